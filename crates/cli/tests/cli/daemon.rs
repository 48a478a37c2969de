//! `xfer recv` as a daemon: set up by a configuration file, it stops on SIGTERM without
//! breaking the transfer under way (which completes byte-identical) and exits 0; a second
//! SIGTERM ends the sessions left at once, and their senders say why.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::{write_data, xfer, Receiver};

/// A receiver from a configuration file with a key file, logging JSON lines.
fn start(dir: &Path, grace_secs: u32) -> Receiver {
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let key = dir.join("key");
    std::fs::write(&key, "daemon-test-key-0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = dir.join("recv.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nroot = \"{}\"\nkey = {{ file = \"{}\" }}\n\
             shutdown_grace = \"{grace_secs}s\"\n",
            root.display(),
            key.display()
        ),
    )
    .unwrap();
    let mut command = xfer();
    command
        .args(["recv", "--log-format", "json", "--config"])
        .arg(&config)
        .env("XFER_LOG", "info");
    Receiver::spawn(command)
}

/// Starts `xfer send` of `file` on one stream paced at `mbit` Mbit/s and returns once the
/// receiver has acknowledged its first bytes.
fn paced_send(receiver: &Receiver, file: &Path, mbit: &str) -> Child {
    let mut child = xfer()
        .args([
            "send",
            "--streams",
            "1",
            "--unit-size",
            "1MiB",
            "--stream-rate-cap",
            mbit,
        ])
        .args(["--json"])
        .arg(file)
        .arg(&receiver.addr)
        .env("XFER_KEY", &receiver.key)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut progress = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        let line = progress
            .next()
            .expect("the sender ended before any ack")
            .unwrap();
        let report: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            report["type"], "progress",
            "the sender ended before any ack"
        );
        if report["bytes_acked"].as_u64().unwrap() > 0 {
            break;
        }
    }
    // The rest of its reports are not needed, but it must not block writing them.
    std::thread::spawn(move || progress.for_each(drop));
    child
}

fn sigterm(receiver: &Receiver) {
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&receiver.child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
}

/// Waits up to `limit` for the receiver to exit; its status.
fn exits_within(receiver: &mut Receiver, limit: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = receiver.child.try_wait().unwrap() {
            return status;
        }
        assert!(
            started.elapsed() < limit,
            "xfer recv still runs after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the receiver's log says `text`.
fn logged(receiver: &Receiver, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !receiver.stderr.lock().unwrap().contains(text) {
        assert!(
            Instant::now() < deadline,
            "the receiver never logged {text:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_lets_the_transfer_under_way_finish_then_the_receiver_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data.bin");
    write_data(&file, 16 << 20, 5);
    let mut receiver = start(dir.path(), 60);
    // 16 MiB at 64 Mbit/s: about two seconds.
    let send = paced_send(&receiver, &file, "64");
    logged(&receiver, "session started");
    sigterm(&receiver);
    let out = send.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(exits_within(&mut receiver, Duration::from_secs(5)).success());
    assert_eq!(
        std::fs::read(dir.path().join("root/data.bin")).unwrap(),
        std::fs::read(&file).unwrap()
    );
    let log = receiver.stderr.lock().unwrap().clone();
    for line in log.lines() {
        let object: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(object["level"].is_string(), "{line}");
    }
    for said in [
        "session started",
        "SIGTERM: stopping",
        "session complete",
        "stopped: no session is running",
    ] {
        assert!(log.contains(said), "{said:?} not in {log}");
    }
}

#[test]
fn a_second_sigterm_ends_the_sessions_at_once_and_the_sender_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data.bin");
    write_data(&file, 64 << 20, 6);
    let mut receiver = start(dir.path(), 600);
    // 64 MiB at 32 Mbit/s would take 16 s.
    let send = paced_send(&receiver, &file, "32");
    sigterm(&receiver);
    logged(&receiver, "stopping: no new sessions");
    sigterm(&receiver);
    assert!(exits_within(&mut receiver, Duration::from_secs(6)).success());
    let out = send.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("shutting down"), "{stderr}");
    assert!(!dir.path().join("root/data.bin").exists());
}

/// A loopback address with a port that was free a moment ago.
fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// The metrics served at `addr`: each sample line's name (with its labels) and value.
fn scrape(addr: &str) -> std::collections::HashMap<String, f64> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (name, value) = line.rsplit_once(' ').unwrap();
            (name.to_string(), value.parse().unwrap())
        })
        .collect()
}

