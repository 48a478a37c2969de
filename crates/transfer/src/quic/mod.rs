//! QUIC (RFC 9000) with quinn: each xfer data stream is its own QUIC connection, so that N
//! streams are N congestion controllers, as N TCP connections are (N streams on one QUIC
//! connection would share one controller and be one flow to the network).
//!
//! The control connection stays TCP with TLS. A receiver serving QUIC listens for UDP on the
//! same port number as for TCP. When a sender asks for QUIC on the authenticated control
//! connection, the receiver makes a certificate for that session alone, answers with its hash,
//! and serves it to QUIC clients that name the session as the TLS server name; the sender
//! accepts no other certificate. On each QUIC connection the data stream then proves the
//! session key like a TCP stream does, bound to the connection's TLS exporter value.
//!
//! Everything here is asynchronous and runs on a runtime its user owns: the receiver's (its
//! connections are tasks of it, read and written by the crate's `task_io`) or a QUIC
//! transfer's own. Endpoints are made in that runtime's context, where quinn spawns their
//! drivers; no runtime is process-wide. Only [`Congestion`] is part of the library's API.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::congestion::{BbrConfig, CubicConfig, NewRenoConfig};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use serde::{Deserialize, Serialize};

use crate::auth::ChannelBinding;
use crate::sync::unpoisoned;
use crate::tcp_info::TcpInfo;
use crate::tls::{self, ReceiverCertificate};

/// The application protocol both sides name in the TLS handshake.
const ALPN: &[u8] = b"xfer";
/// Flow-control window of a connection's stream, bytes: what one connection can have in flight
/// (like a TCP connection's largest window; N connections have N of them).
const STREAM_WINDOW: u32 = 16 << 20;
/// A connection whose peer sent nothing for this long is closed (keep-alives are sent far more
/// often, so only a vanished peer reaches it).
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often an otherwise quiet sender says it is alive.
const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// Socket buffer asked for on each UDP socket, both ways (the kernel caps it at
/// `net.core.rmem_max` / `wmem_max`). The default of about 200 KiB overflows at a few Gbit/s,
/// and every datagram it drops is a loss to the congestion controller.
const UDP_BUFFER: usize = 8 << 20;

/// The congestion controller of each QUIC connection (the sender's: data flows its way).
///
/// ```
/// use transfer::quic::Congestion;
///
/// #[derive(serde::Deserialize)]
/// struct Settings {
///     congestion: Congestion,
/// }
/// let s: Settings = toml::from_str(r#"congestion = "bbr""#).unwrap();
/// assert_eq!(s.congestion, Congestion::Bbr);
/// assert_eq!(Congestion::default(), Congestion::Cubic);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Congestion {
    /// CUBIC (RFC 9438), as Linux TCP uses by default.
    #[default]
    Cubic,
    /// BBR: paced at the measured bottleneck rate, not driven by loss.
    Bbr,
    /// NewReno (RFC 9002's reference controller).
    NewReno,
}

impl Congestion {
    /// The name used on the command line and in reports.
    ///
    /// ```
    /// assert_eq!(transfer::quic::Congestion::NewReno.name(), "new_reno");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Congestion::Cubic => "cubic",
            Congestion::Bbr => "bbr",
            Congestion::NewReno => "new_reno",
        }
    }

    fn factory(self) -> Arc<dyn quinn::congestion::ControllerFactory + Send + Sync> {
        match self {
            Congestion::Cubic => Arc::new(CubicConfig::default()),
            Congestion::Bbr => Arc::new(BbrConfig::default()),
            Congestion::NewReno => Arc::new(NewRenoConfig::default()),
        }
    }
}

impl std::fmt::Display for Congestion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Congestion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Congestion::Cubic, Congestion::Bbr, Congestion::NewReno]
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| {
                format!("unknown congestion controller {s:?} (expected cubic, bbr or new_reno)")
            })
    }
}

/// The TLS server name by which a QUIC client asks for `session`'s certificate.
fn server_name(session: &[u8; 16]) -> String {
    let hex: String = session.iter().map(|b| format!("{b:02x}")).collect();
    format!("s{hex}.xfer")
}

/// An endpoint on a UDP socket bound to `addr`, with large socket buffers; a server when it
/// has a `server` configuration. Called in a runtime's context, where quinn spawns the
/// endpoint's driver.
fn endpoint(addr: SocketAddr, server: Option<quinn::ServerConfig>) -> io::Result<quinn::Endpoint> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    // Best effort: a smaller buffer only costs speed.
    let _ = socket.set_recv_buffer_size(UDP_BUFFER);
    let _ = socket.set_send_buffer_size(UDP_BUFFER);
    socket.bind(&addr.into())?;
    quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        server,
        socket.into(),
        Arc::new(quinn::TokioRuntime),
    )
}

