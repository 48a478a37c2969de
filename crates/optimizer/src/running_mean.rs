//! The running mean that the controllers keep of what they measure at a count (its utility,
//! its RTT) and of the RTT's swing.
//!
//! A plain mean of the first samples, then an exponential mean that weighs each new sample as
//! one of the last `memory`: the first samples are all equally good evidence, and later old
//! ones must fade as the path changes. An exponential mean started at 0 would instead stay far
//! below the quantity for its first dozen samples.

/// A mean of samples: plain over the first `memory` of them, then exponential with weight
/// 1/`memory` ([`RunningMean::add`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct RunningMean {
    mean: f64,
    /// Samples in the mean, at most the `memory` they were added with.
    samples: u32,
}

impl RunningMean {
    /// The mean of one sample.
    pub(crate) fn of(sample: f64) -> Self {
        RunningMean {
            mean: sample,
            samples: 1,
        }
    }

    /// Adds a sample: each new one weighs as one of the last `memory` (at least 1).
    pub(crate) fn add(&mut self, sample: f64, memory: u32) {
        self.samples = (self.samples + 1).min(memory.max(1));
        self.mean += (sample - self.mean) / f64::from(self.samples);
    }

    /// The mean (0 before the first sample).
    pub(crate) fn mean(self) -> f64 {
        self.mean
    }

    /// Samples in the mean, up to the `memory` they were added with.
    pub(crate) fn samples(self) -> u32 {
        self.samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_over_the_memory_then_exponential() {
        let mut m = RunningMean::default();
        for x in [1.0, 2.0, 3.0] {
            m.add(x, 3);
        }
        assert_eq!((m.mean(), m.samples()), (2.0, 3));
        m.add(5.0, 3);
        assert_eq!((m.mean(), m.samples()), (3.0, 3), "a third of the way to 5");
    }

    #[test]
    fn the_first_sample_is_the_mean() {
        let mut m = RunningMean::default();
        m.add(0.3, 10);
        assert_eq!(m, RunningMean::of(0.3));
        assert_eq!((m.mean(), m.samples()), (0.3, 1));
    }
}
