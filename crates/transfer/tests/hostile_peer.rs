//! The receiver against a sender that breaks the rules on purpose: paths that leave the root,
//! unknown sessions, streams proving the wrong session, chunks outside their file, oversized
//! and corrupted chunks, early seals, writes into special files, and the receiver's limits.

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

mod common;
use common::raw_peer::*;

use transfer::auth::SessionKey;
use transfer::filter::Filter;
use transfer::journal::PartPaths;
use transfer::manifest::{DirEntry, ManifestBatch, SinkKind, Timestamp};
use transfer::receiver::Receiver;
use transfer::wire::{
    chunk_checksum, write_chunk, write_message, ChunkHeader, FileStatus, FrameReader, Message,
    PresentFiles, Role, MAGIC, PROTOCOL_VERSION,
};

#[test]
fn manifests_with_paths_that_leave_the_root_are_refused() {
    let parent = tempfile::tempdir().unwrap();
    let root = parent.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let addr = start(&root);
    let bad: [&[u8]; 6] = [
        b"../evil",
        b"/etc/evil",
        b"a/../../evil",
        b"a//b",
        b"a/./b",
        b"a\0b",
    ];
    for path in bad {
        let (_, _, reply) = open_session(&addr, manifest(vec![entry(path, 1)], vec![]));
        assert!(
            matches!(&reply, Message::Refused { reason } if reason.contains("refused")),
            "{path:?}: {reply:?}"
        );
        let dir = DirEntry {
            path: path.to_vec(),
            mode: 0o755,
            mtime: Timestamp { secs: 0, nanos: 0 },
        };
        let (_, _, reply) = open_session(&addr, manifest(vec![], vec![dir]));
        assert!(
            matches!(&reply, Message::Refused { .. }),
            "dir {path:?}: {reply:?}"
        );
    }
    let one = manifest(vec![entry(b"f", 1)], vec![]);
    let (_, _, reply) = open_session_into(&addr, b"../outside", one);
    assert!(
        matches!(&reply, Message::Refused { reason } if reason.contains("'..'")),
        "{reply:?}"
    );
    let twice = manifest(vec![entry(b"f", 1), entry(b"f", 1)], vec![]);
    let (_, _, reply) = open_session(&addr, twice);
    assert!(
        matches!(&reply, Message::Refused { reason } if reason.contains("twice")),
        "{reply:?}"
    );
    let names: Vec<_> = std::fs::read_dir(parent.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("root")]);
    assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
}

#[test]
fn data_streams_need_a_live_session() {
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path());
    let key = SessionKey::from_text(KEY).unwrap();
    let Err(err) = connect_with(&addr, Role::Data { session: [1; 16] }, &key) else {
        panic!("a data stream joined a session that does not exist");
    };
    assert!(err.contains("unknown or finished session"), "{err}");
}

#[test]
fn chunks_outside_their_file_or_too_large_end_the_stream_with_an_error() {
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path());
    let (_control, welcomed, plan) = open_session(&addr, manifest(vec![entry(b"ten", 10)], vec![]));
    assert_eq!(plan, first_plan(vec![FileStatus::Missing]));

    let (mut reader, mut writer) = join(&addr, &welcomed).unwrap();
    let data = [7u8; 10];
    write_chunk(&mut writer, &chunk(&data, 5), &data, None).unwrap();
    let reply = reader.read_message().unwrap();
    assert!(
        matches!(&reply, Message::Error { message } if message.contains("outside")),
        "{reply:?}"
    );

    let (mut reader, mut writer) = join(&addr, &welcomed).unwrap();
    let big = vec![0u8; (16 << 20) + 1];
    let _ = write_chunk(&mut writer, &chunk(&big, 0), &big, None);
    let reply = reader.read_message().unwrap();
    assert!(
        matches!(&reply, Message::Error { message } if message.contains("oversized frame")),
        "{reply:?}"
    );
    assert!(!root.path().join("ten").exists());
}

/// Once a chunk failed its session, a chunk on another of its streams is answered with the same
/// error. (It used to deadlock that stream's thread on the lock of the failure, which kept the
/// session, and the paths it claimed, for good.)
#[test]
fn after_a_session_failed_its_other_streams_are_told_why() {
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path());
    let (_control, welcomed, _) = open_session(&addr, manifest(vec![entry(b"ten", 10)], vec![]));
    let (mut failing, mut failing_writer) = join(&addr, &welcomed).unwrap();
    let (mut other, mut other_writer) = join(&addr, &welcomed).unwrap();
    let data = [7u8; 10];
    write_chunk(&mut failing_writer, &chunk(&data, 5), &data, None).unwrap();
    let reply = failing.read_message().unwrap();
    assert!(
        matches!(&reply, Message::Error { message } if message.contains("outside")),
        "{reply:?}"
    );
    // The socket's timeout covers its reading half too.
    other_writer
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write_chunk(&mut other_writer, &chunk(&data, 0), &data, None).unwrap();
    let reply = other.read_message().expect("an answer, not silence");
    assert!(
        matches!(&reply, Message::Error { message } if message.contains("outside")),
        "{reply:?}"
    );
}

