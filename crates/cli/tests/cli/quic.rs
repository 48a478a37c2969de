//! `--transport quic`: trees arrive byte-identical while the stream (connection) count changes,
//! an interrupted transfer resumes with a live optimiser reading QUIC's path statistics, and
//! what cannot work is refused clearly. The certificate pinning is tested where it is made,
//! also against a receiver that announces a wrong certificate (`transfer/src/quic/tests.rs`).

use crate::common::*;

const MIB: u64 = 1 << 20;

/// A receiver as `xfer recv` starts by default: it serves QUIC senders beside TCP ones, so a
/// sender's `--transport quic` needs nothing on the receiving side.
fn quic_receiver(root: &std::path::Path) -> Receiver {
    Receiver::start(root)
}

#[test]
fn a_quic_tree_arrives_byte_identical_while_the_stream_count_changes() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    std::fs::create_dir_all(tree.join("sub/empty")).unwrap();
    for (name, len) in [
        ("zero", 0),
        ("one", 1),
        ("unit-plus-1", MIB + 1),
        ("big.bin", 768 * MIB + 5),
    ] {
        write_data(&tree.join(name), len, len ^ seed());
    }
    for i in 0..200u64 {
        write_data(&tree.join(format!("sub/f{i}")), i * 53, i);
    }
    chmod(&tree.join("one"), 0o600);
    set_mtime(&tree.join("sub"), 1_500_000_000, 7);
    let receiver = quic_receiver(root.path());
    let out = ok(send(
        &receiver,
        &[
            tree.to_str().unwrap(),
            &receiver.addr,
            "--transport",
            "quic",
            "--congestion",
            "bbr",
            "--verify",
            "--unit-size",
            "1MiB",
            "--optimizer",
            "schedule:0s:1,300ms:6,700ms:2,1s:4",
            "--mi",
            "100ms",
            "--json",
        ],
    ));
    assert_same_tree(src.path(), root.path());
    let summary = summary(&out);
    assert_eq!(summary["transport"], "quic", "{summary}");
    let timeline: Vec<u64> = summary["streams_timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[1].as_u64().unwrap())
        .collect();
    let counts: Vec<u64> = timeline.iter().copied().filter(|&n| n > 0).collect();
    assert!(
        counts.starts_with(&[1, 6, 2, 4]),
        "stream timeline {timeline:?}"
    );
    // Every stream's sample carries the QUIC connection's path statistics.
    let samples: Vec<_> = json_lines(&out)
        .into_iter()
        .filter(|v| v["type"] == "progress")
        .flat_map(|v| v["tcp"].as_array().cloned().unwrap_or_default())
        .collect();
    assert!(!samples.is_empty(), "no progress report had a stream");
    for s in &samples {
        assert!(
            s["rtt_us"].as_u64() > Some(0) && s["data_segs_out"].as_u64() > Some(0),
            "{s}"
        );
        assert!(s["snd_mss"].as_u64() >= Some(1200), "{s}");
    }
}

/// Resume, verification and a live optimiser work over QUIC as over TCP: a sender killed
/// mid-transfer, then a re-run with gd that sends only what is missing and logs its intervals.
#[test]
fn an_interrupted_quic_transfer_resumes_under_the_optimizer() {
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_data(&src.path().join("big.bin"), 1536 * MIB, seed());
    write_data(&src.path().join("small.bin"), 1000, seed() ^ 1);
    let receiver = quic_receiver(dst.path());
    let tree = src.path().to_str().unwrap();
    let args = ["--transport", "quic", "--verify", "--json", tree];
    // Kill it at the first progress report (after 1 s) that shows acknowledged bytes.
    let mut first = xfer();
    first
        .arg("send")
        .args(args)
        .arg(&receiver.addr)
        .env("XFER_KEY", &receiver.key);
    kill_at_first_ack(first);
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("mi.jsonl");
    let rerun = [
        &args[..],
        &[
            "--optimizer",
            "gd",
            "--mi",
            "200ms",
            "--mi-log",
            log.to_str().unwrap(),
            &receiver.addr,
        ],
    ]
    .concat();
    let out = ok(send(&receiver, &rerun));
    let summary = summary(&out);
    assert_eq!(summary["transport"], "quic", "{summary}");
    assert!(
        summary["bytes_skipped"].as_u64().unwrap() > 0,
        "nothing was resumed: {summary}"
    );
    assert_same_tree(
        src.path(),
        &dst.path().join(src.path().file_name().unwrap()),
    );
    let records = json_lines(&std::fs::read_to_string(&log).unwrap());
    assert!(!records.is_empty(), "no interval was logged");
    let measured = records
        .iter()
        .filter(|r| r["throughput"].as_f64() > Some(0.0))
        .count();
    assert!(measured > 0, "no interval measured throughput: {records:?}");
    for r in &records {
        assert!(r["rtt"].as_f64() > Some(0.0), "{r}");
        let loss = r["loss"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&loss), "{r}");
    }
}

#[test]
fn quic_to_a_receiver_that_does_not_serve_it_is_refused_clearly() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write_data(&src.path().join("f"), 1000, 1);
    let receiver = Receiver::start_with(dst.path(), &["--no-quic"]);
    let stderr = fails(send(
        &receiver,
        &[
            "--transport",
            "quic",
            src.path().join("f").to_str().unwrap(),
            &receiver.addr,
        ],
    ));
    assert!(
        stderr.contains("does not serve QUIC (it was started with --no-quic, or could not bind"),
        "{stderr}"
    );
    assert!(complete_looking_files(dst.path()).is_empty());
}

#[test]
fn flags_that_do_not_fit_the_transport_are_refused_clearly() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write_data(&src.path().join("f"), 1000, 1);
    let receiver = quic_receiver(dst.path());
    let file = src.path().join("f");
    let cases: [(&[&str], &str); 2] = [
        (
            &["--transport", "quic", "--stream-rate-cap", "50"],
            "xfer: error: a per-stream rate cap needs TCP",
        ),
        (
            &["--congestion", "bbr"],
            "xfer: error: --congestion chooses QUIC's controller (with --transport quic)",
        ),
    ];
    for (args, needle) in cases {
        let all = [args, &[file.to_str().unwrap(), &receiver.addr]].concat();
        let stderr = fails(send(&receiver, &all));
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    assert!(entries(dst.path()).is_empty());
}

/// A receiver told to insist on QUIC (`--transport quic`) still serves plain TCP senders.
#[test]
fn a_quic_receiver_serves_tcp_senders_too() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write_data(&src.path().join("f"), 5 * MIB, 2);
    let receiver = Receiver::start_with(dst.path(), &["--transport", "quic"]);
    let out = ok(send(
        &receiver,
        &[
            src.path().join("f").to_str().unwrap(),
            &receiver.addr,
            "--json",
        ],
    ));
    assert_eq!(summary(&out)["transport"], "tcp");
    assert!(same_bytes(&src.path().join("f"), &dst.path().join("f")));
}
