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
//! The protocol code is synchronous: [`QuicReader`] and [`QuicWriter`] are blocking `Read` and
//! `Write` over a QUIC stream, driven by one tokio runtime per process that runs the
//! endpoints.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use quinn::congestion::{BbrConfig, CubicConfig, NewRenoConfig};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use serde::{Deserialize, Serialize};

use crate::auth::ChannelBinding;
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
/// How often a connection being opened asks whether its caller still wants it.
pub const GIVE_UP_POLL: Duration = Duration::from_millis(100);
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

/// The runtime that drives every QUIC endpoint of this process.
fn runtime() -> io::Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .thread_name("xfer-quic")
        .enable_all()
        .build()
        .map_err(|e| io::Error::other(format!("cannot start the QUIC runtime: {e}")))?;
    Ok(RUNTIME.get_or_init(|| rt))
}

/// Runs `future` to completion on the calling thread (never a runtime thread), failing with
/// `TimedOut` after `limit` when one is given.
fn block_on<T>(
    limit: Option<Duration>,
    future: impl std::future::Future<Output = T>,
) -> io::Result<T> {
    let rt = runtime()?;
    match limit {
        None => Ok(rt.block_on(future)),
        Some(limit) => rt
            .block_on(async { tokio::time::timeout(limit, future).await })
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "timed out")),
    }
}

/// The TLS server name by which a QUIC client asks for `session`'s certificate.
fn server_name(session: &[u8; 16]) -> String {
    let hex: String = session.iter().map(|b| format!("{b:02x}")).collect();
    format!("s{hex}.xfer")
}

/// An endpoint on a UDP socket bound to `addr`, with large socket buffers; a server when it
/// has a `server` configuration. Called in the runtime's context.
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

