//! `xfer send PATH... USER@HOST:DIR` starting its receiver over ssh, and `xfer send
//! USER@HOST:PATH...` starting its sender there (a pull, a third-party transfer), for real:
//! OpenSSH's server runs in a network namespace of the test with a generated host key and
//! client key pair, xfer runs in a second namespace joined to it by a veth pair, and reaches
//! it through a host alias of an ssh config file (so the user's ssh config is what names the
//! address).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::netns::Namespaces;

/// The sshd's address inside its namespace (the namespaces are the test's own, so fixed
/// private addresses cannot collide with anything).
const REMOTE_ADDR: &str = "10.204.0.2";
/// The host alias the test's ssh config maps to `REMOTE_ADDR`.
pub(crate) const ALIAS: &str = "xfer-test-peer";

/// An sshd in a namespace of its own (1), a sender namespace (0) that reaches it, and an ssh
/// config for the alias. Everything is removed when dropped, also when the test fails.
pub(crate) struct SshPeer {
    sshd: Option<Child>,
    /// The veth device of the sender's namespace, whose counters show what crossed it.
    sender_dev: String,
    // Dropped in this order: sshd is stopped first (in `drop`), then whatever still runs in
    // the namespaces, and the directory goes last.
    hosts: Namespaces,
    dir: tempfile::TempDir,
}

/// The sender's namespace.
const SENDER: usize = 0;
/// The sshd's namespace.
const REMOTE: usize = 1;

fn keygen(path: &Path) {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "xfer-test", "-f"])
        .arg(path)
        .output()
        .expect("run ssh-keygen");
    assert!(out.status.success(), "ssh-keygen failed: {out:?}");
}

impl SshPeer {
    /// Sets everything up; `None` (with the reason printed) when not root, as namespaces and
    /// sshd need it.
    pub(crate) fn start() -> Option<SshPeer> {
        let hosts = Namespaces::new(2, "the ssh start test")?;
        let [sender_dev, _] = hosts.link(0, (SENDER, "10.204.0.1/30"), (REMOTE, "10.204.0.2/30"));
        let mut peer = SshPeer {
            sshd: None,
            sender_dev,
            hosts,
            dir: tempfile::tempdir().unwrap(),
        };
        peer.start_sshd();
        Some(peer)
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Keys, sshd_config, ssh config and known_hosts; then sshd, waited for until it listens.
    fn start_sshd(&mut self) {
        let (host_key, client_key) = (self.path("host_key"), self.path("id"));
        keygen(&host_key);
        keygen(&client_key);
        std::fs::copy(self.path("id.pub"), self.path("authorized_keys")).unwrap();
        let host_pub = std::fs::read_to_string(self.path("host_key.pub")).unwrap();
        std::fs::write(
            self.path("known_hosts"),
            format!("{REMOTE_ADDR} {host_pub}"),
        )
        .unwrap();
        let d = self.dir.path().display();
        std::fs::write(
            self.path("sshd_config"),
            format!(
                "ListenAddress {REMOTE_ADDR}:22\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n\
                 AuthorizedKeysFile {d}/authorized_keys\nPubkeyAuthentication yes\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
                 PermitRootLogin prohibit-password\nStrictModes no\nLogLevel ERROR\n"
            ),
        )
        .unwrap();
        std::fs::write(
            self.path("ssh_config"),
            format!(
                "Host {ALIAS}\n  HostName {REMOTE_ADDR}\n  IdentityFile {d}/id\n  \
                 IdentitiesOnly yes\n  UserKnownHostsFile {d}/known_hosts\n  \
                 GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  BatchMode yes\n  \
                 ConnectTimeout 10\n  LogLevel ERROR\n"
            ),
        )
        .unwrap();
        // sshd refuses to start without its privilege-separation directory.
        std::fs::create_dir_all("/run/sshd").unwrap();
        let mut sshd = self
            .hosts
            .command(REMOTE, "/usr/sbin/sshd")
            .args(["-D", "-e", "-o"])
            .arg("LogLevel=INFO") // for the "Server listening" line; errors only afterwards
            .arg("-f")
            .arg(self.path("sshd_config"))
            .stderr(Stdio::piped())
            .spawn()
            .expect("start sshd (openssh-server is installed by scripts/test)");
        let mut lines = BufReader::new(sshd.stderr.take().unwrap()).lines();
        let mut seen = String::new();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("Server listening") => break,
                Some(Ok(line)) => seen.push_str(&line),
                _ => panic!("sshd did not start: {seen}"),
            }
        }
        std::thread::spawn(move || lines.for_each(drop));
        self.sshd = Some(sshd);
    }

    /// `xfer send ARGS...` in the sender's namespace, with the test's ssh config, running
    /// `remote_xfer` on the remote side.
    pub(crate) fn send(&self, args: &[&str], remote_xfer: &str) -> Command {
        let mut cmd = self.hosts.command(SENDER, env!("CARGO_BIN_EXE_xfer"));
        cmd.arg("send")
            .args(args)
            .arg("--ssh-command")
            .arg(format!("ssh -F {}", self.path("ssh_config").display()))
            .args(["--remote-xfer", remote_xfer])
            .env_remove("XFER_KEY");
        cmd
    }

    pub(crate) fn run(&self, args: &[&str]) -> Output {
        self.send(args, env!("CARGO_BIN_EXE_xfer"))
            .output()
            .expect("run xfer send")
    }

    /// Bytes received and sent so far through the sender's namespace's link.
    pub(crate) fn sender_link_bytes(&self) -> u64 {
        ["rx_bytes", "tx_bytes"]
            .iter()
            .map(|counter| {
                let out = self
                    .hosts
                    .command(SENDER, "cat")
                    .arg(format!(
                        "/sys/class/net/{}/statistics/{counter}",
                        self.sender_dev
                    ))
                    .output()
                    .unwrap();
                String::from_utf8(out.stdout)
                    .unwrap()
                    .trim()
                    .parse::<u64>()
                    .unwrap()
            })
            .sum()
    }

    /// Processes in the remote namespace other than sshd's listener: their command lines.
    fn remote_processes(&self) -> Vec<String> {
        self.remote_pids().into_iter().map(|(_, cmd)| cmd).collect()
    }

    /// Processes in the remote namespace other than sshd's listener: their pids and command
    /// lines.
    pub(crate) fn remote_pids(&self) -> Vec<(u32, String)> {
        let sshd = self.sshd.as_ref().map(Child::id).unwrap_or_default();
        self.hosts
            .pids(REMOTE)
            .into_iter()
            .filter(|&pid| pid != sshd)
            .filter_map(|pid| {
                let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).ok()?;
                Some((pid, cmd.replace('\0', " ")))
            })
            .collect()
    }

    /// Waits until nothing but sshd's listener runs in the remote namespace, `after` an event.
    pub(crate) fn assert_remote_side_ends(&self, after: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let left = self.remote_processes();
            if left.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "still running on the remote side {within:?} after {after}: {left:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for SshPeer {
    fn drop(&mut self) {
        if let Some(mut sshd) = self.sshd.take() {
            let _ = sshd.kill();
            let _ = sshd.wait();
        }
    }
}

