//! `xfer send --dry-run`: it changes nothing at the receiver (not a directory made, not a
//! leftover removed, not a mode or mtime set), and what it lists is what the run after it sends.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::common::*;

/// An entry's size, mode, inode, mtime and ctime (seconds and nanoseconds each): any write,
/// chmod, utime or rename changes one of them.
type Stat = (u64, u32, u64, i64, i64, i64, i64);

/// Everything under `root`, hidden part files and journals too.
fn snapshot(root: &Path) -> BTreeMap<String, Stat> {
    entries(root)
        .into_iter()
        .map(|rel| {
            let m = std::fs::symlink_metadata(root.join(&rel)).unwrap();
            let key = rel.to_string_lossy().into_owned();
            (
                key,
                (
                    m.len(),
                    m.mode(),
                    m.ino(),
                    m.mtime(),
                    m.mtime_nsec(),
                    m.ctime(),
                    m.ctime_nsec(),
                ),
            )
        })
        .collect()
}

/// The one JSON object of `--dry-run --json`.
fn dry_run(receiver: &Receiver, args: &[&str]) -> serde_json::Value {
    let out = ok(send(receiver, &[args, &["--dry-run", "--json"]].concat()));
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["type"], "dry_run", "{report}");
    report
}

/// The path and action of each file a dry run listed.
fn actions(report: &serde_json::Value) -> BTreeMap<String, String> {
    (report["files"].as_array().unwrap().iter())
        .map(|f| {
            (
                f["path"].as_str().unwrap().into(),
                f["action"].as_str().unwrap().into(),
            )
        })
        .collect()
}

#[test]
fn a_dry_run_changes_nothing_and_lists_what_the_run_after_it_sends() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    std::fs::create_dir_all(tree.join("sub/empty")).unwrap();
    write_data(&tree.join("big.bin"), 48 << 20, seed());
    write_data(&tree.join("kept.bin"), 1 << 20, 1);
    write_data(&tree.join("changed.bin"), 1 << 20, 2);
    let receiver = Receiver::start(root.path());
    let tree_arg = tree.to_str().unwrap();
    ok(send(
        &receiver,
        &[tree_arg, &receiver.addr, "--exclude", "big.bin", "-q"],
    ));
    // Half of big.bin arrives before its sender is killed: a part file and its journal.
    let mut first = xfer();
    first
        .arg("send")
        .args([tree_arg, &receiver.addr, "--include", "big.bin", "--json"])
        .args(["--streams", "2", "--stream-rate-cap", "40"])
        .env("XFER_KEY", &receiver.key);
    kill_at_first_ack(first);
    wait_for_session_end(&receiver);
    write_data(&tree.join("changed.bin"), 1 << 20, 3);
    set_mtime(&tree.join("changed.bin"), 1_600_000_000, 0);
    write_data(&tree.join("sub/new.bin"), 300_000, 4);

    let before = snapshot(root.path());
    assert!(
        before.keys().any(|k| k.ends_with(".xfer-part")),
        "big.bin left a part file: {before:?}"
    );
    let report = dry_run(&receiver, &[tree_arg, &receiver.addr]);
    assert_eq!(
        snapshot(root.path()),
        before,
        "the dry run changed the receiver's root"
    );
    let listed = actions(&report);
    let expected = [
        ("tree/big.bin", "resume"),
        ("tree/changed.bin", "send"),
        ("tree/kept.bin", "skip"),
        ("tree/sub/new.bin", "send"),
    ];
    assert_eq!(
        listed,
        expected.map(|(p, a)| (p.into(), a.into())).into(),
        "{report}"
    );
    let to_send = report["bytes_to_send"].as_u64().unwrap();
    let big = &report["files"][0];
    assert!(big["to_send"].as_u64() < Some(48 << 20), "{big}");

    // The run: it sends exactly the bytes listed, and exactly the files listed as sent or
    // resumed appear anew under their final names.
    let summary = summary(&ok(send(&receiver, &[tree_arg, &receiver.addr, "--json"])));
    assert_eq!(
        summary["bytes"].as_u64(),
        Some(to_send),
        "{summary} after {report}"
    );
    let after = snapshot(root.path());
    let written: BTreeMap<String, String> = (listed.keys())
        .map(|path| {
            let rewritten = before.get(path).map(|b| b.2) != after.get(path).map(|a| a.2);
            (
                path.clone(),
                if rewritten { "written" } else { "untouched" }.into(),
            )
        })
        .collect();
    let want = listed
        .iter()
        .map(|(p, a)| {
            (
                p.clone(),
                if a == "skip" { "untouched" } else { "written" }.into(),
            )
        })
        .collect::<BTreeMap<String, String>>();
    assert_eq!(written, want);
    assert_same_tree(src.path(), root.path());

    // Into a directory that is not there, everything is to send, and the directory stays
    // missing; the text form totals it.
    let out = ok(send(
        &receiver,
        &[tree_arg, &receiver.dest("nowhere/deep"), "--dry-run"],
    ));
    assert!(!root.path().join("nowhere").exists(), "made by a dry run");
    assert!(out.contains("send      48.00 MiB  tree/big.bin\n"), "{out}");
    assert!(
        out.ends_with(
            "dry run: a run would send 50.29 MiB of 50.29 MiB (4 files whole, 0 resumed, 0 \
             skipped); nothing was sent or changed\n"
        ),
        "{out}"
    );
}

