//! The receiving side: one listening port for the control connection and every data stream of
//! every session; authentication before any byte is accepted; chunks verified, written and
//! acknowledged per stream.

mod admission;
mod announced;
pub(crate) mod control;
mod control_task;
mod data;
mod destination;
mod events;
mod file_tree;
mod lingering;
mod options;
mod reader;
mod refusal_log;
mod settings;
mod shutdown;
#[cfg(feature = "fuzzing")]
pub(crate) use control_task::control_for_fuzzing;
mod stream_task;
mod task_io;
mod tenant;

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use admission::{Admission, Place};
use announced::Budget;
use control_task::SessionPlaces;
use data::{ChunkError, End, Next, Step};
pub use destination::check_root_writable;
use destination::{ActivePaths, Destination};
use events::Publisher;
pub use events::{ReceiverEvent, ReceiverEvents, SessionOutcome, SessionReport};
use lingering::{Lingering, LINGER};
pub use options::{
    ReceiverOptions, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CHUNK,
    DEFAULT_MAX_HANDSHAKES, DEFAULT_MAX_HANDSHAKES_PER_SOURCE, DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_STREAMS, DEFAULT_SESSION_MEMORY,
};
use reader::{Activity, ConnReader, Source};
use refusal_log::RefusalLog;
pub use settings::ReceiverSettings;
pub use shutdown::Stopper;
use shutdown::{Stage, StopState, STOPPING};
use stream_task::OpenStream;
use tenant::Served;
pub use tenant::Tenant;

use crate::auth::{self, random_bytes, ChannelBinding, SessionKey};
use crate::direct_io::AlignedBuffer;
use crate::link::{self, Connection, LinkReader, LinkWriter};
use crate::quic::{QuicServer, QuicStream};
use crate::seal::{ChunkCheck, FrameWrite, FrameWriter};
use crate::session_id::SessionId;
use crate::telemetry;
use crate::tls::ServerIdentity;
use crate::transport::{self, Transport};
use crate::wire::{self, ChunkHeader, FrameReader, Limit, Message, Role, SessionLimits, WireError};

/// Size of the buffer in front of each connection's socket.
const READ_BUFFER: usize = 64 << 10;
/// Replies a data stream holds back while it handles chunks that have already arrived.
const REPLY_BUFFER: usize = 16 << 10;

