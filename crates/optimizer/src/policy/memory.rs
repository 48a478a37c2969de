//! What a policy remembers beyond its input window: the utility measured at each stream count
//! in the recent past.
//!
//! A window of the last few intervals cannot tell a policy that holds 48 streams at the best
//! count of a path with paced streams from one that holds 48 where 10 gave far more: after a
//! few intervals without a change both windows look alike. The memory keeps, for every count
//! measured in the last `intervals` intervals, its utility (the mean of the intervals it was
//! held in a row, weighted to the last [`SAMPLES`]; an interval that was mostly ramp-up of new streams only
//! until the count is measured settled), so the input can say how far the current utility is
//! below the best remembered one, where that one was, and how the utility changes towards the
//! nearest remembered counts below and above. A count measured again after another replaces its
//! old value, so a best that background traffic took away is forgotten as soon as it is
//! re-measured, and every value is forgotten `intervals` intervals after it was measured.

use std::collections::BTreeMap;

use crate::running_mean::RunningMean;

/// Consecutive intervals one remembered utility is the plain mean of; past that, each new
/// interval weighs 1/SAMPLES, so a count held long follows slow changes.
pub const SAMPLES: u32 = 8;

/// How many signals [`UtilityMemory::signals`] gives.
pub const MEMORY_SIGNALS: usize = 10;

/// Weight of each new pair of intervals in the running noise estimate.
const NOISE_WEIGHT: f64 = 1.0 / 16.0;

/// Relative noise that the `noise` signal maps to tanh(1).
const NOISE_SCALE: f64 = 0.05;

/// Intervals at one count in a row that the `held` signal maps to tanh(1).
const HELD_SCALE: f64 = 32.0;

/// A stream count and the utility remembered for it.
///
/// ```
/// use optimizer::policy::{Measured, UtilityMemory};
///
/// let mut memory = UtilityMemory::new(32);
/// memory.record(20, 0.9, 1, true);
/// let best: Option<Measured> = memory.best();
/// assert_eq!(best, Some((20, 0.9)));
/// ```
pub type Measured = (usize, f64);

/// One remembered count.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Mean utility of the intervals held in a row, weighted to the last [`SAMPLES`].
    utility: RunningMean,
    /// Intervals in a row that measured it, uncapped.
    run: u32,
    /// Utility of the latest interval alone.
    last: f64,
    /// Index of the latest interval that measured it.
    at: u64,
    /// Whether that interval measured the count settled rather than its new streams ramping up.
    settled: bool,
}

/// The utility measured at each recently used stream count.
///
/// ```
/// use optimizer::policy::UtilityMemory;
///
/// let mut memory = UtilityMemory::new(32);
/// for (mi, (streams, utility)) in [(1, 0.2), (6, 0.6), (11, 0.9), (16, 0.8)].into_iter().enumerate() {
///     memory.record(streams, utility, mi as u64, true);
/// }
/// assert_eq!(memory.best(), Some((11, 0.9)));
/// assert_eq!(memory.neighbours(11), (Some((6, 0.6)), Some((16, 0.8))));
/// ```
#[derive(Debug, Clone)]
pub struct UtilityMemory {
    intervals: u64,
    by_count: BTreeMap<usize, Entry>,
    /// Running mean of the relative change of the utility between consecutive settled
    /// intervals at one count: how much one interval's measurement swings by itself.
    noise: Option<f64>,
}

impl UtilityMemory {
    /// An empty memory that forgets a value `intervals` intervals after it was measured.
    ///
    /// ```
    /// use optimizer::policy::UtilityMemory;
    ///
    /// assert_eq!(UtilityMemory::new(32).best(), None);
    /// ```
    pub fn new(intervals: usize) -> Self {
        UtilityMemory {
            intervals: intervals as u64,
            by_count: BTreeMap::new(),
            noise: None,
        }
    }