#[test]
fn corrupted_chunks_are_nacked_and_early_seals_refused() {
    let root = tempfile::tempdir().unwrap();
    let (mut control, (mut reader, mut writer)) = ten_byte_session(&start(root.path()));

    let data = *b"0123456789";
    let mut wrong = chunk(&data[..5], 0);
    wrong.checksum ^= 1;
    write_chunk(&mut writer, &wrong, &data[..5], None).unwrap();
    assert_eq!(
        reader.read_message().unwrap(),
        Message::Nack { file: 0, offset: 0 }
    );
    write_chunk(&mut writer, &chunk(&data[..5], 0), &data[..5], None).unwrap();
    assert_eq!(
        reader.read_message().unwrap(),
        Message::Ack {
            file: 0,
            offset: 0,
            len: 5
        }
    );

    let reply = seal(&mut control, None);
    assert!(
        matches!(&reply, Message::Finalized { error: Some(e), .. } if e.contains("missing")),
        "{reply:?}"
    );
    assert!(
        !root.path().join("ten").exists(),
        "an incomplete file was put in place"
    );
}

#[test]
fn a_wrong_whole_file_hash_keeps_the_file_out_of_place() {
    let root = tempfile::tempdir().unwrap();
    let (mut control, (mut reader, mut writer)) = ten_byte_session(&start(root.path()));
    send_ten_bytes(&mut reader, &mut writer);
    let reply = seal(&mut control, Some([0; 32]));
    assert!(
        matches!(&reply, Message::Finalized { error: Some(e), .. } if e.contains("BLAKE3")),
        "{reply:?}"
    );
    assert!(!root.path().join("ten").exists());
}

#[test]
fn a_directory_swapped_for_a_symlink_mid_session_cannot_redirect_writes() {
    let parent = tempfile::tempdir().unwrap();
    let (root, outside) = (parent.path().join("root"), parent.path().join("outside"));
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&outside).unwrap();
    let addr = start(&root);
    let (mut control, welcomed, plan) =
        open_session(&addr, manifest(vec![entry(b"sub/f", 10)], vec![]));
    assert_eq!(plan, first_plan(vec![FileStatus::Missing]));

    // Someone with access to the root swaps the checked directory for a link to elsewhere.
    std::fs::rename(root.join("sub"), root.join("moved")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("sub")).unwrap();

    let (mut reader, mut writer) = join(&addr, &welcomed).unwrap();
    let data = send_ten_bytes(&mut reader, &mut writer);
    assert_eq!(
        seal(&mut control, None),
        Message::Finalized {
            file: 0,
            error: None
        }
    );
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "a write escaped the root"
    );
    assert_eq!(std::fs::read(root.join("moved/f")).unwrap(), data);
}

/// A data stream that names a session and then stalls before proving its key does not keep
/// the session's files claimed once the session has ended: a sender killed while opening a
/// stream (over QUIC, the receiver hears nothing of the kill) can run again at once.
#[test]
fn a_stream_stalled_in_its_handshake_does_not_outlive_its_session() {
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path());
    let files = || manifest(vec![entry(b"ten", 10)], vec![]);
    let (control, welcomed, _) = open_session(&addr, files());
    let socket = TcpStream::connect(&addr).unwrap();
    let mut reader = FrameReader::new(BufReader::new(socket.try_clone().unwrap()), 1 << 20);
    let mut stalled = socket;
    let hello = Message::Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        role: Role::Data {
            session: welcomed.session,
        },
        nonce: [7; 32],
        key: welcomed.session_key.id(),
        share: [9; 32],
        sealed: false,
    };
    write_message(&mut stalled, &hello).unwrap();
    assert!(matches!(
        reader.read_message().unwrap(),
        Message::Challenge { .. }
    ));
    drop(control);
    // Refused after the claim wait if the stalled stream still held the first session.
    let (_control, _, reply) = open_session(&addr, files());
    assert_eq!(reply, first_plan(vec![FileStatus::Missing]));
    drop(stalled);
}

/// A data stream must prove the key of the session it joins: neither the receiver's key nor the
/// key of another session will do, and the session it tried to join goes on unharmed.
#[test]
fn a_data_stream_from_another_session_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path());
    let (mut control_a, a, _) = open_session(&addr, manifest(vec![entry(b"ten", 10)], vec![]));
    let (_control_b, b, _) = open_session(&addr, manifest(vec![entry(b"other", 10)], vec![]));
    let into_a = Role::Data { session: a.session };
    for (key, what) in [
        (b.session_key.clone(), "session b's key"),
        (SessionKey::from_text(KEY).unwrap(), "the receiver's key"),
    ] {
        let Err(err) = connect_with(&addr, into_a.clone(), &key) else {
            panic!("a stream proving {what} joined session a");
        };
        assert!(
            err.contains("does not know this session's key"),
            "{what}: {err}"
        );
    }
    let (mut reader, mut writer) = join(&addr, &a).unwrap();
    send_ten_bytes(&mut reader, &mut writer);
    assert_eq!(
        seal(&mut control_a, None),
        Message::Finalized {
            file: 0,
            error: None
        }
    );
    assert!(root.path().join("ten").exists());
}

