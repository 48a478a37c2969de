//! A new connection as a task, from its first byte to what it proves, TCP or QUIC alike: its
//! transport opened (`tcp_task`: TLS or not; `quic_task`: the QUIC handshake), then the key
//! handshake by the receiver's rules ([`Challenged`]), all within the handshake deadline and
//! while it holds its place ([`super::admission`]). Then it is served as what it proved: a
//! session's control connection (its places and `Welcome`, then [`control_task`]) or a data
//! stream of a running session ([`super::admit_stream`], then [`stream_task`]).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::time::timeout;

use super::control_task::{self, SessionPlaces};
use super::{
    admit_stream, find_session, key_for, refuse, refused, stream_task, Admitted, Proves, Shared,
    LINGER,
};
use crate::auth::{self, Challenged, ChannelBinding, SessionKey, HANDSHAKE_MESSAGE_LIMIT};
use crate::link::Connection;
use crate::session_id::SessionId;
use crate::task_io::TaskConn;
use crate::wire::{self, Limit, Message};

/// A new connection whose transport is ready for the key handshake.
pub(super) struct Opened {
    pub(super) conn: TaskConn,
    /// What the key handshake's proofs are bound to: the TLS (or QUIC) exporter value, or
    /// [`ChannelBinding::PLAIN`].
    pub(super) binding: ChannelBinding,
    /// A handle to the connection, to close it from elsewhere.
    pub(super) connection: Connection,
    /// TLS or QUIC.
    pub(super) encrypted: bool,
    /// QUIC, which carries data streams only.
    pub(super) over_quic: bool,
}

/// Why a new connection did not get through its handshakes: what to log, and the connection
/// to close, with what it was told, once its place is given back.
pub(super) struct Failed {
    reason: String,
    conn: Option<TaskConn>,
}

impl Failed {
    /// A handshake that failed for `reason`.
    pub(super) fn new(reason: impl std::fmt::Display) -> Failed {
        Failed {
            reason: reason.to_string(),
            conn: None,
        }
    }

    /// A handshake that failed for `reason` on `conn`, which is closed once the place is free.
    pub(super) fn closing(reason: impl std::fmt::Display, conn: TaskConn) -> Failed {
        Failed {
            reason: reason.to_string(),
            conn: Some(conn),
        }
    }
}

/// A connection whose key handshake is done: it, and what it proved.
struct Proven {
    opened: Opened,
    proves: Proves,
    asked: auth::Asked,
    agreed: auth::Agreed,
}

/// Serves a new connection from `peer`, admitted to its handshake: `opening` readies its
/// transport, the key handshake follows, both within the handshake deadline; then it is served
/// to its end as what it proved.
///
/// A connection that fails its handshakes gives its place back before it closes, so that a
/// peer that finds it closed finds the place free.
pub(super) async fn serve(
    shared: Arc<Shared>,
    peer: SocketAddr,
    mut admitted: Admitted,
    opening: impl Future<Output = Result<Opened, Failed>>,
) {
    let limit = shared.options.handshake_timeout;
    // Boxed, so that it can be dropped, with the connection in it, after the place is free.
    let mut handshakes = Box::pin(async { authenticate(&shared, opening.await?).await });
    let proven = match timeout(limit, handshakes.as_mut()).await {
        Ok(proven) => proven,
        Err(_) => {
            admitted.timed_out();
            drop(admitted);
            // The connection closes only now, with the handshake it was in.
            drop(handshakes);
            let reason = format!(
                "handshake not done within {limit:.0?} (the most a connection may take to \
                 authenticate)"
            );
            return refused(&shared, peer, reason);
        }
    };
    drop(admitted);
    let proven = match proven {
        Ok(proven) => proven,
        Err(failed) => {
            refused(&shared, peer, failed.reason);
            if let Some(mut conn) = failed.conn {
                conn.close(false, LINGER).await;
            }
            return;
        }
    };
    match proven.proves {
        Proves::Control { tenant } => {
            let key = shared.served[tenant].key.clone();
            control(&shared, peer, tenant, (key, None), proven).await
        }
        Proves::Granted { credential } => {
            match shared.grants.take(&credential, std::time::Instant::now()) {
                Some(granted) => {
                    let proved = (granted.key, Some(granted.dest));
                    control(&shared, peer, granted.tenant, proved, proven).await
                }
                None => {
                    let mut conn = proven.opened.conn;
                    let reason = "the one-time credential was used already, or expired".into();
                    refuse(&shared, &mut conn.replies, peer, reason);
                    conn.close(false, LINGER).await;
                }
            }
        }
        Proves::Data { session } => data(&shared, peer, session, proven.opened).await,
    }
}

