//! One limit on a transfer's total sending rate, however many streams share it
//! ([`super::SendOptions::rate_limit`]), constant or changing over the day as a
//! [`RateSchedule`] says: before a stream takes its next unit, it reserves a unit's worth of
//! the rate and waits for its turn; what the unit it then gets is shorter by is given back.
//! Reservations follow each other on one timeline (a virtual clock of the bytes reserved, as
//! GCRA schedules cells), so the streams together send at the limit whatever their count,
//! and a transfer that was idle may be ahead of its timeline by at most [`BURST`].
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

/// Seconds in a day, the period of a [`RateSchedule`].
const DAY: u32 = 24 * 3600;

/// How long a rate looked up in the schedule is used before the local time is read again,
/// at most: a change of the host's clock or time zone (summer time) takes effect within it.
const RECHECK: Duration = Duration::from_secs(60);

/// A transfer's rate limit over the day, as rclone's `--bwlimit` timetable: from each step's
/// time of day (the sending host's local time) until the next step's, the step's rate, or
/// none. Before the first step of a day, the day before's last step holds.
///
/// ```
/// use transfer::sender::{RateSchedule, RateStep};
///
/// // 100 MB/s in working hours, no limit at night.
/// let office = RateSchedule::daily(vec![
///     RateStep { from: 8 * 3600, bytes_per_second: Some(100_000_000) },
///     RateStep { from: 18 * 3600, bytes_per_second: None },
/// ])?;
/// assert_eq!(office.at(12 * 3600), (Some(100_000_000), 6 * 3600));
/// assert_eq!(office.at(7 * 3600), (None, 3600), "night, since 18:00 the day before");
/// assert_eq!(RateSchedule::constant(1_000).at(0).0, Some(1_000));
/// assert!(RateSchedule::daily(vec![]).is_err());
/// # Ok::<(), String>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RateSchedule {
    /// In order of `from`, no two at the same time, at least one.
    steps: Vec<RateStep>,
}

/// One step of a [`RateSchedule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateStep {
    /// When it starts: seconds after local midnight (below 86,400).
    pub from: u32,
    /// The limit from then on, in bytes per second (at least 1); `None`: no limit.
    pub bytes_per_second: Option<u64>,
}

impl RateSchedule {
    /// The same limit all day.
    pub fn constant(bytes_per_second: u64) -> RateSchedule {
        RateSchedule {
            steps: vec![RateStep {
                from: 0,
                bytes_per_second: Some(bytes_per_second),
            }],
        }
    }

    /// A timetable of `steps` in order of their times of day; refused (saying why) when it is
    /// empty, out of order, has a time past the day's end or a limit of 0.
    pub fn daily(steps: Vec<RateStep>) -> Result<RateSchedule, String> {
        if steps.is_empty() {
            return Err("a rate timetable needs at least one step".into());
        }
        if let Some(step) = steps.iter().find(|s| s.from >= DAY) {
            return Err(format!("{} s is past the end of a day", step.from));
        }
        if steps.windows(2).any(|pair| pair[0].from >= pair[1].from) {
            return Err("the times of a rate timetable must be in order, none twice".into());
        }
        if steps.iter().any(|s| s.bytes_per_second == Some(0)) {
            return Err("a rate limit must be above 0 bytes per second".into());
        }
        Ok(RateSchedule { steps })
    }

    /// The steps, in order.
    pub fn steps(&self) -> &[RateStep] {
        &self.steps
    }

    /// At `second` of the day (seconds after local midnight): the limit in bytes per second
    /// (`None`: none), and how many seconds it holds until the next step.
    pub fn at(&self, second: u32) -> (Option<u64>, u32) {
        let second = second % DAY;
        let after = self.steps.partition_point(|s| s.from <= second);
        let current = self.steps[(after + self.steps.len() - 1) % self.steps.len()];
        let next = match self.steps.get(after) {
            Some(next) => next.from,
            None => self.steps[0].from + DAY,
        };
        (current.bytes_per_second, next - second)
    }
}

impl std::str::FromStr for RateSchedule {
    type Err = String;

    /// A rate (`300Mbit`, `50MB/s`: [`crate::units::parse_rate`]) held all day, or a timetable
    /// of steps `HH:MM,RATE` separated by spaces, `off` for no limit:
    /// `"08:00,300Mbit 18:00,off"`.
    fn from_str(text: &str) -> Result<RateSchedule, String> {
        if !text.contains(',') {
            return crate::units::parse_rate(text).map(RateSchedule::constant);
        }
        let steps = text.split_whitespace().map(|step| {
            let bad = |why: String| format!("{step:?} is not a step of a rate timetable ({why}); example: \"08:00,300Mbit 18:00,off\"");
            let (time, rate) = step.split_once(',').ok_or_else(|| bad("say HH:MM,RATE".into()))?;
            let from = time_of_day(time).ok_or_else(|| bad(format!("{time:?} is not a time of day, 00:00 to 23:59")))?;
            let bytes_per_second = match rate {
                "off" => None,
                rate => Some(crate::units::parse_rate(rate)?),
            };
            Ok(RateStep { from, bytes_per_second })
        });
        RateSchedule::daily(steps.collect::<Result<_, String>>()?)
    }
}

