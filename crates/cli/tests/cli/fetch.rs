//! `xfer recv` serving both directions, a key's access deciding which: `xfer send
//! HOST:PORT:PATH... DIR` fetches a tree from under a read key's root, byte-identical; a
//! read-only key cannot write, a write-only key cannot fetch, and nothing outside a key's root
//! is reachable, by `..`, an absolute path or a link; a fetch stopped by a signal says so and
//! resumes.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::common::*;
use crate::netns::Namespaces;

/// A daemon on loopback whose own key may only write (under `dir/own`), with tenants `archive`
/// (read, under `dir/archive`, at most 4 streams a session) and `shared` (read-write, under
/// `dir/shared`), serving third-party transfers if `third_party`; returns it and the two
/// tenants' keys.
fn daemon(dir: &Path, third_party: bool) -> (Receiver, String, String) {
    let (config, archive, shared) = daemon_config(dir, third_party, "127.0.0.1:0");
    let mut command = xfer();
    command.args(["recv", "--config"]).arg(&config);
    (Receiver::spawn(command), archive, shared)
}

/// The configuration file (and the two tenants' keys) of [`daemon`]'s daemon, listening on
/// `listen`.
fn daemon_config(dir: &Path, third_party: bool, listen: &str) -> (PathBuf, String, String) {
    let mut keys = Vec::new();
    for (name, key) in [
        ("own", "own-key-0123456789abcdef"),
        ("archive", "archive-key-0123456789ab"),
        ("shared", "shared-key-0123456789abc"),
    ] {
        std::fs::create_dir_all(dir.join(name)).unwrap();
        let file = dir.join(format!("{name}.key"));
        std::fs::write(&file, key).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        keys.push(key.to_string());
    }
    let at = |name: &str| dir.join(name).display().to_string();
    let config = dir.join("recv.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"{listen}\"\nroot = \"{}\"\nkey = {{ file = \"{}.key\" }}\n\
             [options]\nthird_party = {third_party}\nhandshake_timeout = \"2s\"\n\
             [[tenants]]\nname = \"archive\"\naccess = \"read\"\nroot = \"{}\"\n\
             key = {{ file = \"{}.key\" }}\nmax_streams = 4\n\
             [[tenants]]\nname = \"shared\"\naccess = \"read-write\"\nroot = \"{}\"\n\
             key = {{ file = \"{}.key\" }}\n",
            at("own"),
            at("own"),
            at("archive"),
            at("archive"),
            at("shared"),
            at("shared"),
        ),
    )
    .unwrap();
    (config, keys[1].clone(), keys[2].clone())
}

/// The tree `archive/run7` under `dir`: `raw/a.bin` of `size` bytes, `notes.txt` of 1000 and
/// the empty directory `raw/empty`.
fn run7(dir: &Path, size: u64) -> PathBuf {
    let tree = dir.join("archive/run7");
    std::fs::create_dir_all(tree.join("raw/empty")).unwrap();
    write_data(&tree.join("raw/a.bin"), size, seed());
    write_data(&tree.join("notes.txt"), 1000, 1);
    tree
}

/// `xfer send ARGS...` with `key` in `XFER_KEY`.
fn send_with(key: &str, args: &[&str]) -> std::process::Output {
    xfer()
        .arg("send")
        .args(args)
        .env("XFER_KEY", key)
        .output()
        .unwrap()
}

