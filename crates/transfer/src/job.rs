//! Transfers for services: a [`SendJob`] is one transfer started from [`SenderSettings`] (which
//! a service keeps in its own configuration file: they deserialise with serde), observed as a
//! stream of [`SendEvent`]s, cancelled at any moment, and awaited for its [`Summary`] or its
//! typed [`SendError`].
//!
//! The transfer runs on its own threads, as [`Transfer`] does; the job's methods only wait on
//! channels, so they can be awaited in any async runtime and never block one. A program
//! without one waits on its own thread instead: [`SendJob::wait`] and
//! [`SendJob::next_event_blocking`].
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use transfer::job::{SendEvent, SendJob, SenderSettings};
//!
//! let settings: SenderSettings = toml::from_str(r#"
//!     receiver = "dtn.example.org:9000"
//!     key = { file = "/etc/xfer/key" }
//!     source = { paths = ["/data/run42"], destination = "incoming" }
//!     optimizer = "auto"
//! "#)?;
//! let mut job = SendJob::start(settings)?;
//! while let Some(event) = job.next_event().await {
//!     match event {
//!         SendEvent::Progress(p) => println!("{} of {} bytes", p.bytes_acked, p.bytes_total),
//!         SendEvent::Decision(mi) => println!("{} streams", mi.decision.unwrap_or(0)),
//!         SendEvent::Finished(Err(e)) => eprintln!("failed: {e}"),
//!         _ => {}
//!     }
//! }
//! let summary = job.finish().await?;
//! println!("{:.2} Gbit/s", summary.gbit_per_s());
//! # Ok(())
//! # }
//! ```

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use optimizer::{Controller, UtilityParams};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc as async_mpsc, oneshot};

use crate::auth::KeySetting;
use crate::cause::Cause;
use crate::optimizer_choice::{OptimizerChoice, OptimizerError, Tuning};
use crate::sender::{
    Canceller, MiRecord, Progress, SendError, SendOptions, SendSource, StreamSample, Summary,
    Transfer,
};
use crate::session_id::SessionId;
use crate::sync::unpoisoned;
use crate::transport::Transport;

/// Events a job holds for its reader before it waits (progress snapshots are dropped instead:
/// a newer one follows).
const EVENT_BUFFER: usize = 64;

/// Everything a transfer needs, as a service keeps it in its configuration: where it goes
/// (`receiver`, `key`), what it sends ([`SendSource`]), which controller chooses the stream
/// count and how it measures, and how to send ([`SendOptions`], the `[options]` table). Only
/// `receiver`, `key` and `source` must be given; everything else has the default `xfer send`
/// has.
///
/// ```
/// use std::time::Duration;
/// use transfer::auth::KeySetting;
/// use transfer::job::SenderSettings;
///
/// let settings: SenderSettings = toml::from_str(r#"
///     receiver = "dtn.example.org:9000"
///     key = { file = "/etc/xfer/key" }
///     source = { paths = ["/data/run42"], destination = "incoming" }
///     optimizer = "fixed:8"
///     [tuning]
///     max_streams = 32
///     interval = "500ms"
///     [options]
///     verify = true
///     stall_timeout = "2m"
/// "#)?;
/// assert_eq!(settings.key, KeySetting::File("/etc/xfer/key".into()));
/// assert_eq!(settings.optimizer.unwrap().to_string(), "fixed:8");
/// assert_eq!(settings.tuning.interval, Duration::from_millis(500));
/// assert_eq!(settings.options.stall_timeout, Duration::from_secs(120));
/// assert_eq!(settings.options.streams, transfer::sender::DEFAULT_STREAMS, "left out: the default");
///
/// // A misspelt field is an error that names it, not a setting silently ignored.
/// let typo = toml::from_str::<SenderSettings>(r#"
///     receiver = "dtn.example.org:9000"
///     key = { file = "/etc/xfer/key" }
///     source = { memory = 1000 }
///     [options]
///     strems = 4
/// "#);
/// assert!(typo.unwrap_err().to_string().contains("unknown field `strems`"));
/// # Ok::<(), toml::de::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SenderSettings {
    /// The receiver, `HOST:PORT`.
    pub receiver: String,
    /// The receiver's session key.
    pub key: KeySetting,
    /// What to send.
    pub source: SendSource,
    /// The controller that chooses the stream count; `None`: `auto`, or `gd` when the tuning
    /// asks for a utility the built-in policy was not trained for
    /// ([`Tuning::default_choice`]). `fixed:N` keeps N streams.
    #[serde(default)]
    pub optimizer: Option<OptimizerChoice>,
    /// How the controller measures and judges.
    #[serde(default)]
    pub tuning: Tuning,
    /// Seeds the controller's random choices.
    #[serde(default)]
    pub seed: u64,
    /// Time between [`SendEvent::Progress`] events.
    #[serde(default = "default_progress_every", with = "crate::duration")]
    pub progress_every: Duration,
    /// How to send.
    #[serde(default)]
    pub options: SendOptions,
}

