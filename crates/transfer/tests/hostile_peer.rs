//! The receiver against a sender that breaks the rules on purpose: paths that leave the root,
//! unknown sessions, chunks outside their file, oversized and corrupted chunks, early seals.

use std::io::BufReader;
use std::net::TcpStream;
use std::path::Path;

use transfer::auth::{handshake_as_client, SessionKey};
use transfer::manifest::{DirEntry, FileEntry, Manifest, SinkKind, Timestamp};
use transfer::receiver::{Receiver, ReceiverConfig};
use transfer::wire::{
    chunk_checksum, write_chunk, write_message, ChunkHeader, FileStatus, FrameReader, Message, Role,
};

const KEY: &str = "hostile-peer-test-key-0123456789";

type Conn = (FrameReader<BufReader<TcpStream>>, TcpStream);

fn start(root: &Path) -> String {
    let config = ReceiverConfig::new(root.to_path_buf(), SessionKey::from_text(KEY).unwrap());
    let receiver = Receiver::bind("127.0.0.1:0", config).unwrap();
    let addr = receiver.local_addr().unwrap().to_string();
    std::thread::spawn(move || receiver.serve(None));
    addr
}

fn connect(addr: &str, role: Role) -> Result<(Conn, [u8; 16]), String> {
    let socket = TcpStream::connect(addr).unwrap();
    let mut reader = FrameReader::new(BufReader::new(socket.try_clone().unwrap()), 64 << 20);
    let mut writer = socket;
    let key = SessionKey::from_text(KEY).unwrap();
    let (session, _) =
        handshake_as_client(&mut reader, &mut writer, &key, role).map_err(|e| e.to_string())?;
    Ok(((reader, writer), session))
}

fn entry(path: &[u8], size: u64) -> FileEntry {
    FileEntry {
        path: path.to_vec(),
        size,
        mode: 0o644,
        mtime: Timestamp {
            secs: 1_600_000_000,
            nanos: 5,
        },
    }
}

fn manifest(files: Vec<FileEntry>, dirs: Vec<DirEntry>) -> Manifest {
    Manifest {
        dest: Vec::new(),
        sink: SinkKind::Files,
        dirs,
        files,
    }
}

/// Opens a session for `manifest` and returns the control connection, session id and plan.
fn open_session(addr: &str, manifest: Manifest) -> (Conn, [u8; 16], Message) {
    let ((mut reader, mut writer), session) = connect(addr, Role::Control).unwrap();
    write_message(&mut writer, &Message::Manifest(manifest)).unwrap();
    let reply = reader.read_message().unwrap();
    ((reader, writer), session, reply)
}

/// A session with one 10-byte file `ten`, and one data stream joined to it.
fn ten_byte_session(addr: &str) -> (Conn, Conn) {
    let (control, session, _) = open_session(addr, manifest(vec![entry(b"ten", 10)], vec![]));
    let (data, _) = connect(addr, Role::Data { session }).unwrap();
    (control, data)
}

/// Sends the ten bytes of file 0 as one chunk and expects them acknowledged.
fn send_ten_bytes(
    reader: &mut FrameReader<BufReader<TcpStream>>,
    writer: &mut TcpStream,
) -> [u8; 10] {
    let data = *b"0123456789";
    write_chunk(writer, &chunk(&data, 0), &data).unwrap();
    assert_eq!(
        reader.read_message().unwrap(),
        Message::Ack {
            file: 0,
            offset: 0,
            len: 10
        }
    );
    data
}

/// Seals file 0 on the control connection and returns the receiver's answer.
fn seal((reader, writer): &mut Conn, blake3: Option<[u8; 32]>) -> Message {
    write_message(writer, &Message::Seal { file: 0, blake3 }).unwrap();
    reader.read_message().unwrap()
}

fn chunk(data: &[u8], offset: u64) -> ChunkHeader {
    ChunkHeader {
        file: 0,
        offset,
        checksum: chunk_checksum(data),
    }
}

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
    let mut escaping = Manifest {
        dest: b"../outside".to_vec(),
        ..manifest(vec![entry(b"f", 1)], vec![])
    };
    let (_, _, reply) = open_session(&addr, escaping.clone());
    assert!(
        matches!(&reply, Message::Refused { reason } if reason.contains("'..'")),
        "{reply:?}"
    );
    escaping.files = vec![entry(b"f", 1), entry(b"f", 1)];
    escaping.dest = Vec::new();
    let (_, _, reply) = open_session(&addr, escaping);
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
    let Err(err) = connect(&addr, Role::Data { session: [1; 16] }) else {
        panic!("a data stream joined a session that does not exist");
    };
    assert!(err.contains("unknown or finished session"), "{err}");
}

#[test]
fn chunks_outside_their_file_or_too_large_end_the_stream_with_an_error() {
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path());
    let (_control, session, plan) = open_session(&addr, manifest(vec![entry(b"ten", 10)], vec![]));
    assert_eq!(plan, Message::Plan(vec![FileStatus::Missing]));

    let ((mut reader, mut writer), _) = connect(&addr, Role::Data { session }).unwrap();
    let data = [7u8; 10];
    write_chunk(&mut writer, &chunk(&data, 5), &data).unwrap();
    let reply = reader.read_message().unwrap();
    assert!(
        matches!(&reply, Message::Error { message } if message.contains("outside")),
        "{reply:?}"
    );

    let ((mut reader, mut writer), _) = connect(&addr, Role::Data { session }).unwrap();
    let big = vec![0u8; (16 << 20) + 1];
    let _ = write_chunk(&mut writer, &chunk(&big, 0), &big);
    let reply = reader.read_message().unwrap();
    assert!(
        matches!(&reply, Message::Error { message } if message.contains("oversized frame")),
        "{reply:?}"
    );
    assert!(!root.path().join("ten").exists());
}

#[test]
fn corrupted_chunks_are_nacked_and_early_seals_refused() {
    let root = tempfile::tempdir().unwrap();
    let (mut control, (mut reader, mut writer)) = ten_byte_session(&start(root.path()));

    let data = *b"0123456789";
    let mut wrong = chunk(&data[..5], 0);
    wrong.checksum ^= 1;
    write_chunk(&mut writer, &wrong, &data[..5]).unwrap();
    assert_eq!(
        reader.read_message().unwrap(),
        Message::Nack { file: 0, offset: 0 }
    );
    write_chunk(&mut writer, &chunk(&data[..5], 0), &data[..5]).unwrap();
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
    let (mut control, session, plan) =
        open_session(&addr, manifest(vec![entry(b"sub/f", 10)], vec![]));
    assert_eq!(plan, Message::Plan(vec![FileStatus::Missing]));

    // Someone with access to the root swaps the checked directory for a link to elsewhere.
    std::fs::rename(root.join("sub"), root.join("moved")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("sub")).unwrap();

    let ((mut reader, mut writer), _) = connect(&addr, Role::Data { session }).unwrap();
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
