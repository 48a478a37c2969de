//! `xfer send --delete`: the destination's copy of each directory sent ends as the source,
//! what the filter leaves out and everything beside the directories sent kept; a dry run lists
//! exactly what the run removes and removes nothing.

use std::collections::BTreeSet;
use std::path::Path;

use crate::common::*;

/// The paths a dry run would delete (directories with a `/` after them).
fn listed_deletions(report: &serde_json::Value) -> BTreeSet<String> {
    let removed = &report["removed"];
    (removed["listed"].as_array().unwrap().iter())
        .map(|r| {
            let path = r["path"].as_str().unwrap();
            match r["dir"].as_bool().unwrap() {
                true => format!("{path}/"),
                false => path.to_string(),
            }
        })
        .collect()
}

#[test]
fn delete_removes_what_the_source_lost_keeps_what_the_filter_leaves_out_and_a_dry_run_says_so() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    std::fs::create_dir_all(tree.join("sub/deep")).unwrap();
    std::fs::create_dir_all(tree.join("gone/inner")).unwrap();
    write_data(&tree.join("a.bin"), 3 << 20, seed());
    write_data(&tree.join("old.bin"), 1 << 20, 1);
    write_data(&tree.join("sub/deep/b.bin"), 100_000, 2);
    write_data(&tree.join("gone/inner/c.bin"), 5000, 3);
    write_data(&tree.join("gone/d.bin"), 7000, 4);
    let receiver = Receiver::start(root.path());
    let tree_arg = tree.to_str().unwrap();
    let dest = receiver.dest("mirror");
    ok(send(&receiver, &[tree_arg, &dest, "-q"]));
    let copy = root.path().join("mirror/tree");
    assert_same_tree(&tree, &copy);

    // The source loses a file and a whole directory; the destination gains what only it
    // holds: a file the filter leaves out, a link to a file outside the tree, and a file beside
    // the directory sent.
    std::fs::remove_file(tree.join("old.bin")).unwrap();
    std::fs::remove_dir_all(tree.join("gone")).unwrap();
    write_data(&copy.join("sub/notes.keep"), 10, 5);
    let outside = root.path().join("outside.bin");
    write_data(&outside, 4096, 6);
    std::os::unix::fs::symlink(&outside, copy.join("sub/link")).unwrap();
    write_data(&root.path().join("mirror/beside.bin"), 10, 7);
    let filter = ["--exclude", "*.keep"];

    // A plain run removes nothing.
    let out = ok(send(
        &receiver,
        &[&[tree_arg, &dest, "--json"][..], &filter].concat(),
    ));
    assert_eq!(summary(&out)["removed"]["files"], 0, "{out}");
    assert!(copy.join("old.bin").exists() && copy.join("gone/d.bin").exists());

    let dry = |extra: &[&str]| {
        let args = [
            &[tree_arg, &dest, "--delete", "--dry-run"][..],
            &filter,
            extra,
        ]
        .concat();
        ok(send(&receiver, &args))
    };
    let report: serde_json::Value = serde_json::from_str(dry(&["--json"]).trim()).unwrap();
    let want: BTreeSet<String> = [
        "tree/old.bin",
        "tree/sub/link",
        "tree/gone/inner/c.bin",
        "tree/gone/inner/",
        "tree/gone/d.bin",
        "tree/gone/",
    ]
    .map(String::from)
    .into();
    assert_eq!(listed_deletions(&report), want, "{report}");
    assert_eq!(report["removed"]["files"], 4);
    assert_eq!(report["removed"]["dirs"], 2);
    let link_len = std::fs::symlink_metadata(copy.join("sub/link"))
        .unwrap()
        .len();
    assert_eq!(
        report["removed"]["bytes"],
        (1 << 20) + 5000 + 7000 + link_len,
        "a link counts as itself, not what it points at"
    );
    let text = dry(&[]);
    assert!(text.contains("delete               tree/gone/\n"), "{text}");
    assert!(
        text.contains("and remove 4 files (1.01 MiB) and 2 directories the sources do not hold"),
        "{text}"
    );
    assert!(copy.join("old.bin").exists(), "the dry run removed nothing");
    assert!(copy.join("gone/inner/c.bin").exists());

    let out = ok(send(
        &receiver,
        &[&[tree_arg, &dest, "--delete"][..], &filter].concat(),
    ));
    assert!(
        out.contains("removed 4 files (1.01 MiB) and 2 directories the sources do not hold"),
        "{out}"
    );
    // What is left is the source and what the run had to keep (without which, and once a
    // run has set the directory's mtime again, the copy is the source's).
    assert!(
        copy.join("sub/notes.keep").exists(),
        "the filter's file is kept"
    );
    std::fs::remove_file(copy.join("sub/notes.keep")).unwrap();
    ok(send(&receiver, &[tree_arg, &dest, "-q"]));
    assert_same_tree(&tree, &copy);
    assert!(outside.exists(), "the link's target is kept");
    assert!(root.path().join("mirror/beside.bin").exists());

    // A second mirroring run finds nothing more to remove.
    let again = ok(send(&receiver, &[tree_arg, &dest, "--delete", "--json"]));
    assert_eq!(summary(&again)["removed"]["files"], 0, "{again}");
}

#[test]
fn delete_with_a_file_sent_alone_removes_nothing_beside_it() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let file = src.path().join("one.bin");
    write_data(&file, 4096, seed());
    std::fs::create_dir(root.path().join("inbox")).unwrap();
    write_data(&root.path().join("inbox/other.bin"), 10, 1);
    let receiver = Receiver::start(root.path());
    let dest = receiver.dest("inbox");
    let out = ok(send(
        &receiver,
        &[file.to_str().unwrap(), &dest, "--delete", "--json"],
    ));
    assert_eq!(summary(&out)["removed"]["files"], 0, "{out}");
    assert!(same_bytes(&file, &root.path().join("inbox/one.bin")));
    assert!(Path::new(&root.path().join("inbox/other.bin")).exists());
    let refused = fails(send(
        &receiver,
        &["--mem", "1MiB", &receiver.addr, "--delete"],
    ));
    assert!(refused.contains("cannot be used with"), "{refused}");
}
