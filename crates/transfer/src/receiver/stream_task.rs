//! A TCP data stream served as a task of the receiver's runtime instead of a thread of its own,
//! so that the receiver's threads do not grow with its streams: the runtime runs one worker per
//! core. A chunk is copied from the socket into its window of the part file and recorded on the
//! worker; a write from memory, which may wait for another stream's copy of the same bytes,
//! moves its worker aside for a moment ([`tokio::task::block_in_place`]), within a bound of
//! [`FILE_THREADS`] threads.
//!
//! The stream's connection thread does its key handshake and sends `Welcome`, then hands the
//! socket over ([`StreamTask::start`]), with what it had read past the handshake and its frames'
//! seal. The task follows the same rules as a stream's thread ([`super::data`]): it reads each
//! frame's head through [`FrameDecoder`], receives a chunk's payload straight into its file
//! where it can (a sink's is hashed as it arrives and never held), and holds its replies back
//! until it would wait for the peer. Reads wait for a batch of bytes as a thread's do
//! (`SO_RCVLOWAT`, [`RECV_BATCH_WAIT`]), and the session's idle clock ends a stream that
//! nothing arrives on.
//!
//! Over TLS the task drives the connection's rustls state itself (ciphertext in, plaintext
//! out; replies into records). QUIC's data streams still run on threads of their own.

use std::hash::Hasher as _;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use socket2::SockRef;
use tokio::io::Interest;
use tokio::net::TcpStream as AsyncTcp;
use tokio::task::block_in_place;
use tokio::time::{timeout, timeout_at, Instant};

use super::data::{self, ChunkError, End, Next, Step};
use super::reader::{self, CONTROL_POLL};
use super::{ConnFrames, Session, LINGER, REPLY_BUFFER};
use crate::direct_io::AlignedBuffer;
use crate::link::{LinkReader, LinkWriter};
use crate::seal::{ChunkCheck, ChunkSeal, FrameWriter, TAG_LEN};
use crate::telemetry;
use crate::wire::{self, ChunkHeader, FrameDecoder, Head, WireError};

/// The most a read waits to accumulate before it wakes (`SO_RCVLOWAT`).
const RECV_LOWAT_MAX: usize = 512 << 10;
/// The longest a read waits for its batch before it takes what has arrived. The kernel wakes a
/// reader only at the low-water mark; when the window closes below the mark, nothing more
/// arrives, and this bound turns what would be a deadlock into a short pause.
const RECV_BATCH_WAIT: Duration = Duration::from_millis(5);
/// The most threads the runtime's workers hand their work to while a write waits.
const FILE_THREADS: usize = 16;
/// Bytes read ahead of the frame being decoded: heads, and what arrived with them.
const INBOX: usize = 64 << 10;
/// The most bytes that pass a worker at once on their way to a sink ([`Into::Passing`]): the
/// larger the read, the fewer the window updates the kernel sends and handles for it.
const SCRATCH_LEN: usize = 1 << 20;
/// The longest message a data stream may send (it sends only `EndOfStream`): its frame fits
/// the inbox with room to spare.
const MAX_STREAM_MESSAGE: usize = 4 << 10;

/// The runtime that serves the receiver's TCP data streams: a worker per core, and at most
/// [`FILE_THREADS`] more while writes wait.
pub(super) fn runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .thread_name("xfer-streams")
        .max_blocking_threads(FILE_THREADS)
        .enable_io()
        .enable_time()
        .build()
}

/// One data stream, from its `Welcome` on.
pub(super) struct StreamTask {
    session: Arc<Session>,
    peer: SocketAddr,
    socket: TcpStream,
    /// Plaintext the connection's thread had read past the handshake.
    read_ahead: Vec<u8>,
    decoder: FrameDecoder,
    replies: FrameWriter<Vec<u8>>,
    tls: Option<Tls>,
    idle_limit: Duration,
    /// Counts the stream open until the task ends, however it ends.
    open: OpenStream,
}

/// A stream counted in its session and in telemetry, until it drops.
pub(super) struct OpenStream {
    session: Arc<Session>,
    _telemetry: telemetry::Open,
}

impl OpenStream {
    /// Counts a stream of `session` that was admitted (its count taken already).
    pub(super) fn new(session: Arc<Session>) -> OpenStream {
        OpenStream {
            session,
            _telemetry: telemetry::Open::receiver_stream(),
        }
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.session.streams.fetch_sub(1, Ordering::AcqRel);
    }
}

