//! Trees arrive exact, also encrypted; the stream count follows a schedule mid-transfer.

use crate::common::*;

const MIB: u64 = 1 << 20;
const UNIT: u64 = 4 * MIB;

#[test]
fn tree_with_edge_cases_arrives_byte_identical() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    std::fs::create_dir_all(tree.join("nested/a/b/c")).unwrap();
    std::fs::create_dir_all(tree.join("nested/empty")).unwrap();
    std::fs::create_dir_all(tree.join("ünïcödé/日本語")).unwrap();
    for (name, len) in [
        ("zero", 0),
        ("one", 1),
        ("unit-minus-1", UNIT - 1),
        ("unit", UNIT),
        ("unit-plus-1", UNIT + 1),
        ("big.bin", 1 << 30),
    ] {
        write_data(&tree.join(name), len, len);
    }
    write_data(&tree.join("ünïcödé/日本語/ファイル.txt"), 12345, 7);
    let small = tree.join("small");
    for i in 0..5000u64 {
        let dir = small.join(format!("d{:02}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&dir).unwrap();
        }
        write_data(&dir.join(format!("f{i:04}")), (i * 37) % 4097, i);
    }
    chmod(&tree.join("one"), 0o600);
    chmod(&tree.join("unit"), 0o755);
    chmod(&tree.join("unit-minus-1"), 0o444);
    chmod(&tree.join("nested/a"), 0o700);
    chmod(&tree.join("nested/empty"), 0o750);
    set_mtime(&tree.join("one"), 1_000_000_000, 123_456_789);
    set_mtime(&tree.join("nested/a/b"), 1_500_000_000, 987_654_321);

    let receiver = Receiver::start(root.path());
    let out = ok(send(
        &receiver,
        &[
            tree.to_str().unwrap(),
            &receiver.dest("incoming"),
            "--streams",
            "8",
            "--verify",
            "--json",
        ],
    ));
    assert_eq!(summary(&out)["files"], 5000 + 7);
    assert_same_tree(src.path(), &root.path().join("incoming"));
    let leftovers: Vec<_> = entries(root.path())
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".xfer-"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "part or journal files left behind: {leftovers:?}"
    );

    // Sending the same tree again finds everything in place and moves no byte.
    let again = summary(&ok(send(
        &receiver,
        &[tree.to_str().unwrap(), &receiver.dest("incoming"), "--json"],
    )));
    assert_eq!(again["bytes"], 0);
    assert_same_tree(src.path(), &root.path().join("incoming"));
}

