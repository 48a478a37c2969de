//! Integrity without encryption (`xfer send --integrity`), as GridFTP's protected data channel
//! offers it: once a connection's key handshake is done, every frame on it ends with a tag, a
//! BLAKE3 keyed hash of the frame and of its number on the connection, under a key of the
//! connection's and direction's own (derived from [`crate::auth::Agreed`]) that only the two ends
//! can derive: it comes from the key the connection proved and the handshake's Diffie-Hellman
//! secret, which nobody who watched the handshake knows, even with the receiver's key.
//!
//! Someone on the path who rewrites, drops, replays or reorders a frame (a chunk and its xxh3,
//! an acknowledgement, a control message carrying `--verify`'s hashes) is caught at the next
//! tag checked, and cannot make a tag of their own. A chunk's tag covers its bytes through their
//! BLAKE3 hash, which each side computes where it holds the bytes (a sender reading a mapped
//! file, a receiver writing one, hash within their guards against `SIGBUS`); the xxh3 that the
//! journal keeps is checked as before.
//!
//! Frames are written through [`FrameWrite`]: [`FrameWriter`] seals them once it holds a key;
//! plain writers (a socket, a buffer) never do.

use std::io::{self, BufWriter, IoSlice, Write};

/// Bytes of the tag a sealed frame ends with.
pub const TAG_LEN: usize = 16;

/// One direction's key of one connection, and the number of the next frame it seals or opens.
#[derive(Clone)]
pub struct FrameKey {
    key: [u8; 32],
    next: u64,
}

impl std::fmt::Debug for FrameKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FrameKey(.., next: {})", self.next)
    }
}

impl FrameKey {
    pub(crate) fn new(key: [u8; 32]) -> FrameKey {
        FrameKey { key, next: 0 }
    }

    /// A keyed hasher for the next frame, its number already in it.
    fn start(&mut self) -> blake3::Hasher {
        let mut hasher = blake3::Hasher::new_keyed(&self.key);
        hasher.update(&self.next.to_le_bytes());
        self.next += 1;
        hasher
    }

    /// The tag of the next frame, which covers `covered`.
    pub(crate) fn tag(&mut self, covered: &[&[u8]]) -> [u8; TAG_LEN] {
        let mut hasher = self.start();
        covered.iter().for_each(|part| {
            hasher.update(part);
        });
        truncated(&hasher)
    }

    /// The next frame's hasher with `covered` in it, for a chunk whose content is hashed later.
    pub(crate) fn chunk(&mut self, covered: &[&[u8]]) -> blake3::Hasher {
        let mut hasher = self.start();
        covered.iter().for_each(|part| {
            hasher.update(part);
        });
        hasher
    }
}

fn truncated(hasher: &blake3::Hasher) -> [u8; TAG_LEN] {
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&hasher.finalize().as_bytes()[..TAG_LEN]);
    tag
}