/// Connections with the wrong key are refused, and the receiver goes on serving a session
/// that was open before them and one that opens after them.
#[test]
fn wrong_keys_are_refused_and_the_receiver_keeps_serving() {
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path());
    let (mut control, mut data) = ten_byte_session(&addr);
    for _ in 0..5 {
        let wrong = SessionKey::from_text("not-the-key-of-this-receiver").unwrap();
        let Err(err) = connect_with(&addr, Role::Control, &wrong) else {
            panic!("a wrong key was accepted");
        };
        assert!(err.contains("does not hold this key"), "{err}");
    }
    send_ten_bytes(&mut data.0, &mut data.1);
    assert!(matches!(
        seal(&mut control, None),
        Message::Finalized { error: None, .. }
    ));
    let (_later, welcomed, plan) = open_session(&addr, manifest(vec![entry(b"b", 1)], vec![]));
    assert_eq!(plan, first_plan(vec![FileStatus::Missing]));
    assert!(join(&addr, &welcomed).is_ok());
}

/// A FIFO or device node at a file's destination is refused before any byte is sent, and left
/// as it was; so is one at the name of the part file, should it appear there after the check.
#[test]
fn special_files_in_the_root_are_never_written_or_replaced() {
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path());
    use rustix::fs::{makedev, mknodat, FileType, Mode, CWD};
    let mknod = |path: &Path, kind: FileType| {
        // makedev(1, 3) is the device number of /dev/null.
        mknodat(CWD, path, kind, Mode::from(0o600), makedev(1, 3))
            .unwrap_or_else(|e| panic!("mknod {}: {e}", path.display()));
    };
    let mut kinds = vec![(FileType::Fifo, "FIFO")];
    if rustix::process::geteuid().is_root() {
        // Writing into a /dev/null node would lose the data without a word.
        kinds.push((FileType::CharacterDevice, "character device"));
    }
    for (mode, what) in kinds {
        let target = root.path().join("ten");
        mknod(&target, mode);
        // The previous round's session lets go of the name once the receiver sees it closed.
        let deadline = Instant::now() + Duration::from_secs(5);
        let reply = loop {
            let (_, _, reply) = open_session(&addr, manifest(vec![entry(b"ten", 10)], vec![]));
            match &reply {
                Message::Refused { reason }
                    if reason.contains("another session") && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => break reply,
            }
        };
        assert!(
            matches!(&reply, Message::Refused { reason } if reason.contains("special file")),
            "{what}: {reply:?}"
        );
        assert!(!std::fs::symlink_metadata(&target).unwrap().is_file());
        std::fs::remove_file(&target).unwrap();

        // The part file's name, taken after the session was prepared.
        let (_control, (mut reader, mut writer)) = ten_byte_session(&addr);
        let part = root.path().join(".ten.xfer-part");
        mknod(&part, mode);
        let data = *b"0123456789";
        write_chunk(&mut writer, &chunk(&data, 0), &data, None).unwrap();
        let reply = reader.read_message().unwrap();
        assert!(
            matches!(&reply, Message::Error { message } if message.contains("not a regular file")),
            "{what}: {reply:?}"
        );
        assert!(!std::fs::symlink_metadata(&part).unwrap().is_file());
        assert!(!target.exists());
        std::fs::remove_file(&part).unwrap();
    }
}

/// Reads until the peer closes the connection; fails if that takes longer than `within`.
fn closed_within(socket: &mut TcpStream, within: Duration) -> Duration {
    let started = Instant::now();
    socket.set_read_timeout(Some(within)).unwrap();
    let mut sink = [0u8; 4096];
    loop {
        match socket.read(&mut sink) {
            Ok(0) => return started.elapsed(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return started.elapsed(),
            Err(e) => panic!("still open after {:?}: {e}", started.elapsed()),
        }
    }
}

/// Connections that never authenticate are closed after the handshake timeout, those beyond
/// the limit of concurrent handshakes at once; the receiver serves a real session meanwhile.
#[test]
fn silent_connections_are_bounded_in_number_and_time() {
    let root = tempfile::tempdir().unwrap();
    let mut config = config(root.path());
    config.options.max_handshakes = 3;
    config.options.handshake_timeout = Duration::from_millis(1500);
    let addr = start_with(config);
    let mut silent: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200)); // let the receiver accept them
    let mut extra = TcpStream::connect(&addr).unwrap();
    assert!(closed_within(&mut extra, Duration::from_millis(500)) < Duration::from_millis(500));
    for socket in &mut silent {
        let took = closed_within(socket, Duration::from_secs(5));
        assert!(took < Duration::from_secs(3), "{took:?}");
    }
    let (_control, welcomed, plan) = open_session(&addr, manifest(vec![entry(b"f", 1)], vec![]));
    assert_eq!(plan, first_plan(vec![FileStatus::Missing]));
    assert!(join(&addr, &welcomed).is_ok());
}

