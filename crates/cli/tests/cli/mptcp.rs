//! `--transport mptcp` for real: a sender and a receiver in two network namespaces joined by
//! two veth paths, each held by htb to a different rate. The receiver's path manager announces
//! its second address, the sender's opens a subflow to it, and the transfer must use both
//! paths. Where MPTCP is off (`net.mptcp.enabled = 0` in a namespace), xfer falls back to TCP
//! and says so.

use std::path::Path;

use crate::common::*;
use crate::netns::Namespaces;

const SENDER: usize = 0;
const RECEIVER: usize = 1;
/// The receiver's address on each path (the sender's is .1 on the same /30).
const PATH_A: &str = "10.205.1.2";
const PATH_B: &str = "10.205.2.2";
/// Each path's rate in Mbit/s: B is the faster.
const RATE_A: u32 = 100;
const RATE_B: u32 = 200;

/// Holds the sender's egress on `dev` to `mbit` with htb (the data flows that way).
fn limit(hosts: &Namespaces, dev: &str, mbit: u32) {
    let rate = format!("{mbit}mbit");
    hosts.run(
        SENDER,
        "tc",
        &[
            "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1",
        ],
    );
    hosts.run(
        SENDER,
        "tc",
        &[
            "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", &rate,
            "ceil", &rate,
        ],
    );
}

/// Two hosts joined by paths A and B, rate-limited, with the path managers set up: the
/// receiver announces its address on B, and both sides accept one more subflow.
fn two_paths() -> Option<Namespaces> {
    let hosts = Namespaces::new(2, "the MPTCP test")?;
    let [a, _] = hosts.link(0, (SENDER, "10.205.1.1/30"), (RECEIVER, "10.205.1.2/30"));
    let [b, b_peer] = hosts.link(1, (SENDER, "10.205.2.1/30"), (RECEIVER, "10.205.2.2/30"));
    limit(&hosts, &a, RATE_A);
    limit(&hosts, &b, RATE_B);
    for host in [SENDER, RECEIVER] {
        hosts.run(
            host,
            "ip",
            &[
                "mptcp",
                "limits",
                "set",
                "subflows",
                "2",
                "add_addr_accepted",
                "2",
            ],
        );
    }
    hosts.run(
        RECEIVER,
        "ip",
        &["mptcp", "endpoint", "add", PATH_B, "dev", &b_peer, "signal"],
    );
    Some(hosts)
}

/// `xfer recv` in the receiver's namespace with `args`, listening on every address (so that
/// subflows can join on path B's address too) and reached by the sender on path A's.
fn receiver(hosts: &Namespaces, root: &Path, args: &[&str]) -> Receiver {
    let mut command = hosts.command(RECEIVER, env!("CARGO_BIN_EXE_xfer"));
    command
        .args(["recv", "--listen", "0.0.0.0:0", "--root"])
        .arg(root)
        .args(args);
    let mut receiver = Receiver::spawn(command);
    let port = receiver.addr.rsplit_once(':').unwrap().1.to_string();
    receiver.addr = format!("{PATH_A}:{port}");
    receiver
}

/// `xfer send ARGS...` from the sender's namespace, to completion.
fn send_from(hosts: &Namespaces, receiver: &Receiver, args: &[&str]) -> std::process::Output {
    hosts
        .command(SENDER, env!("CARGO_BIN_EXE_xfer"))
        .arg("send")
        .args(args)
        .env("XFER_KEY", &receiver.key)
        .output()
        .expect("run xfer send")
}

#[test]
fn mptcp_uses_both_paths_and_beats_the_faster_one_alone() {
    let Some(hosts) = two_paths() else { return };
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_data(&src.path().join("data.bin"), 80 << 20, seed());
    let receiver = receiver(&hosts, dst.path(), &["--transport", "mptcp"]);
    let source = src.path().join("data.bin");
    let logs = tempfile::tempdir().unwrap();
    let mi_log = logs.path().join("mi.jsonl");
    let out = ok(send_from(
        &hosts,
        &receiver,
        &[
            "--transport",
            "mptcp",
            "--streams",
            "2",
            "--optimizer",
            "fixed:2",
            "--mi-log",
            mi_log.to_str().unwrap(),
            "--json",
            source.to_str().unwrap(),
            &receiver.addr,
        ],
    ));
    assert_same_tree(src.path(), dst.path());
    let lines = json_lines(&out);
    let summary = summary(&out);
    assert_eq!(summary["transport"], "mptcp", "{summary}");
    // Subflows on both paths, as the sender's kernel reports them (MPTCP_FULL_INFO).
    let remotes: std::collections::BTreeSet<String> = lines
        .iter()
        .filter(|l| l["type"] == "progress")
        .flat_map(|l| l["tcp"].as_array().unwrap().clone())
        .flat_map(|stream| stream["subflows"].as_array().cloned().unwrap_or_default())
        .map(|sf| {
            sf["remote"]
                .as_str()
                .unwrap()
                .rsplit_once(':')
                .unwrap()
                .0
                .to_string()
        })
        .collect();
    assert!(
        remotes.contains(PATH_A) && remotes.contains(PATH_B),
        "subflows went to {remotes:?}; output: {out}"
    );
    // The MI log shows each path's RTT, loss and throughput.
    let records = json_lines(&std::fs::read_to_string(&mi_log).unwrap());
    let both = records
        .iter()
        .find(|r| r["paths"].as_array().is_some_and(|p| p.len() == 2));
    let both = both.unwrap_or_else(|| panic!("no interval with both paths: {records:?}"));
    for path in both["paths"].as_array().unwrap() {
        assert!(path["rtt"].as_f64().unwrap() > 0.0, "{path}");
        assert!(path["throughput"].as_f64().unwrap() > 0.0, "{path}");
        assert!(path["loss"].as_f64().unwrap() >= 0.0, "{path}");
    }
    // Faster than path B can carry on its own (its htb rate, headers included, bounds the
    // goodput of anything that uses it alone) while the transfer runs at full width: the
    // fastest second between progress lines. The whole run's mean also counts its last
    // second, when its last unit drains over one subflow (194 Mbit/s in a run that moved
    // 232 Mbit/s in each of its full seconds).
    let mut last = (0.0, 0.0);
    let mut fastest: f64 = 0.0;
    for line in lines.iter().filter(|l| l["type"] == "progress") {
        let (t, bytes) = (
            line["t"].as_f64().unwrap(),
            line["bytes_acked"].as_f64().unwrap(),
        );
        if t > last.0 {
            fastest = fastest.max((bytes - last.1) * 8.0 / (t - last.0) / 1e6);
        }
        last = (t, bytes);
    }
    assert!(
        fastest > f64::from(RATE_B),
        "{fastest:.0} Mbit/s is not more than path B's {RATE_B} Mbit/s; output: {out}"
    );
    eprintln!("MPTCP over {RATE_A} + {RATE_B} Mbit/s paths: {fastest:.0} Mbit/s at best");
}

