//! The transport under every connection: plain TCP; Multipath TCP (RFC 8684), where each
//! connection is one MPTCP socket whose subflows the kernel's path manager opens over every
//! path it is configured to use (`ip mptcp endpoint`, `ip mptcp limits`; see docs/transports.md); or
//! QUIC ([`crate::quic`]), where each data stream is a QUIC connection and the control
//! connection stays TCP.
//!
//! An MPTCP socket reads and writes like a TCP socket, so the protocol code is the same for
//! both; only the opening differs. Where MPTCP cannot be had, xfer uses TCP and says why:
//! this host cannot make MPTCP sockets (a kernel without it, or `net.mptcp.enabled = 0`), or
//! the peer answered as plain TCP (its kernel or its `xfer` does not use MPTCP, or a middlebox
//! stripped the option).

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, Socket, Type};

/// Which protocol carries a transfer's connections.
///
/// ```
/// use transfer::transport::Transport;
///
/// #[derive(serde::Deserialize)]
/// struct Settings {
///     transport: Transport,
/// }
/// let s: Settings = toml::from_str(r#"transport = "quic""#).unwrap();
/// assert_eq!(s.transport, Transport::Quic);
/// assert_eq!(Transport::default(), Transport::Tcp);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Transport {
    /// One TCP connection per stream.
    #[default]
    Tcp,
    /// One Multipath TCP connection per stream, with subflows over several paths.
    Mptcp,
    /// One QUIC connection per stream, over UDP; always encrypted.
    Quic,
}

impl Transport {
    /// The name used on the command line and in reports.
    ///
    /// ```
    /// use transfer::transport::Transport;
    ///
    /// assert_eq!(Transport::Mptcp.name(), "mptcp");
    /// assert_eq!(Transport::Mptcp.to_string(), "mptcp");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Mptcp => "mptcp",
            Transport::Quic => "quic",
        }
    }

    /// The protocol of the sockets [`connect`] and [`listen`] open: QUIC's control connection
    /// is TCP.
    fn protocol(self) -> Protocol {
        match self {
            Transport::Tcp | Transport::Quic => Protocol::TCP,
            Transport::Mptcp => Protocol::MPTCP,
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Transport {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tcp" => Ok(Transport::Tcp),
            "mptcp" => Ok(Transport::Mptcp),
            "quic" => Ok(Transport::Quic),
            other => Err(format!(
                "unknown transport {other:?} (expected tcp, mptcp or quic)"
            )),
        }
    }
}

/// A socket of `transport` for `addr`'s address family, and the transport it really is: when
/// MPTCP was asked for and this host cannot make MPTCP sockets, a TCP socket and the reason.
fn open(
    transport: Transport,
    addr: &SocketAddr,
) -> io::Result<(Socket, Transport, Option<String>)> {
    let domain = Domain::for_address(*addr);
    match Socket::new(domain, Type::STREAM, Some(transport.protocol())) {
        Ok(socket) => Ok((socket, transport, None)),
        Err(e) if transport == Transport::Mptcp && mptcp_unavailable(&e) => {
            let reason = format!(
                "this host cannot open MPTCP sockets ({e}; is net.mptcp.enabled = 1?): using TCP"
            );
            let socket = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
            Ok((socket, Transport::Tcp, Some(reason)))
        }
        Err(e) => Err(e),
    }
}

/// Whether a failed `socket(..., IPPROTO_MPTCP)` means the kernel offers no MPTCP: disabled by
/// sysctl (`ENOPROTOOPT`), not built in (`EPROTONOSUPPORT`), or too old to know the number
/// (`EINVAL`).
fn mptcp_unavailable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOPROTOOPT | libc::EPROTONOSUPPORT | libc::EINVAL)
    )
}