/// --checksum compares only the files the receiver holds (none on a first run); a file
/// rewritten behind its size and mtime is kept by a plain run and sent by --checksum, as the
/// dry run of each says; then an identical tree sends nothing, and says so.
#[test]
fn checksum_sends_a_change_that_kept_size_and_mtime_and_nothing_of_an_identical_tree() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    for i in 0..20 {
        write_data(&tree.join(format!("f{i:02}")), 10_000 + i * 1000, i);
    }
    let receiver = Receiver::start(root.path());
    let tree_arg = tree.to_str().unwrap();
    // Nothing is at the receiver yet: nothing is hashed, on either side.
    let first = summary(&ok(send(
        &receiver,
        &[tree_arg, &receiver.addr, "--checksum", "--json"],
    )));
    assert_eq!(first["compared"]["files"], 0, "{first}");
    let touched = tree.join("f07");
    let mtime = std::fs::metadata(&touched).unwrap().modified().unwrap();
    write_data(&touched, 17_000, 99);
    std::fs::File::options()
        .write(true)
        .open(&touched)
        .unwrap()
        .set_modified(mtime)
        .unwrap();

    let plain = dry_run(&receiver, &[tree_arg, &receiver.addr]);
    assert_eq!(plain["bytes_to_send"], 0, "{plain}");
    let before = snapshot(root.path());
    let by_content = dry_run(&receiver, &[tree_arg, &receiver.addr, "--checksum"]);
    assert_eq!(
        snapshot(root.path()),
        before,
        "the dry run changed the receiver's root"
    );
    assert_eq!(by_content["bytes_to_send"], 17_000, "{by_content}");
    assert_eq!(actions(&by_content)["tree/f07"], "send");

    let sent = summary(&ok(send(
        &receiver,
        &[tree_arg, &receiver.addr, "--checksum", "--json"],
    )));
    assert_eq!(sent["bytes"], 17_000, "{sent}");
    assert_eq!(sent["compared"]["files"], 20, "{sent}");
    assert_eq!(sent["compared"]["changed"], 1, "{sent}");
    assert_same_tree(src.path(), root.path());
    let again = ok(send(&receiver, &[tree_arg, &receiver.addr, "--checksum"]));
    assert!(again.starts_with("sent 0 B in "), "{again}");
    assert!(
        again.contains("20 files") && again.contains("already at the receiver"),
        "{again}"
    );
    assert!(
        again.contains(
            "compared by content (BLAKE3): 20 files already at the receiver, all identical"
        ),
        "{again}"
    );
}
