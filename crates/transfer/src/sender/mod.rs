//! The sending side: a [`Transfer`] moves a manifest's files (or generated data) over a number of
//! streams (TCP, MPTCP or QUIC connections) that the caller may change at any moment with
//! [`Transfer::set_target_streams`].
//!
//! Streams pull work units (chunks of at most `unit_size` bytes) from one shared queue, so a
//! fast stream takes more of them, and at the tail an idle stream carries a copy of a
//! straggler (`work_queue.rs`). A stream being removed sends no new unit, waits for the acks of
//! what it has in flight, and closes; a stream that breaks hands its unacknowledged units back
//! to the queue. The receiver acknowledges a unit only after it verified and wrote it, and treats
//! a unit it already holds as a duplicate, so no byte is lost or written twice.
//!
//! The manifest is streamed (`manifest_stream.rs`): the sources are scanned a batch at a time
//! while data flows, each batch's files join the queue once the receiver's plan for them
//! arrives, and a file is forgotten once it is in place, so memory does not grow with the tree;
//! the queue cuts a file's missing ranges into units only as streams ask for them, so it does
//! not grow with a file's size either.

pub(crate) mod answers;
mod control;
pub(crate) mod control_session;
mod counters;
mod dialing;
mod fetch;
mod hand_out;
mod join;
mod manifest_stream;
mod meter;
mod optimize;
mod options;
mod outcome;
mod preview;
mod quic_stream;
mod rate_limit;
mod source;
mod stream;
mod stream_set;
mod unsent;
mod unsettled;
pub(crate) mod work_queue;

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use crate::auth::{self, AuthError, SessionKey};
use crate::cause::Cause;
use crate::link;
use crate::link::Connection;
use crate::manifest::{ManifestBatch, ScanError, ScannedBatch, Scanner, SinkKind};
use crate::mptcp_info::{self, Subflow};
use crate::optimizer_choice::{OptimizerError, Tuning};
use crate::quic::QuicClient;
use crate::runtime::OwnedRuntime;
use crate::seal::{FrameWrite, FrameWriter};
use crate::session_id::SessionId;
use crate::sync::unpoisoned;
use crate::tcp_info::{self, TcpInfo};
use crate::telemetry;
use crate::transport::{self, Transport};
use crate::wire::{self, FrameReader, Limit, Message, PresentFiles, Removal, Role, WireError};
use control_session::{Action, Announced, Planner};
use counters::Counters;
use dialing::Dialing;
pub use fetch::{fetch, grant, FetchCanceller, FetchReport, FetchRequest, Fetching};
use hand_out::HandOut;
pub use meter::PathStats;
pub use optimize::MiRecord;
use optimize::HISTORY;
use optimizer::{Controller, SignalTracker, UtilityParams};
pub use options::{
    SendOptions, DEFAULT_STALL_TIMEOUT, DEFAULT_STREAMS, DEFAULT_UNIT_SIZE, DEFAULT_UNSENT_LIMIT,
    MIN_STALL_TIMEOUT,
};
use outcome::Outcome;
pub use preview::{preview, Preview, PreviewAction, PreviewFile};
pub use rate_limit::{RateSchedule, RateStep};
use serde::{Deserialize, Serialize};
use source::SourceData;
use stream::StreamHandle;
use stream_set::StreamSet;
use unsettled::UnsettledFiles;
use work_queue::Unit;

/// How long connecting one TCP connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Streams that may break mid-transfer (and be replaced) before the transfer gives up.
const MAX_STREAM_FAILURES: u32 = 32;

/// What to send: files and directory trees, or generated data. In a configuration file
/// `{ paths = ["PATH", ...], destination = "DIR" }` (the destination may be left out) or
/// `{ memory = BYTES }`.
///
/// ```
/// use transfer::sender::SendSource;
///
/// let trees = SendSource::Paths {
///     paths: vec!["/data/run42".into(), "/data/calibration.h5".into()],
///     destination: "incoming".into(),
/// };
/// let read: SendSource = toml::from_str(r#"
///     paths = ["/data/run42", "/data/calibration.h5"]
///     destination = "incoming"
/// "#)?;
/// assert_eq!(read, trees);
/// let probe: SendSource = toml::from_str("memory = 10_000_000_000")?;
/// assert_eq!(probe, SendSource::Memory { size: 10_000_000_000 });
///
/// let both = toml::from_str::<SendSource>("memory = 1000\npaths = [\"/data\"]").unwrap_err();
/// assert!(both.to_string().contains("either paths or memory"), "{both}");
/// # Ok::<(), toml::de::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "SourceFields", into = "SourceFields")]
#[non_exhaustive]
pub enum SendSource {
    /// Files and directory trees, each landing under its own name in `destination`.
    Paths {
        /// Local files and directories.
        paths: Vec<PathBuf>,
        /// Directory under the receiver's root they land in (empty: the root).
        destination: PathBuf,
    },
    /// `size` bytes of generated data to a discarding sink (memory-to-memory benchmark).
    Memory {
        /// Bytes to send.
        size: u64,
    },
}

/// [`SendSource`] as a configuration file writes it: one table whose fields say which kind.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceFields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    paths: Option<Vec<PathBuf>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    destination: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    memory: Option<u64>,
}

impl SendSource {
    /// Refuses a source that names nothing to send.
    pub(crate) fn check(&self) -> Result<(), SendError> {
        match self {
            SendSource::Paths { paths, .. } if paths.is_empty() => Err(SendError::Settings(
                "nothing to send: the source names no path".into(),
            )),
            _ => Ok(()),
        }
    }
}

impl TryFrom<SourceFields> for SendSource {
    type Error = String;

    fn try_from(fields: SourceFields) -> Result<Self, String> {
        match fields {
            SourceFields {
                paths: Some(paths),
                destination,
                memory: None,
            } => Ok(SendSource::Paths {
                paths,
                destination: destination.unwrap_or_default(),
            }),
            SourceFields {
                paths: None,
                destination: Some(_),
                memory: Some(_),
            } => Err(
                "generated data (memory) goes to a discarding sink; a destination makes no sense"
                    .into(),
            ),
            SourceFields {
                paths: None,
                memory: Some(size),
                ..
            } => Ok(SendSource::Memory { size }),
            _ => Err(
                "a source names either paths or memory, not both or neither: e.g. \
                 { paths = [\"/data/run42\"], destination = \"incoming\" } or \
                 { memory = 1000000000 }"
                    .into(),
            ),
        }
    }
}

impl From<SendSource> for SourceFields {
    fn from(source: SendSource) -> Self {
        match source {
            SendSource::Paths { paths, destination } => SourceFields {
                paths: Some(paths),
                destination: (!destination.as_os_str().is_empty()).then_some(destination),
                memory: None,
            },
            SendSource::Memory { size } => SourceFields {
                paths: None,
                destination: None,
                memory: Some(size),
            },
        }
    }
}

