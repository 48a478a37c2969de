//! A connection's bytes as a task reads and writes them: frames decoded from what arrives
//! ([`FrameDecoder`]), chunks' payloads straight into where they belong or hashed as they pass
//! through the worker's own memory, and replies held back until the task would wait for the
//! peer. The receiver serves every connection this way from its first byte, key handshake
//! included, and the sender reads its QUIC streams' answers this way.
//!
//! Under a connection is its link ([`Wire`]): a TCP socket, plain or TLS, whose rustls state
//! the task drives itself (the TLS handshake, then ciphertext in, plaintext out; replies into
//! records), or a QUIC stream, which quinn drives on the same runtime. A TCP read waits for a batch of bytes
//! (`SO_RCVLOWAT` up to [`RECV_LOWAT_MAX`], or [`RECV_BATCH_WAIT`] with fewer). Every read
//! runs against an idle clock ([`Activity`], the session's once there is one), which ends a
//! connection that nothing arrives on.

use std::collections::VecDeque;
use std::hash::Hasher as _;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf as _, Bytes};
use socket2::SockRef;
use tokio::io::Interest;
use tokio::net::TcpStream as AsyncTcp;
use tokio::time::{timeout, timeout_at, Instant};

use crate::auth::ChannelBinding;
use crate::idle::{self, Activity, CONTROL_POLL};
use crate::quic::{QuicConnection, QuicStream};
use crate::seal::{ChunkSeal, FrameKey, FrameWriter};
use crate::tls::{self, EXPORTER_LABEL};
use crate::wire::{self, FrameDecoder, Head, Message, WireError};

/// The most a read waits to accumulate before it wakes (`SO_RCVLOWAT`).
const RECV_LOWAT_MAX: usize = 512 << 10;
/// The longest a read waits for its batch before it takes what has arrived. The kernel wakes a
/// reader only at the low-water mark; when the window closes below the mark, nothing more
/// arrives, and this bound turns what would be a deadlock into a short pause.
const RECV_BATCH_WAIT: Duration = Duration::from_millis(5);
/// Bytes read ahead of the frame being decoded: heads, and what arrived with them. A longer
/// message (a control connection's manifest batch) grows the inbox to hold it.
const INBOX: usize = 64 << 10;
/// The least room a read is given before what the inbox holds moves to its front.
const MIN_ROOM: usize = 8 << 10;
/// The most bytes that pass a worker at once on their way to a sink ([`Into::Passing`]): the
/// larger the read, the fewer the window updates the kernel sends and handles for it.
const SCRATCH_LEN: usize = 1 << 20;

/// A TLS connection's state as its task drives it: rustls's, the ciphertext read and not yet
/// taken, and the records made and not yet sent.
struct Tls {
    conn: rustls::Connection,
    ciphertext: Inbox,
    records: Vec<u8>,
}

/// A connection as its task reads and writes it: frames from the bytes of its link, and the
/// replies held back.
pub(crate) struct TaskConn {
    link: Link,
    inbox: Inbox,
    decoder: FrameDecoder,
    /// Frames waiting to be sent ([`TaskConn::flush`]).
    pub(crate) replies: FrameWriter<Vec<u8>>,
}

/// The plaintext bytes of a connection, read against an idle clock.
struct Link {
    wire: Wire,
    activity: Arc<Activity>,
    idle_limit: Duration,
}

/// What carries a connection's bytes.
enum Wire {
    /// A TCP (or MPTCP) socket, plain or TLS, with the low-water mark set on it.
    Tcp {
        socket: AsyncTcp,
        /// Boxed: rustls's state is large, and a QUIC link has none.
        tls: Option<Box<Tls>>,
        lowat: usize,
    },
    /// A QUIC connection's stream; its sending half is `None` once taken
    /// ([`TaskConn::take_quic_send`]).
    Quic {
        connection: QuicConnection,
        send: Option<quinn::SendStream>,
        recv: quinn::RecvStream,
        held: Segments,
    },
}

