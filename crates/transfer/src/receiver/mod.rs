//! The receiving side: one listening port for the control connection and every data stream of
//! every session; authentication before any byte is accepted; chunks verified, written and
//! acknowledged per stream.

mod admission;
mod announced;
mod destination;
mod events;
mod file_tree;
mod heartbeat;
mod lingering;
mod reader;
mod refusal_log;
mod settings;
mod shutdown;
mod tenant;

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use admission::{Admission, Place};
use announced::Budget;
pub use destination::check_root_writable;
use destination::{ActivePaths, Destination, DestinationError, Placement};
use events::Publisher;
pub use events::{ReceiverEvent, ReceiverEvents, SessionOutcome, SessionReport};
use lingering::{Lingering, LINGER};
use reader::{Activity, ConnReader, Source};
use refusal_log::RefusalLog;
pub use settings::{ReceiverSettings, TenantSettings};
pub use shutdown::Stopper;
use shutdown::{Stage, StopState, STOPPING};
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
use crate::wire::{
    self, ChunkHeader, FrameReader, Head, Limit, Message, Role, SessionLimits, WireError,
};

/// Size of the buffer in front of each connection's socket.
const READ_BUFFER: usize = 64 << 10;
/// Replies a data stream holds back while it handles chunks that have already arrived.
const REPLY_BUFFER: usize = 16 << 10;

/// Default [`ReceiverConfig::limits`]`.max_streams`: data streams one session may open.
pub const DEFAULT_MAX_STREAMS: u32 = 256;
/// Default [`ReceiverConfig::max_sessions`].
pub const DEFAULT_MAX_SESSIONS: usize = 32;
/// Default [`ReceiverConfig::session_memory`]: 4 GiB.
pub const DEFAULT_SESSION_MEMORY: u64 = 4 << 30;
/// Default [`ReceiverConfig::idle_timeout`]: five minutes.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Default [`ReceiverConfig::handshake_timeout`]: 10 seconds, enough for a TLS and a key
/// handshake over the longest paths (a few round trips of 250 ms).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`ReceiverConfig::max_handshakes`].
pub const DEFAULT_MAX_HANDSHAKES: usize = 64;
/// Default [`ReceiverConfig::max_handshakes_per_source`].
pub const DEFAULT_MAX_HANDSHAKES_PER_SOURCE: usize = 8;

/// How a receiver is set up: where files land, the key, and the limits that keep one peer from
/// taking the receiver down. A peer that breaks a limit loses its connection or its session,
/// with the reason logged; the receiver goes on serving everyone else.
///
/// ```
/// use std::time::Duration;
/// use transfer::auth::SessionKey;
/// use transfer::receiver::{Receiver, ReceiverConfig};
///
/// let root = tempfile::tempdir()?;
/// let mut config = ReceiverConfig::new(root.path().into(), SessionKey::from_text("a-site-key-0123456789")?);
/// config.max_sessions = 8;
/// config.limits.max_streams = 64;
/// config.idle_timeout = Duration::from_secs(60);
/// config.require_encryption = true;
/// let receiver = Receiver::bind("127.0.0.1:0", config)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    /// Everything received lands under this directory.
    pub root: PathBuf,
    /// The key senders must prove they hold.
    pub key: SessionKey,
    /// Per-session bounds announced to senders and enforced: streams and chunk size (the most a
    /// session may open is further bounded by `session_memory`).
    pub limits: SessionLimits,
    /// Most sessions served at once.
    pub max_sessions: usize,
    /// Most bytes of chunk buffers one session may hold: each data stream holds up to one
    /// chunk, so this bounds its streams to `session_memory / max_chunk`.
    pub session_memory: u64,
    /// Largest batch of the manifest a session may send, in encoded bytes.
    pub max_manifest: usize,
    /// Most files a session may have announced and not yet sealed (a sender holds back its
    /// manifest to stay below [`wire::SENDER_UNSEALED`]); each costs the receiver some
    /// hundreds of bytes until its seal.
    pub max_unsealed: usize,
    /// Most files all sessions together may have announced and not yet sealed: a batch beyond
    /// it waits up to 30 s for other sessions to seal theirs, then is refused. It bounds the
    /// memory announced files take however many sessions there are (about 0.5 KiB each: the
    /// default is some 280 MiB).
    pub max_unsealed_total: usize,
    /// Most connections from addresses without a running session that may be in their key
    /// handshake at once; an address with a running session has as many places of its own, so
    /// that its new data streams never wait behind strangers. More are refused at once with
    /// [`Limit::Authenticating`], which a sender takes as "try again in a moment".
    pub max_handshakes: usize,
    /// Most of those places one address (an IPv6 /64) may hold, so that a peer at one address
    /// cannot hold them all.
    pub max_handshakes_per_source: usize,
    /// How long a new connection may take, from its accept, to authenticate and, for control,
    /// to say where its files go: a deadline, however steadily the peer trickles bytes.
    pub handshake_timeout: Duration,
    /// How long a session may go without receiving a byte on any of its connections (while the
    /// receiver is not itself busy for it) before it is closed.
    pub idle_timeout: Duration,
    /// Refuse sessions that are not encrypted (TLS); encrypted ones are always accepted.
    pub require_encryption: bool,
    /// Refuse sessions whose frames are neither sealed ([`crate::seal`], `xfer send
    /// --integrity`) nor encrypted.
    pub require_integrity: bool,
    /// Listen for TCP, or for MPTCP (which also takes plain TCP senders; where this host
    /// cannot make MPTCP sockets the receiver listens for TCP and logs why), or for QUIC on the
    /// UDP port of the same number besides TCP (which carries every session's control
    /// connection, and serves TCP senders too).
    pub transport: Transport,
    /// Write received files with direct I/O (`O_DIRECT`), bypassing the page cache: for
    /// parallel file systems, and so that transfers do not fill this host's page cache. The
    /// receiver refuses to start when its root's file system does not support it.
    pub direct_io: bool,
    /// Keys of their own, each with its own root and limits ([`Tenant`]), served beside
    /// `key` and `root` on the same port.
    pub tenants: Vec<Tenant>,
}

