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
mod fetch_task;
mod file_tree;
mod grants;
mod handshake;
mod lingering;
mod mirror;
mod options;
mod quic_task;
mod refusal_log;
mod settings;
mod shutdown;
#[cfg(feature = "fuzzing")]
pub(crate) use control_task::control_for_fuzzing;
#[cfg(feature = "fuzzing")]
pub(crate) use fetch_task::fetch_for_fuzzing;
mod stream_task;
mod tcp_task;
mod tenant;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use admission::{Admission, Place};
use announced::Budget;
use data::End;
pub use destination::check_root_writable;
use destination::{ActivePaths, Destination};
use events::Publisher;
pub use events::{ReceiverEvent, ReceiverEvents, SessionOutcome, SessionReport};
use grants::Grants;
use lingering::{Lingering, LINGER};
pub use options::{
    ReceiverOptions, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CHUNK,
    DEFAULT_MAX_HANDSHAKES, DEFAULT_MAX_HANDSHAKES_PER_SOURCE, DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_STREAMS, DEFAULT_SESSION_MEMORY,
};
use refusal_log::RefusalLog;
pub use settings::ReceiverSettings;
pub use shutdown::Stopper;
use shutdown::{Stage, StopState, STOPPING};
use stream_task::OpenStream;
use tenant::Served;
pub use tenant::{Access, Tenant};

use crate::auth::{self, KeyId, SessionKey};
use crate::idle::Activity;
use crate::link::Connection;
use crate::quic::QuicServer;
use crate::runtime::OwnedRuntime;
use crate::seal::FrameWrite;
use crate::sync::unpoisoned;
use crate::telemetry;
use crate::tls::ServerIdentity;
use crate::transport::{self, Transport};
use crate::wire::{self, Limit, Message, Role, SessionLimits};