/// The most segments a QUIC stream's read takes from quinn at once.
const SEGMENTS_AT_ONCE: usize = 64;

/// Segments of a QUIC stream that a read took from quinn and the reads have not used up yet.
/// quinn hands them over without a copy, under its connection's lock; they are copied where
/// they go (or hashed) here, outside it, so that a copy into a file's window that faults its
/// pages in never holds up the connection's driver.
#[derive(Default)]
struct Segments(VecDeque<Bytes>);

impl Segments {
    /// Puts what is held into `into`, as much as it takes; how many bytes (0 when none is held).
    fn give(&mut self, into: &mut Into<'_>) -> usize {
        let mut given = 0;
        while let Some(front) = self.0.front_mut() {
            let n = (into.room() - given).min(front.len());
            if n == 0 {
                break;
            }
            into.put(given, &front[..n]);
            given += n;
            front.advance(n);
            if front.is_empty() {
                self.0.pop_front();
            }
        }
        given
    }
}

impl TaskConn {
    /// A TCP connection from its first byte, plain until [`TaskConn::accept_tls`], its chunks
    /// at most `max_chunk` long, read against `activity`'s idle clock with `idle_limit`; in the
    /// runtime (a task calls this).
    pub(crate) fn tcp(
        socket: TcpStream,
        activity: Arc<Activity>,
        idle_limit: Duration,
        max_chunk: usize,
    ) -> io::Result<TaskConn> {
        socket.set_nonblocking(true)?;
        Ok(TaskConn {
            link: Link {
                wire: Wire::Tcp {
                    socket: AsyncTcp::from_std(socket)?,
                    tls: None,
                    lowat: 1,
                },
                activity,
                idle_limit,
            },
            inbox: Inbox::holding(&[]),
            decoder: FrameDecoder::new(max_chunk),
            replies: FrameWriter::new(Vec::new()),
        })
    }

    /// A QUIC connection's `stream` from its first byte, its chunks at most `max_chunk` long,
    /// read against `activity`'s idle clock with `idle_limit`.
    pub(crate) fn quic(
        stream: QuicStream,
        activity: Arc<Activity>,
        idle_limit: Duration,
        max_chunk: usize,
    ) -> TaskConn {
        let QuicStream {
            connection,
            send,
            recv,
            ..
        } = stream;
        TaskConn {
            link: Link {
                wire: Wire::Quic {
                    connection,
                    send: Some(send),
                    recv,
                    held: Segments::default(),
                },
                activity,
                idle_limit,
            },
            inbox: Inbox::holding(&[]),
            decoder: FrameDecoder::new(max_chunk),
            replies: FrameWriter::new(Vec::new()),
        }
    }

    /// Reads against `activity`'s idle clock with `idle_limit` from now on (a session's, once
    /// it exists).
    pub(crate) fn watch(&mut self, activity: Arc<Activity>, idle_limit: Duration) {
        self.link.activity = activity;
        self.link.idle_limit = idle_limit;
    }

    /// Refuses messages longer than `limit` from now on.
    pub(crate) fn set_message_limit(&mut self, limit: usize) {
        self.decoder.set_message_limit(limit);
    }

    /// Seals the frames read (`incoming`) and written (`outgoing`) from now on
    /// ([`crate::seal`]).
    pub(crate) fn seal(&mut self, incoming: FrameKey, outgoing: FrameKey) -> io::Result<()> {
        use crate::seal::FrameWrite as _;
        self.replies.seal_with(outgoing)?;
        self.decoder.open_sealed(incoming);
        Ok(())
    }

    /// A QUIC connection's sending half, for a task that writes frames of its own while this
    /// connection reads; replies can no longer be sent here. `None` over TCP, or once taken.
    pub(crate) fn take_quic_send(&mut self) -> Option<quinn::SendStream> {
        match &mut self.link.wire {
            Wire::Quic { send, .. } => send.take(),
            Wire::Tcp { .. } => None,
        }
    }