/// Default [`SenderSettings::progress_every`].
fn default_progress_every() -> Duration {
    Duration::from_secs(1)
}

impl SenderSettings {
    /// Settings with every default, to send `source` to `receiver` with `key` (a
    /// [`KeySetting`], or a [`crate::auth::SessionKey`] already read).
    ///
    /// ```
    /// use transfer::auth::KeySetting;
    /// use transfer::job::SenderSettings;
    /// use transfer::sender::SendSource;
    ///
    /// let mut settings = SenderSettings::new(
    ///     "dtn.example.org:9000",
    ///     KeySetting::File("/etc/xfer/key".into()),
    ///     SendSource::Paths { paths: vec!["/data/run42".into()], destination: "incoming/run42".into() },
    /// );
    /// settings.options.encrypt = true;
    /// assert_eq!(settings.optimizer, None, "auto, the default");
    /// ```
    pub fn new(
        receiver: impl Into<String>,
        key: impl Into<KeySetting>,
        source: SendSource,
    ) -> Self {
        SenderSettings {
            receiver: receiver.into(),
            key: key.into(),
            source,
            optimizer: None,
            tuning: Tuning::default(),
            seed: 0,
            progress_every: default_progress_every(),
            options: SendOptions::default(),
        }
    }
}

/// What a job reports while it runs, in order; [`SendEvent::Finished`] is the last.
///
/// ```
/// use transfer::job::SendEvent;
///
/// /// One line of a service's transfer log.
/// fn log_line(event: &SendEvent) -> Option<String> {
///     Some(match event {
///         SendEvent::Started { session, transport, optimizer } => {
///             format!("session {session} over {transport}, {optimizer} choosing streams")
///         }
///         SendEvent::Notice(notice) => format!("note: {notice}"),
///         SendEvent::Progress(p) => format!("{} of {} bytes", p.bytes_acked, p.bytes_total),
///         SendEvent::Streams(streams) => {
///             let retransmits: u32 = streams.iter().map(|s| s.tcp.total_retrans).sum();
///             format!("{} streams, {retransmits} retransmits", streams.len())
///         }
///         SendEvent::Decision(mi) => format!("interval {}: {:?} streams", mi.observation.mi, mi.decision),
///         SendEvent::Finished(Ok(summary)) => format!("done: {} bytes", summary.bytes),
///         SendEvent::Finished(Err(e)) => format!("failed: {e}"),
///         _ => return None, // kinds of event a later version brings
///     })
/// }
/// assert_eq!(
///     log_line(&SendEvent::Notice("MPTCP is not available here".into())).unwrap(),
///     "note: MPTCP is not available here"
/// );
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SendEvent {
    /// Connected and authenticated, data flowing over this transport (TCP where MPTCP was
    /// asked for and could not be had).
    Started {
        /// The session's id, which the receiver's events and logs name too.
        session: SessionId,
        /// The transport the streams use.
        transport: Transport,
        /// The controller choosing the stream count.
        optimizer: String,
    },
    /// Something that did not stop the transfer: why MPTCP was not used, a source left out
    /// (links, special files), why the default optimiser is `gd`.
    Notice(String),
    /// Bytes, files and streams so far, every `progress_every` (a reader that falls
    /// behind misses some; the next one is newer), and once more as the transfer ends (before
    /// [`SendEvent::Finished`]: what a cancelled or failed transfer got done).
    Progress(Progress),
    /// Each open stream's counters ([`Transfer::sample_streams`]), read right after the
    /// [`SendEvent::Progress`] it follows: the two always come together, or neither does,
    /// but for the last progress, which no streams follow.
    Streams(Vec<StreamSample>),
    /// One monitoring interval: its signals and the controller's decision.
    Decision(Box<MiRecord>),
    /// The transfer ended: its summary, or why it failed ([`SendError::Cancelled`] when it was
    /// cancelled).
    Finished(Result<Summary, SendError>),
}

