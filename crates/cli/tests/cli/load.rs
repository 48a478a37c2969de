//! A load test of `xfer recv` as a daemon: many sessions at once over loopback (by default 60,
//! at most 50 at a time), each from its own in-process sender (a `transfer::job::SendJob`
//! with its own connections, stream count and pace) sending its own tree to its own
//! directory, a fifth of them cancelled at a random moment. Every completed tree must arrive
//! byte-identical, every cancelled one must leave only complete files of its own (or its part
//! files), no session may fail, the receiver must not crash, and it must stop cleanly on
//! SIGTERM. It prints the counts, the receiver's peak RSS and the most threads it ran.
//!
//! The suite runs the short version; `scripts/load-test` runs a longer one, with
//! `XFER_LOAD_SESSIONS`, `XFER_LOAD_CONCURRENCY` and `XFER_LOAD_SEED`.
//!
//! Beside it, many sessions all at once, memory to memory: `XFER_CONCURRENT_SESSIONS` (100 in
//! the suite; `scripts/bench-sessions` runs 1,000) of 4 streams each, the receiver's threads
//! held to its budget however many run, and its memory bounded.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use transfer::auth::KeySetting;
use transfer::job::{SendEvent, SendJob, SenderSettings};
use transfer::sender::SendError;
use transfer::SendSource;

use crate::common::{tree_difference, write_data, Receiver};

/// A setting from the environment, or its default.
fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        })
        .unwrap_or(default)
}

/// What happened to one session.
#[derive(Debug)]
enum Outcome {
    Completed,
    Cancelled,
    Failed(String),
}

/// One session's plan: its tree, its streams and pace, and when (if ever) it is cancelled.
struct Plan {
    index: usize,
    tree: PathBuf,
    streams: usize,
    mbit: u64,
    cancel_after: Option<Duration>,
}

/// Writes session `index`'s tree: 1 to 4 files of up to 3 MiB, one in a subdirectory.
fn write_tree(src: &Path, index: usize, rng: &mut ChaCha8Rng) -> PathBuf {
    let tree = src.join(format!("t{index}"));
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    for file in 0..rng.random_range(1..=4) {
        let name = if file == 0 {
            "sub/f0".into()
        } else {
            format!("f{file}")
        };
        let len = rng.random_range(0..3u64 << 20);
        write_data(&tree.join(name), len, (index * 16 + file) as u64);
    }
    tree
}

/// Runs one session to its end.
async fn run_session(plan: Plan, addr: String, key: String, running: Arc<Running>) -> Outcome {
    let mut settings = SenderSettings::new(
        addr,
        KeySetting::Text(key),
        SendSource::Paths {
            paths: vec![plan.tree.clone()],
            destination: format!("s{}", plan.index).into(),
        },
    );
    settings.optimizer = Some(format!("fixed:{}", plan.streams).parse().unwrap());
    settings.options.streams = plan.streams;
    settings.options.unit_size = 256 << 10;
    settings.options.stream_rate_cap = Some(plan.mbit * 125_000);
    settings.progress_every = Duration::from_millis(100);
    let mut job = match SendJob::start(settings) {
        Ok(job) => job,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    let started = Instant::now();
    let mut counted = None;
    while let Some(event) = job.next_event().await {
        match event {
            SendEvent::Started { .. } => counted = Some(running.enter()),
            SendEvent::Progress(_) if plan.cancel_after.is_some_and(|t| started.elapsed() >= t) => {
                job.cancel()
            }
            _ => {}
        }
    }
    drop(counted);
    match job.finish().await {
        Ok(_) => Outcome::Completed,
        Err(SendError::Cancelled) => Outcome::Cancelled,
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// Sessions under way, and the most there were at once.
#[derive(Default)]
struct Running {
    now: AtomicUsize,
    peak: AtomicUsize,
}

/// One session counted as under way while it lives.
struct Entered(Arc<Running>);

impl Running {
    fn enter(self: &Arc<Self>) -> Entered {
        let now = self.now.fetch_add(1, Ordering::AcqRel) + 1;
        self.peak.fetch_max(now, Ordering::AcqRel);
        Entered(self.clone())
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Checks what a session left under the receiver's root: its whole tree, or (cancelled) only
/// complete copies of its own files beside its part files. `None` when it is right.
fn check_landed(plan_tree: &Path, landed: &Path, outcome: &Outcome) -> Option<String> {
    match outcome {
        Outcome::Completed => tree_difference(plan_tree, landed),
        Outcome::Cancelled => walk_files(landed).into_iter().find_map(|path| {
            let relative = path.strip_prefix(landed).unwrap();
            let name = relative.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with('.')
                && (name.ends_with(".xfer-part") || name.ends_with(".xfer-journal"))
            {
                return None;
            }
            let source = plan_tree.join(relative);
            (std::fs::read(&source).ok() != Some(std::fs::read(&path).unwrap()))
                .then(|| format!("{} is not a complete copy of its source", path.display()))
        }),
        Outcome::Failed(_) => None,
    }
}

/// Every file under `dir` (none if it does not exist).
fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flat_map(|entry| {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk_files(&path)
            } else {
                vec![path]
            }
        })
        .collect()
}

/// A field of process `pid`'s `/proc/PID/status` (`VmHWM`, `Threads`), as a number.
fn status_field(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Samples process `pid`'s thread count every 20 ms until `stop`; the most it saw.
fn most_threads(pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut most = 0;
        while !stop.load(Ordering::Acquire) {
            most = most.max(status_field(pid, "Threads:"));
            std::thread::sleep(Duration::from_millis(20));
        }
        most
    })
}

/// The peak resident memory of process `pid` (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    status_field(pid, "VmHWM:") * 1024
}

/// What every task of `tasks` returned, in order.
async fn every_outcome<T>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    outcomes
}