impl StreamTask {
    /// Takes over a TCP data stream of `session` from its thread once `Welcome` went out: its
    /// socket, what its reader read past the handshake, its frames' seal and, over TLS, the
    /// connection's TLS state. On failure the socket is shut down.
    pub(super) fn take_over(
        session: Arc<Session>,
        peer: SocketAddr,
        socket: TcpStream,
        reader: ConnFrames,
        writer: FrameWriter<LinkWriter>,
        idle_limit: Duration,
        open: OpenStream,
    ) -> io::Result<StreamTask> {
        // The writing half goes first: over TLS it shares the connection with the reader.
        let replies = writer.redirect(Vec::new());
        let (buffered, mut decoder) = reader.into_parts();
        let read_ahead = buffered.buffer().to_vec();
        let tls = match buffered.into_inner() {
            LinkReader::Plain(_) => None,
            LinkReader::Tls(reader) => match reader.into_connection() {
                Ok((conn, ciphertext)) => Some(Tls {
                    conn,
                    ciphertext: Inbox::holding(&ciphertext),
                    records: Vec::new(),
                }),
                Err(e) => {
                    let _ = socket.shutdown(Shutdown::Both);
                    return Err(e);
                }
            },
        };
        decoder.set_message_limit(MAX_STREAM_MESSAGE);
        Ok(StreamTask {
            session,
            peer,
            socket,
            read_ahead,
            decoder,
            replies,
            tls,
            idle_limit,
            open,
        })
    }

    /// Serves the stream on `runtime` until it ends; the calling thread goes on at once.
    pub(super) fn start(self, runtime: &tokio::runtime::Handle) {
        runtime.spawn(self.serve());
    }

    async fn serve(self) {
        let StreamTask {
            session,
            peer,
            socket,
            read_ahead,
            decoder,
            replies,
            tls,
            idle_limit,
            open,
        } = self;
        let conn = match socket
            .set_nonblocking(true)
            .and_then(|()| AsyncTcp::from_std(socket))
        {
            Ok(socket) => Conn {
                link: Link {
                    socket,
                    tls,
                    lowat: 1,
                    session: session.clone(),
                    idle_limit,
                },
                inbox: Inbox::holding(&read_ahead),
                decoder,
            },
            Err(e) => {
                super::stream_ended(&session, peer, End::Closed(e.to_string()));
                return;
            }
        };
        let mut stream = Receiving {
            conn,
            replies,
            memory: Vec::new(),
            aligned: AlignedBuffer::default(),
        };
        let end = stream.receive_chunks().await;
        drop(open);
        let failed = super::stream_ended(&session, peer, end);
        stream.conn.close(failed).await;
    }
}

/// A TLS connection's state as its task drives it: rustls's, the ciphertext read and not yet
/// taken, and the records made and not yet sent.
struct Tls {
    conn: rustls::Connection,
    ciphertext: Inbox,
    records: Vec<u8>,
}

/// A stream's connection as its task reads it: frames from the bytes of its link.
struct Conn {
    link: Link,
    inbox: Inbox,
    decoder: FrameDecoder,
}

/// The bytes of a stream's socket, in plaintext.
struct Link {
    socket: AsyncTcp,
    tls: Option<Tls>,
    /// The low-water mark set on the socket.
    lowat: usize,
    session: Arc<Session>,
    idle_limit: Duration,
}

/// A stream being served, and the memory it receives chunks into when they go neither straight
/// into their file nor to a sink.
struct Receiving {
    conn: Conn,
    replies: FrameWriter<Vec<u8>>,
    memory: Vec<u8>,
    aligned: AlignedBuffer,
}