/// A small tree: files of a few sizes (one spanning several units), a subdirectory, modes and
/// a name with a space.
pub(crate) fn build_tree(root: &Path) {
    std::fs::create_dir_all(root.join("sub dir")).unwrap();
    write_data(&root.join("big.bin"), 9 << 20, 1);
    write_data(&root.join("sub dir/small"), 1000, 2);
    write_data(&root.join("empty"), 0, 3);
    chmod(&root.join("sub dir/small"), 0o640);
    set_mtime(&root.join("big.bin"), 1_600_000_000, 123_456_789);
}

#[test]
fn ssh_start_sends_a_tree_resumes_and_leaves_nothing_running() {
    let Some(peer) = SshPeer::start() else { return };
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    build_tree(&tree);
    // The remote directory does not exist yet: the receiver creates it.
    let remote_dir = peer.path("remote/incoming");
    let dest = format!("root@{ALIAS}:{}", remote_dir.display());
    let tree_arg = tree.to_str().unwrap();
    // A dry run first lists everything, and makes no directory there.
    let dry = ok(peer.run(&[tree_arg, &dest, "--dry-run", "--json"]));
    let dry: serde_json::Value = serde_json::from_str(dry.trim()).unwrap();
    assert_eq!(dry["bytes_to_send"], (9 << 20) + 1000, "{dry}");
    assert!(
        !peer.path("remote").exists(),
        "a dry run made the remote directory"
    );
    peer.assert_remote_side_ends("a dry run", Duration::from_secs(5));
    let first = summary(&ok(peer.run(&[
        tree_arg,
        &dest,
        "--streams",
        "3",
        "--json",
    ])));
    assert_eq!(first["bytes"], (9 << 20) + 1000);
    assert_same_tree(&tree, &remote_dir.join("tree"));
    peer.assert_remote_side_ends("a completed transfer", Duration::from_secs(5));

    // Again, over MPTCP (the remote receiver is started with the sender's transport):
    // everything is there already, so nothing is sent.
    let again = summary(&ok(peer.run(&[
        tree_arg,
        &dest,
        "--transport",
        "mptcp",
        "--json",
    ])));
    assert_eq!(again["bytes_skipped"], (9 << 20) + 1000);
    let dry = ok(peer.run(&[tree_arg, &dest, "--dry-run"]));
    assert!(
        dry.contains("skip       9.00 MiB  tree/big.bin (already there)\n"),
        "{dry}"
    );
    assert_eq!(again["transport"], "mptcp", "{again}");
    assert_same_tree(&tree, &remote_dir.join("tree"));
    peer.assert_remote_side_ends("a transfer with nothing to send", Duration::from_secs(5));

    // A file more, over QUIC: only it is sent.
    write_data(&tree.join("sub dir/added.bin"), 3 << 20, 5);
    let quic = summary(&ok(peer.run(&[
        tree_arg,
        &dest,
        "--transport",
        "quic",
        "--streams",
        "2",
        "--json",
    ])));
    assert_eq!(quic["bytes"], 3 << 20, "{quic}");
    assert_eq!(quic["transport"], "quic", "{quic}");
    assert_same_tree(&tree, &remote_dir.join("tree"));
    peer.assert_remote_side_ends("a QUIC transfer", Duration::from_secs(5));
}

