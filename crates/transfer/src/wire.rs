//! The wire protocol: length-prefixed frames carrying either a control [`Message`] or a data chunk.
//!
//! Every frame is `len: u32 LE | kind: u8 | body[len - 1]`. A `kind = MESSAGE` body is a
//! postcard-encoded [`Message`] followed by an 8-byte check; a `kind = CHUNK` body is a fixed
//! [`ChunkHeader`], an 8-byte check, then the chunk's bytes. Frames larger than the reader's limit
//! are refused before anything is allocated, so a hostile peer cannot make either side allocate
//! more than the negotiated bound.
//!
//! The check is the xxh3-64 of every byte before it in the frame (length and kind included), so a
//! byte corrupted in flight anywhere in a message or a chunk's header is caught
//! ([`WireError::Corrupted`]) before the frame is acted on, and a damaged length cannot misframe
//! the stream unnoticed. A chunk's bytes are covered by the header's own checksum, which the
//! receiver compares before it writes anything; that checksum covers the data alone because the
//! resume journal keeps it.
//!
//! On a sealed connection (`xfer send --integrity`, [`crate::seal`]) every frame also ends with
//! a keyed tag, counted in its length, that covers the frame and its number on the connection.

use std::hash::Hasher;
use std::io::{self, BufRead, Read};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::filter::Filter;
use crate::manifest::{ManifestBatch, SinkKind};
use crate::seal::{tags_match, ChunkSeal, FrameKey, FrameWrite, TAG_LEN};

/// First bytes of every connection's `Hello`, so a stray client is refused at once.
pub const MAGIC: [u8; 4] = *b"XFR1";
/// Version of this protocol; peers with another version are refused with a clear error.
pub const PROTOCOL_VERSION: u16 = 12;
/// Largest control message body accepted.
pub const MAX_MESSAGE_LEN: usize = 64 << 20;
/// Most entries (directories and files) a sender puts in one [`ManifestBatch`]: with paths of
/// at most [`crate::manifest::MAX_PATH_LEN`] bytes, a batch stays well under
/// [`MAX_MESSAGE_LEN`].
pub const BATCH_ENTRIES: usize = 1024;
/// Most files a sender keeps announced and not yet settled (finalised, or found complete): its
/// scanner holds back beyond that, so both sides hold state for a bounded number of files
/// however large the tree. Enough for the files in flight on a long fat path.
pub const SENDER_UNSEALED: usize = 65_536;
/// Largest chunk payload either side will ever accept.
pub const MAX_CHUNK_LEN: usize = 64 << 20;
/// How often a receiver says [`Message::Working`] on each session's control connection, from
/// its `Welcome` to the session's end.
pub const HEARTBEAT: Duration = Duration::from_secs(1);

const KIND_MESSAGE: u8 = 1;
const KIND_CHUNK: u8 = 2;
const FRAME_PREFIX_LEN: usize = 5;
/// Length of the integrity check that follows a message's body and a chunk's header.
pub(crate) const CHECK_LEN: usize = 8;

/// Errors of reading or writing frames.
///
/// ```
/// use transfer::wire::{write_message, FrameReader, Message, WireError};
///
/// let mut bytes = Vec::new();
/// write_message(&mut bytes, &Message::Finish).unwrap();
/// bytes[6] ^= 1; // one bit flipped in flight
/// let damaged = FrameReader::new(&bytes[..], 0).read_message();
/// assert!(matches!(damaged, Err(WireError::Corrupted(_))));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The underlying socket failed or closed mid-frame.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer announced a frame longer than this side accepts.
    #[error("oversized frame from peer: {len} bytes exceeds the limit of {limit}")]
    Oversized {
        /// Announced length.
        len: usize,
        /// The limit in force.
        limit: usize,
    },
    /// The peer sent bytes that are not a valid frame.
    #[error("malformed frame from peer: {0}")]
    Malformed(String),
    /// A frame failed its integrity check: bytes were damaged in flight (or the peer speaks
    /// another protocol version). Nothing of the frame was acted on.
    #[error(
        "a {0} frame failed its integrity check (damaged in transit, or a peer speaking another \
         protocol version)"
    )]
    Corrupted(&'static str),
    /// On a sealed connection ([`crate::seal`]), a frame's tag did not match: it was changed,
    /// dropped, replayed or reordered in transit by someone without the connection's key.
    /// Nothing of the frame was acted on.
    #[error(
        "a {0} frame failed its authentication tag: the connection was tampered with in transit"
    )]
    Unauthentic(&'static str),
}

/// Header of a data chunk: which file, where in it, and the chunk's xxh3-64 checksum.
///
/// ```
/// use transfer::wire::{chunk_checksum, ChunkHeader};
///
/// let data = vec![7u8; 4 << 20];
/// let header = ChunkHeader { file: 3, offset: 8 << 20, checksum: chunk_checksum(&data) };
/// # let _ = header;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// Index of the file in the session's manifest.
    pub file: u32,
    /// Byte offset of the chunk in that file.
    pub offset: u64,
    /// xxh3-64 of the chunk's bytes.
    pub checksum: u64,
}

impl ChunkHeader {
    /// Encoded size of the header.
    pub const LEN: usize = 20;

    fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..4].copy_from_slice(&self.file.to_le_bytes());
        out[4..12].copy_from_slice(&self.offset.to_le_bytes());
        out[12..].copy_from_slice(&self.checksum.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8; Self::LEN]) -> Self {
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        ChunkHeader {
            file: u32_at(0),
            offset: u64_at(4),
            checksum: u64_at(12),
        }
    }
}

/// What a connection is for, declared in its `Hello`.
///
/// ```
/// use transfer::wire::Role;
///
/// let stream = Role::Data { session: [9; 16] };
/// assert_ne!(stream, Role::Control);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// The control connection that opens a session.
    Control,
    /// A data stream joining the session with this id.
    Data {
        /// Session id from the control connection's `Welcome`.
        session: [u8; 16],
    },
}

/// Limits the receiver imposes on a session, announced in `Welcome`.
///
/// ```
/// use transfer::wire::SessionLimits;
///
/// let limits = SessionLimits { max_streams: 64, max_chunk: 16 << 20 };
/// let unit: u32 = 64 << 20; // a sender's unit size is capped by the receiver's chunk limit
/// assert_eq!(unit.min(limits.max_chunk), 16 << 20);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionLimits {
    /// Most data streams open at once.
    pub max_streams: u32,
    /// Largest chunk payload in bytes.
    pub max_chunk: u32,
}

/// A receiver's limit that refused a session, announced in [`Message::Limited`]: a sender
/// (or the service running it) can tell it from other refusals and try again later.
///
/// ```
/// use transfer::wire::Limit;
///
/// assert_eq!(Limit::Sessions { max: 32 }.to_string(), "the receiver serves 32 sessions at once already");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum Limit {
    /// The receiver serves its most sessions at once already.
    #[error("the receiver serves {max} sessions at once already")]
    Sessions {
        /// Its `max_sessions`.
        max: u64,
    },
    /// The receiver is shutting down and takes no new session.
    #[error("the receiver is shutting down")]
    ShuttingDown,
    /// The receiver serves the most sessions at once it allows the sender's key (its tenant)
    /// already.
    #[error("the receiver serves {max} sessions of this key at once already")]
    TenantSessions {
        /// The tenant's `max_sessions`.
        max: u64,
    },
    /// Too many connections are in their key handshake: from the sender's address, or from
    /// everywhere (see `ReceiverOptions::max_handshakes`). It passes as soon as they
    /// authenticate or reach their deadline.
    #[error(
        "the receiver is busy authenticating other connections ({from_address} from this \
         address; at most {max} at once)"
    )]
    Authenticating {
        /// Connections from the sender's address in their handshake.
        from_address: u64,
        /// The receiver's `max_handshakes`.
        max: u64,
    },
}

