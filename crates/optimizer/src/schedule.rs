//! A stream count that follows a timetable (`--optimizer schedule:0s:1,15s:6,40s:1`): to see
//! what a path does when the count changes, on the simulator and on a real transfer alike
//! (`xfer-bench-calibrate --schedule` compares the two second by second).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::controller::Controller;
use crate::signals::Observation;
use crate::timetable::{Timetable, TimetableError};

/// Counts from given times on: the count for an interval is the one in force when it starts.
///
/// ```
/// use optimizer::sim::{run, RunConfig, Scenario};
/// use optimizer::CountSchedule;
///
/// let mut schedule: CountSchedule = "0s:1,10s:6,20s:1".parse().unwrap();
/// assert_eq!(schedule.first(), 1);
/// let config = RunConfig { duration: 30.0, initial_streams: schedule.first(), ..RunConfig::default() };
/// let (rows, _) = run(&Scenario::shipped("cloudlab-1g").unwrap(), &mut schedule, &config);
/// let counts: Vec<usize> = rows.iter().map(|r| r.observation.streams).collect();
/// assert_eq!((counts[9], counts[10], counts[19], counts[20]), (1, 6, 6, 1));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountSchedule {
    counts: Timetable<usize>,
}

impl CountSchedule {
    /// The count at the start.
    ///
    /// ```
    /// # use optimizer::CountSchedule;
    /// assert_eq!("0s:4,2s:8".parse::<CountSchedule>().unwrap().first(), 4);
    /// ```
    pub fn first(&self) -> usize {
        *self.counts.first()
    }

    /// The count in force `seconds` after the start.
    ///
    /// ```
    /// # use optimizer::CountSchedule;
    /// let schedule: CountSchedule = "0s:4,2s:8".parse().unwrap();
    /// assert_eq!((schedule.at(1.999), schedule.at(2.0)), (4, 8));
    /// ```
    pub fn at(&self, seconds: f64) -> usize {
        // Intervals end on times like 2.0000000001 s: compare in whole milliseconds.
        let ms = (seconds * 1e3).round().max(0.0) as u64;
        *self.counts.at(Duration::from_millis(ms))
    }

    /// The same schedule with no count above `max`.
    ///
    /// ```
    /// # use optimizer::CountSchedule;
    /// let schedule: CountSchedule = "0s:4,2s:80".parse().unwrap();
    /// assert_eq!(schedule.capped(64).to_string(), "schedule:0s:4,2s:64");
    /// ```
    pub fn capped(self, max: usize) -> Self {
        CountSchedule {
            counts: self.counts.map(|n| n.min(max.max(1))),
        }
    }
}

impl Controller for CountSchedule {
    fn name(&self) -> String {
        self.to_string()
    }

    fn decide(&mut self, observation: &Observation) -> usize {
        // The interval that just ended ends where the next begins.
        self.at(observation.time)
    }
}

impl FromStr for CountSchedule {
    type Err = TimetableError;

    /// Reads `TIME:COUNT,...` (what follows `schedule:` on a command line).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let counts = Timetable::parse(s, "stream-count schedule", "0s:1,15s:6", |count| {
            count
                .parse()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| format!("{count:?} is not a count of at least 1"))
        })?;
        Ok(CountSchedule { counts })
    }
}

impl fmt::Display for CountSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "schedule:{}", self.counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_below_one_are_refused_and_counts_print_back() {
        let e = "0s:1,5s:0".parse::<CountSchedule>().unwrap_err();
        assert!(e.to_string().contains("not a count"), "{e}");
        let schedule: CountSchedule = "0s:2,0.3s:6,700ms:3".parse().unwrap();
        assert_eq!(schedule.to_string(), "schedule:0s:2,0.3s:6,0.7s:3");
        assert_eq!(
            (schedule.at(0.299), schedule.at(0.3), schedule.at(5.0)),
            (2, 6, 3)
        );
    }
}
