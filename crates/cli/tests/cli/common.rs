//! Helpers for driving the real `xfer` binary in tests: a receiver process, sender runs, tree
//! builders and a tree comparison that checks bytes, modes and mtimes.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `xfer` binary under test.
pub fn xfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xfer"))
}

/// A running `xfer recv`, killed when dropped.
pub struct Receiver {
    pub child: Child,
    pub addr: String,
    pub key: String,
    pub stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Receiver {
    /// Starts a receiver on a free loopback port with a fresh key.
    pub fn start(root: &Path) -> Receiver {
        Receiver::start_with(root, &[])
    }

    /// Starts a receiver with extra arguments (`--key-file`, ...).
    pub fn start_with(root: &Path, extra: &[&str]) -> Receiver {
        let mut command = xfer();
        command
            .args(["recv", "--listen", "127.0.0.1:0", "--root"])
            .arg(root)
            .args(extra);
        Receiver::spawn(command)
    }

    /// Starts `command`, an `xfer recv` (in a network namespace, say), and reads its address
    /// and key.
    pub fn spawn(mut command: Command) -> Receiver {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start xfer recv");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("receiver printed its address").unwrap();
        let addr = first
            .strip_prefix("listening on ")
            .expect("address line")
            .to_string();
        let second = lines.next().expect("receiver printed its key").unwrap();
        let key = match second.strip_prefix("key from ") {
            Some(file) => std::fs::read_to_string(file).unwrap().trim().to_string(),
            None => second.strip_prefix("key ").expect("key line").to_string(),
        };
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Receiver {
            child,
            addr,
            key,
            stderr,
        }
    }

    /// `ADDR` or `ADDR:DEST` for `xfer send`.
    pub fn dest(&self, dest: &str) -> String {
        if dest.is_empty() {
            self.addr.clone()
        } else {
            format!("{}:{dest}", self.addr)
        }
    }

    /// Sends SIGKILL and reaps the process.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `send`, an `xfer send ... --json` with its key set, and kills it (SIGKILL) at its
/// first progress report that shows acknowledged bytes; fails if it ends before that.
pub fn kill_at_first_ack(mut send: Command) {
    let mut child = send
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start xfer send");
    let progress = BufReader::new(child.stdout.take().unwrap());
    for line in progress.lines() {
        let report: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        assert_eq!(
            report["type"], "progress",
            "finished before it could be killed"
        );
        if report["bytes_acked"].as_u64().unwrap() > 0 {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Starts `send`, an `xfer send ... --json`, stops it with SIGTERM once a progress report
/// shows acknowledged bytes, and asserts that it says how to resume and exits 143.
pub fn sigterm_once_data_moves(send: &mut Command) {
    let mut child = send
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start xfer send");
    // Read on until it is stopped: a closed pipe would end it first.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let moving = lines.by_ref().map_while(Result::ok).any(|line| {
        serde_json::from_str::<serde_json::Value>(&line)
            .is_ok_and(|l| l["type"] == "progress" && l["bytes_acked"].as_u64() > Some(0))
    });
    assert!(moving, "no progress came back");
    let pid = child.id().to_string();
    let term = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(term.unwrap().success());
    let stopped = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&stopped.stderr);
    assert_eq!(stopped.status.code(), Some(143), "{err}");
    assert!(err.contains("run the same command again"), "{err}");
}

/// Waits until the receiver has logged the end of the interrupted session.
pub fn wait_for_session_end(receiver: &Receiver) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !receiver.stderr.lock().unwrap().contains("ended early") {
        assert!(
            Instant::now() < deadline,
            "receiver never noticed the killed sender: {}",
            receiver.stderr.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
}

/// Runs `xfer send ARGS...` with the receiver's key in `XFER_KEY` to completion.
pub fn send(receiver: &Receiver, args: &[&str]) -> Output {
    xfer()
        .arg("send")
        .args(args)
        .env("XFER_KEY", &receiver.key)
        .output()
        .expect("run xfer send")
}

/// Asserts success and returns stdout.
pub fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "xfer failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Asserts failure and returns stderr.
pub fn fails(out: Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "xfer unexpectedly succeeded; stderr: {stderr}"
    );
    stderr
}

/// The JSON objects printed by `--json`, in order.
pub fn json_lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("valid JSON line"))
        .collect()
}

/// The `--json` summary object.
pub fn summary(stdout: &str) -> serde_json::Value {
    json_lines(stdout)
        .into_iter()
        .find(|v| v["type"] == "summary")
        .expect("a summary line")
}

