//! A stream count that follows a timetable (`--optimizer schedule:0s:1,15s:6,40s:1`): to see
//! what a path does when the count changes, on the simulator and on a real transfer alike
//! (`xfer-bench-calibrate --schedule` compares the two second by second).

use std::fmt;
use std::str::FromStr;

use crate::controller::Controller;
use crate::signals::Observation;

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
    /// `(from, count)` with `from` in milliseconds since the start, in increasing order, the
    /// first at 0.
    steps: Vec<(u64, usize)>,
}

/// Why a schedule could not be read.
///
/// ```
/// use optimizer::CountSchedule;
///
/// let e = "0s:1,5s:0".parse::<CountSchedule>().unwrap_err();
/// assert!(e.to_string().contains("5s:0"), "{e}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "bad stream-count schedule {text:?} ({why}): expected TIME:COUNT steps separated by commas, \
     times in seconds (15s, 0.5s or 15), the first at 0s, counts at least 1, e.g. 0s:1,15s:6"
)]
pub struct ScheduleError {
    text: String,
    why: String,
}

impl CountSchedule {
    /// The count at the start.
    ///
    /// ```
    /// # use optimizer::CountSchedule;
    /// assert_eq!("0s:4,2s:8".parse::<CountSchedule>().unwrap().first(), 4);
    /// ```
    pub fn first(&self) -> usize {
        self.steps[0].1
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
        self.steps
            .iter()
            .rev()
            .find(|(from, _)| *from <= ms)
            .map_or(self.first(), |&(_, n)| n)
    }

    /// The same schedule with no count above `max`.
    ///
    /// ```
    /// # use optimizer::CountSchedule;
    /// let schedule: CountSchedule = "0s:4,2s:80".parse().unwrap();
    /// assert_eq!(schedule.capped(64).to_string(), "schedule:0s:4,2s:64");
    /// ```
    pub fn capped(mut self, max: usize) -> Self {
        for step in &mut self.steps {
            step.1 = step.1.min(max.max(1));
        }
        self
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
    type Err = ScheduleError;

    /// Reads `TIME:COUNT,...` (what follows `schedule:` on a command line).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let error = |why: String| ScheduleError {
            text: s.into(),
            why,
        };
        let mut steps = Vec::new();
        for part in s.split(',').map(str::trim) {
            let (time, count) = part
                .split_once(':')
                .ok_or_else(|| error(format!("{part:?} is not TIME:COUNT")))?;
            let seconds: f64 = time
                .trim()
                .strip_suffix('s')
                .unwrap_or(time.trim())
                .parse()
                .ok()
                .filter(|t: &f64| t.is_finite() && *t >= 0.0)
                .ok_or_else(|| error(format!("{time:?} in {part:?} is not a time")))?;
            let count = count
                .trim()
                .parse()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| error(format!("{count:?} in {part:?} is not a count")))?;
            steps.push(((seconds * 1e3).round() as u64, count));
        }
        if steps[0].0 != 0 {
            return Err(error("the first step is not at 0s".into()));
        }
        if steps.windows(2).any(|w| w[1].0 <= w[0].0) {
            return Err(error("the times do not increase".into()));
        }
        Ok(CountSchedule { steps })
    }
}

impl fmt::Display for CountSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("schedule:")?;
        for (i, (ms, n)) in self.steps.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            write!(f, "{sep}{}s:{n}", *ms as f64 / 1e3)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bad_schedules_are_refused() {
        for bad in [
            "",
            "1s:2",
            "0s:1,0s:2",
            "0s:1,5s:2,3s:4",
            "0s:x",
            "0s",
            "-1s:2",
            "0s:0",
        ] {
            assert!(bad.parse::<CountSchedule>().is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn schedules_print_back(steps in proptest::collection::vec((1u64..100_000, 1usize..300), 0..6)) {
            let mut text = format!("0s:{}", steps.first().map_or(1, |s| s.1));
            let mut at = 0;
            for (gap, n) in &steps {
                at += gap;
                text += &format!(",{}s:{n}", at as f64 / 1e3);
            }
            let schedule: CountSchedule = text.parse().unwrap();
            prop_assert_eq!(schedule.to_string(), format!("schedule:{text}"));
            prop_assert_eq!(schedule.to_string()["schedule:".len()..].parse::<CountSchedule>().unwrap(), schedule);
        }
    }
}