impl std::fmt::Display for RateSchedule {
    /// As [`RateSchedule::from_str`](std::str::FromStr) reads it back (rates in bytes per
    /// second).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let [RateStep {
            from: 0,
            bytes_per_second: Some(rate),
        }] = self.steps[..]
        {
            return write!(f, "{rate}B/s");
        }
        for (i, step) in self.steps.iter().enumerate() {
            let space = if i == 0 { "" } else { " " };
            write!(
                f,
                "{space}{:02}:{:02}",
                step.from / 3600,
                step.from / 60 % 60
            )?;
            if step.from % 60 != 0 {
                write!(f, ":{:02}", step.from % 60)?;
            }
            f.write_str(",")?;
            match step.bytes_per_second {
                Some(rate) => write!(f, "{rate}B/s")?,
                None => f.write_str("off")?,
            }
        }
        Ok(())
    }
}

/// `HH:MM` or `HH:MM:SS` in seconds after midnight; `None` when it is no time of a day.
fn time_of_day(text: &str) -> Option<u32> {
    let fields: Vec<&str> = text.split(':').collect();
    if !(2..=3).contains(&fields.len()) || fields.iter().any(|f| f.len() != 2) {
        return None;
    }
    let mut seconds = 0;
    for (field, most) in fields.iter().zip([24, 60, 60]) {
        let value = field.parse::<u32>().ok().filter(|&v| v < most)?;
        seconds = seconds * 60 + value;
    }
    Some(if fields.len() == 2 {
        seconds * 60
    } else {
        seconds
    })
}

impl TryFrom<String> for RateSchedule {
    type Error = String;
    fn try_from(text: String) -> Result<RateSchedule, String> {
        text.parse()
    }
}

impl From<RateSchedule> for String {
    fn from(schedule: RateSchedule) -> String {
        schedule.to_string()
    }
}

/// The local time of day in seconds after midnight, as the host's time zone reads it (TZ,
/// else /etc/localtime).
fn local_second_of_day() -> u32 {
    let time = jiff::ZonedDateTime::now().time();
    let field = |value: i8| u32::try_from(value).unwrap_or(0);
    field(time.hour()) * 3600 + field(time.minute()) * 60 + field(time.second())
}

/// The shared timeline of a transfer's rate limit.
#[derive(Debug)]
pub(super) struct RateLimit {
    schedule: RateSchedule,
    /// Reads the local time of day ([`local_second_of_day`]; the tests' own clock).
    second_of_day: fn() -> u32,
    /// What a stream reserves before it takes a unit: the largest unit.
    unit: u64,
    timeline: Mutex<Timeline>,
}

/// Where a [`RateLimit`] stands.
#[derive(Debug, Default)]
struct Timeline {
    /// Where the next reservation starts (`None`: wherever the next one comes).
    next: Option<Instant>,
    /// The rate in force, in bytes per second (`None`: none).
    rate: Option<f64>,
    /// Until when `rate` is used before the schedule is looked up again (`None`: now).
    until: Option<Instant>,
}

impl RateLimit {
    /// A limit following `schedule` on streams sending units of at most `unit_size` bytes.
    pub(super) fn new(schedule: RateSchedule, unit_size: u32) -> RateLimit {
        RateLimit::with_clock(schedule, unit_size, local_second_of_day)
    }

    /// [`RateLimit::new`] reading the time of day from `second_of_day`.
    fn with_clock(schedule: RateSchedule, unit_size: u32, second_of_day: fn() -> u32) -> RateLimit {
        RateLimit {
            schedule,
            second_of_day,
            unit: u64::from(unit_size),
            timeline: Mutex::default(),
        }
    }

    /// What a stream reserves before it takes a unit, in bytes.
    pub(super) fn unit(&self) -> u64 {
        self.unit
    }

    /// Reserves `bytes` of the rate at `now`: the instant they may be sent from (`now`, or
    /// later while earlier reservations use the rate).
    pub(super) fn reserve(&self, bytes: u64, now: Instant) -> Instant {
        let mut timeline = unpoisoned(self.timeline.lock());
        if timeline.until.is_none_or(|until| now >= until) {
            let (rate, holds) = self.schedule.at((self.second_of_day)());
            let rate = rate.map(|r| r as f64);
            if rate != timeline.rate {
                // A new rate starts a timeline of its own: what was reserved at the old one
                // was waited for already.
                timeline.next = None;
                timeline.rate = rate;
            }
            timeline.until = Some(now + RECHECK.min(Duration::from_secs(u64::from(holds))));
        }
        let Some(rate) = timeline.rate else {
            return now;
        };
        let earliest = now.checked_sub(BURST).unwrap_or(now);
        let start = timeline.next.map_or(now, |next| next.max(earliest));
        timeline.next = Some(start + Duration::from_secs_f64(bytes as f64 / rate));
        start
    }

