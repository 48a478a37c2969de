//! Sealed sessions (`xfer send --integrity`, [`transfer::seal`]) against someone on the path
//! who rewrites what the sender sends: a chunk with its xxh3 and header check made again to
//! match, or a control message with its check made again. A plain session takes such a chunk
//! for good data (what docs/security.md says plain sessions do not protect against); a sealed one
//! never does, and a rewritten control message ends it with a clear error.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use transfer::auth::{KeySetting, SessionKey};
use transfer::job::{SendJob, SenderSettings};
use transfer::receiver::{Receiver, ReceiverSettings};
use transfer::sender::SendError;
use transfer::wire::chunk_checksum;
use transfer::SendSource;

use crate::common::{contents, run, KEY};

/// What the man in the middle rewrites, in frames from the sender.
#[derive(Clone, Copy, PartialEq)]
enum Rewrite {
    /// The first byte of the first `count` chunks, their xxh3 and header check made again.
    Chunks { count: u64 },
    /// The last byte of every `Seal` message, its check made again.
    Seals,
}

/// A receiver on loopback, requiring sealed sessions when `require`; its address.
fn receiver(root: &Path, require: bool) -> String {
    let mut config = ReceiverSettings::new(root.into(), SessionKey::from_text(KEY).unwrap());
    config.options.require_integrity = require;
    let receiver = Receiver::bind(&config.listen("127.0.0.1:0")).unwrap();
    let addr = receiver.local_addr().unwrap().to_string();
    std::thread::spawn(move || receiver.serve(None));
    addr
}

/// A relay in front of `upstream` that parses the frames senders send and rewrites them as
/// `rewrite` says; its address, and how many frames it rewrote.
fn man_in_the_middle(upstream: String, rewrite: Rewrite, sealed: bool) -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let rewritten = Arc::new(AtomicU64::new(0));
    let counter = rewritten.clone();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(&upstream) else {
                return;
            };
            let (mut from_server, mut to_client) =
                (server.try_clone().unwrap(), client.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut from_server, &mut to_client);
                let _ = to_client.shutdown(Shutdown::Write);
            });
            let counter = counter.clone();
            std::thread::spawn(move || relay(client, server, rewrite, sealed, &counter));
        }
    });
    (addr, rewritten)
}

/// Relays frames from `client` to `server`, rewriting them.
fn relay(
    mut client: TcpStream,
    mut server: TcpStream,
    rewrite: Rewrite,
    sealed: bool,
    rewritten: &AtomicU64,
) {
    let tag = if sealed { 16 } else { 0 };
    loop {
        let mut prefix = [0u8; 5];
        if client.read_exact(&mut prefix).is_err() {
            break;
        }
        let len = u32::from_le_bytes(prefix[..4].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len - 1];
        if client.read_exact(&mut body).is_err() {
            break;
        }
        match (prefix[4], rewrite) {
            // A chunk: header (20), check (8), data, tag.
            // Each stream's relay claims a rewrite before making it: two must not both see
            // the last one free.
            (2, Rewrite::Chunks { count })
                if rewritten
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                        (n < count).then_some(n + 1)
                    })
                    .is_ok() =>
            {
                let data_end = body.len() - tag;
                body[28] ^= 0x40;
                let checksum = chunk_checksum(&body[28..data_end]);
                body[12..20].copy_from_slice(&checksum.to_le_bytes());
                let check = chunk_checksum(&[&prefix[..], &body[..20]].concat());
                body[20..28].copy_from_slice(&check.to_le_bytes());
            }
            // A message: its postcard body (a `Seal` starts with its variant, 8), check, tag.
            (1, Rewrite::Seals) if body[0] == 8 => {
                let message_end = body.len() - 8 - tag;
                body[message_end - 1] ^= 0x40;
                let check = chunk_checksum(&[&prefix[..], &body[..message_end]].concat());
                body[message_end..message_end + 8].copy_from_slice(&check.to_le_bytes());
                rewritten.fetch_add(1, Ordering::AcqRel);
            }
            _ => {}
        }
        if server.write_all(&prefix).is_err() || server.write_all(&body).is_err() {
            break;
        }
    }
    let _ = server.shutdown(Shutdown::Write);
}