/// Why a transfer failed. The variants name what a service acts on: which file
/// ([`SendError::Source`], [`SendError::SourceChanged`], [`SendError::Receiver`]), which
/// receiver ([`SendError::Connect`], [`SendError::Connection`], [`SendError::Limited`]) and
/// which limit ([`SendError::Limited`], [`SendError::TooManyFiles`]). A variant's text says
/// what failed; where an error lies behind it, that is its `source()` (a [`Cause`], which
/// keeps the error itself): print the chain, as [`Cause`] shows.
///
/// ```
/// use transfer::sender::SendError;
/// use transfer::wire::Limit;
///
/// /// Whether a service should queue the transfer again for later.
/// fn worth_retrying(e: &SendError) -> bool {
///     matches!(
///         e,
///         SendError::Limited { .. }
///             | SendError::Connect { .. }
///             | SendError::Connection { .. }
///             | SendError::SourceChanged { .. }
///     )
/// }
///
/// let busy = SendError::Limited {
///     addr: "dtn.example.org:9000".into(),
///     limit: Limit::Sessions { max: 32 },
/// };
/// assert!(worth_retrying(&busy));
/// assert_eq!(
///     busy.to_string(),
///     "the receiver at dtn.example.org:9000 refused the session: the receiver serves 32 \
///      sessions at once already; try again later"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The settings cannot work together.
    #[error("{0}")]
    Settings(String),
    /// A source could not be read or scanned.
    #[error("cannot read source {path}")]
    Source {
        /// The file or directory, as given or found under a given directory.
        path: String,
        /// Why (the system's error).
        #[source]
        cause: Cause,
    },
    /// Two sources would land under the same name, or one has no name to land under.
    #[error("{0}")]
    Sources(String),
    /// A source file changed while it was being sent.
    #[error(
        "source file {path} changed during the transfer; run the same command again to send it \
         whole"
    )]
    SourceChanged {
        /// The file.
        path: String,
    },
    /// The sources hold more files than one transfer can carry.
    #[error("a transfer sends at most {max} files; send the sources in parts")]
    TooManyFiles {
        /// The most one transfer carries.
        max: u64,
    },
    /// The receiver's address did not resolve or accept a connection.
    #[error("cannot connect to {addr}")]
    Connect {
        /// The address.
        addr: String,
        /// Why (the system's error, or that the name has no address).
        #[source]
        cause: Cause,
    },
    /// Authentication failed or the receiver refused the key.
    #[error("the receiver at {addr} did not accept this sender")]
    Auth {
        /// The receiver's address.
        addr: String,
        /// Why: the key handshake's error ([`crate::auth::AuthError`]) or a certificate not
        /// the one announced.
        #[source]
        cause: Cause,
    },
    /// The receiver refused the session because one of its limits is reached: the same
    /// transfer may be started again later.
    #[error("the receiver at {addr} refused the session: {limit}; try again later")]
    Limited {
        /// The receiver's address.
        addr: String,
        /// Which limit.
        limit: Limit,
    },
    /// The receiver reported an error (disk full, path refused, ...); its text names the path
    /// it concerns.
    #[error("receiver: {reason}")]
    Receiver {
        /// The file it concerns (its path as sent, under the destination), when it is about
        /// one file; `None` when it is about the session.
        file: Option<String>,
        /// What the receiver said.
        reason: String,
    },
    /// The connection to the receiver broke.
    #[error("lost connection to the receiver at {addr}")]
    Connection {
        /// The receiver's address.
        addr: String,
        /// Why: the connection's error, or what was seen (silence, a closed connection, too
        /// many broken streams).
        #[source]
        cause: Cause,
    },
    /// The receiver broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The live optimiser could not be started.
    #[error("cannot start the optimizer")]
    Optimizer(
        /// Why ([`crate::optimizer_choice::OptimizerError`], or the system's error).
        #[source]
        Cause,
    ),
    /// The transfer was cancelled ([`Canceller::cancel`]). What the receiver verified stays
    /// there: the same transfer started again sends only the rest.
    #[error("the transfer was cancelled; start it again to send the rest")]
    Cancelled,
    /// The operating system refused something the transfer needs (a thread, a socket
    /// option).
    #[error("cannot {what}")]
    System {
        /// What the transfer asked for (`start a thread`, `cap the stream rate`).
        what: String,
        /// The system's error.
        #[source]
        cause: Cause,
    },
    /// A bug in xfer, or a panic in a controller of the caller's own: a thread of the
    /// transfer panicked (named, with the panic's message), and the transfer ended.
    #[error("internal error (please report it): {0}")]
    Internal(String),
}

impl From<ScanError> for SendError {
    fn from(e: ScanError) -> Self {
        match e {
            ScanError::Unreadable { path, error } => SendError::Source {
                path,
                cause: error.into(),
            },
            other => SendError::Sources(other.to_string()),
        }
    }
}

impl SendError {
    /// The system refused `what` (`start a thread`), for `error`.
    pub(crate) fn system(what: &str, error: std::io::Error) -> SendError {
        SendError::System {
            what: what.into(),
            cause: error.into(),
        }
    }

    /// A receiver's refusal as the error a sender reports.
    fn refused(reason: String) -> SendError {
        SendError::Receiver { file: None, reason }
    }
}

/// Where a transfer goes and how, as its threads read it.
#[derive(Debug)]
struct Config {
    /// The receiver's address, `HOST:PORT`, as given.
    addr: String,
    /// The receiver's session key.
    key: SessionKey,
    /// How to send.
    options: SendOptions,
}

impl Config {
    /// The connection to the receiver broke, for `cause`.
    fn lost(&self, cause: impl Into<Cause>) -> SendError {
        SendError::Connection {
            addr: self.addr.clone(),
            cause: cause.into(),
        }
    }

    /// The error for a failed read from the receiver's control connection: a read that timed
    /// out says for how long the receiver was silent.
    fn reading(&self, e: WireError) -> SendError {
        match e {
            WireError::Io(io) if is_timeout(&io) => self.lost(format!(
                "the receiver sent nothing for {} s, not even its heartbeat",
                self.options.stall_timeout.as_secs_f64()
            )),
            WireError::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
                self.lost("the connection closed (if the receiver closed it, its log says why)")
            }
            other => self.lost(other),
        }
    }

    /// What a failed key handshake with the receiver means for the transfer.
    fn handshake_failed(&self, e: AuthError) -> SendError {
        match e {
            AuthError::Wire(w @ WireError::Io(_)) => self.lost(w),
            AuthError::Wire(w) => SendError::Protocol(w.to_string()),
            AuthError::Protocol(p) => SendError::Protocol(p),
            AuthError::Refused(r) => SendError::refused(r),
            AuthError::Limited(limit) => SendError::Limited {
                addr: self.addr.clone(),
                limit,
            },
            other => SendError::Auth {
                addr: self.addr.clone(),
                cause: Cause::new(other),
            },
        }
    }
}

/// Whether a read failed because its timeout passed.
fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// A snapshot of a transfer's progress.
///
/// ```
/// use std::time::Duration;
/// use transfer::sender::Progress;
///
/// /// Seconds left at the rate so far, once there is a rate.
/// fn eta(p: &Progress) -> Option<f64> {
///     let rate = p.bytes_acked as f64 / p.elapsed.as_secs_f64();
///     (rate > 0.0).then(|| (p.bytes_total - p.bytes_acked) as f64 / rate)
/// }
/// let p = Progress {
///     elapsed: Duration::from_secs(10),
///     bytes_total: 100 << 30,
///     bytes_acked: 25 << 30,
///     ..Progress::default()
/// };
/// assert_eq!(eta(&p), Some(30.0));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Time since the transfer started.
    pub elapsed: Duration,
    /// Bytes this run has to send, of the files planned so far (it grows while the manifest is
    /// scanned).
    pub bytes_total: u64,
    /// Bytes the receiver already had (resumed or complete files).
    pub bytes_skipped: u64,
    /// Bytes acknowledged (verified and written by the receiver).
    pub bytes_acked: u64,
    /// Bytes handed to the sockets.
    pub bytes_sent: u64,
    /// Files announced so far (it grows while the manifest is scanned).
    pub files_total: u64,
    /// Files in place under their final names.
    pub files_done: u64,
    /// Streams open or opening, not counting those being removed.
    pub streams_active: usize,
    /// Stream count the caller asked for.
    pub streams_target: usize,
}

