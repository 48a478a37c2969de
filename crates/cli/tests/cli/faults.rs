//! The fault-injection suite: real `xfer send` and `xfer recv` processes over loopback, each
//! trial with one fault (SIGKILL of the sender or the receiver at a random moment, a connection
//! reset, stalled or with one bit flipped in flight through [`ChaosProxy`], the receiver's disk
//! filling up, a source file modified mid-transfer), then a re-run without faults. A trial passes
//! when the faulted run ended byte-identical or with a clear error, nothing under a final name is
//! ever wrong, the re-run ends byte-identical, and the receiver keeps serving.
//!
//! `faults_short` runs in the test suite; `scripts/faults [COUNT]` runs `faults_long` until COUNT
//! faults (default 500) have been injected. `XFER_TEST_SEED` replays a run.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::chaos::{ChaosProxy, Direction, Fault, Plan};
use super::common::{
    complete_looking_files, is_root, same_bytes, seed, tree_difference, write_data, xfer, Receiver,
    TmpfsMount,
};

/// Streams of every faulted run.
const STREAMS: usize = 3;
/// Each stream's pace in Mbit/s, so that a faulted run lasts about a second.
const STREAM_MBIT: &str = "60";
/// How long the senders wait for a silent receiver.
const STALL_TIMEOUT: &str = "3s";
/// How long the receiver waits for a silent session.
const IDLE_TIMEOUT: &str = "8s";
/// A run still going after this is a hang.
const RUN_DEADLINE: Duration = Duration::from_secs(60);
/// `(path in the tree, size)` of the files every trial sends.
const FILES: [(&str, u64); 6] = [
    ("a.bin", 6 << 20),
    ("b.bin", (3 << 20) + 1),
    ("sub/c.bin", 8 << 20),
    ("sub/empty", 0),
    ("d.bin", (5 << 19) + 77),
    ("e.txt", 1000),
];
/// The file that the source-modified trial changes (the largest, so it is surely in flight).
const MODIFIED: &str = "sub/c.bin";

#[test]
fn faults_short() {
    let faults = if is_root() {
        14
    } else {
        eprintln!("not root: no disk-full trials (they mount a small tmpfs)");
        12
    };
    run_suite(faults, 40);
}

