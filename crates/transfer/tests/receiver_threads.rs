//! How many threads a receiver runs for its connections: none of their own, in their handshake
//! or after it. A test binary of its own, so that no other test's receiver runs in the process
//! while its threads are counted (`quic_threads.rs` counts them over QUIC).

use std::net::TcpStream;

use transfer::wire::{write_chunk, write_message, Message};
use transfer::ReceiverOptions;

mod common;
use common::raw_peer::*;
use common::{receivers_threads, thread_names};

/// With 4 sessions of 32 data streams each open and every stream carrying a chunk, and 48
/// strangers silent in their handshakes beside them, the receiver runs no thread for any
/// connection: every connection is a task of its runtime from its accept (`xfer-recv`, a
/// worker per core and at most 16 that blocking work may take), beside the one thread that
/// closes refused connections. Every stream still answers, and the files arrive whole.
#[test]
fn a_receivers_threads_do_not_grow_with_its_connections() {
    const SESSIONS: usize = 4;
    const STREAMS: usize = 32;
    const SILENT: usize = 48;
    let root = tempfile::tempdir().unwrap();
    let options = ReceiverOptions::default().max_handshakes_per_source(SILENT + 8);
    let addr = start_with(config(root.path()).options(options));
    let contents = |session: usize, stream: usize| [(session * STREAMS + stream) as u8; 10];
    let mut sessions: Vec<(Conn, Vec<Conn>)> = (0..SESSIONS)
        .map(|session| {
            let size = (STREAMS * 10) as u64;
            let dest = format!("s{session}");
            let batch = manifest(vec![entry(b"f", size)], vec![]);
            let (control, welcomed, _) = open_session_into(&addr, dest.as_bytes(), batch);
            let streams = (0..STREAMS)
                .map(|_| join(&addr, &welcomed).unwrap())
                .collect();
            (control, streams)
        })
        .collect();

    let silent: Vec<TcpStream> = (0..SILENT)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    // Let the receiver accept them all.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let receivers = receivers_threads(&[]);
    println!(
        "{} streams open and {SILENT} silent handshakes: the receiver's threads {receivers:?}",
        SESSIONS * STREAMS
    );
    assert!(
        receivers.iter().any(|name| name == "xfer-recv"),
        "{:?}",
        thread_names()
    );
    drop(silent);

    for (session, (control, streams)) in sessions.iter_mut().enumerate() {
        for (stream, (reader, writer)) in streams.iter_mut().enumerate() {
            let data = contents(session, stream);
            let offset = (stream * 10) as u64;
            write_chunk(writer, &chunk(&data, offset), &data, None).unwrap();
            assert_eq!(
                reader.read_message().unwrap(),
                Message::Ack {
                    file: 0,
                    offset,
                    len: 10
                }
            );
        }
        assert_eq!(
            seal(control, None),
            Message::Finalized {
                file: 0,
                error: None
            }
        );
        for (reader, writer) in streams.iter_mut() {
            write_message(writer, &Message::EndOfStream).unwrap();
            assert_eq!(reader.read_message().unwrap(), Message::EndOfStream);
        }
        let expected: Vec<u8> = (0..STREAMS).flat_map(|s| contents(session, s)).collect();
        let landed = std::fs::read(root.path().join(format!("s{session}/f"))).unwrap();
        assert!(landed == expected, "session {session}'s file differs");
    }
}