impl ReceiverConfig {
    /// Defaults: 256 streams per session, 16 MiB chunks, 4 GiB of buffers per session,
    /// 32 sessions, 64 MiB manifest batches, 262,144 unsealed files a session and 524,288 in
    /// all, 64 connections in their handshake (8 from one address), a 10 s handshake and a
    /// 5 min idle timeout; plain, sealed and encrypted sessions; TCP; writes through the page
    /// cache.
    ///
    /// ```
    /// use transfer::auth::SessionKey;
    /// use transfer::receiver::{ReceiverConfig, DEFAULT_MAX_SESSIONS};
    /// use transfer::transport::Transport;
    ///
    /// let (_, key) = SessionKey::generate();
    /// let config = ReceiverConfig::new("/data/incoming".into(), key);
    /// assert_eq!(config.max_sessions, DEFAULT_MAX_SESSIONS);
    /// assert_eq!(config.transport, Transport::Tcp);
    /// ```
    pub fn new(root: PathBuf, key: SessionKey) -> Self {
        ReceiverConfig {
            root,
            key,
            limits: SessionLimits {
                max_streams: DEFAULT_MAX_STREAMS,
                max_chunk: 16 << 20,
            },
            max_sessions: DEFAULT_MAX_SESSIONS,
            session_memory: DEFAULT_SESSION_MEMORY,
            max_manifest: wire::MAX_MESSAGE_LEN,
            max_unsealed: 4 * wire::SENDER_UNSEALED,
            max_unsealed_total: 8 * wire::SENDER_UNSEALED,
            max_handshakes: DEFAULT_MAX_HANDSHAKES,
            max_handshakes_per_source: DEFAULT_MAX_HANDSHAKES_PER_SOURCE,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            require_encryption: false,
            require_integrity: false,
            transport: Transport::Tcp,
            direct_io: false,
            tenants: Vec::new(),
        }
    }

    /// The limits announced to a session that may open `max_streams` streams: streams bounded
    /// by what `session_memory` can buffer.
    fn announced_limits(&self, max_streams: u32) -> Result<SessionLimits, ReceiverError> {
        let streams = self.session_memory / u64::from(self.limits.max_chunk.max(1));
        if streams == 0 {
            return Err(ReceiverError::Limits(format!(
                "a session's memory limit of {} bytes cannot hold one stream's chunk of {} bytes",
                self.session_memory, self.limits.max_chunk
            )));
        }
        Ok(SessionLimits {
            max_streams: max_streams
                .min(u32::try_from(streams).unwrap_or(u32::MAX))
                .max(1),
            max_chunk: self.limits.max_chunk,
        })
    }
}

