//! `xfer-harness checksum-rate`: how fast one core computes the checksums of a transfer, the
//! xxh3 of every chunk (on both sides, always) and the BLAKE3 of every whole file (on both sides, with
//! `--verify`), so that a user can see whether checksumming could limit a link: each side
//! hashes on its streams' threads, one chunk per stream at a time, and a file's BLAKE3 on one
//! thread.

use std::hint::black_box;
use std::io::Write;
use std::time::{Duration, Instant};

use serde::Serialize;
use transfer::wire::chunk_checksum;

use crate::ChecksumRateArgs;

/// Chunk size of the xxh3 measurement: xfer's default unit.
const CHUNK: usize = 4 << 20;
/// Measurements of each checksum; the fastest counts (the others met other work on the core).
const ROUNDS: u32 = 3;

/// The measured rates, in Gbit/s of data hashed on one core.
#[derive(Debug, Serialize)]
struct Rates {
    r#type: &'static str,
    xxh3_gbit_per_s: f64,
    blake3_gbit_per_s: f64,
    bytes: usize,
}

/// Runs `xfer-harness checksum-rate`.
pub fn run(args: ChecksumRateArgs) -> anyhow::Result<()> {
    let mut data = vec![0u8; (args.mib as usize) << 20];
    blake3::Hasher::new_derive_key("xfer checksum-rate")
        .finalize_xof()
        .fill(&mut data);
    let rates = Rates {
        r#type: "checksum_rate",
        xxh3_gbit_per_s: gbit_per_s(
            data.len(),
            fastest(|| {
                for chunk in data.chunks(CHUNK) {
                    black_box(chunk_checksum(chunk));
                }
            }),
        ),
        blake3_gbit_per_s: gbit_per_s(
            data.len(),
            fastest(|| {
                black_box(blake3::Hasher::new().update(&data).finalize());
            }),
        ),
        bytes: data.len(),
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut out, &rates)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "one core hashes {:.1} Gbit/s with xxh3 (every chunk) and {:.1} Gbit/s with BLAKE3 \
             (every file, with --verify)",
            rates.xxh3_gbit_per_s, rates.blake3_gbit_per_s
        )?;
    }
    Ok(())
}

/// The shortest of [`ROUNDS`] runs of `work`.
fn fastest(mut work: impl FnMut()) -> Duration {
    (0..ROUNDS)
        .map(|_| {
            let started = Instant::now();
            work();
            started.elapsed()
        })
        .min()
        .expect("at least one round")
}

fn gbit_per_s(bytes: usize, took: Duration) -> f64 {
    bytes as f64 * 8.0 / took.as_secs_f64().max(1e-9) / 1e9
}