/// Errors that stop a receiver from starting.
///
/// ```
/// use transfer::auth::SessionKey;
/// use transfer::receiver::{Receiver, ReceiverSettings, ReceiverError};
///
/// let (_, key) = SessionKey::generate();
/// let config = ReceiverSettings::new("/nonexistent/incoming".into(), key);
/// match Receiver::bind(&config.listen("127.0.0.1:0")) {
///     Err(ReceiverError::Root { path, .. }) => assert_eq!(path, "/nonexistent/incoming"),
///     other => panic!("{:?}", other.err()),
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiverError {
    /// The listening address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: String,
        /// Why (address in use, permission denied, ...).
        #[source]
        error: std::io::Error,
    },
    /// The root directory is missing or not writable (or, with direct I/O, on a file system
    /// that does not support it).
    #[error("receiver root {path} is not a writable directory")]
    Root {
        /// The root given.
        path: String,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// The limits contradict each other.
    #[error("invalid receiver limits: {0}")]
    Limits(String),
    /// No TLS certificate could be made.
    #[error("cannot make the receiver's TLS certificate")]
    Tls(#[source] std::io::Error),
    /// The settings are unusable (a key that cannot be read, a value out of range).
    #[error("{0}")]
    Settings(String),
}

/// A session being served.
struct Session {
    id: [u8; 16],
    /// The key its data streams prove.
    key: SessionKey,
    /// What it was told in `Welcome` and is held to.
    limits: SessionLimits,
    /// Short id for logs.
    name: String,
    /// Whether its connections are TLS (its data streams must match its control connection).
    encrypted: bool,
    /// Whether its frames are sealed ([`crate::seal`]; its data streams must match).
    sealed: bool,
    dest: Destination,
    activity: Arc<Activity>,
    streams: AtomicU32,
    /// Bytes its streams verified and wrote.
    bytes_received: AtomicU64,
    failure: Mutex<Option<String>>,
    /// Whether the receiver itself ended it (stopping, or [`Stopper::end_session`]).
    ended_by_receiver: std::sync::atomic::AtomicBool,
    /// Handles of the data connections, shut down when the control connection ends so that no
    /// stream outlives its session (a vanished sender sends no FIN). `None` once it ended.
    connections: Mutex<Option<Vec<Connection>>>,
    /// Its control connection, closed when a stopping receiver ends the session.
    control: Option<Connection>,
}

impl Session {
    /// Ends the session for `reason`: its streams say so to the sender at their next chunk.
    fn fail(&self, reason: &str) {
        self.failure
            .lock()
            .expect("failure lock")
            .get_or_insert_with(|| reason.to_string());
    }

    /// The receiver ends the session for `reason`, which its streams tell the sender at their
    /// next chunk.
    fn end(&self, reason: &str) {
        self.ended_by_receiver.store(true, Ordering::Release);
        self.fail(reason);
    }

    /// Closes every connection of the session.
    fn close(&self) {
        if let Some(connections) = &*self.connections.lock().expect("connections lock") {
            connections.iter().for_each(Connection::shutdown);
        }
        if let Some(control) = &self.control {
            control.shutdown();
        }
    }
}

struct Shared {
    options: ReceiverOptions,
    /// The keys served: the receiver's own first, then its tenants'.
    served: Vec<Served>,
    /// The certificate encrypted connections are served with.
    tls: ServerIdentity,
    /// The QUIC endpoint, when serving QUIC.
    quic: Option<QuicServer>,
    sessions: Mutex<HashMap<[u8; 16], Arc<Session>>>,
    /// Control connections past authentication (a session's slot is taken before its manifest
    /// is read, so concurrent sessions never exceed the limit).
    sessions_open: AtomicUsize,
    /// Places of connections in their key handshake.
    admission: Arc<Admission>,
    /// Refusals logged, summarised per address.
    refusals: RefusalLog,
    /// Closes connections refused at their accept.
    lingering: Lingering,
    /// Bounds the files all sessions hold announced and unsealed.
    unsealed: Arc<Budget>,
    sessions_ended: AtomicU64,
    stop: StopState,
    events: Publisher,
    /// The runtime that serves TCP connections once their handshakes are done
    /// ([`task_io`]).
    streams: tokio::runtime::Handle,
}

/// Adds one to `counter` if it is below `max`; whether it did.
fn take_unit(counter: &AtomicUsize, max: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .is_ok()
}

/// A bound receiver, ready to serve sessions.
///
/// A receiver embedded in a service: it serves on its own thread, the service follows its
/// sessions through its events and stops it gracefully when it shuts down itself.
///
/// ```
/// use std::time::Duration;
/// use transfer::auth::SessionKey;
/// use transfer::receiver::{Receiver, ReceiverSettings, ReceiverEvent};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let root = tempfile::tempdir()?;
/// let (key_text, key) = SessionKey::generate(); // the text goes to the senders
/// let receiver = Receiver::bind(&ReceiverSettings::new(root.path().into(), key).listen("127.0.0.1:0"))?;
/// let (stopper, mut events) = (receiver.stopper(), receiver.subscribe());
/// let serving = std::thread::spawn(move || receiver.serve(None));
/// std::thread::spawn(move || {
///     while let Some(event) = events.blocking_next() {
///         if let ReceiverEvent::SessionEnded(report) = event {
///             println!("{} from {}: {}", report.dest, report.peer, report.outcome);
///         }
///     }
/// });
/// // ... and at the service's own shutdown:
/// stopper.stop(Duration::from_secs(30));
/// serving.join().unwrap()?;
/// # Ok(())
/// # }
/// ```
pub struct Receiver {
    listener: TcpListener,
    transport: Transport,
    shared: Arc<Shared>,
    /// Held for its drop, which stops the connections' runtime.
    _streams: StreamRuntime,
}

/// The runtime of the receiver's connections, shut down without waiting when the receiver is
/// dropped (which an embedder may do on an async thread, where waiting is not allowed).
struct StreamRuntime(Option<tokio::runtime::Runtime>);

impl Drop for StreamRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl Receiver {
    /// Checks `settings` (reads the keys, checks each root, refuses limits that cannot work,
    /// naming the field), binds `settings.listen`, and returns the receiver (nothing is served
    /// until `serve`).
    ///
    /// ```
    /// use transfer::auth::SessionKey;
    /// use transfer::receiver::{Receiver, ReceiverSettings};
    ///
    /// let root = tempfile::tempdir()?;
    /// let (_, key) = SessionKey::generate();
    /// let receiver = Receiver::bind(&ReceiverSettings::new(root.path().into(), key).listen("127.0.0.1:0"))?;
    /// assert_eq!(receiver.root(), root.path().canonicalize()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bind(settings: &ReceiverSettings) -> Result<Receiver, ReceiverError> {
        let options = settings.options.clone();
        options.check()?;
        let served = tenant::served(settings)?;
        let addr = settings.listen.as_str();
        let admission = Admission::new(options.max_handshakes, options.max_handshakes_per_source);
        let unsealed = Budget::new(options.max_unsealed_total);
        let lingering = Lingering::start().map_err(|e| {
            ReceiverError::Settings(format!("cannot start a thread for refusals: {e}"))
        })?;
        let tls = ServerIdentity::generate().map_err(ReceiverError::Tls)?;
        let streams = task_io::runtime().map_err(|e| {
            ReceiverError::Settings(format!("cannot start the runtime of connections: {e}"))
        })?;
        let (listener, transport, fallback) =
            transport::listen(options.transport, addr).map_err(|error| ReceiverError::Bind {
                addr: addr.to_string(),
                error,
            })?;
        if let Some(why) = fallback {
            tracing::warn!("{why}");
        }
        let quic = match transport {
            Transport::Quic => {
                let udp = listener.local_addr().and_then(QuicServer::bind);
                Some(udp.map_err(|error| ReceiverError::Bind {
                    addr: format!("{addr} (UDP, for QUIC)"),
                    error,
                })?)
            }
            _ => None,
        };
        Ok(Receiver {
            listener,
            transport,
            shared: Arc::new(Shared {
                options,
                served,
                tls,
                quic,
                sessions: Mutex::new(HashMap::new()),
                sessions_open: AtomicUsize::new(0),
                admission,
                refusals: RefusalLog::default(),
                lingering,
                unsealed,
                sessions_ended: AtomicU64::new(0),
                stop: StopState::default(),
                events: Publisher::default(),
                streams: streams.handle().clone(),
            }),
            _streams: StreamRuntime(Some(streams)),
        })
    }

    /// The address actually bound (useful with port 0).
    ///
    /// ```
    /// use transfer::auth::SessionKey;
    /// use transfer::receiver::{Receiver, ReceiverSettings};
    ///
    /// let root = tempfile::tempdir()?;
    /// let config = ReceiverSettings::new(root.path().into(), SessionKey::generate().1);
    /// let receiver = Receiver::bind(&config.listen("127.0.0.1:0"))?;
    /// let addr = receiver.local_addr()?;
    /// assert!(addr.ip().is_loopback() && addr.port() != 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The transport it listens for: the one configured, or TCP where MPTCP could not be had.
    ///
    /// ```
    /// use transfer::auth::SessionKey;
    /// use transfer::receiver::{Receiver, ReceiverSettings};
    /// use transfer::transport::Transport;
    ///
    /// let root = tempfile::tempdir()?;
    /// let mut config = ReceiverSettings::new(root.path().into(), SessionKey::generate().1);
    /// config.options.transport = Transport::Mptcp;
    /// let receiver = Receiver::bind(&config.listen("127.0.0.1:0"))?;
    /// // Where the kernel has no MPTCP, the receiver serves TCP (and logs why).
    /// assert!(matches!(receiver.transport(), Transport::Mptcp | Transport::Tcp));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// The root directory in use (canonical).
    ///
    /// ```
    /// use transfer::auth::SessionKey;
    /// use transfer::receiver::{Receiver, ReceiverSettings};
    ///
    /// let root = tempfile::tempdir()?;
    /// let config = ReceiverSettings::new(root.path().join("."), SessionKey::generate().1);
    /// let receiver = Receiver::bind(&config.listen("127.0.0.1:0"))?;
    /// assert_eq!(receiver.root(), root.path().canonicalize()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn root(&self) -> &Path {
        &self.shared.served[0].root
    }

    /// A handle that stops this receiver gracefully ([`Stopper::stop`]) or ends one of its
    /// sessions ([`Stopper::end_session`]), from any thread.
    ///
    /// ```
    /// use std::time::Duration;
    /// use transfer::auth::SessionKey;
    /// use transfer::receiver::{Receiver, ReceiverSettings};
    ///
    /// let root = tempfile::tempdir()?;
    /// let config = ReceiverSettings::new(root.path().into(), SessionKey::generate().1);
    /// let receiver = Receiver::bind(&config.listen("127.0.0.1:0"))?;
    /// let stopper = receiver.stopper();
    /// std::thread::spawn(move || stopper.stop(Duration::ZERO));
    /// receiver.serve(None)?; // returns once stopped: no session was running
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stopper(&self) -> Stopper {
        Stopper(Arc::downgrade(&self.shared))
    }

    /// Subscribes to what happens from now on: sessions starting and ending (each with its
    /// [`SessionReport`]) and connections refused. Any number of subscribers may listen;
    /// events nobody subscribed to cost nothing.
    ///
    /// ```
    /// use transfer::auth::{KeySetting, SessionKey};
    /// use transfer::job::{SendJob, SenderSettings};
    /// use transfer::sender::SendSource;
    /// use transfer::receiver::{Receiver, ReceiverSettings, ReceiverEvent};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let root = tempfile::tempdir()?;
    /// let (key_text, key) = SessionKey::generate();
    /// let receiver = Receiver::bind(&ReceiverSettings::new(root.path().into(), key).listen("127.0.0.1:0"))?;
    /// let addr = receiver.local_addr()?.to_string();
    /// let mut events = receiver.subscribe();
    /// std::thread::spawn(move || receiver.serve(Some(1)));
    ///
    /// let settings = SenderSettings::new(addr, KeySetting::Text(key_text), SendSource::Memory { size: 1 << 20 });
    /// let summary = tokio::runtime::Runtime::new()?.block_on(SendJob::start(settings)?.finish())?;
    /// let report = loop {
    ///     if let Some(ReceiverEvent::SessionEnded(report)) = events.blocking_next() {
    ///         break report;
    ///     }
    /// };
    /// assert_eq!(report.session, summary.session);
    /// assert!(report.outcome.is_completed());
    /// # Ok(())
    /// # }
    /// ```
    pub fn subscribe(&self) -> ReceiverEvents {
        self.shared.events.subscribe()
    }

    /// Serves connections: each one's key handshake on a thread of its own, then, over TCP,
    /// the connection as a task of the receiver's runtime (a QUIC data stream stays on its
    /// thread). Returns after `max_sessions_served` control sessions have ended (successfully
    /// or not), or once a stop ([`Receiver::stopper`]) has no session left; else never.
    ///
    /// ```
    /// use transfer::auth::{KeySetting, SessionKey};
    /// use transfer::job::{SendJob, SenderSettings};
    /// use transfer::sender::SendSource;
    /// use transfer::receiver::{Receiver, ReceiverSettings};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let root = tempfile::tempdir()?;
    /// let (key_text, key) = SessionKey::generate();
    /// let receiver = Receiver::bind(&ReceiverSettings::new(root.path().into(), key).listen("127.0.0.1:0"))?;
    /// let addr = receiver.local_addr()?.to_string();
    /// // Serve one session, as `xfer recv --once` does.
    /// let serving = std::thread::spawn(move || receiver.serve(Some(1)));
    /// let settings = SenderSettings::new(addr, KeySetting::Text(key_text), SendSource::Memory { size: 1 << 20 });
    /// tokio::runtime::Runtime::new()?.block_on(SendJob::start(settings)?.finish())?;
    /// serving.join().unwrap()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn serve(&self, max_sessions_served: Option<u64>) -> std::io::Result<()> {
        self.listener.set_nonblocking(true)?;
        let _accepting_quic = match &self.shared.quic {
            Some(quic) => {
                let shared = self.shared.clone();
                Some(quic.accept_while(
                    self.shared.options.handshake_timeout,
                    move |peer| shared.admit(peer).ok(),
                    serve_quic_connection,
                )?)
            }
            None => None,
        };
        loop {
            if max_sessions_served
                .is_some_and(|n| self.shared.sessions_ended.load(Ordering::Acquire) >= n)
            {
                return Ok(());
            }
            if self.shared.stopped() {
                return Ok(());
            }
            match self.listener.accept() {
                Ok((stream, peer)) => match self.shared.admit(peer) {
                    Ok(admitted) => {
                        std::thread::Builder::new()
                            .name(format!("xfer-conn-{peer}"))
                            .spawn(move || serve_tcp_connection(stream, peer, admitted))?;
                    }
                    Err(limit) => refuse_at_accept(&self.shared, stream, peer, limit),
                },
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.shared.refusals.tick();
                    wait_readable(&self.listener, Duration::from_millis(100))
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

/// Waits until `listener` has a connection to accept, at most `timeout` (a signal or an error
/// ends the wait early: the caller's loop simply tries again).
fn wait_readable(listener: &TcpListener, timeout: Duration) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let timeout = Timespec::try_from(timeout).ok();
    let _ = poll(
        &mut [PollFd::new(listener, PollFlags::IN)],
        timeout.as_ref(),
    );
}

impl Shared {
    /// For a stopping receiver, acts on the sessions still running past the grace period;
    /// whether none is left, so that serving can end.
    fn stopped(&self) -> bool {
        let stage = self.stop.stage(Instant::now());
        if stage == Stage::Serving {
            return false;
        }
        if self.sessions_open.load(Ordering::Acquire) == 0 {
            tracing::info!("stopped: no session is running");
            return true;
        }
        if matches!(stage, Stage::Telling | Stage::Closing) {
            for session in self.sessions.lock().expect("sessions lock").values() {
                session.end(STOPPING);
                if stage == Stage::Closing {
                    session.close();
                }
            }
        }
        false
    }
}

/// A connection admitted to its key handshake, holding its place ([`admission`]) until it
/// drops.
struct Admitted {
    shared: Arc<Shared>,
    place: Place,
}

impl Admitted {
    /// Notes a handshake that failed for `e`: one that reached its deadline makes its address
    /// suspect ([`admission`]).
    fn failed(&mut self, e: &std::io::Error) {
        if e.kind() == std::io::ErrorKind::TimedOut {
            self.place.timed_out();
        }
    }
}

impl Shared {
    /// Admits a new connection from `peer` to its handshake, or the limit that refuses it.
    fn admit(self: &Arc<Self>, peer: SocketAddr) -> Result<Admitted, Limit> {
        Ok(Admitted {
            shared: self.clone(),
            place: self.admission.admit(peer.ip())?,
        })
    }
}

/// Tells a connection refused at its accept why, in a frame both plain and TLS senders read
/// (a TLS sender finds it where the receiver's first record was due), and closes it gracefully
/// ([`Lingering`]).
fn refuse_at_accept(shared: &Shared, stream: TcpStream, peer: SocketAddr, limit: Limit) {
    refused(shared, peer, limit.to_string());
    shared.lingering.refuse(stream, &Message::Limited { limit });
}

/// A new connection, ready for its key handshake.
struct Link {
    reader: ConnFrames,
    writer: FrameWriter<LinkWriter>,
    channel: ChannelBinding,
    /// TLS or QUIC.
    encrypted: bool,
    connection: Connection,
}

fn serve_tcp_connection(stream: TcpStream, peer: SocketAddr, mut admitted: Admitted) {
    let shared = admitted.shared.clone();
    let shared = &*shared;
    let setup = || -> std::io::Result<Link> {
        stream.set_nonblocking(false)?;
        stream.set_nodelay(true)?;
        // A peer that stops reading must not hold a session's thread in a write for ever.
        stream.set_write_timeout(Some(shared.options.idle_timeout))?;
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(60))
            .with_interval(Duration::from_secs(10))
            .with_retries(6);
        socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive)?;
        let source = ConnReader::new(
            Source::Tcp(stream.try_clone()?),
            shared.options.handshake_timeout,
        )?;
        let ((reader, writer, channel), encrypted) = link::server(&stream, source, &shared.tls)?;
        Ok(Link {
            reader: frames(shared, reader),
            writer: FrameWriter::new(writer),
            channel,
            encrypted,
            connection: Connection::Tcp(stream.try_clone()?),
        })
    };
    match setup() {
        Ok(link) => serve_link(link, peer, admitted),
        Err(e) => {
            admitted.failed(&e);
            refused(shared, peer, e.to_string())
        }
    }
}