/// Errors that stop a receiver from starting.
///
/// ```
/// use transfer::auth::SessionKey;
/// use transfer::receiver::{Receiver, ReceiverConfig, ReceiverError};
///
/// let (_, key) = SessionKey::generate();
/// let config = ReceiverConfig::new("/nonexistent/incoming".into(), key);
/// match Receiver::bind("127.0.0.1:0", config) {
///     Err(ReceiverError::Root { path, .. }) => assert_eq!(path, "/nonexistent/incoming"),
///     other => panic!("{:?}", other.err()),
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiverError {
    /// The listening address could not be bound.
    #[error("cannot listen on {addr}: {error}")]
    Bind {
        /// The address.
        addr: String,
        /// The cause (address in use, permission denied, ...).
        error: std::io::Error,
    },
    /// The root directory is missing or not writable (or, with direct I/O, on a file system
    /// that does not support it).
    #[error("receiver root {path} is not a writable directory: {error}")]
    Root {
        /// The root given.
        path: String,
        /// The cause.
        error: std::io::Error,
    },
    /// The limits contradict each other.
    #[error("invalid receiver limits: {0}")]
    Limits(String),
    /// No TLS certificate could be made.
    #[error("{0}")]
    Tls(std::io::Error),
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
    /// stream thread outlives its session (a vanished sender sends no FIN). `None` once it
    /// ended.
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
    config: ReceiverConfig,
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
}

/// Holds one unit of a counter for as long as it lives.
struct Slot<'a>(&'a AtomicUsize);

