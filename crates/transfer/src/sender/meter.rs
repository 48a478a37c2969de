//! Monitoring-interval measurement (for the signals of `optimizer::signals`): the per-stream
//! `TCP_INFO` counters of two successive samples, differenced and summed over the transfer's
//! streams. An MPTCP stream is measured per subflow, and its subflows are also summed per path
//! (local and remote address), so that the MI log shows the RTT and the loss of every path.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use optimizer::MiStats;
use serde::Serialize;

use super::StreamSample;
use crate::tcp_info::TcpInfo;

/// What one path (a local and a remote address, over every MPTCP subflow between them) did in
/// one monitoring interval.
///
/// ```
/// use transfer::sender::{MiRecord, PathStats};
///
/// /// The path that carried most in an interval of an MPTCP transfer.
/// fn busiest(mi: &MiRecord) -> Option<&PathStats> {
///     mi.paths.iter().max_by(|a, b| a.throughput.total_cmp(&b.throughput))
/// }
/// # let _ = busiest;
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PathStats {
    /// Local address.
    pub local: IpAddr,
    /// Remote address.
    pub remote: IpAddr,
    /// Subflows on the path at the end of the interval.
    pub subflows: usize,
    /// Goodput acknowledged on the path, bit/s.
    pub throughput: f64,
    /// Retransmitted over sent data segments, 0 when nothing was sent.
    pub loss: f64,
    /// Smoothed RTT in seconds, weighted by bytes; `None` when no subflow reported one.
    pub rtt: Option<f64>,
}

/// Counters summed over connections (streams or subflows) for one interval.
#[derive(Debug, Default)]
struct Sums {
    connections: usize,
    bytes_acked: u64,
    data_segs_out: u64,
    retrans_segs: u64,
    rtt_weighted: f64,
    rtt_weight: u64,
    rtt_sum: f64,
    rtt_count: usize,
}

impl Sums {
    /// Adds what one connection did between `before` and `now`.
    fn add(&mut self, before: &TcpInfo, now: &TcpInfo) {
        let acked = now.bytes_acked.saturating_sub(before.bytes_acked);
        self.connections += 1;
        self.bytes_acked += acked;
        self.data_segs_out += advanced(before.data_segs_out, now.data_segs_out);
        self.retrans_segs += advanced(before.total_retrans, now.total_retrans);
        if now.rtt_us > 0 {
            let rtt = f64::from(now.rtt_us) / 1e6;
            self.rtt_weighted += rtt * acked as f64;
            self.rtt_weight += acked;
            self.rtt_sum += rtt;
            self.rtt_count += 1;
        }
    }

    /// RTT weighted by bytes acknowledged (the plain mean when nothing was acknowledged).
    fn rtt(&self) -> Option<f64> {
        if self.rtt_weight > 0 {
            Some(self.rtt_weighted / self.rtt_weight as f64)
        } else if self.rtt_count > 0 {
            Some(self.rtt_sum / self.rtt_count as f64)
        } else {
            None
        }
    }
}

/// How far a 32-bit kernel segment counter moved from `before` to `now`. It wraps after 4 Gi
/// segments; it may also read slightly behind a previous sample (a stream sampled open just
/// after its final sample was taken, that final sample coming the interval after), which
/// counts as nothing: no interval moves a counter by 2 Gi.
fn advanced(before: u32, now: u32) -> u64 {
    let moved = now.wrapping_sub(before);
    if moved > u32::MAX / 2 {
        0
    } else {
        u64::from(moved)
    }
}

/// A connection's counters by (stream, subflow id); a TCP stream is its own subflow 0.
type Key = (u64, u32);

/// Remembers each connection's counters at the previous sample, so the next sample yields what
/// happened in between.
#[derive(Debug, Default)]
pub(super) struct IntervalMeter {
    last: HashMap<Key, TcpInfo>,
}

/// A sample's connections: an MPTCP stream's subflows (with their path), or the stream itself.
fn connections(
    sample: &StreamSample,
) -> impl Iterator<Item = (Key, Option<(IpAddr, IpAddr)>, &TcpInfo)> {
    let whole = sample
        .subflows
        .is_empty()
        .then_some(((sample.stream, 0), None, &sample.tcp));
    let subflows = sample.subflows.iter().map(|sf| {
        let path = (sf.local.ip(), sf.remote.ip());
        ((sample.stream, sf.id), Some(path), &sf.tcp)
    });
    whole.into_iter().chain(subflows)
}

impl IntervalMeter {
    /// Starts the next interval from `samples` without measuring anything (counters of streams
    /// opened before the first interval do not count towards it).
    pub(super) fn reset(&mut self, samples: &[StreamSample]) {
        self.last = samples
            .iter()
            .flat_map(|s| connections(s).map(|(key, _, tcp)| (key, *tcp)))
            .collect();
    }