#[test]
fn sender_and_receiver_serve_their_metrics_for_prometheus() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data.bin");
    write_data(&file, 16 << 20, 7);
    let (recv_metrics, send_metrics) = (free_addr(), free_addr());
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let receiver = Receiver::start_with(&root, &["--metrics", &recv_metrics]);
    // Two streams at 40 Mbit/s each: about 1.7 s, while the sender's metrics are read.
    let send = xfer()
        .args([
            "send",
            "--optimizer",
            "fixed:2",
            "--mi",
            "200ms",
            "--streams",
            "2",
        ])
        .args([
            "--stream-rate-cap",
            "40",
            "--quiet",
            "--metrics",
            &send_metrics,
        ])
        .arg(&file)
        .arg(&receiver.addr)
        .env("XFER_KEY", &receiver.key)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let during = loop {
        let scraped = std::net::TcpStream::connect(&send_metrics)
            .is_ok()
            .then(|| scrape(&send_metrics));
        if let Some(m) = scraped.filter(|m| {
            m.get("xfer_sender_bytes_total") > Some(&0.0)
                && m.contains_key("xfer_sender_decisions_total{controller=\"fixed:2\"}")
        }) {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "the sender's metrics never showed progress"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(during["xfer_sender_streams"], 2.0, "{during:?}");
    assert!(send.wait_with_output().unwrap().status.success());

    // The receiver counts the session and its streams once their threads are done with them,
    // which may be just after the sender has exited.
    let expected = [
        ("xfer_receiver_bytes_total", (16 << 20) as f64),
        ("xfer_receiver_sessions_total{outcome=\"completed\"}", 1.0),
        ("xfer_receiver_sessions", 0.0),
        ("xfer_receiver_streams", 0.0),
    ];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let after = scrape(&recv_metrics);
        let wrong: Vec<_> = expected
            .iter()
            .filter(|(name, value)| after.get(*name) != Some(value))
            .collect();
        if wrong.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "{wrong:?} in {after:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 40, F1: a hundred senders at once against a daemon with every default limit. Each
/// either completes, byte-identical, or is told to try again later; a sender after them is
/// served; and SIGTERM still ends the receiver within its grace period. (Before the fix, the
/// refusals gave back session slots they never took: later sessions were refused for good and
/// SIGTERM never ended the receiver.)
#[test]
fn a_hundred_senders_at_once_complete_or_are_told_to_try_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut receiver = start(dir.path(), 20);
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let file = src.join("small.bin");
    write_data(&file, 256 << 10, 40);
    let senders: Vec<Child> = (0..100)
        .map(|i| {
            xfer()
                .arg("send")
                .arg(&file)
                .arg(receiver.dest(&format!("s{i}")))
                .arg("--quiet")
                .env("XFER_KEY", "daemon-test-key-0123456789abcdef")
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let (mut completed, mut told) = (0, 0);
    for (i, sender) in senders.into_iter().enumerate() {
        let out = sender.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            let landed = dir.path().join("root").join(format!("s{i}/small.bin"));
            assert!(crate::common::same_bytes(&file, &landed), "sender {i}");
            completed += 1;
        } else {
            assert!(stderr.contains("try again"), "sender {i}: {stderr}");
            told += 1;
        }
    }
    eprintln!("{completed} completed, {told} told to try again");
    assert!(completed >= 32, "{completed} completed");
    let later = xfer()
        .arg("send")
        .arg(&file)
        .arg(receiver.dest("later"))
        .arg("--quiet")
        .env("XFER_KEY", "daemon-test-key-0123456789abcdef")
        .output()
        .unwrap();
    assert!(
        later.status.success(),
        "{}",
        String::from_utf8_lossy(&later.stderr)
    );
    sigterm(&receiver);
    let status = exits_within(&mut receiver, Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
}
