//! The handshake against any bytes from the other side, as the receiver facing a client and
//! as the sender facing a receiver: it fails cleanly, and no input ever authenticates without
//! the key (the other side's proof covers a fresh nonce of this side, so nothing recorded or
//! guessed can pass).

#![no_main]

use libfuzzer_sys::fuzz_target;
use transfer::auth::{handshake_as_client, handshake_as_server, ChannelBinding, SessionKey};
use transfer::seal::FrameWriter;
use transfer::wire::{FrameReader, Role};

fuzz_target!(|data: &[u8]| {
    let Some((&side, rest)) = data.split_first() else {
        return;
    };
    let key = SessionKey::from_text("fuzzing-key-0123456789abcdef").expect("a valid key");
    let mut reader = FrameReader::new(rest, 1 << 20);
    let mut replies = FrameWriter::new(Vec::new());
    if side & 1 == 0 {
        let result = handshake_as_server(&mut reader, &mut replies, &ChannelBinding::PLAIN, |asked| match asked.role {
            Role::Control => Ok(key.clone()),
            Role::Data { .. } => Err("no such session".into()),
        });
        assert!(result.is_err(), "a client without the key was accepted");
    } else {
        let result = handshake_as_client(
            &mut reader,
            &mut replies,
            &ChannelBinding::PLAIN,
            &key,
            Role::Control,
            side & 2 != 0,
        );
        assert!(result.is_err(), "a receiver without the key was believed");
    }
});
