//! `--rate-limit`: one limit on a transfer's whole rate, however many streams carry it.

use std::process::{Command, Stdio};

use crate::common::*;

/// 300 Mbit/s for 20 s, in bytes (decimal, as `--mem 750MB` reads).
const BYTES: u64 = 750_000_000;

/// On loopback, where nothing else limits, `--rate-limit 300Mbit` holds a 20 s transfer within
/// 3 % of the limit with 1, 8 and 32 streams, and with the default optimiser choosing the
/// count (the four run at once, each with its own limit).
#[test]
fn the_limit_holds_over_20_s_whatever_the_stream_count() {
    let root = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(root.path());
    let runs: Vec<(&str, std::process::Child)> = [
        ("1 stream", &["--streams", "1"][..]),
        ("8 streams", &["--streams", "8"]),
        ("32 streams", &["--streams", "32"]),
        ("the default optimiser", &[]),
    ]
    .into_iter()
    .map(|(name, streams)| {
        let child = Command::new(env!("CARGO_BIN_EXE_xfer"))
            .args([
                "send",
                "--mem",
                "750MB",
                &receiver.addr,
                "--rate-limit",
                "300Mbit",
            ])
            .args(streams)
            .arg("--json")
            .env("XFER_KEY", &receiver.key)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        (name, child)
    })
    .collect();
    for (name, child) in runs {
        let out = ok(child.wait_with_output().unwrap());
        let summary = summary(&out);
        assert_eq!(summary["bytes"], BYTES, "{name}: {summary}");
        let mbit = BYTES as f64 * 8.0 / summary["seconds"].as_f64().unwrap() / 1e6;
        eprintln!("{name}: {mbit:.1} Mbit/s");
        assert!(
            (mbit / 300.0 - 1.0).abs() < 0.03,
            "{name}: {mbit:.1} Mbit/s under a limit of 300"
        );
    }
}

/// A rate that could be bits or bytes is refused, saying how to write either.
#[test]
fn a_rate_without_bits_or_bytes_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(root.path());
    let stderr = fails(send(
        &receiver,
        &["--mem", "1MB", &receiver.addr, "--rate-limit", "300M"],
    ));
    assert!(
        stderr.contains("\"300M\" is not a rate (say bits or bytes per second)")
            && stderr.contains("300Mbit"),
        "{stderr}"
    );
}