/// Statistics of one open stream.
///
/// ```
/// use transfer::sender::{SendOptions, SendSource, Transfer};
///
/// # let root = tempfile::tempdir()?;
/// # let (key_text, key) = transfer::auth::SessionKey::generate();
/// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
/// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
/// # let addr = receiver.local_addr()?.to_string();
/// # std::thread::spawn(move || receiver.serve(None));
/// let options = SendOptions::default().streams(2);
/// let transfer = Transfer::start(&addr, key, SendSource::Memory { size: 64 << 20 }, options)?;
/// for sample in transfer.sample_streams() {
///     println!("stream {}: RTT {} us, {} retransmitted", sample.stream, sample.tcp.rtt_us, sample.tcp.total_retrans);
/// }
/// transfer.wait()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamSample {
    /// Stream number within the transfer (1, 2, ...).
    pub stream: u64,
    /// The stream is being removed: it sends no new unit and closes once its units are acked.
    pub retiring: bool,
    /// Kernel counters (of an MPTCP stream: of its first subflow; of a QUIC stream: its
    /// connection's path statistics in the same fields, see `QuicConnection::sample`).
    pub tcp: TcpInfo,
    /// An MPTCP stream's subflows, one per path in use; empty for TCP and QUIC.
    pub subflows: Vec<Subflow>,
}

/// The result of a finished transfer.
///
/// ```
/// # use transfer::sender::{SendOptions, SendSource, Transfer};
/// # let root = tempfile::tempdir()?;
/// # let (key_text, key) = transfer::auth::SessionKey::generate();
/// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
/// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
/// # let addr = receiver.local_addr()?.to_string();
/// # std::thread::spawn(move || receiver.serve(None));
/// # let options = SendOptions::default().streams(2);
/// let summary = Transfer::start(&addr, key, SendSource::Memory { size: 8 << 20 }, options)?.wait()?;
/// println!(
///     "session {}: {} bytes in {:.2} s over {}, {} retransmitted segments",
///     summary.session, summary.bytes, summary.seconds, summary.transport, summary.retransmits
/// );
/// assert_eq!(summary.streams_timeline[0].1, 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The session's id, as the receiver reports it ([`crate::receiver::SessionReport`]).
    pub session: SessionId,
    /// Bytes acknowledged in this run.
    pub bytes: u64,
    /// Bytes the receiver already had.
    pub bytes_skipped: u64,
    /// Files in the manifest.
    pub files: u64,
    /// Wall time of the transfer in seconds.
    pub seconds: f64,
    /// `(seconds since start, active streams)` at each change of the stream count.
    pub streams_timeline: Vec<(f64, usize)>,
    /// TCP segments retransmitted over all streams.
    pub retransmits: u64,
    /// The transport the streams used.
    pub transport: Transport,
    /// What the receiver removed because the sources do not hold it
    /// ([`SendOptions::delete`]); empty without it.
    pub removed: Removal,
    /// The files the receiver held that were compared by content ([`SendOptions::checksum`]);
    /// none without it.
    #[serde(default)]
    pub compared: Compared,
}

/// The files of a transfer compared by content ([`Summary::compared`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compared {
    /// Files the receiver held at the source's size, hashed on both sides.
    pub files: u64,
    /// Of those, the files whose content differed, which were sent.
    pub changed: u64,
}

impl Summary {
    /// Mean goodput in Gbit/s.
    ///
    /// ```
    /// use transfer::sender::Summary;
    /// use transfer::session_id::SessionId;
    /// use transfer::transport::Transport;
    ///
    /// let summary = Summary {
    ///     session: SessionId([1; 16]),
    ///     bytes: 10_000_000_000,
    ///     bytes_skipped: 0,
    ///     files: 1,
    ///     seconds: 8.0,
    ///     streams_timeline: vec![(0.0, 4), (1.0, 9)],
    ///     retransmits: 0,
    ///     transport: Transport::Tcp,
    ///     removed: Default::default(),
    ///     compared: Default::default(),
    /// };
    /// assert_eq!(summary.gbit_per_s(), 10.0);
    /// ```
    pub fn gbit_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 * 8.0 / self.seconds / 1e9
        } else {
            0.0
        }
    }
}

/// Messages to the control writer thread.
enum ControlEvent {
    /// Announce the next batch of the manifest.
    Entries(ManifestBatch),
    /// All of this file's units were acknowledged: check the source and seal it.
    Seal(u32),
    /// The receiver holds this file complete: check the source and seal it with its hash, for
    /// the receiver to compare.
    Compare(u32),
    /// Every file is finalised: end the session.
    AllFinalized,
    /// The transfer failed: stop.
    Abort,
}

/// Messages to the stream manager thread.
enum ManagerEvent {
    TargetChanged,
    StreamExited {
        id: u64,
        result: Result<(), stream::StreamFailure>,
    },
}

/// State shared by the transfer's threads, in parts that each hold their own lock (or none):
/// what the streams dial with ([`Dialing`]), the work queue ([`HandOut`]), the files waiting to
/// be settled ([`UnsettledFiles`]), the streams ([`StreamSet`]), the running totals
/// ([`Counters`]) and the end ([`Outcome`]). No thread holds two of those locks at once except
/// the manager, which holds the streams' while it starts a stream.
struct Shared {
    config: Config,
    dial: Dialing,
    /// The limit on the transfer's total rate, which the streams take their turns in.
    rate_limit: Option<rate_limit::RateLimit>,
    source: SourceData,
    start: Instant,
    units: HandOut,
    files: UnsettledFiles,
    streams: StreamSet,
    counts: Counters,
    /// The stream count asked for, within `1..=max_streams`.
    target: AtomicUsize,
    /// The receiver's limit on this session's streams.
    max_streams: usize,
    control_socket: TcpStream,
    control_tx: mpsc::Sender<ControlEvent>,
    manager_tx: mpsc::Sender<ManagerEvent>,
    outcome: Outcome,
}

impl Shared {
    /// The next unit for `stream` ([`HandOut::next`]); `None` when the stream should close.
    fn next_unit(&self, stream: u64, retire: &AtomicBool) -> Option<Unit> {
        self.units
            .next(stream, || retire.load(Ordering::Acquire), Instant::now)
    }

    /// A unit's acknowledgement arrived; the first of its copies counts.
    fn unit_acked(&self, unit: Unit) {
        let Some(file_done) = self.units.acked(unit, Instant::now()) else {
            return;
        };
        self.counts.bytes_acked.add(unit.len as u64);
        telemetry::sender_acked(unit.len as u64);
        if file_done {
            self.send_control(ControlEvent::Seal(unit.file));
        }
    }

    /// Tells the control writer; once it has ended (the transfer is over) there is nobody to
    /// tell.
    fn send_control(&self, event: ControlEvent) {
        let _ = self.control_tx.send(event);
    }

    /// Tells the stream manager; once it has ended there is nobody to tell.
    fn notify_manager(&self, event: ManagerEvent) {
        let _ = self.manager_tx.send(event);
    }

    /// Ends the transfer with `error` (the first end wins) and unblocks every thread.
    fn fail(&self, error: SendError) {
        if !self.outcome.end(Err(error)) {
            return;
        }
        self.units.stop();
        self.files.stop();
        self.send_control(ControlEvent::Abort);
        self.notify_manager(ManagerEvent::TargetChanged);
        let _ = self.control_socket.shutdown(std::net::Shutdown::Both);
        for handle in self.streams.handles() {
            handle.shutdown();
        }
    }

    /// The receiver holds everything: the transfer is over, with what it removed.
    fn complete(&self, removed: Removal) {
        self.outcome.end(Ok(removed));
        self.files.stop();
        self.notify_manager(ManagerEvent::TargetChanged);
    }

    fn is_over(&self) -> bool {
        self.outcome.is_over()
    }

    /// Waits until the transfer is over or `deadline` passes; `true` when it is over.
    fn wait_over_until(&self, deadline: Instant) -> bool {
        self.outcome.wait_until(deadline)
    }

    fn set_target(&self, streams: usize) {
        self.target
            .store(streams.clamp(1, self.max_streams), Ordering::Release);
        self.notify_manager(ManagerEvent::TargetChanged);
    }

    /// Samples of the open streams (see [`Transfer::sample_streams`]).
    fn sample_streams(&self) -> Vec<StreamSample> {
        let handles = self.streams.handles();
        handles.iter().filter_map(|h| self.sample(h)).collect()
    }