/// The job's side of the cancel: cancelling before the transfer has connected stops it as
/// soon as it has. Shared by the job, its thread and every [`Canceller`] of it.
#[derive(Debug, Default)]
pub(crate) struct CancelState(Mutex<Cancelling>);

/// What [`CancelState`] guards.
#[derive(Debug, Default)]
struct Cancelling {
    cancelled: bool,
    /// The transfer's own handle, once it has connected.
    transfer: Option<Canceller>,
}

impl CancelState {
    /// Cancels the transfer now, or as soon as it has connected.
    pub(crate) fn cancel(&self) {
        let mut state = unpoisoned(self.0.lock());
        state.cancelled = true;
        if let Some(transfer) = &state.transfer {
            transfer.cancel();
        }
    }

    /// The transfer has connected: `transfer` cancels it from now on (and at once, if the job
    /// was cancelled before).
    fn connected(&self, transfer: Canceller) {
        let mut state = unpoisoned(self.0.lock());
        if state.cancelled {
            transfer.cancel();
        }
        state.transfer = Some(transfer);
    }
}

/// One running transfer. Dropping it without [`SendJob::finish`] or [`SendJob::cancel`] lets
/// the transfer run on to its end unobserved.
///
/// A whole transfer over loopback: a receiver, and a job that sends 8 MiB of generated data to
/// it.
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
/// std::thread::spawn(move || receiver.serve(Some(1)));
///
/// let settings = SenderSettings::new(addr, KeySetting::Text(key_text), SendSource::Memory { size: 8 << 20 });
/// let job = SendJob::start(settings)?;
/// let summary = tokio::runtime::Runtime::new()?.block_on(job.finish())?;
/// assert_eq!(summary.bytes, 8 << 20);
/// # Ok(())
/// # }
/// ```
pub struct SendJob {
    events: async_mpsc::Receiver<SendEvent>,
    result: oneshot::Receiver<Result<Summary, SendError>>,
    cancel: Arc<CancelState>,
}

impl SendJob {
    /// Checks `settings`, builds the controller (a policy that cannot run stops nothing) and
    /// starts the transfer on its own thread; returns at once. Settings that cannot work are
    /// refused here; whether the receiver answers is the first thing the events tell.
    ///
    /// ```
    /// use transfer::auth::KeySetting;
    /// use transfer::job::{SendJob, SenderSettings};
    /// use transfer::sender::SendSource;
    ///
    /// let mut settings = SenderSettings::new(
    ///     "127.0.0.1:9",
    ///     KeySetting::Text("an-example-key-0123456789".into()),
    ///     SendSource::Memory { size: 1 << 20 },
    /// );
    /// settings.options.streams = 0;
    /// let refused = SendJob::start(settings).err().unwrap();
    /// assert_eq!(refused.to_string(), "streams must be at least 1");
    /// ```
    pub fn start(mut settings: SenderSettings) -> Result<SendJob, SendError> {
        let tuning = &settings.tuning;
        let (choice, note) = match &settings.optimizer {
            Some(choice) => (choice.clone(), None),
            None => tuning.default_choice().map_err(optimizer_error)?,
        };
        let utility = tuning.utility_for(&[&choice]).map_err(optimizer_error)?;
        let controller = choice
            .build(tuning, utility, settings.seed)
            .map_err(optimizer_error)?;
        // A controller that names its count (fixed:N, a schedule) starts the transfer at it,
        // within the most it may use, rather than one interval later.
        if let Some(named) = choice.initial_streams() {
            settings.options.streams = named.min(tuning.max_streams as usize);
        }
        Self::spawn(&settings, controller, utility, note)
    }