/// A tree larger than one batch of the manifest arrives whole, and a link and a FIFO that the
/// scanner meets only after data is flowing are left out with a warning each.
#[test]
fn links_and_special_files_found_mid_transfer_are_skipped_with_a_warning() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    for d in 0..3u64 {
        let dir = tree.join(format!("d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..1000u64 {
            write_data(&dir.join(format!("f{i:04}")), i % 300, d * 1000 + i);
        }
    }
    std::os::unix::fs::symlink("/etc/passwd", tree.join("d2/zz-link")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        tree.join("d2/zz-fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from(0o600),
        0,
    )
    .unwrap();
    let receiver = Receiver::start(root.path());
    let out = send(
        &receiver,
        &[tree.to_str().unwrap(), &receiver.dest("in"), "--json"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(summary(&ok(out))["files"], 3000);
    for name in ["zz-link", "zz-fifo"] {
        assert!(
            stderr.contains(&format!(
                "d2/{name}: symbolic link or special file, skipped"
            )),
            "{stderr}"
        );
    }
    // Without them (and with its mtime as it was), the source is what arrived.
    let d2 = tree.join("d2");
    let mtime = std::fs::metadata(&d2).unwrap().modified().unwrap();
    std::fs::remove_file(d2.join("zz-link")).unwrap();
    std::fs::remove_file(d2.join("zz-fifo")).unwrap();
    std::fs::File::open(&d2)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    assert_same_tree(&tree, &root.path().join("in/tree"));
}

#[test]
fn stream_count_follows_a_schedule_mid_transfer() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    write_data(&src.path().join("two-gib.bin"), 2 << 30, 42);
    let receiver = Receiver::start(root.path());
    // Each stream is paced to 320 Mbit/s so that the schedule plays out within the transfer.
    let schedule = [(0.0, 1u64), (2.0, 16), (4.0, 2), (6.0, 8)];
    let schedule_arg = schedule
        .iter()
        .map(|(t, n)| format!("{t}s:{n}"))
        .collect::<Vec<_>>()
        .join(",");
    let schedule_arg = format!("schedule:{schedule_arg}");
    let out = ok(send(
        &receiver,
        &[
            src.path().join("two-gib.bin").to_str().unwrap(),
            &receiver.addr,
            "--optimizer",
            &schedule_arg,
            "--mi",
            "100ms",
            "--stream-rate-cap",
            "320",
            "--unit-size",
            "1MiB",
            "--json",
        ],
    ));
    assert!(same_bytes(
        &src.path().join("two-gib.bin"),
        &root.path().join("two-gib.bin")
    ));

    let scheduled_at = |t: f64| schedule.iter().rev().find(|(s, _)| *s <= t).unwrap().1;
    let settled = |t: f64| schedule.iter().all(|(s, _)| !(t >= *s && t < s + 0.4));
    let mut seen = Vec::new();
    // Once every byte is acknowledged the streams close while the session finishes: only
    // reports with data still moving show the schedule.
    let moving =
        |v: &&serde_json::Value| v["type"] == "progress" && v["bytes_acked"] != v["bytes_total"];
    for report in json_lines(&out).iter().filter(moving) {
        let t = report["t"].as_f64().unwrap();
        let streams = report["streams"].as_u64().unwrap();
        if settled(t) {
            assert_eq!(
                streams,
                scheduled_at(t),
                "at t={t:.2}s the report shows {streams} streams: {report}"
            );
            let samples = report["tcp"].as_array().unwrap();
            let active_samples = samples.iter().filter(|s| s["retiring"] == false).count();
            assert_eq!(
                active_samples as u64, streams,
                "one TCP_INFO sample per active stream at t={t:.2}: {report}"
            );
        }
        if seen.last() != Some(&streams) {
            seen.push(streams);
        }
    }
    for (_, n) in schedule {
        assert!(
            seen.contains(&n),
            "no per-second report showed {n} streams; counts seen: {seen:?}"
        );
    }
    let timeline: Vec<u64> = summary(&out)["streams_timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[1].as_u64().unwrap())
        .collect();
    let changes: Vec<u64> = timeline.iter().copied().filter(|&n| n > 0).collect();
    assert!(
        changes.starts_with(&[1, 16, 2, 8]),
        "stream timeline {timeline:?}"
    );
}

/// `xfer recv --encrypt` serves only encrypted sessions; `xfer send --encrypt` brings a tree
/// across byte-identical, with a stream count changing mid-transfer.
#[test]
fn an_encrypted_tree_arrives_byte_identical_and_plain_senders_are_refused() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    write_data(&tree.join("big.bin"), 64 * MIB + 3, 11);
    for i in 0..50u64 {
        write_data(&tree.join(format!("sub/f{i}")), i * 101, i);
    }
    chmod(&tree.join("sub/f7"), 0o640);
    let receiver = Receiver::start_with(root.path(), &["--encrypt"]);
    let err = fails(send(&receiver, &[tree.to_str().unwrap(), &receiver.addr]));
    assert!(err.contains("only encrypted sessions"), "{err}");
    ok(send(
        &receiver,
        &[
            tree.to_str().unwrap(),
            &receiver.addr,
            "--encrypt",
            "--verify",
            "--optimizer",
            "schedule:0s:2,300ms:6,700ms:3",
            "--mi",
            "100ms",
        ],
    ));
    assert_same_tree(src.path(), root.path());
}

/// `--verify` says what it verified, and on a re-run verifies the files already at the
/// receiver too: one whose content changed there while its size and mtime stayed the source's
/// is found, named and left as it is, and `--checksum` then replaces it.
#[test]
fn a_verify_rerun_verifies_the_files_already_there_and_finds_one_changed_behind_its_back() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    write_data(&tree.join("large.bin"), (3 << 20) + 7, 1);
    write_data(&tree.join("sub/small"), 5000, 2);
    write_data(&tree.join("empty"), 0, 3);
    let receiver = Receiver::start(root.path());
    let run = |extra: &[&str]| {
        let args = [tree.to_str().unwrap(), &receiver.addr, "--verify"];
        send(&receiver, &[&args[..], extra].concat())
    };
    let first = summary(&ok(run(&["--json"])));
    assert_eq!(first["verified"], true, "{first}");
    assert_same_tree(src.path(), root.path());

    let again = ok(run(&[]));
    assert!(
        again.contains(
            "verified end to end (BLAKE3): all 3 files are identical (those already at the \
             receiver too)"
        ),
        "{again}"
    );

    // A bit flipped at the receiver, its size and mtime kept: a plain re-run cannot tell.
    let held = root.path().join("tree/sub/small");
    let mut bytes = std::fs::read(&held).unwrap();
    bytes[4321] ^= 0x10;
    std::fs::write(&held, &bytes).unwrap();
    let mtime = std::fs::metadata(tree.join("sub/small"))
        .unwrap()
        .modified()
        .unwrap();
    std::fs::File::open(&held)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let stderr = fails(run(&[]));
    assert!(
        stderr.contains(
            "sub/small: the file already here has the source's size and mtime but not its content"
        ) && stderr.contains("--checksum"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&held).unwrap(), bytes, "left as it is");

    let replaced = summary(&ok(run(&["--checksum", "--json"])));
    assert_eq!(
        replaced["bytes"], 5000,
        "only the changed file is sent: {replaced}"
    );
    assert_same_tree(src.path(), root.path());
}
