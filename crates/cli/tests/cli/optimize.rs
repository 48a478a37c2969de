//! `xfer send --optimizer`: a live controller chooses the stream count of a real transfer, the
//! data arrives exact, and the MI log has one well-formed line per interval.

use crate::common::*;

#[test]
fn gd_drives_a_real_transfer_that_arrives_byte_identical_with_a_well_formed_mi_log() {
    let records = optimized_transfer(Some("gd"));
    let most = records.iter().map(|r| r["streams"].as_u64().unwrap()).max();
    assert!(
        most >= Some(4),
        "with 25 MB/s per stream, gd adds streams: {records:?}"
    );
}

#[test]
fn the_learned_policy_drives_a_real_transfer_that_arrives_byte_identical() {
    let records = optimized_transfer(Some("ppo"));
    let decisions: Vec<_> = records
        .iter()
        .filter_map(|r| Some((r["streams"].as_i64()?, r["decision"].as_i64()?)))
        .collect();
    assert!(!decisions.is_empty(), "{records:?}");
    for (streams, decision) in decisions {
        let moves = [5, 1, 0, -1, -5].map(|change| (streams + change).clamp(1, 16));
        assert!(moves.contains(&decision), "{streams} -> {decision}");
    }
}

#[test]
fn auto_is_the_default_and_drives_a_real_transfer_logging_who_acts() {
    let records = optimized_transfer(None);
    let mut acting = "ppo";
    for r in records.iter().filter(|r| r["decision"].is_number()) {
        let now = r["acting"].as_str().unwrap_or_else(|| panic!("{r}"));
        assert!(["ppo", "tuner"].contains(&now), "{r}");
        if r["switch"].is_null() {
            assert_eq!(now, acting, "control changed hands without a reason: {r}");
        } else {
            assert!(r["switch"].is_string(), "{r}");
        }
        acting = now;
    }
}

#[test]
fn a_schedule_sets_the_count_on_interval_boundaries_and_logs_each_interval() {
    let schedule = "schedule:0s:1,1s:4,2s:2";
    let records = optimized_transfer(Some(schedule));
    for r in records.iter().filter(|r| r["decision"].is_number()) {
        let end = r["time"].as_f64().unwrap();
        let expected = match end {
            t if t < 0.999 => 1,
            t if t < 1.999 => 4,
            _ => 2,
        };
        assert_eq!(r["decision"], expected, "{r}");
    }
    // Of the intervals decided on: the one the transfer ended in is counted by the streams
    // that were still carrying data as they closed.
    let counts: Vec<_> = records
        .iter()
        .filter(|r| r["decision"].is_number())
        .map(|r| r["streams"].as_u64().unwrap())
        .collect();
    assert!(
        counts.contains(&4) && counts.last() == Some(&2),
        "{counts:?}"
    );
}

/// A transfer shorter than one monitoring interval still logs that interval, as far as it
/// went: when it ended, what it carried and on how many streams, with no decision after it.
#[test]
fn a_transfer_shorter_than_one_interval_logs_it_as_far_as_it_went() {
    let root = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("mi.jsonl");
    let receiver = Receiver::start(root.path());
    let args = [
        "--mem",
        "64MiB",
        &receiver.addr,
        "--streams",
        "2",
        "--mi",
        "30s",
    ];
    let out = ok(send(
        &receiver,
        &[&args[..], &["--mi-log", log.to_str().unwrap(), "--json"]].concat(),
    ));
    let seconds = json_lines(&out).pop().unwrap()["seconds"].as_f64().unwrap();
    let records = json_lines(&std::fs::read_to_string(&log).unwrap());
    assert_eq!(records.len(), 1, "{records:?}");
    let r = &records[0];
    assert!(r["decision"].is_null(), "{r}");
    assert_eq!(r["controller"], "fixed:2", "{r}");
    assert!(matches!(r["streams"].as_u64(), Some(1 | 2)), "{r}");
    let time = r["time"].as_f64().unwrap();
    assert!(time > 0.0 && time <= seconds + 0.1, "{r} in {seconds} s");
    assert!(r["throughput"].as_f64().unwrap() > 0.0, "{r}");
}

