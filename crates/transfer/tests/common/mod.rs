//! What the tests of jobs and receivers share: a receiver on loopback, recognisable file
//! contents, and a job run to its end.

// Each test file uses some of these.
#![allow(dead_code)]

use std::path::Path;

use transfer::auth::SessionKey;
use transfer::job::{SendEvent, SendJob};
use transfer::receiver::{Receiver, ReceiverConfig};
use transfer::sender::{SendError, Summary};

/// The key of every test receiver.
pub const KEY: &str = "job-api-test-key-0123456789abcdef";

/// A receiver serving `root` on a free loopback port, on its own thread; its address.
pub fn start_receiver(root: &Path) -> String {
    let config = ReceiverConfig::new(root.to_path_buf(), SessionKey::from_text(KEY).unwrap());
    let receiver = Receiver::bind("127.0.0.1:0", config).unwrap();
    let addr = receiver.local_addr().unwrap().to_string();
    std::thread::spawn(move || receiver.serve(None));
    addr
}

/// Deterministic bytes that differ from seed to seed.
pub fn contents(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A runtime for one test's jobs.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `job` to its end; its events and its result.
pub fn run(mut job: SendJob) -> (Vec<SendEvent>, Result<Summary, SendError>) {
    runtime().block_on(async {
        let mut events = Vec::new();
        while let Some(event) = job.next_event().await {
            events.push(event);
        }
        (events, job.finish().await)
    })
}