/// A session whose connections all fall silent is closed after the idle timeout and nothing
/// is put in place. (The file arrived whole but was never sealed; being small, it had no
/// journal, so it is sent again whole.)
#[test]
fn an_idle_session_is_closed_after_the_timeout() {
    let root = tempfile::tempdir().unwrap();
    let mut config = config(root.path());
    config.options.idle_timeout = Duration::from_secs(1);
    let addr = start_with(config);
    let ((_, mut control), (mut reader, mut writer)) = ten_byte_session(&addr);
    let started = Instant::now();
    for _ in 0..4 {
        // Busy streams keep the quiet control connection alive.
        std::thread::sleep(Duration::from_millis(400));
        send_ten_bytes(&mut reader, &mut writer);
    }
    closed_within(&mut control, Duration::from_secs(5));
    let lived = started.elapsed();
    assert!(lived >= Duration::from_millis(2500), "{lived:?}");
    assert!(lived < Duration::from_secs(4), "{lived:?}");
    assert!(!root.path().join("ten").exists());
    let (_c, _, plan) = open_session(&addr, manifest(vec![entry(b"ten", 10)], vec![]));
    assert_eq!(plan, first_plan(vec![FileStatus::Missing]));
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Files waiting for their seal hold no descriptors: a sender that delivers thousands of small
/// files and seals none of them (or seals them an RTT later) cannot exhaust the receiver's open
/// files. Files that arrive whole get no journal; a file still arriving keeps one.
#[test]
fn unsealed_files_hold_no_descriptors() {
    const FILES: u32 = 3000;
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path());
    let mut files: Vec<_> = (0..FILES)
        .map(|i| entry(format!("f{i}").as_bytes(), 10))
        .collect();
    files.push(entry(b"halfway", 20));
    let (mut control, welcomed, _) = open_session(&addr, manifest(files, vec![]));
    let (mut reader, mut writer) = join(&addr, &welcomed).unwrap();
    let before = open_descriptors();
    let data = *b"0123456789";
    let header = |file, offset| ChunkHeader {
        file,
        offset,
        checksum: chunk_checksum(&data),
    };
    for file in 0..=FILES {
        write_chunk(&mut writer, &header(file, 0), &data, None).unwrap();
    }
    for _ in 0..=FILES {
        assert!(matches!(
            reader.read_message().unwrap(),
            Message::Ack { .. }
        ));
    }
    let opened = open_descriptors().saturating_sub(before);
    assert!(opened < 100, "{opened} descriptors held for unsealed files");
    let leftovers = |suffix: &str| {
        std::fs::read_dir(root.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(suffix)
            })
            .count()
    };
    assert_eq!(
        leftovers(".xfer-journal"),
        1,
        "only the unfinished file has a journal"
    );
    write_chunk(&mut writer, &header(FILES, 10), &data, None).unwrap();
    assert!(matches!(
        reader.read_message().unwrap(),
        Message::Ack { .. }
    ));
    for file in 0..=FILES {
        let (reader, writer) = &mut control;
        write_message(writer, &Message::Seal { file, blake3: None }).unwrap();
        let reply = loop {
            match reader.read_message().unwrap() {
                Message::Working => {}
                reply => break reply,
            }
        };
        assert_eq!(reply, Message::Finalized { file, error: None });
    }
    assert_eq!(std::fs::read(root.path().join("f2999")).unwrap(), data);
    assert_eq!(
        std::fs::read(root.path().join("halfway")).unwrap(),
        [data, data].concat()
    );
    assert_eq!(leftovers(".xfer-journal") + leftovers(".xfer-part"), 0);
}

/// The session's memory limit bounds its streams: the limit is announced, a stream beyond it
/// is refused, and the streams within it carry on.
#[test]
fn session_memory_bounds_the_streams_of_a_session() {
    let root = tempfile::tempdir().unwrap();
    let mut config = config(root.path());
    config.options.max_chunk = 1 << 20;
    config.options.session_memory = (2 << 20) + 1000;
    let addr = start_with(config);
    let (mut control, welcomed, _) = open_session(&addr, manifest(vec![entry(b"ten", 10)], vec![]));
    assert_eq!(welcomed.limits.max_streams, 2);
    let mut first = join(&addr, &welcomed).unwrap();
    let _second = join(&addr, &welcomed).unwrap();
    let Err(err) = join(&addr, &welcomed) else {
        panic!("a third stream joined");
    };
    assert!(err.contains("at most 2 streams"), "{err}");
    send_ten_bytes(&mut first.0, &mut first.1);
    assert!(matches!(
        seal(&mut control, None),
        Message::Finalized { error: None, .. }
    ));

    let mut tiny = self::config(root.path());
    tiny.options.session_memory = 1 << 20;
    let err = Receiver::bind(&tiny.listen("127.0.0.1:0")).err().unwrap();
    assert!(
        err.to_string().contains("cannot hold one stream's chunk"),
        "{err}"
    );
}

