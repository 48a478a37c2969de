//! The receiving side: one listening port for the control connection and every data stream of
//! every session; authentication before any byte is accepted; chunks verified, written and
//! acknowledged per stream.

mod destination;
mod file_tree;

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use destination::check_root_writable;
use destination::{ActivePaths, Destination, DestinationError};

use crate::auth::{self, random_bytes, SessionKey};
use crate::wire::{
    self, chunk_checksum, Frame, FrameReader, Message, Role, SessionLimits, WireError,
};

/// How long a new connection may take to authenticate and, for control, to send its manifest.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// The most a data stream's read waits to accumulate before returning (`SO_RCVLOWAT`).
const RECV_LOWAT_MAX: usize = 512 << 10;
/// The longest a batched read waits for its batch before it takes what has arrived. The kernel
/// wakes a sleeping reader only at the low-water mark; when the window closes below the mark,
/// nothing more arrives, and this bound turns what would be a deadlock into a short pause.
const RECV_BATCH_WAIT: Duration = Duration::from_millis(5);

/// A data stream's reader: each read waits until `min(requested, RECV_LOWAT_MAX)` bytes have
/// arrived (or `RECV_BATCH_WAIT` has passed) instead of waking for every packet.
struct BatchedReader {
    socket: TcpStream,
    lowat: usize,
    batching: bool,
}

impl BatchedReader {
    fn new(socket: TcpStream) -> Self {
        BatchedReader {
            socket,
            lowat: 1,
            batching: false,
        }
    }

    /// Switches to batched reads (after the handshake; a data stream has no idle timeout).
    fn start_batching(&mut self) -> std::io::Result<()> {
        self.socket.set_read_timeout(Some(RECV_BATCH_WAIT))?;
        self.batching = true;
        Ok(())
    }

    fn set_lowat(&mut self, want: usize) {
        if want == self.lowat {
            return;
        }
        let rc = crate::sockopt::set(
            &self.socket,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            want as libc::c_int,
        );
        // Best effort: if the kernel refuses, reads simply wake more often.
        self.lowat = if rc.is_ok() { want } else { 1 };
    }
}

impl std::io::Read for BatchedReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.batching {
            return self.socket.read(buf);
        }
        self.set_lowat(buf.len().clamp(1, RECV_LOWAT_MAX));
        loop {
            match self.socket.read(buf) {
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                other => return other,
            }
        }
    }
}

/// How a receiver is set up.
#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    /// Everything received lands under this directory.
    pub root: PathBuf,
    /// The key senders must prove they hold.
    pub key: SessionKey,
    /// Per-session bounds announced to senders and enforced.
    pub limits: SessionLimits,
    /// Most sessions served at once.
    pub max_sessions: usize,
}

impl ReceiverConfig {
    /// Defaults: 256 streams per session, 16 MiB chunks, 32 sessions.
    pub fn new(root: PathBuf, key: SessionKey) -> Self {
        ReceiverConfig {
            root,
            key,
            limits: SessionLimits {
                max_streams: 256,
                max_chunk: 16 << 20,
            },
            max_sessions: 32,
        }
    }
}