#[test]
fn a_read_key_fetches_a_tree_identical_and_nothing_outside_its_root() {
    let dir = tempfile::tempdir().unwrap();
    let (daemon, archive_key, shared_key) = daemon(dir.path(), false);
    let tree = run7(dir.path(), 20 << 20);
    chmod(&tree.join("notes.txt"), 0o640);
    set_mtime(&tree.join("raw/a.bin"), 1_600_000_000, 123_456_789);
    set_mtime(&tree.join("raw/empty"), 1_500_000_000, 0);
    // A link in the tree, and one at its root, to a file outside every root.
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "not for fetching").unwrap();
    std::os::unix::fs::symlink(&secret, tree.join("raw/link")).unwrap();
    std::os::unix::fs::symlink(&secret, dir.path().join("archive/out")).unwrap();
    set_mtime(&tree.join("raw"), 1_550_000_000, 0);
    let from = |path: &str| format!("{}:{path}", daemon.addr);
    let here = dir.path().join("here");
    let here_arg = here.to_str().unwrap();

    // A dry run lists what a fetch sends, and makes nothing here.
    let dry = ok(send_with(
        &archive_key,
        &[&from("run7"), here_arg, "--dry-run"],
    ));
    assert!(dry.contains("send      20.00 MiB  run7/raw/a.bin"), "{dry}");
    assert!(!here.exists(), "the dry run made {}", here.display());

    let out = ok(send_with(
        &archive_key,
        &[&from("run7"), here_arg, "--json"],
    ));
    assert_eq!(summary(&out)["bytes"], (20 << 20) + 1000, "{out}");
    // The copy is the tree without its link (which the walk leaves out).
    std::fs::remove_file(tree.join("raw/link")).unwrap();
    set_mtime(&tree.join("raw"), 1_550_000_000, 0);
    assert_same_tree(&tree, &here.join("run7"));
    std::os::unix::fs::symlink(&secret, tree.join("raw/link")).unwrap();
    let again = ok(send_with(&archive_key, &[&from("run7"), here_arg]));
    assert!(again.starts_with("received 0 B"), "{again}");
    assert!(again.contains("already at the receiver"), "{again}");

    // Nothing outside the key's root, however it is named.
    for (path, why) in [
        ("../own", "would leave the receiver's root"),
        ("/etc/passwd", "absolute"),
        ("out", "out: no such file or directory under the root"),
        (
            "missing",
            "missing: no such file or directory under the root",
        ),
    ] {
        let err = fails(send_with(&archive_key, &[&from(path), here_arg]));
        assert!(err.contains(why), "{path}: {err}");
    }
    // A read key writes nothing; the receiver's own key (write) fetches nothing.
    let src = dir.path().join("src.bin");
    write_data(&src, 1000, 2);
    let err = fails(send_with(
        &archive_key,
        &[src.to_str().unwrap(), &from("in")],
    ));
    assert!(
        err.contains("tenant archive may not send files here (its access is read)"),
        "{err}"
    );
    assert!(!dir.path().join("archive/in").exists());
    let err = fails(send_with(&daemon.key, &[&from("run7"), here_arg]));
    assert!(
        err.contains("may not fetch files (its access is write)"),
        "{err}"
    );
    // What a fetch may not ask of the daemon.
    let four = dir.path().join("four");
    let capped = [
        &from("run7"),
        four.to_str().unwrap(),
        "--streams",
        "8",
        "--json",
    ];
    let capped = send_with(&archive_key, &capped);
    let err = String::from_utf8_lossy(&capped.stderr).into_owned();
    assert!(
        err.contains("at most 4 streams: the fetch keeps to them"),
        "{err}"
    );
    let timeline = summary(&ok(capped))["streams_timeline"].clone();
    let most = (timeline.as_array().unwrap().iter())
        .map(|p| p[1].as_u64().unwrap())
        .max();
    assert_eq!(most, Some(4), "{timeline}");
    let optimizer = ["--optimizer", "external:/tmp/agent.sock"];
    let err = fails(send_with(
        &archive_key,
        &[&[&from("run7"), here_arg][..], &optimizer].concat(),
    ));
    assert!(err.contains("runs an agent of its own"), "{err}");

    // This daemon sends to the host that asks only.
    let other = tempfile::tempdir().unwrap();
    let b = Receiver::start(other.path());
    let third = xfer()
        .args(["send", &from("run7"), &b.dest("in")])
        .env("XFER_KEY", &b.key)
        .env("XFER_SOURCE_KEY", &archive_key)
        .output()
        .unwrap();
    let err = fails(third);
    assert!(err.contains("sends only to the host that asks"), "{err}");
    // A read-write key does both: what it sent comes back identical.
    ok(send_with(
        &shared_key,
        &[src.to_str().unwrap(), &from("inbox")],
    ));
    let back = dir.path().join("back");
    ok(send_with(
        &shared_key,
        &[&from("inbox/src.bin"), back.to_str().unwrap()],
    ));
    assert!(same_bytes(&src, &back.join("src.bin")));
}

#[test]
fn a_fetch_stopped_by_sigterm_says_so_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let (daemon, archive_key, _) = daemon(dir.path(), false);
    let file = dir.path().join("archive/big.bin");
    write_data(&file, 48 << 20, seed());
    let from = format!("{}:big.bin", daemon.addr);
    let here = dir.path().join("here");
    sigterm_once_data_moves(
        xfer()
            .args([
                "send",
                &from,
                here.to_str().unwrap(),
                "--json",
                "--streams",
                "2",
            ])
            .args(["--stream-rate-cap", "80", "--unit-size", "1MiB"])
            .env("XFER_KEY", &archive_key),
    );
    // The daemon's sender stopped with it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !daemon
        .stderr
        .lock()
        .unwrap()
        .contains("fetch cancelled by its client")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            daemon.stderr.lock().unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Longer than the daemon's handshake deadline (2 s), in which the client says nothing.
    let rest = [
        &from,
        here.to_str().unwrap(),
        "--json",
        "--rate-limit",
        "60Mbit",
    ];
    let out = ok(send_with(&archive_key, &rest));
    let sent = summary(&out)["bytes"].as_u64().unwrap();
    assert!(
        sent < 48 << 20,
        "the second fetch sent {sent} bytes: all of it again"
    );
    assert!(same_bytes(&file, &here.join("big.bin")));
}

