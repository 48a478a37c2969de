//! What a receiver tells the service that embeds it: sessions starting and ending (with what
//! each moved and how it ended) and connections it refused, as a stream of
//! [`ReceiverEvent`]s from [`super::Receiver::subscribe`].

use std::net::SocketAddr;

use serde::Serialize;
use tokio::sync::broadcast;

use crate::session_id::SessionId;

/// Events held for a subscriber that has not read them yet; one that falls further behind is
/// told how many it missed ([`ReceiverEvent::Missed`]).
const EVENT_BUFFER: usize = 1024;

/// Something that happened at the receiver.
///
/// ```
/// use transfer::receiver::ReceiverEvent;
///
/// /// What a portal shows of an event.
/// fn shown(event: &ReceiverEvent) -> String {
///     match event {
///         ReceiverEvent::SessionStarted { session, tenant, peer, dest } => {
///             format!("{peer} started {} into {}/{dest}", session.short(), tenant.as_deref().unwrap_or("-"))
///         }
///         ReceiverEvent::SessionEnded(report) => format!("{}: {}", report.session.short(), report.outcome),
///         ReceiverEvent::Refused { peer, reason } => format!("refused {peer}: {reason}"),
///         ReceiverEvent::Missed { events } => format!("({events} events not shown)"),
///         other => format!("{other:?}"), // kinds of event a later version brings
///     }
/// }
/// let refused = ReceiverEvent::Refused { peer: "10.0.0.9:51000".parse()?, reason: "wrong key".into() };
/// assert_eq!(shown(&refused), "refused 10.0.0.9:51000: wrong key");
/// # Ok::<(), std::net::AddrParseError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReceiverEvent {
    /// A sender authenticated and named where its files go; its data streams may join now.
    SessionStarted {
        /// The session's id (the sender's [`crate::sender::Summary::session`]).
        session: SessionId,
        /// The tenant whose key the sender proved ([`super::Tenant`]); `None` for the
        /// receiver's own key.
        tenant: Option<String>,
        /// The sender's control connection.
        peer: SocketAddr,
        /// Where under the root its files land (empty: the root itself).
        dest: String,
    },
    /// A session ended: what it moved, and how it ended.
    SessionEnded(SessionReport),
    /// A connection or a session was refused before any data: a wrong key, a limit, a
    /// destination outside the root, a receiver that is stopping.
    Refused {
        /// Who was refused.
        peer: SocketAddr,
        /// Why, as the peer was told.
        reason: String,
    },
    /// This subscriber fell behind and this many events were dropped before the next.
    Missed {
        /// How many.
        events: u64,
    },
}

/// One session from start to end, as the receiver saw it.
///
/// ```
/// use transfer::receiver::{SessionOutcome, SessionReport};
/// use transfer::session_id::SessionId;
///
/// let report = SessionReport {
///     session: SessionId([7; 16]),
///     tenant: Some("climate".into()),
///     peer: "10.0.0.2:40000".parse()?,
///     dest: "run42".into(),
///     files_announced: 3,
///     bytes_announced: 3 << 30,
///     files_placed: 3,
///     files_held: 0,
///     bytes_received: 2 << 30,
///     seconds: 4.0,
///     outcome: SessionOutcome::Completed,
/// };
/// // One of the three GiB was there from an earlier, interrupted run.
/// let gbit_per_s = report.bytes_received as f64 * 8.0 / report.seconds / 1e9;
/// assert!((gbit_per_s - 4.29).abs() < 0.01);
/// # Ok::<(), std::net::AddrParseError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionReport {
    /// The session's id.
    pub session: SessionId,
    /// The tenant whose key the sender proved; `None` for the receiver's own key.
    pub tenant: Option<String>,
    /// The sender's control connection.
    pub peer: SocketAddr,
    /// Where under the root its files land.
    pub dest: String,
    /// Files its manifest announced (those it already had included).
    pub files_announced: u64,
    /// Their bytes.
    pub bytes_announced: u64,
    /// Files verified whole and put in place under their own names in this session.
    pub files_placed: u64,
    /// Files of a striped transfer ([`crate::stripe`]) whose share this session verified
    /// while other ranges were still due: the session that receives the last range places
    /// each.
    pub files_held: u64,
    /// Bytes of the chunks this session's streams delivered and verified (a chunk a sender
    /// sent twice, a straggler's copy at the tail, counts twice; chunks held from an earlier
    /// run are not sent again).
    pub bytes_received: u64,
    /// From authentication to the end.
    pub seconds: f64,
    /// How it ended.
    pub outcome: SessionOutcome,
}