#[test]
#[ignore = "long: run with scripts/faults [COUNT]"]
fn faults_long() {
    let count = std::env::var("XFER_FAULTS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(500);
    run_suite(count, count * 3);
}

/// Runs trials until `faults` faults were injected (at most `max_trials` trials), prints the
/// counts, and fails on any silent corruption, crash, hang, unclear error or failed recovery.
fn run_suite(faults: u64, max_trials: u64) {
    let mut suite = Suite::new(seed());
    let started = Instant::now();
    while suite.counts.injected < faults && suite.counts.trials < max_trials {
        let kind = suite.next_kind();
        suite.trial(kind);
    }
    let c = &suite.counts;
    eprintln!(
        "fault-injection suite: {} trials in {:.0?}\n\
         faults injected          {}\n\
         - completed byte-identical {}\n\
         - clear errors             {}\n\
         - runs killed              {}\n\
         re-runs byte-identical   {}\n\
         silent corruptions       {}\n\
         crashes                  {}\n\
         hangs                    {}\n\
         unclear errors           {}\n\
         not recovered            {}",
        c.trials,
        started.elapsed(),
        c.injected,
        c.completed,
        c.clear_errors,
        c.killed,
        c.recovered,
        c.silent_corruptions,
        c.crashes,
        c.hangs,
        c.unclear_errors,
        c.unrecovered,
    );
    assert!(
        c.injected >= faults,
        "only {} of {faults} faults fired in {} trials",
        c.injected,
        c.trials
    );
    let bad = c.silent_corruptions + c.crashes + c.hangs + c.unclear_errors + c.unrecovered;
    assert_eq!(bad, 0, "failures:\n{}", suite.failures.join("\n"));
}

/// One trial's fault.
#[derive(Debug, Clone, Copy)]
enum Kind {
    KillSender,
    KillReceiver,
    Proxy(Plan),
    DiskFull,
    SourceModified,
}

/// How a run of `xfer send` ended.
enum Run {
    Exited(ExitStatus, String),
    Killed,
    Hung,
}

/// What the suite counts: how faulted runs ended only for faults that fired, failures and
/// re-runs over all trials.
#[derive(Debug, Default)]
struct Counts {
    trials: u64,
    injected: u64,
    completed: u64,
    clear_errors: u64,
    killed: u64,
    recovered: u64,
    silent_corruptions: u64,
    crashes: u64,
    hangs: u64,
    unclear_errors: u64,
    unrecovered: u64,
}

struct Suite {
    rng: ChaCha8Rng,
    work: tempfile::TempDir,
    /// The tree every trial sends.
    tree: PathBuf,
    tree_bytes: u64,
    root: PathBuf,
    receiver: Receiver,
    counts: Counts,
    failures: Vec<String>,
}

impl Suite {
    fn new(seed: u64) -> Suite {
        let work = tempfile::tempdir().unwrap();
        let tree = work.path().join("src").join("tree");
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        for (i, (path, len)) in FILES.iter().enumerate() {
            write_data(&tree.join(path), *len, seed ^ i as u64);
        }
        let root = work.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let receiver = start_receiver(&root);
        Suite {
            rng: ChaCha8Rng::seed_from_u64(seed),
            tree,
            tree_bytes: FILES.iter().map(|(_, len)| len).sum(),
            root,
            receiver,
            work,
            counts: Counts::default(),
            failures: Vec::new(),
        }
    }

    /// The kinds in turn, with random parameters; no disk-full trials without root.
    fn next_kind(&mut self) -> Kind {
        let turn = self.counts.trials % 9;
        let stall = match turn {
            3 => Some(Duration::from_millis(self.rng.random_range(500..6000))),
            _ => None,
        };
        match turn {
            0 => Kind::KillSender,
            1 => Kind::KillReceiver,
            2 => self.proxy(Fault::Reset),
            3 | 4 => self.proxy(Fault::Stall(stall)),
            7 if is_root() => Kind::DiskFull,
            8 => Kind::SourceModified,
            _ => {
                let bit = self.rng.random_range(0..8);
                self.proxy(Fault::Flip(bit))
            }
        }
    }

    /// A proxy fault on a random connection, direction and byte offset within what that
    /// connection carries.
    fn proxy(&mut self, fault: Fault) -> Kind {
        let rng = &mut self.rng;
        let connection = if rng.random_bool(0.3) {
            0
        } else {
            rng.random_range(1..=STREAMS)
        };
        let direction = if rng.random_bool(if connection == 0 { 0.5 } else { 0.75 }) {
            Direction::ToReceiver
        } else {
            Direction::ToSender
        };
        let after_bytes = match (connection, direction) {
            (0, Direction::ToReceiver) => rng.random_range(0..800),
            (0, Direction::ToSender) => rng.random_range(0..400),
            (_, Direction::ToReceiver) => rng.random_range(0..self.tree_bytes / STREAMS as u64),
            (_, Direction::ToSender) => rng.random_range(0..300),
        };
        Kind::Proxy(Plan {
            connection,
            direction,
            after_bytes,
            fault,
        })
    }

    /// Runs one trial and counts what happened.
    fn trial(&mut self, kind: Kind) {
        self.counts.trials += 1;
        let name = format!("trial-{}", self.counts.trials);
        let encrypt = self.rng.random_bool(0.25);
        let verify = self.rng.random_bool(0.3);
        let mut options = vec!["--stall-timeout", STALL_TIMEOUT];
        options.extend(encrypt.then_some("--encrypt"));
        options.extend(verify.then_some("--verify"));
        let shown = format!("{name} {kind:?} encrypt={encrypt} verify={verify}");
        let mut tree = self.tree.clone();
        let (injected, run, dest) = match kind {
            Kind::KillSender | Kind::KillReceiver => {
                let mut child = self.send(&tree, &self.receiver, &name, &options);
                let moment = Duration::from_millis(self.rng.random_range(20..1200));
                std::thread::sleep(moment);
                let injected = child.try_wait().unwrap().is_none();
                let run = if let Kind::KillSender = kind {
                    let _ = child.kill();
                    let _ = child.wait();
                    Run::Killed
                } else {
                    self.receiver.kill();
                    let run = finish(child);
                    self.receiver = start_receiver(&self.root);
                    run
                };
                (injected, run, self.root.join(&name))
            }
            Kind::Proxy(plan) => {
                let proxy = ChaosProxy::start(&self.receiver.addr, plan);
                let run =
                    finish(self.send_to(&tree, &proxy.addr, &self.receiver.key, &name, &options));
                (proxy.injected(), run, self.root.join(&name))
            }
            Kind::SourceModified => {
                tree = self.work.path().join(&name).join("tree");
                copy_tree(&self.tree, &tree);
                let child = self.send(&tree, &self.receiver, &name, &options);
                let dest = self.root.join(&name);
                let injected = modify_in_flight(&tree, &dest.join("tree"));
                (injected, finish(child), dest)
            }
            Kind::DiskFull => return self.disk_full_trial(&name, &options, &shown),
        };
        self.judge(&shown, injected, run, &tree, &dest, None);
    }

    /// The receiver's disk (a tmpfs) holds half the tree; once it has grown, the re-run must
    /// complete.
    fn disk_full_trial(&mut self, name: &str, options: &[&str], shown: &str) {
        let disk = TmpfsMount::new(&format!("size={}", self.tree_bytes / 2));
        let mut receiver = start_receiver(&disk.path);
        let run = finish(self.send(&self.tree, &receiver, name, options));
        let status = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={}", self.tree_bytes * 2)])
            .arg(&disk.path)
            .status()
            .unwrap();
        assert!(status.success(), "cannot grow the tmpfs");
        let tree = self.tree.clone();
        self.judge(
            shown,
            true,
            run,
            &tree,
            &disk.path.join(name),
            Some(&mut receiver),
        );
    }

    /// Starts the faulted `xfer send` of `tree` to `receiver`, into `name` under its root.
    fn send(&self, tree: &Path, receiver: &Receiver, name: &str, options: &[&str]) -> Child {
        self.send_to(tree, &receiver.addr, &receiver.key, name, options)
    }

    /// [`Suite::send`] through `addr` (a proxy) to the receiver that holds `key`.
    fn send_to(&self, tree: &Path, addr: &str, key: &str, name: &str, options: &[&str]) -> Child {
        xfer()
            .arg("send")
            .arg(tree)
            .arg(format!("{addr}:{name}"))
            .env("XFER_KEY", key)
            .args(["--streams", &STREAMS.to_string(), "--unit-size", "1MiB"])
            .args(["--stream-rate-cap", STREAM_MBIT, "--quiet"])
            .args(options)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Counts the faulted run, checks that nothing under a final name is wrong, re-runs the
    /// transfer without faults (to `other` when given, else to the suite's receiver), and checks
    /// that the receiver is still serving. How the faulted run ended is counted only when the
    /// fault fired; failures always are.
    fn judge(
        &mut self,
        shown: &str,
        injected: bool,
        run: Run,
        tree: &Path,
        dest: &Path,
        other: Option<&mut Receiver>,
    ) {
        let got = dest.join("tree");
        let (mut verdict, counter) = match run {
            Run::Exited(status, _) if status.success() => match tree_difference(tree, &got) {
                None => (
                    "completed byte-identical".to_string(),
                    Some(&mut self.counts.completed),
                ),
                Some(d) => (self.failure(shown, Failure::SilentCorruption, &d), None),
            },
            Run::Exited(status, stderr) => {
                let error = stderr.lines().find(|l| l.starts_with("xfer: error: "));
                match error {
                    _ if stderr.contains("panicked") => {
                        (self.failure(shown, Failure::Crash, &stderr), None)
                    }
                    Some(line) => (
                        format!("clear error: {line}"),
                        Some(&mut self.counts.clear_errors),
                    ),
                    None => {
                        let details = format!("{status}: {stderr}");
                        (self.failure(shown, Failure::UnclearError, &details), None)
                    }
                }
            }
            Run::Killed => ("killed".to_string(), Some(&mut self.counts.killed)),
            Run::Hung => {
                let details = "the sender ran past the deadline";
                (self.failure(shown, Failure::Hang, details), None)
            }
        };
        if let Some(counter) = counter.filter(|_| injected) {
            *counter += 1;
        }
        if let Some(wrong) = wrong_final_file(tree, &got) {
            verdict = self.failure(shown, Failure::SilentCorruption, &wrong);
        }
        let suite_receiver = other.is_none();
        let receiver = other.unwrap_or(&mut self.receiver);
        let rerun = rerun(tree, receiver, dest);
        let exit = receiver.child.try_wait().unwrap();
        let crashed = (exit.is_some() || receiver.stderr.lock().unwrap().contains("panicked"))
            .then(|| format!("receiver {exit:?}: {}", receiver.stderr.lock().unwrap()));
        match rerun {
            Ok(()) => self.counts.recovered += 1,
            Err(e) => verdict = self.failure(shown, Failure::NotRecovered, &e),
        }
        if let Some(log) = crashed {
            verdict = self.failure(shown, Failure::Crash, &log);
            if suite_receiver {
                self.receiver = start_receiver(&self.root);
            }
        }
        self.counts.injected += u64::from(injected);
        let fired = if injected {
            ""
        } else {
            " (fault did not fire)"
        };
        eprintln!("{shown}{fired}: {verdict}");
    }

    /// Counts a failure and keeps its details for the final report.
    fn failure(&mut self, shown: &str, what: Failure, details: &str) -> String {
        let c = &mut self.counts;
        *match what {
            Failure::SilentCorruption => &mut c.silent_corruptions,
            Failure::Crash => &mut c.crashes,
            Failure::Hang => &mut c.hangs,
            Failure::UnclearError => &mut c.unclear_errors,
            Failure::NotRecovered => &mut c.unrecovered,
        } += 1;
        self.failures.push(format!("{shown}: {what:?}: {details}"));
        format!("FAILED: {what:?}")
    }
}

/// What must never happen.
#[derive(Debug, Clone, Copy)]
enum Failure {
    /// A file under its final name, or a run that reported success, is not its source.
    SilentCorruption,
    /// A panic, or the receiver exited.
    Crash,
    /// The faulted run was still going at [`RUN_DEADLINE`].
    Hang,
    /// The faulted run failed without an `xfer: error:` line.
    UnclearError,
    /// The re-run without faults did not end byte-identical.
    NotRecovered,
}

/// A receiver on `root` that gives up on a silent session after [`IDLE_TIMEOUT`].
fn start_receiver(root: &Path) -> Receiver {
    Receiver::start_with(root, &["--idle-timeout", IDLE_TIMEOUT])
}

/// Waits for a run to end, killing it at [`RUN_DEADLINE`].
fn finish(mut child: Child) -> Run {
    let deadline = Instant::now() + RUN_DEADLINE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut stderr)
                .unwrap();
            return Run::Exited(status, stderr);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Run::Hung;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The first file under its final name in `got` that is not byte-identical to its source.
fn wrong_final_file(tree: &Path, got: &Path) -> Option<String> {
    if !got.exists() {
        return None;
    }
    complete_looking_files(got).into_iter().find_map(|rel| {
        let source = tree.join(&rel);
        let same = source.is_file() && same_bytes(&source, &got.join(&rel));
        (!same).then(|| format!("{} is not its source", rel.display()))
    })
}

/// Sends `tree` again to `receiver`, into `dest` (a directory under its root), and checks the
/// result byte for byte. A receiver that still holds the names for the faulted session (it has
/// not noticed yet that the session is over) is asked again.
fn rerun(tree: &Path, receiver: &Receiver, dest: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let name = dest.file_name().unwrap().to_str().unwrap();
    loop {
        let out = xfer()
            .arg("send")
            .arg(tree)
            .arg(format!("{}:{name}", receiver.addr))
            .env("XFER_KEY", &receiver.key)
            .args(["--streams", &STREAMS.to_string(), "--quiet"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            return match tree_difference(tree, &dest.join("tree")) {
                None => Ok(()),
                Some(d) => Err(format!("the re-run succeeded but {d}")),
            };
        }
        if !stderr.contains("another session") || Instant::now() > deadline {
            return Err(format!("the re-run failed: {stderr}"));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Copies a tree of plain files and directories.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Waits until [`MODIFIED`] is being received into `got` (its part file exists, its final name
/// does not), then overwrites 4 KiB in the middle of its source. `false` when the file was done
/// before that happened.
fn modify_in_flight(tree: &Path, got: &Path) -> bool {
    let (dir, file) = MODIFIED.rsplit_once('/').unwrap();
    let part = got.join(dir).join(format!(".{file}.xfer-part"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !part.exists() {
        if Instant::now() > deadline || got.join(MODIFIED).exists() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut source = std::fs::OpenOptions::new()
        .write(true)
        .open(tree.join(MODIFIED))
        .unwrap();
    source.seek(SeekFrom::Start(4 << 20)).unwrap();
    source.write_all(&[0xa5; 4096]).unwrap();
    source.sync_all().unwrap();
    !got.join(MODIFIED).exists()
}

/// A data stream that stops forwarding for good after most of its share is closed after the
/// stall timeout, and the other streams finish its units (its writer, waiting for a unit while
/// all that were left were its own, used to wait for ever).
#[test]
fn a_stream_stalled_for_good_is_replaced() {
    let suite = Suite::new(seed());
    let plan = Plan {
        connection: 2,
        direction: Direction::ToReceiver,
        after_bytes: suite.tree_bytes / STREAMS as u64 - (1 << 20),
        fault: Fault::Stall(None),
    };
    let proxy = ChaosProxy::start(&suite.receiver.addr, plan);
    let options = ["--stall-timeout", STALL_TIMEOUT];
    let child = suite.send_to(&suite.tree, &proxy.addr, &suite.receiver.key, "t", &options);
    let Run::Exited(status, stderr) = finish(child) else {
        panic!("the transfer hung")
    };
    assert!(proxy.injected());
    assert!(status.success(), "{stderr}");
    assert_eq!(
        tree_difference(&suite.tree, &suite.root.join("t/tree")),
        None
    );
}

/// A data stream that stops forwarding for a while (well within the stall timeout) does not
/// hold up the end of the transfer: once the other streams run out of work, they carry copies
/// of its unacknowledged units, and the transfer ends long before the stall does.
#[test]
fn the_tail_of_a_stalled_stream_is_reissued_on_the_others() {
    const STALL: Duration = Duration::from_secs(40);
    let suite = Suite::new(seed());
    let plan = Plan {
        connection: 2,
        direction: Direction::ToReceiver,
        after_bytes: suite.tree_bytes / STREAMS as u64 - (1 << 20),
        fault: Fault::Stall(Some(STALL)),
    };
    let proxy = ChaosProxy::start(&suite.receiver.addr, plan);
    let started = Instant::now();
    let options = ["--stall-timeout", "50s"];
    let child = suite.send_to(&suite.tree, &proxy.addr, &suite.receiver.key, "t", &options);
    let Run::Exited(status, stderr) = finish(child) else {
        panic!("the transfer hung")
    };
    let took = started.elapsed();
    assert!(proxy.injected());
    assert!(status.success(), "{stderr}");
    assert_eq!(
        tree_difference(&suite.tree, &suite.root.join("t/tree")),
        None
    );
    assert!(
        took < STALL / 4,
        "the transfer took {took:?}: it waited for the stalled stream"
    );
}