fn transport_config(congestion: Congestion) -> quinn::TransportConfig {
    let mut config = quinn::TransportConfig::default();
    config
        .max_concurrent_bidi_streams(1u32.into())
        .max_concurrent_uni_streams(0u32.into())
        .stream_receive_window(STREAM_WINDOW.into())
        .receive_window(STREAM_WINDOW.into())
        .send_window(u64::from(STREAM_WINDOW))
        .max_idle_timeout(Some(IDLE_TIMEOUT.try_into().expect("a valid idle timeout")))
        .congestion_controller_factory(congestion.factory());
    config
}

fn quic_error(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("QUIC: {e}"))
}

/// One QUIC connection carrying one xfer stream: a handle for statistics and closing.
#[derive(Clone)]
pub(crate) struct QuicConnection {
    connection: quinn::Connection,
    /// A sender's own endpoint (each connection has its own UDP socket); a receiver's
    /// connections share the server's.
    _endpoint: Option<quinn::Endpoint>,
}

impl std::fmt::Debug for QuicConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QuicConnection({})", self.connection.remote_address())
    }
}

impl QuicConnection {
    /// The connection's path statistics in the shape of `TCP_INFO`, so that the optimiser
    /// reads QUIC as it reads TCP: packets for segments, lost packets for retransmitted ones,
    /// UDP payload bytes sent and not lost for bytes acknowledged (it includes the bytes in
    /// flight, which cancel out when two samples are differenced), the path MTU for the
    /// segment size and the window in MTUs. `None` once the connection has closed.
    pub(crate) fn sample(&self) -> Option<TcpInfo> {
        if self.connection.close_reason().is_some() {
            return None;
        }
        let stats = self.connection.stats();
        let path = stats.path;
        let mtu = u32::from(path.current_mtu).max(1);
        let micros = |d: Duration| u32::try_from(d.as_micros()).unwrap_or(u32::MAX);
        Some(TcpInfo {
            rtt_us: micros(path.rtt),
            min_rtt_us: micros(path.min_rtt),
            // 32 bits like the kernel's counters; the meter differences them with wrapping.
            total_retrans: path.lost_packets as u32,
            data_segs_out: path.sent_packets as u32,
            bytes_acked: stats.udp_tx.bytes.saturating_sub(path.lost_bytes),
            bytes_retrans: path.lost_bytes,
            delivery_rate: 0,
            snd_cwnd: u32::try_from(path.cwnd / u64::from(mtu)).unwrap_or(u32::MAX),
            snd_mss: mtu,
            // quinn reports no threshold; its first congestion event ends slow start as TCP's.
            snd_ssthresh: if path.congestion_events == 0 {
                crate::tcp_info::INFINITE_SSTHRESH
            } else {
                u32::try_from(path.cwnd / u64::from(mtu)).unwrap_or(u32::MAX)
            },
        })
    }

    /// Closes the connection at once (what is unsent is dropped); reads and writes on its
    /// stream fail. Any thread may call it.
    pub(crate) fn close(&self) {
        self.connection.close(0u32.into(), b"closed");
    }

    /// Once the connection is closed, by either end.
    pub(crate) async fn closed(&self) {
        self.connection.closed().await;
    }

    fn channel_binding(&self) -> io::Result<ChannelBinding> {
        let mut binding = [0u8; 32];
        self.connection
            .export_keying_material(&mut binding, tls::EXPORTER_LABEL, b"")
            .map_err(|_| quic_error("cannot export keying material"))?;
        Ok(ChannelBinding(binding))
    }
}

/// A new connection's stream, both halves, and the binding its key handshake proves.
pub(crate) struct QuicStream {
    /// The connection, for statistics and closing.
    pub(crate) connection: QuicConnection,
    /// What is sent to the peer.
    pub(crate) send: quinn::SendStream,
    /// What the peer sends.
    pub(crate) recv: quinn::RecvStream,
    /// The connection's TLS exporter value.
    pub(crate) binding: ChannelBinding,
}

impl QuicStream {
    fn new(
        connection: QuicConnection,
        (send, recv): (quinn::SendStream, quinn::RecvStream),
    ) -> io::Result<QuicStream> {
        Ok(QuicStream {
            binding: connection.channel_binding()?,
            connection,
            send,
            recv,
        })
    }
}

/// The sender's side: opens connections to one receiver session, accepting only the
/// certificate announced for it.
pub(crate) struct QuicClient {
    config: quinn::ClientConfig,
    check: Arc<ReceiverCertificate>,
    server_name: String,
}

impl QuicClient {
    /// A client for the session `session` whose certificate hashes to `certificate` (both
    /// come from the authenticated control connection, `Welcome` and `QuicOffer`), with
    /// `congestion` on every connection.
    pub(crate) fn new(
        session: &[u8; 16],
        certificate: [u8; 32],
        congestion: Congestion,
    ) -> io::Result<QuicClient> {
        let check = Arc::new(ReceiverCertificate::pinned(certificate));
        let mut tls = tls::client_config(check.clone())?;
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let crypto = QuicClientConfig::try_from(tls).map_err(quic_error)?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        let mut transport = transport_config(congestion);
        transport.keep_alive_interval(Some(KEEP_ALIVE));
        config.transport_config(Arc::new(transport));
        Ok(QuicClient {
            config,
            check,
            server_name: server_name(session),
        })
    }

