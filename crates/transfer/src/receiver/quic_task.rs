//! QUIC connections served as tasks of the receiver's runtime, from their first packet to
//! their end: no thread is started for them, and none waits on the runtime from outside. The
//! endpoint's accept loop is a task ([`accept`]); each connection it admits is another, which
//! completes the QUIC handshake, does the key handshake with the receiver's rules
//! ([`Challenged`]) within the handshake deadline while holding its place ([`super::admission`]),
//! and then serves the data stream as a TCP stream's task does ([`stream_task::serve`]).
//! QUIC carries data streams only: a control connection is refused in its key handshake.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::timeout;

use super::stream_task;
use super::{admit_stream, find_session, key_for, refused, Admitted, Proves, Shared, LINGER};
use crate::auth::{self, Challenged, HANDSHAKE_MESSAGE_LIMIT};
use crate::idle::Activity;
use crate::link::Connection;
use crate::quic::{self, QuicConnection};
use crate::task_io::TaskConn;
use crate::wire::{self, Message};

/// Accepts QUIC connections while it lives, when the receiver serves QUIC.
pub(super) struct Accepting(tokio::task::JoinHandle<()>);

impl Drop for Accepting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts accepting the QUIC connections of a receiver that serves QUIC, until the guard
/// returned drops: each is admitted to its handshake ([`Shared::admit`]) or refused at once.
pub(super) fn accept(shared: &Arc<Shared>) -> Option<Accepting> {
    shared.quic.as_ref()?;
    let shared = shared.clone();
    let runtime = shared.streams.clone();
    Some(Accepting(runtime.spawn(async move {
        let Some(quic) = &shared.quic else { return };
        while let Some(incoming) = quic.accept().await {
            let peer = incoming.remote_address();
            match shared.admit(peer) {
                Ok(admitted) => _ = tokio::spawn(serve(shared.clone(), incoming, peer, admitted)),
                Err(limit) => {
                    incoming.refuse();
                    refused(&shared, peer, limit.to_string());
                }
            }
        }
    })))
}

/// A QUIC connection whose key handshake is done: the stream, and what it proved.
struct Proven {
    conn: TaskConn,
    connection: QuicConnection,
    proves: Proves,
}

/// Why a QUIC connection did not get past its handshakes: what to log, and whether it ran out
/// of time (which makes its address suspect, [`Admitted::failed`]).
struct Failed {
    reason: String,
    timed_out: bool,
}

/// Serves one QUIC connection from `peer`, admitted to its handshake, to its end.
async fn serve(
    shared: Arc<Shared>,
    incoming: quinn::Incoming,
    peer: SocketAddr,
    mut admitted: Admitted,
) {
    let limit = shared.options.handshake_timeout;
    let proven = match timeout(limit, handshake(&shared, incoming)).await {
        Ok(proven) => proven,
        Err(_) => Err(Failed {
            reason: format!(
                "QUIC: handshake not done within {limit:.0?} (the most a connection may take \
                 to authenticate)"
            ),
            timed_out: true,
        }),
    };
    if let Err(Failed {
        timed_out: true, ..
    }) = &proven
    {
        admitted.failed(&io::ErrorKind::TimedOut.into());
    }
    drop(admitted);
    let Proven {
        mut conn,
        connection,
        proves,
    } = match proven {
        Ok(proven) => proven,
        Err(failed) => return refused(&shared, peer, failed.reason),
    };
    // The key handshake refuses a control connection over QUIC.
    let Proves::Data { session } = proves else {
        connection.close();
        return;
    };
    let Some(session) = find_session(&shared, &session) else {
        super::refuse(
            &shared,
            &mut conn.replies,
            peer,
            "the session has ended".into(),
        );
        return conn.close(false, LINGER).await;
    };
    let handle = Ok(Connection::Quic(connection));
    let Some(open) = admit_stream(&shared, &session, &mut conn.replies, peer, handle) else {
        return conn.close(false, LINGER).await;
    };
    conn.set_message_limit(stream_task::MAX_STREAM_MESSAGE);
    conn.watch(session.activity.clone(), shared.options.idle_timeout);
    // Its `Welcome` goes out before the stream first waits for the sender.
    stream_task::serve(session, peer, conn, open).await;
}

/// Completes the QUIC handshake of `incoming` and takes its stream, then does the key
/// handshake on it: the client's `Hello` answered by a `Challenge` and its proof checked
/// ([`Challenged`]); each refusal told to the client.
async fn handshake(shared: &Shared, incoming: quinn::Incoming) -> Result<Proven, Failed> {
    let failed = |reason: String| Failed {
        reason,
        timed_out: false,
    };
    let stream = quic::accept_stream(incoming)
        .await
        .map_err(|e| failed(format!("QUIC: {e}")))?;
    let connection = stream.connection.clone();
    let binding = stream.binding;
    // The handshake's deadline bounds every read until the stream is welcomed.
    let max_chunk = shared.options.max_chunk as usize;
    let mut conn = TaskConn::quic(stream, Activity::new(), Duration::MAX, max_chunk);
    conn.set_message_limit(HANDSHAKE_MESSAGE_LIMIT);
    let mut proves = None;
    let hello = conn.next_message().await;
    let rules = Challenged::from_hello(hello, &binding, |asked| {
        let (key, what) = key_for(shared, asked, true, true)?;
        proves = Some(what);
        Ok(key)
    });
    let proven = match rules {
        Ok((challenged, challenge)) => match send(&mut conn, &challenge).await {
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
            conn.close(false, LINGER).await;
            return Err(failed(refusal.error.to_string()));
        }
    };
    if let Some((incoming, outgoing)) = proven.frame_keys {
        if let Err(e) = conn.seal(incoming, outgoing) {
            connection.close();
            return Err(failed(e.to_string()));
        }
    }
    match proves {
        Some(proves) => Ok(Proven {
            conn,
            connection,
            proves,
        }),
        None => {
            connection.close();
            Err(failed("a handshake that proved nothing".into()))
        }
    }
}

/// Writes `message` and sends it with whatever was held back.
async fn send(conn: &mut TaskConn, message: &Message) -> Result<(), auth::AuthError> {
    wire::write_message(&mut conn.replies, message)?;
    conn.flush()
        .await
        .map_err(|e| auth::AuthError::Wire(e.into()))?;
    Ok(())
}
