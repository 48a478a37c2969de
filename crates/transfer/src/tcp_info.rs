//! Per-stream TCP statistics read from the kernel's `TCP_INFO` socket option.
//!
//! `getsockopt(TCP_INFO)` copies a snapshot under the socket lock for a few microseconds and never
//! waits for the data path, so sampling from a monitor thread does not slow a stream. The struct
//! below mirrors the kernel's `struct tcp_info` (include/uapi/linux/tcp.h) up to
//! `tcpi_bytes_retrans`; the `libc` crate's copy stops before `tcpi_bytes_acked`,
//! `tcpi_min_rtt`, `tcpi_data_segs_out` and `tcpi_delivery_rate`, which the optimiser needs.
//! Older kernels fill a shorter prefix; fields they lack read as zero.

use std::os::fd::AsRawFd;

use serde::Serialize;

use crate::sockopt;

#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(crate) struct KernelTcpInfo {
    state_and_flags: [u8; 8],
    rto: u32,
    ato: u32,
    snd_mss: u32,
    rcv_mss: u32,
    unacked: u32,
    sacked: u32,
    lost: u32,
    retrans: u32,
    fackets: u32,
    last_data_sent: u32,
    last_ack_sent: u32,
    last_data_recv: u32,
    last_ack_recv: u32,
    pmtu: u32,
    rcv_ssthresh: u32,
    rtt: u32,
    rttvar: u32,
    snd_ssthresh: u32,
    snd_cwnd: u32,
    advmss: u32,
    reordering: u32,
    rcv_rtt: u32,
    rcv_space: u32,
    total_retrans: u32,
    pacing_rate: u64,
    max_pacing_rate: u64,
    bytes_acked: u64,
    bytes_received: u64,
    segs_out: u32,
    segs_in: u32,
    notsent_bytes: u32,
    min_rtt: u32,
    data_segs_in: u32,
    data_segs_out: u32,
    delivery_rate: u64,
    busy_time: u64,
    rwnd_limited: u64,
    sndbuf_limited: u64,
    delivered: u32,
    delivered_ce: u32,
    bytes_sent: u64,
    bytes_retrans: u64,
}

/// One stream's TCP counters at one instant (cumulative counters are totals since the
/// connection opened; the optimiser differences them per monitoring interval).
///
/// ```
/// use transfer::tcp_info::TcpInfo;
///
/// let (before, after) = (TcpInfo { data_segs_out: 1000, total_retrans: 2, ..TcpInfo::default() }, TcpInfo { data_segs_out: 3000, total_retrans: 12, ..TcpInfo::default() });
/// let loss = f64::from(after.total_retrans - before.total_retrans) / f64::from(after.data_segs_out - before.data_segs_out);
/// assert_eq!(loss, 0.005);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TcpInfo {
    /// Smoothed RTT in microseconds.
    pub rtt_us: u32,
    /// Minimum RTT seen on the connection, microseconds.
    pub min_rtt_us: u32,
    /// Segments retransmitted since the connection opened.
    pub total_retrans: u32,
    /// Data segments sent since the connection opened.
    pub data_segs_out: u32,
    /// Bytes acknowledged by the peer's TCP.
    pub bytes_acked: u64,
    /// Bytes retransmitted.
    pub bytes_retrans: u64,
    /// The kernel's delivery-rate estimate, bytes per second.
    pub delivery_rate: u64,
    /// Congestion window, segments.
    pub snd_cwnd: u32,
    /// Sender maximum segment size, bytes.
    pub snd_mss: u32,
    /// Slow-start threshold, segments: [`INFINITE_SSTHRESH`] until the connection leaves slow
    /// start (at its first loss, or where HyStart ends it). QUIC reports no threshold: its
    /// window from its first congestion event on.
    pub snd_ssthresh: u32,
}

/// The kernel's slow-start threshold of a connection still in its first slow start
/// (`TCP_INFINITE_SSTHRESH`).
pub const INFINITE_SSTHRESH: u32 = 0x7fff_ffff;

/// Reads `TCP_INFO` of a connected TCP socket (of an MPTCP socket: of its first subflow).
///
/// ```
/// use std::io::Write;
/// use std::net::{TcpListener, TcpStream};
///
/// let listener = TcpListener::bind("127.0.0.1:0")?;
/// let mut stream = TcpStream::connect(listener.local_addr()?)?;
/// stream.write_all(&[0; 4096])?;
/// let info = transfer::tcp_info::sample(&stream)?;
/// assert!(info.snd_mss > 0);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn sample(socket: &impl AsRawFd) -> std::io::Result<TcpInfo> {
    let mut raw = KernelTcpInfo::default();
    // SAFETY: every bit pattern is a valid `KernelTcpInfo` (integers only).
    unsafe { sockopt::get(socket, libc::IPPROTO_TCP, libc::TCP_INFO, &mut raw)? };
    Ok(TcpInfo::from(&raw))
}

impl From<&KernelTcpInfo> for TcpInfo {
    fn from(raw: &KernelTcpInfo) -> TcpInfo {
        TcpInfo {
            rtt_us: raw.rtt,
            min_rtt_us: raw.min_rtt,
            total_retrans: raw.total_retrans,
            data_segs_out: raw.data_segs_out,
            bytes_acked: raw.bytes_acked,
            bytes_retrans: raw.bytes_retrans,
            delivery_rate: raw.delivery_rate,
            snd_cwnd: raw.snd_cwnd,
            snd_mss: raw.snd_mss,
            snd_ssthresh: raw.snd_ssthresh,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn layout_matches_the_kernel_offsets() {
        // Offsets from include/uapi/linux/tcp.h: tcpi_pacing_rate at 104, tcpi_delivery_rate at 160.
        assert_eq!(std::mem::offset_of!(KernelTcpInfo, pacing_rate), 104);
        assert_eq!(std::mem::offset_of!(KernelTcpInfo, min_rtt), 148);
        assert_eq!(std::mem::offset_of!(KernelTcpInfo, delivery_rate), 160);
        assert_eq!(std::mem::offset_of!(KernelTcpInfo, bytes_retrans), 208);
    }

    #[test]
    fn counts_bytes_acked_on_loopback() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let reader = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).unwrap();
            buf.len()
        });
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        client.write_all(&vec![7u8; 1 << 20]).unwrap();
        client.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(reader.join().unwrap(), 1 << 20);
        let info = sample(&client).unwrap();
        assert!(info.bytes_acked >= 1 << 20, "{info:?}");
        assert!(info.data_segs_out > 0 && info.snd_mss > 0, "{info:?}");
        assert!(info.min_rtt_us > 0 && info.rtt_us > 0, "{info:?}");
        // Read, whether HyStart has ended slow start yet (a threshold) or not (infinite).
        assert!(info.snd_ssthresh > 0, "{info:?}");
    }
}