/// How a session ended. Whatever the end, every chunk it verified stays journaled: the same
/// transfer started again sends only the rest.
///
/// ```
/// use transfer::receiver::SessionOutcome;
///
/// let cut = SessionOutcome::Disconnected("connection reset by peer".into());
/// assert_eq!(cut.to_string(), "disconnected: connection reset by peer");
/// // A workflow starts its next step only on a complete arrival.
/// assert!(!cut.is_completed());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "reason", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SessionOutcome {
    /// Every file of the manifest is in place.
    Completed,
    /// The sender's connection closed or broke before it finished: a cancelled or killed
    /// sender, a cut network.
    Disconnected(String),
    /// The receiver ended it: it was stopping ([`super::Stopper::stop`]) or was asked to
    /// ([`super::Stopper::end_session`]).
    EndedByReceiver(String),
    /// It broke a rule or could not be served: a protocol error, a path it may not write, a
    /// full disk.
    Failed(String),
}

impl SessionOutcome {
    /// Whether every file arrived.
    ///
    /// ```
    /// use transfer::receiver::SessionOutcome;
    ///
    /// assert!(SessionOutcome::Completed.is_completed());
    /// assert!(!SessionOutcome::EndedByReceiver("maintenance".into()).is_completed());
    /// ```
    pub fn is_completed(&self) -> bool {
        *self == SessionOutcome::Completed
    }
}

impl std::fmt::Display for SessionOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionOutcome::Completed => f.write_str("completed"),
            SessionOutcome::Disconnected(why) => write!(f, "disconnected: {why}"),
            SessionOutcome::EndedByReceiver(why) => write!(f, "ended by the receiver: {why}"),
            SessionOutcome::Failed(why) => write!(f, "failed: {why}"),
        }
    }
}

/// The receiver's side: publishes events to every subscriber (none: they are dropped).
pub(super) struct Publisher(broadcast::Sender<ReceiverEvent>);

impl Default for Publisher {
    fn default() -> Self {
        Publisher(broadcast::channel(EVENT_BUFFER).0)
    }
}

impl Publisher {
    /// Tells every subscriber.
    pub(super) fn publish(&self, event: ReceiverEvent) {
        let _ = self.0.send(event);
    }

    /// A new subscriber, which sees the events from now on.
    pub(super) fn subscribe(&self) -> ReceiverEvents {
        ReceiverEvents(self.0.subscribe())
    }
}

/// A subscription to a receiver's events ([`super::Receiver::subscribe`]). Events wait for it
/// in a bounded buffer: one that reads too slowly is told what it missed instead of holding the
/// receiver's memory.
///
/// Each session's report as one JSON line, for a log collector:
///
/// ```
/// use transfer::auth::SessionKey;
/// use transfer::receiver::{Receiver, ReceiverSettings, ReceiverEvent};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let root = tempfile::tempdir()?;
/// let receiver = Receiver::bind(&ReceiverSettings::new(root.path().into(), SessionKey::generate().1).listen("127.0.0.1:0"))?;
/// let mut events = receiver.subscribe();
/// std::thread::spawn(move || {
///     while let Some(event) = events.blocking_next() {
///         if let ReceiverEvent::SessionEnded(_) = event {
///             println!("{}", serde_json::to_string(&event).unwrap());
///         }
///     }
/// });
/// # Ok(())
/// # }
/// ```
pub struct ReceiverEvents(broadcast::Receiver<ReceiverEvent>);

impl ReceiverEvents {
    /// The next event, waiting for it; `None` once the receiver is gone and every event has
    /// been read. Suits any async runtime.
    ///
    /// ```
    /// use transfer::auth::SessionKey;
    /// use transfer::receiver::{Receiver, ReceiverSettings};
    ///
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let root = tempfile::tempdir()?;
    /// let receiver = Receiver::bind(&ReceiverSettings::new(root.path().into(), SessionKey::generate().1).listen("127.0.0.1:0"))?;
    /// let mut events = receiver.subscribe();
    /// drop(receiver);
    /// assert_eq!(events.next().await, None, "the receiver is gone");
    /// # Ok(())
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(example()).unwrap();
    /// ```
    pub async fn next(&mut self) -> Option<ReceiverEvent> {
        Self::received(self.0.recv().await)
    }

