//! QUIC connections served as tasks of the receiver's runtime, from their first packet to their
//! end: the endpoint's accept loop is a task ([`accept`]), and each connection it admits is
//! another, which completes the QUIC handshake and takes the connection's stream, then goes on
//! as every new connection does ([`handshake`]). QUIC carries data streams only: a control
//! connection is refused in its key handshake.

use std::sync::Arc;

use super::handshake::{self, Failed, Opened};
use super::{refused, Shared};
use crate::idle::Activity;
use crate::link::Connection;
use crate::quic;
use crate::task_io::TaskConn;

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
                Ok(admitted) => {
                    let opening = open(shared.clone(), incoming);
                    tokio::spawn(handshake::serve(shared.clone(), peer, admitted, opening));
                }
                Err(limit) => {
                    incoming.refuse();
                    refused(&shared, peer, limit.to_string());
                }
            }
        }
    })))
}

/// Completes the QUIC handshake of `incoming` and takes its stream.
async fn open(shared: Arc<Shared>, incoming: quinn::Incoming) -> Result<Opened, Failed> {
    let stream = quic::accept_stream(incoming)
        .await
        .map_err(|e| Failed::new(format!("QUIC: {e}")))?;
    let connection = stream.connection.clone();
    let binding = stream.binding;
    // The handshake's deadline bounds every wait until the stream is welcomed.
    let options = &shared.options;
    let limit = options.handshake_timeout;
    let max_chunk = options.max_chunk as usize;
    Ok(Opened {
        conn: TaskConn::quic(stream, Activity::new(), limit, max_chunk),
        binding,
        connection: Connection::Quic(connection),
        encrypted: true,
        over_quic: true,
    })
}