fn serve_quic_connection(
    stream: std::io::Result<QuicStream>,
    peer: SocketAddr,
    admitted: Admitted,
) {
    let shared = &admitted.shared;
    let setup = || -> std::io::Result<Link> {
        let mut stream = stream?;
        stream
            .writer
            .set_write_timeout(Some(shared.options.idle_timeout));
        let source = ConnReader::new(
            Source::Quic(stream.reader),
            shared.options.handshake_timeout,
        )?;
        Ok(Link {
            reader: frames(shared, LinkReader::Plain(source)),
            writer: FrameWriter::new(LinkWriter::Quic(stream.writer)),
            channel: stream.binding,
            encrypted: true,
            connection: Connection::Quic(stream.connection),
        })
    };
    match setup() {
        Ok(link) => serve_link(link, peer, admitted),
        Err(e) => refused(shared, peer, format!("QUIC: {e}")),
    }
}

fn frames(shared: &Shared, reader: LinkReader<ConnReader>) -> ConnFrames {
    FrameReader::new(
        BufReader::with_capacity(READ_BUFFER, reader),
        shared.options.max_chunk as usize,
    )
}

/// Authenticates a new connection and serves it as what it proves to be: a session's control
/// connection (over TCP only) or one of its data streams.
fn serve_link(link: Link, peer: SocketAddr, mut admitted: Admitted) {
    let Link {
        mut reader,
        mut writer,
        channel,
        encrypted,
        connection,
    } = link;
    let shared_arc = admitted.shared.clone();
    let shared = &*shared_arc;
    let over_quic = matches!(connection, Connection::Quic(_));
    let (mut joined, mut tenant) = (None, 0);
    let key_for = |asked: &auth::Asked| match &asked.role {
        Role::Control if over_quic => {
            Err("control connections are TCP; QUIC carries data streams only".into())
        }
        Role::Control if shared.options.require_encryption && !encrypted => {
            Err("this receiver serves only encrypted sessions: use xfer send --encrypt".into())
        }
        Role::Control if shared.options.require_integrity && !encrypted && !asked.sealed => Err(
            "this receiver serves only sessions whose integrity is protected: use xfer send \
             --integrity (or --encrypt)"
                .into(),
        ),
        Role::Control => {
            // A key nobody here holds is answered with the receiver's own: the sender finds
            // the proof wrong and says so, and nobody learns which keys are served.
            tenant = shared
                .served
                .iter()
                .position(|s| s.id == asked.key)
                .unwrap_or(0);
            Ok(shared.served[tenant].key.clone())
        }
        Role::Data { session } => {
            let session = find_session(shared, session).ok_or("unknown or finished session")?;
            if session.encrypted != encrypted {
                return Err(format!(
                    "session {} is {}encrypted, and so must its streams be",
                    session.name,
                    if session.encrypted { "" } else { "not " }
                ));
            }
            if session.sealed != asked.sealed {
                return Err(format!(
                    "session {} is {}sealed (xfer send --integrity), and so must its streams be",
                    session.name,
                    if session.sealed { "" } else { "not " }
                ));
            }
            // Only the id is kept: a peer that stalls before its proof must not hold the
            // session (and the paths it claimed) after the session ends.
            joined = Some(session.id);
            Ok(session.key.clone())
        }
    };
    let proven = auth::handshake_as_server(&mut reader, &mut writer, &channel, key_for);
    if let Err(auth::AuthError::Wire(WireError::Io(e))) = &proven {
        admitted.failed(e);
    }
    drop(admitted);
    match proven {
        Ok((
            auth::Asked {
                role: Role::Control,
                sealed,
                ..
            },
            agreed,
        )) => {
            let control = ControlPeer {
                peer,
                tenant,
                agreed,
                encrypted,
                sealed,
            };
            return run_control(&shared_arc, reader, writer, connection, control);
        }
        Ok((_, _)) => match joined.and_then(|id| find_session(shared, &id)) {
            Some(session) => return run_data(shared, session, reader, writer, connection, peer),
            None => refuse(shared, &mut writer, peer, "the session has ended".into()),
        },
        Err(e) => refused(shared, peer, e.to_string()),
    }
    close_after_reply(&connection, writer.get_mut());
}