/// Writes `len` bytes of deterministic, position-dependent data.
pub fn write_data(path: &Path, len: u64, seed: u64) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    // Small files (trees of thousands) generate and allocate only what they write.
    let mut block = vec![0u8; len.min(1 << 20).next_multiple_of(8) as usize];
    let mut written = 0u64;
    let mut counter = seed;
    while written < len {
        let n = (len - written).min(block.len() as u64) as usize;
        for word in block[..n.next_multiple_of(8)].chunks_exact_mut(8) {
            counter = counter
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            word.copy_from_slice(&counter.to_le_bytes());
        }
        f.write_all(&block[..n]).unwrap();
        written += n as u64;
    }
}

/// Sets an explicit mtime (nanosecond precision) on a path.
pub fn set_mtime(path: &Path, secs: u64, nanos: u32) {
    let t = std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos);
    std::fs::File::open(path).unwrap().set_modified(t).unwrap();
}

/// Sets permission bits.
pub fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Every entry under `root`, relative, sorted.
pub fn entries(root: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = walk(root)
        .into_iter()
        .map(|p| p.strip_prefix(root).unwrap().to_path_buf())
        .collect();
    out.sort();
    out
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        out.push(path.clone());
        if std::fs::symlink_metadata(&path).unwrap().is_dir() {
            out.extend(walk(&path));
        }
    }
    out
}

/// Asserts that `got` is an exact copy of `want`: same entries, types, bytes, permission bits and
/// mtimes (files to the nanosecond, directories too).
pub fn assert_same_tree(want: &Path, got: &Path) {
    if let Some(difference) = tree_difference(want, got) {
        panic!("{difference}");
    }
}

/// The first way in which `got` is not an exact copy of `want` (see [`assert_same_tree`]).
pub fn tree_difference(want: &Path, got: &Path) -> Option<String> {
    let (w, g) = (entries(want), entries(got));
    if w != g {
        return Some(format!(
            "different entries under {} and {}: {w:?} and {g:?}",
            want.display(),
            got.display()
        ));
    }
    for rel in std::iter::once(PathBuf::new()).chain(w) {
        let (a, b) = (want.join(&rel), got.join(&rel));
        let (ma, mb) = (
            std::fs::symlink_metadata(&a).unwrap(),
            std::fs::symlink_metadata(&b).unwrap(),
        );
        let shown = rel.display();
        if ma.file_type() != mb.file_type() {
            return Some(format!("type of {shown}"));
        }
        if rel.as_os_str().is_empty() {
            continue; // the roots themselves are not part of the transfer
        }
        if ma.mode() & 0o777 != mb.mode() & 0o777 {
            return Some(format!("mode of {shown}"));
        }
        if (ma.mtime(), ma.mtime_nsec()) != (mb.mtime(), mb.mtime_nsec()) {
            return Some(format!("mtime of {shown}"));
        }
        if ma.is_file() && (ma.len() != mb.len() || !same_bytes(&a, &b)) {
            return Some(format!("bytes of {shown} differ"));
        }
    }
    None
}

/// Compares two files block by block.
pub fn same_bytes(a: &Path, b: &Path) -> bool {
    let (mut fa, mut fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let na = read_full(&mut fa, &mut ba);
        let nb = read_full(&mut fb, &mut bb);
        if na != nb || ba[..na] != bb[..nb] {
            return false;
        }
        if na == 0 {
            return true;
        }
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]).unwrap() {
            0 => break,
            k => n += k,
        }
    }
    n
}

/// Files under `root` that look complete: everything except the hidden `.xfer-part` and
/// `.xfer-journal` files of an interrupted transfer.
pub fn complete_looking_files(root: &Path) -> Vec<PathBuf> {
    entries(root)
        .into_iter()
        .filter(|rel| {
            let name = rel.file_name().unwrap().to_string_lossy();
            std::fs::symlink_metadata(root.join(rel)).unwrap().is_file()
                && !name.ends_with(".xfer-part")
                && !name.ends_with(".xfer-journal")
        })
        .collect()
}

/// True when this process runs as root (needed to mount small filesystems in tests).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A tmpfs mounted for a test, unmounted when dropped (also when the test panics).
pub struct TmpfsMount {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl TmpfsMount {
    /// Mounts a tmpfs with `options` (such as `size=1m` or `ro`).
    pub fn new(options: &str) -> TmpfsMount {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "xfer-test"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount -t tmpfs -o {options} failed (tests run as root need mount)"
        );
        TmpfsMount {
            path: dir.path().to_path_buf(),
            _dir: dir,
        }
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// A seed for randomised steps: from `XFER_TEST_SEED` when set, else from the clock; printed so a
/// failure can be replayed.
pub fn seed() -> u64 {
    let seed = std::env::var("XFER_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("XFER_TEST_SEED={seed}");
    seed
}