/// One QUIC connection carrying one xfer stream.
///
/// ```
/// # use std::io::{Read, Write};
/// # use std::time::Duration;
/// # use transfer::quic::{Congestion, QuicClient, QuicServer};
/// # let server = QuicServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
/// # let addr = server.local_addr().unwrap();
/// # let session = [3u8; 16];
/// # let certificate = server.add_session(&session).unwrap();
/// # let _accepting = server.accept_while(Duration::from_secs(5), |_| Some(()), |stream, _, ()| {
/// #     let Ok(mut stream) = stream else { return };
/// #     let mut buf = [0u8; 5];
/// #     stream.reader.read_exact(&mut buf).unwrap();
/// #     stream.writer.write_all(&buf).unwrap();
/// #     stream.writer.finish();
/// #     stream.connection.wait_closed(Duration::from_secs(5));
/// # }).unwrap();
/// # let client = QuicClient::new(&session, certificate, Congestion::Cubic).unwrap();
/// # let mut stream = client.connect(addr, Duration::from_secs(5), || false).unwrap();
/// stream.writer.write_all(b"hello").unwrap();
/// let mut echo = Vec::new();
/// stream.reader.read_to_end(&mut echo).unwrap();
/// assert_eq!(echo, b"hello");
/// stream.connection.close();
/// ```
#[derive(Clone)]
pub struct QuicConnection {
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
    ///
    /// ```
    /// # use std::io::{Read, Write};
    /// # use std::time::Duration;
    /// # use transfer::quic::{Congestion, QuicClient, QuicServer};
    /// # let server = QuicServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    /// # let addr = server.local_addr().unwrap();
    /// # let session = [3u8; 16];
    /// # let certificate = server.add_session(&session).unwrap();
    /// # let _accepting = server.accept_while(Duration::from_secs(5), |_| Some(()), |stream, _, ()| {
    /// #     let Ok(mut stream) = stream else { return };
    /// #     let mut buf = [0u8; 5];
    /// #     stream.reader.read_exact(&mut buf).unwrap();
    /// #     stream.writer.write_all(&buf).unwrap();
    /// #     stream.writer.finish();
    /// #     stream.connection.wait_closed(Duration::from_secs(5));
    /// # }).unwrap();
    /// # let client = QuicClient::new(&session, certificate, Congestion::Cubic).unwrap();
    /// # let mut stream = client.connect(addr, Duration::from_secs(5), || false).unwrap();
    /// stream.writer.write_all(b"hello").unwrap();
    /// stream.reader.read_to_end(&mut Vec::new()).unwrap();
    /// let info = stream.connection.sample().unwrap();
    /// assert!(info.snd_mss >= 1200 && info.rtt_us > 0);
    /// stream.connection.close();
    /// assert_eq!(stream.connection.sample(), None);
    /// ```
    pub fn sample(&self) -> Option<TcpInfo> {
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

    /// Closes the connection at once (what is unsent is dropped); blocked reads and writes fail.
    ///
    /// ```
    /// # use std::io::{Read, Write};
    /// # use std::time::Duration;
    /// # use transfer::quic::{Congestion, QuicClient, QuicServer};
    /// # let server = QuicServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    /// # let addr = server.local_addr().unwrap();
    /// # let session = [3u8; 16];
    /// # let certificate = server.add_session(&session).unwrap();
    /// # let _accepting = server.accept_while(Duration::from_secs(5), |_| Some(()), |stream, _, ()| {
    /// #     let Ok(mut stream) = stream else { return };
    /// #     let mut buf = [0u8; 5];
    /// #     stream.reader.read_exact(&mut buf).unwrap();
    /// #     stream.writer.write_all(&buf).unwrap();
    /// #     stream.writer.finish();
    /// #     stream.connection.wait_closed(Duration::from_secs(5));
    /// # }).unwrap();
    /// # let client = QuicClient::new(&session, certificate, Congestion::Cubic).unwrap();
    /// # let mut stream = client.connect(addr, Duration::from_secs(5), || false).unwrap();
    /// stream.connection.close();
    /// assert!(stream.reader.read(&mut [0; 1]).is_err() || stream.reader.read(&mut [0; 1]).unwrap() == 0);
    /// ```
    pub fn close(&self) {
        self.connection.close(0u32.into(), b"closed");
    }

    /// Waits until the peer closes the connection, at most `limit`.
    ///
    /// ```
    /// # use std::io::{Read, Write};
    /// # use std::time::Duration;
    /// # use transfer::quic::{Congestion, QuicClient, QuicServer};
    /// # let server = QuicServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    /// # let addr = server.local_addr().unwrap();
    /// # let session = [3u8; 16];
    /// # let certificate = server.add_session(&session).unwrap();
    /// # let _accepting = server.accept_while(Duration::from_secs(5), |_| Some(()), |stream, _, ()| {
    /// #     let Ok(mut stream) = stream else { return };
    /// #     let mut buf = [0u8; 5];
    /// #     stream.reader.read_exact(&mut buf).unwrap();
    /// #     stream.writer.write_all(&buf).unwrap();
    /// #     stream.writer.finish();
    /// #     stream.connection.wait_closed(Duration::from_secs(5));
    /// # }).unwrap();
    /// # let client = QuicClient::new(&session, certificate, Congestion::Cubic).unwrap();
    /// # let mut stream = client.connect(addr, Duration::from_secs(5), || false).unwrap();
    /// let started = std::time::Instant::now();
    /// stream.connection.wait_closed(Duration::from_millis(200)); // the peer waits for us to close
    /// assert!(started.elapsed() >= Duration::from_millis(200));
    /// ```
    pub fn wait_closed(&self, limit: Duration) {
        let _ = block_on(Some(limit), self.connection.closed());
    }

    fn channel_binding(&self) -> io::Result<ChannelBinding> {
        let mut binding = [0u8; 32];
        self.connection
            .export_keying_material(&mut binding, tls::EXPORTER_LABEL, b"")
            .map_err(|_| quic_error("cannot export keying material"))?;
        Ok(ChannelBinding(binding))
    }
}

/// The reading half of a connection's stream: a blocking `Read`.
///
/// ```
/// # use std::io::{Read, Write};
/// # use std::time::Duration;
/// # use transfer::quic::{Congestion, QuicClient, QuicServer};
/// # let server = QuicServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
/// # let addr = server.local_addr().unwrap();
/// # let session = [3u8; 16];
/// # let certificate = server.add_session(&session).unwrap();
/// # let _accepting = server.accept_while(Duration::from_secs(5), |_| Some(()), |stream, _, ()| {
/// #     let Ok(mut stream) = stream else { return };
/// #     let mut buf = [0u8; 5];
/// #     stream.reader.read_exact(&mut buf).unwrap();
/// #     stream.writer.write_all(&buf).unwrap();
/// #     stream.writer.finish();
/// #     stream.connection.wait_closed(Duration::from_secs(5));
/// # }).unwrap();
/// # let client = QuicClient::new(&session, certificate, Congestion::Cubic).unwrap();
/// # let mut stream = client.connect(addr, Duration::from_secs(5), || false).unwrap();
/// stream.writer.write_all(b"hello").unwrap();
/// let mut echo = [0; 5];
/// stream.reader.read_exact(&mut echo).unwrap();
/// assert_eq!(&echo, b"hello");
/// ```
#[derive(Debug)]
pub struct QuicReader {
    stream: quinn::RecvStream,
    timeout: Option<Duration>,
}

impl QuicReader {
    /// Reads fail with `TimedOut` after waiting `timeout` (`None`: they wait for ever).
    ///
    /// ```
    /// # use std::io::{Read, Write};
    /// # use std::time::Duration;
    /// # use transfer::quic::{Congestion, QuicClient, QuicServer};
    /// # let server = QuicServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    /// # let addr = server.local_addr().unwrap();
    /// # let session = [3u8; 16];
    /// # let certificate = server.add_session(&session).unwrap();
    /// # let _accepting = server.accept_while(Duration::from_secs(5), |_| Some(()), |stream, _, ()| {
    /// #     let Ok(mut stream) = stream else { return };
    /// #     let mut buf = [0u8; 5];
    /// #     stream.reader.read_exact(&mut buf).unwrap();
    /// #     stream.writer.write_all(&buf).unwrap();
    /// #     stream.writer.finish();
    /// #     stream.connection.wait_closed(Duration::from_secs(5));
    /// # }).unwrap();
    /// # let client = QuicClient::new(&session, certificate, Congestion::Cubic).unwrap();
    /// # let mut stream = client.connect(addr, Duration::from_secs(5), || false).unwrap();
    /// stream.reader.set_read_timeout(Some(Duration::from_millis(100)));
    /// let waited = stream.reader.read(&mut [0; 5]).unwrap_err(); // nothing was sent to echo
    /// assert_eq!(waited.kind(), std::io::ErrorKind::TimedOut);
    /// ```
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) {
        self.timeout = timeout;
    }
}