#[test]
fn a_third_party_transfer_between_daemons_goes_with_a_one_time_credential_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let (a, archive_key, _) = daemon(dir.path(), true);
    let tree = run7(dir.path(), 40 << 20);
    let b_root = tempfile::tempdir().unwrap();
    let b = Receiver::start(b_root.path());
    let third_party = |extra: &[&str]| {
        let mut command = xfer();
        command
            .args(["send", &format!("{}:run7", a.addr), &b.dest("in")])
            .args(extra)
            .env("XFER_KEY", &b.key)
            .env("XFER_SOURCE_KEY", &archive_key);
        command
    };
    let missing = xfer()
        .args(["send", &format!("{}:run7", a.addr), &b.dest("in")])
        .env("XFER_KEY", &b.key)
        .env_remove("XFER_SOURCE_KEY")
        .output()
        .unwrap();
    let err = fails(missing);
    assert!(
        err.contains("XFER_SOURCE_KEY or --source-key-file"),
        "{err}"
    );

    // A dry run plans at B and makes nothing there.
    let dry = ok(third_party(&["--dry-run"]).output().unwrap());
    assert!(dry.contains("send      40.00 MiB  run7/raw/a.bin"), "{dry}");
    assert!(!b_root.path().join("in").exists());

    // Stopped part way (the client's SIGTERM cancels A's sender), then run again.
    sigterm_once_data_moves(&mut third_party(&[
        "--json",
        "--streams",
        "2",
        "--stream-rate-cap",
        "80",
    ]));
    let out = ok(third_party(&["--json"]).output().unwrap());
    let report = summary(&out);
    assert!(
        report["bytes"].as_u64().unwrap() < (40 << 20) + 1000,
        "{report}"
    );
    assert_same_tree(&tree, &b_root.path().join("in/run7"));
    let text = ok(third_party(&[]).output().unwrap());
    assert!(text.starts_with("sent 0 B"), "{text}");
}

/// Both daemons in one namespace, the host that asks in another: what crosses the link between
/// them is the request, the credential and the reports, not the data.
#[test]
fn a_transfer_between_daemons_never_crosses_the_host_that_asked() {
    let Some(hosts) = Namespaces::new(2, "the transfer between daemons") else {
        return;
    };
    let [asking_dev, _] = hosts.link(0, (0, "10.205.0.1/30"), (1, "10.205.0.2/30"));
    let dir = tempfile::tempdir().unwrap();
    let (config, archive_key, _) = daemon_config(dir.path(), true, "10.205.0.2:0");
    let tree = run7(dir.path(), 32 << 20);
    let mut command = hosts.command(1, env!("CARGO_BIN_EXE_xfer"));
    command.args(["recv", "--config"]).arg(&config);
    let a = Receiver::spawn(command);
    let b_root = tempfile::tempdir().unwrap();
    let mut command = hosts.command(1, env!("CARGO_BIN_EXE_xfer"));
    command
        .args(["recv", "--listen", "10.205.0.2:0", "--root"])
        .arg(b_root.path());
    let b = Receiver::spawn(command);
    let crossed = || {
        (["rx_bytes", "tx_bytes"].iter())
            .map(|counter| {
                let path = format!("/sys/class/net/{asking_dev}/statistics/{counter}");
                let out = hosts.command(0, "cat").arg(path).output().unwrap();
                String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse::<u64>()
                    .unwrap()
            })
            .sum::<u64>()
    };
    let before = crossed();
    let out = hosts
        .command(0, env!("CARGO_BIN_EXE_xfer"))
        .args(["send", &format!("{}:run7", a.addr), &b.dest("in"), "--json"])
        .env("XFER_KEY", &b.key)
        .env("XFER_SOURCE_KEY", &archive_key)
        .output()
        .unwrap();
    let report = summary(&ok(out));
    assert_eq!(report["bytes"], (32 << 20) + 1000, "{report}");
    assert_same_tree(&tree, &b_root.path().join("in/run7"));
    let through = crossed() - before;
    assert!(
        through < (32 << 20) / 16,
        "{through} bytes crossed the asking host's link for 32 MiB sent"
    );
    eprintln!("{through} bytes crossed the asking host's link for 32 MiB");
}
