//! One limit on a transfer's total sending rate, however many streams share it
//! ([`super::SendOptions::rate_limit`]): before a stream takes its next unit, it reserves a
//! unit's worth of the rate and waits for its turn; what the unit it then gets is shorter by
//! is given back. Reservations follow each other on one timeline (a virtual clock of the
//! bytes reserved, as GCRA schedules cells), so the streams together send at the limit
//! whatever their count, and a transfer that was idle may be ahead of its timeline by at most
//! [`BURST`].
//!
//! A rate limiter crate (governor) counts `u32` cells per second and waits asynchronously or
//! by polling; the streams are threads that block per unit of up to 16 MiB at rates up to
//! hundreds of Gbit/s, which these few lines over std's clock serve directly.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sync::unpoisoned;

/// How far ahead of the limit's timeline the streams may be after an idle spell: a little
/// credit, so that the wait of each reservation does not add up to a rate below the limit.
pub(super) const BURST: Duration = Duration::from_millis(20);

/// The shared timeline of a transfer's rate limit.
#[derive(Debug)]
pub(super) struct RateLimit {
    /// The limit, in bytes per second.
    bytes_per_second: f64,
    /// What a stream reserves before it takes a unit: the largest unit.
    unit: u64,
    /// Where the next reservation starts on the timeline.
    next: Mutex<Option<Instant>>,
}

impl RateLimit {
    /// A limit of `bytes_per_second` (at least 1) on streams sending units of at most
    /// `unit_size` bytes.
    pub(super) fn new(bytes_per_second: u64, unit_size: u32) -> RateLimit {
        RateLimit {
            bytes_per_second: bytes_per_second.max(1) as f64,
            unit: u64::from(unit_size),
            next: Mutex::new(None),
        }
    }

    /// What a stream reserves before it takes a unit, in bytes.
    pub(super) fn unit(&self) -> u64 {
        self.unit
    }

    /// Reserves `bytes` of the rate at `now`: the instant they may be sent from (`now`, or
    /// later while earlier reservations use the rate).
    pub(super) fn reserve(&self, bytes: u64, now: Instant) -> Instant {
        let mut next = unpoisoned(self.next.lock());
        let earliest = now.checked_sub(BURST).unwrap_or(now);
        let start = next.map_or(now, |next| next.max(earliest));
        *next = Some(start + self.duration_of(bytes));
        start
    }

    /// Gives back `bytes` reserved and not sent: the reservations after move that much earlier.
    pub(super) fn give_back(&self, bytes: u64) {
        let mut next = unpoisoned(self.next.lock());
        if let Some(at) = next.as_mut() {
            *at = at.checked_sub(self.duration_of(bytes)).unwrap_or(*at);
        }
    }

    /// How long `bytes` take at the limit.
    fn duration_of(&self, bytes: u64) -> Duration {
        Duration::from_secs_f64(bytes as f64 / self.bytes_per_second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// However many streams reserve, and in whatever sizes, the reservations of a busy
    /// transfer follow each other at the limit: the last one starts when all the bytes before
    /// it have taken their time at the limit.
    #[test]
    fn reservations_from_many_streams_follow_each_other_at_the_limit() {
        let limit = RateLimit::new(1_000_000, 1 << 20);
        let t0 = Instant::now();
        let mut last = t0;
        let mut reserved = 0u64;
        for i in 0..1_000u64 {
            let bytes = 1_000 + i % 7 * 10_000;
            last = limit.reserve(bytes, t0);
            assert!(last >= t0);
            reserved += bytes;
        }
        let before_last = reserved - (1_000 + 999 % 7 * 10_000);
        let expected = Duration::from_secs_f64(before_last as f64 / 1e6);
        let off = (last - t0).as_secs_f64() - expected.as_secs_f64();
        assert!(off.abs() < 1e-6, "{off}");
    }

    /// After an idle spell a transfer may be ahead of its timeline by [`BURST`] only, and what
    /// a stream gave back is reserved again at once.
    #[test]
    fn an_idle_spell_earns_a_short_burst_and_what_is_given_back_is_reused() {
        let limit = RateLimit::new(1_000_000, 1 << 20);
        let t0 = Instant::now();
        assert_eq!(limit.reserve(1_000, t0), t0);
        let later = t0 + Duration::from_secs(10);
        // The timeline is 10 s behind: it catches up to the burst's credit, no more.
        assert_eq!(limit.reserve(100_000, later), later - BURST);
        assert_eq!(
            limit.reserve(1_000, later),
            later - BURST + Duration::from_millis(100)
        );
        limit.give_back(1_000);
        assert_eq!(
            limit.reserve(1_000, later),
            later - BURST + Duration::from_millis(100)
        );
    }
}