/// What the receiver already holds of one manifest file, answered in `Plan`.
///
/// ```
/// use transfer::wire::FileStatus;
///
/// /// Bytes still to send of a file of `size` bytes.
/// fn to_send(status: &FileStatus, size: u64) -> u64 {
///     match status {
///         FileStatus::Missing => size,
///         FileStatus::Partial(held) => size - held.iter().map(|(_, len)| len).sum::<u64>(),
///         FileStatus::Complete => 0,
///     }
/// }
/// assert_eq!(to_send(&FileStatus::Partial(vec![(0, 4 << 20), (8 << 20, 4 << 20)]), 16 << 20), 8 << 20);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileStatus {
    /// Nothing usable: send the whole file.
    Missing,
    /// These verified `(offset, len)` ranges survive from an interrupted attempt.
    Partial(Vec<(u64, u64)>),
    /// The destination already holds this exact file (size and mtime match): send nothing. In
    /// a session that compares by content ([`PresentFiles::Compared`]) it holds a file of
    /// this size, which its seal compares.
    Complete,
}

/// What a session does with the files the receiver already holds complete
/// ([`Message::Start`]).
///
/// ```
/// use transfer::wire::PresentFiles;
///
/// // A plain re-run trusts size and mtime; `--verify` and `--checksum` read the content.
/// assert_eq!(PresentFiles::default(), PresentFiles::Kept);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum PresentFiles {
    /// Kept, found by size and mtime: nothing more is done with them.
    #[default]
    Kept,
    /// Verified (`--verify`): each is sealed with the sender's BLAKE3 of the source, and a
    /// copy whose content differs fails the run naming it (and is left as it is: with the
    /// source's size and mtime, it may as well be the one that is right).
    Verified,
    /// Compared by content (`--checksum`): every copy of the source's size, whatever its
    /// mtime, is planned complete and sealed with the sender's BLAKE3; one that hashes the
    /// same is kept (with the source's mode and mtime), one that differs is answered
    /// changed and sent again ([`Message::Compare`]). Both sides hash while other files'
    /// data flows, and only the files the receiver holds.
    Compared,
}

/// How long a credential a receiver granted ([`Message::Granted`]) may wait for its session.
pub const GRANT_LIFETIME: Duration = Duration::from_secs(120);

/// Most removed entries a [`Removal`] names one by one; its counts cover the rest.
pub const MAX_LISTED_REMOVALS: usize = 10_000;

/// What a mirroring session removed from its destination, or a dry run found it would: the
/// files and directories under the directories it sent that its manifest does not hold.
///
/// ```
/// use transfer::wire::{Removal, Removed};
///
/// let mut removal = Removal::default();
/// removal.add(Removed { path: b"run42/old.h5".to_vec(), size: 4096, dir: false });
/// removal.add(Removed { path: b"run42/old".to_vec(), size: 0, dir: true });
/// assert_eq!((removal.files, removal.dirs, removal.bytes), (1, 1, 4096));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Removal {
    /// The entries, in the order they were removed (contents before their directory), at most
    /// [`MAX_LISTED_REMOVALS`] of them.
    pub listed: Vec<Removed>,
    /// Files (and links, and anything else that is not a directory) removed.
    pub files: u64,
    /// Directories removed.
    pub dirs: u64,
    /// Bytes of the files removed.
    pub bytes: u64,
}

impl Removal {
    /// Counts one entry removed, and lists it while the list has room.
    pub fn add(&mut self, removed: Removed) {
        if removed.dir {
            self.dirs += 1;
        } else {
            self.files += 1;
            self.bytes = self.bytes.saturating_add(removed.size);
        }
        if self.listed.len() < MAX_LISTED_REMOVALS {
            self.listed.push(removed);
        }
    }

    /// Whether nothing was removed.
    pub fn is_empty(&self) -> bool {
        self.files == 0 && self.dirs == 0
    }
}

/// One entry of a [`Removal`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removed {
    /// Its path relative to the destination directory, `/`-separated raw bytes.
    pub path: Vec<u8>,
    /// Its size (0 for a directory).
    pub size: u64,
    /// A directory (removed once empty).
    pub dir: bool,
}

