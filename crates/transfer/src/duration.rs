//! Times in settings files, written as on the command line: `stall_timeout = "2m"`,
//! `interval = "500ms"`, `"1.5s"`, or a bare number of seconds (`interval = 0.5`). Read by the
//! one reader of times, [`optimizer::parse_time`]; written back by [`optimizer::format_time`].
//! Used as `#[serde(with = "crate::duration")]`.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};

/// Writes `time` as `"1.5s"`.
pub(crate) fn serialize<S: Serializer>(time: &Duration, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_str(&optimizer::format_time(*time))
}

/// Reads a time written as text (`"500ms"`) or as a number of seconds.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(input: D) -> Result<Duration, D::Error> {
    input.deserialize_any(TimeVisitor)
}

/// What a time may be written as, for serde.
struct TimeVisitor;

impl Visitor<'_> for TimeVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a time like \"500ms\", \"1.5s\", \"2m\" or a number of seconds")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
        optimizer::parse_time(text)
            .ok_or_else(|| E::invalid_value(de::Unexpected::Str(text), &self))
    }

    fn visit_f64<E: de::Error>(self, secs: f64) -> Result<Duration, E> {
        Duration::try_from_secs_f64(secs)
            .map_err(|_| E::invalid_value(de::Unexpected::Float(secs), &self))
    }

    fn visit_u64<E: de::Error>(self, secs: u64) -> Result<Duration, E> {
        Ok(Duration::from_secs(secs))
    }

    fn visit_i64<E: de::Error>(self, secs: i64) -> Result<Duration, E> {
        u64::try_from(secs)
            .map(Duration::from_secs)
            .map_err(|_| E::invalid_value(de::Unexpected::Signed(secs), &self))
    }
}

/// `time`, refused with a message naming the setting `name` when it is zero.
pub(crate) fn positive(name: &str, time: Duration) -> Result<Duration, String> {
    if time.is_zero() {
        Err(format!("{name} must be longer than zero"))
    } else {
        Ok(time)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Timed {
        #[serde(with = "super")]
        every: Duration,
    }

    fn read(text: &str) -> Result<Duration, String> {
        toml::from_str::<Timed>(text)
            .map(|t| t.every)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn times_read_as_text_or_seconds_and_write_back() {
        assert_eq!(read(r#"every = "500ms""#), Ok(Duration::from_millis(500)));
        assert_eq!(read(r#"every = "2m""#), Ok(Duration::from_secs(120)));
        assert_eq!(read("every = 0.25"), Ok(Duration::from_millis(250)));
        assert_eq!(read("every = 3"), Ok(Duration::from_secs(3)));
        let timed = Timed {
            every: Duration::from_millis(10_601),
        };
        let text = toml::to_string(&timed).unwrap();
        assert_eq!(text.trim(), r#"every = "10.601s""#);
        assert_eq!(toml::from_str::<Timed>(&text).unwrap(), timed);
    }

    #[test]
    fn bad_times_are_refused_with_what_was_expected() {
        for bad in [
            r#"every = "soon""#,
            "every = -1",
            "every = -0.5",
            r#"every = "-2s""#,
        ] {
            let e = read(bad).unwrap_err();
            assert!(e.contains(r#"a time like "500ms""#), "{bad}: {e}");
        }
        assert_eq!(
            super::positive("interval", Duration::ZERO),
            Err("interval must be longer than zero".into())
        );
    }
}