    /// What the interval meter measures: samples of the open streams and the final samples of
    /// those closed since its previous call ([`StreamSet::for_meter`]).
    fn sample_for_meter(&self) -> Vec<StreamSample> {
        let (handles, departed) = self.streams.for_meter();
        let mut samples: Vec<_> = handles.iter().filter_map(|h| self.sample(h)).collect();
        samples.extend(departed);
        samples
    }

    /// Removes stream `id` once it ended, keeping its final sample for the interval meter.
    fn remove_stream(&self, id: u64) {
        self.streams.remove(id, |handle| self.sample(handle));
    }

    /// A sample of one stream's counters, if it has a connection.
    fn sample(&self, handle: &StreamHandle) -> Option<StreamSample> {
        handle
            .sample(self.dial.transport)
            .map(|(tcp, subflows)| StreamSample {
                stream: handle.id,
                retiring: handle.is_retiring(),
                tcp,
                subflows,
            })
    }

    /// Takes the actions the control session's rules asked for ([`Planner::handle`]), in order.
    /// A batch's files are queued in one change of the work queue, whose lock the streams
    /// take for every unit; the change ends (waking the streams) before any other action,
    /// which takes other locks.
    fn act(&self, actions: Vec<Action>) -> Result<(), SendError> {
        let mut queue = None;
        for action in actions {
            if !matches!(action, Action::Queue(..) | Action::CloseQueue) {
                queue = None;
            }
            match action {
                Action::Count { to_send, skipped } => {
                    self.counts.bytes_total.add(to_send);
                    self.counts.bytes_skipped.add(skipped);
                }
                Action::Queue(file, ranges) => {
                    queue
                        .get_or_insert_with(|| self.units.change())
                        .add_file(file, ranges);
                }
                Action::CloseQueue => queue.get_or_insert_with(|| self.units.change()).close(),
                Action::Settle(file) => self.files.settle(file)?,
                Action::Seal(file) => self.send_control(ControlEvent::Seal(file)),
                Action::Compare(file) => {
                    self.counts.files_compared.add(1);
                    self.send_control(ControlEvent::Compare(file));
                }
                Action::Changed(file) => {
                    let size = self.files.get(file)?.entry.size;
                    self.counts.files_changed.add(1);
                    self.counts.bytes_skipped.sub(size);
                    self.counts.bytes_total.add(size);
                }
                Action::Finish => self.send_control(ControlEvent::AllFinalized),
                Action::Complete(removed) => self.complete(removed),
            }
        }
        Ok(())
    }
}

impl Announced for UnsettledFiles {
    fn announced(&self) -> (u64, bool) {
        UnsettledFiles::announced(self)
    }

    fn size(&self, file: u32) -> Result<u64, SendError> {
        Ok(self.get(file)?.entry.size)
    }

    fn share(&self, file: u32) -> Result<Option<Vec<Range<u64>>>, SendError> {
        Ok(self.get(file)?.share.clone())
    }

    fn shown(&self, file: u32) -> String {
        UnsettledFiles::shown(self, file)
    }
}

/// A running transfer, driven directly: a service that chooses the stream count itself, or
/// reads the streams' counters, uses it instead of a [`crate::job::SendJob`].
///
/// ```
/// # use transfer::sender::{SendOptions, SendSource, Transfer};
/// # let root = tempfile::tempdir()?;
/// # let (key_text, key) = transfer::auth::SessionKey::generate();
/// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
/// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
/// # let addr = receiver.local_addr()?.to_string();
/// # std::thread::spawn(move || receiver.serve(None));
/// # let options = SendOptions::default().streams(2);
/// let transfer = Transfer::start(&addr, key, SendSource::Memory { size: 256 << 20 }, options)?;
/// transfer.set_target_streams(4);
/// while !transfer.wait_timeout(std::time::Duration::from_millis(100)) {
///     let p = transfer.progress();
///     println!("{} of {} bytes on {} streams", p.bytes_acked, p.bytes_total, p.streams_active);
/// }
/// transfer.wait()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Transfer {
    shared: Arc<Shared>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    optimized: AtomicBool,
    notices: Vec<String>,
    /// Over QUIC, the runtime of the streams' connections and tasks, which stops with the
    /// transfer.
    _quic: Option<OwnedRuntime>,
}