/// A manifest over the receiver's limit ends that session with the reason; others go on.
#[test]
fn a_manifest_over_the_limit_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let mut config = config(root.path());
    config.options.max_manifest = 4096;
    let addr = start_with(config);
    let files = (0..500)
        .map(|i| entry(format!("file-{i}").as_bytes(), 1))
        .collect();
    let ((mut reader, mut writer), _) = connect(&addr).unwrap();
    let start = Message::Start {
        dest: Vec::new(),
        sink: SinkKind::Files,
        present: PresentFiles::Kept,
        delete: None,
        striped: false,
    };
    write_message(&mut writer, &start).unwrap();
    write_message(&mut writer, &Message::Entries(manifest(files, vec![]))).unwrap();
    writer.flush().unwrap();
    let told = loop {
        match reader.read_message() {
            Ok(Message::Working) => {}
            other => break other,
        }
    };
    assert!(
        matches!(&told, Ok(Message::Error { message }) if message.contains("oversized frame")),
        "{told:?}"
    );
    assert!(reader.read_message().is_err(), "the session ended");
    let (_c, _, plan) = open_session(&addr, manifest(vec![entry(b"small", 1)], vec![]));
    assert_eq!(plan, first_plan(vec![FileStatus::Missing]));
}

/// Each `Start` is refused with a reason that says `why`, on a connection of its own, and
/// nothing of what the receiver held is planned or removed.
fn starts_are_refused(starts: Vec<(Message, &str)>) {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("kept"), b"here before").unwrap();
    let addr = start(root.path());
    for (start, why) in starts {
        let ((mut reader, mut writer), _) = connect(&addr).unwrap();
        write_message(&mut writer, &start).unwrap();
        writer.flush().unwrap();
        let told = reader.read_message();
        assert!(
            matches!(&told, Ok(Message::Refused { reason }) if reason.contains(why)),
            "{why}: {told:?}"
        );
    }
    assert_eq!(
        std::fs::read(root.path().join("kept")).unwrap(),
        b"here before"
    );
}

/// A mirroring `Start` the receiver cannot honour is refused with the reason, before anything
/// is planned or removed: over generated data, with a filter larger than it judges by, or with
/// a pattern that is no glob.
#[test]
fn a_mirroring_start_that_cannot_work_is_refused() {
    let huge = (0..10_001).fold(Filter::default(), |f, i| f.exclude(format!("f{i}")));
    let cases = [
        (SinkKind::Discard, Filter::default(), "needs files"),
        (SinkKind::Files, huge, "10001 rules and paths"),
        (
            SinkKind::Files,
            Filter::default().exclude("a[b"),
            "exclude pattern",
        ),
    ];
    let starts = cases.map(|(sink, filter, why)| {
        let start = Message::Start {
            dest: Vec::new(),
            sink,
            present: PresentFiles::Kept,
            delete: Some(filter),
            striped: false,
        };
        (start, why)
    });
    starts_are_refused(starts.into());
}

/// A striped `Start` (one node's share of a transfer) that asks for what needs every file
/// whole at one receiver is refused with the reason, and nothing in place is removed: a mirror
/// would remove the files other nodes bring, and a hash of a whole file has no node that read
/// all of it.
#[test]
fn a_striped_start_that_needs_whole_files_is_refused() {
    let cases = [
        (SinkKind::Files, PresentFiles::Kept, true, "cannot remove"),
        (
            SinkKind::Files,
            PresentFiles::Compared,
            false,
            "cannot hash",
        ),
        (
            SinkKind::Files,
            PresentFiles::Verified,
            false,
            "cannot hash",
        ),
        (SinkKind::Discard, PresentFiles::Kept, false, "needs files"),
    ];
    let starts = cases.map(|(sink, present, mirror, why)| {
        let start = Message::Start {
            dest: Vec::new(),
            sink,
            present,
            delete: mirror.then(Filter::default),
            striped: true,
        };
        (start, why)
    });
    starts_are_refused(starts.into());
}

