//! A data stream over QUIC: its thread takes units and writes their frames as a TCP stream's
//! writer does ([`super::stream`]), and a task of the transfer's own runtime ([`QuicStreams`])
//! sends them on the QUIC stream while it reads and acts on the receiver's answers. quinn
//! drives the connection on the same runtime, so no read or write waits on a runtime from
//! outside it: the thread hands the task its frames in pieces through a short queue, and
//! waits only when the queue is full.
//!
//! The connection is opened and its key handshake done by a task too ([`open`]), while the
//! thread waits for it and gives up when the transfer ends meanwhile.

use std::io::{self, IoSlice, Write};
use std::net::SocketAddr;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::time::timeout;

use super::answers::Unanswered;
use super::stream::{handshake_failure, on_answer, write_units, StreamFailure, StreamHandle};
use super::{guarded_message, SendError, Shared, CONNECT_TIMEOUT};
use crate::auth::{Greeting, Welcomed};
use crate::cause::Cause;
use crate::idle::Activity;
use crate::quic::{QuicClient, QuicConnection, QuicError};
use crate::seal::FrameWriter;
use crate::task_io::TaskConn;
use crate::wire::{self, Role, WireError};

/// The most bytes of frames a stream's thread hands its task at once.
const PIECE: usize = 256 << 10;
/// Pieces waiting for the task: the thread waits while this many do. quinn's own send buffer
/// behind it holds a connection's window.
const QUEUED_PIECES: usize = 4;
/// How often a thread waiting for its connection to open asks whether the transfer still
/// wants it.
const GIVE_UP_POLL: Duration = Duration::from_millis(100);

/// What opens a transfer's QUIC streams: the client pinned to the session's certificate, and
/// the runtime its connections and their tasks run on (the transfer owns it).
pub(super) struct QuicStreams {
    pub(super) client: QuicClient,
    pub(super) runtime: Handle,
}

/// Runs `task` on `runtime` for a thread that waits for its outcome on the channel returned;
/// a panic in it comes back as its message ([`guarded_message`]).
fn spawn_for_thread<T: Send + 'static>(
    runtime: &Handle,
    task: impl std::future::Future<Output = T> + Send + 'static,
) -> (mpsc::Receiver<Result<T, String>>, tokio::task::AbortHandle) {
    let (tx, rx) = mpsc::channel();
    let running = runtime.spawn(task);
    let abort = running.abort_handle();
    runtime.spawn(async move {
        let outcome = running.await.map_err(|e| match e.try_into_panic() {
            Ok(panic) => guarded_message(&*panic),
            Err(e) => e.to_string(),
        });
        let _ = tx.send(outcome);
    });
    (rx, abort)
}

/// The outcome of a task a stream's thread waits for: a panic ends the transfer with
/// [`SendError::Internal`]; a task that never ran (the runtime stopped) breaks the stream.
fn task_outcome<T>(
    shared: &Shared,
    handle: &StreamHandle,
    outcome: Result<Result<T, String>, mpsc::RecvError>,
) -> Result<T, StreamFailure> {
    match outcome {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(panic)) => {
            let thread = format!("xfer-stream-{} task", handle.id);
            shared.fail(SendError::Internal(format!(
                "the {thread} panicked: {panic}"
            )));
            Err(StreamFailure::Fatal)
        }
        Err(mpsc::RecvError) => Err(StreamFailure::Broken(
            "the transfer's QUIC runtime stopped".into(),
        )),
    }
}

