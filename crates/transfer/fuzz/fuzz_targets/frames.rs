//! Any bytes a peer sends, read as frames the way both sides read them, plain or sealed (the
//! first byte chooses): each frame is a message or a chunk within the limits, or an error; never
//! a panic, never an allocation past the limits, and every message read encodes back to one that
//! reads the same.

#![no_main]

use libfuzzer_sys::fuzz_target;
use transfer::wire::{write_message, Frame, FrameReader};

const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&sealed, data)) = data.split_first() else {
        return;
    };
    let mut reader = if sealed & 1 == 1 {
        transfer::fuzzing::sealed_frames(data, LIMIT)
    } else {
        FrameReader::new(data, LIMIT)
    };
    reader.set_message_limit(LIMIT);
    loop {
        match reader.read_frame() {
            Ok(Frame::Chunk(_, bytes)) => assert!(bytes.len() <= LIMIT),
            Ok(Frame::Message(message)) => {
                let mut encoded = Vec::new();
                write_message(&mut encoded, &message).expect("a message read encodes");
                let again = FrameReader::new(&encoded[..], LIMIT).read_message();
                assert_eq!(again.expect("an encoded message reads"), message);
            }
            Err(_) => break,
        }
    }
});