impl<'a> Slot<'a> {
    /// Takes a unit of `counter` if it is below `max`. The slot is made only once the unit is
    /// taken: a slot made and dropped for a refusal would give back a unit it never took.
    fn take(counter: &'a AtomicUsize, max: usize) -> Option<Slot<'a>> {
        if take_unit(counter, max) {
            Some(Slot(counter))
        } else {
            None
        }
    }
}

/// Adds one to `counter` if it is below `max`; whether it did.
fn take_unit(counter: &AtomicUsize, max: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .is_ok()
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A bound receiver, ready to serve sessions.
///
/// A receiver embedded in a service: it serves on its own thread, the service follows its
/// sessions through its events and stops it gracefully when it shuts down itself.
///
/// ```
/// use std::time::Duration;
/// use transfer::auth::SessionKey;
/// use transfer::receiver::{Receiver, ReceiverConfig, ReceiverEvent};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let root = tempfile::tempdir()?;
/// let (key_text, key) = SessionKey::generate(); // the text goes to the senders
/// let receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::new(root.path().into(), key))?;
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
}

impl Receiver {
    /// Checks the root, binds `addr`, and returns the receiver (nothing is served until `serve`).
    ///
    /// ```
    /// use transfer::auth::SessionKey;
    /// use transfer::receiver::{Receiver, ReceiverConfig};
    ///
    /// let root = tempfile::tempdir()?;
    /// let (_, key) = SessionKey::generate();
    /// let receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::new(root.path().into(), key))?;
    /// assert_eq!(receiver.root(), root.path().canonicalize()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bind(addr: &str, mut config: ReceiverConfig) -> Result<Receiver, ReceiverError> {
        let root = check_root_writable(&config.root, config.direct_io);
        config.root = root.map_err(|error| ReceiverError::Root {
            path: config.root.display().to_string(),
            error,
        })?;
        let served = tenant::served(&config)?;
        if config.max_handshakes == 0 || config.max_handshakes_per_source == 0 {
            return Err(ReceiverError::Limits(
                "max_handshakes and max_handshakes_per_source must be at least 1".into(),
            ));
        }
        let admission = Admission::new(config.max_handshakes, config.max_handshakes_per_source);
        let unsealed = Budget::new(config.max_unsealed_total);
        let lingering = Lingering::start().map_err(|e| {
            ReceiverError::Settings(format!("cannot start a thread for refusals: {e}"))
        })?;
        let tls = ServerIdentity::generate().map_err(ReceiverError::Tls)?;
        let (listener, transport, fallback) =
            transport::listen(config.transport, addr).map_err(|error| ReceiverError::Bind {
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
                config,
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
            }),
        })
    }

    /// The address actually bound (useful with port 0).
    ///
    /// ```
    /// use transfer::auth::SessionKey;
    /// use transfer::receiver::{Receiver, ReceiverConfig};
    ///
    /// let root = tempfile::tempdir()?;
    /// let config = ReceiverConfig::new(root.path().into(), SessionKey::generate().1);
    /// let receiver = Receiver::bind("127.0.0.1:0", config)?;
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
    /// use transfer::receiver::{Receiver, ReceiverConfig};
    /// use transfer::transport::Transport;
    ///
    /// let root = tempfile::tempdir()?;
    /// let mut config = ReceiverConfig::new(root.path().into(), SessionKey::generate().1);
    /// config.transport = Transport::Mptcp;
    /// let receiver = Receiver::bind("127.0.0.1:0", config)?;
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
    /// use transfer::receiver::{Receiver, ReceiverConfig};
    ///
    /// let root = tempfile::tempdir()?;
    /// let config = ReceiverConfig::new(root.path().join("."), SessionKey::generate().1);
    /// let receiver = Receiver::bind("127.0.0.1:0", config)?;
    /// assert_eq!(receiver.root(), root.path().canonicalize()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn root(&self) -> &Path {
        &self.shared.config.root
    }

    /// A handle that stops this receiver gracefully ([`Stopper::stop`]) or ends one of its
    /// sessions ([`Stopper::end_session`]), from any thread.
    ///
    /// ```
    /// use std::time::Duration;
    /// use transfer::auth::SessionKey;
    /// use transfer::receiver::{Receiver, ReceiverConfig};
    ///
    /// let root = tempfile::tempdir()?;
    /// let config = ReceiverConfig::new(root.path().into(), SessionKey::generate().1);
    /// let receiver = Receiver::bind("127.0.0.1:0", config)?;
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
    /// use transfer::receiver::{Receiver, ReceiverConfig, ReceiverEvent};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let root = tempfile::tempdir()?;
    /// let (key_text, key) = SessionKey::generate();
    /// let receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::new(root.path().into(), key))?;
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

    /// Serves connections, each on its own thread. Returns after `max_sessions_served` control
    /// sessions have ended (successfully or not), or once a stop ([`Receiver::stopper`]) has
    /// no session left; else never.
    ///
    /// ```
    /// use transfer::auth::{KeySetting, SessionKey};
    /// use transfer::job::{SendJob, SenderSettings};
    /// use transfer::sender::SendSource;
    /// use transfer::receiver::{Receiver, ReceiverConfig};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let root = tempfile::tempdir()?;
    /// let (key_text, key) = SessionKey::generate();
    /// let receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::new(root.path().into(), key))?;
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
                    self.shared.config.handshake_timeout,
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
        stream.set_write_timeout(Some(shared.config.idle_timeout))?;
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(60))
            .with_interval(Duration::from_secs(10))
            .with_retries(6);
        socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive)?;
        let source = ConnReader::new(
            Source::Tcp(stream.try_clone()?),
            shared.config.handshake_timeout,
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
            .set_write_timeout(Some(shared.config.idle_timeout));
        let source = ConnReader::new(Source::Quic(stream.reader), shared.config.handshake_timeout)?;
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
        shared.config.limits.max_chunk as usize,
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
    let shared = admitted.shared.clone();
    let shared = &*shared;
    let over_quic = matches!(connection, Connection::Quic(_));
    let (mut joined, mut tenant) = (None, 0);
    let key_for = |asked: &auth::Asked| match &asked.role {
        Role::Control if over_quic => {
            Err("control connections are TCP; QUIC carries data streams only".into())
        }
        Role::Control if shared.config.require_encryption && !encrypted => {
            Err("this receiver serves only encrypted sessions: use xfer send --encrypt".into())
        }
        Role::Control if shared.config.require_integrity && !encrypted && !asked.sealed => Err(
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
    let failed = match proven {
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
                served: &shared.served[tenant],
                agreed: &agreed,
                encrypted,
                sealed,
                connection: connection.try_clone().ok(),
            };
            run_control(shared, &mut reader, &mut writer, control);
            shared.sessions_ended.fetch_add(1, Ordering::AcqRel);
            false
        }
        Ok((_, _)) => match joined.and_then(|id| find_session(shared, &id)) {
            Some(session) => run_data(
                shared,
                &session,
                &mut reader,
                &mut writer,
                &connection,
                peer,
            ),
            None => {
                refuse(shared, &mut writer, peer, "the session has ended".into());
                false
            }
        },
        Err(e) => {
            refused(shared, peer, e.to_string());
            false
        }
    };
    close_after_reply(&connection, writer.get_mut(), failed);
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
struct ControlPeer<'a> {
    peer: SocketAddr,
    /// The key it proved: the receiver's own or a tenant's.
    served: &'a Served,
    /// What its key handshake agreed, which its session's key is derived from.
    agreed: &'a auth::Agreed,
    /// Whether it is TLS.
    encrypted: bool,
    /// Whether its frames are sealed ([`crate::seal`]).
    sealed: bool,
    /// Another handle to the connection, to close it from elsewhere.
    connection: Option<Connection>,
}

