//! Stopping a receiver without losing work: it takes no new session, lets those running finish
//! for a grace period, then ends the rest. Every chunk a session verified is journaled, so a
//! sender whose session was ended resumes by starting the same transfer again.

use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use super::Shared;
use crate::session_id::SessionId;
use crate::sync::unpoisoned;

/// What a sender is told when its running session is ended by a stop.
pub(super) const STOPPING: &str =
    "the receiver is shutting down; start the transfer again later to send the rest";

/// How long sessions told of the stop get to hear it on their streams before their
/// connections are closed.
const TELL_THEN_CLOSE: Duration = Duration::from_secs(2);

/// When a receiver stops, once asked to.
#[derive(Default)]
pub(super) struct StopState {
    /// When the grace period ends; `None` while serving normally.
    deadline: Mutex<Option<Instant>>,
}

/// What a stopping receiver does to the sessions still running.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Stage {
    /// Serving normally.
    Serving,
    /// No new sessions; running ones go on.
    Draining,
    /// The grace period is over: running sessions are told to stop.
    Telling,
    /// Their connections are closed.
    Closing,
}

impl StopState {
    /// Starts the stop, or shortens a stop under way to end no later than `grace` from now.
    pub(super) fn begin(&self, grace: Duration) {
        let end = Instant::now() + grace;
        let mut deadline = unpoisoned(self.deadline.lock());
        *deadline = Some(deadline.map_or(end, |d| d.min(end)));
    }

    /// Whether the receiver takes no new session.
    pub(super) fn is_stopping(&self) -> bool {
        unpoisoned(self.deadline.lock()).is_some()
    }

    /// Where the stop is at `now`.
    pub(super) fn stage(&self, now: Instant) -> Stage {
        match *unpoisoned(self.deadline.lock()) {
            None => Stage::Serving,
            Some(d) if now < d => Stage::Draining,
            Some(d) if now < d + TELL_THEN_CLOSE => Stage::Telling,
            Some(_) => Stage::Closing,
        }
    }
}

/// Stops a receiver, or ends one of its sessions, from any thread
/// ([`super::Receiver::stopper`]). Cloning it is cheap, and
/// it does not keep the receiver alive.
///
/// ```
/// use std::time::Duration;
/// use transfer::auth::SessionKey;
/// use transfer::receiver::{Receiver, ReceiverSettings};
///
/// let root = tempfile::tempdir()?;
/// let receiver = Receiver::bind(&ReceiverSettings::new(root.path().into(), SessionKey::generate().1).listen("127.0.0.1:0"))?;
/// let stopper = receiver.stopper();
/// drop(receiver);
/// stopper.stop(Duration::ZERO); // a receiver that is gone: nothing to do
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Stopper(pub(super) Weak<Shared>);

impl Stopper {
    /// Stops taking new sessions at once (a sender that tries is told the receiver is
    /// shutting down) and lets the sessions running finish for up to `grace`. Those still
    /// running then are told to stop and, two seconds later, their connections are closed;
    /// what they verified stays journaled. [`super::Receiver::serve`] returns once no session
    /// is left. Calling it again can only shorten the grace period.
    ///
    /// ```
    /// use std::time::Duration;
    /// use transfer::auth::SessionKey;
    /// use transfer::receiver::{Receiver, ReceiverSettings};
    ///
    /// let root = tempfile::tempdir()?;
    /// let receiver = Receiver::bind(&ReceiverSettings::new(root.path().into(), SessionKey::generate().1).listen("127.0.0.1:0"))?;
    /// let stopper = receiver.stopper();
    /// let serving = std::thread::spawn(move || receiver.serve(None));
    /// stopper.stop(Duration::from_secs(600)); // sessions running may take 10 minutes
    /// stopper.stop(Duration::ZERO); // a second request (another SIGTERM): end them now
    /// serving.join().unwrap()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stop(&self, grace: Duration) {
        if let Some(shared) = self.0.upgrade() {
            let running = shared
                .sessions_open
                .load(std::sync::atomic::Ordering::Acquire);
            tracing::info!(
                "stopping: no new sessions; {running} running may finish within {grace:.0?}"
            );
            shared.stop.begin(grace);
        }
    }

    /// Ends one running session (a service cancelling an inbound transfer): its streams tell
    /// the sender `reason` at their next chunk and, two seconds later, its connections are
    /// closed. What it verified stays journaled, so the sender resumes by starting the same
    /// transfer again. Returns whether such a session was running. Its
    /// [`super::SessionReport`] says [`super::SessionOutcome::EndedByReceiver`].
    ///
    /// A portal that cancels the inbound transfers of a project over quota:
    ///
    /// ```
    /// use transfer::auth::SessionKey;
    /// use transfer::receiver::{Receiver, ReceiverSettings, ReceiverEvent};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let root = tempfile::tempdir()?;
    /// let receiver = Receiver::bind(&ReceiverSettings::new(root.path().into(), SessionKey::generate().1).listen("127.0.0.1:0"))?;
    /// let (stopper, mut events) = (receiver.stopper(), receiver.subscribe());
    /// std::thread::spawn(move || receiver.serve(None));
    /// std::thread::spawn(move || {
    ///     while let Some(event) = events.blocking_next() {
    ///         match event {
    ///             ReceiverEvent::SessionStarted { session, dest, .. } if dest.starts_with("over-quota/") => {
    ///                 stopper.end_session(session, "project over quota: ask for more space");
    ///             }
    ///             _ => {}
    ///         }
    ///     }
    /// });
    /// # Ok(())
    /// # }
    /// ```
    pub fn end_session(&self, session: SessionId, reason: &str) -> bool {
        let Some(shared) = self.0.upgrade() else {
            return false;
        };
        let Some(running) = super::find_session(&shared, &session.0) else {
            return false;
        };
        tracing::info!(session = %running.name, %reason, "ending the session");
        running.end(reason);
        let closing = running.clone();
        let spawned = std::thread::Builder::new()
            .name("xfer-end-session".into())
            .spawn(move || {
                std::thread::sleep(TELL_THEN_CLOSE);
                closing.close();
            });
        if spawned.is_err() {
            running.close();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_drains_then_tells_then_closes_and_a_second_stop_only_shortens_it() {
        let state = StopState::default();
        let now = Instant::now();
        assert_eq!(state.stage(now), Stage::Serving);
        assert!(!state.is_stopping());
        state.begin(Duration::from_secs(60));
        assert!(state.is_stopping());
        assert_eq!(state.stage(now), Stage::Draining);
        let at = |secs| now + Duration::from_secs(secs);
        assert_eq!(state.stage(at(61)), Stage::Telling);
        assert_eq!(state.stage(at(63)), Stage::Closing);
        state.begin(Duration::from_secs(600));
        assert_eq!(
            state.stage(at(61)),
            Stage::Telling,
            "a longer grace is not granted"
        );
        state.begin(Duration::ZERO);
        assert_eq!(state.stage(at(1)), Stage::Telling);
    }
}