/// Replies a data stream holds back while it handles chunks that have already arrived.
const REPLY_BUFFER: usize = 16 << 10;
/// The most threads that run work which may block for the runtime's tasks at once: control
/// messages' handling (a large file's BLAKE3, the final flush) and writes from memory.
const BLOCKING_THREADS: usize = 16;

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
        unpoisoned(self.failure.lock()).get_or_insert_with(|| reason.to_string());
    }

    /// The receiver ends the session for `reason`, which its streams tell the sender at their
    /// next chunk.
    fn end(&self, reason: &str) {
        self.ended_by_receiver.store(true, Ordering::Release);
        self.fail(reason);
    }

    /// Closes every connection of the session.
    fn close(&self) {
        if let Some(connections) = &*unpoisoned(self.connections.lock()) {
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
    /// One-time credentials waiting for their sessions (third-party transfers).
    grants: Grants,
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
    /// The runtime that serves every connection once its handshake is done, and QUIC
    /// connections from their start ([`task_io`]).
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
    /// Held for its drop, which stops the connections' runtime: a worker per core and at
    /// most [`BLOCKING_THREADS`] more.
    _streams: OwnedRuntime,
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
        let streams = OwnedRuntime::start("xfer-recv", BLOCKING_THREADS).map_err(|e| {
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
        let quic = match (transport, options.quic) {
            (Transport::Quic, _) | (_, true) => {
                let udp = (listener.local_addr())
                    .and_then(|addr| QuicServer::bind(addr, streams.handle()));
                match udp {
                    Ok(server) => Some(server),
                    Err(error) if transport == Transport::Quic => {
                        return Err(ReceiverError::Bind {
                            addr: format!("{addr} (UDP, for QUIC)"),
                            error,
                        })
                    }
                    Err(error) => {
                        tracing::warn!("not serving QUIC: cannot bind {addr} over UDP: {error}");
                        None
                    }
                }
            }
            (_, false) => None,
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
                grants: Grants::default(),
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
            _streams: streams,
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

    /// Whether QUIC senders are served too, on the UDP port of the same number
    /// ([`ReceiverOptions::quic`]).
    ///
    /// ```
    /// use transfer::auth::SessionKey;
    /// use transfer::receiver::{Receiver, ReceiverSettings};
    ///
    /// let root = tempfile::tempdir()?;
    /// let settings = ReceiverSettings::new(root.path().into(), SessionKey::generate().1);
    /// let receiver = Receiver::bind(&settings.listen("127.0.0.1:0"))?;
    /// assert!(receiver.serves_quic(), "by default, where the UDP port is free");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn serves_quic(&self) -> bool {
        self.shared.quic.is_some()
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
        let _accepting_quic = quic_task::accept(&self.shared);
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
                    Ok(admitted) => tcp_task::start(&self.shared, stream, peer, admitted),
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
            for session in unpoisoned(self.sessions.lock()).values() {
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
    place: Place,
}

impl Admitted {
    /// Notes a handshake that reached its deadline: its address becomes suspect
    /// ([`admission`]).
    fn timed_out(&mut self) {
        self.place.timed_out();
    }
}

impl Shared {
    /// Admits a new connection from `peer` to its handshake, or the limit that refuses it.
    fn admit(&self, peer: SocketAddr) -> Result<Admitted, Limit> {
        Ok(Admitted {
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

/// What a connection proves in its key handshake: that it is a session's control connection,
/// holding the receiver's own key or a tenant's ([`Shared::served`]) or a one-time credential
/// one of them granted ([`Shared::grants`]), or a data stream of a running session.
enum Proves {
    Control { tenant: usize },
    Granted { credential: KeyId },
    Data { session: [u8; 16] },
}

/// The key a client's `Hello` (`asked`) must prove on a connection carried over QUIC or not,
/// encrypted or not, and what it will have proven; or why it is refused.
fn key_for(
    shared: &Shared,
    asked: &auth::Asked,
    over_quic: bool,
    encrypted: bool,
) -> Result<(SessionKey, Proves), String> {
    match &asked.role {
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
            if let Some(tenant) = shared.served.iter().position(|s| s.id == asked.key) {
                let key = shared.served[tenant].key.clone();
                return Ok((key, Proves::Control { tenant }));
            }
            if let Some(key) = shared.grants.key(&asked.key, Instant::now()) {
                return Ok((
                    key,
                    Proves::Granted {
                        credential: asked.key,
                    },
                ));
            }
            // A key nobody here holds is answered with the receiver's own: the sender finds
            // the proof wrong and says so, and nobody learns which keys are served.
            Ok((shared.served[0].key.clone(), Proves::Control { tenant: 0 }))
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
            let id = session.id;
            Ok((session.key.clone(), Proves::Data { session: id }))
        }
    }
}

/// The running session with this id.
fn find_session(shared: &Shared, id: &[u8; 16]) -> Option<Arc<Session>> {
    unpoisoned(shared.sessions.lock()).get(id).cloned()
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

impl Session {
    /// How the session ended, given how its control connection did: a session the receiver
    /// ended, or one a stream failed (after which the sender gives up), ends for that reason.
    fn outcome(&self, control: Result<(), SessionOutcome>) -> SessionOutcome {
        let failure = unpoisoned(self.failure.lock()).clone();
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
            "this receiver does not serve QUIC (it was started with --no-quic, or could not \
             bind its UDP port: its log says which)"
                .into(),
        );
    };
    if !session.encrypted {
        return Err("QUIC sessions need an encrypted (TLS) control connection".into());
    }
    quic.add_session(&session.id)
        .map_err(|e| format!("cannot serve QUIC: {e}"))
}

/// Admits a data stream of `session` from `peer` that proved its key, on the connection
/// `handle` is a handle of: counted among the session's streams, registered to be closed with
/// the session, and `Welcome` written to `writer`. Refused (the reason written to `writer`)
/// when the session has its most streams or has ended.
fn admit_stream(
    shared: &Shared,
    session: &Arc<Session>,
    writer: &mut impl FrameWrite,
    peer: SocketAddr,
    handle: Connection,
) -> Option<OpenStream> {
    let limits = session.limits;
    if session.streams.fetch_add(1, Ordering::AcqRel) >= limits.max_streams {
        session.streams.fetch_sub(1, Ordering::AcqRel);
        let reason = format!("a session may open at most {} streams", limits.max_streams);
        refuse(shared, writer, peer, reason);
        return None;
    }
    let open = OpenStream::new(session.clone());
    let mut connections = unpoisoned(session.connections.lock());
    let registered = match connections.as_mut() {
        Some(connections) => {
            connections.push(handle);
            true
        }
        None => false,
    };
    drop(connections);
    if !registered {
        drop(open);
        refuse(shared, writer, peer, "the session has ended".into());
        return None;
    }
    let welcome = Message::Welcome {
        session: session.id,
        limits,
    };
    if let Err(e) = wire::write_message(writer, &welcome) {
        drop(open);
        stream_ended(session, peer, End::Closed(e.to_string()));
        return None;
    }
    Some(open)
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::sender::{SendOptions, SendSource, Transfer};

    /// Sessions are registered in one map that every session shares: a thread that panicked
    /// holding it (a bug in one session) fails none of the sessions after it, each of which
    /// is registered, served and taken out again.
    #[test]
    fn a_panic_holding_the_sessions_fails_no_later_session() {
        let root = tempfile::tempdir().unwrap();
        let (key_text, key) = auth::SessionKey::generate();
        let settings = ReceiverSettings::new(root.path().into(), key).listen("127.0.0.1:0");
        let receiver = Arc::new(Receiver::bind(&settings).unwrap());
        let addr = receiver.local_addr().unwrap().to_string();
        crate::sync::panic_holding(|| receiver.shared.sessions.lock());
        // Not joined: a receiver that fails its sessions would wait for them forever.
        let serving = receiver.clone();
        std::thread::spawn(move || serving.serve(None));
        let src = tempfile::tempdir().unwrap();
        for n in 0..2u8 {
            let file = src.path().join(format!("file-{n}"));
            std::fs::write(&file, vec![n; 3 << 20]).unwrap();
            let source = SendSource::Paths {
                paths: vec![file],
                destination: PathBuf::new(),
            };
            let key = auth::SessionKey::from_text(&key_text).unwrap();
            let options = SendOptions::default().streams(2).unit_size(1 << 20);
            Transfer::start(&addr, key, source, options)
                .and_then(|transfer| transfer.wait())
                .unwrap();
            let landed = std::fs::read(root.path().join(format!("file-{n}"))).unwrap();
            assert!(landed == vec![n; 3 << 20], "file-{n} differs");
        }
        // The sender is done when the receiver has placed its files; the receiver takes the
        // session out of the map just after.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !unpoisoned(receiver.shared.sessions.lock()).is_empty() {
            assert!(Instant::now() < deadline, "a session stays registered");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// QUIC is served by default, beside TCP, where the UDP port of the same number is free;
    /// where it is taken, a receiver that did not insist on QUIC serves TCP alone, and one
    /// that did (`Transport::Quic`) does not start, naming the UDP port.
    #[test]
    fn quic_is_served_by_default_where_its_udp_port_is_free() {
        let root = tempfile::tempdir().unwrap();
        let (_, key) = auth::SessionKey::generate();
        let settings = ReceiverSettings::new(root.path().into(), key);
        let free = Receiver::bind(&settings.clone().listen("127.0.0.1:0")).unwrap();
        assert!(free.serves_quic());
        let off = Receiver::bind(&ReceiverSettings {
            options: settings.options.clone().quic(false),
            ..settings.clone().listen("127.0.0.1:0")
        })
        .unwrap();
        assert!(!off.serves_quic());

        let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let listen = format!("127.0.0.1:{port}");
        let tcp_only = Receiver::bind(&settings.clone().listen(&listen)).unwrap();
        assert!(!tcp_only.serves_quic());
        drop(tcp_only);
        let insisting = ReceiverSettings {
            options: settings.options.clone().transport(Transport::Quic),
            ..settings.listen(&listen)
        };
        match Receiver::bind(&insisting) {
            Err(ReceiverError::Bind { addr, .. }) => assert!(addr.contains("UDP"), "{addr}"),
            other => panic!("{:?}", other.err()),
        }
    }
}
