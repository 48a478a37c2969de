//! The harness's tools, run as the harness runs them.

use std::process::{Command, Output};

fn harness() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xfer-harness"))
}

/// The stdout of a run that succeeded.
fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `xfer-harness checksum-rate` measures the two checksums of a transfer on one core.

#[test]
fn checksum_rates_are_measured_and_xxh3_is_the_faster() {
    let out = harness()
        .args(["checksum-rate", "--json", "--mib", "16"])
        .output()
        .unwrap();
    let lines: Vec<serde_json::Value> = ok(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
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
    let text = ok(harness()
        .args(["checksum-rate", "--mib", "4"])
        .output()
        .unwrap());
    assert!(
        text.contains("with xxh3") && text.contains("with BLAKE3"),
        "{text}"
    );
    let refused = harness()
        .args(["checksum-rate", "--mib", "0"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
}

/// A delay line's arguments are checked before it touches a device: a bad schedule names the
/// step at fault, a link that is not NETNS/DEV=NETNS/DEV is refused.
#[test]
fn a_delay_line_refuses_bad_arguments_with_the_reason() {
    for (args, reason) in [
        (
            &["--link", "a/b=c/d", "--schedule", "0s:10ms,5s:fast"][..],
            "\"fast\" is not a delay",
        ),
        (
            &["--link", "a/b=c/d", "--schedule", "1s:10ms"],
            "the first step is not at 0s",
        ),
        (&["--link", "a/b"], "is not NETNS/DEV=NETNS/DEV"),
        (&["--link", "a/b=c/d", "--cpu", "100000"], "beyond the CPUs"),
    ] {
        let out = harness().arg("delay-line").args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr.contains(reason), "{args:?}: {stderr}");
    }
}