    /// Forgets the values that are too old at interval `mi`.
    ///
    /// ```
    /// use optimizer::policy::UtilityMemory;
    ///
    /// let mut memory = UtilityMemory::new(10);
    /// memory.record(8, 0.7, 5, true);
    /// memory.forget(14);
    /// assert!(memory.best().is_some());
    /// memory.forget(15);
    /// assert!(memory.best().is_none(), "measured 10 intervals ago");
    /// ```
    pub fn forget(&mut self, mi: u64) {
        let span = self.intervals;
        self.by_count.retain(|_, e| mi < e.at.saturating_add(span));
    }

    /// Records that interval `mi` measured `utility` at `streams`, `settled` unless new streams
    /// were ramping up for most of it: averaged with the value of the interval before if that
    /// measured the same count settled too, else replacing what was there.
    ///
    /// ```
    /// use optimizer::policy::UtilityMemory;
    ///
    /// let mut memory = UtilityMemory::new(32);
    /// memory.record(8, 1.0, 1, true);
    /// memory.record(8, 0.8, 2, true);
    /// assert_eq!(memory.settled_at(8), Some(0.9), "the mean of a count held in a row");
    /// memory.record(8, 0.5, 9, true);
    /// assert_eq!(memory.settled_at(8), Some(0.5), "measured again later: replaced");
    /// ```
    pub fn record(&mut self, streams: usize, utility: f64, mi: u64, settled: bool) {
        if !utility.is_finite() {
            return;
        }
        // The first interval of a run can still show the change before it: only later pairs
        // measure noise.
        let previous = self
            .by_count
            .get(&streams)
            .filter(|e| settled && e.settled && e.run >= 2 && e.at + 1 == mi)
            .map(|e| e.last);
        if let Some(previous) = previous {
            self.track_noise(previous, utility);
        }
        let fresh = Entry {
            utility: RunningMean::of(utility),
            run: 1,
            last: utility,
            at: mi,
            settled,
        };
        let entry = self.by_count.entry(streams).or_insert(fresh);
        if entry.at + 1 == mi {
            // Held in a row, ramp-up or not.
            let run = entry.run + 1;
            if settled && entry.settled {
                entry.utility.add(utility, SAMPLES);
                entry.last = utility;
                entry.at = mi;
            } else {
                *entry = fresh;
            }
            entry.run = run;
        } else {
            *entry = fresh;
        }
    }

    /// Updates the noise estimate with two consecutive settled intervals at one count.
    fn track_noise(&mut self, previous: f64, utility: f64) {
        let size = utility.abs().max(previous.abs());
        if size > 0.0 {
            let change = (utility - previous).abs() / size;
            let noise = self.noise.get_or_insert(change);
            *noise += (change - *noise) * NOISE_WEIGHT;
        }
    }

    /// The relative change of the utility between consecutive settled intervals at one count,
    /// averaged over the recent pairs; `None` before the first such pair.
    ///
    /// ```
    /// use optimizer::policy::UtilityMemory;
    ///
    /// let mut memory = UtilityMemory::new(32);
    /// memory.record(8, 0.5, 1, true); // the first interval at 8: may still show the change
    /// memory.record(8, 1.0, 2, true);
    /// assert_eq!(memory.noise(), None);
    /// memory.record(8, 0.9, 3, true);
    /// assert!((memory.noise().unwrap() - 0.1).abs() < 1e-12);
    /// ```
    pub fn noise(&self) -> Option<f64> {
        self.noise
    }

    /// The count with the highest remembered utility and that utility (the fewer streams on a
    /// tie); `None` while nothing is remembered.
    ///
    /// ```
    /// use optimizer::policy::UtilityMemory;
    ///
    /// let mut memory = UtilityMemory::new(32);
    /// memory.record(12, 0.9, 1, true);
    /// memory.record(10, 0.9, 2, true);
    /// assert_eq!(memory.best(), Some((10, 0.9)), "the fewer streams on a tie");
    /// ```
    pub fn best(&self) -> Option<Measured> {
        self.best_of(|_| true)
    }