    /// [`SendJob::start`] with a controller of the caller's own in place of a named one
    /// (`settings.optimizer` must be `None`): it sees every monitoring interval of
    /// `settings.tuning` and chooses the stream count, judged by the tuning's utility.
    ///
    /// ```
    /// use transfer::auth::KeySetting;
    /// use transfer::job::{SendJob, SenderSettings};
    /// use transfer::sender::SendSource;
    /// use transfer::optimizer::{Controller, Observation};
    ///
    /// /// One more stream every interval while the loss stays under 0.1 %, one fewer after.
    /// struct Cautious;
    ///
    /// impl Controller for Cautious {
    ///     fn name(&self) -> String {
    ///         "cautious".into()
    ///     }
    ///     fn decide(&mut self, o: &Observation) -> usize {
    ///         if o.loss < 0.001 { o.streams + 1 } else { o.streams.saturating_sub(1).max(1) }
    ///     }
    /// }
    ///
    /// let settings = SenderSettings::new(
    ///     "127.0.0.1:9",
    ///     KeySetting::Text("an-example-key-0123456789".into()),
    ///     SendSource::Memory { size: 1 << 20 },
    /// );
    /// // Nobody listens on loopback's discard port: the job starts, then tells why it failed.
    /// let job = SendJob::start_with(settings, Box::new(Cautious))?;
    /// let failed = tokio::runtime::Runtime::new()?.block_on(job.finish());
    /// assert!(matches!(failed, Err(transfer::sender::SendError::Connect { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start_with(
        settings: SenderSettings,
        controller: Box<dyn Controller>,
    ) -> Result<SendJob, SendError> {
        if let Some(named) = &settings.optimizer {
            return Err(SendError::Settings(format!(
                "the settings name the optimizer {named} and a controller was given as well: \
                 leave `optimizer` out"
            )));
        }
        let utility = settings.tuning.utility_for(&[]).map_err(optimizer_error)?;
        Self::spawn(&settings, controller, utility, None)
    }

    /// Starts the job's thread: the transfer of `settings` with `controller` judged by
    /// `utility`, `note` its first event.
    fn spawn(
        settings: &SenderSettings,
        controller: Box<dyn Controller>,
        utility: UtilityParams,
        note: Option<String>,
    ) -> Result<SendJob, SendError> {
        settings.options.check()?;
        settings.source.check()?;
        let key = settings
            .key
            .key()
            .map_err(|e| SendError::Settings(e.to_string()))?;
        let every = crate::duration::positive("progress_every", settings.progress_every)
            .map_err(SendError::Settings)?;
        let (receiver, source, options) = (
            settings.receiver.clone(),
            settings.source.clone(),
            settings.options.clone(),
        );
        // Checked here, so that tuning that cannot work is refused before anything starts.
        settings.tuning.interval().map_err(optimizer_error)?;
        settings.tuning.reward().map_err(optimizer_error)?;
        let tuning = settings.tuning.clone();

        let (events_tx, events) = async_mpsc::channel(EVENT_BUFFER);
        let (result_tx, result) = oneshot::channel();
        let (log_tx, log) = mpsc::channel();
        let cancel = Arc::new(CancelState::default());
        let run = Run {
            events: events_tx,
            cancel: cancel.clone(),
            every,
            log,
        };
        std::thread::Builder::new()
            .name("xfer-job".into())
            .spawn(move || {
                if let Some(note) = note {
                    run.send(SendEvent::Notice(note));
                }
                let name = controller.name();
                let outcome =
                    Transfer::start(&receiver, key, source, options).and_then(|transfer| {
                        transfer.optimize(controller, &tuning, utility, Some(log_tx))?;
                        Ok(transfer)
                    });
                let result = match outcome {
                    Ok(transfer) => run.follow(transfer, name),
                    Err(e) => Err(e),
                };
                let _ = result_tx.send(result.clone());
                run.send(SendEvent::Finished(result));
            })
            .map_err(|e| SendError::Settings(format!("cannot start a thread: {e}")))?;
        Ok(SendJob {
            events,
            result,
            cancel,
        })
    }

    /// The next event; `None` after [`SendEvent::Finished`].
    ///
    /// ```
    /// use transfer::auth::KeySetting;
    /// use transfer::job::{SendEvent, SendJob, SenderSettings};
    /// use transfer::sender::SendSource;
    ///
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let settings = SenderSettings::new(
    ///     "127.0.0.1:9",
    ///     KeySetting::Text("an-example-key-0123456789".into()),
    ///     SendSource::Memory { size: 1 << 20 },
    /// );
    /// let mut job = SendJob::start(settings)?;
    /// let mut last = None;
    /// while let Some(event) = job.next_event().await {
    ///     last = Some(event);
    /// }
    /// assert!(matches!(last, Some(SendEvent::Finished(Err(_)))), "nobody listens there");
    /// # Ok(())
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(example()).unwrap();
    /// ```
    pub async fn next_event(&mut self) -> Option<SendEvent> {
        self.events.recv().await
    }

    /// Cancels the transfer (also before it has connected): it ends with
    /// [`SendError::Cancelled`]; see [`Canceller`] for what the receiver keeps.
    ///
    /// ```
    /// use transfer::auth::KeySetting;
    /// use transfer::job::{SendJob, SenderSettings};
    /// use transfer::sender::SendSource;
    /// use transfer::sender::SendError;
    ///
    /// let settings = SenderSettings::new(
    ///     "192.0.2.1:9000", // an address nobody answers from: the job is still connecting
    ///     KeySetting::Text("an-example-key-0123456789".into()),
    ///     SendSource::Memory { size: 1 << 30 },
    /// );
    /// let job = SendJob::start(settings)?;
    /// job.cancel();
    /// let result = tokio::runtime::Runtime::new()?.block_on(job.finish());
    /// assert!(matches!(result, Err(SendError::Cancelled | SendError::Connect { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// A handle that cancels this job from anywhere, as [`SendJob::cancel`] does: from a signal
    /// handler's thread, say, while this one waits for the end.
    ///
    /// ```
    /// use transfer::auth::KeySetting;
    /// use transfer::job::{SendJob, SenderSettings};
    /// use transfer::sender::{SendError, SendSource};
    ///
    /// let settings = SenderSettings::new(
    ///     "192.0.2.1:9000", // an address nobody answers from: the job is still connecting
    ///     KeySetting::Text("an-example-key-0123456789".into()),
    ///     SendSource::Memory { size: 1 << 30 },
    /// );
    /// let job = SendJob::start(settings)?;
    /// let canceller = job.canceller();
    /// std::thread::spawn(move || canceller.cancel());
    /// let result = job.wait();
    /// assert!(matches!(result, Err(SendError::Cancelled | SendError::Connect { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn canceller(&self) -> Canceller {
        Canceller::job(Arc::downgrade(&self.cancel))
    }

    /// Waits for the end of the transfer (passing over the events not yet read) and returns
    /// its summary or its error.
    ///
    /// ```
    /// use transfer::auth::KeySetting;
    /// use transfer::job::{SendJob, SenderSettings};
    /// use transfer::sender::SendSource;
    /// use transfer::sender::SendError;
    ///
    /// let settings = SenderSettings::new(
    ///     "127.0.0.1:9",
    ///     KeySetting::Text("an-example-key-0123456789".into()),
    ///     SendSource::Memory { size: 1 << 20 },
    /// );
    /// let job = SendJob::start(settings)?;
    /// match tokio::runtime::Runtime::new()?.block_on(job.finish()) {
    ///     Ok(summary) => println!("{:.2} Gbit/s", summary.gbit_per_s()),
    ///     Err(SendError::Connect { addr, cause }) => println!("{addr} is not listening: {cause}"),
    ///     Err(e) => println!("failed: {e}"),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn finish(mut self) -> Result<Summary, SendError> {
        while self.events.recv().await.is_some() {}
        self.result
            .await
            .unwrap_or_else(|_| Err(ended_without_result()))
    }

    /// The next event, waiting on this thread: [`SendJob::next_event`] for a program without an
    /// async runtime. Called from inside an async runtime's task it panics (await
    /// `next_event` there).
    ///
    /// ```
    /// use transfer::auth::KeySetting;
    /// use transfer::job::{SendEvent, SendJob, SenderSettings};
    /// use transfer::sender::SendSource;
    ///
    /// let settings = SenderSettings::new(
    ///     "127.0.0.1:9",
    ///     KeySetting::Text("an-example-key-0123456789".into()),
    ///     SendSource::Memory { size: 1 << 20 },
    /// );
    /// let mut job = SendJob::start(settings)?;
    /// let mut last = None;
    /// while let Some(event) = job.next_event_blocking() {
    ///     last = Some(event);
    /// }
    /// assert!(matches!(last, Some(SendEvent::Finished(Err(_)))), "nobody listens there");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn next_event_blocking(&mut self) -> Option<SendEvent> {
        self.events.blocking_recv()
    }

    /// Waits on this thread for the end of the transfer (passing over the events not yet
    /// read): [`SendJob::finish`] for a program without an async runtime
    /// (`examples/send_directory.rs`). Called from inside an async runtime's task it panics.
    ///
    /// ```
    /// use transfer::auth::KeySetting;
    /// use transfer::job::{SendJob, SenderSettings};
    /// use transfer::sender::SendSource;
    /// use transfer::sender::SendError;
    ///
    /// let settings = SenderSettings::new(
    ///     "127.0.0.1:9",
    ///     KeySetting::Text("an-example-key-0123456789".into()),
    ///     SendSource::Memory { size: 1 << 20 },
    /// );
    /// let result = SendJob::start(settings)?.wait();
    /// assert!(matches!(result, Err(SendError::Connect { .. })), "nobody listens there");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait(mut self) -> Result<Summary, SendError> {
        while self.events.blocking_recv().is_some() {}
        self.result
            .blocking_recv()
            .unwrap_or_else(|_| Err(ended_without_result()))
    }
}