impl Receiving {
    /// Verifies, writes and acknowledges chunks until the stream ends, as the data stream's
    /// rules say ([`data`]); how it ended. Replies go out before the stream waits for more.
    async fn receive_chunks(&mut self) -> End {
        loop {
            let head = self.next_head().await;
            // Read after the head arrived: the session may have failed while this stream waited.
            let failure = self
                .conn
                .link
                .session
                .failure
                .lock()
                .expect("failure lock")
                .clone();
            let step = match data::on_head(head, failure) {
                Next::Receive(header, len) => {
                    let stored = self.receive_chunk(&header, len).await;
                    if let Ok(true) = stored {
                        super::count_stored(&self.conn.link.session, len);
                    }
                    data::on_stored(&header, len, stored)
                }
                Next::Then(step) => step,
            };
            match step {
                Step::Answer(answer) => {
                    if let Err(e) = wire::write_message(&mut self.replies, &answer) {
                        return End::Closed(e.to_string());
                    }
                    if self.replies.get_ref().len() >= REPLY_BUFFER {
                        if let Err(e) = self.flush().await {
                            return End::Closed(e.to_string());
                        }
                    }
                }
                Step::End(end, answer) => {
                    if let End::Failed(reason) = &end {
                        self.conn.link.session.fail(reason);
                    }
                    let answered = match answer {
                        Some(answer) => wire::write_message(&mut self.replies, &answer),
                        None => Ok(()),
                    };
                    let flushed = match answered {
                        Ok(()) => self.flush().await.map_err(WireError::Io),
                        Err(e) => Err(e),
                    };
                    return match (end, flushed) {
                        (End::Finished, Err(e)) => End::Closed(e.to_string()),
                        (end, _) => end,
                    };
                }
            }
        }
    }

    /// The next frame's head, once all of it arrived; the replies held back go out before the
    /// stream waits for it.
    async fn next_head(&mut self) -> Result<Head, WireError> {
        // Before the stream may wait for the peer, which may be waiting for these replies.
        if !self.conn.inbox.holds_a_frame() {
            self.flush().await?;
        }
        loop {
            let conn = &mut self.conn;
            let need = conn.decoder.head_len(conn.inbox.filled())?;
            if conn.inbox.filled().len() >= need {
                let head = conn.decoder.decode_head(&conn.inbox.filled()[..need]);
                conn.inbox.consume(need);
                return head;
            }
            self.conn.fill(need, 0).await?;
        }
    }

    /// Receives a chunk's payload and tag: straight into its part file when the destination
    /// maps it, hashed as it passes for a sink, else into memory; checks it and, when it
    /// matches, writes and journals it. Returns whether it matched.
    async fn receive_chunk(
        &mut self,
        header: &ChunkHeader,
        len: usize,
    ) -> Result<bool, ChunkError> {
        let session = self.conn.link.session.clone();
        let dest = &session.dest;
        let check = |seal| ChunkCheck {
            checksum: header.checksum,
            seal,
        };
        if let Some(sink) = dest.sink() {
            let (checksum, content, seal) = self.conn.payload_hashed(len).await?;
            if checksum != header.checksum || seal.is_some_and(|seal| !seal.matches(&content)) {
                return Ok(false);
            }
            sink.write(header.file, header.offset, len as u64)
                .map_err(ChunkError::Destination)?;
            return Ok(true);
        }
        // Mapping a window and, below, recording the chunk verified are short calls that wait
        // for no other stream: they run on the worker, as the copy into the window does.
        let mapped =
            (dest.map_chunk(header.file, header.offset, len)).map_err(ChunkError::Destination)?;
        if let Some(mut chunk) = mapped {
            let seal = self.conn.payload_into(chunk.bytes()).await?;
            return (chunk.commit(&check(seal))).map_err(ChunkError::Destination);
        }
        // Memory that cannot be had for direct I/O leaves the chunk to be written through the
        // page cache.
        let direct = if dest.writes_direct() {
            self.aligned.get(len).ok()
        } else {
            None
        };
        let buf = match direct {
            Some(buf) => buf,
            None => {
                self.memory.resize(len, 0);
                &mut self.memory[..]
            }
        };
        let seal = self.conn.payload_into(buf).await?;
        if !check(seal).matches(buf) {
            return Ok(false);
        }
        // A write from memory may wait for another stream's copy of the same bytes.
        block_in_place(|| dest.write(header.file, header.offset, buf, header.checksum))
            .map_err(ChunkError::Destination)?;
        Ok(true)
    }

