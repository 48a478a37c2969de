//! Per-subflow statistics of an MPTCP connection, read with `getsockopt(SOL_MPTCP,
//! MPTCP_FULL_INFO)` (Linux 6.5 and later): each subflow's id, addresses and `TCP_INFO` in one
//! consistent snapshot, so that the optimiser sees the RTT and the losses of every path. The
//! kernel's structs are mirrored in `sys/socket_info.rs`.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use serde::{Deserialize, Serialize};

use crate::sys::socket_info;
use crate::tcp_info::TcpInfo;

/// One subflow of an MPTCP connection at one instant.
///
/// ```
/// use transfer::mptcp_info::Subflow;
///
/// /// The subflows of a connection by the path they take.
/// fn by_path(subflows: &[Subflow]) -> Vec<(std::net::IpAddr, std::net::IpAddr)> {
///     subflows.iter().map(|s| (s.local.ip(), s.remote.ip())).collect()
/// }
/// # let _ = by_path;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subflow {
    /// The subflow's id within its connection (never reused while the connection lives).
    pub id: u32,
    /// Local address and port.
    pub local: SocketAddr,
    /// Remote address and port.
    pub remote: SocketAddr,
    /// Its TCP counters.
    pub tcp: TcpInfo,
}

/// The subflows of an MPTCP connection; an error when the socket is not MPTCP (or fell back
/// to TCP) or the kernel predates `MPTCP_FULL_INFO`.
///
/// ```
/// use std::net::{TcpListener, TcpStream};
///
/// let listener = TcpListener::bind("127.0.0.1:0")?;
/// let tcp = TcpStream::connect(listener.local_addr()?)?;
/// assert!(transfer::mptcp_info::subflows(&tcp).is_err(), "a TCP socket has no subflows");
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn subflows(socket: &impl AsRawFd) -> std::io::Result<Vec<Subflow>> {
    Ok(socket_info::mptcp_subflows(socket)?
        .iter()
        .map(|sf| Subflow {
            id: sf.id,
            local: sf.local,
            remote: sf.remote,
            tcp: TcpInfo::from(&sf.tcp),
        })
        .collect())
}

/// Whether an MPTCP socket has fallen back to plain TCP (the peer answered without MPTCP):
/// the kernel then refuses MPTCP-level options.
pub(crate) fn fell_back(socket: &impl AsRawFd) -> bool {
    socket_info::mptcp_fell_back(socket)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{self, Transport};
    use std::io::{Read, Write};
    use std::time::Duration;

    #[test]
    fn reads_the_subflow_of_a_loopback_connection() {
        let (listener, _, _) = transport::listen(Transport::Mptcp, "127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let reader = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).unwrap();
            buf.len()
        });
        let (mut client, used, _) =
            transport::connect(Transport::Mptcp, &addr, Duration::from_secs(5)).unwrap();
        assert_eq!(used, Transport::Mptcp);
        assert!(!fell_back(&client));
        client.write_all(&vec![7u8; 1 << 20]).unwrap();
        client.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(reader.join().unwrap(), 1 << 20);
        let subflows = subflows(&client).unwrap();
        assert_eq!(subflows.len(), 1, "{subflows:?}");
        let sf = subflows[0];
        assert_eq!(sf.remote, addr);
        assert_eq!(sf.local, client.local_addr().unwrap());
        assert!(sf.tcp.bytes_acked >= 1 << 20, "{sf:?}");
        assert!(sf.tcp.rtt_us > 0 && sf.tcp.snd_mss > 0, "{sf:?}");
    }

    #[test]
    fn a_plain_tcp_socket_has_no_subflows() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert!(subflows(&client).is_err());
        assert!(fell_back(&client));
    }
}
