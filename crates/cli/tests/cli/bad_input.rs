//! Every bad input ends with a one-line error naming the cause, a non-zero exit, and nothing on
//! the receiver that could be mistaken for a complete file.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::Path;

use crate::common::*;

/// Asserts a single `xfer: error:` line containing every one of `needles`.
fn assert_error(stderr: &str, needles: &[&str]) {
    let lines: Vec<_> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "expected exactly one line on stderr, got:\n{stderr}"
    );
    assert!(lines[0].starts_with("xfer: error: "), "{stderr}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "error {stderr:?} does not mention {needle:?}"
        );
    }
}

fn one_file(dir: &Path) -> std::path::PathBuf {
    let file = dir.join("payload.bin");
    write_data(&file, 4 << 20, 3);
    file
}

#[test]
fn missing_source() {
    let root = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(root.path());
    let stderr = fails(send(
        &receiver,
        &["/nonexistent/xfer-test-source", &receiver.addr],
    ));
    assert_error(
        &stderr,
        &[
            "cannot read source /nonexistent/xfer-test-source",
            "No such file",
        ],
    );
    assert!(entries(root.path()).is_empty());
}

#[test]
fn unreadable_source() {
    let src = tempfile::tempdir().unwrap();
    chmod(src.path(), 0o755);
    let file = one_file(src.path());
    chmod(&file, 0o000);
    let root = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(root.path());
    let mut cmd = xfer();
    cmd.arg("send")
        .arg(&file)
        .arg(&receiver.addr)
        .env("XFER_KEY", &receiver.key);
    if is_root() {
        cmd.uid(65534).gid(65534); // root reads everything; drop to nobody so mode 000 bites
    }
    let stderr = fails(cmd.output().unwrap());
    assert_error(
        &stderr,
        &["cannot read source", "payload.bin", "Permission denied"],
    );
    assert!(entries(root.path()).is_empty());
}

#[test]
fn unreachable_receiver() {
    let src = tempfile::tempdir().unwrap();
    let file = one_file(src.path());
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = xfer()
        .arg("send")
        .arg(&file)
        .arg(closed.to_string())
        .env("XFER_KEY", "0123456789abcdef0123")
        .output()
        .unwrap();
    assert_error(
        &fails(out),
        &[&format!("cannot connect to {closed}"), "refused"],
    );
}

#[test]
fn wrong_key_is_refused_before_any_byte_is_written() {
    let src = tempfile::tempdir().unwrap();
    let file = one_file(src.path());
    let root = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(root.path());
    let out = xfer()
        .arg("send")
        .arg(&file)
        .arg(&receiver.addr)
        .env("XFER_KEY", "not-the-right-key-at-all")
        .output()
        .unwrap();
    assert_error(
        &fails(out),
        &["authentication failed", "does not hold this key"],
    );
    assert!(
        entries(root.path()).is_empty(),
        "{:?}",
        entries(root.path())
    );
    // The receiver logged why, and goes on serving senders with the right key.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !receiver.stderr.lock().unwrap().contains("wrong key") {
        assert!(
            std::time::Instant::now() < deadline,
            "no reason logged: {}",
            receiver.stderr.lock().unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    ok(send(&receiver, &[file.to_str().unwrap(), &receiver.addr]));
    assert_eq!(entries(root.path()).len(), 1);
}

#[test]
fn missing_key() {
    let src = tempfile::tempdir().unwrap();
    let file = one_file(src.path());
    let out = xfer()
        .env_remove("XFER_KEY")
        .arg("send")
        .arg(&file)
        .arg("127.0.0.1:9")
        .output()
        .unwrap();
    assert_error(&fails(out), &["no session key", "XFER_KEY", "--key-file"]);
}

/// A key on the command line is refused (any user could read it in `ps`), and so is a key file
/// others can read; neither reaches the receiver.
#[test]
fn keys_others_could_read_are_refused() {
    let src = tempfile::tempdir().unwrap();
    let file = one_file(src.path());
    let root = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(root.path());
    let out = xfer()
        .arg("send")
        .arg(&file)
        .arg(&receiver.addr)
        .args(["--key", &receiver.key])
        .output()
        .unwrap();
    assert_error(&fails(out), &["--key is not accepted", "XFER_KEY"]);
    let key_file = src.path().join("key");
    std::fs::write(&key_file, &receiver.key).unwrap();
    let send_with_key_file = || {
        xfer()
            .env_remove("XFER_KEY")
            .arg("send")
            .arg(&file)
            .arg(&receiver.addr)
            .arg("--key-file")
            .arg(&key_file)
            .output()
            .unwrap()
    };
    chmod(&key_file, 0o644);
    assert_error(
        &fails(send_with_key_file()),
        &["can be read by other users", "chmod 600"],
    );
    assert!(entries(root.path()).is_empty());
    chmod(&key_file, 0o600);
    ok(send_with_key_file());
    assert_eq!(entries(root.path()).len(), 1);
}

#[test]
fn port_in_use() {
    let root = tempfile::tempdir().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = xfer()
        .args(["recv", "--listen", &addr, "--root"])
        .arg(root.path())
        .output()
        .unwrap();
    assert_error(
        &fails(out),
        &[&format!("cannot listen on {addr}"), "in use"],
    );
}

#[test]
fn receiver_root_missing_or_not_writable() {
    let out = xfer()
        .args([
            "recv",
            "--listen",
            "127.0.0.1:0",
            "--root",
            "/nonexistent/xfer-root",
        ])
        .output()
        .unwrap();
    assert_error(
        &fails(out),
        &[
            "receiver root /nonexistent/xfer-root is not a writable directory",
            "No such file",
        ],
    );
    if !is_root() {
        eprintln!("not root: skipping the read-only mount case");
        return;
    }
    let ro = TmpfsMount::new("ro,size=1m");
    let out = xfer()
        .args(["recv", "--listen", "127.0.0.1:0", "--root"])
        .arg(&ro.path)
        .output()
        .unwrap();
    assert_error(
        &fails(out),
        &["is not a writable directory", "Read-only file system"],
    );
}

#[test]
fn receiver_disk_full() {
    if !is_root() {
        eprintln!("not root: cannot mount a small tmpfs; skipping");
        return;
    }
    let small = TmpfsMount::new("size=1m");
    let src = tempfile::tempdir().unwrap();
    let file = one_file(src.path());
    let receiver = Receiver::start(&small.path);
    let stderr = fails(send(&receiver, &[file.to_str().unwrap(), &receiver.addr]));
    assert_error(
        &stderr,
        &[
            "receiver: cannot write payload.bin",
            "No space left on device",
        ],
    );
    assert!(
        complete_looking_files(&small.path).is_empty(),
        "{:?}",
        entries(&small.path)
    );
}

#[test]
fn destinations_that_leave_the_root_are_refused() {
    let src = tempfile::tempdir().unwrap();
    let file = one_file(src.path());
    let parent = tempfile::tempdir().unwrap();
    let root = parent.path().join("root");
    let outside = parent.path().join("outside");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    let receiver = Receiver::start(&root);
    let cases: [(&str, &[&str]); 4] = [
        ("../outside", &["'..' would leave the receiver's root"]),
        (
            "/etc",
            &["absolute path", "must stay under the receiver's root"],
        ),
        ("link", &["symbolic link", "refusing to write through it"]),
        ("link/deeper", &["symbolic link"]),
    ];
    for (dest, needles) in cases {
        let stderr = fails(send(
            &receiver,
            &[file.to_str().unwrap(), &receiver.dest(dest)],
        ));
        assert_error(&stderr, needles);
    }
    assert!(
        entries(&outside).is_empty(),
        "something was written outside the root: {:?}",
        entries(&outside)
    );
    assert_eq!(entries(&root), vec![std::path::PathBuf::from("link")]);
}

/// A fake receiver that answers every connection with `reply`.
fn fake_receiver(reply: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = listener.accept() {
            let mut hello = [0u8; 64];
            let _ = s.read(&mut hello);
            let _ = s.write_all(&reply);
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    });
    addr
}