/// Compares two tags in time that does not depend on where they differ.
pub(crate) fn tags_match(a: &[u8; TAG_LEN], b: &[u8]) -> bool {
    b.len() == TAG_LEN && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// A received chunk's tag, checked once its content's hash is known (read with the chunk's
/// payload, [`crate::wire::FrameReader::read_payload`]).
#[derive(Debug, Clone)]
pub struct ChunkSeal {
    hasher: blake3::Hasher,
    tag: [u8; TAG_LEN],
}

impl ChunkSeal {
    pub(crate) fn new(hasher: blake3::Hasher, tag: [u8; TAG_LEN]) -> ChunkSeal {
        ChunkSeal { hasher, tag }
    }

    /// Whether the tag covers a chunk whose bytes hash (BLAKE3) to `content`.
    pub fn matches(&self, content: &blake3::Hash) -> bool {
        let mut hasher = self.hasher.clone();
        hasher.update(content.as_bytes());
        tags_match(&truncated(&hasher), &self.tag)
    }
}

/// What a received chunk's bytes must match before they count: the xxh3 its header carries and,
/// on a sealed connection, its tag.
///
/// ```
/// use transfer::seal::ChunkCheck;
/// use transfer::wire::chunk_checksum;
///
/// let check = ChunkCheck { checksum: chunk_checksum(b"data"), seal: None };
/// assert!(check.matches(b"data") && !check.matches(b"dada"));
/// ```
#[derive(Debug, Clone)]
pub struct ChunkCheck {
    /// xxh3-64 of the bytes, from the chunk's header.
    pub checksum: u64,
    /// The chunk's tag, on a sealed connection.
    pub seal: Option<ChunkSeal>,
}

impl ChunkCheck {
    /// Whether `bytes` are the chunk that was sent.
    pub fn matches(&self, bytes: &[u8]) -> bool {
        crate::wire::chunk_checksum(bytes) == self.checksum
            && self
                .seal
                .as_ref()
                .is_none_or(|seal| seal.matches(&blake3::hash(bytes)))
    }
}

/// Where frames are written ([`crate::wire::write_message`], [`crate::wire::write_chunk`]): each
/// frame goes out whole, followed by its tag when the writer seals.
///
/// ```
/// use transfer::seal::FrameWrite;
///
/// let mut plain = Vec::new();
/// assert!(!plain.seals());
/// plain.write_frame(&[b"covered"], &[b"on the wire"]).unwrap();
/// assert_eq!(plain, b"on the wire");
/// ```
pub trait FrameWrite: Write {
    /// Whether frames written here end with a tag.
    fn seals(&self) -> bool {
        false
    }

    /// The tag of the next frame, covering `covered`, when this writer seals (each call is one
    /// frame); `None` when it does not.
    fn next_tag(&mut self, _covered: &[&[u8]]) -> Option<[u8; TAG_LEN]> {
        None
    }

    /// Seals every frame from now on with `key`; a writer that cannot hold a key refuses.
    fn seal_with(&mut self, _key: FrameKey) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this writer cannot seal frames",
        ))
    }

    /// Writes one frame, `wire` and then its tag over `covered`, as one piece: a writer shared
    /// by threads takes its lock once for both, so that no frame comes between a tag's number
    /// and its frame.
    fn write_frame(&mut self, covered: &[&[u8]], wire: &[&[u8]]) -> io::Result<()> {
        let tag = self.next_tag(covered);
        let mut slices: Vec<IoSlice<'_>> = wire.iter().map(|part| IoSlice::new(part)).collect();
        if let Some(tag) = &tag {
            slices.push(IoSlice::new(tag));
        }
        write_all_vectored(self, &mut slices)
    }
}

