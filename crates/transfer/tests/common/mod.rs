//! What the tests of jobs and receivers share: a receiver on loopback, recognisable file
//! contents, paced jobs, a job run to its end, and a peer that speaks the protocol frame by
//! frame ([`raw_peer`]).

// Each test file uses some of these.
#![allow(dead_code)]

pub mod raw_peer;

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use transfer::auth::{KeySetting, SessionKey};
use transfer::job::{SendEvent, SendJob, SenderSettings};
use transfer::receiver::{Receiver, ReceiverEvents, ReceiverSettings, Stopper};
use transfer::sender::{SendError, Summary};
use transfer::SendSource;

/// An error and every cause behind it, on one line, as `xfer` prints it.
pub fn explain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text += &format!(": {c}");
        cause = c.source();
    }
    text
}

/// The key of every test receiver.
pub const KEY: &str = "job-api-test-key-0123456789abcdef";

/// A receiver serving `root` on a free loopback port, on its own thread; its address.
pub fn start_receiver(root: &Path) -> String {
    let config = ReceiverSettings::new(root.to_path_buf(), SessionKey::from_text(KEY).unwrap());
    let receiver = Receiver::bind(&config.listen("127.0.0.1:0")).unwrap();
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

/// A sender's directory holding one file, `big.bin`, and an empty root for a receiver; both
/// are deleted when it is dropped.
pub struct OneFile {
    /// The sender's directory.
    pub src: tempfile::TempDir,
    /// The receiver's root.
    pub root: tempfile::TempDir,
    /// `big.bin` in `src`.
    pub file: PathBuf,
    /// Its bytes.
    pub data: Vec<u8>,
}

/// `big.bin` of `len` bytes made from `seed`, and an empty root.
pub fn one_file(seed: u64, len: usize) -> OneFile {
    let (src, root) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let file = src.path().join("big.bin");
    let data = contents(seed, len);
    std::fs::write(&file, &data).unwrap();
    OneFile {
        src,
        root,
        file,
        data,
    }
}

/// A receiver serving from settings on its own thread.
pub struct Serving {
    /// Its loopback address.
    pub addr: String,
    /// Stops it or ends its sessions.
    pub stopper: Stopper,
    /// Its events from before it served.
    pub events: ReceiverEvents,
    /// The thread serving it.
    pub thread: JoinHandle<std::io::Result<()>>,
}

/// A receiver from settings on a free loopback port.
pub fn serve(root: &Path) -> Serving {
    let mut settings = ReceiverSettings::new(root.into(), KeySetting::Text(KEY.into()));
    settings.listen = "127.0.0.1:0".into();
    let receiver = Receiver::bind(&settings).unwrap();
    Serving {
        addr: receiver.local_addr().unwrap().to_string(),
        stopper: receiver.stopper(),
        events: receiver.subscribe(),
        thread: std::thread::spawn(move || receiver.serve(None)),
    }
}

/// A job sending `file` on one stream paced at `rate` bytes per second.
pub fn paced(addr: &str, file: PathBuf, rate: Option<u64>) -> SenderSettings {
    let mut settings = SenderSettings::new(
        addr,
        KeySetting::Text(KEY.into()),
        SendSource::Paths {
            paths: vec![file],
            destination: PathBuf::new(),
        },
    );
    settings.optimizer = Some("fixed:1".parse().unwrap());
    settings.options.streams = 1;
    settings.options.unit_size = 1 << 20;
    settings.options.stream_rate_cap = rate;
    settings.progress_every = Duration::from_millis(20);
    settings
}

/// Runs `job` until it has `bytes` acknowledged, then calls `then`; its result.
pub fn run_past(mut job: SendJob, bytes: u64, then: impl FnOnce()) -> Result<Summary, SendError> {
    runtime().block_on(async {
        let mut then = Some(then);
        while let Some(event) = job.next_event().await {
            if let SendEvent::Progress(p) = event {
                if p.bytes_acked >= bytes {
                    if let Some(then) = then.take() {
                        then();
                    }
                }
            }
        }
        job.finish().await
    })
}

/// The names of this process's threads.
pub fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim_end().to_string())
        .collect()
}

/// How many of this process's threads have a name that starts with `prefix`.
pub fn threads_named(prefix: &str) -> usize {
    thread_names()
        .iter()
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// The names of this process's threads that a receiver runs, all but those whose names start
/// with one of `others` (a sender's, say), after checking that a receiver runs no other threads
/// than its runtime's (`xfer-recv`: a worker per core and at most 16 for blocking work) and the
/// one that closes refused connections (`xfer-refusing`), and at most that many.
pub fn receivers_threads(others: &[&str]) -> Vec<String> {
    let receivers: Vec<String> = thread_names()
        .into_iter()
        .filter(|name| name.starts_with("xfer-"))
        .filter(|name| !others.iter().any(|prefix| name.starts_with(prefix)))
        .collect();
    let cores = std::thread::available_parallelism().unwrap().get();
    assert!(
        receivers
            .iter()
            .all(|name| name == "xfer-recv" || name == "xfer-refusing"),
        "{receivers:?}"
    );
    assert!(receivers.len() <= cores + 16 + 1, "{receivers:?}");
    receivers
}
