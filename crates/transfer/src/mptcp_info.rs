//! Per-subflow statistics of an MPTCP connection, read with `getsockopt(SOL_MPTCP,
//! MPTCP_FULL_INFO)` (Linux 6.5 and later): each subflow's id, addresses and `TCP_INFO` in one
//! consistent snapshot, so that the optimiser sees the RTT and the losses of every path. The
//! structs below mirror include/uapi/linux/mptcp.h.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;

use serde::Serialize;

use crate::sockopt;
use crate::tcp_info::{KernelTcpInfo, TcpInfo};

/// `SOL_MPTCP` (include/linux/socket.h).
const SOL_MPTCP: libc::c_int = 284;
/// `MPTCP_INFO`: the connection-level `struct mptcp_info`.
const MPTCP_INFO: libc::c_int = 1;
/// `MPTCP_FULL_INFO`: `struct mptcp_full_info` with the subflow arrays.
const MPTCP_FULL_INFO: libc::c_int = 4;
/// Most subflows read per sample: the in-kernel path manager allows at most 8.
const MAX_SUBFLOWS: usize = 8;

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct KernelMptcpInfo {
    subflows: u8,
    add_addr_signal: u8,
    add_addr_accepted: u8,
    subflows_max: u8,
    add_addr_signal_max: u8,
    add_addr_accepted_max: u8,
    flags: u32,
    token: u32,
    write_seq: u64,
    snd_una: u64,
    rcv_nxt: u64,
    local_addr_used: u8,
    local_addr_max: u8,
    csum_enabled: u8,
    retransmits: u32,
    bytes_retrans: u64,
    bytes_sent: u64,
    bytes_received: u64,
    bytes_acked: u64,
    subflows_total: u8,
    endp_add_addr_max: u8,
    reserved: [u8; 2],
    last_data_sent: u32,
    last_data_recv: u32,
    last_ack_recv: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct KernelSubflowInfo {
    id: u32,
    local: libc::sockaddr_storage,
    remote: libc::sockaddr_storage,
}

#[repr(C)]
#[derive(Default)]
struct KernelFullInfo {
    size_tcpinfo_kernel: u32,
    size_tcpinfo_user: u32,
    size_sfinfo_kernel: u32,
    size_sfinfo_user: u32,
    num_subflows: u32,
    size_arrays_user: u32,
    subflow_info: u64,
    tcp_info: u64,
    mptcp_info: KernelMptcpInfo,
}

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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

/// Whether an MPTCP socket has fallen back to plain TCP (the peer answered without MPTCP):
/// the kernel then refuses MPTCP-level options.
pub(crate) fn fell_back(socket: &impl AsRawFd) -> bool {
    let mut info = KernelMptcpInfo::default();
    // SAFETY: `mptcp_info` holds integers only.
    let result = unsafe { sockopt::get(socket, SOL_MPTCP, MPTCP_INFO, &mut info) };
    result.is_err() || info.flags & 1 != 0 // MPTCP_INFO_FLAG_FALLBACK
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
    let empty_addr = || {
        // SAFETY: all-zero bytes are a valid `sockaddr_storage` (family AF_UNSPEC).
        unsafe { std::mem::zeroed::<libc::sockaddr_storage>() }
    };
    let mut sfinfo = [KernelSubflowInfo {
        id: 0,
        local: empty_addr(),
        remote: empty_addr(),
    }; MAX_SUBFLOWS];
    let mut tcpinfo = [KernelTcpInfo::default(); MAX_SUBFLOWS];
    let mut full = KernelFullInfo {
        size_tcpinfo_user: std::mem::size_of::<KernelTcpInfo>() as u32,
        size_sfinfo_user: std::mem::size_of::<KernelSubflowInfo>() as u32,
        size_arrays_user: MAX_SUBFLOWS as u32,
        subflow_info: sfinfo.as_mut_ptr() as u64,
        tcp_info: tcpinfo.as_mut_ptr() as u64,
        ..KernelFullInfo::default()
    };
    // SAFETY: the struct holds integers only; its two pointers are to live arrays of
    // `size_arrays_user` elements of the sizes it states, which the kernel fills.
    unsafe { sockopt::get(socket, SOL_MPTCP, MPTCP_FULL_INFO, &mut full)? };
    let count = (full.num_subflows as usize).min(MAX_SUBFLOWS);
    Ok(sfinfo[..count]
        .iter()
        .zip(&tcpinfo[..count])
        .map(|(sf, tcp)| Subflow {
            id: sf.id,
            local: socket_addr(&sf.local),
            remote: socket_addr(&sf.remote),
            tcp: TcpInfo::from(tcp),
        })
        .collect())
}

/// A kernel socket address as a `SocketAddr` (the unspecified IPv4 address for a family that
/// is neither IPv4 nor IPv6, which the kernel does not report for subflows).
fn socket_addr(storage: &libc::sockaddr_storage) -> SocketAddr {
    match libc::c_int::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a `sockaddr_in`, which it is large
            // and aligned enough for.
            let sin = unsafe { &*(storage as *const _ as *const libc::sockaddr_in) };
            SocketAddr::new(
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))),
                u16::from_be(sin.sin_port),
            )
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for `sockaddr_in6`.
            let sin6 = unsafe { &*(storage as *const _ as *const libc::sockaddr_in6) };
            SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)),
                u16::from_be(sin6.sin6_port),
            )
        }
        _ => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{self, Transport};
    use std::io::{Read, Write};
    use std::time::Duration;

    #[test]
    fn layouts_match_the_kernel() {
        // Offsets and sizes from include/uapi/linux/mptcp.h on x86_64.
        assert_eq!(std::mem::offset_of!(KernelMptcpInfo, flags), 8);
        assert_eq!(std::mem::offset_of!(KernelMptcpInfo, retransmits), 44);
        assert_eq!(std::mem::offset_of!(KernelMptcpInfo, bytes_acked), 72);
        assert_eq!(std::mem::offset_of!(KernelMptcpInfo, last_data_sent), 84);
        assert_eq!(std::mem::size_of::<KernelMptcpInfo>(), 96);
        assert_eq!(std::mem::offset_of!(KernelSubflowInfo, local), 8);
        assert_eq!(std::mem::offset_of!(KernelSubflowInfo, remote), 136);
        assert_eq!(std::mem::size_of::<KernelSubflowInfo>(), 264);
        assert_eq!(std::mem::offset_of!(KernelFullInfo, subflow_info), 24);
        assert_eq!(std::mem::offset_of!(KernelFullInfo, mptcp_info), 40);
    }

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
