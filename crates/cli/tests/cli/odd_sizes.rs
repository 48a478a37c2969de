//! Transfers of odd sizes, unit sizes and stream counts all complete: no read may wait for
//! bytes that will never come (the receiver batches its reads with a low-water mark).

use std::time::{Duration, Instant};

use crate::common::*;

/// Runs `xfer send ARGS` and fails the test if it has not finished within `limit`.
fn send_within(receiver: &Receiver, args: &[String], limit: Duration) -> String {
    let mut child = xfer()
        .arg("send")
        .args(args)
        .env("XFER_KEY", &receiver.key)
        .arg("--json")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("xfer send {args:?} still running after {limit:?}: a read is stuck");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ok(child.wait_with_output().unwrap())
}

#[test]
fn odd_sizes_unit_sizes_and_stream_counts_all_complete() {
    let root = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(root.path());
    let mut state = seed();
    let mut next = |bound: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % bound
    };
    for _ in 0..12 {
        let size = 1 + next(600 << 20);
        let unit = [4096, 65_537, 1 << 20, 3 << 20, 4 << 20][next(5) as usize];
        let streams = 1 + next(12);
        let args = [
            "--mem".to_string(),
            size.to_string(),
            receiver.addr.clone(),
            "--unit-size".into(),
            unit.to_string(),
            "--streams".into(),
            streams.to_string(),
        ];
        let out = send_within(&receiver, &args, Duration::from_secs(60));
        assert_eq!(summary(&out)["bytes"].as_u64().unwrap(), size, "{args:?}");
    }
}