    /// Gives back `bytes` reserved and not sent: the reservations after move that much earlier.
    pub(super) fn give_back(&self, bytes: u64) {
        let mut timeline = unpoisoned(self.timeline.lock());
        let Some(rate) = timeline.rate else {
            return;
        };
        if let Some(at) = timeline.next.as_mut() {
            let back = Duration::from_secs_f64(bytes as f64 / rate);
            *at = at.checked_sub(back).unwrap_or(*at);
        }
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
        let limit = RateLimit::new(RateSchedule::constant(1_000_000), 1 << 20);
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
        let limit = RateLimit::new(RateSchedule::constant(1_000_000), 1 << 20);
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

    /// What the command line and configuration files say reads as the schedule meant, and
    /// prints back as it reads.
    #[test]
    fn a_schedule_reads_from_a_rate_or_a_timetable_and_prints_back() {
        let office: RateSchedule = "08:00,300Mbit 18:30,off".parse().unwrap();
        assert_eq!(
            office.steps(),
            [
                RateStep {
                    from: 8 * 3600,
                    bytes_per_second: Some(37_500_000)
                },
                RateStep {
                    from: 18 * 3600 + 1800,
                    bytes_per_second: None
                },
            ]
        );
        assert_eq!(office.to_string(), "08:00,37500000B/s 18:30,off");
        assert_eq!(office.to_string().parse::<RateSchedule>().unwrap(), office);
        let constant: RateSchedule = "50MB/s".parse().unwrap();
        assert_eq!(constant, RateSchedule::constant(50_000_000));
        assert_eq!(
            constant.to_string().parse::<RateSchedule>().unwrap(),
            constant
        );
        for bad in [
            "8,300Mbit",
            "25:00,1MB/s",
            "08:5,1MB/s",
            "08:00,300",
            "18:00,off 08:00,1MB/s",
        ] {
            assert!(bad.parse::<RateSchedule>().is_err(), "{bad}");
        }
        let e = "08:00,300".parse::<RateSchedule>().unwrap_err();
        assert!(e.contains("examples: 300Mbit"), "{e}");
        // A service's configuration file says the same as the command line.
        let options: crate::sender::SendOptions =
            toml::from_str("rate_limit = \"08:00,300Mbit 18:30,off\"").unwrap();
        assert_eq!(options.rate_limit, Some(office));
        let e = toml::from_str::<crate::sender::SendOptions>("rate_limit = \"300M\"");
        assert!(e.unwrap_err().to_string().contains("not a rate"));
    }

    /// The tests' clock: 08:00 and a second before it.
    fn eight() -> u32 {
        8 * 3600
    }
    fn just_before_eight() -> u32 {
        8 * 3600 - 1
    }

    /// The limit in force follows the timetable: none before 08:00, 1 MB/s from then; a
    /// reservation at the new rate starts a timeline of its own.
    #[test]
    fn the_limit_follows_the_timetable() {
        let schedule = RateSchedule::daily(vec![
            RateStep {
                from: 8 * 3600,
                bytes_per_second: Some(1_000_000),
            },
            RateStep {
                from: 20 * 3600,
                bytes_per_second: None,
            },
        ])
        .unwrap();
        let night = RateLimit::with_clock(schedule.clone(), 1 << 20, just_before_eight);
        let t0 = Instant::now();
        for _ in 0..100 {
            assert_eq!(night.reserve(1 << 20, t0), t0, "no limit: no wait");
        }
        let day = RateLimit::with_clock(schedule, 1 << 20, eight);
        assert_eq!(day.reserve(1_000_000, t0), t0);
        assert_eq!(day.reserve(1_000, t0), t0 + Duration::from_secs(1));
        // The night's rate held only until the next step: a second later, it looks again.
        let later = t0 + Duration::from_secs(1);
        assert_eq!(night.timeline.lock().unwrap().until, Some(later));
    }

    #[test]
    fn a_timetable_out_of_order_or_past_midnight_is_refused() {
        let step = |from, rate| RateStep {
            from,
            bytes_per_second: rate,
        };
        let e = RateSchedule::daily(vec![step(600, None), step(60, Some(5))]).unwrap_err();
        assert!(e.contains("in order"), "{e}");
        assert!(RateSchedule::daily(vec![step(DAY, None)]).is_err());
        assert!(RateSchedule::daily(vec![step(0, Some(0))]).is_err());
        let one = RateSchedule::daily(vec![step(3600, Some(5))]).unwrap();
        assert_eq!(one.at(0), (Some(5), 3600), "its only step holds all day");
    }
}