/// Control and acknowledgement messages.
///
/// ```
/// use transfer::wire::{write_message, FrameReader, Message};
///
/// let sent = Message::Ack { file: 1, offset: 4 << 20, len: 4 << 20 };
/// let mut bytes = Vec::new();
/// write_message(&mut bytes, &sent).unwrap();
/// assert_eq!(FrameReader::new(&bytes[..], 0).read_message().unwrap(), sent);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Message {
    /// First message of every connection (client to receiver).
    Hello {
        /// Must equal [`MAGIC`].
        magic: [u8; 4],
        /// Must equal [`PROTOCOL_VERSION`].
        version: u16,
        /// What the connection is for.
        role: Role,
        /// Client's fresh random nonce.
        nonce: [u8; 32],
        /// Which key the client holds ([`crate::auth::SessionKey::id`]): a receiver with a
        /// key per tenant proves the one it names.
        key: crate::auth::KeyId,
        /// Client's fresh X25519 public key ([`crate::auth`]).
        share: [u8; 32],
        /// Every frame after the handshake carries a tag, both ways ([`crate::seal`]).
        sealed: bool,
    },
    /// Receiver's answer: its nonce and its proof of knowing the key.
    Challenge {
        /// Receiver's fresh random nonce.
        nonce: [u8; 32],
        /// Receiver's fresh X25519 public key.
        share: [u8; 32],
        /// MAC over both nonces and both shares proving the receiver holds the key.
        proof: [u8; 32],
    },
    /// Client's proof of knowing the key.
    Auth {
        /// MAC over both nonces and the role.
        proof: [u8; 32],
    },
    /// Authentication succeeded.
    Welcome {
        /// The session this connection belongs to.
        session: [u8; 16],
        /// Limits in force for the session.
        limits: SessionLimits,
    },
    /// The receiver refuses the connection or the request; the text says why.
    Refused {
        /// Human-readable cause.
        reason: String,
    },
    /// Where the session's files land (control, sender to receiver, first after `Welcome`;
    /// not answered).
    Start {
        /// Destination directory relative to the receiver's root (empty: the root itself).
        dest: Vec<u8>,
        /// Files or a discarding sink.
        sink: SinkKind,
        /// What becomes of files the receiver already holds complete.
        present: PresentFiles,
        /// Mirror (`--delete`): once every file is in place, remove what the directories the
        /// session sends hold and its manifest does not, except what this filter (the
        /// sender's, paths relative to each source) leaves out. `None`: remove nothing.
        delete: Option<Filter>,
        /// One of several sessions of a striped transfer ([`crate::stripe`]): other sessions,
        /// here or on other receiving nodes sharing this file system, write other ranges of
        /// the same files. The session joins a part file and journal another made rather than
        /// start them afresh, and a file is placed by the session whose seal finds every range
        /// of it in the journal; a seal that does not leaves the file for the others.
        striped: bool,
    },
    /// The next batch of the manifest (control, sender to receiver); answered by a `Plan`.
    Entries(ManifestBatch),
    /// What the receiver already has of one batch's files (control, in the order batches came).
    Plan {
        /// Number of the batch's first file.
        first: u32,
        /// One entry per file of the batch.
        files: Vec<FileStatus>,
        /// It answers the batch that said `last`.
        last: bool,
    },
    /// All of a file's chunks were acknowledged and the source is unchanged: finalise it.
    Seal {
        /// Manifest file index.
        file: u32,
        /// BLAKE3 of the whole source file when `--verify` is on.
        blake3: Option<[u8; 32]>,
    },
    /// Result of sealing a file: `None` when it is in place under its final name.
    Finalized {
        /// Manifest file index.
        file: u32,
        /// Why finalising failed, if it did.
        error: Option<String>,
    },
    /// Files the receiver holds complete, to compare by content ([`PresentFiles::Compared`]),
    /// each with the BLAKE3 of its source (control, sender to receiver; at most
    /// [`BATCH_ENTRIES`]): sealed as a group, so that many small files cost one message each
    /// way. Answered by `Compared`, or by the `Finalized` with the reason of the first that
    /// could not be compared.
    Compare {
        /// Manifest file indices, each with its source's hash.
        files: Vec<(u32, [u8; 32])>,
    },
    /// What a comparison found ([`Message::Compare`], or a `Seal` of a file held complete).
    Compared {
        /// Files whose copy is the source's: in place, with the source's mode and mtime.
        kept: Vec<u32>,
        /// Files whose copy is not: the receiver holds nothing of them now, and the sender
        /// sends them whole and seals them.
        changed: Vec<u32>,
    },
    /// The sender is done: set directory metadata, flush, and end the session.
    Finish,
    /// The session ended; everything is durable on the receiver.
    Done {
        /// What a mirroring session removed (a dry run: would remove); empty without
        /// [`Message::Start`]'s `delete`.
        removed: Removal,
    },
    /// The receiver's heartbeat on the control connection (every [`HEARTBEAT`]): it is alive and
    /// working for the session, even while it has nothing else to say.
    Working,
    /// A chunk was verified and written (data stream, receiver to sender).
    Ack {
        /// Manifest file index.
        file: u32,
        /// Chunk offset.
        offset: u64,
        /// Chunk length.
        len: u32,
    },
    /// A chunk failed its checksum and must be sent again.
    Nack {
        /// Manifest file index.
        file: u32,
        /// Chunk offset.
        offset: u64,
    },
    /// The sender will send no more chunks on this stream; the receiver echoes it after the last ack.
    EndOfStream,
    /// A fatal error on the receiver (disk full, I/O error); the session cannot go on.
    Error {
        /// Human-readable cause.
        message: String,
    },
    /// The sender asks for QUIC data streams (control, after `Plan`); the receiver answers
    /// [`Message::QuicOffer`] or [`Message::Refused`].
    QuicRequest,
    /// The receiver serves the session's QUIC connections, on the UDP port of its TCP port
    /// number, with a certificate made for the session alone (see [`crate::quic`]).
    QuicOffer {
        /// BLAKE3 of the certificate's DER encoding: the sender accepts no other.
        certificate: [u8; 32],
    },
    /// The receiver refuses the session because `limit` is reached (control, instead of
    /// `Welcome`): a [`Message::Refused`] a sender may try again after.
    Limited {
        /// Which limit.
        limit: Limit,
    },
    /// The client asks the receiver to send files from under its key's root (control, first
    /// after `Welcome`, instead of `Start`; a key with read access only): answered by
    /// `Fetched` reports, or `Refused`.
    Fetch {
        /// A [`crate::sender::FetchRequest`] as JSON.
        request: String,
    },
    /// A report of the transfer the receiver runs for a `Fetch` (control, receiver to
    /// client); the connection closes after the last.
    Fetched {
        /// A [`crate::sender::FetchReport`] as JSON.
        report: String,
    },
    /// The client asks for a one-time credential with which another host may send one session
    /// of files to `dest` (control, first after `Welcome`, instead of `Start`; a key with
    /// write access only): answered by `Granted`, or `Refused`.
    Grant {
        /// The directory under the key's root the session must write to.
        dest: Vec<u8>,
    },
    /// The credential: a key the receiver accepts for one session to the granted directory,
    /// within [`GRANT_LIFETIME`] (control, receiver to client; the connection then closes).
    Granted {
        /// The key, as text.
        key: String,
    },
}

/// A frame as read: a control message, or a chunk whose bytes sit in the reader's buffer.
///
/// ```
/// # use transfer::wire::{chunk_checksum, write_chunk, write_message, ChunkHeader, FrameReader, Message};
/// # let data = b"the bytes of a chunk".to_vec();
/// # let header = ChunkHeader { file: 0, offset: 0, checksum: chunk_checksum(&data) };
/// # let mut bytes = Vec::new();
/// # write_message(&mut bytes, &Message::Working).unwrap();
/// # write_chunk(&mut bytes, &header, &data, None).unwrap();
/// # let mut reader = FrameReader::new(&bytes[..], 1 << 20);
/// use transfer::wire::Frame;
///
/// assert!(matches!(reader.read_frame().unwrap(), Frame::Message(Message::Working)));
/// match reader.read_frame().unwrap() {
///     Frame::Chunk(head, bytes) => assert_eq!((head.file, bytes), (0, &data[..])),
///     Frame::Message(m) => panic!("{m:?}"),
/// }
/// ```
#[derive(Debug)]
pub enum Frame<'a> {
    /// A control or acknowledgement message.
    Message(Message),
    /// A data chunk.
    Chunk(ChunkHeader, &'a [u8]),
}

/// A frame's start as read: a whole control message, or a chunk's header and the length of
/// the payload that follows it (read next with [`FrameReader::read_payload`] or
/// [`FrameReader::read_payload_into`]).
///
/// ```
/// # use transfer::wire::{chunk_checksum, write_chunk, write_message, ChunkHeader, FrameReader, Message};
/// # let data = b"the bytes of a chunk".to_vec();
/// # let header = ChunkHeader { file: 0, offset: 0, checksum: chunk_checksum(&data) };
/// # let mut bytes = Vec::new();
/// # write_message(&mut bytes, &Message::Working).unwrap();
/// # write_chunk(&mut bytes, &header, &data, None).unwrap();
/// # let mut reader = FrameReader::new(&bytes[..], 1 << 20);
/// use transfer::wire::Head;
///
/// assert!(matches!(reader.read_head().unwrap(), Head::Message(Message::Working)));
/// let Head::Chunk(head, len) = reader.read_head().unwrap() else { panic!() };
/// assert_eq!((head, len), (header, data.len()));
/// ```
#[derive(Debug)]
pub enum Head {
    /// A control or acknowledgement message.
    Message(Message),
    /// A data chunk's header and payload length.
    Chunk(ChunkHeader, usize),
}

/// Reads frames from a byte stream, reusing one buffer for chunk payloads.
///
/// ```
/// # use transfer::wire::{chunk_checksum, write_chunk, write_message, ChunkHeader, FrameReader, Message};
/// # let data = b"the bytes of a chunk".to_vec();
/// # let header = ChunkHeader { file: 0, offset: 0, checksum: chunk_checksum(&data) };
/// # let mut bytes = Vec::new();
/// # write_message(&mut bytes, &Message::Working).unwrap();
/// # write_chunk(&mut bytes, &header, &data, None).unwrap();
/// # let mut reader = FrameReader::new(&bytes[..], 1 << 20);
/// reader.read_message().unwrap();
/// let transfer::wire::Head::Chunk(head, _) = reader.read_head().unwrap() else { panic!() };
/// let (payload, _) = reader.read_payload().unwrap();
/// assert_eq!(chunk_checksum(payload), head.checksum, "what the receiver checks before writing");
/// ```
pub struct FrameReader<R> {
    inner: R,
    /// The head being read.
    head: Vec<u8>,
    /// Chunk payloads read into the reader's own memory. Apart from `head`, so that it keeps
    /// its length from chunk to chunk and is not filled again for each.
    buf: Vec<u8>,
    decoder: FrameDecoder,
}

