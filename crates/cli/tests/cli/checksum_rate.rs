//! `xfer checksum-rate` measures the two checksums of a transfer on one core.

use crate::common::*;

#[test]
fn checksum_rates_are_measured_and_xxh3_is_the_faster() {
    let out = xfer()
        .args(["checksum-rate", "--json", "--mib", "16"])
        .output()
        .unwrap();
    let lines = json_lines(&ok(out));
    let [rates] = &lines[..] else {
        panic!("one JSON line expected: {lines:?}");
    };
    assert_eq!(rates["type"], "checksum_rate");
    assert_eq!(rates["bytes"], 16 << 20);
    let (xxh3, blake3) = (
        rates["xxh3_gbit_per_s"].as_f64().unwrap(),
        rates["blake3_gbit_per_s"].as_f64().unwrap(),
    );
    assert!(blake3 > 0.0 && blake3.is_finite(), "{rates}");
    // xxh3 checks every chunk because it is several times faster than BLAKE3.
    assert!(xxh3 > blake3, "{rates}");
    let text = ok(xfer()
        .args(["checksum-rate", "--mib", "4"])
        .output()
        .unwrap());
    assert!(
        text.contains("with xxh3") && text.contains("with BLAKE3"),
        "{text}"
    );
    let refused = xfer()
        .args(["checksum-rate", "--mib", "0"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
}