/// Sends `file` to `addr`, sealed or not, with `--verify`; the result.
fn send(addr: &str, file: &Path, integrity: bool) -> Result<(), SendError> {
    let mut settings = SenderSettings::new(
        addr,
        KeySetting::Text(KEY.into()),
        SendSource::Paths {
            paths: vec![file.into()],
            destination: PathBuf::new(),
        },
    );
    settings.options.integrity = integrity;
    settings.options.verify = true;
    settings.options.streams = 2;
    settings.optimizer = Some("fixed:2".parse().unwrap());
    settings.options.unit_size = 1 << 20;
    run(SendJob::start(settings).unwrap()).1.map(drop)
}

/// A sealed session's files arrive whole; a receiver that requires sealing refuses a plain
/// session with the reason, and serves a sealed one.
#[test]
fn a_sealed_session_arrives_whole_and_a_receiver_may_require_it() {
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("run.bin");
    let data = contents(41, (5 << 20) + 1234);
    std::fs::write(&file, &data).unwrap();
    let root = tempfile::tempdir().unwrap();
    let addr = receiver(root.path(), true);
    let refused = send(&addr, &file, false).unwrap_err().to_string();
    assert!(refused.contains("use xfer send --integrity"), "{refused}");
    assert!(!root.path().join("run.bin").exists());
    send(&addr, &file, true).unwrap();
    assert!(std::fs::read(root.path().join("run.bin")).unwrap() == data);
}

/// Someone on the path rewrites the first chunks sent, with checksums that match their new
/// bytes. A plain session (even with `--verify`, whose hash the same attacker could rewrite
/// too) does not notice the rewritten chunks themselves; a sealed session refuses every one of
/// them, the sender sends them again, and the file lands as it was sent.
#[test]
fn rewritten_chunks_are_caught_only_in_a_sealed_session() {
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("run.bin");
    let data = contents(42, 8 << 20);
    std::fs::write(&file, &data).unwrap();

    let root = tempfile::tempdir().unwrap();
    let (relay, rewritten) = man_in_the_middle(
        receiver(root.path(), false),
        Rewrite::Chunks { count: 3 },
        false,
    );
    let plain = send(&relay, &file, false).unwrap_err().to_string();
    assert_eq!(rewritten.load(Ordering::Acquire), 3);
    // Only the whole-file hash, which the same attacker could rewrite, saw it.
    assert!(plain.contains("BLAKE3 differs"), "{plain}");

    let root = tempfile::tempdir().unwrap();
    let (relay, rewritten) = man_in_the_middle(
        receiver(root.path(), false),
        Rewrite::Chunks { count: 3 },
        true,
    );
    send(&relay, &file, true).unwrap();
    assert_eq!(rewritten.load(Ordering::Acquire), 3);
    assert!(std::fs::read(root.path().join("run.bin")).unwrap() == data);
}

/// A control message rewritten on the path, its check made again: a sealed session ends with
/// an error saying the connection was tampered with, and nothing is put in place.
#[test]
fn a_rewritten_control_message_ends_a_sealed_session() {
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("run.bin");
    std::fs::write(&file, contents(43, 3 << 20)).unwrap();
    let root = tempfile::tempdir().unwrap();
    let (relay, rewritten) = man_in_the_middle(receiver(root.path(), false), Rewrite::Seals, true);
    let err = send(&relay, &file, true).unwrap_err().to_string();
    assert!(rewritten.load(Ordering::Acquire) >= 1);
    assert!(err.contains("tampered with in transit"), "{err}");
    assert!(!root.path().join("run.bin").exists());
}