    /// Opens a connection (on its own UDP socket) to `addr` and its stream; the caller bounds
    /// the wait. Runs in the runtime that drives the connection.
    pub(crate) async fn connect(&self, addr: SocketAddr) -> Result<QuicStream, QuicError> {
        let unspecified: SocketAddr = if addr.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let endpoint = endpoint(unspecified, None)?;
        let connecting = endpoint
            .connect_with(self.config.clone(), addr, &self.server_name)
            .map_err(quic_error)?;
        let opened = async {
            let connection = connecting.await?;
            let stream = connection.open_bi().await?;
            Ok::<_, quinn::ConnectionError>((connection, stream))
        };
        let (connection, stream) = match opened.await {
            Ok(opened) => opened,
            Err(_) if self.check.was_mismatched() => return Err(QuicError::WrongCertificate),
            Err(e) => return Err(quic_error(e).into()),
        };
        let connection = QuicConnection {
            connection,
            _endpoint: Some(endpoint),
        };
        Ok(QuicStream::new(connection, stream)?)
    }
}

/// Why a QUIC connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QuicError {
    /// The receiver showed a certificate other than the one announced for the session.
    #[error(
        "the receiver's QUIC certificate is not the one its control connection announced \
         (another host answers on that address?)"
    )]
    WrongCertificate,
    /// The connection failed.
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Certificates of the sessions a receiver serves over QUIC, by the server name clients ask for.
#[derive(Debug, Default)]
struct SessionCertificates(Mutex<HashMap<String, Arc<CertifiedKey>>>);

impl ResolvesServerCert for SessionCertificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name()?;
        unpoisoned(self.0.lock()).get(name).cloned()
    }
}

/// The receiver's side: one UDP endpoint serving every session's connections.
pub(crate) struct QuicServer {
    endpoint: quinn::Endpoint,
    certificates: Arc<SessionCertificates>,
}

impl QuicServer {
    /// Listens for QUIC on UDP `addr`, its endpoint driven by `runtime`.
    pub(crate) fn bind(
        addr: SocketAddr,
        runtime: &tokio::runtime::Handle,
    ) -> io::Result<QuicServer> {
        let certificates = Arc::new(SessionCertificates::default());
        let mut tls = rustls::ServerConfig::builder_with_provider(tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls::tls_error)?
            .with_no_client_auth()
            .with_cert_resolver(certificates.clone());
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let crypto = QuicServerConfig::try_from(tls).map_err(quic_error)?;
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        config.transport_config(Arc::new(transport_config(Congestion::default())));
        let endpoint = {
            let _entered = runtime.enter();
            endpoint(addr, Some(config))?
        };
        Ok(QuicServer {
            endpoint,
            certificates,
        })
    }

    /// Makes a certificate for `session` and serves it to clients that name the session;
    /// returns its hash, for the sender to pin.
    pub(crate) fn add_session(&self, session: &[u8; 16]) -> io::Result<[u8; 32]> {
        let name = server_name(session);
        let (certificate, key) = tls::self_signed(&name)?;
        let hash = tls::certificate_hash(&certificate);
        let key = tls::provider()
            .key_provider
            .load_private_key(key)
            .map_err(tls::tls_error)?;
        let certified = Arc::new(CertifiedKey::new(vec![certificate], key));
        let mut certificates = unpoisoned(self.certificates.0.lock());
        certificates.insert(name, certified);
        Ok(hash)
    }

    /// Stops serving `session`'s certificate: no new connection can join it.
    pub(crate) fn remove_session(&self, session: &[u8; 16]) {
        let mut certificates = unpoisoned(self.certificates.0.lock());
        certificates.remove(&server_name(session));
    }

    /// The next connection a client opens; `None` once the endpoint is closed.
    pub(crate) async fn accept(&self) -> Option<quinn::Incoming> {
        self.endpoint.accept().await
    }
}

/// Completes an incoming connection's handshake and takes its stream; the caller bounds the
/// wait.
pub(crate) async fn accept_stream(incoming: quinn::Incoming) -> io::Result<QuicStream> {
    let accepted = async {
        let connection = incoming.await?;
        let stream = connection.accept_bi().await?;
        Ok::<_, quinn::ConnectionError>((connection, stream))
    };
    let (connection, stream) = accepted.await.map_err(quic_error)?;
    QuicStream::new(
        QuicConnection {
            connection,
            _endpoint: None,
        },
        stream,
    )
}

#[cfg(test)]
mod tests;