impl Read for QuicReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match block_on(self.timeout, self.stream.read(buf))? {
            Ok(n) => Ok(n.unwrap_or(0)),
            Err(e) => Err(e.into()),
        }
    }
}

/// The writing half of a connection's stream: a blocking `Write`.
///
/// ```
/// # use std::io::{Read, Write};
/// # use std::time::Duration;
/// # use transfer::quic::{Congestion, QuicClient, QuicServer};
/// # let server = QuicServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
/// # let addr = server.local_addr().unwrap();
/// # let session = [3u8; 16];
/// # let certificate = server.add_session(&session).unwrap();
/// # let _accepting = server.accept_while(Duration::from_secs(5), |_| Some(()), |stream, _, ()| {
/// #     let Ok(mut stream) = stream else { return };
/// #     let mut buf = [0u8; 5];
/// #     stream.reader.read_exact(&mut buf).unwrap();
/// #     stream.writer.write_all(&buf).unwrap();
/// #     stream.writer.finish();
/// #     stream.connection.wait_closed(Duration::from_secs(5));
/// # }).unwrap();
/// # let client = QuicClient::new(&session, certificate, Congestion::Cubic).unwrap();
/// # let mut stream = client.connect(addr, Duration::from_secs(5), || false).unwrap();
/// stream.writer.write_all(b"hel").unwrap();
/// stream.writer.write_all(b"lo").unwrap();
/// stream.writer.flush().unwrap();
/// stream.reader.read_exact(&mut [0; 5]).unwrap();
/// ```
#[derive(Debug)]
pub struct QuicWriter {
    stream: quinn::SendStream,
    timeout: Option<Duration>,
}

impl QuicWriter {
    /// Writes fail with `TimedOut` when the peer takes nothing for `timeout`.
    ///
    /// ```
    /// # use std::io::{Read, Write};
    /// # use std::time::Duration;
    /// # use transfer::quic::{Congestion, QuicClient, QuicServer};
    /// # let server = QuicServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    /// # let addr = server.local_addr().unwrap();
    /// # let session = [3u8; 16];
    /// # let certificate = server.add_session(&session).unwrap();
    /// # let _accepting = server.accept_while(Duration::from_secs(5), |_| Some(()), |stream, _, ()| {
    /// #     let Ok(mut stream) = stream else { return };
    /// #     let mut buf = [0u8; 5];
    /// #     stream.reader.read_exact(&mut buf).unwrap();
    /// #     stream.writer.write_all(&buf).unwrap();
    /// #     stream.writer.finish();
    /// #     stream.connection.wait_closed(Duration::from_secs(5));
    /// # }).unwrap();
    /// # let client = QuicClient::new(&session, certificate, Congestion::Cubic).unwrap();
    /// # let mut stream = client.connect(addr, Duration::from_secs(5), || false).unwrap();
    /// stream.writer.set_write_timeout(Some(Duration::from_secs(30)));
    /// stream.writer.write_all(b"hello").unwrap();
    /// ```
    pub fn set_write_timeout(&mut self, timeout: Option<Duration>) {
        self.timeout = timeout;
    }