/// The frames of a byte stream decoded from their bytes, with no reader: whoever reads the
/// stream, blocking ([`FrameReader`]) or not, gives it each frame's head once the bytes
/// [`FrameDecoder::head_len`] asks for have arrived, places a chunk's payload wherever it
/// belongs, and gives it the tag that follows on a sealed connection. It checks every length
/// before the bytes it announces are read, and every check and tag once they are.
///
/// ```
/// use transfer::wire::{write_message, FrameDecoder, Head, Message};
///
/// let mut bytes = Vec::new();
/// write_message(&mut bytes, &Message::Working).unwrap();
/// let mut decoder = FrameDecoder::new(0);
/// let need = decoder.head_len(&bytes[..3]).unwrap();
/// assert_eq!(need, 5, "the prefix first");
/// let need = decoder.head_len(&bytes[..need]).unwrap();
/// assert_eq!(need, bytes.len(), "then the whole message");
/// assert!(matches!(decoder.decode_head(&bytes).unwrap(), Head::Message(Message::Working)));
/// ```
#[derive(Debug)]
pub struct FrameDecoder {
    max_chunk: usize,
    max_message: usize,
    /// Payload bytes of the last chunk head still to arrive.
    payload_due: usize,
    /// On a sealed connection, the key of the frames read ([`crate::seal`]).
    key: Option<FrameKey>,
    /// The tag of the chunk whose head was read, hashed so far.
    chunk_tag: Option<blake3::Hasher>,
}

/// What a frame's prefix says, checked against the decoder's limits.
struct Layout {
    kind: u8,
    /// The bytes that follow the prefix.
    body_len: usize,
    /// The bytes of the head, prefix included: a message frame whole, a chunk frame up to its
    /// payload.
    head_len: usize,
}

impl FrameDecoder {
    /// A decoder of a plain connection's frames; chunks longer than `max_chunk` bytes and
    /// messages longer than [`MAX_MESSAGE_LEN`] are refused as oversized.
    ///
    /// ```
    /// use transfer::wire::{write_chunk, chunk_checksum, ChunkHeader, FrameDecoder, WireError};
    ///
    /// let data = [7u8; 100];
    /// let header = ChunkHeader { file: 0, offset: 0, checksum: chunk_checksum(&data) };
    /// let mut bytes = Vec::new();
    /// write_chunk(&mut bytes, &header, &data, None).unwrap();
    /// let mut decoder = FrameDecoder::new(64);
    /// let head = decoder.head_len(&bytes).unwrap();
    /// assert!(matches!(decoder.decode_head(&bytes[..head]), Err(WireError::Oversized { limit: 64, .. })));
    /// ```
    pub fn new(max_chunk: usize) -> Self {
        FrameDecoder {
            max_chunk: max_chunk.min(MAX_CHUNK_LEN),
            max_message: MAX_MESSAGE_LEN,
            payload_due: 0,
            key: None,
            chunk_tag: None,
        }
    }

    /// From the next frame on, every frame must carry its tag under `key` ([`crate::seal`]).
    pub(crate) fn open_sealed(&mut self, key: FrameKey) {
        self.key = Some(key);
    }

    /// Refuses messages longer than `limit` bytes (at most [`MAX_MESSAGE_LEN`]) from now on.
    pub fn set_message_limit(&mut self, limit: usize) {
        self.max_message = limit.min(MAX_MESSAGE_LEN);
    }

    /// The bytes of a frame's tag on this connection: [`crate::seal::TAG_LEN`] once sealed.
    fn tag_len(&self) -> usize {
        if self.key.is_some() {
            TAG_LEN
        } else {
            0
        }
    }

    /// How many bytes the next frame's head takes, given `start`, the first of them to have
    /// arrived: the prefix's length until it is there, then the head's (a message frame
    /// whole, a chunk frame up to its payload). A prefix that announces a malformed frame or an
    /// oversized message is refused here, before the bytes it announces are read.
    ///
    /// # Panics
    ///
    /// If a chunk's payload is still due ([`FrameDecoder::payload_arrived`]).
    pub fn head_len(&self, start: &[u8]) -> Result<usize, WireError> {
        assert_eq!(self.payload_due, 0, "a chunk's payload was not read");
        match start.first_chunk::<FRAME_PREFIX_LEN>() {
            Some(prefix) => Ok(self.layout(prefix)?.head_len),
            None => Ok(FRAME_PREFIX_LEN),
        }
    }

    /// What `prefix` says of its frame; a malformed frame or an oversized message is refused.
    fn layout(&self, prefix: &[u8; FRAME_PREFIX_LEN]) -> Result<Layout, WireError> {
        let len = u32::from_le_bytes(prefix[..4].try_into().expect("4 bytes")) as usize;
        let body_len = len
            .checked_sub(1)
            .ok_or_else(|| WireError::Malformed("zero-length frame".into()))?;
        let tag_len = self.tag_len();
        let head = match prefix[4] {
            KIND_MESSAGE => {
                let message_len = body_len.checked_sub(CHECK_LEN + tag_len).ok_or_else(|| {
                    WireError::Malformed(format!("message frame of {body_len} bytes has no check"))
                })?;
                if message_len > self.max_message {
                    return Err(WireError::Oversized {
                        len: message_len,
                        limit: self.max_message,
                    });
                }
                body_len
            }
            KIND_CHUNK => {
                if body_len < ChunkHeader::LEN + CHECK_LEN + tag_len {
                    return Err(WireError::Malformed(format!(
                        "chunk frame of {body_len} bytes has no header"
                    )));
                }
                ChunkHeader::LEN + CHECK_LEN
            }
            other => return Err(WireError::Malformed(format!("unknown frame kind {other}"))),
        };
        Ok(Layout {
            kind: prefix[4],
            body_len,
            head_len: FRAME_PREFIX_LEN + head,
        })
    }

    /// Decodes a frame's head from `head`, the [`FrameDecoder::head_len`] bytes it takes: a
    /// whole message, or a chunk's header and the length of the payload that follows.
    ///
    /// # Panics
    ///
    /// If `head` is not as long as [`FrameDecoder::head_len`] says.
    pub fn decode_head(&mut self, head: &[u8]) -> Result<Head, WireError> {
        assert_eq!(self.payload_due, 0, "a chunk's payload was not read");
        let (prefix, body) = head
            .split_first_chunk::<FRAME_PREFIX_LEN>()
            .expect("a head is longer than its prefix");
        let Layout {
            kind,
            body_len,
            head_len,
        } = self.layout(prefix)?;
        assert_eq!(head.len(), head_len, "a frame's head is head_len bytes");
        let tag_len = self.tag_len();
        if kind == KIND_MESSAGE {
            let (checked, tag) = body.split_at(body_len - tag_len);
            let (message, check) = checked.split_at(checked.len() - CHECK_LEN);
            verify_check(&[prefix, message], check, "message")?;
            if let Some(key) = &mut self.key {
                if !tags_match(&key.tag(&[prefix, checked]), tag) {
                    return Err(WireError::Unauthentic("message"));
                }
            }
            let msg = postcard::from_bytes(message)
                .map_err(|e| WireError::Malformed(format!("bad message: {e}")))?;
            return Ok(Head::Message(msg));
        }
        let data_len = body_len - (ChunkHeader::LEN + CHECK_LEN + tag_len);
        let (fields, check) = body.split_at(ChunkHeader::LEN);
        verify_check(&[prefix, fields], check, "chunk header")?;
        if data_len > self.max_chunk {
            return Err(WireError::Oversized {
                len: data_len,
                limit: self.max_chunk,
            });
        }
        self.payload_due = data_len;
        self.chunk_tag = self.key.as_mut().map(|key| key.chunk(&[prefix, body]));
        let fields = fields.try_into().expect("header length");
        Ok(Head::Chunk(ChunkHeader::decode(fields), data_len))
    }

    /// Payload bytes of the chunk whose head was decoded still to arrive.
    pub fn payload_due(&self) -> usize {
        self.payload_due
    }

    /// `n` bytes of the chunk's payload arrived, wherever the reader put them.
    ///
    /// # Panics
    ///
    /// If more arrived than were due.
    pub fn payload_arrived(&mut self, n: usize) {
        self.payload_due = (self.payload_due.checked_sub(n)).expect("no more payload than due");
    }