/// The manifest comes in batches whose files are numbered on across them; a file's state is
/// gone once it is sealed, so a late copy of one of its chunks is acknowledged and not written,
/// and a second seal is refused.
#[test]
fn the_manifest_arrives_in_batches_numbered_across_them() {
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path());
    let first = ManifestBatch {
        last: false,
        ..manifest(vec![entry(b"a", 10)], vec![])
    };
    let (mut control, welcomed, plan) = open_session(&addr, first);
    let missing = vec![FileStatus::Missing];
    assert_eq!(
        plan,
        Message::Plan {
            first: 0,
            files: missing.clone(),
            last: false
        }
    );
    let (reader, writer) = &mut control;
    let second = manifest(vec![entry(b"b", 10)], vec![]);
    write_message(writer, &Message::Entries(second)).unwrap();
    assert_eq!(
        reader.read_message().unwrap(),
        Message::Plan {
            first: 1,
            files: missing,
            last: true
        }
    );
    let (mut data_reader, mut data_writer) = join(&addr, &welcomed).unwrap();
    let data = *b"0123456789";
    let header = ChunkHeader {
        file: 1,
        ..chunk(&data, 0)
    };
    let ack = Message::Ack {
        file: 1,
        offset: 0,
        len: 10,
    };
    write_chunk(&mut data_writer, &header, &data, None).unwrap();
    assert_eq!(data_reader.read_message().unwrap(), ack);
    let seal_b = Message::Seal {
        file: 1,
        blake3: None,
    };
    write_message(writer, &seal_b).unwrap();
    let finalized = Message::Finalized {
        file: 1,
        error: None,
    };
    assert_eq!(reader.read_message().unwrap(), finalized);
    assert_eq!(std::fs::read(root.path().join("b")).unwrap(), data);

    let other = *b"9876543210";
    let late = ChunkHeader {
        file: 1,
        ..chunk(&other, 0)
    };
    write_chunk(&mut data_writer, &late, &other, None).unwrap();
    assert_eq!(data_reader.read_message().unwrap(), ack);
    assert_eq!(std::fs::read(root.path().join("b")).unwrap(), data);
    write_message(writer, &seal_b).unwrap();
    let reply = reader.read_message().unwrap();
    assert!(
        matches!(&reply, Message::Finalized { error: Some(e), .. } if e.contains("settled already")),
        "{reply:?}"
    );
}

/// A sender may hold only so many files announced and unsealed, and may not name one path in
/// two batches.
#[test]
fn batches_over_the_unsealed_limit_or_naming_a_path_again_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let mut config = config(root.path());
    config.options.max_unsealed = 100;
    let addr = start_with(config);
    let batch = |from: usize, count: usize| ManifestBatch {
        last: false,
        ..manifest(
            (from..from + count)
                .map(|i| entry(format!("f{i}").as_bytes(), 1))
                .collect(),
            vec![],
        )
    };
    let (mut control, _, plan) = open_session(&addr, batch(0, 60));
    assert!(matches!(plan, Message::Plan { first: 0, .. }), "{plan:?}");
    let (reader, writer) = &mut control;
    write_message(writer, &Message::Entries(batch(60, 60))).unwrap();
    let reply = reader.read_message().unwrap();
    assert!(
        matches!(&reply, Message::Refused { reason } if reason.contains("more than 100 files")),
        "{reply:?}"
    );

    let (mut control, _, plan) = open_session(&addr, batch(0, 2));
    assert!(matches!(plan, Message::Plan { first: 0, .. }), "{plan:?}");
    let (reader, writer) = &mut control;
    write_message(writer, &Message::Entries(batch(1, 2))).unwrap();
    let reply = reader.read_message().unwrap();
    assert!(
        matches!(&reply, Message::Refused { reason } if reason.contains("f1 appears twice")),
        "{reply:?}"
    );
}

/// Sizes beyond what any file can hold, and one path named both as a file and as a
/// directory (in one batch, or across batches, or as the parent of another file), are refused
/// instead of planned.
#[test]
fn manifests_no_file_system_could_hold_are_refused() {
    use transfer::manifest::MAX_FILE_SIZE;
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path());
    let dir = |path: &[u8]| DirEntry {
        path: path.to_vec(),
        mode: 0o755,
        mtime: Timestamp { secs: 1, nanos: 0 },
    };
    let refused = |reply: &Message, says: &str| {
        assert!(
            matches!(reply, Message::Refused { reason } if reason.contains(says)),
            "{reply:?}"
        );
    };
    for size in [u64::MAX, MAX_FILE_SIZE + 1] {
        let (_, _, reply) = open_session(&addr, manifest(vec![entry(b"huge", size)], vec![]));
        refused(&reply, "more than any file can hold");
    }
    let (_, _, reply) = open_session(&addr, manifest(vec![entry(b"huge", MAX_FILE_SIZE)], vec![]));
    assert_eq!(reply, first_plan(vec![FileStatus::Missing]));
    for (files, dirs) in [
        (vec![entry(b"a", 1)], vec![dir(b"a")]),
        (vec![entry(b"a", 1), entry(b"a/b", 1)], vec![]),
        (vec![entry(b"x/a", 1)], vec![dir(b"x"), dir(b"x/a/c")]),
    ] {
        let (_, _, reply) = open_session(&addr, manifest(files, dirs));
        refused(&reply, "both as a file and as a directory");
    }
    // Across batches: a file, then a directory of its name; a directory, then a file of its.
    for (first, then) in [
        (
            manifest(vec![entry(b"d/f", 1)], vec![]),
            manifest(vec![entry(b"d/f/g", 1)], vec![]),
        ),
        (
            manifest(vec![], vec![dir(b"e")]),
            manifest(vec![entry(b"e", 1)], vec![]),
        ),
    ] {
        let (mut control, _, plan) = open_session(
            &addr,
            ManifestBatch {
                last: false,
                ..first
            },
        );
        assert!(matches!(plan, Message::Plan { .. }), "{plan:?}");
        let (reader, writer) = &mut control;
        write_message(writer, &Message::Entries(then)).unwrap();
        refused(
            &reader.read_message().unwrap(),
            "both as a file and as a directory",
        );
    }
    assert!(!root.path().join("a").exists() && !root.path().join("d/f").exists());
}