#[test]
fn malformed_or_oversized_frames_from_the_receiver() {
    let src = tempfile::tempdir().unwrap();
    let file = one_file(src.path());
    let garbage = fake_receiver(b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec());
    let out = xfer()
        .arg("send")
        .arg(&file)
        .arg(&garbage)
        .env("XFER_KEY", "0123456789abcdef0123")
        .output()
        .unwrap();
    assert_error(&fails(out), &["protocol error", "frame"]);

    let mut huge = (1u32 << 31).to_le_bytes().to_vec();
    huge.push(1);
    let oversized = fake_receiver(huge);
    let out = xfer()
        .arg("send")
        .arg(&file)
        .arg(&oversized)
        .env("XFER_KEY", "0123456789abcdef0123")
        .output()
        .unwrap();
    assert_error(&fails(out), &["oversized frame"]);
}

#[test]
fn garbage_sent_to_the_receiver_is_refused_and_it_keeps_serving() {
    let src = tempfile::tempdir().unwrap();
    let file = one_file(src.path());
    let root = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(root.path());
    for junk in [b"GET / HTTP/1.1\r\n\r\n".to_vec(), vec![0xff; 4096], {
        let mut v = u32::MAX.to_le_bytes().to_vec();
        v.push(2);
        v
    }] {
        let mut s = std::net::TcpStream::connect(&receiver.addr).unwrap();
        let _ = s.write_all(&junk);
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest); // the receiver closes the connection
    }
    assert!(entries(root.path()).is_empty());
    ok(send(&receiver, &[file.to_str().unwrap(), &receiver.addr]));
    assert!(same_bytes(&file, &root.path().join("payload.bin")));
    assert!(
        receiver.stderr.lock().unwrap().contains("refused"),
        "{}",
        receiver.stderr.lock().unwrap()
    );
}

/// `HOST:DIR` is an ssh destination; one who meant a running receiver and left out its port
/// is told how to name it when ssh fails.
#[test]
fn a_destination_without_its_port_says_how_to_name_a_running_receiver() {
    let src = tempfile::tempdir().unwrap();
    let file = one_file(src.path());
    let out = xfer()
        .arg("send")
        .arg(&file)
        .arg("127.0.0.1:incoming")
        // Nothing listens on port 1, so ssh fails at once with its exit status 255.
        .args([
            "--ssh-command",
            "ssh -p 1 -o BatchMode=yes -o ConnectTimeout=5",
        ])
        .output()
        .unwrap();
    let stderr = fails(out);
    assert!(stderr.contains("ssh to 127.0.0.1 failed"), "{stderr}");
    assert!(stderr.contains("127.0.0.1:PORT:incoming"), "{stderr}");
}

/// `xfer --version` names the revision it was built from and the policy built into it, with a
/// hash of the policy's network, so that a report says exactly what ran.
#[test]
fn the_version_names_the_revision_and_the_built_in_policy() {
    let out = xfer().arg("--version").output().unwrap();
    assert!(out.status.success());
    let line = String::from_utf8(out.stdout).unwrap();
    let network = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../models/default/policy.onnx"
    ))
    .unwrap();
    let hash = blake3::hash(&network).to_hex();
    assert!(
        line.starts_with(&format!("xfer {} (revision ", env!("CARGO_PKG_VERSION")))
            && line.contains("built-in policy models/default: PPO")
            && line.contains(&format!("network blake3 {}", &hash[..12])),
        "{line}"
    );
}
