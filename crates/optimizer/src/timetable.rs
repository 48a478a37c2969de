//! Values that change at given times since a start, written `TIME:VALUE,TIME:VALUE,...`: a
//! stream count (`--optimizer schedule:0s:1,15s:6`), the delay of the emulated WAN
//! (`0s:10ms,60s:80ms`). One reader for every such timetable, and for the times they are
//! written in, so that every command line reads `500ms`, `1.5s` and `2m` alike.

use std::fmt;
use std::time::Duration;

/// Reads a time: `500ms`, `15s`, `1.5s`, `2m`, or bare seconds (`15`), at least zero.
///
/// Written here, not taken from `humantime`, because that crate reads neither fractions
/// (`0.5s`) nor bare seconds, and both are in the command lines and harness files users have.
///
/// ```
/// use optimizer::parse_time;
/// use std::time::Duration;
///
/// assert_eq!(parse_time("1.5s"), Some(Duration::from_millis(1500)));
/// assert_eq!(parse_time("300ms"), Some(Duration::from_millis(300)));
/// assert_eq!(parse_time("2m"), Some(Duration::from_secs(120)));
/// assert_eq!(parse_time("15"), Some(Duration::from_secs(15)));
/// assert_eq!(parse_time("-1s"), None);
/// ```
pub fn parse_time(s: &str) -> Option<Duration> {
    let s = s.trim();
    // Nanoseconds per unit: scaling once, then rounding, reads 10.601s as 10,601 ms exactly.
    let (number, unit_ns) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e6)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e9)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60e9)
    } else {
        (s, 1e9)
    };
    let ns = (number.trim().parse::<f64>().ok()? * unit_ns).round();
    (ns >= 0.0 && ns < u64::MAX as f64).then(|| Duration::from_nanos(ns as u64))
}

/// Writes a time as [`parse_time`] reads it back: seconds as the shortest decimal, `1.5s`.
///
/// ```
/// use optimizer::{format_time, parse_time};
/// use std::time::Duration;
///
/// assert_eq!(format_time(Duration::from_millis(10_601)), "10.601s");
/// assert_eq!(format_time(Duration::from_secs(60)), "60s");
/// assert_eq!(parse_time(&format_time(Duration::from_nanos(1))), Some(Duration::from_nanos(1)));
/// ```
pub fn format_time(time: Duration) -> String {
    // Whole nanoseconds over 1e9 print as the shortest decimal that reads back.
    format!("{}s", time.as_nanos() as f64 / 1e9)
}

/// Values from given times on: `(from, value)` steps, the first at zero, the times increasing.
///
/// ```
/// use optimizer::{parse_time, Timetable};
/// use std::time::Duration;
///
/// let delays = Timetable::parse("0s:10ms,60s:80ms", "delay schedule", "0s:10ms,60s:80ms", |d| {
///     parse_time(d).ok_or_else(|| format!("{d:?} is not a delay like 50ms"))
/// })
/// .unwrap();
/// assert_eq!(delays.at(Duration::from_secs(59)), &Duration::from_millis(10));
/// assert_eq!(delays.at(Duration::from_secs(60)), &Duration::from_millis(80));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timetable<T> {
    steps: Vec<(Duration, T)>,
}

/// Why a timetable could not be read.
///
/// ```
/// use optimizer::CountSchedule;
///
/// let e = "0s:1,5s:0".parse::<CountSchedule>().unwrap_err();
/// assert!(e.to_string().contains("5s:0"), "{e}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "bad {what} {text:?} ({why}): expected TIME:VALUE steps separated by commas, times like \
     15s, 0.5s, 500ms, 2m or 15 (seconds), the first at 0s and each later than the one before, \
     e.g. {example}"
)]
pub struct TimetableError {
    what: &'static str,
    example: &'static str,
    text: String,
    why: String,
}

