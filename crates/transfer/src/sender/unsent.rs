//! How much a TCP stream keeps queued in its socket but not yet sent (`TCP_NOTSENT_LOWAT`), as
//! the path it runs on allows.
//!
//! A stream's writer sleeps whenever its unsent queue is full and wakes when the kernel has sent
//! about half of it, so a queue of 128 KiB wakes it some 600 times a second at 600 Mbit/s, and it
//! sends each segment itself, in `write`. A small queue is right where the CPU and not the link
//! limits (loopback, a LAN): the bytes reach the receiver while they are still in cache, and a
//! larger one halved a veth pair's throughput there. On a long path the bytes in flight have left
//! the cache anyway, and with a deep queue the kernel sends each segment as an acknowledgement
//! makes room, from the acknowledgement's processing, as iperf3's unlimited queue lets it.
//!
//! So the queue starts at the configured floor and follows twice the path's bandwidth-delay
//! product as the stream sees it (its delivery rate times the number of streams sharing the path
//! times its minimum RTT), at most [`CEILING`]. Each stream of a transfer gets the same queue
//! whatever their number, so that together they wake no more often per byte than one stream
//! does. On a short path the product is far below the floor and nothing changes. At 600 Mbit/s
//! and 30 ms on the emulated WAN, one stream's sender spent 3.4 CPU seconds per GiB with 128 KiB,
//! 1.3 with 4 MiB and 1.0 with 16 MiB, and iperf3's 0.7; the host's CPU (sender, receiver and
//! the emulated path) was the same for all of them, 17-19 s, because what the sender no longer
//! spends, the processing of acknowledgements does
//! (`docs/experiments/2026-12-02-the-unsent-queue-follows-the-path.md`). The socket's send
//! buffer (`net.ipv4.tcp_wmem`) bounds the queue too, as it bounds iperf3's.

use std::net::TcpStream;

use crate::tcp_info::TcpInfo;

/// The largest unsent queue a stream is given, whatever the path.
pub(super) const CEILING: u32 = 16 << 20;

/// Sizes are set in steps of this many bytes, so that the estimate's noise does not reset the
/// socket option after every unit.
const STEP: u32 = 64 << 10;

/// One stream's unsent queue: its floor and the size its socket has now.
pub(super) struct UnsentQueue {
    floor: u32,
    current: u32,
}

impl UnsentQueue {
    /// A queue of `floor` bytes, the size [`super::stream`] gives a new socket; 0 (the system's
    /// default, unlimited unless set) is left alone.
    pub(super) fn new(floor: u32) -> UnsentQueue {
        UnsentQueue {
            floor,
            current: floor,
        }
    }

    /// The size for a stream of which `info` is the newest sample, one of `streams` sharing
    /// the path.
    fn size_for(&self, info: &TcpInfo, streams: usize) -> u32 {
        let rate = u128::from(info.delivery_rate) * streams.max(1) as u128;
        let bdp = rate * u128::from(info.min_rtt_us) / 1_000_000;
        let twice = u32::try_from(bdp * 2).unwrap_or(u32::MAX);
        (twice / STEP * STEP).clamp(self.floor, CEILING.max(self.floor))
    }

    /// Resizes `socket`'s unsent queue to follow the path it shares with `streams - 1` other
    /// streams of its transfer, when its size should change.
    pub(super) fn follow(&mut self, socket: &TcpStream, streams: usize) {
        if self.floor == 0 {
            return;
        }
        let Ok(info) = crate::tcp_info::sample(socket) else {
            return;
        };
        let size = self.size_for(&info, streams);
        if size == self.current {
            return;
        }
        match socket2::SockRef::from(socket).set_tcp_notsent_lowat(size) {
            Ok(()) => self.current = size,
            // The stream goes on with the queue it has; the next unit tries again.
            Err(e) => tracing::debug!("cannot resize a stream's unsent queue to {size}: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(mbit: u64, min_rtt_ms: u32) -> TcpInfo {
        TcpInfo {
            delivery_rate: mbit * 125_000,
            min_rtt_us: min_rtt_ms * 1000,
            ..TcpInfo::default()
        }
    }

    #[test]
    fn a_short_path_keeps_the_floor_and_a_long_one_twice_its_product_up_to_the_ceiling() {
        let queue = UnsentQueue::new(128 << 10);
        // Loopback and a LAN: far below the floor.
        assert_eq!(queue.size_for(&path(25_000, 0), 1), 128 << 10);
        assert_eq!(queue.size_for(&path(10_000, 0), 16), 128 << 10);
        // 600 Mbit/s at 30 ms: 2.25 MB in flight, twice that queued, in whole steps.
        assert_eq!(queue.size_for(&path(600, 30), 1), 4_456_448);
        assert_eq!(queue.size_for(&path(600, 30), 1) % STEP, 0);
        // 10 Gbit/s at 80 ms would want 200 MB.
        assert_eq!(queue.size_for(&path(10_000, 80), 1), CEILING);
        // A stream not yet measured keeps the floor.
        assert_eq!(queue.size_for(&TcpInfo::default(), 4), 128 << 10);
    }

    #[test]
    fn streams_sharing_a_path_each_get_the_queue_one_stream_would() {
        let queue = UnsentQueue::new(128 << 10);
        // Four streams of 150 Mbit/s each on the same 600 Mbit/s, 30 ms path.
        assert_eq!(
            queue.size_for(&path(150, 30), 4),
            queue.size_for(&path(600, 30), 1)
        );
        // A count of 0 (none chosen yet) counts the stream itself.
        assert_eq!(queue.size_for(&path(600, 30), 0), 4_456_448);
    }

    #[test]
    fn a_floor_above_the_ceiling_is_kept() {
        let queue = UnsentQueue::new(32 << 20);
        assert_eq!(queue.size_for(&path(600, 30), 1), 32 << 20);
    }

    #[test]
    fn a_socket_follows_its_path_and_a_zero_floor_leaves_the_system_default() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let socket = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let sock = socket2::SockRef::from(&socket);
        let before = sock.tcp_notsent_lowat().unwrap();
        UnsentQueue::new(0).follow(&socket, 1);
        assert_eq!(sock.tcp_notsent_lowat().unwrap(), before);
        // An idle loopback socket has no rate: the queue is set to the floor.
        let mut queue = UnsentQueue::new(192 << 10);
        queue.current = 0;
        queue.follow(&socket, 1);
        assert_eq!(sock.tcp_notsent_lowat().unwrap(), 192 << 10);
        assert_eq!(queue.current, 192 << 10);
    }
}