/// The running session with this id.
fn find_session(shared: &Shared, id: &[u8; 16]) -> Option<Arc<Session>> {
    shared
        .sessions
        .lock()
        .expect("sessions lock")
        .get(id)
        .cloned()
}

/// Tells `peer` why it is refused, and logs, counts and publishes it.
fn refuse(shared: &Shared, writer: &mut impl FrameWrite, peer: SocketAddr, reason: String) {
    let _ = wire::write_message(
        writer,
        &Message::Refused {
            reason: reason.clone(),
        },
    );
    refused(shared, peer, reason);
}

/// Tells `peer` its session is refused because `limit` is reached, and logs, counts and
/// publishes it.
fn refuse_over(shared: &Shared, writer: &mut impl FrameWrite, peer: SocketAddr, limit: Limit) {
    let _ = wire::write_message(writer, &Message::Limited { limit });
    refused(shared, peer, limit.to_string());
}

/// Logs (summarised per address, [`RefusalLog`]), counts and publishes a refusal: of a
/// connection before or in its handshake, or of a session.
fn refused(shared: &Shared, peer: SocketAddr, reason: String) {
    shared.refusals.refused(peer, &reason);
    telemetry::receiver_refused();
    shared
        .events
        .publish(ReceiverEvent::Refused { peer, reason });
}