    /// [`ReceiverEvents::next`] for threads outside an async runtime (it panics inside one).
    ///
    /// ```
    /// use transfer::auth::SessionKey;
    /// use transfer::receiver::{Receiver, ReceiverSettings};
    ///
    /// let root = tempfile::tempdir()?;
    /// let receiver = Receiver::bind(&ReceiverSettings::new(root.path().into(), SessionKey::generate().1).listen("127.0.0.1:0"))?;
    /// let mut events = receiver.subscribe();
    /// drop(receiver);
    /// assert_eq!(events.blocking_next(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn blocking_next(&mut self) -> Option<ReceiverEvent> {
        Self::received(self.0.blocking_recv())
    }

    /// An event already waiting, if any (never waits); `None` also once the receiver is gone.
    ///
    /// ```
    /// use transfer::auth::SessionKey;
    /// use transfer::receiver::{Receiver, ReceiverSettings};
    ///
    /// let root = tempfile::tempdir()?;
    /// let receiver = Receiver::bind(&ReceiverSettings::new(root.path().into(), SessionKey::generate().1).listen("127.0.0.1:0"))?;
    /// let mut events = receiver.subscribe();
    /// assert_eq!(events.try_next(), None, "nothing has happened yet");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_next(&mut self) -> Option<ReceiverEvent> {
        use broadcast::error::TryRecvError;
        match self.0.try_recv() {
            Ok(event) => Some(event),
            Err(TryRecvError::Lagged(events)) => Some(ReceiverEvent::Missed { events }),
            Err(TryRecvError::Empty | TryRecvError::Closed) => None,
        }
    }

    fn received(
        result: Result<ReceiverEvent, broadcast::error::RecvError>,
    ) -> Option<ReceiverEvent> {
        use broadcast::error::RecvError;
        match result {
            Ok(event) => Some(event),
            Err(RecvError::Lagged(events)) => Some(ReceiverEvent::Missed { events }),
            Err(RecvError::Closed) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(n: u16) -> ReceiverEvent {
        ReceiverEvent::Refused {
            peer: SocketAddr::from(([127, 0, 0, 1], n)),
            reason: "wrong key".into(),
        }
    }

    #[test]
    fn a_subscriber_sees_events_from_its_subscription_on_and_is_told_what_it_missed() {
        let publisher = Publisher::default();
        publisher.publish(refused(1));
        let mut events = publisher.subscribe();
        assert_eq!(
            events.try_next(),
            None,
            "nothing from before the subscription"
        );
        publisher.publish(refused(2));
        assert_eq!(events.blocking_next(), Some(refused(2)));
        for n in 0..EVENT_BUFFER as u16 + 10 {
            publisher.publish(refused(n));
        }
        assert_eq!(
            events.try_next(),
            Some(ReceiverEvent::Missed { events: 10 })
        );
        assert_eq!(events.try_next(), Some(refused(10)));
        drop(publisher);
        let mut left = 0;
        while events.blocking_next().is_some() {
            left += 1;
        }
        assert_eq!(left, EVENT_BUFFER - 1, "what was buffered is still read");
    }

    #[test]
    fn events_serialise_for_a_log_collector() {
        let report = ReceiverEvent::SessionEnded(SessionReport {
            session: SessionId([1; 16]),
            tenant: None,
            peer: SocketAddr::from(([10, 0, 0, 2], 40000)),
            dest: "run42".into(),
            files_announced: 3,
            bytes_announced: 300,
            files_placed: 2,
            files_held: 0,
            bytes_received: 200,
            seconds: 1.5,
            outcome: SessionOutcome::Disconnected("connection reset".into()),
        });
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["event"], "session_ended");
        assert_eq!(json["session"], "01".repeat(16));
        assert_eq!(json["peer"], "10.0.0.2:40000");
        assert_eq!(json["outcome"]["kind"], "disconnected");
        assert_eq!(json["outcome"]["reason"], "connection reset");
    }
}
