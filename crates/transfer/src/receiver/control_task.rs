//! A session's control connection served as a task of the receiver's runtime, from its
//! `Welcome` to its end, instead of a thread of its own and a heartbeat thread beside it.
//!
//! The connection's task did its key handshake, took the session's places and sent `Welcome`
//! ([`super::handshake`]). It then reads where the files go (`Start`), opens the destination
//! and registers the session, then hands each message
//! to the session's rules ([`ControlSession`]) and writes their replies until the session ends.
//! The rules may take long (a batch's plan, a large file's BLAKE3, the final flush to stable
//! storage): they run on the runtime's blocking threads, and the task meanwhile sends `Working`
//! every [`HEARTBEAT`], as it does while it waits for the sender, so that the sender can tell a
//! receiver busy for it from one that is gone.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::time::{interval, Interval, MissedTickBehavior};

use super::control::{ControlSession, SessionFiles, Step};
use super::destination::{Destination, DestinationError, Placement, Sealed};
use super::grants;
use super::{offer_quic, ReceiverEvent, Session, SessionOutcome, SessionReport, Shared, LINGER};
use crate::auth;
use crate::idle::Activity;
use crate::link::Connection;
use crate::manifest::ManifestBatch;
use crate::session_id::SessionId;
use crate::sync::unpoisoned;
use crate::task_io::TaskConn;
use crate::telemetry;
use crate::wire::{self, FileStatus, Message, Removal, WireError, HEARTBEAT};

/// The receiver's places taken by a session (of all sessions, and of its key's), given back
/// when it drops.
pub(super) struct SessionPlaces {
    shared: Arc<Shared>,
    tenant: usize,
}

impl SessionPlaces {
    /// Takes a place among the receiver's sessions and one among those of the key `tenant`
    /// serves; the limit that refuses it otherwise.
    pub(super) fn take(shared: &Arc<Shared>, tenant: usize) -> Result<SessionPlaces, wire::Limit> {
        let served = &shared.served[tenant];
        if !super::take_unit(&shared.sessions_open, shared.options.max_sessions) {
            let max = shared.options.max_sessions as u64;
            return Err(wire::Limit::Sessions { max });
        }
        if !super::take_unit(&served.sessions_open, served.max_sessions) {
            shared.sessions_open.fetch_sub(1, Ordering::AcqRel);
            let max = served.max_sessions as u64;
            return Err(wire::Limit::TenantSessions { max });
        }
        Ok(SessionPlaces {
            shared: shared.clone(),
            tenant,
        })
    }
}

