//! How many threads QUIC streams take: none of the receiver's, one each of the sender's. A
//! test binary of its own, so that no other test's receiver or sender runs in the process while
//! its threads are counted.

use std::time::{Duration, Instant};

use transfer::auth::SessionKey;
use transfer::{ReceiverOptions, SendError, SendOptions, SendSource, Transfer, Transport};

mod common;
use common::raw_peer::{config, start_with, KEY};
use common::{receivers_threads, thread_names, threads_named};

/// The threads of the sender's side of a transfer, by their names' prefixes.
const SENDER_THREADS: [&str; 6] = [
    "xfer-control-",
    "xfer-stream",
    "xfer-send-quic",
    "xfer-mi",
    "xfer-decide",
    "xfer-scan",
];

/// With a QUIC transfer's 32 streams open, each its own QUIC connection, the receiver's threads
/// are its runtime's (`xfer-recv`: a worker per core and at most 16 for blocking work) and the
/// one that closes refused connections: its QUIC connections are tasks from their first packet,
/// key handshake included. The sender runs one thread per stream, which writes its frames; a
/// task of its own runtime (`xfer-send-quic`) sends them and reads the answers.
#[test]
fn quic_streams_run_no_thread_of_the_receivers_and_one_each_of_the_senders() {
    const STREAMS: usize = 32;
    let root = tempfile::tempdir().unwrap();
    let options = ReceiverOptions::default().transport(Transport::Quic);
    let addr = start_with(config(root.path()).options(options));
    let options = SendOptions::default()
        .transport(Transport::Quic)
        .streams(STREAMS);
    let key = SessionKey::from_text(KEY).unwrap();
    let transfer =
        Transfer::start(&addr, key, SendSource::Memory { size: 1 << 40 }, options).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while transfer.sample_streams().len() < STREAMS && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        transfer.sample_streams().len(),
        STREAMS,
        "every stream connected"
    );
    let receivers = receivers_threads(&SENDER_THREADS);
    println!(
        "{STREAMS} QUIC streams open: the receiver's threads {receivers:?}, the sender's \
         stream threads {}",
        threads_named("xfer-stream-")
    );
    assert_eq!(
        threads_named("xfer-stream-"),
        STREAMS,
        "{:?}",
        thread_names()
    );
    transfer.canceller().cancel();
    assert!(matches!(transfer.wait(), Err(SendError::Cancelled)));
}