#[test]
fn ssh_start_failures_are_clear_and_leave_nothing_running() {
    let Some(peer) = SshPeer::start() else { return };
    let src = tempfile::tempdir().unwrap();
    write_data(&src.path().join("f"), 1000, 4);
    let file = src.path().join("f");
    let dest = format!("root@{ALIAS}:{}", peer.path("remote").display());

    let out = peer
        .send(&[file.to_str().unwrap(), &dest], "/nonexistent/xfer")
        .output()
        .unwrap();
    let err = fails(out);
    assert!(
        err.contains("was not found on") && err.contains("--remote-xfer"),
        "{err}"
    );

    let err = fails(peer.run(&[file.to_str().unwrap(), "root@no-such-host.invalid:x"]));
    assert!(err.contains("no-such-host.invalid"), "{err}");
    assert!(!peer.path("remote").exists());
    peer.assert_remote_side_ends("failed starts", Duration::from_secs(5));
}

/// Starts a paced memory-to-memory send (still running seconds later) and waits until its
/// remote receiver runs.
fn start_paced_send(peer: &SshPeer) -> Child {
    let dest = format!("root@{ALIAS}:");
    let mut sender = peer
        .send(
            &[
                "--mem",
                "10GiB",
                &dest,
                "--streams",
                "2",
                "--stream-rate-cap",
                "50",
            ],
            env!("CARGO_BIN_EXE_xfer"),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !peer
        .remote_processes()
        .iter()
        .any(|cmd| cmd.contains("recv --over-ssh"))
    {
        assert!(
            Instant::now() < deadline,
            "the remote receiver never started"
        );
        assert!(
            sender.try_wait().unwrap().is_none(),
            "the sender ended early"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    sender
}

#[test]
fn the_remote_receiver_ends_with_its_sender_or_its_ssh_channel() {
    let Some(peer) = SshPeer::start() else { return };
    // The sender killed mid-transfer.
    let mut sender = start_paced_send(&peer);
    sender.kill().unwrap();
    sender.wait().unwrap();
    peer.assert_remote_side_ends("the sender was killed", Duration::from_secs(10));

    // The ssh channel lost while the session's connections stay open (the sender is stopped,
    // its ssh client killed): the receiver must not wait for them to time out.
    let mut sender = start_paced_send(&peer);
    let pid = sender.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let ssh = Command::new("pgrep")
        .args(["-P", &pid, "ssh"])
        .output()
        .unwrap();
    let ssh = String::from_utf8(ssh.stdout).unwrap();
    assert!(!ssh.trim().is_empty(), "the sender runs no ssh client");
    for pid in ssh.split_whitespace() {
        assert!(Command::new("kill")
            .args(["-9", pid])
            .status()
            .unwrap()
            .success());
    }
    peer.assert_remote_side_ends("its ssh client was killed", Duration::from_secs(10));
    sender.kill().unwrap();
    sender.wait().unwrap();
}

#[test]
fn a_pull_fetches_a_tree_identical_after_a_dry_run_that_makes_nothing_here() {
    let Some(peer) = SshPeer::start() else { return };
    let tree = peer.path("remote/data/tree");
    build_tree(&tree);
    std::fs::create_dir_all(tree.join("empty dir")).unwrap();
    let total = (9u64 << 20) + 1000;
    let source = format!("root@{ALIAS}:{}", tree.display());
    let here_dir = tempfile::tempdir().unwrap();
    let here = here_dir.path().join("fetched");
    let here_arg = here.to_str().unwrap();

    let dry = ok(peer.run(&[&source, here_arg, "--dry-run"]));
    assert!(dry.contains("send       9.00 MiB  tree/big.bin\n"), "{dry}");
    assert!(
        dry.contains("dry run: a run would send 9.00 MiB of 9.00 MiB"),
        "{dry}"
    );
    assert!(!here.exists(), "a dry run made the local directory");
    peer.assert_remote_side_ends("a dry run", Duration::from_secs(5));

    // The remote sender's reports come back: progress, the JSON summary, and the MI log
    // written here (the limit makes the transfer last a few intervals).
    let mi_log = here_dir.path().join("mi.jsonl");
    let first = ok(peer.run(&[
        &source,
        here_arg,
        "--rate-limit",
        "40Mbit",
        "--optimizer",
        "gd",
        "--mi",
        "100ms",
        "--mi-log",
        mi_log.to_str().unwrap(),
        "--json",
    ]));
    assert!(
        json_lines(&first).iter().any(|l| l["type"] == "progress"),
        "{first}"
    );
    assert_eq!(summary(&first)["bytes"], total, "{first}");
    assert_same_tree(&tree, &here.join("tree"));
    let log = std::fs::read_to_string(&mi_log).unwrap();
    assert!(!log.is_empty(), "the MI log of a pull is empty");
    for line in log.lines() {
        let record: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(
            record["streams"].as_u64().is_some() && record["controller"] == "gd",
            "{line}"
        );
    }
    peer.assert_remote_side_ends("a pull", Duration::from_secs(5));

    // Again, as text: nothing to fetch.
    let again = ok(peer.run(&[&source, here_arg]));
    assert!(
        again.starts_with("received 0 B in ") && again.contains("9.00 MiB already at the receiver"),
        "{again}"
    );
    peer.assert_remote_side_ends("a pull with nothing to fetch", Duration::from_secs(5));

    // A file more, over QUIC (the receiver here serves the sender's transport): only it comes.
    write_data(&tree.join("sub dir/added.bin"), 2 << 20, 7);
    let quic = summary(&ok(peer.run(&[
        &source,
        here_arg,
        "--transport",
        "quic",
        "--streams",
        "2",
        "--json",
    ])));
    assert_eq!(quic["bytes"], 2 << 20, "{quic}");
    assert_eq!(quic["transport"], "quic", "{quic}");
    assert_same_tree(&tree, &here.join("tree"));

    // Refusals that name the way out, before anything starts.
    let err = fails(peer.run(&[&source, tree.to_str().unwrap(), here_arg]));
    assert!(err.contains("some sources are on another host"), "{err}");
    let err = fails(peer.run(&[tree.to_str().unwrap(), here_arg]));
    assert!(err.contains("is a directory on this host"), "{err}");
}

#[test]
fn a_third_party_transfer_goes_directly_and_resumes_after_a_kill() {
    let Some(peer) = SshPeer::start() else { return };
    let tree = peer.path("a/tree");
    build_tree(&tree);
    write_data(&tree.join("large.bin"), 24 << 20, 6);
    let total = (33u64 << 20) + 1000;
    let source = format!("root@{ALIAS}:{}", tree.display());
    let dest_dir = peer.path("b/incoming");
    let dest = format!("root@{ALIAS}:{}", dest_dir.display());
    let crossed = peer.sender_link_bytes();

    // Stopped by SIGTERM once data moves (the limit keeps it running for seconds).
    sigterm_once_data_moves(&mut peer.send(
        &[&source, &dest, "--rate-limit", "30Mbit", "--json"],
        env!("CARGO_BIN_EXE_xfer"),
    ));
    peer.assert_remote_side_ends("a stopped third-party transfer", Duration::from_secs(10));

    let second = summary(&ok(peer.run(&[&source, &dest, "--json"])));
    let sent = second["bytes"].as_u64().unwrap();
    assert!(
        sent < total,
        "the second run sent everything again: {second}"
    );
    assert_eq!(
        sent + second["bytes_skipped"].as_u64().unwrap(),
        total,
        "{second}"
    );
    assert_same_tree(&tree, &dest_dir.join("tree"));
    peer.assert_remote_side_ends("a third-party transfer", Duration::from_secs(5));
    // Only ssh's control traffic and the reports crossed the host that asked.
    let crossed = peer.sender_link_bytes() - crossed;
    assert!(
        crossed < total / 16,
        "{crossed} bytes crossed the asking host's link for a {total}-byte transfer"
    );
}
