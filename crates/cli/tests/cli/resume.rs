//! Resume after SIGKILL of the sender or of the receiver, and changed sources.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use transfer::journal::{Journal, PartPaths, SourceIdentity};

use crate::common::*;

const MIB: u64 = 1 << 20;
const STREAMS: u64 = 4;
const UNIT: u64 = MIB;
/// Bytes of a journal's header and of each of its records ([`transfer::journal`]).
const JOURNAL_HEADER: u64 = 48;
const JOURNAL_RECORD: u64 = 32;

/// A tree of one large, one medium and many small files; returns its total size.
fn build_tree(dir: &Path) -> u64 {
    std::fs::create_dir_all(dir.join("many")).unwrap();
    write_data(&dir.join("large.bin"), 192 * MIB + 12345, 1);
    write_data(&dir.join("medium.bin"), 20 * MIB, 2);
    for i in 0..50u64 {
        write_data(&dir.join(format!("many/f{i:02}")), 100_000 + i, 100 + i);
    }
    192 * MIB + 12345 + 20 * MIB + (0..50).map(|i| 100_000 + i).sum::<u64>()
}

/// Starts `xfer send PATH` with `streams` streams each paced to `mbit` Mbit/s and 1 MiB units, so
/// that a kill or a change lands mid-transfer, and the `extra` options. Stderr is piped for the
/// caller to read.
fn start_paced_send(
    receiver: &Receiver,
    path: &Path,
    streams: u64,
    mbit: u32,
    extra: &[&str],
) -> Child {
    xfer()
        .arg("send")
        .arg(path)
        .arg(&receiver.addr)
        .env("XFER_KEY", &receiver.key)
        .args(["--unit-size", "1MiB"])
        .args([
            "--streams",
            &streams.to_string(),
            "--stream-rate-cap",
            &mbit.to_string(),
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Starts the standard interrupted transfer of `tree` (about 4 x 400 Mbit/s).
fn start_slow_send(receiver: &Receiver, tree: &Path, extra: &[&str]) -> Child {
    start_paced_send(receiver, tree, STREAMS, 400, extra)
}

/// Bytes of `tree` that the receiver holds verifiably under `dest`: complete files plus the
/// journaled ranges of part files that still verify.
fn bytes_held(tree: &Path, dest: &Path) -> u64 {
    let mut held = 0;
    for rel in entries(tree) {
        let (src, dst) = (tree.join(&rel), dest.join(&rel));
        let meta = std::fs::metadata(&src).unwrap();
        if !meta.is_file() {
            continue;
        }
        if std::fs::metadata(&dst).is_ok_and(|m| {
            m.len() == meta.len()
                && m.mtime() == meta.mtime()
                && m.mtime_nsec() == meta.mtime_nsec()
        }) {
            held += meta.len();
            continue;
        }
        let paths = PartPaths::for_final(&dst);
        let Ok(part) = std::fs::File::open(&paths.part) else {
            continue;
        };
        let identity = SourceIdentity::of_metadata(&meta);
        let Ok(journal) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&paths.journal)
        else {
            continue;
        };
        if let Some((_, verified)) = Journal::resume(journal, &part, identity) {
            held += verified.iter().map(|r| r.end - r.start).sum::<u64>();
        }
    }
    held
}

/// Re-runs the send with units of `unit_size` (at most [`UNIT`]) and the `extra` options, and
/// checks it moved only what was missing and ended identical.
fn rerun_and_check(
    receiver: &Receiver,
    src: &Path,
    root: &Path,
    total: u64,
    unit_size: &str,
    extra: &[&str],
) {
    let tree = src.join("tree");
    let missing = total - bytes_held(&tree, &root.join("tree"));
    let streams = STREAMS.to_string();
    let args = [
        tree.to_str().unwrap(),
        &receiver.addr,
        "--streams",
        &streams,
        "--unit-size",
        unit_size,
        "--json",
    ];
    let out = ok(send(receiver, &[&args[..], extra].concat()));
    let summary = summary(&out);
    let (sent, skipped) = (
        summary["bytes"].as_u64().unwrap(),
        summary["bytes_skipped"].as_u64().unwrap(),
    );
    eprintln!(
        "total {total}, missing after the kill {missing}, re-run sent {sent}, skipped {skipped}"
    );
    assert_eq!(sent + skipped, total);
    assert!(
        sent <= missing + STREAMS * UNIT,
        "re-run sent {sent} bytes but only {missing} were missing"
    );
    assert_same_tree(src, root);
}

/// Runs `xfer send PATH ADDR --json EXTRA...` to success; the bytes it sent.
fn bytes_sent(receiver: &Receiver, path: &Path, extra: &[&str]) -> u64 {
    let args = [path.to_str().unwrap(), &receiver.addr, "--json"];
    let out = ok(send(receiver, &[&args[..], extra].concat()));
    summary(&out)["bytes"].as_u64().unwrap()
}

fn random_delay(seed: u64, lo_ms: u64, hi_ms: u64) -> Duration {
    Duration::from_millis(lo_ms + seed % (hi_ms - lo_ms))
}

#[test]
fn sender_killed_at_a_random_point_then_rerun_sends_only_what_is_missing() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let total = build_tree(&src.path().join("tree"));
    let receiver = Receiver::start(root.path());
    let mut sender = start_slow_send(&receiver, &src.path().join("tree"), &[]);
    std::thread::sleep(random_delay(seed(), 200, 900));
    sender.kill().unwrap();
    sender.wait().unwrap();
    wait_for_session_end(&receiver);
    assert!(
        complete_looking_files(root.path()).iter().all(|f| {
            let src_file = src.path().join(f);
            src_file.is_file() && same_bytes(&src_file, &root.path().join(f))
        }),
        "a complete-looking file on the receiver differs from its source"
    );
    rerun_and_check(&receiver, src.path(), root.path(), total, "1MiB", &[]);
}

/// Ctrl-C (SIGINT) and SIGTERM stop a send with one line that says how far it got and that
/// the same command resumes, and the status a shell expects of that signal; the same command
/// then sends only what is missing.
#[test]
fn a_send_stopped_by_a_signal_says_how_to_resume_and_the_same_command_resumes() {
    use rustix::process::{kill_process, Pid, Signal};
    for (signal, name, status) in [(Signal::INT, "SIGINT", 130), (Signal::TERM, "SIGTERM", 143)] {
        let src = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let total = build_tree(&src.path().join("tree"));
        let receiver = Receiver::start(root.path());
        let sender = start_slow_send(&receiver, &src.path().join("tree"), &[]);
        std::thread::sleep(Duration::from_millis(600));
        kill_process(Pid::from_child(&sender), signal).unwrap();
        let out = sender.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{name}: {stderr}");
        assert!(
            stderr.starts_with(&format!("xfer: stopped by {name} after sending "))
                && stderr
                    .trim_end()
                    .ends_with("run the same command again to send the rest")
                && stderr.lines().count() == 1,
            "{name}: expected one line saying how to resume, got: {stderr}"
        );
        wait_for_session_end(&receiver);
        rerun_and_check(&receiver, src.path(), root.path(), total, "1MiB", &[]);
    }
}

#[test]
fn receiver_killed_at_a_random_point_then_rerun_sends_only_what_is_missing() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("key");
    std::fs::write(&key_file, "receiver-kill-test-key-0123456789\n").unwrap();
    std::fs::set_permissions(
        &key_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let total = build_tree(&src.path().join("tree"));
    let mut receiver =
        Receiver::start_with(root.path(), &["--key-file", key_file.to_str().unwrap()]);
    let sender = start_slow_send(&receiver, &src.path().join("tree"), &[]);
    std::thread::sleep(random_delay(seed(), 200, 900));
    receiver.kill();
    let out = sender.wait_with_output().unwrap();
    let stderr = fails(out);
    assert!(
        stderr.contains("xfer: error:") && stderr.lines().count() == 1,
        "expected one error line, got: {stderr}"
    );
    let receiver = Receiver::start_with(root.path(), &["--key-file", key_file.to_str().unwrap()]);
    rerun_and_check(&receiver, src.path(), root.path(), total, "1MiB", &[]);
}

#[test]
fn a_source_changed_since_the_interrupted_attempt_is_sent_again_whole() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let file = src.path().join("data.bin");
    write_data(&file, 64 * MIB, 5);
    let receiver = Receiver::start(root.path());
    let mut sender = start_paced_send(&receiver, &file, 2, 80, &[]);
    let part = PartPaths::for_final(&root.path().join("data.bin"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::metadata(&part.journal)
        .map(|m| m.len())
        .unwrap_or(0)
        < JOURNAL_HEADER + JOURNAL_RECORD * 4
    {
        assert!(Instant::now() < deadline, "no partial data arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
    sender.kill().unwrap();
    sender.wait().unwrap();
    wait_for_session_end(&receiver);

    write_data(&file, 64 * MIB, 6);
    set_mtime(&file, 1_700_000_000, 1);
    assert_eq!(
        bytes_sent(&receiver, &file, &[]),
        64 * MIB,
        "the changed file must be sent whole"
    );
    assert!(same_bytes(&file, &root.path().join("data.bin")));
}

/// Starts a paced send of `file` with `extra` options, waits until at least `chunks` of it
/// are journaled at the receiver, and kills the sender.
fn kill_after_chunks(receiver: &Receiver, file: &Path, root: &Path, chunks: u64, extra: &[&str]) {
    let mut sender = start_paced_send(receiver, file, 2, 80, extra);
    let part = PartPaths::for_final(&root.join(file.file_name().unwrap()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::metadata(&part.journal)
        .map(|m| m.len())
        .unwrap_or(0)
        < JOURNAL_HEADER + JOURNAL_RECORD * chunks
    {
        assert!(Instant::now() < deadline, "no partial data arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
    sender.kill().unwrap();
    sender.wait().unwrap();
    wait_for_session_end(receiver);
}

/// F3 of issue 40: a killed send of one file, then another file of the same name, size and
/// mtime in its place (as `tar x`, `cp -p` or `rsync -t` of regenerated outputs make): the
/// next run sends the new file whole instead of resuming one version onto the other.
#[test]
fn a_killed_send_is_never_resumed_onto_another_file_of_the_same_name_size_and_mtime() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let file = src.path().join("output.h5");
    write_data(&file, 64 * MIB, 13);
    set_mtime(&file, 1_700_000_000, 7);
    let receiver = Receiver::start(root.path());
    kill_after_chunks(&receiver, &file, root.path(), 4, &[]);

    let regenerated = src.path().join("regenerated");
    write_data(&regenerated, 64 * MIB, 14);
    set_mtime(&regenerated, 1_700_000_000, 7);
    std::fs::rename(&regenerated, &file).unwrap();
    assert_eq!(
        bytes_sent(&receiver, &file, &[]),
        64 * MIB,
        "another file must be sent whole"
    );
    assert!(same_bytes(&file, &root.path().join("output.h5")));
}

/// F3 of issue 40: a file rewritten in place while it is sent, its mtime then set back: the
/// sender says it changed and nothing of it is put in place; the next run sends it whole.
#[test]
fn a_file_rewritten_in_place_with_its_mtime_set_back_never_lands_mixed() {
    use std::os::unix::fs::FileExt;
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let file = src.path().join("table.dat");
    write_data(&file, 32 * MIB, 15);
    set_mtime(&file, 1_700_000_000, 3);
    let receiver = Receiver::start(root.path());
    let sender = start_paced_send(&receiver, &file, 1, 80, &[]);
    std::thread::sleep(Duration::from_millis(700));
    let new = src.path().join("new");
    write_data(&new, 32 * MIB, 16);
    let in_place = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    in_place
        .write_all_at(&std::fs::read(&new).unwrap(), 0)
        .unwrap();
    drop(in_place);
    set_mtime(&file, 1_700_000_000, 3);
    let stderr = fails(sender.wait_with_output().unwrap());
    assert!(stderr.contains("changed during the transfer"), "{stderr}");
    assert!(
        complete_looking_files(root.path()).is_empty(),
        "{:?}",
        complete_looking_files(root.path())
    );
    assert_eq!(bytes_sent(&receiver, &file, &[]), 32 * MIB);
    assert!(same_bytes(&new, &root.path().join("table.dat")));
}

/// F3 of issue 40: with `--verify`, a file whose whole-file hash differs from the source's is
/// kept out of place and what the receiver held of it is discarded, so the next run sends it
/// whole and succeeds. The mismatch is made by a chunk of the part file changed behind the
/// receiver's back together with its journal record, so that it still verifies on resume, as
/// a chunk of another version of the source would.
#[test]
fn with_verify_a_file_that_fails_its_hash_is_sent_whole_by_the_next_run() {
    use std::os::unix::fs::FileExt;
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let file = src.path().join("run.bin");
    write_data(&file, 64 * MIB, 17);
    let receiver = Receiver::start(root.path());
    kill_after_chunks(&receiver, &file, root.path(), 2, &["--verify"]);

    let paths = PartPaths::for_final(&root.path().join("run.bin"));
    let journal = std::fs::read(&paths.journal).unwrap();
    let record = &journal[JOURNAL_HEADER as usize..][..JOURNAL_RECORD as usize];
    let offset = u64::from_le_bytes(record[..8].try_into().unwrap());
    let len = u64::from_le_bytes(record[8..16].try_into().unwrap());
    let part = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&paths.part)
        .unwrap();
    let mut chunk = vec![0u8; len as usize];
    part.read_exact_at(&mut chunk, offset).unwrap();
    chunk.iter_mut().for_each(|b| *b = !*b);
    part.write_all_at(&chunk, offset).unwrap();
    // The record gets the changed chunk's checksum and, over its first 24 bytes, the check of
    // its own that a record carries.
    let mut forged = record.to_vec();
    let checksum = transfer::wire::chunk_checksum(&chunk);
    forged[16..24].copy_from_slice(&checksum.to_le_bytes());
    let check = transfer::wire::chunk_checksum(&forged[..24]);
    forged[24..].copy_from_slice(&check.to_le_bytes());
    let journal_file = std::fs::OpenOptions::new()
        .write(true)
        .open(&paths.journal)
        .unwrap();
    journal_file.write_all_at(&forged, JOURNAL_HEADER).unwrap();

    let args = [file.to_str().unwrap(), &receiver.addr, "--verify"];
    let stderr = fails(send(&receiver, &args));
    assert!(
        stderr.contains("BLAKE3 differs") && stderr.contains("send it whole"),
        "{stderr}"
    );
    assert!(!root.path().join("run.bin").exists());
    assert_eq!(bytes_sent(&receiver, &file, &["--verify"]), 64 * MIB);
    assert!(same_bytes(&file, &root.path().join("run.bin")));
}

/// `--checksum` compares files already at the destination by content: one of the same size and
/// mtime but other bytes is sent again (a plain run keeps it), one of the same bytes and
/// another mtime is kept, with the source's mtime given to it.
#[test]
fn with_checksum_files_at_the_destination_are_compared_by_content() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    let (changed, same) = (tree.join("changed.bin"), tree.join("same.bin"));
    write_data(&changed, 3 * MIB, 21);
    write_data(&same, 2 * MIB, 22);
    let receiver = Receiver::start(root.path());
    bytes_sent(&receiver, &tree, &[]);
    let landed = root.path().join("tree");
    // The destination's copy of `changed` rewritten with the same size and mtime; `same`
    // touched to another mtime.
    let mtime = std::fs::metadata(&changed).unwrap().modified().unwrap();
    write_data(&landed.join("changed.bin"), 3 * MIB, 23);
    std::fs::File::open(landed.join("changed.bin"))
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    set_mtime(&landed.join("same.bin"), 1_500_000_000, 0);

    assert_eq!(bytes_sent(&receiver, &tree, &[]), 2 * MIB);
    assert!(!same_bytes(&changed, &landed.join("changed.bin")));

    set_mtime(&landed.join("same.bin"), 1_500_000_000, 0);
    assert_eq!(bytes_sent(&receiver, &tree, &["--checksum"]), 3 * MIB);
    assert_same_tree(src.path(), root.path());
}

#[test]
fn a_source_changed_during_the_transfer_is_detected_and_not_put_in_place() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let file = src.path().join("growing.log");
    write_data(&file, 32 * MIB, 9);
    let receiver = Receiver::start(root.path());
    let sender = start_paced_send(&receiver, &file, 1, 80, &[]);
    std::thread::sleep(Duration::from_millis(500));
    set_mtime(&file, 1_600_000_000, 0);
    let stderr = fails(sender.wait_with_output().unwrap());
    assert!(stderr.contains("changed during the transfer"), "{stderr}");
    assert!(
        complete_looking_files(root.path()).is_empty(),
        "{:?}",
        complete_looking_files(root.path())
    );
}

/// A source cut short by another process while its units are sent (from mapped windows of the
/// file, or with direct reads): the sender stops with a clear error, not killed by SIGBUS, and
/// nothing is put in place.
#[test]
fn a_source_truncated_during_the_transfer_is_detected_and_not_put_in_place() {
    for extra in [&[][..], &["--direct-io"]] {
        let src = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let file = src.path().join("shrinking.bin");
        write_data(&file, 32 * MIB, 10);
        let receiver = Receiver::start(root.path());
        let sender = start_paced_send(&receiver, &file, 1, 80, extra);
        std::thread::sleep(Duration::from_millis(500));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(4 * MIB)
            .unwrap();
        let out = sender.wait_with_output().unwrap();
        assert!(
            out.status.code().is_some(),
            "{extra:?}: killed by a signal: {:?}",
            out.status
        );
        let stderr = fails(out);
        assert!(
            stderr.contains("changed during the transfer"),
            "{extra:?}: {stderr}"
        );
        assert!(
            complete_looking_files(root.path()).is_empty(),
            "{extra:?}: {:?}",
            complete_looking_files(root.path())
        );
    }
}

/// With direct I/O on both ends: a sender killed mid-transfer and run again with another unit
/// size (so that its chunks start off the blocks direct I/O writes, and go through the page
/// cache beside direct writes) and `--verify` (whole-file hashes read directly) sends only what
/// is missing, and the tree arrives identical, odd tails included.
#[test]
fn with_direct_io_a_killed_sender_resumes_with_another_unit_size_and_the_tree_arrives_whole() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let total = build_tree(&src.path().join("tree"));
    let receiver = Receiver::start_with(root.path(), &["--direct-io"]);
    let mut sender = start_slow_send(&receiver, &src.path().join("tree"), &["--direct-io"]);
    std::thread::sleep(random_delay(seed(), 200, 900));
    sender.kill().unwrap();
    sender.wait().unwrap();
    wait_for_session_end(&receiver);
    let odd_unit = (UNIT - 4321).to_string();
    rerun_and_check(
        &receiver,
        src.path(),
        root.path(),
        total,
        &odd_unit,
        &["--direct-io", "--verify"],
    );
}

/// 100,000 small files (0 to 4 KiB, several modes and mtimes, 100 directories): a sender killed
/// once files are being acknowledged leaves only complete, correct files in place, and the
/// re-run skips the sealed ones and ends with the whole tree identical.
#[test]
fn a_tree_of_100000_small_files_resumes_after_a_kill_and_arrives_whole() {
    const FILES: u64 = 100_000;
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    for i in 0..FILES {
        let dir = tree.join(format!("d{:02}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir_all(&dir).unwrap();
        }
        let file = dir.join(format!("f{i:05}"));
        write_data(&file, (i * 37) % 4097, i ^ seed());
        chmod(&file, [0o644, 0o600, 0o755][(i % 3) as usize]);
        if i % 100 == 0 {
            set_mtime(&file, 1_500_000_000 + i, (i * 7) as u32);
        }
    }
    let receiver = Receiver::start(root.path());
    let tree_arg = tree.to_str().unwrap();
    let mut first = xfer();
    first
        .arg("send")
        .args([tree_arg, &receiver.addr, "--json", "--streams", "2"])
        .args(["--stream-rate-cap", "40"])
        .env("XFER_KEY", &receiver.key);
    kill_at_first_ack(first);
    wait_for_session_end(&receiver);
    let in_place = complete_looking_files(root.path());
    assert!(
        in_place
            .iter()
            .all(|f| same_bytes(&src.path().join(f), &root.path().join(f))),
        "a complete-looking file on the receiver differs from its source"
    );
    let out = ok(send(&receiver, &[tree_arg, &receiver.addr, "--json"]));
    let summary = summary(&out);
    assert_eq!(summary["files"].as_u64(), Some(FILES), "{summary}");
    assert!(
        summary["bytes_skipped"].as_u64() > Some(0),
        "nothing was resumed ({} files were in place): {summary}",
        in_place.len()
    );
    assert_same_tree(src.path(), root.path());
}