    /// Sends the replies held back (over TLS, as records).
    async fn flush(&mut self) -> io::Result<()> {
        let out = self.replies.get_mut();
        let link = &mut self.conn.link;
        match &mut link.tls {
            None => send(&link.socket, out, link.idle_limit).await?,
            Some(tls) => {
                let mut rest = &out[..];
                while !rest.is_empty() || tls.conn.wants_write() {
                    let n = tls.conn.writer().write(rest)?;
                    rest = &rest[n..];
                    while tls.conn.wants_write() {
                        tls.conn.write_tls(&mut tls.records)?;
                    }
                }
                send(&link.socket, &mut tls.records, link.idle_limit).await?;
            }
        }
        out.clear();
        Ok(())
    }
}

/// Sends `out` and empties it, waiting while the peer's window is full (at most `idle_limit`:
/// a peer that stops reading its answers does not hold the stream for ever).
async fn send(socket: &AsyncTcp, out: &mut Vec<u8>, idle_limit: Duration) -> io::Result<()> {
    let mut sent = 0;
    while sent < out.len() {
        timeout(idle_limit, socket.writable()).await.map_err(|_| {
            io::Error::new(
                ErrorKind::TimedOut,
                format!("the peer read none of its answers for {idle_limit:.0?}"),
            )
        })??;
        match socket.try_write(&out[sent..]) {
            Ok(n) => sent += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(e) => return Err(e),
        }
    }
    out.clear();
    Ok(())
}

impl Conn {
    /// Reads until the inbox holds at least `need` bytes, waking for a batch of at least
    /// `batch` bytes (more than the inbox holds: the bytes wait in the socket); the end of the
    /// connection before them is an error.
    async fn fill(&mut self, need: usize, batch: usize) -> io::Result<()> {
        while self.inbox.filled().len() < need {
            let want = batch.max(need - self.inbox.filled().len());
            let n = self
                .link
                .read(&mut Into::Buf(self.inbox.room()), want)
                .await?;
            if n == 0 {
                return Err(io::Error::new(
                    ErrorKind::UnexpectedEof,
                    "the peer closed the connection",
                ));
            }
            self.inbox.filled_by(n);
        }
        Ok(())
    }

    /// Receives the payload of the chunk whose head was decoded into `dest` (what the inbox
    /// holds is copied, the rest read straight into `dest`), then its tag.
    async fn payload_into(&mut self, dest: &mut [u8]) -> Result<Option<ChunkSeal>, ChunkError> {
        self.decoder.payload_arrived(dest.len());
        let held = self.inbox.filled();
        let mut filled = held.len().min(dest.len());
        dest[..filled].copy_from_slice(&held[..filled]);
        self.inbox.consume(filled);
        while filled < dest.len() {
            let rest = &mut dest[filled..];
            let want = rest.len();
            let n = (self.link.read(&mut Into::Buf(rest), want).await)
                .map_err(|e| ChunkError::Wire(e.into()))?;
            if n == 0 {
                return Err(ChunkError::Wire(closed()));
            }
            filled += n;
        }
        self.chunk_tag().await
    }

    /// Receives the payload of the chunk whose head was decoded through the inbox, hashing it
    /// as it passes: its checksum, its BLAKE3 hash when the stream is sealed (the zero hash
    /// when not), and its tag.
    async fn payload_hashed(
        &mut self,
        len: usize,
    ) -> Result<(u64, blake3::Hash, Option<ChunkSeal>), ChunkError> {
        self.decoder.payload_arrived(len);
        let mut checksum = twox_hash::XxHash3_64::new();
        let mut content = (self.decoder.chunk_tag_len() > 0).then(blake3::Hasher::new);
        let mut hash = |bytes: &[u8]| {
            checksum.write(bytes);
            if let Some(content) = &mut content {
                content.update(bytes);
            }
        };
        let held = self.inbox.filled();
        let mut left = len - held.len().min(len);
        hash(&held[..len - left]);
        self.inbox.consume(len - left);
        while left > 0 {
            let batch = left + self.decoder.chunk_tag_len();
            let n = (self
                .link
                .read(&mut Into::Passing(left, &mut hash), batch)
                .await)
                .map_err(|e| ChunkError::Wire(e.into()))?;
            if n == 0 {
                return Err(ChunkError::Wire(closed()));
            }
            left -= n;
        }
        let content = content.map_or(blake3::Hash::from_bytes([0; 32]), |c| c.finalize());
        let seal = self.chunk_tag().await?;
        Ok((checksum.finish(), content, seal))
    }