/// Checks that `receiver` is still running, stops sampling its threads (`threads`), and
/// returns its peak RSS and the most threads it ran.
fn receivers_peaks(
    receiver: &mut Receiver,
    stop_sampling: &AtomicBool,
    threads: std::thread::JoinHandle<u64>,
) -> (u64, u64) {
    assert!(
        receiver.child.try_wait().unwrap().is_none(),
        "the receiver exited: {}",
        receiver.stderr.lock().unwrap()
    );
    let rss = peak_rss(receiver.child.id());
    stop_sampling.store(true, Ordering::Release);
    (rss, threads.join().unwrap())
}

#[test]
fn a_receiver_daemon_serves_many_sessions_at_once_each_intact_and_apart() {
    let sessions = setting("XFER_LOAD_SESSIONS", 60) as usize;
    let concurrency = setting("XFER_LOAD_CONCURRENCY", 50) as usize;
    let seed = setting("XFER_LOAD_SEED", 1);
    let dir = tempfile::tempdir().unwrap();
    let (src, root) = (dir.path().join("src"), dir.path().join("root"));
    std::fs::create_dir_all(&root).unwrap();
    // A session ends at the receiver a moment after its sender is done with it (later still
    // for a cancelled one, and under load), so the receiver allows more than run at once here.
    let max_sessions = (concurrency * 2).to_string();
    let mut receiver = Receiver::start_with(&root, &["--max-sessions", &max_sessions]);

    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let plans: Vec<Plan> = (0..sessions)
        .map(|index| Plan {
            index,
            tree: write_tree(&src, index, &mut rng),
            streams: rng.random_range(1..=4),
            // 2 to 12 Mbit/s per stream: a session lasts about one to ten seconds.
            mbit: rng.random_range(2..=12),
            cancel_after: rng
                .random_bool(0.2)
                .then(|| Duration::from_millis(rng.random_range(100..2000))),
        })
        .collect();
    let trees: Vec<PathBuf> = plans.iter().map(|p| p.tree.clone()).collect();

    let started = Instant::now();
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let threads = most_threads(receiver.child.id(), stop_sampling.clone());
    let running = Arc::new(Running::default());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let outcomes: Vec<Outcome> = runtime.block_on(async {
        let limit = Arc::new(tokio::sync::Semaphore::new(concurrency));
        let tasks: Vec<_> = plans
            .into_iter()
            .map(|plan| {
                let (addr, key) = (receiver.addr.clone(), receiver.key.clone());
                let (limit, running) = (limit.clone(), running.clone());
                tokio::spawn(async move {
                    let _slot = limit.acquire_owned().await.unwrap();
                    run_session(plan, addr, key, running).await
                })
            })
            .collect();
        every_outcome(tasks).await
    });
    let seconds = started.elapsed().as_secs_f64();

    let (rss, threads) = receivers_peaks(&mut receiver, &stop_sampling, threads);
    let count = |f: fn(&Outcome) -> bool| outcomes.iter().filter(|o| f(o)).count();
    let (completed, cancelled) = (
        count(|o| matches!(o, Outcome::Completed)),
        count(|o| matches!(o, Outcome::Cancelled)),
    );
    let failed: Vec<String> = outcomes
        .iter()
        .enumerate()
        .filter_map(|(i, o)| match o {
            Outcome::Failed(reason) => Some(format!("session {i}: {reason}")),
            _ => None,
        })
        .collect();
    let peak = running.peak.load(Ordering::Acquire);
    println!(
        "load test (seed {seed}): {sessions} sessions started, {completed} completed \
         byte-identical, {cancelled} cancelled cleanly, {} failed, at most {peak} at once, \
         peak receiver RSS {} MiB, at most {threads} receiver threads, {seconds:.1} s",
        failed.len(),
        rss >> 20
    );
    assert!(failed.is_empty(), "failed sessions: {failed:#?}");
    for (index, (tree, outcome)) in trees.iter().zip(&outcomes).enumerate() {
        let landed = root.join(format!("s{index}/t{index}"));
        if let Some(wrong) = check_landed(tree, &landed, outcome) {
            panic!("session {index} ({outcome:?}): {wrong}");
        }
    }
    // Nothing landed outside the sessions' own directories.
    for entry in std::fs::read_dir(&root).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let index: usize = name.strip_prefix('s').and_then(|n| n.parse().ok()).unwrap();
        assert!(index < sessions, "{name} under the root");
    }
    assert!(
        peak >= concurrency.min(sessions) * 9 / 10,
        "only {peak} sessions ran at once"
    );
    assert!(
        rss < 2 << 30,
        "the receiver's peak RSS was {} MiB",
        rss >> 20
    );

    // The daemon stops cleanly.
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&receiver.child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = receiver.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the receiver did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{}", receiver.stderr.lock().unwrap());
}

