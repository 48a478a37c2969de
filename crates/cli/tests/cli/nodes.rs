//! `xfer send --nodes FILE PATH... DIR`: a transfer striped over node pairs, every node started
//! over ssh by the head, for real. The sshd of [`SshPeer`] stands for every node, sending and
//! receiving, so all of them share its file system as a site's data-transfer nodes share
//! theirs. The tree arrives identical with a run per pair in the summary; run again over
//! fewer pairs, nothing is sent; with a node's sender or receiver killed mid-transfer, another
//! pair takes its stripe over and the transfer completes, identical, saying so.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;
use crate::ssh_start::{build_tree, SshPeer, ALIAS};

/// A node list of `pairs` pairs, every node the test's sshd.
fn node_list(peer: &SshPeer, pairs: usize) -> PathBuf {
    let list = peer.path(&format!("nodes-{pairs}"));
    let line = format!("root@{ALIAS} root@{ALIAS}\n");
    std::fs::write(
        &list,
        format!("# sending node, receiving node\n{}", line.repeat(pairs)),
    )
    .unwrap();
    list
}

/// A tree of small files and large ones cut into several 16 MiB pieces (so that every pair
/// has pieces of files other pairs send too), on the "sending nodes"; its size.
fn striped_tree(peer: &SshPeer) -> (PathBuf, u64) {
    let tree = peer.path("a/tree");
    build_tree(&tree);
    write_data(&tree.join("large-1.bin"), 40 << 20, 11);
    write_data(&tree.join("sub dir/large-2.bin"), (33 << 20) + 5, 12);
    (tree, (82u64 << 20) + 1005)
}