    /// Whether a TCP peer opens with a TLS handshake ([`tls::opens_tls`]): waits for its first
    /// two bytes, or for one that cannot start one; the caller bounds the wait.
    pub(crate) async fn starts_tls(&self) -> io::Result<bool> {
        let Wire::Tcp { socket, .. } = &self.link.wire else {
            return Ok(false);
        };
        let mut first = [0u8; 2];
        loop {
            let n = socket.peek(&mut first).await?;
            if let Some(opens) = tls::opens_tls(&first[..n])? {
                return Ok(opens);
            }
            // One byte that may start a record: its second comes soon from any TLS client.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Runs the TLS handshake of `conn` (the receiver's side) over this TCP connection, whose
    /// bytes are TLS from then on; the connection's exporter value, which its key handshake
    /// binds. The caller bounds the wait.
    pub(crate) async fn accept_tls(
        &mut self,
        conn: rustls::Connection,
    ) -> io::Result<ChannelBinding> {
        let Link {
            wire,
            activity,
            idle_limit,
        } = &mut self.link;
        let Wire::Tcp { socket, tls, lowat } = wire else {
            return Err(io::Error::new(ErrorKind::Unsupported, "TLS over QUIC"));
        };
        let mut state = Box::new(Tls {
            conn,
            ciphertext: Inbox::holding(&[]),
            records: Vec::new(),
        });
        loop {
            while state.conn.wants_write() {
                state.conn.write_tls(&mut state.records)?;
            }
            send(socket, &mut state.records, *idle_limit).await?;
            if !state.conn.is_handshaking() {
                break;
            }
            if state.ciphertext.filled().is_empty() {
                let room = &mut Into::Buf(state.ciphertext.room(0));
                let n = read_socket(socket, lowat, activity, *idle_limit, room, 1).await?;
                if n == 0 {
                    return Err(tls::closed_in_handshake());
                }
                state.ciphertext.filled_by(n);
            }
            let taken = state.conn.read_tls(&mut state.ciphertext.filled())?;
            state.ciphertext.consume(taken);
            if let Err(e) = state.conn.process_new_packets() {
                // Tell the peer why, as rustls's alert says, before giving up.
                while state.conn.wants_write() && state.conn.write_tls(&mut state.records).is_ok() {
                }
                let _ = send(socket, &mut state.records, *idle_limit).await;
                return Err(tls::tls_error(e));
            }
        }
        let mut binding = [0u8; 32];
        (state.conn)
            .export_keying_material(&mut binding, EXPORTER_LABEL, None)
            .map_err(tls::tls_error)?;
        *tls = Some(state);
        Ok(ChannelBinding(binding))
    }

    /// The next frame, which must be a message.
    pub(crate) async fn next_message(&mut self) -> Result<Message, WireError> {
        match self.next_head().await? {
            Head::Message(message) => Ok(message),
            Head::Chunk(..) => Err(WireError::Malformed(
                "data chunk where a control message was expected".into(),
            )),
        }
    }

    /// The next frame's head, once all of it arrived; the replies held back go out before the
    /// task waits for it. Cancel-safe: dropped while it waits, it loses no byte.
    pub(crate) async fn next_head(&mut self) -> Result<Head, WireError> {
        // Before the task may wait for the peer, which may be waiting for these replies.
        if !self.inbox.holds_a_frame() {
            self.flush().await?;
        }
        loop {
            let need = self.decoder.head_len(self.inbox.filled())?;
            if self.inbox.filled().len() >= need {
                let head = self.decoder.decode_head(&self.inbox.filled()[..need]);
                self.inbox.consume(need);
                return head;
            }
            self.fill(need, 0).await?;
        }
    }

    /// Sends the replies held back (over TLS, as records). Cut short, it leaves exactly what
    /// is still to be sent ([`send`]).
    pub(crate) async fn flush(&mut self) -> io::Result<()> {
        let out = self.replies.get_mut();
        let idle_limit = self.link.idle_limit;
        match &mut self.link.wire {
            Wire::Tcp {
                socket, tls: None, ..
            } => send(socket, out, idle_limit).await,
            Wire::Tcp {
                socket,
                tls: Some(tls),
                ..
            } => {
                let mut rest = &out[..];
                while !rest.is_empty() || tls.conn.wants_write() {
                    let n = tls.conn.writer().write(rest)?;
                    rest = &rest[n..];
                    while tls.conn.wants_write() {
                        tls.conn.write_tls(&mut tls.records)?;
                    }
                }
                // Encrypted once: from here on only the records are still to be sent.
                out.clear();
                send(socket, &mut tls.records, idle_limit).await
            }
            Wire::Quic { send, .. } => send_quic(send.as_mut(), out, idle_limit).await,
        }
    }

    /// Reads until the inbox holds at least `need` bytes, waking for a batch of at least
    /// `batch` bytes (more than the inbox holds: the bytes wait in the socket); the end of the
    /// connection before them is an error.
    async fn fill(&mut self, need: usize, batch: usize) -> io::Result<()> {
        while self.inbox.filled().len() < need {
            let want = batch.max(need - self.inbox.filled().len());
            let n = self
                .link
                .read(&mut Into::Buf(self.inbox.room(need)), want)
                .await?;
            if n == 0 {
                return Err(wire::peer_closed());
            }
            self.inbox.filled_by(n);
        }
        Ok(())
    }

    /// Receives the payload of the chunk whose head was decoded into `dest` (what the inbox
    /// holds is copied, the rest read straight into `dest`), then its tag.
    pub(crate) async fn payload_into(
        &mut self,
        dest: &mut [u8],
    ) -> Result<Option<ChunkSeal>, WireError> {
        self.decoder.payload_arrived(dest.len());
        let held = self.inbox.filled();
        let mut filled = held.len().min(dest.len());
        dest[..filled].copy_from_slice(&held[..filled]);
        self.inbox.consume(filled);
        while filled < dest.len() {
            let rest = &mut dest[filled..];
            let want = rest.len();
            let n = self.link.read(&mut Into::Buf(rest), want).await?;
            if n == 0 {
                return Err(wire::peer_closed().into());
            }
            filled += n;
        }
        self.chunk_tag().await
    }

    /// Receives the payload of the chunk whose head was decoded through the inbox, hashing it
    /// as it passes: its checksum, its BLAKE3 hash when the stream is sealed (the zero hash
    /// when not), and its tag.
    pub(crate) async fn payload_hashed(
        &mut self,
        len: usize,
    ) -> Result<(u64, blake3::Hash, Option<ChunkSeal>), WireError> {
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
            let n = (self.link)
                .read(&mut Into::Passing(left, &mut hash), batch)
                .await?;
            if n == 0 {
                return Err(wire::peer_closed().into());
            }
            left -= n;
        }
        let content = content.map_or(blake3::Hash::from_bytes([0; 32]), |c| c.finalize());
        let seal = self.chunk_tag().await?;
        Ok((checksum.finish(), content, seal))
    }

    /// After a chunk's payload: on a sealed connection, its tag, for the chunk's reader to check
    /// once it has hashed the payload.
    async fn chunk_tag(&mut self) -> Result<Option<ChunkSeal>, WireError> {
        let len = self.decoder.chunk_tag_len();
        self.fill(len, 0).await?;
        let mut tag = [0u8; crate::seal::TAG_LEN];
        tag[..len].copy_from_slice(&self.inbox.filled()[..len]);
        self.inbox.consume(len);
        Ok(self.decoder.chunk_end(&tag[..len]))
    }

    /// Sends the replies held back and closes the connection once the peer has had the chance
    /// to read the last of them, waiting at most `linger` in all. After an error reply
    /// (`failed`) the peer may still be sending: a TCP connection reads and discards what it
    /// sends meanwhile, so that it reads the error instead of losing it to a reset; a QUIC
    /// stream asks it to stop. A QUIC connection is closed once the peer closed it (it does
    /// once it read the last reply), or `linger` passed.
    pub(crate) async fn close(&mut self, failed: bool, linger: Duration) {
        let deadline = Instant::now() + linger;
        let _ = timeout_at(deadline, self.flush()).await;
        match &mut self.link.wire {
            Wire::Tcp { socket, .. } => {
                let sock = SockRef::from(&*socket);
                if failed && sock.shutdown(Shutdown::Write).is_ok() {
                    let mut sink = [0u8; 16 << 10];
                    while let Ok(Ok(())) = timeout_at(deadline, socket.readable()).await {
                        match socket.try_read(&mut sink) {
                            Ok(0) => break,
                            Err(e) if e.kind() != ErrorKind::WouldBlock => break,
                            Ok(_) | Err(_) => {}
                        }
                    }
                }
                let _ = sock.shutdown(Shutdown::Both);
            }
            Wire::Quic {
                connection,
                send,
                recv,
                ..
            } => {
                if let Some(send) = send {
                    let _ = send.finish();
                }
                if failed {
                    let _ = recv.stop(0u32.into());
                }
                let _ = timeout_at(deadline, connection.closed()).await;
                connection.close();
            }
        }
    }
}

/// Sends `out` and empties it, waiting while the peer's window is full (at most `idle_limit`:
/// a peer that stops reading its answers does not hold the stream for ever).
///
/// What went out is taken off `out` as it goes, so that a send cut short (its future dropped
/// for a heartbeat) leaves exactly what is still to be sent.
async fn send(socket: &AsyncTcp, out: &mut Vec<u8>, idle_limit: Duration) -> io::Result<()> {
    while !out.is_empty() {
        timeout(idle_limit, socket.writable())
            .await
            .map_err(|_| unread(idle_limit))??;
        match socket.try_write(out) {
            Ok(n) => _ = out.drain(..n),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// [`send`] on a QUIC stream: quinn takes what its flow control admits, at once or not at all,
/// so a send cut short leaves exactly what is still to go here too.
async fn send_quic(
    stream: Option<&mut quinn::SendStream>,
    out: &mut Vec<u8>,
    idle_limit: Duration,
) -> io::Result<()> {
    if out.is_empty() {
        return Ok(());
    }
    let stream = stream.ok_or_else(|| {
        io::Error::new(
            ErrorKind::Unsupported,
            "this QUIC stream's sending half was taken",
        )
    })?;
    while !out.is_empty() {
        let n = timeout(idle_limit, stream.write(out))
            .await
            .map_err(|_| unread(idle_limit))??;
        out.drain(..n);
    }
    Ok(())
}

/// The error of a send that waited `idle_limit` for the peer to make room.
fn unread(idle_limit: Duration) -> io::Error {
    io::Error::new(
        ErrorKind::TimedOut,
        format!("the peer read none of its answers for {idle_limit:.0?}"),
    )
}

/// Where a read puts its bytes: a buffer of the caller's, or, for bytes that are only looked at
/// as they pass (at most the number given), nowhere of the stream's own: a TCP read puts them
/// in the worker thread's scratch memory, a QUIC read hands over quinn's segments, so that a
/// stream that hashes a chunk holds no memory of its own for it.
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
    /// How many bytes it takes.
    fn room(&self) -> usize {
        match self {
            Into::Buf(buf) => buf.len(),
            Into::Passing(most, _) => *most,
        }
    }

    /// Puts `bytes` where they go, `at` bytes after those put before them (which only a buffer
    /// keeps).
    fn put(&mut self, at: usize, bytes: &[u8]) {
        match self {
            Into::Buf(buf) => buf[at..at + bytes.len()].copy_from_slice(bytes),
            Into::Passing(_, consume) => consume(bytes),
        }
    }

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
    /// Reads plaintext into `into`: over TCP once `want` bytes arrived or [`RECV_BATCH_WAIT`]
    /// passed with fewer ([`read_socket`]), over QUIC whatever has arrived ([`read_quic`]); 0
    /// at the end of the connection.
    async fn read(&mut self, into: &mut Into<'_>, want: usize) -> io::Result<usize> {
        let Link {
            wire,
            activity,
            idle_limit,
        } = self;
        let (socket, tls, lowat) = match wire {
            Wire::Quic { recv, held, .. } => {
                return read_quic(recv, held, activity, *idle_limit, into).await
            }
            Wire::Tcp { socket, tls, lowat } => (socket, tls, lowat),
        };
        let Some(tls) = tls else {
            return read_socket(socket, lowat, activity, *idle_limit, into, want).await;
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
                tls.conn.process_new_packets().map_err(tls::tls_error)?;
                if taken == 0 {
                    return Err(io::Error::other("TLS: rustls takes no more ciphertext"));
                }
                continue;
            }
            let room = &mut Into::Buf(tls.ciphertext.room(0));
            let n = read_socket(socket, lowat, activity, *idle_limit, room, want).await?;
            if n == 0 {
                // The peer closed without close_notify: an end of stream like TCP's; the
                // protocol's own messages say whether it came at a clean point.
                return Ok(0);
            }
            tls.ciphertext.filled_by(n);
        }
    }
}

/// Reads from a QUIC stream into `into` what has arrived, in order: what `held` holds, else
/// as many segments as quinn has (at most [`SEGMENTS_AT_ONCE`]), kept in `held` until used;
/// fails once the session was idle for `idle_limit`. 0 at the end of the stream. Cancel-safe:
/// quinn hands segments over only in the poll that returns them.
async fn read_quic(
    recv: &mut quinn::RecvStream,
    held: &mut Segments,
    activity: &Activity,
    idle_limit: Duration,
    into: &mut Into<'_>,
) -> io::Result<usize> {
    loop {
        let given = held.give(into);
        if given > 0 {
            return Ok(given);
        }
        let mut segments: [Bytes; SEGMENTS_AT_ONCE] = std::array::from_fn(|_| Bytes::new());
        match timeout(CONTROL_POLL, recv.read_chunks(&mut segments)).await {
            Ok(Ok(Some(n))) => {
                activity.touch();
                held.0.extend(segments[..n].iter_mut().map(std::mem::take));
            }
            Ok(Ok(None)) => return Ok(0),
            Ok(Err(e)) => return Err(e.into()),
            Err(_quiet) => {
                if activity.idle_for().is_some_and(|idle| idle >= idle_limit) {
                    return Err(idle::timed_out(idle_limit));
                }
            }
        }
    }
}

/// Reads from `socket` into `into`, waking once `want` bytes (at most [`RECV_LOWAT_MAX`])
/// arrived or [`RECV_BATCH_WAIT`] passed with fewer; fails once the session was idle for
/// `idle_limit`. 0 at the end of the connection.
async fn read_socket(
    socket: &AsyncTcp,
    lowat: &mut usize,
    activity: &Activity,
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
                activity.touch();
                return Ok(n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                // Nothing at all arrived: wait for the first byte, not for a batch.
                *lowat = set_lowat(socket, *lowat, 1);
                if activity.idle_for().is_some_and(|idle| idle >= idle_limit) {
                    return Err(idle::timed_out(idle_limit));
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
            if self.buf.len() > INBOX {
                // What a long message grew it to is not kept.
                self.buf = vec![0u8; INBOX].into_boxed_slice();
            }
        }
    }

    /// Room to read into after what is held, for a frame that needs `need` bytes held in all
    /// (0 when any room will do): what is held moves to the front when the room after it is
    /// short, and the inbox grows when it is short itself.
    fn room(&mut self, need: usize) -> &mut [u8] {
        if self.start > 0 && self.buf.len() - self.end < need.max(MIN_ROOM) {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        if self.buf.len() < need {
            let mut grown = vec![0u8; need].into_boxed_slice();
            grown[..self.end].copy_from_slice(&self.buf[..self.end]);
            self.buf = grown;
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
            inbox.room(0).len(),
            INBOX - 3,
            "what is held stays where it is while there is room after it"
        );
        let fill = INBOX - 3 - 100;
        for (i, byte) in inbox.room(0)[..fill].iter_mut().enumerate() {
            *byte = i as u8;
        }
        inbox.filled_by(fill);
        inbox.consume(fill + 1 - 10);
        let held = inbox.filled().to_vec();
        assert_eq!(held.len(), 10);
        assert_eq!(inbox.room(0).len(), INBOX - 10, "moved to the front");
        assert_eq!(inbox.filled(), held);
        inbox.consume(10);
        assert_eq!(inbox.room(0).len(), INBOX);
    }

    #[test]
    fn an_inbox_grows_for_a_long_frame_and_shrinks_once_it_is_read() {
        let mut inbox = Inbox::holding(&[1; 100]);
        inbox.consume(50);
        let need = INBOX * 3;
        assert_eq!(
            inbox.room(need).len(),
            need - 50,
            "grown, what is held at the front"
        );
        assert_eq!(inbox.filled(), [1; 50]);
        inbox.room(need).fill(2);
        inbox.filled_by(need - 50);
        assert_eq!(inbox.filled().len(), need);
        assert_eq!(inbox.filled()[49..51], [1, 2]);
        inbox.consume(need);
        assert_eq!(inbox.room(0).len(), INBOX, "back to its size");
    }

    /// A plain TCP connection as a task reads it, read against `activity` with `limit`, and
    /// the peer's end.
    fn task_conn(activity: &Arc<Activity>, limit: Duration) -> (TaskConn, TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (ours, _) = listener.accept().unwrap();
        (
            TaskConn::tcp(ours, activity.clone(), limit, 0).unwrap(),
            peer,
        )
    }

    /// A quiet connection lives as long as another connection of its session receives bytes,
    /// and while the receiver is busy for the session; then it times out.
    #[test]
    fn a_session_is_idle_only_when_none_of_its_connections_receives() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let activity = Activity::new();
            let limit = Duration::from_millis(600);
            let (mut quiet, _quiet_peer) = task_conn(&activity, limit);
            let (mut busy, mut busy_peer) = task_conn(&activity, limit);
            let started = std::time::Instant::now();
            let feeding = async {
                {
                    let _guard = activity.busy();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                for _ in 0..8 {
                    crate::wire::write_message(&mut busy_peer, &Message::EndOfStream).unwrap();
                    assert!(matches!(
                        busy.next_message().await,
                        Ok(Message::EndOfStream)
                    ));
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
            };
            let (err, ()) = tokio::join!(quiet.next_message(), feeding);
            let err = err.unwrap_err();
            assert!(err.to_string().contains("session idle"), "{err}");
            // The busy spell and 8 feeds of 150 ms kept it alive; it died about `limit` after
            // the last one.
            let took = started.elapsed();
            assert!(took >= Duration::from_millis(1500), "{took:?}");
        });
    }

    /// A send cut short, as a heartbeat cuts a wait for the next message short, leaves exactly
    /// what is still to go: sent again, every byte arrives once and in order.
    #[test]
    fn a_send_cut_short_leaves_exactly_what_is_still_to_go() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let mut peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (ours, _) = listener.accept().unwrap();
            ours.set_nonblocking(true).unwrap();
            let socket = AsyncTcp::from_std(ours).unwrap();
            // More than the sockets' buffers hold while the peer reads nothing.
            let data: Vec<u8> = (0..32u32 << 20).map(|i| (i % 251) as u8).collect();
            let mut out = data.clone();
            let limit = Duration::from_secs(10);
            let cut = timeout(Duration::from_millis(200), send(&socket, &mut out, limit)).await;
            assert!(cut.is_err(), "the send waited for room");
            assert!(
                !out.is_empty() && out.len() < data.len(),
                "{} left",
                out.len()
            );
            let reader = std::thread::spawn(move || {
                let mut got = Vec::new();
                peer.read_to_end(&mut got).unwrap();
                got
            });
            send(&socket, &mut out, limit).await.unwrap();
            drop(socket);
            assert!(reader.join().unwrap() == data, "every byte once, in order");
        });
    }
}