    /// After a chunk's payload: on a sealed connection, its tag, for the chunk's reader to check
    /// once it has hashed the payload.
    async fn chunk_tag(&mut self) -> Result<Option<ChunkSeal>, ChunkError> {
        let len = self.decoder.chunk_tag_len();
        self.fill(len, 0)
            .await
            .map_err(|e| ChunkError::Wire(e.into()))?;
        let mut tag = [0u8; TAG_LEN];
        tag[..len].copy_from_slice(&self.inbox.filled()[..len]);
        self.inbox.consume(len);
        Ok(self.decoder.chunk_end(&tag[..len]))
    }

    /// Closes the connection once the peer has had the chance to read the last reply: after an
    /// error reply (`failed`) it may still be sending, so what it sends is read and discarded
    /// for at most [`LINGER`], and it reads the error instead of losing it to a reset.
    async fn close(&mut self, failed: bool) {
        let socket = SockRef::from(&self.link.socket);
        if failed && socket.shutdown(Shutdown::Write).is_ok() {
            let deadline = Instant::now() + LINGER;
            let mut sink = [0u8; 16 << 10];
            while let Ok(Ok(())) = timeout_at(deadline, self.link.socket.readable()).await {
                match self.link.socket.try_read(&mut sink) {
                    Ok(0) => break,
                    Err(e) if e.kind() != ErrorKind::WouldBlock => break,
                    Ok(_) | Err(_) => {}
                }
            }
        }
        let _ = socket.shutdown(Shutdown::Both);
    }
}

/// The error of a connection that ended inside a frame.
fn closed() -> WireError {
    WireError::Io(io::Error::new(
        ErrorKind::UnexpectedEof,
        "the peer closed the connection",
    ))
}

/// Where a read puts its bytes: a buffer of the caller's, or, for bytes that are only looked at
/// as they pass (at most the number given), the worker thread's scratch memory: a stream that
/// hashes a chunk holds no memory of its own for it.
enum Into<'a> {
    Buf(&'a mut [u8]),
    Passing(usize, &'a mut (dyn FnMut(&[u8]) + Send)),
}

thread_local! {
    /// Each worker's memory for bytes that pass ([`Into::Passing`]).
    static SCRATCH: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0u8; SCRATCH_LEN].into_boxed_slice());
}

impl Into<'_> {
    /// Has `read` put bytes where they go; how many.
    fn take(&mut self, read: impl FnOnce(&mut [u8]) -> io::Result<usize>) -> io::Result<usize> {
        match self {
            Into::Buf(buf) => read(buf),
            Into::Passing(most, consume) => SCRATCH.with_borrow_mut(|scratch| {
                let n = read(&mut scratch[..SCRATCH_LEN.min(*most)])?;
                consume(&scratch[..n]);
                Ok(n)
            }),
        }
    }
}

impl Link {
    /// Reads plaintext into `into` once `want` bytes arrived or [`RECV_BATCH_WAIT`] passed with
    /// fewer ([`read_socket`]); 0 at the end of the connection.
    async fn read(&mut self, into: &mut Into<'_>, want: usize) -> io::Result<usize> {
        let Link {
            socket,
            tls,
            lowat,
            session,
            idle_limit,
        } = self;
        let Some(tls) = tls else {
            return read_socket(socket, lowat, session, *idle_limit, into, want).await;
        };
        loop {
            match into.take(|buf| tls.conn.reader().read(buf)) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if !tls.ciphertext.filled().is_empty() {
                let taken = tls.conn.read_tls(&mut tls.ciphertext.filled())?;
                tls.ciphertext.consume(taken);
                tls.conn
                    .process_new_packets()
                    .map_err(crate::tls::tls_error)?;
                if taken == 0 {
                    return Err(io::Error::other("TLS: rustls takes no more ciphertext"));
                }
                continue;
            }
            let room = &mut Into::Buf(tls.ciphertext.room());
            let n = read_socket(socket, lowat, session, *idle_limit, room, want).await?;
            if n == 0 {
                // The peer closed without close_notify: an end of stream like TCP's; the
                // protocol's own messages say whether it came at a clean point.
                return Ok(0);
            }
            tls.ciphertext.filled_by(n);
        }
    }
}