    /// Ends the stream after what was written; the peer's reads end once they have it all.
    ///
    /// ```
    /// # use std::io::{Read, Write};
    /// # use std::time::Duration;
    /// # use transfer::quic::{Congestion, QuicClient, QuicServer};
    /// # let server = QuicServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    /// # let addr = server.local_addr().unwrap();
    /// # let session = [3u8; 16];
    /// # let certificate = server.add_session(&session).unwrap();
    /// # let _accepting = server.accept_while(Duration::from_secs(5), |_| Some(()), |stream, _, ()| {
    /// #     let Ok(mut stream) = stream else { return };
    /// #     let mut buf = [0u8; 5];
    /// #     stream.reader.read_exact(&mut buf).unwrap();
    /// #     stream.writer.write_all(&buf).unwrap();
    /// #     stream.writer.finish();
    /// #     stream.connection.wait_closed(Duration::from_secs(5));
    /// # }).unwrap();
    /// # let client = QuicClient::new(&session, certificate, Congestion::Cubic).unwrap();
    /// # let mut stream = client.connect(addr, Duration::from_secs(5), || false).unwrap();
    /// stream.writer.write_all(b"hello").unwrap();
    /// stream.writer.finish();
    /// assert!(stream.writer.write_all(b"more").is_err(), "the stream is finished");
    /// ```
    pub fn finish(&mut self) {
        let _ = self.stream.finish();
    }
}

impl Write for QuicWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match block_on(self.timeout, self.stream.write(buf))? {
            Ok(n) => Ok(n),
            Err(e) => Err(e.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        // Written data is sent as the connection's window allows; there is nothing to push.
        Ok(())
    }
}

/// A new connection's stream, both halves, and the binding its key handshake proves.
///
/// ```
/// # use std::io::{Read, Write};
/// # use std::time::Duration;
/// # use transfer::quic::{Congestion, QuicClient, QuicServer};
/// # let server = QuicServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
/// # let addr = server.local_addr().unwrap();
/// # let session = [3u8; 16];
/// # let certificate = server.add_session(&session).unwrap();
/// # let _accepting = server.accept_while(Duration::from_secs(5), |_| Some(()), |stream, _, ()| {
/// #     let Ok(mut stream) = stream else { return };
/// #     let mut buf = [0u8; 5];
/// #     stream.reader.read_exact(&mut buf).unwrap();
/// #     stream.writer.write_all(&buf).unwrap();
/// #     stream.writer.finish();
/// #     stream.connection.wait_closed(Duration::from_secs(5));
/// # }).unwrap();
/// # let client = QuicClient::new(&session, certificate, Congestion::Cubic).unwrap();
/// # let mut stream = client.connect(addr, Duration::from_secs(5), || false).unwrap();
/// use transfer::auth::ChannelBinding;
///
/// assert_ne!(stream.binding, ChannelBinding::PLAIN, "QUIC is always TLS");
/// ```
#[derive(Debug)]
pub struct QuicStream {
    /// The connection, for statistics and closing.
    pub connection: QuicConnection,
    /// What the peer sends.
    pub reader: QuicReader,
    /// What is sent to the peer.
    pub writer: QuicWriter,
    /// The connection's TLS exporter value.
    pub binding: ChannelBinding,
}

impl QuicStream {
    fn new(
        connection: QuicConnection,
        (writer, reader): (quinn::SendStream, quinn::RecvStream),
    ) -> io::Result<QuicStream> {
        Ok(QuicStream {
            binding: connection.channel_binding()?,
            connection,
            reader: QuicReader {
                stream: reader,
                timeout: None,
            },
            writer: QuicWriter {
                stream: writer,
                timeout: None,
            },
        })
    }
}