    /// What the streams did since the previous sample: bytes acknowledged, data segments sent
    /// and retransmitted, RTT weighted by bytes acknowledged (the plain mean when nothing was
    /// acknowledged), the number of streams not being retired and of those being retired (or
    /// closed: their final samples) that still acknowledged data; and the same per path of the
    /// MPTCP streams. A connection not seen before counts from its opening. `end` and
    /// `duration` are in seconds.
    pub(super) fn measure(
        &mut self,
        samples: &[StreamSample],
        end: f64,
        duration: f64,
    ) -> (MiStats, Vec<PathStats>) {
        let mut total = Sums::default();
        let mut paths: BTreeMap<(IpAddr, IpAddr), Sums> = BTreeMap::new();
        let (mut retiring, mut retiring_bytes) = (0, 0);
        for sample in samples {
            let acked_before = total.bytes_acked;
            for (key, path, now) in connections(sample) {
                let before = self.last.get(&key).copied().unwrap_or_default();
                total.add(&before, now);
                if let Some(path) = path {
                    paths.entry(path).or_default().add(&before, now);
                }
            }
            if sample.retiring && total.bytes_acked > acked_before {
                retiring += 1;
                retiring_bytes += total.bytes_acked - acked_before;
            }
        }
        self.reset(samples);
        let stats = MiStats {
            end,
            duration,
            streams: samples.iter().filter(|s| !s.retiring).count(),
            bytes_acked: total.bytes_acked,
            data_segs_out: total.data_segs_out,
            retrans_segs: total.retrans_segs,
            rtt: total.rtt(),
            // The meter sees only open streams; the sender adds those still connecting.
            connecting: 0,
            retiring,
            retiring_bytes,
        };
        let paths = paths
            .into_iter()
            .map(|((local, remote), sums)| PathStats {
                local,
                remote,
                subflows: sums.connections,
                throughput: if duration > 0.0 {
                    sums.bytes_acked as f64 * 8.0 / duration
                } else {
                    0.0
                },
                loss: if sums.data_segs_out > 0 {
                    sums.retrans_segs as f64 / sums.data_segs_out as f64
                } else {
                    0.0
                },
                rtt: sums.rtt(),
            })
            .collect();
        (stats, paths)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mptcp_info::Subflow;

    fn tcp(acked: u64, segs: u32, retrans: u32, rtt_us: u32) -> TcpInfo {
        TcpInfo {
            rtt_us,
            bytes_acked: acked,
            data_segs_out: segs,
            total_retrans: retrans,
            ..TcpInfo::default()
        }
    }

    fn sample(
        stream: u64,
        retiring: bool,
        acked: u64,
        segs: u32,
        retrans: u32,
        rtt_us: u32,
    ) -> StreamSample {
        StreamSample {
            stream,
            retiring,
            tcp: tcp(acked, segs, retrans, rtt_us),
            subflows: Vec::new(),
        }
    }

    #[test]
    fn differences_and_sums_the_streams_counters() {
        let mut meter = IntervalMeter::default();
        meter.reset(&[sample(1, false, 1000, u32::MAX - 1, 0, 100)]);
        let (stats, paths) = meter.measure(
            &[
                sample(1, false, 4000, 3, 1, 1000),
                sample(2, true, 1000, 7, 0, 4000),
            ],
            2.0,
            1.0,
        );
        assert!(paths.is_empty(), "TCP streams have no per-path breakdown");
        assert_eq!(stats.bytes_acked, 3000 + 1000);
        assert_eq!(
            stats.data_segs_out,
            5 + 7,
            "the 32-bit segment counter wraps; a new stream counts from its opening"
        );
        assert_eq!(stats.retrans_segs, 1);
        assert_eq!(
            (stats.streams, stats.retiring),
            (1, 1),
            "a retiring stream that carried data is counted apart from the active ones"
        );
        // RTT weighted by bytes: (1 ms * 3000 + 4 ms * 1000) / 4000.
        assert!((stats.rtt.unwrap() - 0.00175).abs() < 1e-12);
        let (next, _) = meter.measure(&[sample(2, true, 1500, 9, 0, 0)], 3.0, 1.0);
        assert_eq!((next.bytes_acked, next.data_segs_out), (500, 2));
        assert_eq!(next.rtt, None);
        assert_eq!((next.streams, next.retiring), (0, 1));
        // A retiring stream that acknowledged nothing (its unit done) measures nothing.
        let (last, _) = meter.measure(&[sample(2, true, 1500, 9, 0, 0)], 4.0, 1.0);
        assert_eq!((last.bytes_acked, last.retiring), (0, 0));
    }

    #[test]
    fn a_closed_streams_final_sample_counts_once_and_a_late_reading_adds_nothing() {
        let mut meter = IntervalMeter::default();
        meter.reset(&[sample(1, false, 0, 0, 0, 0), sample(2, true, 0, 0, 0, 0)]);
        // Stream 2 closed after the previous sample: its final sample still counts its data.
        let (stats, _) = meter.measure(
            &[
                sample(1, false, 1000, 10, 0, 0),
                sample(2, true, 500, 5, 1, 0),
            ],
            1.0,
            1.0,
        );
        assert_eq!((stats.bytes_acked, stats.data_segs_out), (1500, 15));
        assert_eq!(
            (stats.streams, stats.retiring, stats.retiring_bytes),
            (1, 1, 500)
        );
        // Stream 1 was sampled open a moment after its final sample, which comes the interval
        // after and reads a little behind: nothing is added, nothing wraps.
        let (last, _) = meter.measure(&[sample(1, true, 990, 9, 0, 0)], 2.0, 1.0);
        assert_eq!(
            (last.bytes_acked, last.data_segs_out, last.retrans_segs),
            (0, 0, 0)
        );
        assert_eq!((last.streams, last.retiring), (0, 0));
    }

    #[test]
    fn without_acknowledged_bytes_the_rtt_is_the_plain_mean() {
        let mut meter = IntervalMeter::default();
        meter.reset(&[sample(1, false, 10, 1, 0, 0), sample(2, false, 10, 1, 0, 0)]);
        let (stats, _) = meter.measure(
            &[
                sample(1, false, 10, 1, 0, 1000),
                sample(2, false, 10, 1, 0, 3000),
            ],
            1.0,
            1.0,
        );
        assert_eq!(stats.bytes_acked, 0);
        assert!((stats.rtt.unwrap() - 0.002).abs() < 1e-12);
    }

    fn subflow(
        id: u32,
        local: &str,
        remote: &str,
        acked: u64,
        segs: u32,
        retrans: u32,
        rtt_us: u32,
    ) -> Subflow {
        Subflow {
            id,
            local: local.parse().unwrap(),
            remote: remote.parse().unwrap(),
            tcp: tcp(acked, segs, retrans, rtt_us),
        }
    }

    fn mptcp(stream: u64, subflows: Vec<Subflow>) -> StreamSample {
        StreamSample {
            stream,
            retiring: false,
            tcp: subflows[0].tcp,
            subflows,
        }
    }

    #[test]
    fn mptcp_streams_are_measured_per_subflow_and_summed_per_path() {
        let mut meter = IntervalMeter::default();
        meter.reset(&[mptcp(
            1,
            vec![subflow(1, "10.0.1.1:5000", "10.0.1.2:9", 1000, 10, 0, 5000)],
        )]);
        // Stream 1 gains a subflow on path B; stream 2 has one subflow on each path.
        let (stats, paths) = meter.measure(
            &[
                mptcp(
                    1,
                    vec![
                        subflow(1, "10.0.1.1:5000", "10.0.1.2:9", 3000, 20, 2, 5000),
                        subflow(2, "10.0.2.1:5001", "10.0.2.2:9", 1000, 10, 0, 20000),
                    ],
                ),
                mptcp(
                    2,
                    vec![
                        subflow(1, "10.0.1.1:5002", "10.0.1.2:9", 2000, 20, 0, 7000),
                        subflow(3, "10.0.2.1:5003", "10.0.2.2:9", 3000, 30, 3, 20000),
                    ],
                ),
            ],
            1.0,
            0.5,
        );
        assert_eq!(stats.streams, 2);
        assert_eq!(stats.bytes_acked, 2000 + 1000 + 2000 + 3000);
        assert_eq!(
            (stats.data_segs_out, stats.retrans_segs),
            (10 + 10 + 20 + 30, 5)
        );
        assert_eq!(paths.len(), 2);
        let (a, b) = (&paths[0], &paths[1]);
        assert_eq!(
            (a.local.to_string(), a.remote.to_string(), a.subflows),
            ("10.0.1.1".into(), "10.0.1.2".into(), 2)
        );
        assert_eq!(a.throughput, 4000.0 * 8.0 / 0.5);
        assert_eq!(a.loss, 2.0 / 30.0);
        // (5 ms * 2000 + 7 ms * 2000) / 4000.
        assert!((a.rtt.unwrap() - 0.006).abs() < 1e-12);
        assert_eq!((b.subflows, b.loss), (2, 3.0 / 40.0));
        assert!((b.rtt.unwrap() - 0.02).abs() < 1e-12);
    }
}
