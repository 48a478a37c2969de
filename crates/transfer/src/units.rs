//! How sizes and rates read wherever xfer takes them (command line, configuration files): the
//! one reader of each, so that `10GB` means 10^9 bytes and `300Mbit` 37.5 MB/s everywhere.

/// A size as GNU coreutils reads one: `GB` is 10^9 bytes, `GiB` 2^30, and a lone letter
/// (`G`) binary too, as in `dd` and `sort -S`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let unit = s.trim_start_matches(|c: char| c.is_ascii_digit() || matches!(c, '.' | '_' | ' '));
    let config = match unit.len() {
        1 => parse_size::Config::new().with_binary(),
        _ => parse_size::Config::new(),
    };
    config.parse_size(s).map_err(|e| {
        format!("{s:?} is not a size ({e}); examples: 10GiB or 10G (2^30 bytes each), 10GB (10^9), 4096")
    })
}

/// A rate in bytes per second, from bits (`300Mbit`, `10Gbit/s`: decimal prefixes, as links
/// are rated) or bytes per second (`50MB/s`, `40MiB/s`, read as sizes are). A bare number, or
/// one with a prefix alone (`300M`, which iperf3 reads as bits and a size as bytes), is
/// refused: bits or bytes is too easy to get wrong by a factor of 8.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let bad = |why: String| {
        format!("{s:?} is not a rate ({why}); examples: 300Mbit, 10Gbit/s, 50MB/s, 40MiB/s")
    };
    let text = s.trim();
    let text = text.strip_suffix("/s").unwrap_or(text);
    let rate = if let Some(bits) = text.strip_suffix("bit") {
        let bits = bits.trim();
        let digits = (bits.find(|c: char| !(c.is_ascii_digit() || c == '.'))).unwrap_or(bits.len());
        let (number, prefix) = (&bits[..digits], bits[digits..].trim());
        let scale = match prefix {
            "" => 1.0,
            "K" | "k" => 1e3,
            "M" => 1e6,
            "G" => 1e9,
            "T" => 1e12,
            other => return Err(bad(format!("{other:?} is no prefix of bits: K, M, G or T"))),
        };
        let number: f64 = number
            .parse()
            .map_err(|_| bad(format!("{number:?} is not a number")))?;
        number * scale / 8.0
    } else if text.ends_with('B') {
        parse_size(text).map_err(|_| bad("a size per second, or bits".into()))? as f64
    } else {
        return Err(bad("say bits or bytes per second".into()));
    };
    if !(rate.is_finite() && rate >= 1.0) {
        return Err(bad("it must be at least 8 bit/s".into()));
    }
    Ok(rate as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_decimal_units_as_decimal() {
        let size = |s| parse_size(s).unwrap();
        assert_eq!(size("10GB"), 10_000_000_000);
        assert_eq!(size("10GiB"), 10 << 30);
        assert_eq!(size("10G"), 10 << 30);
        assert_eq!(size("512M"), 512 << 20);
        assert_eq!(size("512MB"), 512_000_000);
        assert_eq!(size("1.5KiB"), 1536);
        assert_eq!(size("100TiB"), 100 << 40);
        assert_eq!(size("4096"), 4096);
        let err = parse_size("10 gigs").unwrap_err();
        assert!(err.contains("10GB (10^9)"), "{err}");
    }

    #[test]
    fn rates_read_as_bits_with_decimal_prefixes_or_as_sizes_per_second() {
        let rate = |s| parse_rate(s).unwrap();
        assert_eq!(rate("300Mbit"), 37_500_000);
        assert_eq!(rate("10Gbit/s"), 1_250_000_000);
        assert_eq!(rate("1.5 Gbit"), 187_500_000);
        assert_eq!(rate("800kbit"), 100_000);
        assert_eq!(rate("50MB/s"), 50_000_000);
        assert_eq!(rate("40MiB/s"), 40 << 20);
        for bad in ["300", "300M", "fast", "0Mbit", "3Xbit", "Mbit"] {
            let err = parse_rate(bad).unwrap_err();
            assert!(err.contains("examples: 300Mbit"), "{bad}: {err}");
        }
    }
}