/// The key handshake on an opened connection: the client's `Hello` answered by a `Challenge`
/// and its proof checked ([`Challenged`]); each refusal told to the client before the
/// connection closes.
async fn authenticate(shared: &Shared, mut opened: Opened) -> Result<Proven, Failed> {
    let conn = &mut opened.conn;
    conn.set_message_limit(HANDSHAKE_MESSAGE_LIMIT);
    let mut proves = None;
    let hello = conn.next_message().await;
    let rules = Challenged::from_hello(hello, &opened.binding, |asked| {
        let (key, what) = key_for(shared, asked, opened.over_quic, opened.encrypted)?;
        proves = Some(what);
        Ok(key)
    });
    let proven = match rules {
        Ok((challenged, challenge)) => match send(conn, &challenge).await {
            Ok(()) => challenged.auth(conn.next_message().await),
            Err(e) => Err(e.into()),
        },
        Err(refusal) => Err(refusal),
    };
    let proven = match proven {
        Ok(proven) => proven,
        Err(refusal) => {
            if let Some(reason) = refusal.told {
                let _ = wire::write_message(&mut conn.replies, &Message::Refused { reason });
            }
            return Err(Failed::closing(refusal.error, opened.conn));
        }
    };
    if let Some((incoming, outgoing)) = proven.frame_keys {
        if let Err(e) = conn.seal(incoming, outgoing) {
            return Err(Failed::closing(e, opened.conn));
        }
    }
    let Some(proves) = proves else {
        return Err(Failed::closing(
            "a handshake that proved nothing",
            opened.conn,
        ));
    };
    Ok(Proven {
        opened,
        proves,
        asked: proven.asked,
        agreed: proven.agreed,
    })
}

/// Writes `message` and sends it with whatever was held back.
async fn send(conn: &mut TaskConn, message: &Message) -> Result<(), auth::AuthError> {
    wire::write_message(&mut conn.replies, message)?;
    (conn.flush().await).map_err(|e| auth::AuthError::Wire(e.into()))?;
    Ok(())
}

/// A control connection past its key handshake, proving `proved`: the key `tenant` serves, or
/// a one-time credential it granted for one session to a directory. Refused when the receiver
/// is stopping or its sessions (or its key's) are full, else welcomed and served to the
/// session's end ([`control_task`]).
async fn control(
    shared: &Arc<Shared>,
    peer: SocketAddr,
    tenant: usize,
    proved: (SessionKey, Option<Vec<u8>>),
    proven: Proven,
) {
    let (key, granted) = proved;
    let Proven {
        opened,
        asked,
        agreed,
        ..
    } = proven;
    let mut conn = opened.conn;
    let welcomed = if shared.stop.is_stopping() {
        Err(Limit::ShuttingDown)
    } else {
        SessionPlaces::take(shared, tenant)
    };
    let places = match welcomed {
        Ok(places) => places,
        Err(limit) => {
            super::refuse_over(shared, &mut conn.replies, peer, limit);
            conn.close(false, LINGER).await;
            shared.sessions_ended.fetch_add(1, Ordering::AcqRel);
            return;
        }
    };
    let id = auth::random_bytes::<16>();
    let welcome = Message::Welcome {
        session: id,
        limits: shared.served[tenant].limits,
    };
    if let Err(e) = send(&mut conn, &welcome).await {
        tracing::warn!("session {} from {peer}: {e}", SessionId(id).short());
        conn.close(false, LINGER).await;
        shared.sessions_ended.fetch_add(1, Ordering::AcqRel);
        return;
    }
    let welcomed = control_task::Welcomed {
        peer,
        id,
        agreed,
        encrypted: opened.encrypted,
        sealed: asked.sealed,
        connection: Some(opened.connection),
        places,
        key,
        granted,
    };
    control_task::serve(welcomed, conn).await;
}

/// A data stream of the running session `session` past its key handshake: admitted and
/// served to its end ([`stream_task`]), or told why not.
async fn data(shared: &Shared, peer: SocketAddr, session: [u8; 16], opened: Opened) {
    let Opened {
        mut conn,
        connection,
        ..
    } = opened;
    let Some(session) = find_session(shared, &session) else {
        refuse(
            shared,
            &mut conn.replies,
            peer,
            "the session has ended".into(),
        );
        return conn.close(false, LINGER).await;
    };
    let Some(open) = admit_stream(shared, &session, &mut conn.replies, peer, connection) else {
        return conn.close(false, LINGER).await;
    };
    conn.set_message_limit(stream_task::MAX_STREAM_MESSAGE);
    conn.watch(session.activity.clone(), shared.options.idle_timeout);
    // Its `Welcome` goes out before the stream first waits for the sender.
    stream_task::serve(session, peer, conn, open).await;
}