/// The sender's side: opens connections to one receiver session, accepting only the
/// certificate announced for it.
///
/// ```
/// # use std::io::{Read, Write};
/// # use std::time::Duration;
/// # use transfer::quic::{Congestion, QuicClient, QuicServer};
/// # let server = QuicServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
/// # let addr = server.local_addr().unwrap();
/// # let session = [3u8; 16];
/// # let certificate = server.add_session(&session).unwrap();
/// # let _accepting = server.accept_while(Duration::from_secs(5), |_| Some(()), |stream, _, ()| {
/// #     let Ok(mut stream) = stream else { return };
/// #     let mut buf = [0u8; 5];
/// #     stream.reader.read_exact(&mut buf).unwrap();
/// #     stream.writer.write_all(&buf).unwrap();
/// #     stream.writer.finish();
/// #     stream.connection.wait_closed(Duration::from_secs(5));
/// # }).unwrap();
/// # let client = QuicClient::new(&session, certificate, Congestion::Cubic).unwrap();
/// # let mut stream = client.connect(addr, Duration::from_secs(5), || false).unwrap();
/// let second = client.connect(addr, Duration::from_secs(5), || false).unwrap(); // one more stream
/// # drop((stream, second));
/// ```
pub struct QuicClient {
    config: quinn::ClientConfig,
    check: Arc<ReceiverCertificate>,
    server_name: String,
}

impl QuicClient {
    /// A client for the session `session` whose certificate hashes to `certificate`, with
    /// `congestion` on every connection.
    ///
    /// ```
    /// use transfer::quic::{Congestion, QuicClient};
    ///
    /// // The session id and the certificate hash come from the authenticated control
    /// // connection (`Welcome` and `QuicOffer`).
    /// let client = QuicClient::new(&[1; 16], [0xab; 32], Congestion::Bbr).unwrap();
    /// # let _ = client;
    /// ```
    pub fn new(
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

    /// Opens a connection (on its own UDP socket) to `addr` and its stream, within `timeout`;
    /// stops waiting early once `give_up` says so (it is asked every [`GIVE_UP_POLL`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use transfer::quic::{Congestion, QuicClient};
    ///
    /// let client = QuicClient::new(&[1; 16], [0; 32], Congestion::Cubic).unwrap();
    /// // Nobody serves QUIC there; the caller gives up at once.
    /// let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// assert!(client.connect(silent.local_addr().unwrap(), Duration::from_secs(30), || true).is_err());
    /// ```
    pub fn connect(
        &self,
        addr: SocketAddr,
        timeout: Duration,
        give_up: impl Fn() -> bool,
    ) -> Result<QuicStream, QuicError> {
        let unspecified: SocketAddr = if addr.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let (endpoint, connecting) = {
            // quinn spawns the endpoint's and the connection's drivers on the current runtime.
            let _entered = runtime()?.enter();
            let endpoint = endpoint(unspecified, None)?;
            let connecting = endpoint
                .connect_with(self.config.clone(), addr, &self.server_name)
                .map_err(quic_error)?;
            (endpoint, connecting)
        };
        let mut opening = Box::pin(async {
            let connection = connecting.await?;
            let stream = connection.open_bi().await?;
            Ok::<_, quinn::ConnectionError>((connection, stream))
        });
        // Waited for in short steps, so that a caller who gives up is not kept waiting.
        let deadline = std::time::Instant::now() + timeout;
        let opened = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match block_on(Some(left.min(GIVE_UP_POLL)), &mut opening) {
                Ok(opened) => break opened,
                Err(_) if give_up() => {
                    return Err(io::Error::new(io::ErrorKind::Interrupted, "QUIC: given up").into())
                }
                Err(_) if left <= GIVE_UP_POLL => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("QUIC: no answer from {addr} within {timeout:?} (is UDP blocked?)"),
                    )
                    .into())
                }
                Err(_) => {}
            }
        };
        let (connection, stream) = match opened {
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
///
/// ```
/// # use std::time::Duration;
/// # use transfer::quic::{Congestion, QuicClient, QuicServer};
/// # let server = QuicServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
/// # let addr = server.local_addr().unwrap();
/// # let _accepting = server.accept_while(Duration::from_secs(5), |_| Some(()), |_, _, ()| {}).unwrap();
/// use transfer::quic::QuicError;
///
/// let mut announced = server.add_session(&[5; 16]).unwrap();
/// announced[0] ^= 1; // another host answers on that address
/// let client = QuicClient::new(&[5; 16], announced, Congestion::Cubic).unwrap();
/// let refused = client.connect(addr, Duration::from_secs(5), || false);
/// assert!(matches!(refused, Err(QuicError::WrongCertificate)));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuicError {
    /// The receiver showed a certificate other than the one announced for the session.
    #[error(
        "the receiver's QUIC certificate is not the one its control connection announced \
         (another host answers on that address?)"
    )]
    WrongCertificate,
    /// The connection failed or timed out.
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Certificates of the sessions a receiver serves over QUIC, by the server name clients ask for.
#[derive(Debug, Default)]
struct SessionCertificates(Mutex<HashMap<String, Arc<CertifiedKey>>>);