fn text(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn a_tree_striped_over_three_node_pairs_arrives_identical_and_a_rerun_over_two_sends_nothing() {
    let Some(peer) = SshPeer::start() else { return };
    let (tree, total) = striped_tree(&peer);
    let dest = peer.path("b/incoming");
    let three = node_list(&peer, 3);
    let crossed = peer.sender_link_bytes();
    let first = summary(&ok(peer.run(&[
        "--nodes",
        text(&three),
        text(&tree),
        text(&dest),
        "--json",
    ])));
    // The head's link carries ssh and the reports only: the data goes from node to node.
    let crossed = peer.sender_link_bytes() - crossed;
    println!("the head's link carried {crossed} bytes for a {total}-byte striped transfer");
    assert!(
        crossed < total / 64,
        "{crossed} bytes crossed the head's link for a {total}-byte transfer"
    );
    assert_eq!(first["bytes"], total, "{first}");
    assert_eq!(first["bytes_skipped"], 0, "{first}");
    let runs = first["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{first}");
    for (i, run) in runs.iter().enumerate() {
        assert_eq!(run["node"], i, "{first}");
        assert_eq!(run["stripe"], format!("{i}/3"), "{first}");
        assert!(run["bytes"].as_u64().unwrap() > 0, "{first}");
        assert!(run.get("failed").is_none(), "{first}");
    }
    assert_same_tree(&tree, &dest.join("tree"));
    peer.assert_remote_side_ends("a striped transfer", Duration::from_secs(5));

    // Again over two pairs, shown as a user sees it: everything is there, nothing is sent.
    let two = node_list(&peer, 2);
    let again = ok(peer.run(&["--nodes", text(&two), text(&tree), text(&dest)]));
    assert!(again.starts_with("sent 0 B in "), "{again}");
    assert!(
        again.contains("82.00 MiB already at the receiver"),
        "{again}"
    );
    let pair = format!("(root@{ALIAS} -> root@{ALIAS})");
    assert!(
        again.contains(&format!("\nnode 0 {pair}: stripe 0/2, 0 B from 0.00 s to ")),
        "{again}"
    );
    assert!(
        again.contains(&format!("\nnode 1 {pair}: stripe 1/2, ")),
        "{again}"
    );
    assert_same_tree(&tree, &dest.join("tree"));
    peer.assert_remote_side_ends(
        "a striped transfer that sent nothing",
        Duration::from_secs(5),
    );
}

/// Starts a striped transfer over three pairs, each held to a rate at which it takes seconds,
/// kills the first remote process whose command line holds `victim` once data moves, and
/// checks that another pair took the killed one's stripe over and the tree arrived identical.
fn one_node_killed_mid_transfer(victim: &str) {
    let Some(peer) = SshPeer::start() else { return };
    let (tree, total) = striped_tree(&peer);
    let dest = peer.path("b/incoming");
    let list = node_list(&peer, 3);
    let mut head = peer
        .send(
            &[
                "--nodes",
                text(&list),
                text(&tree),
                text(&dest),
                "--rate-limit",
                "40Mbit",
                "--json",
            ],
            env!("CARGO_BIN_EXE_xfer"),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(head.stdout.take().unwrap()).lines();
    // The head's time when data moved: the kill follows at once.
    let moving = lines.by_ref().map_while(Result::ok).find_map(|line| {
        let l = serde_json::from_str::<serde_json::Value>(&line).ok()?;
        (l["type"] == "progress" && l["bytes_acked"].as_u64() > Some(0)).then(|| l["t"].clone())
    });
    let killed_at = moving.expect("no progress came back");
    let killed = peer
        .remote_pids()
        .into_iter()
        .find(|(_, cmd)| cmd.contains(victim))
        .unwrap_or_else(|| panic!("no {victim:?} runs: {:?}", peer.remote_pids()));
    let kill = Command::new("kill")
        .args(["-KILL", &killed.0.to_string()])
        .status();
    assert!(kill.unwrap().success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let out = head.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the head failed: {err}");
    let summary = summary(rest.last().expect("a summary"));
    // Shown with --nocapture: what the head said, when the node was killed and when each run
    // started and ended (on the head's clock).
    println!(
        "{err}killed at {killed_at} s\n{}",
        serde_json::to_string_pretty(&summary["runs"]).unwrap()
    );
    let runs = summary["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "{summary}");
    let failed: Vec<_> = runs.iter().filter(|r| r.get("failed").is_some()).collect();
    assert_eq!(failed.len(), 1, "{summary}");
    let (node, stripe) = (&failed[0]["node"], &failed[0]["stripe"]);
    let took = &runs[3];
    assert_eq!(&took["took_over_from"], node, "{summary}");
    assert_eq!(&took["stripe"], stripe, "{summary}");
    assert_ne!(&took["node"], node, "{summary}");
    assert!(
        err.contains(&format!(
            "node {node} (root@{ALIAS} -> root@{ALIAS}) failed: "
        )) && err.contains(&format!(
            "its stripe {} goes to node",
            stripe.as_str().unwrap()
        )),
        "{err}"
    );
    // Every byte is accounted for: sent by a run, or found at the receivers.
    assert_eq!(
        summary["bytes"].as_u64().unwrap() + summary["bytes_skipped"].as_u64().unwrap(),
        total,
        "{summary}"
    );
    assert_same_tree(&tree, &dest.join("tree"));
    peer.assert_remote_side_ends(
        "a striped transfer with a node killed",
        Duration::from_secs(10),
    );
}

#[test]
fn a_sending_node_killed_mid_transfer_has_its_stripe_taken_over_and_the_tree_arrives_identical() {
    one_node_killed_mid_transfer("send --over-ssh");
}

#[test]
fn a_receiving_node_killed_mid_transfer_has_its_stripe_taken_over_and_the_tree_arrives_identical() {
    one_node_killed_mid_transfer("recv --over-ssh");
}

#[test]
fn a_node_list_that_is_not_one_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("nodes");
    std::fs::write(&list, "dtn1 dtn-b1\ndtn2\n").unwrap();
    let err = fails(
        xfer()
            .args(["send", "--nodes", text(&list), "/data/run7", "/incoming"])
            .output()
            .unwrap(),
    );
    assert!(
        err.contains("line 2: a node pair is written SENDER RECEIVER"),
        "{err}"
    );
    std::fs::write(&list, "dtn1 dtn-b1\n").unwrap();
    let err = fails(
        xfer()
            .args([
                "send",
                "--nodes",
                text(&list),
                "/data/run7",
                "dtn-b1:/incoming",
            ])
            .output()
            .unwrap(),
    );
    assert!(err.contains("without a host"), "{err}");
    let err = fails(
        xfer()
            .args(["send", "--nodes", text(&list), "/data", "/in", "--verify"])
            .output()
            .unwrap(),
    );
    assert!(err.contains("--verify"), "{err}");
}