/// Files announced and unsealed are bounded across all sessions too: a batch beyond the
/// receiver's bound waits until another session's files are given back, then is planned.
#[test]
fn announced_files_are_bounded_across_sessions() {
    let root = tempfile::tempdir().unwrap();
    let mut config = config(root.path());
    config.options.max_unsealed_total = 1000;
    let addr = start_with(config);
    let batch = |prefix: &str| ManifestBatch {
        last: false,
        ..manifest(
            (0..600)
                .map(|i| entry(format!("{prefix}{i}").as_bytes(), 1))
                .collect(),
            vec![],
        )
    };
    let (first, _, plan) = open_session_into(&addr, b"one", batch("f"));
    assert!(matches!(plan, Message::Plan { .. }), "{plan:?}");
    // Timed from before the first session is let go, however late its thread starts.
    let started = Instant::now();
    let second = std::thread::spawn({
        let addr = addr.clone();
        move || {
            let (_control, _, plan) = open_session_into(&addr, b"two", batch("g"));
            (plan, started.elapsed())
        }
    });
    std::thread::sleep(Duration::from_secs(2));
    drop(first);
    let (plan, waited) = second.join().unwrap();
    assert!(matches!(plan, Message::Plan { .. }), "{plan:?}");
    assert!(waited >= Duration::from_secs(2), "{waited:?}");
}

/// A 2 MiB file received through two data streams, in chunks long enough to be received
/// straight into the part file: no copy that fails its checksum ever lands over one that
/// verified, whichever stream it comes on and whenever.
#[test]
fn copies_of_a_large_chunk_that_fail_their_checksum_never_land_over_good_ones() {
    const MIB: usize = 1 << 20;
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path());
    let (mut control, welcomed, _) =
        open_session(&addr, manifest(vec![entry(b"big", 2 * MIB as u64)], vec![]));
    let (mut a_reader, mut a) = join(&addr, &welcomed).unwrap();
    let (mut b_reader, mut b) = join(&addr, &welcomed).unwrap();
    let good: Vec<u8> = (0..2 * MIB).map(|i| (i * 31 % 253) as u8).collect();
    let (first, second) = good.split_at(MIB);
    let ack = |offset: u64| Message::Ack {
        file: 0,
        offset,
        len: MIB as u32,
    };
    let nack = |offset: u64| Message::Nack { file: 0, offset };
    // A frame whose payload was damaged on the way: the header's checksum is the good one.
    let damaged = |data: &[u8], offset: u64| {
        let mut frame = Vec::new();
        write_chunk(&mut frame, &chunk(data, offset), data, None).unwrap();
        let last = frame.len() - 1;
        frame[last] ^= 0xFF;
        frame
    };

    // A damaged copy, then a good one on the other stream, then a damaged one again.
    a.write_all(&damaged(first, 0)).unwrap();
    assert_eq!(a_reader.read_message().unwrap(), nack(0));
    write_chunk(&mut b, &chunk(first, 0), first, None).unwrap();
    assert_eq!(b_reader.read_message().unwrap(), ack(0));
    a.write_all(&damaged(first, 0)).unwrap();
    assert_eq!(a_reader.read_message().unwrap(), nack(0));

    // Stream B is halfway through a damaged copy when A's good copy arrives. Received through
    // memory (the library's default), B's is checked first and nacked, and A's written after
    // it; received into a mapped window (once another test of this binary enabled them), A's
    // detaches B's window and is written, B's bytes go nowhere, and B's copy is answered as
    // the range is: verified. Either way the good copy is what the file holds.
    let frame = damaged(second, MIB as u64);
    b.write_all(&frame[..frame.len() / 2]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    write_chunk(&mut a, &chunk(second, MIB as u64), second, None).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    b.write_all(&frame[frame.len() / 2..]).unwrap();
    let answer = b_reader.read_message().unwrap();
    assert!(
        answer == nack(MIB as u64) || answer == ack(MIB as u64),
        "{answer:?}"
    );
    assert_eq!(a_reader.read_message().unwrap(), ack(MIB as u64));

    assert_eq!(
        seal(&mut control, None),
        Message::Finalized {
            file: 0,
            error: None
        }
    );
    assert!(std::fs::read(root.path().join("big")).unwrap() == good);
}