#[test]
fn without_mptcp_the_transfer_falls_back_to_tcp_and_warns() {
    let Some(hosts) = Namespaces::new(2, "the MPTCP fallback test") else {
        return;
    };
    hosts.link(0, (SENDER, "10.205.1.1/30"), (RECEIVER, "10.205.1.2/30"));
    let src = tempfile::tempdir().unwrap();
    write_data(&src.path().join("data.bin"), 3 << 20, seed());
    let source = src.path().join("data.bin");
    let args = ["--transport", "mptcp", "--json", source.to_str().unwrap()];
    // First the sender's host lacks MPTCP, then the receiver's.
    for (off, warning) in [
        (SENDER, "this host cannot open MPTCP sockets"),
        (RECEIVER, "answered as plain TCP"),
    ] {
        hosts.run(off, "sysctl", &["-q", "net.mptcp.enabled=0"]);
        let dst = tempfile::tempdir().unwrap();
        let receiver = receiver(&hosts, dst.path(), &["--transport", "mptcp"]);
        let out = send_from(
            &hosts,
            &receiver,
            &[&args[..], &[receiver.addr.as_str()]].concat(),
        );
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let stdout = ok(out);
        assert!(
            stderr.contains("xfer: warning: ") && stderr.contains(warning),
            "{stderr}"
        );
        assert_eq!(summary(&stdout)["transport"], "tcp");
        assert_same_tree(src.path(), dst.path());
        if off == RECEIVER {
            let logged = receiver.stderr.lock().unwrap().clone();
            assert!(logged.contains("cannot open MPTCP sockets"), "{logged}");
        }
        hosts.run(off, "sysctl", &["-q", "net.mptcp.enabled=1"]);
    }
}

#[test]
fn a_rate_cap_with_mptcp_is_refused_clearly() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write_data(&src.path().join("f"), 1000, 1);
    let receiver = Receiver::start_with(dst.path(), &["--transport", "mptcp"]);
    let stderr = fails(send(
        &receiver,
        &[
            "--transport",
            "mptcp",
            "--stream-rate-cap",
            "50",
            src.path().join("f").to_str().unwrap(),
            &receiver.addr,
        ],
    ));
    assert!(
        stderr.contains("xfer: error: a per-stream rate cap needs TCP"),
        "{stderr}"
    );
    assert!(entries(dst.path()).is_empty());
}

/// Resume, encryption, end-to-end verification and a live optimiser work over MPTCP as over
/// TCP: a sender killed mid-transfer, then a re-run that sends only what is missing.
#[test]
fn an_interrupted_mptcp_transfer_resumes_encrypted_and_verified() {
    let Some(hosts) = two_paths() else { return };
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_data(&src.path().join("big.bin"), 64 << 20, seed());
    write_data(&src.path().join("small.bin"), 1000, seed() ^ 1);
    let receiver = receiver(&hosts, dst.path(), &["--transport", "mptcp"]);
    let tree = src.path().to_str().unwrap();
    let args = [
        "--transport",
        "mptcp",
        "--encrypt",
        "--verify",
        "--json",
        tree,
    ];
    // The paths carry at most 300 Mbit/s, so the transfer takes over 1.7 s: kill it at its
    // first progress report (after 1 s), once some bytes are acknowledged.
    let mut first = hosts.command(SENDER, env!("CARGO_BIN_EXE_xfer"));
    first
        .arg("send")
        .args(args)
        .arg(&receiver.addr)
        .env("XFER_KEY", &receiver.key);
    kill_at_first_ack(first);
    let rerun = [&args[..], &["--optimizer", "gd", &receiver.addr]].concat();
    let out = ok(send_from(&hosts, &receiver, &rerun));
    let summary = summary(&out);
    assert_eq!(summary["transport"], "mptcp", "{summary}");
    assert!(
        summary["bytes_skipped"].as_u64().unwrap() > 0,
        "nothing was resumed: {summary}"
    );
    assert_same_tree(
        src.path(),
        &dst.path().join(src.path().file_name().unwrap()),
    );
}