/// A connection to `addr` over `transport`, opened within `timeout`; the transport it really
/// uses and, when that is not `transport`, why (see the module documentation).
///
/// ```
/// use std::time::Duration;
/// use transfer::transport::{connect, listen, Transport};
///
/// let (listener, _, _) = listen(Transport::Tcp, "127.0.0.1:0")?;
/// let addr = listener.local_addr()?;
/// let (stream, used, why) = connect(Transport::Tcp, &addr, Duration::from_secs(1))?;
/// assert_eq!((used, why), (Transport::Tcp, None));
/// # drop(stream);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn connect(
    transport: Transport,
    addr: &SocketAddr,
    timeout: Duration,
) -> io::Result<(TcpStream, Transport, Option<String>)> {
    let (socket, mut used, mut reason) = open(transport, addr)?;
    socket.connect_timeout(&(*addr).into(), timeout)?;
    let stream = TcpStream::from(socket);
    if used == Transport::Mptcp && crate::mptcp_info::fell_back(&stream) {
        used = Transport::Tcp;
        reason = Some(format!(
            "the receiver at {addr} answered as plain TCP (is it started with --transport mptcp, \
             on a kernel with net.mptcp.enabled = 1, with no middlebox stripping MPTCP options?): \
             using TCP"
        ));
    }
    Ok((stream, used, reason))
}

/// A listener on the first address `addr` resolves to that can be bound, taking connections
/// over `transport` (an MPTCP listener also takes plain TCP clients); the transport it really
/// uses and, when that is not `transport`, why.
///
/// ```
/// use transfer::transport::{listen, Transport};
///
/// // Where the kernel has no MPTCP, a TCP listener and the reason.
/// let (listener, used, why) = listen(Transport::Mptcp, "127.0.0.1:0")?;
/// if used == Transport::Tcp {
///     eprintln!("{}", why.unwrap());
/// }
/// # drop(listener);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn listen(
    transport: Transport,
    addr: &str,
) -> io::Result<(TcpListener, Transport, Option<String>)> {
    let mut last = None;
    for addr in addr.to_socket_addrs()? {
        let bound = open(transport, &addr).and_then(|(socket, used, reason)| {
            socket.set_reuse_address(true)?;
            socket.bind(&addr.into())?;
            socket.listen(1024)?;
            Ok((TcpListener::from(socket), used, reason))
        });
        match bound {
            Ok(bound) => return Ok(bound),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the address resolves to nothing",
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn round_trip(server: Transport, client: Transport) -> (Transport, Option<String>) {
        let (listener, used, reason) = listen(server, "127.0.0.1:0").unwrap();
        assert_eq!((used, reason), (server, None), "this host has MPTCP");
        let addr = listener.local_addr().unwrap();
        let echo = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
        });
        let (mut stream, used, reason) = connect(client, &addr, Duration::from_secs(5)).unwrap();
        stream.write_all(b"hello").unwrap();
        let mut back = [0u8; 5];
        stream.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"hello");
        echo.join().unwrap();
        (used, reason)
    }

    #[test]
    fn mptcp_to_an_mptcp_listener_stays_mptcp() {
        assert_eq!(
            round_trip(Transport::Mptcp, Transport::Mptcp),
            (Transport::Mptcp, None)
        );
    }

    #[test]
    fn mptcp_to_a_tcp_listener_falls_back_and_says_why() {
        let (used, reason) = round_trip(Transport::Tcp, Transport::Mptcp);
        assert_eq!(used, Transport::Tcp);
        assert!(reason.unwrap().contains("answered as plain TCP"));
    }

    #[test]
    fn tcp_clients_are_served_by_an_mptcp_listener() {
        assert_eq!(
            round_trip(Transport::Mptcp, Transport::Tcp),
            (Transport::Tcp, None)
        );
    }

    #[test]
    fn names_parse_back() {
        for t in [Transport::Tcp, Transport::Mptcp, Transport::Quic] {
            assert_eq!(t.name().parse::<Transport>(), Ok(t));
        }
        assert!("sctp"
            .parse::<Transport>()
            .unwrap_err()
            .contains("tcp, mptcp or quic"));
    }
}