#[test]
fn a_fixed_count_keeps_its_streams_and_writes_an_mi_log_too() {
    let root = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("mi.jsonl");
    let receiver = Receiver::start(root.path());
    // 100 streams: more than the controllers' default limit, which a count named on the
    // command line is not held to.
    let out = ok(send(
        &receiver,
        &[
            "--mem",
            "2GiB",
            receiver.addr.as_str(),
            "--streams",
            "100",
            "--mi",
            "100ms",
            "--mi-log",
            log.to_str().unwrap(),
            "--json",
        ],
    ));
    let summary = json_lines(&out).pop().unwrap();
    assert_eq!(summary["bytes"], 2u64 << 30);
    let records = json_lines(&std::fs::read_to_string(&log).unwrap());
    assert!(!records.is_empty(), "an MI log of a fixed count");
    for r in &records {
        assert_eq!(r["controller"], "fixed:100", "{r}");
        assert!(matches!(r["decision"].as_u64(), Some(100) | None), "{r}");
    }
    // 100 streams from the start, fewer only as they close at the end.
    let timeline = summary["streams_timeline"].as_array().unwrap();
    let counts: Vec<u64> = timeline
        .iter()
        .map(|step| step[1].as_u64().unwrap())
        .collect();
    assert!(
        counts[0] == 100 && counts.windows(2).all(|w| w[1] < w[0]),
        "{timeline:?}"
    );
}

/// Sends a tree with `optimizer` choosing the count from 1 stream (or, for `None`, the default
/// optimiser from the default count), with paced streams, 200 ms intervals and at most 16
/// streams; checks that it arrived byte-identical and that its MI log is well formed, and
/// returns the log.
fn optimized_transfer(optimizer: Option<&str>) -> Vec<serde_json::Value> {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    std::fs::create_dir_all(tree.join("small")).unwrap();
    write_data(&tree.join("big.bin"), 600 << 20, 11);
    for i in 0..300u64 {
        write_data(&tree.join(format!("small/f{i}")), i * 101, i);
    }
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("mi.jsonl");
    let receiver = Receiver::start(root.path());
    let chosen = match optimizer {
        Some(name) => vec!["--optimizer", name, "--streams", "1"],
        None => vec![],
    };
    // Paced streams make throughput grow with the count, so gd has a reason to add streams.
    ok(send(
        &receiver,
        &[
            tree.to_str().unwrap(),
            &receiver.dest("in"),
            "--stream-rate-cap",
            "200",
            "--mi",
            "200ms",
            "--max-streams",
            "16",
            "--mi-log",
            log.to_str().unwrap(),
            "--quiet",
        ]
        .iter()
        .chain(&chosen)
        .copied()
        .collect::<Vec<_>>(),
    ));
    assert_same_tree(src.path(), &root.path().join("in"));

    let records = json_lines(&std::fs::read_to_string(&log).unwrap());
    assert!(records.len() >= 5, "{records:?}");
    let mut last_time = 0.0;
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r["mi"], i as u64, "{r}");
        assert_eq!(r["controller"], optimizer.unwrap_or("auto"));
        for key in [
            "time",
            "connecting",
            "retiring",
            "retiring_throughput",
            "throughput",
            "loss",
            "rtt",
            "rtt_ratio",
            "rtt_gradient",
            "utility",
            "reward",
        ] {
            assert!(r[key].is_number(), "{key} in {r}");
        }
        let time = r["time"].as_f64().unwrap();
        assert!(time > last_time, "time increases: {r}");
        last_time = time;
        let streams = r["streams"].as_u64().unwrap();
        assert!((1..=16).contains(&streams), "{r}");
        assert!(r["rtt"].as_f64().unwrap() > 0.0 && r["rtt_ratio"].as_f64().unwrap() >= 1.0);
        let loss = r["loss"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&loss), "{r}");
        // A decision and its latency come together, or neither (the controller was busy).
        match (r["decision"].as_u64(), r["decision_latency"].as_f64()) {
            (Some(n), Some(latency)) => assert!((1..=16).contains(&n) && latency >= 0.0),
            (None, None) => {}
            _ => panic!("decision without latency or the reverse: {r}"),
        }
    }
    records
}

#[test]
fn optimizer_flags_that_cannot_work_are_refused_before_anything_is_sent() {
    let root = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(root.path());
    let cases: [(&[&str], &str); 7] = [
        (&["--optimizer", "pp"], "unknown optimizer \"pp\""),
        (
            &["--optimizer", "schedule:2s:1"],
            "the first step is not at 0s",
        ),
        (
            &["--optimizer", "ppo:/nonexistent/model"],
            "cannot read policy metadata /nonexistent/model",
        ),
        (&["--optimizer", "ppo", "--k", "1.1"], "re-train it"),
        (
            &["--mi-log", "/nonexistent/dir/mi.jsonl"],
            "cannot create /nonexistent/dir/mi.jsonl",
        ),
        (
            &["--k", "0.5"],
            "K must be at least 1 and B at least 0 (--k, --b), not K=0.5",
        ),
        (
            &["--reward-eps=-1"],
            "its eps at least 0 (--reward-x, --reward-y, --reward-eps)",
        ),
    ];
    for (args, needle) in cases {
        let mut all = vec!["--mem", "1MiB", receiver.addr.as_str()];
        all.extend_from_slice(args);
        let stderr = fails(send(&receiver, &all));
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    assert!(entries(root.path()).is_empty());
}