impl ResolvesServerCert for SessionCertificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name()?;
        self.0.lock().expect("certificates lock").get(name).cloned()
    }
}

/// The receiver's side: one UDP endpoint serving every session's connections.
///
/// ```
/// # use std::io::{Read, Write};
/// # use std::time::Duration;
/// # use transfer::quic::{Congestion, QuicClient, QuicServer};
/// # let server = QuicServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
/// # let addr = server.local_addr().unwrap();
/// # let session = [3u8; 16];
/// # let certificate = server.add_session(&session).unwrap();
/// # let _accepting = server.accept_while(Duration::from_secs(5), |_| Some(()), |stream, _, ()| {
/// #     let Ok(mut stream) = stream else { return };
/// #     let mut buf = [0u8; 5];
/// #     stream.reader.read_exact(&mut buf).unwrap();
/// #     stream.writer.write_all(&buf).unwrap();
/// #     stream.writer.finish();
/// #     stream.connection.wait_closed(Duration::from_secs(5));
/// # }).unwrap();
/// # let client = QuicClient::new(&session, certificate, Congestion::Cubic).unwrap();
/// # let mut stream = client.connect(addr, Duration::from_secs(5), || false).unwrap();
/// stream.writer.write_all(b"hello").unwrap();
/// stream.reader.read_exact(&mut [0; 5]).unwrap();
/// server.remove_session(&session); // the session ended: no new stream may join
/// assert!(client.connect(addr, Duration::from_secs(5), || false).is_err());
/// ```
pub struct QuicServer {
    endpoint: quinn::Endpoint,
    certificates: Arc<SessionCertificates>,
}