    /// Like [`best`](Self::best), among the counts whose value was measured settled.
    ///
    /// ```
    /// use optimizer::policy::UtilityMemory;
    ///
    /// let mut memory = UtilityMemory::new(32);
    /// memory.record(10, 0.8, 1, true);
    /// memory.record(20, 0.95, 2, false); // its new streams were still ramping up
    /// assert_eq!(memory.best(), Some((20, 0.95)));
    /// assert_eq!(memory.best_settled(), Some((10, 0.8)));
    /// ```
    pub fn best_settled(&self) -> Option<Measured> {
        self.best_of(|e| e.settled)
    }

    /// The best remembered count among the entries `keep` accepts.
    fn best_of(&self, keep: impl Fn(&Entry) -> bool) -> Option<Measured> {
        self.by_count.iter().filter(|(_, e)| keep(e)).fold(
            None,
            |best: Option<Measured>, (&n, e)| match best {
                Some((_, b)) if b >= e.utility.mean() => best,
                _ => Some((n, e.utility.mean())),
            },
        )
    }

    /// The remembered utility at `streams`, if the run it comes from measured that count
    /// settled (not only its new streams ramping up).
    ///
    /// ```
    /// use optimizer::policy::UtilityMemory;
    ///
    /// let mut memory = UtilityMemory::new(32);
    /// memory.record(20, 0.95, 1, false);
    /// assert_eq!(memory.settled_at(20), None);
    /// ```
    pub fn settled_at(&self, streams: usize) -> Option<f64> {
        self.by_count
            .get(&streams)
            .filter(|e| e.settled)
            .map(|e| e.utility.mean())
    }

    /// The nearest remembered counts below and above `streams`, with their utilities.
    ///
    /// ```
    /// use optimizer::policy::UtilityMemory;
    ///
    /// let mut memory = UtilityMemory::new(32);
    /// memory.record(17, 0.9, 1, true);
    /// memory.record(22, 0.7, 2, true);
    /// assert_eq!(memory.neighbours(19), (Some((17, 0.9)), Some((22, 0.7))));
    /// assert_eq!(memory.neighbours(30), (Some((22, 0.7)), None));
    /// ```
    pub fn neighbours(&self, streams: usize) -> (Option<Measured>, Option<Measured>) {
        let below = self.by_count.range(..streams).next_back();
        let above = self.by_count.range(streams + 1..).next();
        let value = |(&m, e): (&usize, &Entry)| (m, e.utility.mean());
        (below.map(value), above.map(value))
    }

