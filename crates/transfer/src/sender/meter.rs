//! Monitoring-interval measurement (DESIGN.md section 4): the per-stream `TCP_INFO` counters of
//! two successive samples, differenced and summed over the transfer's streams.

use std::collections::HashMap;

use optimizer::MiStats;

use super::StreamSample;
use crate::tcp_info::TcpInfo;

/// Remembers each stream's counters at the previous sample, so the next sample yields what
/// happened in between.
#[derive(Debug, Default)]
pub(super) struct IntervalMeter {
    last: HashMap<u64, TcpInfo>,
}

impl IntervalMeter {
    /// Starts the next interval from `samples` without measuring anything (counters of streams
    /// opened before the first interval do not count towards it).
    pub(super) fn reset(&mut self, samples: &[StreamSample]) {
        self.last = samples.iter().map(|s| (s.stream, s.tcp)).collect();
    }

    /// What the streams did since the previous sample: bytes acknowledged, data segments sent
    /// and retransmitted, RTT weighted by bytes acknowledged (the plain mean when nothing was
    /// acknowledged), and the number of streams not being retired. A stream not seen before
    /// counts from its opening. `end` and `duration` are in seconds.
    pub(super) fn measure(&mut self, samples: &[StreamSample], end: f64, duration: f64) -> MiStats {
        let mut stats = MiStats {
            end,
            duration,
            streams: samples.iter().filter(|s| !s.retiring).count(),
            ..MiStats::default()
        };
        let (mut weighted, mut weight, mut rtt_sum, mut rtt_count) = (0.0, 0u64, 0.0, 0usize);
        for sample in samples {
            let now = sample.tcp;
            let before = self.last.get(&sample.stream).copied().unwrap_or_default();
            let acked = now.bytes_acked.saturating_sub(before.bytes_acked);
            stats.bytes_acked += acked;
            // The kernel's segment counters are 32-bit and wrap after 4 Gi segments.
            stats.data_segs_out += u64::from(now.data_segs_out.wrapping_sub(before.data_segs_out));
            stats.retrans_segs += u64::from(now.total_retrans.wrapping_sub(before.total_retrans));
            if now.rtt_us > 0 {
                let rtt = f64::from(now.rtt_us) / 1e6;
                weighted += rtt * acked as f64;
                weight += acked;
                rtt_sum += rtt;
                rtt_count += 1;
            }
        }
        stats.rtt = if weight > 0 {
            Some(weighted / weight as f64)
        } else if rtt_count > 0 {
            Some(rtt_sum / rtt_count as f64)
        } else {
            None
        };
        self.reset(samples);
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            tcp: TcpInfo {
                rtt_us,
                bytes_acked: acked,
                data_segs_out: segs,
                total_retrans: retrans,
                ..TcpInfo::default()
            },
        }
    }

    #[test]
    fn differences_and_sums_the_streams_counters() {
        let mut meter = IntervalMeter::default();
        meter.reset(&[sample(1, false, 1000, 10, 0, 100)]);
        let stats = meter.measure(
            &[
                sample(1, false, 4000, 14, 1, 1000),
                sample(2, true, 1000, u32::MAX, 0, 4000),
            ],
            2.0,
            1.0,
        );
        assert_eq!(stats.bytes_acked, 3000 + 1000);
        assert_eq!(stats.data_segs_out, 4 + u64::from(u32::MAX));
        assert_eq!(stats.retrans_segs, 1);
        assert_eq!(
            stats.streams, 1,
            "a retiring stream is not counted as active"
        );
        // RTT weighted by bytes: (1 ms * 3000 + 4 ms * 1000) / 4000.
        assert!((stats.rtt.unwrap() - 0.00175).abs() < 1e-12);
        // Counters wrap: the next interval still differences correctly.
        let next = meter.measure(&[sample(2, true, 1500, 5, 0, 0)], 3.0, 1.0);
        assert_eq!((next.bytes_acked, next.data_segs_out), (500, 6));
        assert_eq!(next.rtt, None);
    }

    #[test]
    fn without_acknowledged_bytes_the_rtt_is_the_plain_mean() {
        let mut meter = IntervalMeter::default();
        meter.reset(&[sample(1, false, 10, 1, 0, 0), sample(2, false, 10, 1, 0, 0)]);
        let stats = meter.measure(
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
}