/// Writes every slice, however the writer splits them.
fn write_all_vectored<W: Write + ?Sized>(
    w: &mut W,
    mut slices: &mut [IoSlice<'_>],
) -> io::Result<()> {
    while !slices.is_empty() {
        match w.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A connection's writer of frames, which seals them once its handshake gave it a key.
///
/// ```
/// use transfer::seal::{FrameWrite, FrameWriter};
///
/// let mut writer = FrameWriter::new(Vec::new());
/// transfer::wire::write_message(&mut writer, &transfer::wire::Message::Finish).unwrap();
/// assert!(!writer.seals(), "until its handshake is done");
/// # assert!(!writer.get_ref().is_empty());
/// ```
#[derive(Debug)]
pub struct FrameWriter<W> {
    inner: W,
    key: Option<FrameKey>,
}

impl<W> FrameWriter<W> {
    /// Frames go to `inner`, unsealed until [`FrameWrite::seal_with`].
    pub fn new(inner: W) -> Self {
        FrameWriter { inner, key: None }
    }

    /// What the frames go to.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// What the frames go to, to set its timeouts or finish it (never to write frames past
    /// the sealing).
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }
}

impl<W: Write> Write for FrameWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.inner.write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write> FrameWrite for FrameWriter<W> {
    fn seals(&self) -> bool {
        self.key.is_some()
    }

    fn next_tag(&mut self, covered: &[&[u8]]) -> Option<[u8; TAG_LEN]> {
        Some(self.key.as_mut()?.tag(covered))
    }

    fn seal_with(&mut self, key: FrameKey) -> io::Result<()> {
        self.key = Some(key);
        Ok(())
    }
}

impl<W: FrameWrite + ?Sized> FrameWrite for &mut W {
    fn seals(&self) -> bool {
        (**self).seals()
    }

    fn next_tag(&mut self, covered: &[&[u8]]) -> Option<[u8; TAG_LEN]> {
        (**self).next_tag(covered)
    }

    fn seal_with(&mut self, key: FrameKey) -> io::Result<()> {
        (**self).seal_with(key)
    }

    fn write_frame(&mut self, covered: &[&[u8]], wire: &[&[u8]]) -> io::Result<()> {
        (**self).write_frame(covered, wire)
    }
}

/// Frames buffered in order: their tags are numbered in the order they are buffered.
impl<W: FrameWrite> FrameWrite for BufWriter<W> {
    fn seals(&self) -> bool {
        self.get_ref().seals()
    }

    fn next_tag(&mut self, covered: &[&[u8]]) -> Option<[u8; TAG_LEN]> {
        self.get_mut().next_tag(covered)
    }

    fn seal_with(&mut self, key: FrameKey) -> io::Result<()> {
        self.get_mut().seal_with(key)
    }
}

/// Plain writers, which never seal: test buffers, and sockets written by peers in tests.
impl FrameWrite for Vec<u8> {}
impl FrameWrite for std::net::TcpStream {}
impl FrameWrite for std::os::unix::net::UnixStream {}
impl FrameWrite for crate::link::LinkWriter {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{
        chunk_checksum, write_chunk, write_message, ChunkHeader, FrameReader, Head, Message,
        WireError,
    };

    fn pair() -> (FrameWriter<Vec<u8>>, FrameKey) {
        let mut writer = FrameWriter::new(Vec::new());
        writer.seal_with(FrameKey::new([5; 32])).unwrap();
        (writer, FrameKey::new([5; 32]))
    }

    /// Sealed messages and chunks read back under the same key; under another key, or one
    /// frame later (a frame dropped or replayed), nothing does.
    #[test]
    fn sealed_frames_open_only_with_their_key_in_their_order() {
        let (mut writer, key) = pair();
        let data = b"the bytes of a chunk".to_vec();
        let header = ChunkHeader {
            file: 1,
            offset: 0,
            checksum: chunk_checksum(&data),
        };
        write_message(&mut writer, &Message::Working).unwrap();
        write_chunk(&mut writer, &header, &data, None).unwrap();
        write_message(
            &mut writer,
            &Message::Done {
                removed: Default::default(),
            },
        )
        .unwrap();
        let bytes = writer.get_ref().clone();

        let mut reader = FrameReader::new(&bytes[..], 1 << 20);
        reader.open_sealed(key.clone());
        assert_eq!(reader.read_message().unwrap(), Message::Working);
        let Head::Chunk(got, len) = reader.read_head().unwrap() else {
            panic!()
        };
        assert_eq!((got, len), (header, data.len()));
        let (payload, seal) = reader.read_payload().unwrap();
        assert_eq!(payload, &data[..]);
        let seal = seal.unwrap();
        assert!(seal.matches(&blake3::hash(&data)));
        assert!(!seal.matches(&blake3::hash(b"other bytes")));
        assert_eq!(
            reader.read_message().unwrap(),
            Message::Done {
                removed: Default::default()
            }
        );

        let mut other = FrameReader::new(&bytes[..], 1 << 20);
        other.open_sealed(FrameKey::new([6; 32]));
        assert!(matches!(
            other.read_message(),
            Err(WireError::Unauthentic(_))
        ));

        let mut skipped = FrameKey::new([5; 32]);
        skipped.tag(&[b"a frame that never came"]);
        let mut later = FrameReader::new(&bytes[..], 1 << 20);
        later.open_sealed(skipped);
        assert!(matches!(
            later.read_message(),
            Err(WireError::Unauthentic(_))
        ));
    }

    /// A byte changed anywhere in a sealed message is caught, by its check or by its tag, and a
    /// message whose check was made again to match still fails its tag.
    #[test]
    fn a_rewritten_message_fails_its_tag() {
        let (mut writer, key) = pair();
        let seal = Message::Seal {
            file: 3,
            blake3: Some([7; 32]),
        };
        write_message(&mut writer, &seal).unwrap();
        let bytes = writer.get_ref().clone();
        for i in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x10;
            let mut reader = FrameReader::new(&damaged[..], 0);
            reader.open_sealed(key.clone());
            assert!(reader.read_message().is_err(), "byte {i}");
        }
        // An attacker's own message with a valid check, in place of the sender's.
        let mut forged = Vec::new();
        let other = Message::Seal {
            file: 3,
            blake3: Some([8; 32]),
        };
        write_message(&mut forged, &other).unwrap();
        let len = u32::from_le_bytes(forged[..4].try_into().unwrap()) + TAG_LEN as u32;
        forged[..4].copy_from_slice(&len.to_le_bytes());
        let checked = forged.len() - 8;
        let check = chunk_checksum(&forged[..checked]);
        forged[checked..].copy_from_slice(&check.to_le_bytes());
        forged.extend_from_slice(&[0; TAG_LEN]);
        let mut reader = FrameReader::new(&forged[..], 0);
        reader.open_sealed(key);
        assert!(matches!(
            reader.read_message(),
            Err(WireError::Unauthentic(_))
        ));
    }

    #[test]
    fn tags_compare_whole() {
        let tag = [3u8; TAG_LEN];
        assert!(tags_match(&tag, &[3u8; TAG_LEN]));
        let mut other = tag;
        other[TAG_LEN - 1] = 4;
        assert!(!tags_match(&tag, &other));
        assert!(!tags_match(&tag, &tag[..8]));
    }
}