/// Opens a QUIC connection for a stream to the first of the receiver's addresses that answers
/// and proves the session on it; the connection's reading side and a handle to it.
pub(super) fn open(
    shared: &Arc<Shared>,
    handle: &StreamHandle,
    quic: &QuicStreams,
) -> Result<(TaskConn, QuicConnection), StreamFailure> {
    let mut last = None;
    for &addr in &shared.dial.addrs {
        let (opened, abort) = spawn_for_thread(&quic.runtime, open_one(shared.clone(), addr));
        let outcome = loop {
            match opened.recv_timeout(GIVE_UP_POLL) {
                Ok(outcome) => break Ok(outcome),
                Err(mpsc::RecvTimeoutError::Timeout) if shared.is_over() => {
                    abort.abort();
                    return Err(StreamFailure::Fatal);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break Err(mpsc::RecvError),
            }
        };
        match task_outcome(shared, handle, outcome)? {
            Ok(opened) => return Ok(opened),
            Err(Opening::Refused(failure)) => return Err(failure),
            Err(Opening::Connect(e @ QuicError::WrongCertificate)) => {
                let addr = shared.config.addr.clone();
                let cause = Cause::new(e);
                shared.fail(SendError::Auth { addr, cause });
                return Err(StreamFailure::Fatal);
            }
            // The transfer ended meanwhile (and said why).
            Err(Opening::Connect(QuicError::Io(_))) if shared.is_over() => {
                return Err(StreamFailure::Fatal)
            }
            Err(Opening::Connect(QuicError::Io(e))) => last = Some(e),
        }
    }
    let reason = last.map(|e| e.to_string()).unwrap_or_default();
    Err(StreamFailure::Broken(format!(
        "cannot open a QUIC connection to {}: {reason}",
        shared.config.addr
    )))
}

/// Why a QUIC connection could not serve as a stream.
enum Opening {
    /// It could not be opened.
    Connect(QuicError),
    /// Its key handshake failed; what that means for the transfer.
    Refused(StreamFailure),
}

/// Opens a connection to `addr` within [`CONNECT_TIMEOUT`] and does the data stream's half of
/// the key handshake within the stall timeout.
async fn open_one(
    shared: Arc<Shared>,
    addr: SocketAddr,
) -> Result<(TaskConn, QuicConnection), Opening> {
    let Some(quic) = &shared.dial.quic else {
        return Err(Opening::Connect(QuicError::Io(io::Error::other(
            "the transfer does not use QUIC",
        ))));
    };
    let stream = timeout(CONNECT_TIMEOUT, quic.client.connect(addr))
        .await
        .map_err(|_| {
            Opening::Connect(QuicError::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("QUIC: no answer from {addr} within {CONNECT_TIMEOUT:?} (is UDP blocked?)"),
            )))
        })?
        .map_err(Opening::Connect)?;
    let connection = stream.connection.clone();
    let binding = stream.binding;
    let mut conn = TaskConn::quic(stream, Activity::new(), Duration::MAX, 0);
    let limit = shared.config.options.stall_timeout;
    let proven = match timeout(limit, prove_session(&shared, &mut conn, &binding)).await {
        Ok(proven) => proven,
        Err(_) => Err(WireError::Io(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the receiver did not answer the stream's handshake within {limit:?}"),
        ))
        .into()),
    };
    match proven {
        Ok(_) => Ok((conn, connection)),
        Err(e) => {
            connection.close();
            Err(Opening::Refused(handshake_failure(&shared, e)))
        }
    }
}

/// The data stream's half of the key handshake over `conn`, whose channel is `binding`
/// ([`Greeting`]): it proves it belongs to the session.
async fn prove_session(
    shared: &Shared,
    conn: &mut TaskConn,
    binding: &crate::auth::ChannelBinding,
) -> Result<Welcomed, crate::auth::AuthError> {
    let role = Role::Data {
        session: shared.dial.session,
    };
    let (greeting, hello) = Greeting::start(&shared.dial.session_key, role, shared.dial.sealed)?;
    wire::write_message(&mut conn.replies, &hello)?;
    conn.flush().await.map_err(WireError::Io)?;
    let (mut proving, auth) = match greeting.challenge(conn.next_message().await, binding) {
        Ok(challenged) => challenged,
        Err(refusal) => {
            if let Some(reason) = refusal.told {
                let _ = wire::write_message(&mut conn.replies, &wire::Message::Refused { reason });
                let _ = conn.flush().await;
            }
            return Err(refusal.error);
        }
    };
    wire::write_message(&mut conn.replies, &auth)?;
    conn.flush().await.map_err(WireError::Io)?;
    if let Some((outgoing, incoming)) = proving.frame_keys.take() {
        conn.seal(incoming, outgoing).map_err(WireError::Io)?;
    }
    proving.welcome(conn.next_message().await)
}