    /// The bytes of the chunk's tag that follow its payload: none on a plain connection.
    pub fn chunk_tag_len(&self) -> usize {
        if self.chunk_tag.is_some() {
            TAG_LEN
        } else {
            0
        }
    }

    /// The chunk's payload arrived, and its [`FrameDecoder::chunk_tag_len`] bytes of tag in
    /// `tag`: on a sealed connection, the seal its reader checks once it has hashed the
    /// payload.
    pub fn chunk_end(&mut self, tag: &[u8]) -> Option<ChunkSeal> {
        debug_assert_eq!(self.payload_due, 0, "the whole payload arrived");
        let hasher = self.chunk_tag.take()?;
        let tag = tag.try_into().expect("a tag of chunk_tag_len bytes");
        Some(ChunkSeal::new(hasher, tag))
    }
}

impl<R: Read> FrameReader<R> {
    /// Wraps `inner`; chunks longer than `max_chunk` bytes and messages longer than
    /// [`MAX_MESSAGE_LEN`] are refused as oversized.
    ///
    /// ```
    /// # use transfer::wire::{chunk_checksum, write_chunk, write_message, ChunkHeader, FrameReader, Message};
    /// # let data = b"the bytes of a chunk".to_vec();
    /// # let header = ChunkHeader { file: 0, offset: 0, checksum: chunk_checksum(&data) };
    /// # let mut bytes = Vec::new();
    /// # write_message(&mut bytes, &Message::Working).unwrap();
    /// # write_chunk(&mut bytes, &header, &data, None).unwrap();
    /// # let mut reader = FrameReader::new(&bytes[..], 8);
    /// reader.read_message().unwrap();
    /// assert!(matches!(reader.read_head(), Err(transfer::wire::WireError::Oversized { limit: 8, .. })));
    /// ```
    pub fn new(inner: R, max_chunk: usize) -> Self {
        FrameReader {
            inner,
            head: Vec::new(),
            buf: Vec::new(),
            decoder: FrameDecoder::new(max_chunk),
        }
    }

    /// From the next frame on, every frame must carry its tag under `key` ([`crate::seal`]);
    /// a chunk's is checked by its reader, which gets it with the payload.
    pub(crate) fn open_sealed(&mut self, key: FrameKey) {
        self.decoder.open_sealed(key);
    }

    /// Refuses messages longer than `limit` bytes (at most [`MAX_MESSAGE_LEN`]) from now on.
    ///
    /// ```
    /// use transfer::wire::{write_message, FrameReader, Message, WireError};
    ///
    /// let mut bytes = Vec::new();
    /// write_message(&mut bytes, &Message::Error { message: "x".repeat(100) }).unwrap();
    /// let mut reader = FrameReader::new(&bytes[..], 0);
    /// reader.set_message_limit(64);
    /// assert!(matches!(reader.read_message(), Err(WireError::Oversized { .. })));
    /// ```
    pub fn set_message_limit(&mut self, limit: usize) {
        self.decoder.set_message_limit(limit);
    }

    /// Gives back the wrapped reader.
    ///
    /// ```
    /// use transfer::wire::FrameReader;
    ///
    /// let mut reader = FrameReader::new(std::io::Cursor::new(vec![0u8; 3]), 0);
    /// assert_eq!(reader.get_mut().position(), 0);
    /// ```
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Reads the next frame. A clean end of stream before a frame starts is `UnexpectedEof`.
    ///
    /// ```
    /// use transfer::wire::{FrameReader, WireError};
    ///
    /// let mut reader = FrameReader::new(&[][..], 0);
    /// match reader.read_frame() {
    ///     Err(WireError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof),
    ///     other => panic!("{other:?}"),
    /// }
    /// ```
    pub fn read_frame(&mut self) -> Result<Frame<'_>, WireError> {
        match self.read_head()? {
            Head::Message(m) => Ok(Frame::Message(m)),
            Head::Chunk(header, _) => {
                let (payload, seal) = self.read_payload()?;
                // A sealed chunk read whole is checked here, where its bytes are.
                if seal.is_some_and(|seal| !seal.matches(&blake3::hash(payload))) {
                    return Err(WireError::Unauthentic("chunk"));
                }
                Ok(Frame::Chunk(header, payload))
            }
        }
    }

    /// Reads the next frame up to a chunk's payload, which must be read before the next head.
    /// A clean end of stream before a frame starts is `UnexpectedEof`.
    ///
    /// ```
    /// # use transfer::wire::{chunk_checksum, write_chunk, write_message, ChunkHeader, FrameReader, Message};
    /// # let data = b"the bytes of a chunk".to_vec();
    /// # let header = ChunkHeader { file: 0, offset: 0, checksum: chunk_checksum(&data) };
    /// # let mut bytes = Vec::new();
    /// # write_message(&mut bytes, &Message::Working).unwrap();
    /// # write_chunk(&mut bytes, &header, &data, None).unwrap();
    /// # let mut reader = FrameReader::new(std::io::BufReader::new(&bytes[..]), 1 << 20);
    /// reader.read_head().unwrap();
    /// let transfer::wire::Head::Chunk(_, len) = reader.read_head().unwrap() else { panic!() };
    /// let mut place = vec![0; len]; // e.g. a window of the file the chunk belongs in
    /// reader.read_payload_into(&mut place).unwrap();
    /// assert_eq!(place, data);
    /// ```
    pub fn read_head(&mut self) -> Result<Head, WireError> {
        self.head.resize(FRAME_PREFIX_LEN, 0);
        read_exact(&mut self.inner, &mut self.head)?;
        let len = self.decoder.head_len(&self.head)?;
        self.head.resize(len, 0);
        read_exact(&mut self.inner, &mut self.head[FRAME_PREFIX_LEN..])?;
        self.decoder.decode_head(&self.head)
    }

    /// Reads the payload of the chunk whose head was just read into the reader's own buffer;
    /// on a sealed connection also its tag, which the caller checks ([`ChunkSeal::matches`]).
    ///
    /// ```
    /// # use transfer::wire::{chunk_checksum, write_chunk, write_message, ChunkHeader, FrameReader, Message};
    /// # let data = b"the bytes of a chunk".to_vec();
    /// # let header = ChunkHeader { file: 0, offset: 0, checksum: chunk_checksum(&data) };
    /// # let mut bytes = Vec::new();
    /// # write_message(&mut bytes, &Message::Working).unwrap();
    /// # write_chunk(&mut bytes, &header, &data, None).unwrap();
    /// # let mut reader = FrameReader::new(&bytes[..], 1 << 20);
    /// reader.read_head().unwrap();
    /// reader.read_head().unwrap();
    /// let (payload, seal) = reader.read_payload().unwrap();
    /// assert_eq!(payload, &data[..]);
    /// assert!(seal.is_none(), "a plain connection's chunks carry no tag");
    /// ```
    pub fn read_payload(&mut self) -> Result<(&[u8], Option<ChunkSeal>), WireError> {
        let due = self.decoder.payload_due();
        self.decoder.payload_arrived(due);
        self.buf.resize(due, 0);
        read_exact(&mut self.inner, &mut self.buf)?;
        let seal = self.read_chunk_tag()?;
        Ok((&self.buf, seal))
    }

    /// After a chunk's payload: on a sealed connection, reads its tag, for the chunk's reader
    /// to check once it has hashed the payload.
    fn read_chunk_tag(&mut self) -> Result<Option<ChunkSeal>, WireError> {
        let mut tag = [0u8; TAG_LEN];
        let tag = &mut tag[..self.decoder.chunk_tag_len()];
        read_exact(&mut self.inner, tag)?;
        Ok(self.decoder.chunk_end(tag))
    }

    /// Reads the next frame and requires it to be a message.
    ///
    /// ```
    /// # use transfer::wire::{chunk_checksum, write_chunk, write_message, ChunkHeader, FrameReader, Message};
    /// # let data = b"the bytes of a chunk".to_vec();
    /// # let header = ChunkHeader { file: 0, offset: 0, checksum: chunk_checksum(&data) };
    /// # let mut bytes = Vec::new();
    /// # write_message(&mut bytes, &Message::Working).unwrap();
    /// # write_chunk(&mut bytes, &header, &data, None).unwrap();
    /// # let mut reader = FrameReader::new(&bytes[..], 1 << 20);
    /// assert_eq!(reader.read_message().unwrap(), Message::Working);
    /// assert!(reader.read_message().is_err(), "a chunk where a message was due");
    /// ```
    pub fn read_message(&mut self) -> Result<Message, WireError> {
        match self.read_frame()? {
            Frame::Message(m) => Ok(m),
            Frame::Chunk(..) => Err(WireError::Malformed(
                "data chunk where a control message was expected".into(),
            )),
        }
    }
}