impl QuicServer {
    /// Listens for QUIC on UDP `addr`.
    ///
    /// ```
    /// let server = transfer::quic::QuicServer::bind("127.0.0.1:0".parse().unwrap())?;
    /// # let _ = server;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn bind(addr: SocketAddr) -> io::Result<QuicServer> {
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
            let _entered = runtime()?.enter();
            endpoint(addr, Some(config))?
        };
        Ok(QuicServer {
            endpoint,
            certificates,
        })
    }

    /// The UDP address bound.
    ///
    /// ```
    /// let server = transfer::quic::QuicServer::bind("127.0.0.1:0".parse().unwrap())?;
    /// assert_ne!(server.local_addr()?.port(), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// Makes a certificate for `session` and serves it to clients that name the session;
    /// returns its hash, for the sender to pin.
    ///
    /// ```
    /// let server = transfer::quic::QuicServer::bind("127.0.0.1:0".parse().unwrap())?;
    /// let (a, b) = (server.add_session(&[1; 16])?, server.add_session(&[2; 16])?);
    /// assert_ne!(a, b, "each session has its own certificate");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn add_session(&self, session: &[u8; 16]) -> io::Result<[u8; 32]> {
        let name = server_name(session);
        let (certificate, key) = tls::self_signed(&name)?;
        let hash = tls::certificate_hash(&certificate);
        let key = tls::provider()
            .key_provider
            .load_private_key(key)
            .map_err(tls::tls_error)?;
        let certified = Arc::new(CertifiedKey::new(vec![certificate], key));
        let mut certificates = self.certificates.0.lock().expect("certificates lock");
        certificates.insert(name, certified);
        Ok(hash)
    }

    /// Stops serving `session`'s certificate: no new connection can join it.
    ///
    /// ```
    /// let server = transfer::quic::QuicServer::bind("127.0.0.1:0".parse().unwrap())?;
    /// server.add_session(&[1; 16])?;
    /// server.remove_session(&[1; 16]);
    /// server.remove_session(&[1; 16]); // gone already: nothing to do
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn remove_session(&self, session: &[u8; 16]) {
        let mut certificates = self.certificates.0.lock().expect("certificates lock");
        certificates.remove(&server_name(session));
    }

    /// Accepts connections until the returned guard drops. Each new connection is offered to
    /// `admit` with the peer's address, which refuses it or admits it with a token (a place
    /// among the connections in their handshake, say). An admitted connection runs, on a thread
    /// of its own, its handshake within `handshake_timeout` and then `serve` with the outcome,
    /// the peer's address and the token.
    ///
    /// ```
    /// use std::time::Duration;
    /// use transfer::quic::QuicServer;
    ///
    /// let server = QuicServer::bind("127.0.0.1:0".parse().unwrap())?;
    /// let accepting = server.accept_while(
    ///     Duration::from_secs(10),
    ///     |peer| (!peer.ip().is_unspecified()).then_some(()), // admit, or refuse at once
    ///     |stream, peer, ()| match stream {
    ///         Ok(stream) => println!("{peer} opened a stream (binding {:?})", stream.binding),
    ///         Err(e) => println!("{peer}: {e}"),
    ///     },
    /// )?;
    /// drop(accepting); // stops accepting
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn accept_while<T: Send + 'static>(
        &self,
        handshake_timeout: Duration,
        admit: impl Fn(SocketAddr) -> Option<T> + Send + 'static,
        serve: impl Fn(io::Result<QuicStream>, SocketAddr, T) + Send + Sync + 'static,
    ) -> io::Result<Accepting> {
        let endpoint = self.endpoint.clone();
        let serve = Arc::new(serve);
        let task = runtime()?.spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                let peer = incoming.remote_address();
                let Some(token) = admit(peer) else {
                    incoming.refuse();
                    continue;
                };
                let serve = serve.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("xfer-quic-{peer}"))
                    .spawn(move || serve(accept_stream(incoming, handshake_timeout), peer, token));
                if let Err(e) = spawned {
                    tracing::warn!("cannot serve a QUIC connection from {peer}: {e}");
                }
            }
        });
        Ok(Accepting(task))
    }
}

/// Completes an incoming connection's handshake and takes its stream.
fn accept_stream(incoming: quinn::Incoming, limit: Duration) -> io::Result<QuicStream> {
    let accepted = block_on(Some(limit), async {
        let connection = incoming.await?;
        let stream = connection.accept_bi().await?;
        Ok::<_, quinn::ConnectionError>((connection, stream))
    })?;
    let (connection, stream) = accepted.map_err(quic_error)?;
    QuicStream::new(
        QuicConnection {
            connection,
            _endpoint: None,
        },
        stream,
    )
}

/// Accepts QUIC connections while it lives ([`QuicServer::accept_while`]).
///
/// ```
/// use std::time::Duration;
///
/// let server = transfer::quic::QuicServer::bind("127.0.0.1:0".parse().unwrap())?;
/// let _accepting = server.accept_while(Duration::from_secs(10), |_| Some(()), |_, _, ()| {})?;
/// // ... serves until `_accepting` goes out of scope.
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Accepting(tokio::task::JoinHandle<()>);