impl Drop for SessionPlaces {
    fn drop(&mut self) {
        self.shared.served[self.tenant]
            .sessions_open
            .fetch_sub(1, Ordering::AcqRel);
        self.shared.sessions_open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Who is on a control connection that was welcomed, and what the session holds.
pub(super) struct Welcomed {
    pub(super) peer: SocketAddr,
    /// The session's id, sent in `Welcome`.
    pub(super) id: [u8; 16],
    /// What its key handshake agreed, which its session's key is derived from.
    pub(super) agreed: auth::Agreed,
    /// Whether it is TLS.
    pub(super) encrypted: bool,
    /// Whether its frames are sealed ([`crate::seal`]).
    pub(super) sealed: bool,
    /// Another handle to the connection, to close it from elsewhere.
    pub(super) connection: Option<Connection>,
    pub(super) places: SessionPlaces,
    /// The key it proved (a served key, or a one-time credential), which its session's key
    /// is derived from.
    pub(super) key: auth::SessionKey,
    /// Proven with a one-time credential: the one directory its session may write to.
    pub(super) granted: Option<Vec<u8>>,
}

/// Serves a control connection `conn` from its `Welcome` until the session ends, and closes it.
pub(super) async fn serve(welcomed: Welcomed, mut conn: TaskConn) {
    let shared = welcomed.places.shared.clone();
    // Until the session exists, `Start` must come within the handshake's limit.
    conn.watch(Activity::new(), shared.options.handshake_timeout);
    conn.set_message_limit(shared.options.max_manifest);
    serve_session(&shared, &mut conn, welcomed).await;
    conn.close(false, LINGER).await;
    shared.sessions_ended.fetch_add(1, Ordering::AcqRel);
}

/// The connection's heartbeat: `Working` every [`HEARTBEAT`] from `Welcome` on, which tells
/// the sender that the receiver is still there, and busy for the session when it is.
pub(super) fn heartbeat() -> Interval {
    let mut beat = interval(HEARTBEAT);
    beat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    beat.reset();
    beat
}

/// The next message, sending the heartbeat while it is awaited.
async fn next_message(conn: &mut TaskConn, beats: &mut Interval) -> Result<Message, WireError> {
    loop {
        tokio::select! {
            message = conn.next_message() => return message,
            _ = beats.tick() => reply(conn, &Message::Working).await?,
        }
    }
}

/// Writes `message` and sends it with whatever was held back.
pub(super) async fn reply(conn: &mut TaskConn, message: &Message) -> Result<(), WireError> {
    wire::write_message(&mut conn.replies, message)?;
    conn.flush().await?;
    Ok(())
}

/// Tells `peer` why its session is refused, and logs, counts and publishes it.
pub(super) async fn refuse(shared: &Shared, conn: &mut TaskConn, peer: SocketAddr, reason: String) {
    super::refuse(shared, &mut conn.replies, peer, reason);
    let _ = conn.flush().await;
}

/// A control connection from `Welcome` on: where the files go, then the manifest's batches
/// (each answered by its plan) and the files' seals until the session finishes or fails.
async fn serve_session(shared: &Arc<Shared>, conn: &mut TaskConn, welcomed: Welcomed) {
    let options = &shared.options;
    let Welcomed {
        peer,
        id,
        agreed,
        encrypted,
        sealed,
        connection,
        places,
        key,
        granted,
    } = welcomed;
    let name = SessionId(id).short();
    let mut beats = heartbeat();
    let writes = shared.served[places.tenant].access.writes();
    let (dest, sink, present, delete, striped) = match next_message(conn, &mut beats).await {
        Ok(Message::Start { dest, .. })
            if granted
                .as_ref()
                .is_some_and(|g| grants::directory(&dest).as_ref() != Ok(g)) =>
        {
            let granted = String::from_utf8_lossy(granted.as_deref().unwrap_or_default());
            let reason = format!(
                "this one-time credential is for one session to {granted:?}, not to {:?}",
                String::from_utf8_lossy(&dest)
            );
            return refuse(shared, conn, peer, reason).await;
        }
        Ok(ref message @ (Message::Fetch { .. } | Message::Grant { .. })) if granted.is_some() => {
            let reason = format!(
                "a one-time credential sends one session of files here, not a {}",
                auth::name(message)
            );
            return refuse(shared, conn, peer, reason).await;
        }
        Ok(Message::Grant { dest }) if writes => {
            return grant(shared, conn, peer, places.tenant, dest).await
        }
        Ok(Message::Start { .. } | Message::Grant { .. }) if !writes => {
            let served = &shared.served[places.tenant];
            let reason = format!(
                "{} may not send files here (its access is {}): it can only fetch them",
                served.shown(),
                served.access
            );
            return refuse(shared, conn, peer, reason).await;
        }
        Ok(Message::Fetch { request }) => {
            return super::fetch_task::serve(shared, conn, peer, places.tenant, request).await
        }
        Ok(Message::Start {
            dest,
            sink,
            present,
            delete,
            striped,
        }) => (dest, sink, present, delete, striped),
        Ok(other) => {
            let reason = format!("expected Start, got {}", auth::name(&other));
            return refuse(shared, conn, peer, reason).await;
        }
        Err(e) => return tracing::warn!("session {name} from {peer}: {e}"),
    };
    let started = Instant::now();
    let dest_shown = String::from_utf8_lossy(&dest).into_owned();
    let served = &shared.served[places.tenant];
    let placement = Placement {
        root: &served.root,
        dest: &dest,
        owner: id,
        active: &served.active,
        max_unsealed: options.max_unsealed,
        budget: &shared.unsealed,
        direct_io: options.direct_io,
        present,
        delete: delete.as_ref(),
        striped,
    };
    let dest = match tokio::task::block_in_place(|| Destination::open(placement, sink)) {
        Ok(dest) => dest,
        Err(e) => return refuse(shared, conn, peer, e.to_string()).await,
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
        key: key.for_session(&agreed, &id),
        limits: served.limits,
        name,
        encrypted,
        sealed,
        dest,
        activity: Activity::new(),
        streams: AtomicU32::new(0),
        bytes_received: AtomicU64::new(0),
        failure: Mutex::new(None),
        ended_by_receiver: Default::default(),
        connections: Mutex::new(Some(Vec::new())),
        control: connection,
    });
    unpoisoned(shared.sessions.lock()).insert(id, session.clone());
    // From now on the sender's address has places of its own for its streams' handshakes.
    let _known = shared.admission.session_from(peer.ip());
    conn.watch(session.activity.clone(), options.idle_timeout);
    let mut control = ControlSession::default();
    let outcome = serve_messages(shared, &session, conn, &mut beats, &mut control).await;
    let announced = control.announced();
    unpoisoned(shared.sessions.lock()).remove(&id);
    if let Some(quic) = &shared.quic {
        quic.remove_session(&id);
    }
    let connections = unpoisoned(session.connections.lock()).take();
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
        files_held: announced.held,
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

/// Grants a one-time credential for one session of `tenant`'s to `dest`
/// ([`super::grants`]), and tells the client.
async fn grant(
    shared: &Shared,
    conn: &mut TaskConn,
    peer: SocketAddr,
    tenant: usize,
    dest: Vec<u8>,
) {
    let dest = match grants::directory(&dest) {
        Ok(dest) => dest,
        Err(reason) => return refuse(shared, conn, peer, reason).await,
    };
    let shown = String::from_utf8_lossy(&dest).into_owned();
    match shared.grants.grant(tenant, dest, Instant::now()) {
        Ok(key) => {
            tracing::info!(%peer, tenant = shared.served[tenant].name, dest = shown, "one-time credential granted");
            let _ = reply(conn, &Message::Granted { key }).await;
        }
        Err(reason) => refuse(shared, conn, peer, reason).await,
    }
}

/// Reads the control connection's messages and writes their replies as `control` says, until
/// the session is over. Each message is handled on a blocking thread, with the heartbeat going
/// on while it is.
async fn serve_messages(
    shared: &Arc<Shared>,
    session: &Arc<Session>,
    conn: &mut TaskConn,
    beats: &mut Interval,
    control: &mut ControlSession,
) -> Result<(), SessionOutcome> {
    let lost = |e: &dyn std::fmt::Display| SessionOutcome::Disconnected(e.to_string());
    loop {
        let step = match next_message(conn, beats).await {
            Ok(message) => match handle(shared, session, conn, beats, control, message).await {
                Ok(step) => step,
                Err(outcome) => return Err(outcome),
            },
            Err(e @ WireError::Io(_)) => return Err(lost(&e)),
            Err(e) => control.damaged(&e),
        };
        if let Some(message) = &step.reply {
            if let Err(e) = reply(conn, message).await {
                return match (step.end, e) {
                    (Some(Err(failed)), _) => Err(failed),
                    (_, e @ WireError::Io(_)) => Err(lost(&e)),
                    (_, e) => Err(SessionOutcome::Failed(e.to_string())),
                };
            }
        }
        if let Some(end) = step.end {
            return end;
        }
    }
}

/// Hands `message` to the session's rules on a blocking thread, sending the heartbeat while
/// they work; what they say to do, or how the session failed if they could not finish.
async fn handle(
    shared: &Arc<Shared>,
    session: &Arc<Session>,
    conn: &mut TaskConn,
    beats: &mut Interval,
    control: &mut ControlSession,
    message: Message,
) -> Result<Step, SessionOutcome> {
    let mut files = LiveFiles {
        shared: shared.clone(),
        session: session.clone(),
    };
    let mut rules = std::mem::take(control);
    let mut handling = tokio::task::spawn_blocking(move || {
        let step = rules.handle(message, &mut files);
        (rules, step)
    });
    let mut beating = true;
    let handled = loop {
        tokio::select! {
            handled = &mut handling => break handled,
            // A beat that cannot be sent stops the heartbeat; the rules still finish their
            // step (the session's account keeps it), and the reply finds the connection gone.
            _ = beats.tick(), if beating => {
                beating = reply(conn, &Message::Working).await.is_ok();
            }
        }
    };
    match handled {
        Ok((rules, step)) => {
            *control = rules;
            Ok(step)
        }
        Err(e) => Err(SessionOutcome::Failed(format!(
            "the receiver failed while handling a control message: {e}"
        ))),
    }
}

/// A session's files and QUIC endpoint as its control messages act on them
/// ([`ControlSession`]): each long step (a batch's plan, a large file's BLAKE3) under the
/// session's busy mark, which keeps the session's idle clock from running meanwhile.
struct LiveFiles {
    shared: Arc<Shared>,
    session: Arc<Session>,
}

impl SessionFiles for LiveFiles {
    fn add_batch(
        &mut self,
        batch: &ManifestBatch,
    ) -> Result<(u32, Vec<FileStatus>), DestinationError> {
        let _busy = self.session.activity.busy();
        self.session.dest.add_batch(batch)
    }

    fn seal(&mut self, file: u32, blake3: Option<[u8; 32]>) -> Result<Sealed, DestinationError> {
        let _busy = self.session.activity.busy();
        self.session.dest.seal(file, blake3)
    }

    fn finish(&mut self) -> Result<Removal, DestinationError> {
        let _busy = self.session.activity.busy();
        self.session.dest.finish()
    }

    fn offer_quic(&mut self) -> Result<[u8; 32], String> {
        offer_quic(&self.shared, &self.session)
    }
}

/// A session's control messages as the receiver handles them, with no connection: the
/// destination `dest` checked and made under `root`, then each message handed to the session's
/// rules ([`ControlSession`]) with that destination's files (QUIC is not served), until the
/// session ends. Returns the replies, how it ended (`None`: it had not), and what the manifest
/// announced.
#[cfg(feature = "fuzzing")]
pub(crate) fn control_for_fuzzing(
    root: &std::path::Path,
    dest: &[u8],
    messages: Vec<Message>,
) -> crate::fuzzing::ControlRun {
    /// The destination alone, without heartbeat or QUIC.
    struct Unattended(Destination);

    impl SessionFiles for Unattended {
        fn add_batch(
            &mut self,
            batch: &ManifestBatch,
        ) -> Result<(u32, Vec<FileStatus>), DestinationError> {
            self.0.add_batch(batch)
        }
        fn seal(
            &mut self,
            file: u32,
            blake3: Option<[u8; 32]>,
        ) -> Result<Sealed, DestinationError> {
            self.0.seal(file, blake3)
        }
        fn finish(&mut self) -> Result<Removal, DestinationError> {
            self.0.finish()
        }
        fn offer_quic(&mut self) -> Result<[u8; 32], String> {
            Err("QUIC is not served here".into())
        }
    }

    let mut run = crate::fuzzing::ControlRun::default();
    let active = Arc::default();
    let placement = Placement {
        root,
        dest,
        owner: [0; 16],
        active: &active,
        max_unsealed: 1 << 10,
        budget: &super::announced::Budget::new(1 << 10),
        direct_io: false,
        // A fresh root holds no file to verify or compare.
        present: crate::wire::PresentFiles::Kept,
        delete: None,
        striped: false,
    };
    let mut files = match Destination::open(placement, crate::manifest::SinkKind::Files) {
        Ok(destination) => Unattended(destination),
        Err(e) => {
            run.end = Some(Err(e.to_string()));
            return run;
        }
    };
    let mut control = ControlSession::default();
    for message in messages {
        let step = control.handle(message, &mut files);
        run.replies.extend(step.reply);
        if let Some(end) = step.end {
            run.end = Some(end.map_err(|e| e.to_string()));
            break;
        }
    }
    let announced = control.announced();
    (run.files_announced, run.files_placed) = (announced.files, announced.placed);
    run
}