impl<R: Read> FrameReader<io::BufReader<R>> {
    /// Whether the whole next frame has arrived in the buffer already, so that reading it will
    /// not wait for the peer (its length is checked when it is read).
    ///
    /// ```
    /// use std::io::BufReader;
    /// use transfer::wire::{write_message, FrameReader, Message, Removal};
    ///
    /// let mut bytes = Vec::new();
    /// write_message(&mut bytes, &Message::Working).unwrap();
    /// write_message(&mut bytes, &Message::Done { removed: Removal::default() }).unwrap();
    /// let mut reader = FrameReader::new(BufReader::new(&bytes[..]), 0);
    /// reader.read_message().unwrap();
    /// assert!(reader.next_frame_buffered(), "Done arrived with Working");
    /// reader.read_message().unwrap();
    /// assert!(!reader.next_frame_buffered());
    /// ```
    pub fn next_frame_buffered(&self) -> bool {
        let buffered = self.inner.buffer();
        self.decoder.payload_due() == 0
            && buffered.len() >= 4
            && (buffered.len() - 4) as u64
                >= u64::from(u32::from_le_bytes(
                    buffered[..4].try_into().expect("4 bytes"),
                ))
    }

    /// Reads the payload of the chunk whose head was just read into `dest`, which must be as
    /// long: what the buffer holds is copied, the rest is read straight into `dest`. On a sealed
    /// connection also reads the chunk's tag, which the caller checks.
    ///
    /// ```
    /// # use transfer::wire::{chunk_checksum, write_chunk, write_message, ChunkHeader, FrameReader, Message};
    /// # let data = b"the bytes of a chunk".to_vec();
    /// # let header = ChunkHeader { file: 0, offset: 0, checksum: chunk_checksum(&data) };
    /// # let mut bytes = Vec::new();
    /// # write_message(&mut bytes, &Message::Working).unwrap();
    /// # write_chunk(&mut bytes, &header, &data, None).unwrap();
    /// # let mut reader = FrameReader::new(std::io::BufReader::new(&bytes[..]), 1 << 20);
    /// reader.read_head().unwrap();
    /// reader.read_head().unwrap();
    /// let mut dest = vec![0; data.len()];
    /// reader.read_payload_into(&mut dest).unwrap();
    /// assert_eq!(dest, data);
    /// ```
    pub fn read_payload_into(&mut self, dest: &mut [u8]) -> Result<Option<ChunkSeal>, WireError> {
        assert_eq!(dest.len(), self.decoder.payload_due(), "payload length");
        self.decoder.payload_arrived(dest.len());
        let buffered = self.inner.buffer();
        let n = buffered.len().min(dest.len());
        dest[..n].copy_from_slice(&buffered[..n]);
        self.inner.consume(n);
        read_exact(self.inner.get_mut(), &mut dest[n..])?;
        self.read_chunk_tag()
    }
}

/// `read_exact` that says in words when the peer closed the connection.
fn read_exact(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<()> {
    reader.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => peer_closed(),
        _ => e,
    })
}

/// The error of a connection that the peer closed inside a frame.
pub(crate) fn peer_closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the peer closed the connection",
    )
}

/// The integrity check over `parts`, in order.
fn frame_check(parts: &[&[u8]]) -> [u8; CHECK_LEN] {
    let mut hasher = twox_hash::XxHash3_64::new();
    for part in parts {
        hasher.write(part);
    }
    hasher.finish().to_le_bytes()
}

/// Compares a frame's check with the bytes it covers. Fuzzing builds skip the comparison so that
/// the fuzzer reaches the decoders behind it.
fn verify_check(parts: &[&[u8]], check: &[u8], what: &'static str) -> Result<(), WireError> {
    if cfg!(fuzzing) || frame_check(parts) == check {
        Ok(())
    } else {
        Err(WireError::Corrupted(what))
    }
}

/// Writes one message frame.
///
/// ```
/// use transfer::wire::{write_message, Message};
///
/// let mut bytes = Vec::new();
/// write_message(&mut bytes, &Message::EndOfStream).unwrap();
/// assert_eq!(u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize, bytes.len() - 4);
/// ```
pub fn write_message<W: FrameWrite + ?Sized>(w: &mut W, msg: &Message) -> Result<(), WireError> {
    let mut body = Vec::with_capacity(64);
    body.extend_from_slice(&[0u8; FRAME_PREFIX_LEN]);
    let mut body = postcard::to_extend(msg, body)
        .map_err(|e| WireError::Malformed(format!("cannot encode message: {e}")))?;
    let len = body.len() - FRAME_PREFIX_LEN;
    if len > MAX_MESSAGE_LEN {
        return Err(WireError::Oversized {
            len,
            limit: MAX_MESSAGE_LEN,
        });
    }
    let tag_len = if w.seals() { TAG_LEN } else { 0 };
    body[..4].copy_from_slice(&((1 + len + CHECK_LEN + tag_len) as u32).to_le_bytes());
    body[4] = KIND_MESSAGE;
    let check = frame_check(&[&body]);
    body.extend_from_slice(&check);
    w.write_frame(&[&body], &[&body])?;
    Ok(())
}

/// Writes one chunk frame with a single vectored write (header and payload are not copied
/// together). On a sealed connection its tag covers `data` through `content`, their BLAKE3
/// hash, computed here when not given (a sender that reads the bytes from a mapped file hashes
/// them where it reads them, [`crate::seal`]).
///
/// ```
/// use transfer::wire::{chunk_checksum, write_chunk, ChunkHeader};
///
/// let data = vec![1u8; 1 << 16];
/// let header = ChunkHeader { file: 0, offset: 0, checksum: chunk_checksum(&data) };
/// let mut bytes = Vec::new();
/// write_chunk(&mut bytes, &header, &data, None).unwrap();
/// assert_eq!(bytes.len(), data.len() + 4 + 1 + ChunkHeader::LEN + 8);
/// ```
pub fn write_chunk<W: FrameWrite + ?Sized>(
    w: &mut W,
    header: &ChunkHeader,
    data: &[u8],
    content: Option<&blake3::Hash>,
) -> Result<(), WireError> {
    if data.len() > MAX_CHUNK_LEN {
        return Err(WireError::Oversized {
            len: data.len(),
            limit: MAX_CHUNK_LEN,
        });
    }
    const CHECKED: usize = FRAME_PREFIX_LEN + ChunkHeader::LEN;
    let sealed = w.seals();
    let tag_len = if sealed { TAG_LEN } else { 0 };
    let mut prefix = [0u8; CHECKED + CHECK_LEN];
    let len = (1 + ChunkHeader::LEN + CHECK_LEN + data.len() + tag_len) as u32;
    prefix[..4].copy_from_slice(&len.to_le_bytes());
    prefix[4] = KIND_CHUNK;
    prefix[FRAME_PREFIX_LEN..CHECKED].copy_from_slice(&header.encode());
    let check = frame_check(&[&prefix[..CHECKED]]);
    prefix[CHECKED..].copy_from_slice(&check);
    let hashed;
    let content = match content {
        Some(content) => content,
        None if sealed => {
            hashed = blake3::hash(data);
            &hashed
        }
        None => &blake3::Hash::from_bytes([0; 32]),
    };
    let (head, tail) = prefix.split_at(FRAME_PREFIX_LEN);
    w.write_frame(&[head, tail, content.as_bytes()], &[&prefix, data])?;
    Ok(())
}