impl Drop for Accepting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> (QuicServer, SocketAddr) {
        let server = QuicServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = server.local_addr().unwrap();
        (server, addr)
    }

    /// Echoes one message of `len` bytes back on every connection.
    fn echo(server: &QuicServer, len: usize) -> Accepting {
        server
            .accept_while(
                Duration::from_secs(5),
                |_| Some(()),
                move |stream, _, ()| {
                    let Ok(mut stream) = stream else { return };
                    let mut buf = vec![0u8; len];
                    stream.reader.read_exact(&mut buf).unwrap();
                    stream.writer.write_all(&buf).unwrap();
                    stream.writer.finish();
                    stream.connection.wait_closed(Duration::from_secs(5));
                },
            )
            .unwrap()
    }

    #[test]
    fn a_pinned_certificate_carries_a_stream_both_ways() {
        let (server, addr) = server();
        let session = [3u8; 16];
        let hash = server.add_session(&session).unwrap();
        let _accepting = echo(&server, 1 << 20);
        let client = QuicClient::new(&session, hash, Congestion::Bbr).unwrap();
        let mut stream = client
            .connect(addr, Duration::from_secs(5), || false)
            .unwrap();
        let sent: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
        stream.writer.write_all(&sent).unwrap();
        let mut back = Vec::new();
        stream.reader.read_to_end(&mut back).unwrap();
        assert!(back == sent, "the echo differs");
        let info = stream.connection.sample().unwrap();
        assert!(info.bytes_acked >= 1 << 20, "{info:?}");
        assert!(info.data_segs_out > 0 && info.rtt_us > 0, "{info:?}");
        assert!(info.snd_mss >= 1200 && info.snd_cwnd > 0, "{info:?}");
        stream.connection.close();
        assert_eq!(stream.connection.sample(), None);
    }

    #[test]
    fn another_certificate_than_the_announced_one_is_refused() {
        let (server, addr) = server();
        let session = [4u8; 16];
        let real = server.add_session(&session).unwrap();
        let _accepting = echo(&server, 1);
        let mut other = real;
        other[0] ^= 1;
        let client = QuicClient::new(&session, other, Congestion::Cubic).unwrap();
        let err = client
            .connect(addr, Duration::from_secs(5), || false)
            .unwrap_err();
        assert!(matches!(err, QuicError::WrongCertificate), "{err}");
        assert!(err.to_string().contains("certificate"), "{err}");
    }

    #[test]
    fn a_session_without_a_certificate_cannot_connect() {
        let (server, addr) = server();
        let session = [5u8; 16];
        let hash = server.add_session(&session).unwrap();
        server.remove_session(&session);
        let _accepting = echo(&server, 1);
        let client = QuicClient::new(&session, hash, Congestion::NewReno).unwrap();
        let err = client
            .connect(addr, Duration::from_secs(5), || false)
            .unwrap_err();
        assert!(matches!(err, QuicError::Io(_)), "{err}");
    }

    #[test]
    fn both_ends_export_the_same_binding() {
        let (server, addr) = server();
        let session = [6u8; 16];
        let hash = server.add_session(&session).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = Mutex::new(tx);
        let _accepting = server
            .accept_while(
                Duration::from_secs(5),
                |_| Some(()),
                move |stream, _, ()| {
                    let mut stream = stream.unwrap();
                    let mut hello = [0u8; 1];
                    stream.reader.read_exact(&mut hello).unwrap();
                    tx.lock().unwrap().send(stream.binding).unwrap();
                },
            )
            .unwrap();
        let client = QuicClient::new(&session, hash, Congestion::Cubic).unwrap();
        let mut stream = client
            .connect(addr, Duration::from_secs(5), || false)
            .unwrap();
        stream.writer.write_all(b"x").unwrap();
        let theirs = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(theirs, stream.binding);
        assert_ne!(stream.binding, ChannelBinding::PLAIN);
    }

    #[test]
    fn reads_time_out_when_asked_to() {
        let (server, addr) = server();
        let session = [7u8; 16];
        let hash = server.add_session(&session).unwrap();
        let _accepting = echo(&server, 2);
        let client = QuicClient::new(&session, hash, Congestion::Cubic).unwrap();
        let mut stream = client
            .connect(addr, Duration::from_secs(5), || false)
            .unwrap();
        stream.writer.write_all(b"x").unwrap();
        stream
            .reader
            .set_read_timeout(Some(Duration::from_millis(200)));
        let err = stream.reader.read(&mut [0u8; 4]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn opening_stops_when_the_caller_gives_up() {
        // A UDP port where nothing answers.
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap();
        let client = QuicClient::new(&[8u8; 16], [0; 32], Congestion::Cubic).unwrap();
        let started = std::time::Instant::now();
        let give_up_at = started + Duration::from_millis(300);
        let err = client
            .connect(addr, Duration::from_secs(20), || {
                std::time::Instant::now() >= give_up_at
            })
            .unwrap_err();
        let took = started.elapsed();
        assert!(matches!(&err, QuicError::Io(e) if e.kind() == io::ErrorKind::Interrupted));
        assert!(took < Duration::from_secs(2), "took {took:?}");
        let started = std::time::Instant::now();
        let err = client
            .connect(addr, Duration::from_millis(400), || false)
            .unwrap_err();
        assert!(err.to_string().contains("no answer"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn congestion_names_parse_back() {
        for c in [Congestion::Cubic, Congestion::Bbr, Congestion::NewReno] {
            assert_eq!(c.name().parse::<Congestion>(), Ok(c));
        }
        assert!("vegas".parse::<Congestion>().unwrap_err().contains("bbr"));
    }
}