/// The threads `xfer recv` runs besides its runtime's: the main thread (the accept loop), the
/// one that waits for signals and the one that closes refused connections.
const RECEIVER_FIXED_THREADS: u64 = 3;
/// The most threads the receiver's runtime takes for blocking work (`xfer-recv`, beside a
/// worker per core).
const RECEIVER_BLOCKING_THREADS: u64 = 16;

/// `XFER_CONCURRENT_SESSIONS` sessions (default 100) of 4 streams each run all at once against
/// one `xfer recv`, memory to memory, each paced so that it lasts longer than all of them take
/// to start. Every session completes, the most that ran at once is all of them, the receiver's
/// threads never exceed its budget (a worker per core, at most 16 for blocking work, and its 3
/// fixed threads: none per session, connection or handshake), and its peak RSS stays under
/// 1 GiB.
#[test]
fn a_receiver_serves_many_sessions_at_once_within_its_thread_budget() {
    const STREAMS: usize = 4;
    let sessions = setting("XFER_CONCURRENT_SESSIONS", 100) as usize;
    // Each stream at 2 Mbit/s: a session of 4 MiB lasts about 4 s, plus 1 s per 100 sessions
    // for all of them to start.
    let seconds = 4 + sessions as u64 / 100;
    let size = seconds * STREAMS as u64 * 250_000;
    let root = tempfile::tempdir().unwrap();
    let places = (sessions * (STREAMS + 1)).to_string();
    let mut receiver = Receiver::start_with(
        root.path(),
        &[
            "--max-sessions",
            &sessions.to_string(),
            // Every sender is on 127.0.0.1, where a real receiver sees many addresses.
            "--max-handshakes",
            &places,
            "--max-handshakes-per-source",
            &places,
        ],
    );
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let threads = most_threads(receiver.child.id(), stop_sampling.clone());
    let running = Arc::new(Running::default());
    let started = Instant::now();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let outcomes: Vec<Result<(), String>> = runtime.block_on(async {
        let tasks: Vec<_> = (0..sessions)
            .map(|_| {
                let mut settings = SenderSettings::new(
                    receiver.addr.clone(),
                    KeySetting::Text(receiver.key.clone()),
                    SendSource::Memory { size },
                );
                settings.optimizer = Some(format!("fixed:{STREAMS}").parse().unwrap());
                settings.options.streams = STREAMS;
                settings.options.unit_size = 256 << 10;
                settings.options.stream_rate_cap = Some(250_000);
                let running = running.clone();
                tokio::spawn(async move {
                    let mut job = SendJob::start(settings).map_err(|e| e.to_string())?;
                    let mut counted = None;
                    while let Some(event) = job.next_event().await {
                        if let SendEvent::Started { .. } = event {
                            counted = Some(running.enter());
                        }
                    }
                    drop(counted);
                    job.finish().await.map(drop).map_err(|e| e.to_string())
                })
            })
            .collect();
        every_outcome(tasks).await
    });
    let seconds = started.elapsed().as_secs_f64();
    let (rss, threads) = receivers_peaks(&mut receiver, &stop_sampling, threads);
    let cores = std::thread::available_parallelism().unwrap().get() as u64;
    let budget = cores + RECEIVER_BLOCKING_THREADS + RECEIVER_FIXED_THREADS;
    let peak = running.peak.load(Ordering::Acquire);
    let failed: Vec<String> = (outcomes.iter().enumerate())
        .filter_map(|(i, o)| o.as_ref().err().map(|e| format!("session {i}: {e}")))
        .collect();
    println!(
        "{sessions} sessions of {STREAMS} streams, {size} bytes each: {} completed, {} failed, \
         at most {peak} at once; at most {threads} receiver threads (budget {budget}), peak \
         receiver RSS {} MiB, {seconds:.1} s",
        sessions - failed.len(),
        failed.len(),
        rss >> 20
    );
    assert!(failed.is_empty(), "failed sessions: {failed:#?}");
    assert_eq!(peak, sessions, "not every session ran at once");
    assert!(
        threads <= budget,
        "{threads} receiver threads, over {budget}"
    );
    assert!(
        rss < 1 << 30,
        "the receiver's peak RSS was {} MiB",
        rss >> 20
    );
}