/// xxh3-64 checksum of a chunk, the per-unit integrity check.
///
/// ```
/// use transfer::wire::chunk_checksum;
///
/// assert_ne!(chunk_checksum(b"abc"), chunk_checksum(b"abd"));
/// ```
pub fn chunk_checksum(data: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::FrameWriter;
    use proptest::prelude::*;

    fn roundtrip(msg: &Message) -> Message {
        let mut out = Vec::new();
        write_message(&mut out, msg).unwrap();
        FrameReader::new(&out[..], MAX_CHUNK_LEN)
            .read_message()
            .unwrap()
    }

    /// The checksum is standard XXH3-64 (seed 0), whatever SIMD path the CPU takes: values from
    /// the reference algorithm, for an empty input and for a megabyte that runs the long loop.
    #[test]
    fn chunk_checksum_is_standard_xxh3() {
        assert_eq!(chunk_checksum(b""), 0x2d06_8005_38d3_94c2);
        let data: Vec<u8> = (0..(1u32 << 20) + 7)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        assert_eq!(chunk_checksum(&data), 0xa80b_ea05_3044_86e6);
    }

    #[test]
    fn messages_roundtrip() {
        let msgs = [
            Message::Hello {
                magic: MAGIC,
                version: PROTOCOL_VERSION,
                role: Role::Data { session: [7; 16] },
                nonce: [1; 32],
                key: crate::auth::KeyId([2; 8]),
                share: [3; 32],
                sealed: true,
            },
            Message::Plan {
                first: 1 << 20,
                files: vec![
                    FileStatus::Missing,
                    FileStatus::Partial(vec![(0, 10), (20, 5)]),
                    FileStatus::Complete,
                ],
                last: true,
            },
            Message::Start {
                dest: b"d/e".to_vec(),
                sink: SinkKind::Files,
                present: PresentFiles::Compared,
                delete: Some(Filter::default().exclude("*.tmp")),
                striped: true,
            },
            Message::Compare {
                files: vec![(7, [9; 32])],
            },
            Message::Compared {
                kept: vec![7],
                changed: vec![8, 9],
            },
            Message::Done {
                removed: Removal {
                    listed: vec![Removed {
                        path: b"run/old".to_vec(),
                        size: 12,
                        dir: false,
                    }],
                    files: 1,
                    dirs: 0,
                    bytes: 12,
                },
            },
            Message::Entries(ManifestBatch::memory(5)),
            Message::Ack {
                file: 3,
                offset: u64::MAX,
                len: 17,
            },
            Message::Error {
                message: "disk full".into(),
            },
            Message::QuicRequest,
            Message::Limited {
                limit: Limit::Sessions { max: 32 },
            },
            Message::Limited {
                limit: Limit::ShuttingDown,
            },
            Message::Limited {
                limit: Limit::Authenticating {
                    from_address: 8,
                    max: 64,
                },
            },
            Message::QuicOffer {
                certificate: [9; 32],
            },
        ];
        for m in &msgs {
            assert_eq!(&roundtrip(m), m);
        }
    }

    #[test]
    fn oversized_chunk_is_refused_before_reading_it() {
        let mut out = Vec::new();
        let header = ChunkHeader {
            file: 0,
            offset: 0,
            checksum: 0,
        };
        write_chunk(&mut out, &header, &[0u8; 100], None).unwrap();
        let err = FrameReader::new(&out[..], 99).read_frame().unwrap_err();
        assert!(
            matches!(
                err,
                WireError::Oversized {
                    len: 100,
                    limit: 99
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_frame_counts_as_buffered_only_once_all_of_it_is_in_the_buffer() {
        let mut out = Vec::new();
        write_message(&mut out, &Message::EndOfStream).unwrap();
        let header = ChunkHeader {
            file: 0,
            offset: 0,
            checksum: 0,
        };
        write_chunk(&mut out, &header, &[7u8; 100], None).unwrap();
        let message_len = out.len() - 100 - FRAME_PREFIX_LEN - ChunkHeader::LEN - CHECK_LEN;
        // A buffer that ends one byte short of the chunk frame.
        let capacity = out.len() - 1;
        let mut reader = FrameReader::new(
            io::BufReader::with_capacity(capacity, &out[..]),
            MAX_CHUNK_LEN,
        );
        assert!(!reader.next_frame_buffered(), "nothing read yet");
        reader.get_mut().fill_buf().unwrap();
        assert!(reader.next_frame_buffered());
        assert_eq!(reader.read_message().unwrap(), Message::EndOfStream);
        assert_eq!(reader.get_mut().buffer().len(), capacity - message_len);
        assert!(
            !reader.next_frame_buffered(),
            "the chunk lacks its last byte"
        );
        let Head::Chunk(_, 100) = reader.read_head().unwrap() else {
            panic!("not the chunk")
        };
        assert!(!reader.next_frame_buffered(), "its payload is due");
        assert_eq!(reader.read_payload().unwrap().0, &[7u8; 100]);
    }

    #[test]
    fn oversized_message_is_refused() {
        let mut out = ((MAX_MESSAGE_LEN + 2 + CHECK_LEN) as u32)
            .to_le_bytes()
            .to_vec();
        out.push(KIND_MESSAGE);
        let err = FrameReader::new(&out[..], 16).read_frame().unwrap_err();
        assert!(err.to_string().starts_with("oversized frame"), "{err}");
    }

    /// Every bit of a message frame, and of a chunk frame up to its data, is covered: flipping
    /// any one of them gives an error and never a different frame; flipping a bit of the data
    /// leaves the frame readable but its checksum wrong, which the receiver turns into a resend.
    #[test]
    fn every_flipped_bit_is_caught() {
        let mut frame = Vec::new();
        write_message(
            &mut frame,
            &Message::Ack {
                file: 2,
                offset: 1 << 20,
                len: 4096,
            },
        )
        .unwrap();
        let data = b"sixteen bytes!!!";
        let header = ChunkHeader {
            file: 1,
            offset: 7,
            checksum: chunk_checksum(data),
        };
        let message_len = frame.len();
        write_chunk(&mut frame, &header, data, None).unwrap();
        for bit in 0..frame.len() * 8 {
            let mut damaged = frame.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            let mut reader = FrameReader::new(&damaged[..], 64);
            let first = reader.read_frame().map(|f| matches!(f, Frame::Message(_)));
            if bit / 8 < message_len {
                assert!(first.is_err(), "bit {bit} of the message went unnoticed");
                continue;
            }
            assert!(
                first.unwrap(),
                "bit {bit}: the intact message no longer reads"
            );
            match reader.read_frame() {
                Err(_) => assert!(bit / 8 < frame.len() - data.len(), "bit {bit} of the data"),
                Ok(Frame::Chunk(h, d)) => {
                    assert!(
                        bit / 8 >= frame.len() - data.len(),
                        "bit {bit} of the header"
                    );
                    assert_eq!(h, header);
                    assert_ne!(chunk_checksum(d), h.checksum, "bit {bit}");
                }
                Ok(Frame::Message(m)) => panic!("bit {bit} made a chunk into {m:?}"),
            }
        }
    }

    #[test]
    fn a_damaged_frame_names_what_was_damaged() {
        let mut frame = Vec::new();
        write_message(&mut frame, &Message::Finish).unwrap();
        *frame.last_mut().unwrap() ^= 0x10;
        let err = FrameReader::new(&frame[..], 64).read_frame().unwrap_err();
        assert!(matches!(err, WireError::Corrupted("message")), "{err}");
        assert!(err.to_string().contains("integrity check"), "{err}");
    }

    /// What a frame decodes to: a message, or a chunk's header and payload (and whether its
    /// seal, if sealed, matches).
    #[derive(Debug, PartialEq)]
    enum Decoded {
        Message(Message),
        Chunk(ChunkHeader, Vec<u8>, bool),
    }

    /// Decodes `bytes` as an event-driven reader does: they arrive in pieces of the sizes in
    /// `pieces` (cycled), each head is decoded once [`FrameDecoder::head_len`] of its bytes
    /// are there, and a chunk's payload and tag are taken as they come. Ends at the first error
    /// or where the bytes end.
    fn decode_in_pieces(
        bytes: &[u8],
        pieces: &[usize],
        key: Option<FrameKey>,
    ) -> (Vec<Decoded>, Option<WireError>) {
        let mut decoder = FrameDecoder::new(1 << 16);
        if let Some(key) = key {
            decoder.open_sealed(key);
        }
        let (mut arrived, mut taken, mut piece) = (0, 0, 0);
        let mut more = |arrived: &mut usize| {
            let size = pieces[piece % pieces.len()].max(1);
            piece += 1;
            *arrived = (*arrived + size).min(bytes.len());
        };
        let mut frames = Vec::new();
        loop {
            let head = loop {
                match decoder.head_len(&bytes[taken..arrived]) {
                    Err(e) => return (frames, Some(e)),
                    Ok(need) if arrived - taken >= need => break &bytes[taken..taken + need],
                    Ok(_) if arrived == bytes.len() => return (frames, None),
                    Ok(_) => more(&mut arrived),
                }
            };
            taken += head.len();
            match decoder.decode_head(head) {
                Err(e) => return (frames, Some(e)),
                Ok(Head::Message(m)) => frames.push(Decoded::Message(m)),
                Ok(Head::Chunk(header, len)) => {
                    let mut payload = Vec::new();
                    while payload.len() < len {
                        if arrived == taken {
                            if arrived == bytes.len() {
                                return (frames, None);
                            }
                            more(&mut arrived);
                        }
                        let n = (len - payload.len()).min(arrived - taken);
                        payload.extend_from_slice(&bytes[taken..taken + n]);
                        decoder.payload_arrived(n);
                        taken += n;
                    }
                    let tag_len = decoder.chunk_tag_len();
                    while arrived - taken < tag_len {
                        if arrived == bytes.len() {
                            return (frames, None);
                        }
                        more(&mut arrived);
                    }
                    let seal = decoder.chunk_end(&bytes[taken..taken + tag_len]);
                    taken += tag_len;
                    let sealed = seal.is_none_or(|s| s.matches(&blake3::hash(&payload)));
                    frames.push(Decoded::Chunk(header, payload, sealed));
                }
            }
        }
    }

    /// The same bytes through the blocking reader.
    fn read_whole(bytes: &[u8], key: Option<FrameKey>) -> (Vec<Decoded>, Option<WireError>) {
        let mut reader = FrameReader::new(bytes, 1 << 16);
        if let Some(key) = key {
            reader.open_sealed(key);
        }
        let mut frames = Vec::new();
        loop {
            match reader.read_head() {
                Err(WireError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return (frames, None)
                }
                Err(e) => return (frames, Some(e)),
                Ok(Head::Message(m)) => frames.push(Decoded::Message(m)),
                Ok(Head::Chunk(header, _)) => match reader.read_payload() {
                    Err(WireError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        return (frames, None)
                    }
                    Err(e) => return (frames, Some(e)),
                    Ok((payload, seal)) => {
                        let sealed = seal.is_none_or(|s| s.matches(&blake3::hash(payload)));
                        frames.push(Decoded::Chunk(header, payload.to_vec(), sealed));
                    }
                },
            }
        }
    }

    proptest! {
        /// Frames decoded from bytes in pieces of any size, as an event-driven reader gets
        /// them, are the frames the blocking reader reads, with the same first error, plain
        /// and sealed, whole or cut short or with a byte changed.
        #[test]
        fn frames_decoded_in_pieces_are_the_frames_read(
            frames in proptest::collection::vec(
                (any::<bool>(), any::<u32>(), proptest::collection::vec(any::<u8>(), 0..300)),
                1..6,
            ),
            pieces in proptest::collection::vec(1usize..64, 1..8),
            sealed: bool,
            cut in any::<proptest::sample::Index>(),
            flip in proptest::option::of((any::<proptest::sample::Index>(), 1u8..=255)),
        ) {
            let mut writer = FrameWriter::new(Vec::new());
            if sealed {
                writer.seal_with(FrameKey::new([9; 32])).unwrap();
            }
            let mut written = Vec::new();
            for (is_chunk, n, data) in frames {
                if is_chunk {
                    let header = ChunkHeader { file: n, offset: 7, checksum: chunk_checksum(&data) };
                    let content = sealed.then(|| blake3::hash(&data));
                    write_chunk(&mut writer, &header, &data, content.as_ref()).unwrap();
                    written.push(Decoded::Chunk(header, data, true));
                } else {
                    let message = Message::Error { message: String::from_utf8_lossy(&data).into() };
                    write_message(&mut writer, &message).unwrap();
                    written.push(Decoded::Message(message));
                }
            }
            let mut bytes = writer.get_ref().clone();
            if let Some((at, bits)) = flip {
                let at = at.index(bytes.len());
                bytes[at] ^= bits;
            }
            let cut = cut.index(bytes.len() / 4 + 1);
            bytes.truncate(bytes.len() - cut);
            let key = || sealed.then(|| FrameKey::new([9; 32]));
            let (read, read_error) = read_whole(&bytes, key());
            let (decoded, decode_error) = decode_in_pieces(&bytes, &pieces, key());
            if flip.is_none() && cut == 0 {
                prop_assert_eq!(&decoded, &written);
                prop_assert!(decode_error.is_none(), "{:?}", decode_error);
            }
            prop_assert_eq!(decoded, read);
            prop_assert_eq!(
                decode_error.map(|e| e.to_string()),
                read_error.map(|e| e.to_string())
            );
        }

        #[test]
        fn chunk_roundtrip(file: u32, offset: u64, data in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let header = ChunkHeader { file, offset, checksum: chunk_checksum(&data) };
            let mut out = Vec::new();
            write_chunk(&mut out, &header, &data, None).unwrap();
            let mut reader = FrameReader::new(&out[..], 4096);
            match reader.read_frame().unwrap() {
                Frame::Chunk(h, d) => { prop_assert_eq!(h, header); prop_assert_eq!(d, &data[..]); }
                Frame::Message(m) => prop_assert!(false, "got message {:?}", m),
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut reader = FrameReader::new(&bytes[..], 256);
            for _ in 0..8 {
                if reader.read_frame().is_err() { break; }
            }
        }

        #[test]
        fn truncated_frames_are_errors(cut in 0usize..40) {
            let mut out = Vec::new();
            write_message(&mut out, &Message::Nack { file: 1, offset: 99 }).unwrap();
            write_chunk(&mut out, &ChunkHeader { file: 1, offset: 2, checksum: 3 }, b"hello", None).unwrap();
            let cut = cut.min(out.len() - 1);
            let mut reader = FrameReader::new(&out[..cut], 64);
            let first = reader.read_frame().map(|_| ()).is_ok();
            prop_assert!(!first || reader.read_frame().is_err());
        }
    }
}