/// The error of a job whose thread ended without sending its result (it panicked).
fn ended_without_result() -> SendError {
    SendError::Internal("the transfer's thread ended without a result".into())
}

/// An optimiser that cannot be had, as the job's error.
fn optimizer_error(e: OptimizerError) -> SendError {
    SendError::Optimizer(Cause::new(e))
}

/// The job thread's half: follows the transfer and reports it.
struct Run {
    events: async_mpsc::Sender<SendEvent>,
    cancel: Arc<CancelState>,
    every: Duration,
    /// The transfer's monitoring intervals.
    log: mpsc::Receiver<MiRecord>,
}

impl Run {
    /// Sends an event, waiting while the reader's buffer is full; an event nobody will read
    /// (the job was dropped) is let go.
    fn send(&self, event: SendEvent) {
        let _ = self.events.blocking_send(event);
    }

    /// Relays `transfer`'s progress, notices and decisions until it ends; its result.
    fn follow(&self, transfer: Transfer, optimizer: String) -> Result<Summary, SendError> {
        self.cancel.connected(transfer.canceller());
        self.send(SendEvent::Started {
            session: transfer.session(),
            transport: transfer.transport(),
            optimizer,
        });
        for notice in transfer.notices() {
            self.send(SendEvent::Notice(notice.clone()));
        }
        let decisions = || {
            for record in self.log.try_iter() {
                self.send(SendEvent::Decision(Box::new(record)));
            }
        };
        loop {
            let over = transfer.wait_timeout(self.every);
            decisions();
            for skipped in transfer.take_skipped_sources() {
                self.send(SendEvent::Notice(skipped));
            }
            if over {
                break;
            }
            // A reader that is behind misses this snapshot; the next one is newer. This
            // thread alone sends, so the room it sees stays free for both events.
            if self.events.capacity() >= 2 {
                let _ = self
                    .events
                    .try_send(SendEvent::Progress(transfer.progress()));
                let _ = self
                    .events
                    .try_send(SendEvent::Streams(transfer.sample_streams()));
            }
        }
        // The last snapshot, as the transfer ended (what a stopped one got done), taken before
        // `wait` consumes the transfer and sent after its last decisions, just before the end.
        let last = transfer.progress();
        let result = transfer.wait();
        decisions();
        self.send(SendEvent::Progress(last));
        result
    }
}