/// Another process cuts a part file short mid-session: the next chunk says so, whether it is
/// written through a buffer (the library's default) or a mapped window (once the program
/// enables them; other tests of this binary may then map too, which they do not mind), the
/// file is not put in place, and the receiver goes on serving.
#[test]
fn a_part_file_cut_short_by_another_process_fails_its_session_only() {
    cut_short_part_file_is_refused();
    transfer::enable_mapped_files();
    cut_short_part_file_is_refused();
}

fn cut_short_part_file_is_refused() {
    const MIB: usize = 1 << 20;
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path());
    let (_control, welcomed, _) =
        open_session(&addr, manifest(vec![entry(b"big", 2 * MIB as u64)], vec![]));
    let (mut reader, mut writer) = join(&addr, &welcomed).unwrap();
    let data = vec![7u8; MIB];
    write_chunk(&mut writer, &chunk(&data, 0), &data, None).unwrap();
    assert_eq!(
        reader.read_message().unwrap(),
        Message::Ack {
            file: 0,
            offset: 0,
            len: MIB as u32
        }
    );
    let part = PartPaths::for_final(&root.path().join("big")).part;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&part)
        .unwrap()
        .set_len(1000)
        .unwrap();
    write_chunk(&mut writer, &chunk(&data, MIB as u64), &data, None).unwrap();
    let reply = reader.read_message().unwrap();
    assert!(
        matches!(&reply, Message::Error { message } if message.contains("changed the size of the part file")),
        "{reply:?}"
    );
    assert!(!root.path().join("big").exists());
    // The receiver still serves.
    let (mut control, (mut reader, mut writer)) = ten_byte_session(&addr);
    send_ten_bytes(&mut reader, &mut writer);
    assert_eq!(
        seal(&mut control, None),
        Message::Finalized {
            file: 0,
            error: None
        }
    );
}

#[test]
fn a_chunk_is_acknowledged_while_the_next_one_is_still_arriving() {
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path());
    let (small, large) = (vec![1u8; 1000], vec![2u8; 100_000]);
    let file = entry(b"two-chunks", (small.len() + large.len()) as u64);
    let (_control, welcomed, _) = open_session(&addr, manifest(vec![file], vec![]));
    let (mut reader, mut writer) = join(&addr, &welcomed).unwrap();

    // The first chunk and the start of the second arrive together; the rest of the second
    // comes only once the first is acknowledged, as a sender may need its answers first.
    let mut frames = Vec::new();
    write_chunk(&mut frames, &chunk(&small, 0), &small, None).unwrap();
    let split = frames.len() + 100;
    write_chunk(
        &mut frames,
        &chunk(&large, small.len() as u64),
        &large,
        None,
    )
    .unwrap();
    writer.write_all(&frames[..split]).unwrap();
    writer
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    assert_eq!(
        reader.read_message().expect("the first chunk's answer"),
        Message::Ack {
            file: 0,
            offset: 0,
            len: small.len() as u32
        }
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    writer.write_all(&frames[split..]).unwrap();
    assert_eq!(
        reader.read_message().unwrap(),
        Message::Ack {
            file: 0,
            offset: small.len() as u64,
            len: large.len() as u32
        }
    );
}

/// The receiver is heard from on a session's control connection every heartbeat, also while it
/// waits for the sender, and its replies arrive whole between the beats.
#[test]
fn a_quiet_session_hears_the_receiver_every_heartbeat() {
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path());
    let ((mut reader, mut writer), _, plan) =
        open_session(&addr, manifest(vec![entry(b"f", 1)], vec![]));
    assert_eq!(plan, first_plan(vec![FileStatus::Missing]));
    let started = Instant::now();
    reader
        .get_mut()
        .get_mut()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut beats = 0;
    while started.elapsed() < Duration::from_millis(3500) {
        assert_eq!(reader.read_message().unwrap(), Message::Working);
        beats += 1;
    }
    assert!(
        (3..=5).contains(&beats),
        "{beats} beats in {:?}",
        started.elapsed()
    );
    write_message(
        &mut writer,
        &Message::Seal {
            file: 0,
            blake3: None,
        },
    )
    .unwrap();
    let reply = loop {
        match reader.read_message().unwrap() {
            Message::Working => {}
            reply => break reply,
        }
    };
    assert!(
        matches!(
            reply,
            Message::Finalized {
                file: 0,
                error: Some(_)
            }
        ),
        "{reply:?}"
    );
}