/// Reads from `socket` into `into`, waking once `want` bytes (at most [`RECV_LOWAT_MAX`])
/// arrived or [`RECV_BATCH_WAIT`] passed with fewer; fails once the session was idle for
/// `idle_limit`. 0 at the end of the connection.
async fn read_socket(
    socket: &AsyncTcp,
    lowat: &mut usize,
    session: &Session,
    idle_limit: Duration,
    into: &mut Into<'_>,
    want: usize,
) -> io::Result<usize> {
    *lowat = set_lowat(socket, *lowat, want.clamp(1, RECV_LOWAT_MAX));
    // Read past tokio's readiness, which a wait that ended early has not seen.
    let read_now = |buf: &mut [u8]| (&*SockRef::from(socket)).read(buf);
    loop {
        // Waiting for a batch, a short wait takes what arrived; waiting for the first byte, the
        // wait is long enough to cost nothing and short enough to look at the idle clock.
        let wait = if *lowat > 1 {
            RECV_BATCH_WAIT
        } else {
            CONTROL_POLL
        };
        let read = match timeout(wait, socket.readable()).await {
            Ok(ready) => {
                ready?;
                match socket.try_io(Interest::READABLE, || into.take(read_now)) {
                    Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                    read => read,
                }
            }
            // Fewer bytes than the mark arrived, or none: read what there is.
            Err(_elapsed) => into.take(read_now),
        };
        match read {
            Ok(n) => {
                session.activity.touch();
                return Ok(n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                // Nothing at all arrived: wait for the first byte, not for a batch.
                *lowat = set_lowat(socket, *lowat, 1);
                if session
                    .activity
                    .idle_for()
                    .is_some_and(|idle| idle >= idle_limit)
                {
                    return Err(reader::idle(idle_limit));
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Asks the kernel to wake a reader of `socket` only once `want` bytes have arrived
/// (`SO_RCVLOWAT`), unless `was` is what it asks already; the mark now set.
fn set_lowat(socket: &impl std::os::fd::AsRawFd, was: usize, want: usize) -> usize {
    if want == was {
        return was;
    }
    let rc = crate::sys::sockopt::set(
        socket,
        libc::SOL_SOCKET,
        libc::SO_RCVLOWAT,
        want as libc::c_int,
    );
    // Best effort: if the kernel refuses, reads simply wake more often.
    if rc.is_ok() {
        want
    } else {
        1
    }
}

/// Bytes read from the connection and not yet decoded.
struct Inbox {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Inbox {
    /// An inbox that holds `read_ahead` already.
    fn holding(read_ahead: &[u8]) -> Inbox {
        let mut buf = vec![0u8; INBOX.max(read_ahead.len())].into_boxed_slice();
        buf[..read_ahead.len()].copy_from_slice(read_ahead);
        Inbox {
            buf,
            start: 0,
            end: read_ahead.len(),
        }
    }

    fn filled(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Whether the whole next frame is held, so that handling it will not wait for the peer.
    fn holds_a_frame(&self) -> bool {
        let held = self.filled();
        held.first_chunk::<4>()
            .is_some_and(|len| (held.len() - 4) as u64 >= u64::from(u32::from_le_bytes(*len)))
    }

    fn consume(&mut self, n: usize) {
        assert!(n <= self.end - self.start, "consumed more than held");
        self.start += n;
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
    }

    /// Room to read into after what is held (moved to the front when it would not fit a head).
    fn room(&mut self) -> &mut [u8] {
        if self.buf.len() - self.end < MAX_STREAM_MESSAGE * 2 && self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        &mut self.buf[self.end..]
    }

    fn filled_by(&mut self, n: usize) {
        self.end += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inbox_gives_its_bytes_in_order_and_makes_room_at_the_front() {
        let mut inbox = Inbox::holding(b"abc");
        assert_eq!(inbox.filled(), b"abc");
        inbox.consume(2);
        assert_eq!(
            inbox.room().len(),
            INBOX - 3,
            "what is held stays where it is while there is room after it"
        );
        let fill = INBOX - 3 - 100;
        for (i, byte) in inbox.room()[..fill].iter_mut().enumerate() {
            *byte = i as u8;
        }
        inbox.filled_by(fill);
        inbox.consume(fill + 1 - 10);
        let held = inbox.filled().to_vec();
        assert_eq!(held.len(), 10);
        assert_eq!(inbox.room().len(), INBOX - 10, "moved to the front");
        assert_eq!(inbox.filled(), held);
        inbox.consume(10);
        assert_eq!(inbox.room().len(), INBOX);
    }
}
