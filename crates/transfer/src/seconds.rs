//! Times in settings files, given as a number of seconds (`interval_secs = 0.5`).

use std::time::Duration;

/// `value` seconds as a duration; the error names the setting `name`. Negative, infinite and
/// NaN values are refused, and zero unless `zero` allows it.
pub(crate) fn seconds(name: &str, value: f64, zero: bool) -> Result<Duration, String> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| zero || !d.is_zero())
        .ok_or_else(|| {
            format!(
                "{name} must be a {} number of seconds, not {value}",
                if zero { "non-negative" } else { "positive" }
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_checked() {
        assert_eq!(seconds("t", 0.5, false), Ok(Duration::from_millis(500)));
        assert_eq!(seconds("t", 0.0, true), Ok(Duration::ZERO));
        for (value, zero) in [
            (0.0, false),
            (-1.0, true),
            (f64::NAN, true),
            (f64::INFINITY, true),
        ] {
            let err = seconds("grace_secs", value, zero).unwrap_err();
            assert!(err.starts_with("grace_secs must be a"), "{err}");
        }
    }
}
