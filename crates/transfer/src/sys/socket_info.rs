//! The kernel's statistics structs of a TCP connection (`struct tcp_info`,
//! include/uapi/linux/tcp.h) and of an MPTCP connection and its subflows
//! (include/uapi/linux/mptcp.h), mirrored field by field, and the socket options that read
//! them. `crate::tcp_info` and `crate::mptcp_info` turn them into the public types.
//!
//! The mirror of `struct tcp_info` goes up to `tcpi_bytes_retrans`: the `libc` crate's copy
//! stops before `tcpi_bytes_acked`, `tcpi_min_rtt`, `tcpi_data_segs_out` and
//! `tcpi_delivery_rate`, which the optimiser needs. Older kernels fill a shorter prefix; the
//! fields they lack read as zero.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;

use super::sockopt::{self, Plain};

/// `struct tcp_info`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(crate) struct KernelTcpInfo {
    pub(crate) state_and_flags: [u8; 8],
    pub(crate) rto: u32,
    pub(crate) ato: u32,
    pub(crate) snd_mss: u32,
    pub(crate) rcv_mss: u32,
    pub(crate) unacked: u32,
    pub(crate) sacked: u32,
    pub(crate) lost: u32,
    pub(crate) retrans: u32,
    pub(crate) fackets: u32,
    pub(crate) last_data_sent: u32,
    pub(crate) last_ack_sent: u32,
    pub(crate) last_data_recv: u32,
    pub(crate) last_ack_recv: u32,
    pub(crate) pmtu: u32,
    pub(crate) rcv_ssthresh: u32,
    pub(crate) rtt: u32,
    pub(crate) rttvar: u32,
    pub(crate) snd_ssthresh: u32,
    pub(crate) snd_cwnd: u32,
    pub(crate) advmss: u32,
    pub(crate) reordering: u32,
    pub(crate) rcv_rtt: u32,
    pub(crate) rcv_space: u32,
    pub(crate) total_retrans: u32,
    pub(crate) pacing_rate: u64,
    pub(crate) max_pacing_rate: u64,
    pub(crate) bytes_acked: u64,
    pub(crate) bytes_received: u64,
    pub(crate) segs_out: u32,
    pub(crate) segs_in: u32,
    pub(crate) notsent_bytes: u32,
    pub(crate) min_rtt: u32,
    pub(crate) data_segs_in: u32,
    pub(crate) data_segs_out: u32,
    pub(crate) delivery_rate: u64,
    pub(crate) busy_time: u64,
    pub(crate) rwnd_limited: u64,
    pub(crate) sndbuf_limited: u64,
    pub(crate) delivered: u32,
    pub(crate) delivered_ce: u32,
    pub(crate) bytes_sent: u64,
    pub(crate) bytes_retrans: u64,
}

// SAFETY: `repr(C)`, integers and arrays of them only.
unsafe impl Plain for KernelTcpInfo {}

/// Reads `TCP_INFO` of a connected TCP socket (of an MPTCP socket: of its first subflow).
pub(crate) fn tcp_info(socket: &impl AsRawFd) -> std::io::Result<KernelTcpInfo> {
    sockopt::get(socket, libc::IPPROTO_TCP, libc::TCP_INFO)
}

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

// SAFETY: `repr(C)`, integers and arrays of them only.
unsafe impl Plain for KernelMptcpInfo {}

/// One subflow as the kernel reports it.
#[derive(Clone, Copy)]
pub(crate) struct KernelSubflow {
    /// The subflow's id within its connection.
    pub(crate) id: u32,
    /// Local address and port.
    pub(crate) local: SocketAddr,
    /// Remote address and port.
    pub(crate) remote: SocketAddr,
    /// Its `TCP_INFO`.
    pub(crate) tcp: KernelTcpInfo,
}

/// Whether an MPTCP socket has fallen back to plain TCP (the peer answered without MPTCP):
/// the kernel then refuses MPTCP-level options.
pub(crate) fn mptcp_fell_back(socket: &impl AsRawFd) -> bool {
    match sockopt::get::<KernelMptcpInfo>(socket, SOL_MPTCP, MPTCP_INFO) {
        Ok(info) => info.flags & 1 != 0, // MPTCP_INFO_FLAG_FALLBACK
        Err(_) => true,
    }
}

/// The subflows of an MPTCP connection (`MPTCP_FULL_INFO`, Linux 6.5 and later): an error
/// when the socket is not MPTCP, fell back to TCP, or the kernel predates the option.
pub(crate) fn mptcp_subflows(socket: &impl AsRawFd) -> std::io::Result<Vec<KernelSubflow>> {
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
    unsafe { sockopt::get_into(socket, SOL_MPTCP, MPTCP_FULL_INFO, &mut full)? };
    let count = (full.num_subflows as usize).min(MAX_SUBFLOWS);
    Ok(sfinfo[..count]
        .iter()
        .zip(&tcpinfo[..count])
        .map(|(sf, tcp)| KernelSubflow {
            id: sf.id,
            local: socket_addr(&sf.local),
            remote: socket_addr(&sf.remote),
            tcp: *tcp,
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

    #[test]
    fn layout_matches_the_kernel_offsets() {
        // Offsets from include/uapi/linux/tcp.h: tcpi_pacing_rate at 104, tcpi_delivery_rate at 160.
        assert_eq!(std::mem::offset_of!(KernelTcpInfo, pacing_rate), 104);
        assert_eq!(std::mem::offset_of!(KernelTcpInfo, min_rtt), 148);
        assert_eq!(std::mem::offset_of!(KernelTcpInfo, delivery_rate), 160);
        assert_eq!(std::mem::offset_of!(KernelTcpInfo, bytes_retrans), 208);
    }

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
}
