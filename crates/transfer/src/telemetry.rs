//! What the data plane counts, through the [`metrics`] facade: bytes, sessions, streams,
//! retransmits, the optimiser's decisions and errors, on the sender and on the receiver.
//! Nothing is recorded until the application installs a recorder; `xfer send|recv --metrics
//! ADDR` installs a Prometheus exporter, and a service can install any recorder of the
//! `metrics` ecosystem (calling [`describe`] first gives each metric its help text).
//!
//! The names, all prefixed `xfer_`:
//!
//! | metric | kind | what |
//! |---|---|---|
//! | `xfer_sender_bytes_total` | counter | bytes the receiver acknowledged (verified and written) |
//! | `xfer_sender_streams` | gauge | data streams open |
//! | `xfer_sender_stream_failures_total` | counter | streams that broke (their units went to the others) |
//! | `xfer_sender_decisions_total{controller}` | counter | stream counts a controller chose |
//! | `xfer_sender_transfers_total{outcome}` | counter | transfers ended: `completed`, `cancelled`, `failed` |
//! | `xfer_sender_retransmits_total` | counter | TCP segments retransmitted, counted when a transfer ends |
//! | `xfer_receiver_bytes_total` | counter | bytes verified and written |
//! | `xfer_receiver_sessions` | gauge | sessions being served |
//! | `xfer_receiver_sessions_total{outcome}` | counter | sessions ended: `completed`, `disconnected`, `ended_by_receiver`, `failed` ([`crate::receiver::SessionOutcome`]) |
//! | `xfer_receiver_streams` | gauge | data streams open |
//! | `xfer_receiver_refused_total` | counter | connections and sessions refused (limits, bad key, stopping) |

use metrics::{counter, describe_counter, describe_gauge, gauge, Unit};

use crate::receiver::SessionOutcome;
use crate::sender::{SendError, Summary};

const SENDER_BYTES: &str = "xfer_sender_bytes_total";
const SENDER_STREAMS: &str = "xfer_sender_streams";
const SENDER_STREAM_FAILURES: &str = "xfer_sender_stream_failures_total";
const SENDER_DECISIONS: &str = "xfer_sender_decisions_total";
const SENDER_TRANSFERS: &str = "xfer_sender_transfers_total";
const SENDER_RETRANSMITS: &str = "xfer_sender_retransmits_total";
const RECEIVER_BYTES: &str = "xfer_receiver_bytes_total";
const RECEIVER_SESSIONS: &str = "xfer_receiver_sessions";
const RECEIVER_SESSIONS_ENDED: &str = "xfer_receiver_sessions_total";
const RECEIVER_STREAMS: &str = "xfer_receiver_streams";
const RECEIVER_REFUSED: &str = "xfer_receiver_refused_total";