impl<T> Timetable<T> {
    /// Reads `text`, each value with `value` (which says what it expected when it fails);
    /// `what` and `example` name the timetable in the error.
    pub fn parse(
        text: &str,
        what: &'static str,
        example: &'static str,
        value: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Self, TimetableError> {
        let error = |why: String| TimetableError {
            what,
            example,
            text: text.into(),
            why,
        };
        let mut steps = Vec::new();
        for part in text.split(',').map(str::trim) {
            let (time, v) = part
                .split_once(':')
                .ok_or_else(|| error(format!("{part:?} is not TIME:VALUE")))?;
            let time = parse_time(time)
                .ok_or_else(|| error(format!("{time:?} in {part:?} is not a time")))?;
            let v = value(v.trim()).map_err(|why| error(format!("in {part:?}: {why}")))?;
            steps.push((time, v));
        }
        if steps[0].0 != Duration::ZERO {
            return Err(error("the first step is not at 0s".into()));
        }
        if steps.windows(2).any(|w| w[1].0 <= w[0].0) {
            return Err(error("the times do not increase".into()));
        }
        Ok(Timetable { steps })
    }

    /// The same value from the start on.
    pub fn constant(value: T) -> Self {
        Timetable {
            steps: vec![(Duration::ZERO, value)],
        }
    }

    /// The value at the start.
    pub fn first(&self) -> &T {
        &self.steps[0].1
    }

    /// The value in force `elapsed` after the start.
    pub fn at(&self, elapsed: Duration) -> &T {
        let after = self.steps.partition_point(|(from, _)| *from <= elapsed);
        &self.steps[after.max(1) - 1].1
    }

    /// Each value changed by `f`, at the same times.
    pub fn map<U>(self, f: impl Fn(T) -> U) -> Timetable<U> {
        Timetable {
            steps: self.steps.into_iter().map(|(t, v)| (t, f(v))).collect(),
        }
    }
}

impl<T: fmt::Display> fmt::Display for Timetable<T> {
    /// Writes the timetable as [`Timetable::parse`] reads it, times in seconds.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (from, v)) in self.steps.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            write!(f, "{sep}{}:{v}", format_time(*from))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn counts(text: &str) -> Result<Timetable<u32>, TimetableError> {
        Timetable::parse(text, "schedule", "0s:1", |v| {
            v.parse().map_err(|_| format!("{v:?} is not a number"))
        })
    }

    #[test]
    fn bad_timetables_are_refused_with_the_step_at_fault() {
        for (bad, named) in [
            ("", "\"\""),
            ("1s:2", "first step"),
            ("0s:1,0s:2", "increase"),
            ("0s:1,5s:2,3s:4", "increase"),
            ("0s:x", "\"x\""),
            ("0s", "\"0s\""),
            ("-1s:2", "\"-1s\""),
            ("0s:1,,2s:3", "\"\""),
        ] {
            let e = counts(bad).unwrap_err().to_string();
            assert!(e.contains(named), "{bad:?}: {e}");
        }
    }

    #[test]
    fn values_hold_from_their_time_until_the_next() {
        let t = counts("0s:1,300ms:6,0.7s:3,2m:9").unwrap();
        let at = |ms| *t.at(Duration::from_millis(ms));
        assert_eq!(
            [
                at(0),
                at(299),
                at(300),
                at(699),
                at(700),
                at(119_999),
                at(120_000)
            ],
            [1, 1, 6, 6, 3, 3, 9]
        );
        assert_eq!(*t.first(), 1);
        assert_eq!(*Timetable::constant(5).at(Duration::from_secs(9)), 5);
    }

    proptest! {
        #[test]
        fn timetables_print_back(steps in proptest::collection::vec((1u64..100_000, 1u32..300), 0..6)) {
            let mut text = format!("0s:{}", steps.first().map_or(1, |s| s.1));
            let mut at = 0;
            for (gap, n) in &steps {
                at += gap;
                text += &format!(",{}s:{n}", at as f64 / 1e3);
            }
            let t = counts(&text).unwrap();
            prop_assert_eq!(t.to_string(), text.clone());
            prop_assert_eq!(counts(&t.to_string()).unwrap(), t);
        }
    }
}