fn run_control(
    shared: &Shared,
    reader: &mut ConnFrames,
    writer: &mut FrameWriter<LinkWriter>,
    control: ControlPeer,
) {
    let config = &shared.config;
    let peer = control.peer;
    if shared.stop.is_stopping() {
        return refuse_over(shared, writer, peer, Limit::ShuttingDown);
    }
    let Some(_slot) = Slot::take(&shared.sessions_open, config.max_sessions) else {
        let max = config.max_sessions as u64;
        return refuse_over(shared, writer, peer, Limit::Sessions { max });
    };
    let served = control.served;
    let Some(_tenant_slot) = Slot::take(&served.sessions_open, served.max_sessions) else {
        let max = served.max_sessions as u64;
        return refuse_over(shared, writer, peer, Limit::TenantSessions { max });
    };
    let id = random_bytes::<16>();
    let name = SessionId(id).short();
    let limits = served.limits;
    if let Err(e) = wire::write_message(
        writer,
        &Message::Welcome {
            session: id,
            limits,
        },
    ) {
        return tracing::warn!("session {name} from {peer}: {e}");
    }
    heartbeat::with_heartbeat(writer, |writer| {
        serve_session(shared, reader, writer, control, id)
    })
}

/// A control connection from `Welcome` on: where the files go, then the manifest's batches
/// (each answered by its plan) and the files' seals until the session finishes or fails.
fn serve_session(
    shared: &Shared,
    reader: &mut ConnFrames,
    writer: &mut impl FrameWrite,
    control: ControlPeer,
    id: [u8; 16],
) {
    let config = &shared.config;
    let peer = control.peer;
    let name = SessionId(id).short();
    reader.set_message_limit(config.max_manifest);
    let (dest, sink) = match reader.read_message() {
        Ok(Message::Start { dest, sink }) => (dest, sink),
        Ok(other) => {
            return refuse(
                shared,
                writer,
                peer,
                format!("expected Start, got {}", auth::name(&other)),
            )
        }
        Err(e) => return tracing::warn!("session {name} from {peer}: {e}"),
    };
    let started = Instant::now();
    let dest_shown = String::from_utf8_lossy(&dest).into_owned();
    let served = control.served;
    let placement = Placement {
        root: &served.root,
        dest: &dest,
        owner: id,
        active: &served.active,
        max_unsealed: config.max_unsealed,
        budget: &shared.unsealed,
        direct_io: config.direct_io,
    };
    let dest = match Destination::open(placement, sink) {
        Ok(dest) => dest,
        Err(e) => return refuse(shared, writer, peer, e.to_string()),
    };
    let tenant = served.name.clone();
    tracing::info!(session = %name, tenant, %peer, dest = %dest_shown, "session started");
    shared.events.publish(ReceiverEvent::SessionStarted {
        session: SessionId(id),
        tenant: tenant.clone(),
        peer,
        dest: dest_shown.clone(),
    });
    let open = telemetry::Open::receiver_session();
    let session = Arc::new(Session {
        id,
        key: served.key.for_session(control.agreed, &id),
        limits: served.limits,
        name,
        encrypted: control.encrypted,
        sealed: control.sealed,
        dest,
        activity: Activity::new(),
        streams: AtomicU32::new(0),
        bytes_received: AtomicU64::new(0),
        failure: Mutex::new(None),
        ended_by_receiver: Default::default(),
        connections: Mutex::new(Some(Vec::new())),
        control: control.connection,
    });
    shared
        .sessions
        .lock()
        .expect("sessions lock")
        .insert(id, session.clone());
    // From now on the sender's address has places of its own for its streams' handshakes.
    let _known = shared.admission.session_from(peer.ip());
    let mut announced = ManifestSoFar::default();
    let outcome = serve_control_messages(shared, &session, reader, writer, &mut announced);
    shared.sessions.lock().expect("sessions lock").remove(&id);
    if let Some(quic) = &shared.quic {
        quic.remove_session(&id);
    }
    let connections = session.connections.lock().expect("connections lock").take();
    for connection in connections.into_iter().flatten() {
        connection.shutdown();
    }
    let report = SessionReport {
        session: SessionId(id),
        tenant,
        peer,
        dest: dest_shown,
        files_announced: announced.files,
        bytes_announced: announced.bytes,
        files_placed: announced.placed,
        bytes_received: session.bytes_received.load(Ordering::Acquire),
        seconds: started.elapsed().as_secs_f64(),
        outcome: session.outcome(outcome),
    };
    drop(open);
    telemetry::receiver_session_ended(&report.outcome);
    let (name, files, bytes, seconds) = (
        &session.name,
        report.files_announced,
        report.bytes_received,
        report.seconds,
    );
    match &report.outcome {
        SessionOutcome::Completed => {
            tracing::info!(session = %name, %peer, files, bytes, seconds, "session complete")
        }
        error => tracing::warn!(
            session = %name, %peer, files_announced = files, bytes, seconds, %error,
            "session ended early"
        ),
    }
    shared.events.publish(ReceiverEvent::SessionEnded(report));
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

/// What a session's manifest announced so far, and how many of its files are in place.
#[derive(Default)]
struct ManifestSoFar {
    files: u64,
    bytes: u64,
    placed: u64,
    /// The batch that said `last` came.
    complete: bool,
}

fn serve_control_messages(
    shared: &Shared,
    session: &Session,
    reader: &mut ConnFrames,
    writer: &mut impl FrameWrite,
    announced: &mut ManifestSoFar,
) -> Result<(), SessionOutcome> {
    let lost = |e: &dyn std::fmt::Display| SessionOutcome::Disconnected(e.to_string());
    let failed = |e: &dyn std::fmt::Display| SessionOutcome::Failed(e.to_string());
    let wire_error = |e: WireError| match e {
        WireError::Io(_) => lost(&e),
        _ => failed(&e),
    };
    reader
        .get_mut()
        .get_mut()
        .source_mut()
        .watch_session(session.activity.clone(), shared.config.idle_timeout)
        .map_err(|e| lost(&e))?;
    loop {
        let message = match reader.read_message() {
            Ok(message) => message,
            Err(e @ WireError::Io(_)) => return Err(lost(&e)),
            Err(e) => {
                // A frame damaged, forged or malformed: the sender is told why before the
                // connection closes.
                let error = Message::Error {
                    message: e.to_string(),
                };
                let _ = wire::write_message(writer, &error);
                return Err(failed(&e));
            }
        };
        match message {
            Message::Entries(batch) => {
                if announced.complete {
                    return Err(failed(&"a batch of the manifest after its last"));
                }
                let result = {
                    let _busy = session.activity.busy();
                    session.dest.add_batch(&batch)
                };
                let reply = match &result {
                    Ok((first, files)) => Message::Plan {
                        first: *first,
                        files: files.clone(),
                        last: batch.last,
                    },
                    Err(e) => Message::Refused {
                        reason: e.to_string(),
                    },
                };
                wire::write_message(writer, &reply).map_err(wire_error)?;
                result.map_err(|e| failed(&e))?;
                announced.files += batch.files.len() as u64;
                announced.bytes = announced.bytes.saturating_add(batch.total_bytes());
                announced.complete = batch.last;
            }
            Message::Seal { file, blake3 } => {
                let result = {
                    let _busy = session.activity.busy();
                    session.dest.seal(file, blake3)
                };
                let error = result.as_ref().err().map(ToString::to_string);
                if result.is_ok() {
                    announced.placed += 1;
                }
                wire::write_message(
                    writer,
                    &Message::Finalized {
                        file,
                        error: error.clone(),
                    },
                )
                .map_err(wire_error)?;
                if let Err(DestinationError::Protocol(e)) = result {
                    return Err(failed(&e));
                }
            }
            Message::QuicRequest => {
                let offer = offer_quic(shared, session);
                let reply = match &offer {
                    Ok(certificate) => Message::QuicOffer {
                        certificate: *certificate,
                    },
                    Err(reason) => Message::Refused {
                        reason: reason.clone(),
                    },
                };
                wire::write_message(writer, &reply).map_err(wire_error)?;
                offer.map_err(|e| failed(&e))?;
            }
            Message::Finish => {
                let finished = {
                    let _busy = session.activity.busy();
                    session.dest.finish()
                };
                let reply = match &finished {
                    Ok(()) => Message::Done,
                    Err(e) => Message::Error {
                        message: e.to_string(),
                    },
                };
                wire::write_message(writer, &reply).map_err(wire_error)?;
                return finished.map_err(|e| failed(&e));
            }
            other => {
                return Err(failed(&format_args!(
                    "unexpected {} on the control connection",
                    auth::name(&other)
                )))
            }
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

/// Serves a data stream until it ends; whether it failed the session (an error reply was
/// sent and the peer may still be sending).
fn run_data(
    shared: &Shared,
    session: &Session,
    reader: &mut ConnFrames,
    writer: &mut FrameWriter<LinkWriter>,
    connection: &Connection,
    peer: SocketAddr,
) -> bool {
    let limits = session.limits;
    if session.streams.fetch_add(1, Ordering::AcqRel) >= limits.max_streams {
        session.streams.fetch_sub(1, Ordering::AcqRel);
        refuse(
            shared,
            writer,
            peer,
            format!("a session may open at most {} streams", limits.max_streams),
        );
        return false;
    }
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
        session.streams.fetch_sub(1, Ordering::AcqRel);
        refuse(shared, writer, peer, "the session has ended".into());
        return false;
    }
    let _open = telemetry::Open::receiver_stream();
    let result = wire::write_message(
        writer,
        &Message::Welcome {
            session: session.id,
            limits,
        },
    )
    .map_err(|e| StreamEnd::Closed(e.to_string()))
    .and_then(|()| {
        let conn = reader.get_mut().get_mut().source_mut();
        conn.watch_session(session.activity.clone(), shared.config.idle_timeout)
            .and_then(|()| conn.start_batching())
            .map_err(|e| StreamEnd::Closed(e.to_string()))
    })
    .and_then(|()| receive_chunks(session, reader, writer));
    session.streams.fetch_sub(1, Ordering::AcqRel);
    match result {
        Ok(()) => false,
        Err(StreamEnd::Closed(e)) => {
            tracing::debug!("session {}: stream from {peer} closed: {e}", session.name);
            false
        }
        Err(StreamEnd::Failed(e)) => {
            tracing::warn!(
                "session {}: stream from {peer} failed the session: {e}",
                session.name
            );
            true
        }
    }
}

/// Closes a connection once the peer has had the chance to read the last reply. After an error
/// reply (`failed`) a TCP peer may still be sending: its data is read and discarded for a
/// bounded time, so its blocked write completes and it reads the error instead of hanging (or
/// losing the error to a reset). A QUIC connection's stream is finished and the peer, which
/// closes the connection once it has read the last reply, is given as long to do so (closing
/// first would discard what it has not received).
fn close_after_reply(connection: &Connection, writer: &mut LinkWriter, failed: bool) {
    match (connection, writer) {
        (Connection::Quic(quic), LinkWriter::Quic(stream)) => {
            stream.finish();
            quic.wait_closed(LINGER);
        }
        (Connection::Tcp(socket), _) if failed => drain_before_close(socket),
        _ => {}
    }
    connection.shutdown();
}

/// Why a data stream ended early.
enum StreamEnd {
    /// The connection closed or broke; the session may go on with other streams.
    Closed(String),
    /// The peer broke a rule or the receiver failed: the session cannot go on.
    Failed(String),
}

/// Half-closes, then reads and discards what the peer is still sending, for at most [`LINGER`].
fn drain_before_close(mut socket: &TcpStream) {
    let _ = socket.shutdown(std::net::Shutdown::Write);
    if socket.set_read_timeout(Some(LINGER)).is_err() {
        return;
    }
    let deadline = Instant::now() + LINGER;
    let mut sink = vec![0u8; 256 << 10];
    while Instant::now() < deadline {
        match std::io::Read::read(&mut socket, &mut sink) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Verifies, writes and acknowledges chunks until the sender ends the stream.
///
/// Replies wait in a buffer while chunks that have arrived whole are handled, and go out before
/// the stream waits for more: a run of small files costs one write, not one per file, and no
/// reply waits for a chunk that is still arriving (the sender closes a stream whose answers
/// stop coming).
fn receive_chunks(
    session: &Session,
    reader: &mut ConnFrames,
    writer: &mut FrameWriter<LinkWriter>,
) -> Result<(), StreamEnd> {
    let closed = |e: std::io::Error| StreamEnd::Closed(e.to_string());
    let mut writer = BufWriter::with_capacity(REPLY_BUFFER, writer);
    let mut aligned = AlignedBuffer::default();
    let fail = |writer: &mut BufWriter<&mut FrameWriter<LinkWriter>>, message: String| {
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
        Err(StreamEnd::Failed(message))
    };
    loop {
        // Before a read that may wait for the peer, which may be waiting for these replies.
        if !reader.next_frame_buffered() {
            writer.flush().map_err(closed)?;
        }
        let reply = match reader.read_head() {
            Ok(Head::Chunk(header, len)) => {
                // Bound first: a guard in the `if let` would be held through `fail`, which
                // locks again.
                let failed = session.failure.lock().expect("failure lock").clone();
                if let Some(message) = failed {
                    return fail(&mut writer, message);
                }
                let verified = match receive_chunk(session, reader, &mut aligned, &header, len) {
                    Ok(verified) => verified,
                    Err(ChunkError::Wire(e)) => {
                        let _ = writer.flush();
                        return Err(StreamEnd::Closed(e.to_string()));
                    }
                    Err(ChunkError::Destination(e)) => return fail(&mut writer, e.to_string()),
                };
                if verified {
                    telemetry::receiver_wrote(len as u64);
                    session
                        .bytes_received
                        .fetch_add(len as u64, Ordering::Relaxed);
                    Message::Ack {
                        file: header.file,
                        offset: header.offset,
                        len: len as u32,
                    }
                } else {
                    Message::Nack {
                        file: header.file,
                        offset: header.offset,
                    }
                }
            }
            Ok(Head::Message(Message::EndOfStream)) => {
                wire::write_message(&mut writer, &Message::EndOfStream)
                    .map_err(|e| StreamEnd::Closed(e.to_string()))?;
                return writer.flush().map_err(closed);
            }
            Ok(Head::Message(other)) => {
                return fail(
                    &mut writer,
                    format!("unexpected {} on a data stream", auth::name(&other)),
                )
            }
            Err(e @ (WireError::Oversized { .. } | WireError::Malformed(_))) => {
                return fail(&mut writer, e.to_string())
            }
            Err(e) => {
                // What was verified and written is acknowledged, whatever broke after it.
                let _ = writer.flush();
                return Err(StreamEnd::Closed(e.to_string()));
            }
        };
        wire::write_message(&mut writer, &reply).map_err(|e| StreamEnd::Closed(e.to_string()))?;
    }
}

/// How receiving one chunk's payload failed.
enum ChunkError {
    /// The connection broke while the payload arrived.
    Wire(WireError),
    /// The destination refused or failed to write it.
    Destination(DestinationError),
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

/// What the receiver does with a peer's manifest before any data: the destination checked and
/// made under `root`, then each batch in turn: every path checked, the directories made, the
/// resume plan read from what is there. Stops at the first refusal.
#[cfg(feature = "fuzzing")]
pub(crate) fn prepare_for_fuzzing(
    root: &Path,
    dest: &[u8],
    batches: &[crate::manifest::ManifestBatch],
) -> Result<(), String> {
    let active = Arc::default();
    let placement = Placement {
        root,
        dest,
        owner: [0; 16],
        active: &active,
        max_unsealed: 1 << 10,
        budget: &Budget::new(1 << 10),
        direct_io: false,
    };
    let destination = Destination::open(placement, crate::manifest::SinkKind::Files)
        .map_err(|e| e.to_string())?;
    for batch in batches {
        batch.total_bytes();
        destination.add_batch(batch).map_err(|e| e.to_string())?;
    }
    Ok(())
}