impl Transfer {
    /// Checks the sources and scans the manifest's first batch, connects and authenticates,
    /// exchanges that batch and its plan, and starts the streams and the scan of the rest.
    /// Returns once data is flowing; errors up to that point are returned here, later ones
    /// (such as a directory deep in a source that cannot be read) by [`Transfer::wait`].
    ///
    /// ```
    /// # use transfer::sender::{SendOptions, SendSource, Transfer};
    /// # let root = tempfile::tempdir()?;
    /// # let (key_text, key) = transfer::auth::SessionKey::generate();
    /// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
    /// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
    /// # let addr = receiver.local_addr()?.to_string();
    /// # std::thread::spawn(move || receiver.serve(None));
    /// # let options = SendOptions::default().streams(2);
    /// let source = SendSource::Paths {
    ///     paths: vec!["/nonexistent/data".into()],
    ///     destination: "incoming".into(),
    /// };
    /// match Transfer::start(&addr, key, source, options) {
    ///     Err(transfer::sender::SendError::Source { path, .. }) => assert_eq!(path, "/nonexistent/data"),
    ///     other => panic!("{:?}", other.err()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start(
        receiver: &str,
        key: SessionKey,
        source: SendSource,
        mut options: SendOptions,
    ) -> Result<Transfer, SendError> {
        let start = Instant::now();
        options.check()?;
        source.check()?;
        if options.transport == Transport::Quic {
            options.encrypt = true;
        }
        options.stall_timeout = options.stall_timeout.max(MIN_STALL_TIMEOUT);
        let sources = Sources::open(source, &options)?;
        let config = Config {
            addr: receiver.to_string(),
            key,
            options,
        };
        let addrs = resolve(&config.addr)?;
        let ControlLink {
            socket: control,
            transport,
            fallback,
            mut reader,
            mut writer,
            welcomed:
                auth::Welcomed {
                    session,
                    limits,
                    session_key,
                },
        } = open_control(&addrs, &config)?;
        let present = match sources.sink {
            SinkKind::Files => config.options.present(),
            _ => PresentFiles::Kept,
        };
        let opening = Message::Start {
            dest: sources.dest,
            sink: sources.sink,
            present,
            delete: config.options.deletion(),
            striped: config.options.stripe.is_some(),
        };
        wire::write_message(&mut writer, &opening).map_err(|e| config.lost(e))?;
        let (quic, quic_runtime) = match transport {
            Transport::Quic => {
                let client = ask_for_quic(&mut reader, &mut writer, &session, &config)?;
                let runtime = OwnedRuntime::start("xfer-send-quic", 1)
                    .map_err(|e| SendError::system("start the QUIC runtime", e))?;
                let runtime_handle = runtime.handle().clone();
                let streams = quic_stream::QuicStreams {
                    client,
                    runtime: runtime_handle,
                };
                (Some(streams), Some(runtime))
            }
            _ => (None, None),
        };
        let (control_tx, control_rx) = mpsc::channel();
        let (manager_tx, manager_rx) = mpsc::channel();
        let max_streams = limits.max_streams.max(1) as usize;
        // Largest unit in bytes: the configured size within the receiver's limit.
        let unit_size = config.options.unit_size.clamp(1, limits.max_chunk);
        let rate_limit = (config.options.rate_limit.clone())
            .map(|schedule| rate_limit::RateLimit::new(schedule, unit_size));
        let dial = Dialing {
            addrs,
            transport,
            quic,
            openings: dialing::Openings::default(),
            session,
            session_key,
            sealed: writer.seals(),
        };
        let files = UnsettledFiles::new(wire::SENDER_UNSEALED, config.options.stripe);
        let shared = Arc::new(Shared {
            target: AtomicUsize::new(config.options.streams.clamp(1, max_streams)),
            config,
            dial,
            rate_limit,
            source: sources.data,
            start,
            units: HandOut::new(unit_size),
            files,
            streams: StreamSet::new(),
            counts: Counters::default(),
            max_streams,
            control_socket: control,
            control_tx,
            manager_tx,
            outcome: Outcome::new(),
        });
        let batch = shared.files.announce(sources.first_batch)?;
        let whole = batch.last;
        wire::write_message(&mut writer, &Message::Entries(batch))
            .map_err(|e| shared.config.lost(e))?;
        let mut planner = Planner::new(present);
        let answer = read_answer(&mut reader, &shared.config)?;
        shared.act(planner.handle(answer, &shared.files)?)?;
        let mut threads =
            spawn_threads(&shared, (reader, writer), planner, control_rx, manager_rx)?;
        if let Some(scanner) = sources.scanner.filter(|_| !whole) {
            threads.push(spawn_guarded(&shared, "xfer-scan", {
                let shared = shared.clone();
                move || manifest_stream::run_scanner(&shared, scanner)
            })?);
        }
        Ok(Transfer {
            shared,
            threads: Mutex::new(threads),
            optimized: AtomicBool::new(false),
            notices: Vec::from_iter(fallback),
            _quic: quic_runtime,
        })
    }

    /// Sets the number of streams; it takes effect at once (clamped to 1..=the receiver's limit).
    ///
    /// ```
    /// # use transfer::sender::{SendOptions, SendSource, Transfer};
    /// # let root = tempfile::tempdir()?;
    /// # let (key_text, key) = transfer::auth::SessionKey::generate();
    /// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
    /// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
    /// # let addr = receiver.local_addr()?.to_string();
    /// # std::thread::spawn(move || receiver.serve(None));
    /// # let options = SendOptions::default().streams(2);
    /// let transfer = Transfer::start(&addr, key, SendSource::Memory { size: 64 << 20 }, options)?;
    /// transfer.set_target_streams(8);
    /// assert_eq!(transfer.progress().streams_target, 8);
    /// transfer.set_target_streams(0);
    /// assert_eq!(transfer.progress().streams_target, 1, "at least one stream");
    /// transfer.wait()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_target_streams(&self, streams: usize) {
        self.shared.set_target(streams);
    }

    /// Hands the stream count to `controller` for the rest of the transfer: every
    /// `tuning.interval` the streams' `TCP_INFO` becomes an observation judged by `utility`
    /// ([`Tuning::utility_for`]) and rewarded by `tuning.reward`, and the controller's answer
    /// becomes the target count. The controller runs on its own thread and the data path
    /// never waits for it (see [`MiRecord::decision`] for what happens while it is busy). Each
    /// interval's [`MiRecord`] goes to `log` when given. A transfer takes one controller;
    /// calling this again is an error.
    ///
    /// ```
    /// use std::time::Duration;
    /// use transfer::optimizer::{Fixed, UtilityParams};
    /// use transfer::optimizer_choice::Tuning;
    /// # use transfer::sender::{SendOptions, SendSource, Transfer};
    /// # let root = tempfile::tempdir()?;
    /// # let (key_text, key) = transfer::auth::SessionKey::generate();
    /// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
    /// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
    /// # let addr = receiver.local_addr()?.to_string();
    /// # std::thread::spawn(move || receiver.serve(None));
    /// # let options = SendOptions::default().streams(2);
    /// let transfer = Transfer::start(&addr, key, SendSource::Memory { size: 64 << 20 }, options)?;
    /// let (log, intervals) = std::sync::mpsc::channel();
    /// let tuning = Tuning { interval: Duration::from_millis(50), ..Tuning::default() };
    /// let utility = UtilityParams::default();
    /// transfer.optimize(Box::new(Fixed(3)), &tuning, utility, Some(log))?;
    /// assert!(transfer.optimize(Box::new(Fixed(5)), &tuning, utility, None).is_err(), "one controller");
    /// transfer.wait()?;
    /// for mi in intervals.try_iter() {
    ///     println!("{:.0} Mbit/s on {} streams", mi.observation.throughput / 1e6, mi.observation.streams);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn optimize(
        &self,
        controller: Box<dyn Controller>,
        tuning: &Tuning,
        utility: UtilityParams,
        log: Option<mpsc::Sender<MiRecord>>,
    ) -> Result<(), SendError> {
        let checked = |e: OptimizerError| SendError::Optimizer(Cause::new(e));
        let interval = tuning.interval().map_err(checked)?;
        let tracker = SignalTracker::new(utility, tuning.reward().map_err(checked)?, HISTORY);
        if self.optimized.swap(true, Ordering::AcqRel) {
            return Err(SendError::Optimizer(
                "this transfer already has a controller".into(),
            ));
        }
        let threads = optimize::spawn(&self.shared, controller, interval, tracker, log)
            .map_err(|e| SendError::system("start a thread for the optimizer", e))?;
        unpoisoned(self.threads.lock()).extend(threads);
        Ok(())
    }

    /// Sources left out of the manifest (links, special files), with why, that were found
    /// since the last call. The manifest is scanned while data flows, so more may come until
    /// the transfer is over; they are kept until taken.
    ///
    /// ```
    /// # use transfer::sender::{SendOptions, SendSource, Transfer};
    /// # let root = tempfile::tempdir()?;
    /// # let (key_text, key) = transfer::auth::SessionKey::generate();
    /// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
    /// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
    /// # let addr = receiver.local_addr()?.to_string();
    /// # std::thread::spawn(move || receiver.serve(None));
    /// # let options = SendOptions::default().streams(2);
    /// let src = tempfile::tempdir()?;
    /// std::fs::write(src.path().join("data"), b"payload")?;
    /// std::os::unix::fs::symlink("data", src.path().join("link"))?;
    /// let source = SendSource::Paths { paths: vec![src.path().into()], destination: "".into() };
    /// let transfer = Transfer::start(&addr, key, source, options)?;
    /// transfer.wait_timeout(std::time::Duration::from_secs(10));
    /// let skipped = transfer.take_skipped_sources();
    /// assert!(skipped[0].contains("link"), "{skipped:?}");
    /// assert!(transfer.take_skipped_sources().is_empty(), "taken once");
    /// transfer.wait()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn take_skipped_sources(&self) -> Vec<String> {
        self.shared.files.take_skipped()
    }

    /// The transport the streams use: the one asked for, or TCP where MPTCP could not be had.
    ///
    /// ```
    /// # use transfer::sender::{SendOptions, SendSource, Transfer};
    /// # use transfer::transport::Transport;
    /// # let root = tempfile::tempdir()?;
    /// # let (key_text, key) = transfer::auth::SessionKey::generate();
    /// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
    /// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
    /// # let addr = receiver.local_addr()?.to_string();
    /// # std::thread::spawn(move || receiver.serve(None));
    /// # let options = SendOptions::default().streams(2);
    /// let transfer = Transfer::start(&addr, key, SendSource::Memory { size: 1 << 20 }, options)?;
    /// assert_eq!(transfer.transport(), Transport::Tcp);
    /// transfer.wait()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn transport(&self) -> Transport {
        self.shared.dial.transport
    }

    /// Things the user should know that did not stop the transfer (such as why MPTCP was not
    /// used).
    ///
    /// ```
    /// # use transfer::sender::{SendOptions, SendSource, Transfer};
    /// # let root = tempfile::tempdir()?;
    /// # let (key_text, key) = transfer::auth::SessionKey::generate();
    /// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
    /// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
    /// # let addr = receiver.local_addr()?.to_string();
    /// # std::thread::spawn(move || receiver.serve(None));
    /// # let options = SendOptions::default().streams(2);
    /// let transfer = Transfer::start(&addr, key, SendSource::Memory { size: 1 << 20 }, options)?;
    /// for notice in transfer.notices() {
    ///     eprintln!("note: {notice}");
    /// }
    /// transfer.wait()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn notices(&self) -> &[String] {
        &self.notices
    }

    /// A snapshot of progress counters (cheap: reads atomics and two small locks).
    ///
    /// ```
    /// # use transfer::sender::{SendOptions, SendSource, Transfer};
    /// # let root = tempfile::tempdir()?;
    /// # let (key_text, key) = transfer::auth::SessionKey::generate();
    /// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
    /// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
    /// # let addr = receiver.local_addr()?.to_string();
    /// # std::thread::spawn(move || receiver.serve(None));
    /// # let options = SendOptions::default().streams(2);
    /// let transfer = Transfer::start(&addr, key, SendSource::Memory { size: 16 << 20 }, options)?;
    /// let before = transfer.progress();
    /// assert_eq!(before.bytes_total, 16 << 20);
    /// transfer.wait_timeout(std::time::Duration::from_secs(10));
    /// assert_eq!(transfer.progress().bytes_acked, 16 << 20);
    /// transfer.wait()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn progress(&self) -> Progress {
        let s = &self.shared;
        let (files_total, files_done) = s.files.counts();
        Progress {
            elapsed: s.start.elapsed(),
            bytes_total: s.counts.bytes_total.get(),
            bytes_skipped: s.counts.bytes_skipped.get(),
            bytes_acked: s.counts.bytes_acked.get(),
            bytes_sent: s.counts.bytes_sent.get(),
            files_total,
            files_done,
            streams_active: s.streams.lock().active(),
            streams_target: s.target.load(Ordering::Acquire),
        }
    }

    /// Reads the counters of every open stream now (`TCP_INFO`, or QUIC's path statistics).
    /// Never waits for the data path. A stream that closed is no longer listed, so the
    /// difference between two calls misses what it carried in between; the optimiser's
    /// interval records ([`MiRecord`]) count it.
    ///
    /// ```
    /// # use transfer::sender::{SendOptions, SendSource, Transfer};
    /// # let root = tempfile::tempdir()?;
    /// # let (key_text, key) = transfer::auth::SessionKey::generate();
    /// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
    /// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
    /// # let addr = receiver.local_addr()?.to_string();
    /// # std::thread::spawn(move || receiver.serve(None));
    /// # let options = SendOptions::default().streams(2);
    /// let transfer = Transfer::start(&addr, key, SendSource::Memory { size: 64 << 20 }, options)?;
    /// let acked: u64 = transfer.sample_streams().iter().map(|s| s.tcp.bytes_acked).sum();
    /// println!("{acked} bytes acknowledged by TCP so far");
    /// transfer.wait()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sample_streams(&self) -> Vec<StreamSample> {
        self.shared.sample_streams()
    }

    /// The session's id, which the receiver's events and logs use too.
    ///
    /// ```
    /// # use transfer::sender::{SendOptions, SendSource, Transfer};
    /// # let root = tempfile::tempdir()?;
    /// # let (key_text, key) = transfer::auth::SessionKey::generate();
    /// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
    /// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
    /// # let addr = receiver.local_addr()?.to_string();
    /// # std::thread::spawn(move || receiver.serve(None));
    /// # let options = SendOptions::default().streams(2);
    /// let transfer = Transfer::start(&addr, key, SendSource::Memory { size: 1 << 20 }, options)?;
    /// let session = transfer.session();
    /// assert_eq!(transfer.wait()?.session, session);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn session(&self) -> SessionId {
        SessionId(self.shared.dial.session)
    }

    /// A handle that cancels this transfer from any thread ([`SendError::Cancelled`]).
    ///
    /// ```
    /// # use transfer::sender::{SendOptions, SendSource, Transfer};
    /// # let root = tempfile::tempdir()?;
    /// # let (key_text, key) = transfer::auth::SessionKey::generate();
    /// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
    /// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
    /// # let addr = receiver.local_addr()?.to_string();
    /// # std::thread::spawn(move || receiver.serve(None));
    /// # let options = SendOptions::default().streams(2);
    /// let transfer = Transfer::start(&addr, key, SendSource::Memory { size: 1 << 40 }, options)?;
    /// let canceller = transfer.canceller();
    /// std::thread::spawn(move || canceller.cancel());
    /// assert_eq!(transfer.wait().unwrap_err(), transfer::sender::SendError::Cancelled);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn canceller(&self) -> Canceller {
        Canceller(CancelTarget::Transfer(Arc::downgrade(&self.shared)))
    }

    /// Waits up to `timeout` for the transfer to end; `true` when it has.
    ///
    /// ```
    /// # use transfer::sender::{SendOptions, SendSource, Transfer};
    /// # let root = tempfile::tempdir()?;
    /// # let (key_text, key) = transfer::auth::SessionKey::generate();
    /// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
    /// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
    /// # let addr = receiver.local_addr()?.to_string();
    /// # std::thread::spawn(move || receiver.serve(None));
    /// # let options = SendOptions::default().streams(2);
    /// let transfer = Transfer::start(&addr, key, SendSource::Memory { size: 4 << 20 }, options)?;
    /// while !transfer.wait_timeout(std::time::Duration::from_millis(200)) {
    ///     println!("{} bytes", transfer.progress().bytes_acked);
    /// }
    /// transfer.wait()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        self.shared.wait_over_until(Instant::now() + timeout)
    }

    /// Waits for the end of the transfer and returns its summary or its error.
    ///
    /// ```
    /// # use transfer::sender::{SendOptions, SendSource, Transfer};
    /// # let root = tempfile::tempdir()?;
    /// # let (key_text, key) = transfer::auth::SessionKey::generate();
    /// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
    /// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
    /// # let addr = receiver.local_addr()?.to_string();
    /// # std::thread::spawn(move || receiver.serve(None));
    /// # let options = SendOptions::default().streams(2);
    /// let summary = Transfer::start(&addr, key, SendSource::Memory { size: 4 << 20 }, options)?.wait()?;
    /// assert_eq!(summary.bytes, 4 << 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait(self) -> Result<Summary, SendError> {
        let outcome = self.outcome();
        telemetry::sender_transfer_ended(&outcome);
        outcome
    }

    /// [`Transfer::wait`] without counting the outcome.
    fn outcome(self) -> Result<Summary, SendError> {
        while !self.wait_timeout(Duration::from_secs(3600)) {}
        let seconds = self.shared.start.elapsed().as_secs_f64();
        for t in unpoisoned(self.threads.into_inner()) {
            let _ = t.join();
        }
        let shared = self.shared;
        let removed = shared.outcome.get().expect("over: the wait above ended")?;
        let counts = &shared.counts;
        Ok(Summary {
            session: SessionId(shared.dial.session),
            bytes: counts.bytes_acked.get(),
            bytes_skipped: counts.bytes_skipped.get(),
            files: shared.files.counts().0,
            seconds,
            streams_timeline: shared.streams.timeline(),
            retransmits: counts.closed_retransmits.get(),
            transport: shared.dial.transport,
            removed,
            compared: Compared {
                files: counts.files_compared.get(),
                changed: counts.files_changed.get(),
            },
        })
    }
}

