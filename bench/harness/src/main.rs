//! `xfer-harness`: tools the benchmark harness in `bench/` runs beside xfer, kept out of the
//! product binary: the emulated WAN's delay line (`bench/xfer_bench/wan.py`) and a probe of how
//! fast one core computes xfer's checksums (`bench/xfer_bench/files.py`).

mod checksum_rate;
mod delay_line;
mod sys;

use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use optimizer::{parse_time, Timetable, TimetableError};

/// Tools of xfer's benchmark harness.
#[derive(Debug, Parser)]
#[command(name = "xfer-harness", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The tools.
#[derive(Debug, Subcommand)]
enum Command {
    /// Delay packets between TUN devices: the propagation delay of the emulated WAN.
    DelayLine(DelayLineArgs),
    /// Measure how fast one core computes the checksums a transfer uses (xxh3 of every chunk,
    /// BLAKE3 of every file with --verify), to compare with the link's rate.
    ChecksumRate(ChecksumRateArgs),
}

/// `xfer-harness checksum-rate`.
#[derive(Debug, Args)]
pub struct ChecksumRateArgs {
    /// Bytes hashed in each measurement, in MiB (of generated data in memory).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=16384))]
    pub mib: u32,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `xfer-harness delay-line`.
#[derive(Debug, Args)]
#[command(
    after_help = "Example (the harness in bench/ sets up the namespaces, devices and routes):\n  xfer-harness delay-line --link rcv/dlr=snd/dls --delay 50ms --cpu 0 --realtime"
)]
pub struct DelayLineArgs {
    /// Packets entering the first TUN device come out of the second after the delay, in order:
    /// NETNS/DEV=NETNS/DEV (namespaces as made by `ip netns add`). Repeat for more links.
    #[arg(long, required = true, value_name = "NETNS/DEV=NETNS/DEV")]
    pub link: Vec<String>,
    /// Delay added to every packet.
    #[arg(long, default_value = "0ms", value_parser = parse_delay)]
    pub delay: Duration,
    /// Delay changing over time instead, e.g. "0s:50ms,60s:100ms" (times since the start, or
    /// since the last SIGUSR1: the harness sends one when the transfer it measures starts).
    #[arg(long, value_parser = parse_delay_schedule, conflicts_with = "delay")]
    pub schedule: Option<Timetable<Duration>>,
    /// Pin the delay line to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Ask for real-time FIFO scheduling (needs root; a warning when refused).
    #[arg(long)]
    pub realtime: bool,
    /// Packets each link can hold at once; more are dropped and counted.
    #[arg(long, default_value_t = 65536, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub capacity: u32,
}

fn parse_delay(s: &str) -> Result<Duration, String> {
    parse_time(s).ok_or_else(|| format!("{s:?} is not a delay like 50ms or 0.2s"))
}

fn parse_delay_schedule(s: &str) -> Result<Timetable<Duration>, TimetableError> {
    Timetable::parse(s, "delay schedule", "0s:50ms,60s:100ms", parse_delay)
}

fn main() {
    let result = match Cli::parse().command {
        Command::DelayLine(args) => delay_line::run(args),
        Command::ChecksumRate(args) => checksum_rate::run(args),
    };
    if let Err(e) = result {
        eprintln!("xfer-harness: error: {e:#}");
        std::process::exit(1);
    }
}
