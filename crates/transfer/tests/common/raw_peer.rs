//! A peer that speaks the protocol frame by frame, for tests that break its rules on purpose
//! or hold the receiver's connections open: a receiver on loopback with a known key, control
//! connections and data streams through the key handshake, manifests, chunks and seals.

use std::io::BufReader;
use std::net::TcpStream;
use std::path::Path;

use transfer::auth::{handshake_as_client, ChannelBinding, SessionKey, Welcomed};
use transfer::manifest::{DirEntry, FileEntry, ManifestBatch, SinkKind, Timestamp};
use transfer::receiver::{Receiver, ReceiverSettings};
use transfer::wire::{
    chunk_checksum, write_chunk, write_message, ChunkHeader, FileStatus, FrameReader, Message,
    PresentFiles, Role,
};

pub const KEY: &str = "hostile-peer-test-key-0123456789";

pub type Conn = (FrameReader<BufReader<TcpStream>>, TcpStream);

pub fn config(root: &Path) -> ReceiverSettings {
    ReceiverSettings::new(root.to_path_buf(), SessionKey::from_text(KEY).unwrap())
}

pub fn start(root: &Path) -> String {
    start_with(config(root))
}

pub fn start_with(config: ReceiverSettings) -> String {
    let receiver = Receiver::bind(&config.listen("127.0.0.1:0")).unwrap();
    let addr = receiver.local_addr().unwrap().to_string();
    std::thread::spawn(move || receiver.serve(None));
    addr
}

pub fn connect_with(addr: &str, role: Role, key: &SessionKey) -> Result<(Conn, Welcomed), String> {
    let socket = TcpStream::connect(addr).unwrap();
    let mut reader = FrameReader::new(BufReader::new(socket.try_clone().unwrap()), 64 << 20);
    let mut writer = socket;
    let welcomed = handshake_as_client(
        &mut reader,
        &mut writer,
        &ChannelBinding::PLAIN,
        key,
        role,
        false,
    )
    .map_err(|e| e.to_string())?;
    Ok(((reader, writer), welcomed))
}

/// A control connection proving the receiver's key.
pub fn connect(addr: &str) -> Result<(Conn, Welcomed), String> {
    connect_with(addr, Role::Control, &SessionKey::from_text(KEY).unwrap())
}

/// A data stream joining the session `welcomed` describes, proving its key.
pub fn join(addr: &str, welcomed: &Welcomed) -> Result<Conn, String> {
    let role = Role::Data {
        session: welcomed.session,
    };
    connect_with(addr, role, &welcomed.session_key).map(|(conn, _)| conn)
}

pub fn entry(path: &[u8], size: u64) -> FileEntry {
    FileEntry {
        path: path.to_vec(),
        size,
        mode: 0o644,
        mtime: Timestamp {
            secs: 1_600_000_000,
            nanos: 5,
        },
        ctime: Timestamp {
            secs: 1_600_000_001,
            nanos: 6,
        },
        inode: 77,
    }
}

/// A whole manifest in one batch.
pub fn manifest(files: Vec<FileEntry>, dirs: Vec<DirEntry>) -> ManifestBatch {
    ManifestBatch {
        dirs,
        files,
        last: true,
    }
}

/// The plan of a first batch that was also the last.
pub fn first_plan(files: Vec<FileStatus>) -> Message {
    Message::Plan {
        first: 0,
        files,
        last: true,
    }
}

/// Opens a session for `batch` into the root and returns the control connection, the welcome
/// and the plan.
pub fn open_session(addr: &str, batch: ManifestBatch) -> (Conn, Welcomed, Message) {
    open_session_into(addr, b"", batch)
}

/// Opens a session for `batch` into `dest` and returns the control connection, the welcome and
/// the answer to the batch.
pub fn open_session_into(
    addr: &str,
    dest: &[u8],
    batch: ManifestBatch,
) -> (Conn, Welcomed, Message) {
    let ((mut reader, mut writer), welcomed) = connect(addr).unwrap();
    let start = Message::Start {
        dest: dest.to_vec(),
        sink: SinkKind::Files,
        present: PresentFiles::Kept,
        delete: None,
        striped: false,
    };
    write_message(&mut writer, &start).unwrap();
    write_message(&mut writer, &Message::Entries(batch)).unwrap();
    let reply = loop {
        match reader.read_message().unwrap() {
            Message::Working => {} // the receiver's heartbeat while it prepares the batch
            reply => break reply,
        }
    };
    ((reader, writer), welcomed, reply)
}

/// A session with one 10-byte file `ten`, and one data stream joined to it.
pub fn ten_byte_session(addr: &str) -> (Conn, Conn) {
    let (control, welcomed, _) = open_session(addr, manifest(vec![entry(b"ten", 10)], vec![]));
    let data = join(addr, &welcomed).unwrap();
    (control, data)
}

/// Sends the ten bytes of file 0 as one chunk and expects them acknowledged.
pub fn send_ten_bytes(
    reader: &mut FrameReader<BufReader<TcpStream>>,
    writer: &mut TcpStream,
) -> [u8; 10] {
    let data = *b"0123456789";
    write_chunk(writer, &chunk(&data, 0), &data, None).unwrap();
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
pub fn seal((reader, writer): &mut Conn, blake3: Option<[u8; 32]>) -> Message {
    write_message(writer, &Message::Seal { file: 0, blake3 }).unwrap();
    reader.read_message().unwrap()
}

pub fn chunk(data: &[u8], offset: u64) -> ChunkHeader {
    ChunkHeader {
        file: 0,
        offset,
        checksum: chunk_checksum(data),
    }
}