/// Cancels a running transfer: its streams and its connection to the receiver close at once,
/// and [`Transfer::wait`] returns [`SendError::Cancelled`]. The receiver keeps what it has
/// verified, so starting the same transfer again sends only the rest. Cancelling a transfer
/// that has ended does nothing; the handle does not keep the transfer's resources alive.
///
/// [`Transfer::canceller`] gives one for a transfer, [`SendJob::canceller`] one for a job's,
/// which also stops it before it has connected. Either may be moved to another thread (a
/// signal handler's, a service's request handler) while the owner waits for the end.
///
/// [`SendJob::canceller`]: crate::job::SendJob::canceller
///
/// ```
/// # use transfer::sender::{SendOptions, SendSource, Transfer};
/// # let root = tempfile::tempdir()?;
/// # let (key_text, key) = transfer::auth::SessionKey::generate();
/// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
/// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
/// # let addr = receiver.local_addr()?.to_string();
/// # std::thread::spawn(move || receiver.serve(None));
/// # let options = SendOptions::default().streams(2);
/// let transfer = Transfer::start(&addr, key, SendSource::Memory { size: 1 << 40 }, options)?;
/// let canceller = transfer.canceller();
/// canceller.cancel();
/// assert_eq!(transfer.wait().unwrap_err(), transfer::sender::SendError::Cancelled);
/// canceller.cancel(); // over: nothing to do
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Canceller(CancelTarget);