/// Errors that stop a receiver from starting.
#[derive(Debug, thiserror::Error)]
pub enum ReceiverError {
    /// The listening address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The cause (address in use, permission denied, ...).
        source: std::io::Error,
    },
    /// The root directory is missing or not writable.
    #[error("receiver root {path} is not a writable directory: {source}")]
    Root {
        /// The root given.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// A session being served.
struct Session {
    dest: Destination,
    streams: AtomicU32,
    failure: Mutex<Option<String>>,
    /// Clones of the data sockets, shut down when the control connection ends so that no stream
    /// thread outlives its session (a vanished sender sends no FIN). `None` once it ended.
    sockets: Mutex<Option<Vec<TcpStream>>>,
}

struct Shared {
    config: ReceiverConfig,
    sessions: Mutex<HashMap<[u8; 16], Arc<Session>>>,
    active_paths: ActivePaths,
    sessions_ended: AtomicU64,
}

/// A bound receiver, ready to serve sessions.
pub struct Receiver {
    listener: TcpListener,
    shared: Arc<Shared>,
}

impl Receiver {
    /// Checks the root, binds `addr`, and returns the receiver (nothing is served until `serve`).
    pub fn bind(addr: &str, mut config: ReceiverConfig) -> Result<Receiver, ReceiverError> {
        config.root = check_root_writable(&config.root).map_err(|source| ReceiverError::Root {
            path: config.root.display().to_string(),
            source,
        })?;
        let listener = TcpListener::bind(addr).map_err(|source| ReceiverError::Bind {
            addr: addr.to_string(),
            source,
        })?;
        Ok(Receiver {
            listener,
            shared: Arc::new(Shared {
                config,
                sessions: Mutex::new(HashMap::new()),
                active_paths: ActivePaths::default(),
                sessions_ended: AtomicU64::new(0),
            }),
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The root directory in use (canonical).
    pub fn root(&self) -> &Path {
        &self.shared.config.root
    }

    /// Serves connections, each on its own thread. Returns after `max_sessions_served` control
    /// sessions have ended (successfully or not), or never when `None`.
    pub fn serve(&self, max_sessions_served: Option<u64>) -> std::io::Result<()> {
        self.listener.set_nonblocking(true)?;
        loop {
            if max_sessions_served
                .is_some_and(|n| self.shared.sessions_ended.load(Ordering::Acquire) >= n)
            {
                return Ok(());
            }
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    let shared = self.shared.clone();
                    std::thread::Builder::new()
                        .name(format!("xfer-conn-{peer}"))
                        .spawn(move || serve_connection(&shared, stream, peer))?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    wait_readable(&self.listener, 100)
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Out of file descriptors and the like: say so and keep serving.
                    tracing::warn!("accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }
}

fn wait_readable(listener: &TcpListener, timeout_ms: i32) {
    let mut fd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut fd, 1, timeout_ms) };
}

fn serve_connection(shared: &Shared, stream: TcpStream, peer: SocketAddr) {
    let setup = || -> std::io::Result<(FrameReader<BufReader<BatchedReader>>, TcpStream)> {
        stream.set_nonblocking(false)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(60))
            .with_interval(Duration::from_secs(10))
            .with_retries(6);
        socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive)?;
        let reader = FrameReader::new(
            BufReader::with_capacity(64 << 10, BatchedReader::new(stream.try_clone()?)),
            shared.config.limits.max_chunk as usize,
        );
        Ok((reader, stream.try_clone()?))
    };
    let (mut reader, mut writer) = match setup() {
        Ok(rw) => rw,
        Err(e) => return tracing::warn!("connection from {peer}: {e}"),
    };
    match auth::handshake_as_server(&mut reader, &mut writer, &shared.config.key) {
        Ok(Role::Control) => {
            run_control(shared, &mut reader, &mut writer, peer);
            shared.sessions_ended.fetch_add(1, Ordering::AcqRel);
        }
        Ok(Role::Data { session }) => run_data(shared, session, &mut reader, &mut writer, peer),
        Err(e) => tracing::warn!("connection from {peer} refused: {e}"),
    }
}

fn refuse(writer: &mut TcpStream, peer: SocketAddr, reason: String) {
    tracing::warn!("refusing {peer}: {reason}");
    let _ = wire::write_message(writer, &Message::Refused { reason });
}

fn run_control(
    shared: &Shared,
    reader: &mut FrameReader<BufReader<BatchedReader>>,
    writer: &mut TcpStream,
    peer: SocketAddr,
) {
    let limits = shared.config.limits;
    let id = random_bytes::<16>();
    let short_id: String = id[..4].iter().map(|b| format!("{b:02x}")).collect();
    if shared.sessions.lock().expect("sessions lock").len() >= shared.config.max_sessions {
        return refuse(
            writer,
            peer,
            format!(
                "the receiver serves {} sessions already",
                shared.config.max_sessions
            ),
        );
    }
    if let Err(e) = wire::write_message(
        writer,
        &Message::Welcome {
            session: id,
            limits,
        },
    ) {
        return tracing::warn!("session {short_id} from {peer}: {e}");
    }
    let manifest = match reader.read_message() {
        Ok(Message::Manifest(m)) => m,
        Ok(other) => {
            return refuse(
                writer,
                peer,
                format!("expected Manifest, got {}", auth::name(&other)),
            )
        }
        Err(e) => return tracing::warn!("session {short_id} from {peer}: {e}"),
    };
    let started = Instant::now();
    let (dest, plan) =
        match Destination::prepare(&shared.config.root, &manifest, &shared.active_paths) {
            Ok(prepared) => prepared,
            Err(e) => return refuse(writer, peer, e.to_string()),
        };
    tracing::info!(
        "session {short_id} from {peer}: {} files, {} directories, {} bytes",
        manifest.files.len(),
        manifest.dirs.len(),
        manifest.total_bytes()
    );
    let session = Arc::new(Session {
        dest,
        streams: AtomicU32::new(0),
        failure: Mutex::new(None),
        sockets: Mutex::new(Some(Vec::new())),
    });
    shared
        .sessions
        .lock()
        .expect("sessions lock")
        .insert(id, session.clone());
    let outcome = serve_control_messages(&session, reader, writer, plan);
    shared.sessions.lock().expect("sessions lock").remove(&id);
    let sockets = session.sockets.lock().expect("sockets lock").take();
    for socket in sockets.into_iter().flatten() {
        let _ = socket.shutdown(std::net::Shutdown::Both);
    }
    match outcome {
        Ok(()) => tracing::info!(
            "session {short_id} from {peer} complete in {:.2?}",
            started.elapsed()
        ),
        Err(e) => tracing::warn!("session {short_id} from {peer} ended early: {e}"),
    }
}

fn serve_control_messages(
    session: &Session,
    reader: &mut FrameReader<BufReader<BatchedReader>>,
    writer: &mut TcpStream,
    plan: Vec<wire::FileStatus>,
) -> Result<(), String> {
    wire::write_message(writer, &Message::Plan(plan)).map_err(|e| e.to_string())?;
    reader
        .get_mut()
        .get_mut()
        .socket
        .set_read_timeout(None)
        .map_err(|e| e.to_string())?;
    loop {
        match reader.read_message().map_err(|e| e.to_string())? {
            Message::Seal { file, blake3 } => {
                let result = session.dest.seal(file, blake3);
                let error = result.as_ref().err().map(ToString::to_string);
                wire::write_message(
                    writer,
                    &Message::Finalized {
                        file,
                        error: error.clone(),
                    },
                )
                .map_err(|e| e.to_string())?;
                if let Err(DestinationError::Protocol(e)) = result {
                    return Err(e);
                }
            }
            Message::Finish => {
                let reply = match session.dest.finish() {
                    Ok(()) => Message::Done,
                    Err(e) => Message::Error {
                        message: e.to_string(),
                    },
                };
                wire::write_message(writer, &reply).map_err(|e| e.to_string())?;
                return match reply {
                    Message::Done => Ok(()),
                    _ => Err("finishing failed".into()),
                };
            }
            other => {
                return Err(format!(
                    "unexpected {} on the control connection",
                    auth::name(&other)
                ))
            }
        }
    }
}

fn run_data(
    shared: &Shared,
    id: [u8; 16],
    reader: &mut FrameReader<BufReader<BatchedReader>>,
    writer: &mut TcpStream,
    peer: SocketAddr,
) {
    let Some(session) = shared
        .sessions
        .lock()
        .expect("sessions lock")
        .get(&id)
        .cloned()
    else {
        return refuse(writer, peer, "unknown or finished session".into());
    };
    let limits = shared.config.limits;
    if session.streams.fetch_add(1, Ordering::AcqRel) >= limits.max_streams {
        session.streams.fetch_sub(1, Ordering::AcqRel);
        return refuse(
            writer,
            peer,
            format!("a session may open at most {} streams", limits.max_streams),
        );
    }
    let registered = match (
        writer.try_clone(),
        session.sockets.lock().expect("sockets lock").as_mut(),
    ) {
        (Ok(clone), Some(sockets)) => {
            sockets.push(clone);
            true
        }
        _ => false,
    };
    if !registered {
        session.streams.fetch_sub(1, Ordering::AcqRel);
        return refuse(writer, peer, "the session has ended".into());
    }
    let result = wire::write_message(
        writer,
        &Message::Welcome {
            session: id,
            limits,
        },
    )
    .map_err(|e| e.to_string())
    .and_then(|()| {
        reader
            .get_mut()
            .get_mut()
            .start_batching()
            .map_err(|e| e.to_string())
    })
    .and_then(|()| receive_chunks(&session, reader, writer));
    session.streams.fetch_sub(1, Ordering::AcqRel);
    if let Err(e) = result {
        tracing::debug!("data stream from {peer} closed: {e}");
        drain_before_close(writer);
    }
    let _ = writer.shutdown(std::net::Shutdown::Both);
}

/// After an error reply: half-close, then read and discard what the peer is still sending for a
/// bounded time, so its blocked write completes and it reads the error instead of hanging (or
/// losing the error to a reset).
fn drain_before_close(socket: &mut TcpStream) {
    const LINGER: Duration = Duration::from_secs(2);
    let _ = socket.shutdown(std::net::Shutdown::Write);
    if socket.set_read_timeout(Some(LINGER)).is_err() {
        return;
    }
    let deadline = Instant::now() + LINGER;
    let mut sink = vec![0u8; 256 << 10];
    while Instant::now() < deadline {
        match std::io::Read::read(socket, &mut sink) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Verifies, writes and acknowledges chunks until the sender ends the stream.
fn receive_chunks(
    session: &Session,
    reader: &mut FrameReader<BufReader<BatchedReader>>,
    writer: &mut TcpStream,
) -> Result<(), String> {
    let fail = |writer: &mut TcpStream, message: String| {
        session
            .failure
            .lock()
            .expect("failure lock")
            .get_or_insert_with(|| message.clone());
        let _ = wire::write_message(
            writer,
            &Message::Error {
                message: message.clone(),
            },
        );
        let _ = writer.flush();
        Err(message)
    };
    loop {
        let reply = match reader.read_frame() {
            Ok(Frame::Chunk(header, data)) => {
                if let Some(message) = session.failure.lock().expect("failure lock").clone() {
                    return fail(writer, message);
                }
                if chunk_checksum(data) != header.checksum {
                    Message::Nack {
                        file: header.file,
                        offset: header.offset,
                    }
                } else {
                    match session
                        .dest
                        .write(header.file, header.offset, data, header.checksum)
                    {
                        Ok(()) => Message::Ack {
                            file: header.file,
                            offset: header.offset,
                            len: data.len() as u32,
                        },
                        Err(e) => return fail(writer, e.to_string()),
                    }
                }
            }
            Ok(Frame::Message(Message::EndOfStream)) => {
                return wire::write_message(writer, &Message::EndOfStream)
                    .map_err(|e| e.to_string());
            }
            Ok(Frame::Message(other)) => {
                return fail(
                    writer,
                    format!("unexpected {} on a data stream", auth::name(&other)),
                )
            }
            Err(e @ (WireError::Oversized { .. } | WireError::Malformed(_))) => {
                return fail(writer, e.to_string())
            }
            Err(e) => return Err(e.to_string()),
        };
        wire::write_message(writer, &reply).map_err(|e| e.to_string())?;
    }
}