/// Carries units over an authenticated QUIC stream (`conn`, on `connection`) until it is
/// retired, the transfer ends or the connection breaks: this thread writes the frames, the
/// stream's task sends them and reads the answers into `in_flight`.
pub(super) fn exchange(
    shared: &Arc<Shared>,
    handle: &Arc<StreamHandle>,
    quic: &QuicStreams,
    conn: TaskConn,
    connection: QuicConnection,
    in_flight: &Arc<Mutex<Unanswered>>,
) -> Result<(), StreamFailure> {
    let (pieces, queue) = tokio::sync::mpsc::channel(QUEUED_PIECES);
    let task = carry(
        shared.clone(),
        handle.clone(),
        conn,
        connection.clone(),
        queue,
        in_flight.clone(),
    );
    let (carried, _abort) = spawn_for_thread(&quic.runtime, task);
    let mut writer = FrameWriter::new(Pieces(pieces));
    let written = write_units(shared, handle, &mut writer, in_flight);
    // The queue closes: the task has every frame.
    drop(writer);
    if written.is_err() {
        connection.close();
    }
    let answered = task_outcome(shared, handle, carried.recv()).and_then(|answered| answered);
    written.and(answered)
}

/// A stream's task: sends the pieces of frames its thread queues, while it reads the
/// receiver's answers and acts on them until the answer to `EndOfStream`. When either fails
/// the connection closes, which ends the other, and the queue with it: a thread waiting for
/// room in it is let go.
async fn carry(
    shared: Arc<Shared>,
    handle: Arc<StreamHandle>,
    mut conn: TaskConn,
    connection: QuicConnection,
    mut queue: tokio::sync::mpsc::Receiver<Bytes>,
    in_flight: Arc<Mutex<Unanswered>>,
) -> Result<(), StreamFailure> {
    let Some(mut send) = conn.take_quic_send() else {
        return Err(StreamFailure::Broken(
            "the QUIC stream has no sending half".into(),
        ));
    };
    let sending = async {
        while let Some(piece) = queue.recv().await {
            if let Err(e) = send.write_chunk(piece).await {
                queue.close();
                connection.close();
                return Err(StreamFailure::Broken(e.to_string()));
            }
        }
        Ok(())
    };
    let answering = async {
        let answered = loop {
            match on_answer(&shared, &handle, conn.next_message().await, &in_flight) {
                Ok(true) => break Ok(()),
                Ok(false) => {}
                Err(failure) => break Err(failure),
            }
        };
        if answered.is_err() {
            // A thread waiting for a unit would otherwise wait for this stream's own, and one
            // waiting for room in the queue for the connection.
            handle.retire(&shared);
            connection.close();
        }
        answered
    };
    let (sent, answered) = tokio::join!(sending, answering);
    sent.and(answered)
}

/// The writing half of a QUIC stream as its thread sees it: what is written goes to the
/// stream's task in pieces of at most [`PIECE`] bytes (a frame's head and payload in one when
/// they fit), waiting while [`QUEUED_PIECES`] wait already. Fails once the task has ended.
struct Pieces(tokio::sync::mpsc::Sender<Bytes>);

impl Write for Pieces {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let len = bufs.iter().map(|b| b.len()).sum::<usize>().min(PIECE);
        if len == 0 {
            return Ok(0);
        }
        let mut piece = Vec::with_capacity(len);
        for buf in bufs {
            let room = len - piece.len();
            piece.extend_from_slice(&buf[..buf.len().min(room)]);
        }
        self.0.blocking_send(Bytes::from(piece)).map_err(|_| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the QUIC stream's connection closed",
            )
        })?;
        Ok(len)
    }

    fn flush(&mut self) -> io::Result<()> {
        // Each piece is queued as it is written.
        Ok(())
    }
}