/// What a [`Canceller`] stops. Both are weak: a handle kept after the end holds nothing.
#[derive(Debug, Clone)]
enum CancelTarget {
    /// One transfer.
    Transfer(std::sync::Weak<Shared>),
    /// A job's transfer, whether or not it has connected yet.
    Job(std::sync::Weak<crate::job::CancelState>),
}

impl Canceller {
    /// Cancels the transfer unless it has ended.
    ///
    /// ```
    /// # use transfer::sender::{SendOptions, SendSource, Transfer};
    /// # let root = tempfile::tempdir()?;
    /// # let (key_text, key) = transfer::auth::SessionKey::generate();
    /// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
    /// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
    /// # let addr = receiver.local_addr()?.to_string();
    /// # std::thread::spawn(move || receiver.serve(None));
    /// # let options = SendOptions::default().streams(2);
    /// let transfer = Transfer::start(&addr, key, SendSource::Memory { size: 1 << 40 }, options)?;
    /// transfer.canceller().cancel();
    /// assert!(transfer.wait().is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel(&self) {
        match &self.0 {
            CancelTarget::Transfer(shared) => {
                if let Some(shared) = shared.upgrade() {
                    shared.fail(SendError::Cancelled);
                }
            }
            CancelTarget::Job(job) => {
                if let Some(job) = job.upgrade() {
                    job.cancel();
                }
            }
        }
    }

    /// The handle of a job's transfer.
    pub(crate) fn job(job: std::sync::Weak<crate::job::CancelState>) -> Canceller {
        Canceller(CancelTarget::Job(job))
    }
}

/// Runs `body`, the work of the thread named `thread`. A panic in it (a bug, or in a
/// controller of the caller's own) is caught and given to `fail` as
/// [`SendError::Internal`] naming the thread and the panic's message, so that the transfer
/// ends with that error instead of leaving the other threads waiting for work that will never
/// be done. (Another thread may then panic on a lock the first poisoned; it is caught the same
/// way, and the first error stands.) `None` after a panic.
fn guarded<T>(thread: &str, body: impl FnOnce() -> T, fail: impl FnOnce(SendError)) -> Option<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(done) => Some(done),
        Err(panic) => {
            let message = guarded_message(&*panic);
            fail(SendError::Internal(format!(
                "the {thread} thread panicked: {message}"
            )));
            None
        }
    }
}

/// A panic's message, from what it was given.
fn guarded_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|m| m.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Attempts at the control connection when the receiver closes it before the key handshake is
/// done: the pause between them doubles from 100 ms, plus up to as much again at random, about
/// 6 s in all.
const CONTROL_ATTEMPTS: u32 = 7;

/// How long the control connection keeps trying while the receiver is busy authenticating
/// others ([`Limit::Authenticating`]). A receiver frees every place at the latest at its
/// handshake deadline (10 s by default, [`crate::receiver::DEFAULT_HANDSHAKE_TIMEOUT`]), so a
/// sender that tries a little longer than that finds a place if the receiver has one to give:
/// strangers holding every place until their deadline cannot turn a sender away.
const BUSY_PATIENCE: Duration = Duration::from_secs(15);

/// The longest pause between attempts while the receiver is busy (before the jitter of
/// [`with_jitter`]), so that a place freed is found within a second or two.
const BUSY_PAUSE: Duration = Duration::from_secs(1);

/// The control connection through its key handshake.
/// Starts a thread named `name` that runs `body`, ending the transfer if it panics
/// ([`guarded`]).
fn spawn_guarded(
    shared: &Arc<Shared>,
    name: &str,
    body: impl FnOnce() + Send + 'static,
) -> Result<std::thread::JoinHandle<()>, SendError> {
    let shared = shared.clone();
    let what = name.to_string();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            guarded(&what, body, |e| shared.fail(e));
        })
        .map_err(|e| SendError::system("start a thread", e))
}

/// Starts the threads every transfer runs: the control connection's writer and reader, and the
/// stream manager.
fn spawn_threads(
    shared: &Arc<Shared>,
    (reader, writer): (ControlReader, FrameWriter<link::LinkWriter>),
    planner: Planner,
    control_rx: mpsc::Receiver<ControlEvent>,
    manager_rx: mpsc::Receiver<ManagerEvent>,
) -> Result<Vec<std::thread::JoinHandle<()>>, SendError> {
    let out = shared.clone();
    let inbound = shared.clone();
    let manager = shared.clone();
    Ok(vec![
        spawn_guarded(shared, "xfer-control-out", move || {
            control::run_writer(&out, writer, control_rx)
        })?,
        spawn_guarded(shared, "xfer-control-in", move || {
            control::run_reader(&inbound, reader, planner)
        })?,
        spawn_guarded(shared, "xfer-streams", move || {
            stream::run_manager(&manager, manager_rx)
        })?,
    ])
}

/// What a transfer sends, opened before it connects: the manifest's first batch, where unit
/// bytes come from, the scanner of the rest, and where and into what it lands.
struct Sources {
    first_batch: ScannedBatch,
    data: SourceData,
    /// The scan of the batches after the first, for files.
    scanner: Option<Scanner>,
    /// The directory under the receiver's root, raw bytes.
    dest: Vec<u8>,
    sink: SinkKind,
}

impl Sources {
    /// Checks `source` against `options` and scans its first batch.
    fn open(source: SendSource, options: &SendOptions) -> Result<Sources, SendError> {
        match source {
            SendSource::Paths { paths, destination } => {
                let mut scanner = Scanner::new(&paths)?.with_filter(&options.filter)?;
                Ok(Sources {
                    first_batch: scanner.next_batch(wire::BATCH_ENTRIES)?,
                    data: SourceData::Files {
                        direct: options.direct_io,
                    },
                    scanner: Some(scanner),
                    dest: destination.as_os_str().as_bytes().to_vec(),
                    sink: SinkKind::Files,
                })
            }
            SendSource::Memory { .. } if !options.filter.is_empty() => Err(SendError::Settings(
                "a filter chooses among files: generated data has none".into(),
            )),
            SendSource::Memory { .. } if options.delete => Err(SendError::Settings(
                "--delete mirrors files: generated data has none".into(),
            )),
            SendSource::Memory { .. } if options.stripe.is_some() => Err(SendError::Settings(
                "a striped transfer shares files between nodes: generated data has none".into(),
            )),
            SendSource::Memory { size } => Ok(Sources {
                first_batch: ScannedBatch {
                    batch: ManifestBatch::memory(size),
                    local_paths: vec![PathBuf::new()],
                    skipped: Vec::new(),
                },
                data: SourceData::pattern(options.unit_size),
                scanner: None,
                dest: Vec::new(),
                sink: SinkKind::Discard,
            }),
        }
    }
}

struct ControlLink {
    socket: TcpStream,
    /// The transport in use, and why it is not the one asked for.
    transport: Transport,
    fallback: Option<String>,
    reader: ControlReader,
    writer: FrameWriter<link::LinkWriter>,
    welcomed: auth::Welcomed,
}

/// The control connection's reading half.
type ControlReader = FrameReader<std::io::BufReader<link::LinkReader<link::PollRead>>>;

/// How an attempt at the control connection failed.
enum ControlFailure {
    /// The receiver closed it before the handshake was done: worth another attempt.
    Closed(std::io::Error),
    /// The receiver is busy authenticating other connections: worth another attempt.
    Busy(Limit),
    /// Anything else.
    Failed(SendError),
}

