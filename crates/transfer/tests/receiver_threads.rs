//! How many threads a receiver runs for its data streams: none of their own. A test binary of
//! its own, so that no other test's receiver runs in the process while its threads are counted
//! (`quic_threads.rs` counts them over QUIC).

use std::time::{Duration, Instant};

use transfer::wire::{write_chunk, write_message, Message};

mod common;
use common::raw_peer::*;
use common::{thread_names, threads_named};

/// With 4 sessions of 32 data streams each open and every stream carrying a chunk, the receiver
/// runs no connection thread once the handshakes are done: the control connections and the
/// streams run on its runtime (`xfer-recv`, a worker per core and a bounded number that
/// blocking work may take), every one of them still answers, and the files arrive whole.
#[test]
fn a_receivers_threads_do_not_grow_with_its_data_streams() {
    const SESSIONS: usize = 4;
    const STREAMS: usize = 32;
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path());
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

    let deadline = Instant::now() + Duration::from_secs(10);
    while threads_named("xfer-conn") > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (connections, workers) = (threads_named("xfer-conn"), threads_named("xfer-recv"));
    println!(
        "{} streams open: {connections} connection threads, {workers} runtime threads",
        SESSIONS * STREAMS
    );
    assert_eq!(connections, 0, "{:?}", thread_names());
    assert!(workers >= 1, "{:?}", thread_names());

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