    /// What the memory says about an interval at `streams` that measured `utility`, in the
    /// order of the last six of [`super::SIGNALS`], each in [-1, 1], with
    /// utilities compared in units of `scale` at least (a small share of the best throughput
    /// seen, so that utilities near 0 do not blow up):
    /// - `regret`: (best remembered - utility) / |best|, in [0, 1];
    /// - `best_offset`: tanh((count of the best - streams) / 10);
    /// - `slope_below`, `slope_above`: tanh of the elasticity of the utility (relative change
    ///   over relative change of the count) from the nearest remembered count below to this
    ///   count's remembered utility, and from that to the nearest count above: positive when
    ///   more streams did better; 0 while this count or that neighbour is not remembered;
    /// - `gap_below`, `gap_above`: tanh(distance in streams to that neighbour / 10), 0 when
    ///   there is none;
    /// - `trust_below`, `trust_above`: how many settled intervals that neighbour's value
    ///   averages, over the 8 it keeps at most; 0 when there is none or it was only measured ramping up;
    /// - `noise`: tanh([`noise`](Self::noise) / 5 %), 0 before it is known: whether a slope is
    ///   larger than what one interval swings by itself;
    /// - `held`: tanh(intervals in a row at `streams` / 32): how long the count has been held,
    ///   beyond the input window.
    ///
    /// ```
    /// use optimizer::policy::UtilityMemory;
    ///
    /// let mut memory = UtilityMemory::new(32);
    /// memory.record(20, 1.0, 1, true);
    /// memory.record(40, 0.5, 2, true);
    /// let [regret, best_offset, ..] = memory.signals(40, 0.5, 0.01);
    /// assert_eq!(regret, 0.5, "half the best remembered utility is lost");
    /// assert!(best_offset < 0.0, "the best was at fewer streams");
    /// ```
    pub fn signals(&self, streams: usize, utility: f64, scale: f64) -> [f64; MEMORY_SIGNALS] {
        let mut out = [0.0; MEMORY_SIGNALS];
        let Some((best_count, best)) = self.best() else {
            return out;
        };
        let unit = |u: f64| u.abs().max(scale);
        if unit(best) > 0.0 {
            out[0] = ((best - utility) / unit(best)).clamp(0.0, 1.0);
        }
        out[1] = ((best_count as f64 - streams as f64) / 10.0).tanh();
        let here = self.by_count.get(&streams).map(|e| e.utility.mean());
        let elasticity = |(n0, u0): (usize, f64), (n1, u1): (usize, f64)| {
            let du = (u1 - u0) / ((unit(u0) + unit(u1)) / 2.0);
            let dn = (n1 as f64 - n0 as f64) / ((n1 + n0) as f64 / 2.0);
            (du / dn).tanh()
        };
        let (below, above) = self.neighbours(streams);
        let trust = |m: usize| {
            let e = &self.by_count[&m];
            if e.settled {
                f64::from(e.utility.samples()) / f64::from(SAMPLES)
            } else {
                0.0
            }
        };
        if let Some((m, u_below)) = below {
            out[3] = ((streams - m) as f64 / 10.0).tanh();
            out[6] = trust(m);
            if let Some(u) = here {
                out[2] = elasticity((m, u_below), (streams, u));
            }
        }
        if let Some((m, u_above)) = above {
            out[5] = ((m - streams) as f64 / 10.0).tanh();
            out[7] = trust(m);
            if let Some(u) = here {
                out[4] = elasticity((streams, u), (m, u_above));
            }
        }
        out[8] = self.noise.map_or(0.0, |x| (x / NOISE_SCALE).tanh());
        if let Some(e) = self.by_count.get(&streams) {
            out[9] = (f64::from(e.run) / HELD_SCALE).tanh();
        }
        out.map(|x| if x.is_finite() { x } else { 0.0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_latest_run_per_count_and_forgets_old_ones() {
        let mut m = UtilityMemory::new(4);
        assert_eq!(m.best(), None);
        m.record(10, 8.0, 0, true);
        m.record(10, 6.0, 1, true);
        assert_eq!(m.best(), Some((10, 7.0)), "mean of a run");
        m.record(20, 6.5, 2, true);
        m.record(10, 5.0, 3, true);
        assert_eq!(m.best(), Some((20, 6.5)), "a new run replaced the old");
        m.forget(6);
        m.record(30, 1.0, 6, true);
        assert_eq!(
            m.best(),
            Some((10, 5.0)),
            "count 20 of interval 2 forgotten"
        );
        m.forget(7);
        assert_eq!(m.best(), Some((30, 1.0)));
        m.record(12, f64::NAN, 7, true);
        assert_eq!(
            m.best(),
            Some((30, 1.0)),
            "no value from a broken measurement"
        );
    }

    #[test]
    fn a_run_averages_at_most_its_last_samples() {
        let mut m = UtilityMemory::new(100);
        for mi in 0..20 {
            m.record(3, 0.0, mi, true);
        }
        for mi in 20..20 + u64::from(SAMPLES) {
            m.record(3, 1.0, mi, true);
        }
        let (_, u) = m.best().unwrap();
        assert!(u > 0.6, "old samples fade: {u}");
    }

    #[test]
    fn a_ramp_up_interval_counts_only_until_the_count_is_measured_settled() {
        let mut m = UtilityMemory::new(8);
        m.record(10, 2.0, 0, false);
        assert_eq!(m.best(), Some((10, 2.0)));
        assert_eq!(m.settled_at(10), None, "only ramp-up measured");
        m.record(4, 1.0, 0, true);
        assert_eq!(m.best_settled(), Some((4, 1.0)));
        m.record(10, 6.0, 1, true);
        m.record(10, 8.0, 2, true);
        assert_eq!(m.best(), Some((10, 7.0)), "the ramp-up is not in the mean");
        assert_eq!(m.settled_at(10), Some(7.0));
    }

    #[test]
    fn ties_go_to_fewer_streams() {
        let mut m = UtilityMemory::new(8);
        m.record(16, 3.0, 0, true);
        m.record(4, 3.0, 2, true);
        assert_eq!(m.best(), Some((4, 3.0)));
    }

    #[test]
    fn slopes_say_whether_more_streams_did_better() {
        let mut m = UtilityMemory::new(32);
        assert_eq!(
            m.signals(5, 1.0, 0.1),
            [0.0; MEMORY_SIGNALS],
            "nothing remembered"
        );
        // Utility n (linear: elasticity 1) up to 10, then flat.
        m.record(5, 5.0, 0, true);
        m.record(10, 10.0, 2, true);
        m.record(20, 10.0, 4, true);
        let s = m.signals(10, 10.0, 0.1);
        assert_eq!(s[0], 0.0, "at the best");
        assert_eq!(s[1], 0.0);
        assert!(
            (s[2] - 1f64.tanh()).abs() < 1e-9,
            "5 -> 10 doubled: {}",
            s[2]
        );
        assert!((s[3] - 0.5f64.tanh()).abs() < 1e-9);
        assert_eq!(s[4], 0.0, "flat above");
        assert!((s[5] - 1f64.tanh()).abs() < 1e-9);
        let s = m.signals(20, 10.0, 0.1);
        assert_eq!(s[0], 0.0, "a tie is no regret");
        assert!(s[1] < -0.7, "the best is 10 below");
        assert_eq!((s[4], s[5]), (0.0, 0.0), "nothing above");
        let s = m.signals(7, 2.0, 0.1);
        assert!((s[0] - 0.8).abs() < 1e-9);
        assert_eq!(s[2], 0.0, "7 itself not remembered: no slope");
        assert!(s[3] > 0.0 && s[5] > 0.0, "neighbours both sides");
    }

    #[test]
    fn trust_counts_the_settled_intervals_behind_a_neighbour() {
        let mut m = UtilityMemory::new(32);
        for mi in 0..4 {
            m.record(4, 1.0, mi, true);
        }
        m.record(9, 1.5, 4, false);
        m.record(6, 1.2, 5, true);
        let [.., trust_below, trust_above, _, _] = m.signals(6, 1.2, 0.1);
        assert_eq!(trust_below, 0.5, "4 of 8 intervals");
        assert_eq!(trust_above, 0.0, "9 was only measured ramping up");
    }

    #[test]
    fn noise_leaves_out_the_first_interval_of_each_run() {
        let mut m = UtilityMemory::new(32);
        // Each run starts far off (the change before it), then alternates 1.0 and 0.9.
        for (start, n) in [(0, 4), (10, 8)] {
            m.record(n, 0.1, start, true);
            for i in 1..10 {
                m.record(n, if i % 2 == 0 { 0.9 } else { 1.0 }, start + i, true);
            }
        }
        let noise = m.noise().unwrap();
        assert!((noise - 0.1).abs() < 1e-9, "{noise}");
        let [.., signal, _] = m.signals(8, 0.9, 0.1);
        assert!(
            (signal - 2f64.tanh()).abs() < 1e-9,
            "10 % is twice the scale"
        );
    }

    #[test]
    fn held_counts_a_run_past_the_samples_averaged() {
        let mut m = UtilityMemory::new(100);
        m.record(3, 1.0, 0, false);
        for mi in 1..32 {
            m.record(3, 1.0, mi, true);
        }
        let held = m.signals(3, 1.0, 0.1)[MEMORY_SIGNALS - 1];
        assert!((held - 1f64.tanh()).abs() < 1e-9, "32 in a row: {held}");
        m.record(4, 1.0, 32, true);
        let held = m.signals(4, 1.0, 0.1)[MEMORY_SIGNALS - 1];
        assert!(
            (held - (1.0 / 32f64).tanh()).abs() < 1e-9,
            "a new count: {held}"
        );
    }
}