/// Connects the control connection and runs its key handshake, trying again when the receiver
/// closes it first (up to [`CONTROL_ATTEMPTS`] in all) or is busy (for [`BUSY_PATIENCE`]).
fn open_control(addrs: &[SocketAddr], config: &Config) -> Result<ControlLink, SendError> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(100);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let (why, pause_cap) = match try_control(addrs, config) {
            Ok(link) => return Ok(link),
            Err(ControlFailure::Failed(e)) => return Err(e),
            Err(ControlFailure::Closed(e)) if attempt >= CONTROL_ATTEMPTS => {
                return Err(config.reading(WireError::Io(e)))
            }
            Err(ControlFailure::Busy(limit)) if started.elapsed() >= BUSY_PATIENCE => {
                return Err(SendError::Limited {
                    addr: config.addr.clone(),
                    limit,
                })
            }
            Err(ControlFailure::Closed(e)) => (
                format!("the receiver closed the connection before the handshake ({e})"),
                Duration::MAX,
            ),
            Err(ControlFailure::Busy(limit)) => (limit.to_string(), BUSY_PAUSE),
        };
        let wait = with_jitter(pause.min(pause_cap));
        tracing::info!("{why}; trying again in {wait:.1?}");
        std::thread::sleep(wait);
        pause *= 2;
    }
}

impl ControlFailure {
    /// `e` as [`ControlFailure::Closed`] when the peer closed the connection, else as `other`
    /// makes it.
    fn of(e: std::io::Error, other: impl FnOnce(std::io::Error) -> SendError) -> Self {
        use std::io::ErrorKind::*;
        match e.kind() {
            ConnectionReset | ConnectionAborted | UnexpectedEof | BrokenPipe => {
                ControlFailure::Closed(e)
            }
            _ => ControlFailure::Failed(other(e)),
        }
    }
}

/// `pause` plus up to as much again at random, so that senders refused together do not all
/// come back together.
pub(super) fn with_jitter(pause: Duration) -> Duration {
    let jitter = u64::from(u16::from_le_bytes(auth::random_bytes::<2>()));
    pause + pause.mul_f64(jitter as f64 / f64::from(u16::MAX))
}

/// One attempt of [`open_control`].
fn try_control(addrs: &[SocketAddr], config: &Config) -> Result<ControlLink, ControlFailure> {
    let (socket, transport, fallback) = try_connect(addrs, config.options.transport)
        .map_err(|e| ControlFailure::of(e, |e| connect_error(&config.addr, e)))?;
    socket
        .set_read_timeout(Some(config.options.stall_timeout))
        .map_err(|e| ControlFailure::Failed(config.lost(e)))?;
    let failure = |e| match e {
        AuthError::Wire(WireError::Io(io)) => {
            ControlFailure::of(io, |io| config.reading(WireError::Io(io)))
        }
        AuthError::Limited(limit @ Limit::Authenticating { .. }) => ControlFailure::Busy(limit),
        other => ControlFailure::Failed(config.handshake_failed(other)),
    };
    let (reader, writer, channel) = link::client(&socket, config.options.encrypt)
        .map_err(|e| failure(AuthError::from_io(e)))?;
    let mut reader = FrameReader::new(std::io::BufReader::new(reader), 0);
    let mut writer = FrameWriter::new(writer);
    let welcomed = auth::handshake_as_client(
        &mut reader,
        &mut writer,
        &channel,
        &config.key,
        Role::Control,
        config.options.seals(),
    )
    .map_err(failure)?;
    Ok(ControlLink {
        socket,
        transport,
        fallback,
        reader,
        writer,
        welcomed,
    })
}

fn resolve(addr: &str) -> Result<Vec<SocketAddr>, SendError> {
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| SendError::Connect {
            addr: addr.to_string(),
            cause: e.into(),
        })?
        .collect();
    if addrs.is_empty() {
        return Err(SendError::Connect {
            addr: addr.to_string(),
            cause: "the name has no address".into(),
        });
    }
    Ok(addrs)
}

/// Opens one connection over `transport` to the first address that answers, with the
/// transport it really uses and, when that is not `transport`, why.
fn connect(
    addrs: &[SocketAddr],
    shown: &str,
    transport: Transport,
) -> Result<(TcpStream, Transport, Option<String>), SendError> {
    try_connect(addrs, transport).map_err(|e| connect_error(shown, e))
}

/// [`connect`], failing with the last address's error.
fn try_connect(
    addrs: &[SocketAddr],
    transport: Transport,
) -> std::io::Result<(TcpStream, Transport, Option<String>)> {
    let mut last = None;
    for addr in addrs {
        match transport::connect(transport, addr, CONNECT_TIMEOUT) {
            Ok((s, used, why)) => {
                s.set_nodelay(true)?;
                return Ok((s, used, why));
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("the name has no address")))
}

/// The error for a connection to `shown` that could not be made.
fn connect_error(shown: &str, e: std::io::Error) -> SendError {
    SendError::Connect {
        addr: shown.to_string(),
        cause: e.into(),
    }
}

/// Samples a stream's counters: a TCP socket's `TCP_INFO` and, over MPTCP, its subflows'; a
/// QUIC connection's path statistics in the same shape. `None` once it has closed.
fn sample_connection(
    connection: &Connection,
    transport: Transport,
) -> Option<(TcpInfo, Vec<Subflow>)> {
    let socket = match connection {
        Connection::Tcp(socket) => socket,
        Connection::Quic(quic) => return Some((quic.sample()?, Vec::new())),
    };
    let tcp = tcp_info::sample(socket).ok()?;
    let subflows = match transport {
        // A stream that fell back to TCP on its own has none.
        Transport::Mptcp => mptcp_info::subflows(socket).unwrap_or_default(),
        Transport::Tcp | Transport::Quic => Vec::new(),
    };
    Some((tcp, subflows))
}

/// The receiver's next message on the control connection that is not its heartbeat.
fn read_answer<R: std::io::Read>(
    reader: &mut FrameReader<R>,
    config: &Config,
) -> Result<Message, SendError> {
    loop {
        match reader.read_message() {
            Ok(Message::Working) => {}
            answer => return answer.map_err(|e| config.reading(e)),
        }
    }
}

/// Asks the receiver for QUIC data streams (after the plan, on the control connection) and
/// makes the client that opens them, pinned to the certificate the receiver announces.
fn ask_for_quic<R: std::io::Read>(
    reader: &mut FrameReader<R>,
    writer: &mut impl FrameWrite,
    session: &[u8; 16],
    config: &Config,
) -> Result<QuicClient, SendError> {
    wire::write_message(writer, &Message::QuicRequest).map_err(|e| config.lost(e))?;
    match read_answer(reader, config)? {
        Message::QuicOffer { certificate } => {
            QuicClient::new(session, certificate, config.options.congestion)
                .map_err(|e| config.lost(e))
        }
        Message::Refused { reason } => Err(SendError::refused(reason)),
        other => Err(SendError::Protocol(format!(
            "expected QuicOffer, got {}",
            auth::name(&other)
        ))),
    }
}

/// What the sender does with a receiver's resume plan for `files`: the units left to send, in
/// the order a work queue hands them out.
#[cfg(feature = "fuzzing")]
pub(crate) fn queue_for_fuzzing(
    files: &[crate::manifest::FileEntry],
    plan: &[crate::wire::FileStatus],
    unit_size: u32,
) -> Result<Vec<(u32, u64, u32)>, String> {
    use work_queue::{Next, WorkQueue};
    let mut queue = WorkQueue::new(unit_size);
    for (file, (entry, status)) in (0..).zip(files.iter().zip(plan)) {
        let ranges =
            control_session::ranges_to_send(entry.size, status).map_err(|e| e.to_string())?;
        if !ranges.is_empty() {
            queue.add_file(file, ranges);
        }
    }
    queue.close();
    let mut units = Vec::new();
    while let Next::Unit(u) = queue.next(0, Instant::now()) {
        units.push((u.file, u.offset, u.len));
    }
    Ok(units)
}
