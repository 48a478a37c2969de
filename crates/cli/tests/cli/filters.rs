//! `--include`, `--exclude` and `--files-from`: what a filter leaves out never reaches the
//! receiver, what it keeps arrives byte-identical, and only directories holding a file sent
//! are made there.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;

use crate::common::*;

/// A run's tree: data, logs, a scratch directory, and an empty directory.
fn build_run(tree: &Path) {
    for dir in ["raw/deep", "scratch", "logs", "empty"] {
        std::fs::create_dir_all(tree.join(dir)).unwrap();
    }
    for (i, file) in [
        "a.h5",
        "raw/b.h5",
        "raw/deep/c.h5",
        "raw/notes.txt",
        "scratch/d.h5",
        "logs/run.log",
        "logs/keep.log",
    ]
    .into_iter()
    .enumerate()
    {
        write_data(&tree.join(file), 1000 + i as u64 * 777, i as u64);
    }
}

/// Sends `tree` with `filter` to a fresh receiver; what arrived under it (paths relative to
/// the tree, directories with a trailing `/`), each file checked against its source.
fn arrived(tree: &Path, filter: &[&str], stdin: Option<&[u8]>) -> Vec<String> {
    let root = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(root.path());
    let mut child = xfer()
        .arg("send")
        .arg(tree)
        .arg(&receiver.addr)
        .args(filter)
        .env("XFER_KEY", &receiver.key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or_default()).unwrap();
    drop(input);
    ok(child.wait_with_output().unwrap());
    let landed = root.path().join(tree.file_name().unwrap());
    if !landed.exists() {
        return Vec::new();
    }
    entries(&landed)
        .into_iter()
        .map(|rel| {
            let got = landed.join(&rel);
            if got.is_dir() {
                format!("{}/", rel.display())
            } else {
                assert!(
                    same_bytes(&tree.join(&rel), &got),
                    "{} differs",
                    rel.display()
                );
                rel.display().to_string()
            }
        })
        .collect()
}

#[test]
fn includes_and_excludes_apply_in_order_and_leave_no_empty_directories() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("run");
    build_run(&tree);
    let h5 = ["a.h5", "raw/", "raw/b.h5", "raw/deep/", "raw/deep/c.h5"];
    let mut with_scratch = h5.to_vec();
    with_scratch.extend(["scratch/", "scratch/d.h5"]);
    assert_eq!(arrived(&tree, &["--include", "*.h5"], None), with_scratch);
    let rules = [
        "--exclude",
        "scratch/",
        "--include",
        "*.h5",
        "--exclude",
        "*",
    ];
    assert_eq!(arrived(&tree, &rules, None), h5);
    // The first rule that matches decides: keep.log before *.log.
    assert_eq!(
        arrived(
            &tree,
            &[
                "--include",
                "keep.log",
                "--exclude",
                "*.log",
                "--exclude",
                "/raw/**"
            ],
            None
        ),
        ["a.h5", "logs/", "logs/keep.log", "scratch/", "scratch/d.h5"]
    );
}

#[test]
fn files_from_a_list_on_stdin_send_only_what_it_names() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("run");
    build_run(&tree);
    let lines = b"# the data\nraw/deep\r\n\na.h5\n";
    assert_eq!(
        arrived(&tree, &["--files-from", "-"], Some(lines)),
        ["a.h5", "raw/", "raw/deep/", "raw/deep/c.h5"]
    );
    let nul = b"logs/run.log\0raw/notes.txt\0";
    assert_eq!(
        arrived(
            &tree,
            &["--files-from", "-", "--exclude", "*.txt"],
            Some(nul)
        ),
        ["logs/", "logs/run.log"]
    );
}

#[test]
fn a_pattern_that_is_no_glob_and_a_list_that_leaves_its_source_are_refused() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("run");
    build_run(&tree);
    let root = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(root.path());
    let tree_arg = tree.to_str().unwrap();
    let stderr = fails(send(
        &receiver,
        &[tree_arg, &receiver.addr, "--include", "raw/[ab"],
    ));
    assert!(stderr.contains("include pattern \"raw/[ab\": "), "{stderr}");
    let list = src.path().join("list");
    std::fs::write(&list, "../../etc/passwd\n").unwrap();
    let stderr = fails(send(
        &receiver,
        &[
            tree_arg,
            &receiver.addr,
            "--files-from",
            list.to_str().unwrap(),
        ],
    ));
    assert!(
        stderr.contains("listed path \"../../etc/passwd\": '..' would leave its source"),
        "{stderr}"
    );
    assert!(entries(root.path()).is_empty());
}
