//! Per-stream TCP statistics read from the kernel's `TCP_INFO` socket option.
//!
//! `getsockopt(TCP_INFO)` copies a snapshot under the socket lock for a few microseconds and never
//! waits for the data path, so sampling from a monitor thread does not slow a stream. The
//! kernel's `struct tcp_info` is mirrored in `sys/socket_info.rs`.

use std::os::fd::AsRawFd;

use serde::{Deserialize, Serialize};

use crate::sys::socket_info::{self, KernelTcpInfo};

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    Ok(TcpInfo::from(&socket_info::tcp_info(socket)?))
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