/// Gives every metric its unit and help text in the installed recorder.
///
/// A service that exports the data plane's counters for Prometheus with its own recorder:
///
/// ```
/// use metrics_exporter_prometheus::PrometheusBuilder;
/// use transfer::auth::{KeySetting, SessionKey};
/// use transfer::job::{SendJob, SenderSettings};
/// use transfer::sender::SendSource;
/// use transfer::receiver::{Receiver, ReceiverSettings};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let prometheus = PrometheusBuilder::new().install_recorder()?;
/// transfer::telemetry::describe();
///
/// let root = tempfile::tempdir()?;
/// let (key_text, key) = SessionKey::generate();
/// let receiver = Receiver::bind(&ReceiverSettings::new(root.path().into(), key).listen("127.0.0.1:0"))?;
/// let addr = receiver.local_addr()?.to_string();
/// let serving = std::thread::spawn(move || receiver.serve(Some(1)));
/// let settings = SenderSettings::new(addr, KeySetting::Text(key_text), SendSource::Memory { size: 4 << 20 });
/// tokio::runtime::Runtime::new()?.block_on(SendJob::start(settings)?.finish())?;
/// serving.join().unwrap()?;
///
/// let page = prometheus.render(); // what a scrape of /metrics returns
/// assert!(page.contains("# HELP xfer_sender_bytes_total Bytes the receiver acknowledged."));
/// assert!(page.contains(r#"xfer_sender_transfers_total{outcome="completed"}"#));
/// assert!(page.contains(r#"xfer_receiver_sessions_total{outcome="completed"}"#));
/// # Ok(())
/// # }
/// ```
pub fn describe() {
    describe_counter!(
        SENDER_BYTES,
        Unit::Bytes,
        "Bytes the receiver acknowledged."
    );
    describe_gauge!(SENDER_STREAMS, "Data streams open.");
    describe_counter!(SENDER_STREAM_FAILURES, "Data streams that broke.");
    describe_counter!(SENDER_DECISIONS, "Stream counts chosen, by controller.");
    describe_counter!(SENDER_TRANSFERS, "Transfers ended, by outcome.");
    describe_counter!(
        SENDER_RETRANSMITS,
        "TCP segments retransmitted by ended transfers."
    );
    describe_counter!(RECEIVER_BYTES, Unit::Bytes, "Bytes verified and written.");
    describe_gauge!(RECEIVER_SESSIONS, "Sessions being served.");
    describe_counter!(RECEIVER_SESSIONS_ENDED, "Sessions ended, by outcome.");
    describe_gauge!(RECEIVER_STREAMS, "Data streams open.");
    describe_counter!(RECEIVER_REFUSED, "Connections and sessions refused.");
}

/// One of something that is open (a stream, a session) in a gauge, for as long as it lives.
pub(crate) struct Open(&'static str);

impl Open {
    fn new(name: &'static str) -> Open {
        gauge!(name).increment(1.0);
        Open(name)
    }

    /// A sender's data stream.
    pub(crate) fn sender_stream() -> Open {
        Open::new(SENDER_STREAMS)
    }

    /// A receiver's data stream.
    pub(crate) fn receiver_stream() -> Open {
        Open::new(RECEIVER_STREAMS)
    }

    /// A receiver's session.
    pub(crate) fn receiver_session() -> Open {
        Open::new(RECEIVER_SESSIONS)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        gauge!(self.0).decrement(1.0);
    }
}

/// The receiver acknowledged `bytes` of a transfer.
pub(crate) fn sender_acked(bytes: u64) {
    counter!(SENDER_BYTES).increment(bytes);
}

/// A sender's stream broke.
pub(crate) fn sender_stream_broke() {
    counter!(SENDER_STREAM_FAILURES).increment(1);
}

/// `controller` chose a stream count.
pub(crate) fn sender_decided(controller: &str) {
    counter!(SENDER_DECISIONS, "controller" => controller.to_owned()).increment(1);
}

/// A transfer ended so.
pub(crate) fn sender_transfer_ended(outcome: &Result<Summary, SendError>) {
    let label = match outcome {
        Ok(summary) => {
            counter!(SENDER_RETRANSMITS).increment(summary.retransmits);
            "completed"
        }
        Err(SendError::Cancelled) => "cancelled",
        Err(_) => "failed",
    };
    counter!(SENDER_TRANSFERS, "outcome" => label).increment(1);
}

/// The receiver verified and wrote `bytes`.
pub(crate) fn receiver_wrote(bytes: u64) {
    counter!(RECEIVER_BYTES).increment(bytes);
}

/// A session ended so.
pub(crate) fn receiver_session_ended(outcome: &SessionOutcome) {
    let label = match outcome {
        SessionOutcome::Completed => "completed",
        SessionOutcome::Disconnected(_) => "disconnected",
        SessionOutcome::EndedByReceiver(_) => "ended_by_receiver",
        SessionOutcome::Failed(_) => "failed",
    };
    counter!(RECEIVER_SESSIONS_ENDED, "outcome" => label).increment(1);
}

/// The receiver refused a connection or a session.
pub(crate) fn receiver_refused() {
    counter!(RECEIVER_REFUSED).increment(1);
}
