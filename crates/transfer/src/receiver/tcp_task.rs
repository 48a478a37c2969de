//! A TCP connection served as a task of the receiver's runtime from the moment it is accepted:
//! its socket set up, TLS told from plain by its first bytes and TLS's handshake driven by the
//! task, then its key handshake and the rest ([`handshake`]). No thread is started for it: the
//! receiver's threads do not grow with the connections in their handshake either.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use super::handshake::{self, Failed, Opened};
use super::{Admitted, Shared};
use crate::auth::ChannelBinding;
use crate::idle::Activity;
use crate::link::Connection;
use crate::task_io::TaskConn;

/// Serves the accepted connection `socket` from `peer`, admitted to its handshake, as a task
/// of the receiver's runtime; the calling thread goes on at once.
pub(super) fn start(shared: &Arc<Shared>, socket: TcpStream, peer: SocketAddr, admitted: Admitted) {
    let opening = open(shared.clone(), socket);
    shared
        .streams
        .spawn(handshake::serve(shared.clone(), peer, admitted, opening));
}

/// Readies an accepted connection for its key handshake: its socket's options, and TLS when
/// the client opens with it.
async fn open(shared: Arc<Shared>, socket: TcpStream) -> Result<Opened, Failed> {
    let prepared = (|| {
        socket.set_nodelay(true)?;
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(60))
            .with_interval(Duration::from_secs(10))
            .with_retries(6);
        socket2::SockRef::from(&socket).set_tcp_keepalive(&keepalive)?;
        socket.try_clone()
    })();
    let handle = prepared.map_err(Failed::new)?;
    let options = &shared.options;
    // The handshake's deadline bounds every wait until the connection is welcomed.
    let limit = options.handshake_timeout;
    let max_chunk = options.max_chunk as usize;
    let mut conn = TaskConn::tcp(socket, Activity::new(), limit, max_chunk).map_err(Failed::new)?;
    let encrypted = conn.starts_tls().await.map_err(Failed::new)?;
    let binding = if encrypted {
        let tls = shared.tls.server_connection().map_err(Failed::new)?;
        match conn.accept_tls(tls).await {
            Ok(binding) => binding,
            Err(e) => return Err(Failed::closing(e, conn)),
        }
    } else {
        ChannelBinding::PLAIN
    };
    Ok(Opened {
        conn,
        binding,
        connection: Connection::Tcp(handle),
        encrypted,
        over_quic: false,
    })
}