type ConnFrames = FrameReader<BufReader<LinkReader<ConnReader>>>;

/// Who is on an authenticated control connection.
struct ControlPeer {
    peer: SocketAddr,
    /// Which key it proved ([`Shared::served`]): the receiver's own or a tenant's.
    tenant: usize,
    /// What its key handshake agreed, which its session's key is derived from.
    agreed: auth::Agreed,
    /// Whether it is TLS.
    encrypted: bool,
    /// Whether its frames are sealed ([`crate::seal`]).
    sealed: bool,
}

/// A control connection past its key handshake: refused when the receiver is stopping or its
/// sessions (or its key's) are full, else welcomed and handed to its task
/// ([`control_task`]), which serves the session to its end.
fn run_control(
    shared: &Arc<Shared>,
    reader: ConnFrames,
    mut writer: FrameWriter<LinkWriter>,
    connection: Connection,
    control: ControlPeer,
) {
    let peer = control.peer;
    let welcomed = if shared.stop.is_stopping() {
        Err(Limit::ShuttingDown)
    } else {
        SessionPlaces::take(shared, control.tenant)
    };
    let places = match welcomed {
        Ok(places) => places,
        Err(limit) => {
            refuse_over(shared, &mut writer, peer, limit);
            close_after_reply(&connection, writer.get_mut());
            shared.sessions_ended.fetch_add(1, Ordering::AcqRel);
            return;
        }
    };
    let id = random_bytes::<16>();
    let limits = shared.served[control.tenant].limits;
    let welcome = Message::Welcome {
        session: id,
        limits,
    };
    // Control connections are TCP: the handshake refuses one over QUIC.
    let handed = match (wire::write_message(&mut writer, &welcome), connection) {
        (Ok(()), Connection::Tcp(socket)) => {
            let clone = socket.try_clone().ok().map(Connection::Tcp);
            task_io::hand_over(socket, reader, writer, shared.options.max_manifest)
                .map(|handed| (handed, clone))
                .map_err(WireError::Io)
        }
        (Ok(()), connection) => {
            connection.shutdown();
            Err(WireError::Malformed(
                "a control connection over QUIC".into(),
            ))
        }
        (Err(e), connection) => {
            connection.shutdown();
            Err(e)
        }
    };
    match handed {
        Ok((handed, connection)) => {
            let welcomed = control_task::Welcomed {
                peer,
                id,
                agreed: control.agreed,
                encrypted: control.encrypted,
                sealed: control.sealed,
                connection,
                places,
            };
            control_task::start(welcomed, handed);
        }
        Err(e) => {
            tracing::warn!("session {} from {peer}: {e}", SessionId(id).short());
            shared.sessions_ended.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Session {
    /// How the session ended, given how its control connection did: a session the receiver
    /// ended, or one a stream failed (after which the sender gives up), ends for that reason.
    fn outcome(&self, control: Result<(), SessionOutcome>) -> SessionOutcome {
        let failure = self.failure.lock().expect("failure lock").clone();
        match (control, failure) {
            (_, Some(reason)) if self.ended_by_receiver.load(Ordering::Acquire) => {
                SessionOutcome::EndedByReceiver(reason)
            }
            (Ok(()), _) => SessionOutcome::Completed,
            (Err(SessionOutcome::Disconnected(_)), Some(reason)) => SessionOutcome::Failed(reason),
            (Err(outcome), _) => outcome,
        }
    }
}

/// Makes the session's QUIC certificate and returns its hash, or why QUIC cannot be had.
fn offer_quic(shared: &Shared, session: &Session) -> Result<[u8; 32], String> {
    let Some(quic) = &shared.quic else {
        return Err(
            "this receiver does not serve QUIC: start it with xfer recv --transport quic".into(),
        );
    };
    if !session.encrypted {
        return Err("QUIC sessions need an encrypted (TLS) control connection".into());
    }
    quic.add_session(&session.id)
        .map_err(|e| format!("cannot serve QUIC: {e}"))
}

/// Serves a data stream until it ends and closes it: a TCP stream as a task of the receiver's
/// runtime ([`stream_task`]), a QUIC stream on this thread.
fn run_data(
    shared: &Shared,
    session: Arc<Session>,
    mut reader: ConnFrames,
    mut writer: FrameWriter<LinkWriter>,
    connection: Connection,
    peer: SocketAddr,
) {
    let limits = session.limits;
    if session.streams.fetch_add(1, Ordering::AcqRel) >= limits.max_streams {
        session.streams.fetch_sub(1, Ordering::AcqRel);
        refuse(
            shared,
            &mut writer,
            peer,
            format!("a session may open at most {} streams", limits.max_streams),
        );
        return close_after_reply(&connection, writer.get_mut());
    }
    let open = OpenStream::new(session.clone());
    let registered = match (
        connection.try_clone(),
        session
            .connections
            .lock()
            .expect("connections lock")
            .as_mut(),
    ) {
        (Ok(clone), Some(connections)) => {
            connections.push(clone);
            true
        }
        _ => false,
    };
    if !registered {
        drop(open);
        refuse(shared, &mut writer, peer, "the session has ended".into());
        return close_after_reply(&connection, writer.get_mut());
    }
    let welcomed = wire::write_message(
        &mut writer,
        &Message::Welcome {
            session: session.id,
            limits,
        },
    );
    if let Err(e) = welcomed {
        drop(open);
        stream_ended(&session, peer, End::Closed(e.to_string()));
        return close_after_reply(&connection, writer.get_mut());
    }
    match connection {
        Connection::Tcp(socket) => {
            let limit = stream_task::MAX_STREAM_MESSAGE;
            match task_io::hand_over(socket, reader, writer, limit) {
                Ok(handed) => {
                    let idle = shared.options.idle_timeout;
                    stream_task::start(&shared.streams, session, peer, handed, idle, open)
                }
                Err(e) => _ = stream_ended(&session, peer, End::Closed(e.to_string())),
            }
        }
        connection => {
            let conn = reader.get_mut().get_mut().source_mut();
            let end =
                match conn.watch_session(session.activity.clone(), shared.options.idle_timeout) {
                    Ok(()) => receive_chunks(&session, &mut reader, &mut writer),
                    Err(e) => End::Closed(e.to_string()),
                };
            drop(open);
            stream_ended(&session, peer, end);
            close_after_reply(&connection, writer.get_mut());
        }
    }
}

/// Logs how a data stream of `session` from `peer` ended; whether it failed the session (an
/// error reply was sent and the peer may still be sending).
fn stream_ended(session: &Session, peer: SocketAddr, end: End) -> bool {
    match end {
        End::Finished => false,
        End::Closed(e) => {
            tracing::debug!("session {}: stream from {peer} closed: {e}", session.name);
            false
        }
        End::Failed(e) => {
            tracing::warn!(
                "session {}: stream from {peer} failed the session: {e}",
                session.name
            );
            true
        }
    }
}

/// Counts `len` bytes of `session` verified and written.
fn count_stored(session: &Session, len: usize) {
    telemetry::receiver_wrote(len as u64);
    session
        .bytes_received
        .fetch_add(len as u64, Ordering::Relaxed);
}

/// Closes a connection once the peer has had the chance to read the last reply: a QUIC
/// connection's stream is finished and the peer, which closes the connection once it has read
/// the last reply, is given [`LINGER`] to do so (closing first would discard what it has not
/// received). A TCP data stream that may still be sending after an error reply is closed by
/// its task ([`stream_task`]).
fn close_after_reply(connection: &Connection, writer: &mut LinkWriter) {
    if let (Connection::Quic(quic), LinkWriter::Quic(stream)) = (connection, writer) {
        stream.finish();
        quic.wait_closed(LINGER);
    }
    connection.shutdown();
}

/// Verifies, writes and acknowledges chunks until the stream ends, as the data stream's rules
/// say ([`data`]); how it ended.
///
/// Replies wait in a buffer while chunks that have arrived whole are handled, and go out before
/// the stream waits for more: a run of small files costs one write, not one per file, and no
/// reply waits for a chunk that is still arriving (the sender closes a stream whose answers
/// stop coming).
fn receive_chunks(
    session: &Session,
    reader: &mut ConnFrames,
    writer: &mut FrameWriter<LinkWriter>,
) -> End {
    let mut writer = BufWriter::with_capacity(REPLY_BUFFER, writer);
    let mut aligned = AlignedBuffer::default();
    loop {
        // Before a read that may wait for the peer, which may be waiting for these replies.
        if !reader.next_frame_buffered() {
            if let Err(e) = writer.flush() {
                return End::Closed(e.to_string());
            }
        }
        let head = reader.read_head();
        // Read after the head arrived: the session may have failed while this stream waited.
        let failure = session.failure.lock().expect("failure lock").clone();
        let step = match data::on_head(head, failure) {
            Next::Receive(header, len) => {
                let stored = receive_chunk(session, reader, &mut aligned, &header, len);
                if let Ok(true) = stored {
                    count_stored(session, len);
                }
                data::on_stored(&header, len, stored)
            }
            Next::Then(step) => step,
        };
        match step {
            Step::Answer(answer) => {
                if let Err(e) = wire::write_message(&mut writer, &answer) {
                    return End::Closed(e.to_string());
                }
            }
            Step::End(end, answer) => {
                if let End::Failed(reason) = &end {
                    session.fail(reason);
                }
                let answered = match answer {
                    Some(answer) => wire::write_message(&mut writer, &answer),
                    None => Ok(()),
                };
                let flushed = answered.and_then(|()| writer.flush().map_err(WireError::Io));
                return match (end, flushed) {
                    (End::Finished, Err(e)) => End::Closed(e.to_string()),
                    (end, _) => end,
                };
            }
        }
    }
}

/// Reads a chunk's payload (straight into its part file when it is long enough, else into the
/// reader's buffer, or into `aligned` memory for direct I/O), checks it against its checksum
/// and, when it matches, writes and journals it. Returns whether it matched.
fn receive_chunk(
    session: &Session,
    reader: &mut ConnFrames,
    aligned: &mut AlignedBuffer,
    header: &ChunkHeader,
    len: usize,
) -> Result<bool, ChunkError> {
    let mapped = session
        .dest
        .map_chunk(header.file, header.offset, len)
        .map_err(ChunkError::Destination)?;
    let check = |seal| ChunkCheck {
        checksum: header.checksum,
        seal,
    };
    if let Some(mut chunk) = mapped {
        let seal = reader
            .read_payload_into(chunk.bytes())
            .map_err(ChunkError::Wire)?;
        return chunk.commit(&check(seal)).map_err(ChunkError::Destination);
    }
    // Memory that cannot be had for direct I/O leaves the chunk to be written through the
    // page cache.
    let direct = if session.dest.writes_direct() {
        aligned.get(len).ok()
    } else {
        None
    };
    let (data, seal) = match direct {
        Some(buf) => {
            let seal = reader.read_payload_into(buf).map_err(ChunkError::Wire)?;
            (&*buf, seal)
        }
        None => reader.read_payload().map_err(ChunkError::Wire)?,
    };
    if !check(seal).matches(data) {
        return Ok(false);
    }
    session
        .dest
        .write(header.file, header.offset, data, header.checksum)
        .map_err(ChunkError::Destination)?;
    Ok(true)
}
