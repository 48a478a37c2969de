//! `xfer send`: a transfer run as the library's [`SendJob`], shown as a live progress bar or
//! per-second JSON, and a summary.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use transfer::auth::SessionKey;
use transfer::job::{SendEvent, SendJob, SenderSettings};
use transfer::mptcp_info::Subflow;
use transfer::optimizer::ControllerSpec;
use transfer::optimizer_choice::OptimizerChoice;
use transfer::quic::Congestion;
use transfer::sender::{
    MiRecord, Progress, SendOptions, SendSource, StreamSample, Summary, DEFAULT_STREAMS,
};
use transfer::tcp_info::TcpInfo;
use transfer::transport::Transport;

use crate::args::{parse_destination, Destination, SendArgs};
use crate::controllers;
use crate::ssh_start::SshStart;

/// How often the progress bar is updated.
const TICK: Duration = Duration::from_millis(200);
/// How often a JSON progress object is printed.
const REPORT_EVERY: Duration = Duration::from_secs(1);

/// One per-second JSON report.
#[derive(Serialize)]
struct ProgressReport<'a> {
    r#type: &'static str,
    t: f64,
    bytes_acked: u64,
    bytes_total: u64,
    bytes_skipped: u64,
    gbit_per_s: f64,
    files_done: u64,
    files_total: u64,
    streams: usize,
    streams_target: usize,
    tcp: &'a [StreamReport],
}

/// One stream's counters in a report.
#[derive(Serialize)]
struct StreamReport {
    stream: u64,
    retiring: bool,
    #[serde(flatten)]
    tcp: TcpInfo,
    /// An MPTCP stream's subflows.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    subflows: Vec<Subflow>,
}

/// The final JSON summary.
#[derive(Serialize)]
struct SummaryReport<'a> {
    r#type: &'static str,
    bytes: u64,
    bytes_skipped: u64,
    files: u64,
    seconds: f64,
    gbit_per_s: f64,
    streams_timeline: &'a [(f64, usize)],
    retransmits: u64,
    transport: Transport,
    /// The sender's peak resident memory.
    peak_rss_bytes: u64,
}

/// Runs `xfer send`.
pub fn run(args: SendArgs) -> anyhow::Result<()> {
    let (sources, destination) = match args.args.split_last() {
        Some((dest, sources)) => (sources, parse_destination(dest)?),
        None => bail!("missing destination HOST:PORT[:DEST] or [USER@]HOST:DIR"),
    };
    // Over ssh, the receiver's root is the directory named, so files land directly in it.
    let (receiver, named_dir, dest) = match destination {
        Destination::Direct { addr, dest } => (Receiver::Running(addr), dest.clone(), dest),
        Destination::Ssh { target, dir } => {
            if args.key_file.is_some() {
                bail!("--key-file is for a running receiver; one started over ssh sends its key back over the ssh channel");
            }
            let start = SshStart {
                ssh_command: args.ssh_command.clone(),
                target,
                dir: dir.clone(),
                remote_xfer: args.remote_xfer.clone(),
                transport: args.transport,
                direct_io: args.direct_io,
            };
            (Receiver::OverSsh(start), dir, String::new())
        }
    };
    let source = match args.mem {
        Some(size) => {
            if !sources.is_empty() {
                bail!(
                    "--mem sends generated data; do not also name files ({})",
                    sources.join(", ")
                );
            }
            if !named_dir.is_empty() {
                bail!("--mem sends to a discarding sink; a destination directory makes no sense");
            }
            SendSource::Memory { size }
        }
        None => {
            if sources.is_empty() {
                bail!("nothing to send: name files or directories before the destination, or use --mem SIZE");
            }
            SendSource::Paths {
                paths: sources.iter().map(PathBuf::from).collect(),
                destination: dest.into(),
            }
        }
    };
    // Without --optimizer, --streams N keeps N streams: the controller that does so is
    // fixed:N, whose count the user named and so is its own limit.
    let mut tuning = args.tuning.tuning();
    let optimizer = match (args.optimizer.clone(), args.streams) {
        (Some(choice), _) => choice,
        (None, Some(n)) => {
            tuning.max_streams = tuning.max_streams.max(n);
            OptimizerChoice::Builtin(ControllerSpec::Fixed(n as usize))
        }
        (None, None) => controllers::announced_default_optimizer(&args.tuning, args.quiet)?,
    };
    // A controller that names its count starts at it (the job sees to that).
    let initial = args.streams.map_or(DEFAULT_STREAMS, |n| n as usize);
    // Checked before anything starts (a receiver over ssh included), as the job checks them
    // again: tuning that cannot work stops nothing.
    tuning.utility_for(&[&optimizer])?;
    tuning.reward()?;
    let mut mi_log = match &args.mi_log {
        Some(path) => Some(std::io::BufWriter::new(
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => None,
    };
    let congestion = match (args.congestion, args.transport) {
        (Some(c), Transport::Quic) => c,
        (Some(_), _) => bail!(
            "--congestion chooses QUIC's controller (with --transport quic); TCP and MPTCP use \
             the kernel's (sysctl net.ipv4.tcp_congestion_control)"
        ),
        (None, _) => Congestion::default(),
    };
    let stream_rate_cap = match args.stream_rate_cap {
        Some(mbit) if mbit.is_finite() && mbit > 0.0 => Some((mbit * 1e6 / 8.0) as u64),
        Some(mbit) => bail!("--stream-rate-cap must be a positive number of Mbit/s, not {mbit}"),
        None => None,
    };
    let options = SendOptions::default()
        .streams(initial)
        .unit_size(args.unit_size)
        .verify(args.verify)
        .checksum(args.checksum)
        .direct_io(args.direct_io)
        .stream_rate_cap(stream_rate_cap)
        .unsent_limit(args.unsent_limit)
        .encrypt(args.encrypt)
        .integrity(args.integrity)
        .stall_timeout(args.stall_timeout)
        .transport(args.transport)
        .congestion(congestion);
    options.check()?;
    let (addr, key, remote) = match receiver {
        Receiver::Running(addr) => (addr, session_key(&args)?, None),
        Receiver::OverSsh(start) => {
            let remote = start.start()?;
            (remote.addr.to_string(), remote.key.clone(), Some(remote))
        }
    };
    if let Some(addr) = args.metrics {
        crate::metrics_endpoint::serve(addr)?;
    }
    let mut settings = SenderSettings::new(addr, key, source);
    settings.optimizer = Some(optimizer);
    settings.tuning = tuning;
    settings.seed = args.seed;
    settings.options = options;
    // The bar moves smoothly; JSON reports once a second.
    settings.progress_every = if args.json { REPORT_EVERY } else { TICK };
    let mut job = SendJob::start(settings)?;

    let mut bar = None;
    let mut stdout = std::io::stdout().lock();
    let mut latest = Progress::default();
    let mut last_report = (Duration::ZERO, 0u64);
    while let Some(event) = job.next_event_blocking() {
        match event {
            SendEvent::Started { .. } => bar = progress_bar(&args),
            SendEvent::Notice(notice) => warn(&notice, bar.as_ref(), args.quiet),
            SendEvent::Progress(progress) => {
                latest = progress;
                if let Some(bar) = &bar {
                    bar.set_length(progress.bytes_total);
                    bar.set_position(progress.bytes_acked);
                    bar.set_message(format!(
                        "files {}/{}  streams {}",
                        progress.files_done, progress.files_total, progress.streams_active
                    ));
                }
            }
            SendEvent::Streams(streams) if args.json => {
                let rate = rate_since(last_report, &latest);
                last_report = (latest.elapsed, latest.bytes_acked);
                print_progress(&mut stdout, &latest, rate, streams)?;
            }
            SendEvent::Decision(record) => {
                if let Some(out) = &mut mi_log {
                    write_mi_record(out, &record)?;
                }
            }
            SendEvent::Finished(_) => break,
            _ => {}
        }
    }
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let summary = job.wait()?;
    if let Some(remote) = remote {
        remote.finish()?;
    }
    print_summary(&args, &summary, &mut stdout).context("writing the summary")
}

/// The receiver a transfer goes to.
enum Receiver {
    /// One already running at `HOST:PORT`; the key comes from the user.
    Running(String),
    /// One to start over ssh for this transfer.
    OverSsh(SshStart),
}

/// Prints a notice (a source left out, why MPTCP was not used) above the progress bar, unless
/// `quiet`.
fn warn(notice: &str, bar: Option<&ProgressBar>, quiet: bool) {
    if quiet {
        return;
    }
    let print = || eprintln!("xfer: warning: {notice}");
    match bar {
        Some(bar) => bar.suspend(print),
        None => print(),
    }
}

/// Appends an MI record as a JSON line and flushes, so a killed transfer leaves a usable log.
fn write_mi_record(out: &mut impl Write, record: &MiRecord) -> anyhow::Result<()> {
    serde_json::to_writer(&mut *out, record)?;
    writeln!(out)?;
    out.flush().context("writing the MI log")
}

/// Prints one JSON progress report: `progress` with the transfer's rate since the previous
/// report, and each stream's counters.
fn print_progress(
    out: &mut impl Write,
    progress: &Progress,
    gbit_per_s: f64,
    streams: Vec<StreamSample>,
) -> anyhow::Result<()> {
    let tcp: Vec<_> = streams
        .into_iter()
        .map(
            |StreamSample {
                 stream,
                 retiring,
                 tcp,
                 subflows,
             }| StreamReport {
                stream,
                retiring,
                tcp,
                subflows,
            },
        )
        .collect();
    let report = ProgressReport {
        r#type: "progress",
        t: progress.elapsed.as_secs_f64(),
        bytes_acked: progress.bytes_acked,
        bytes_total: progress.bytes_total,
        bytes_skipped: progress.bytes_skipped,
        gbit_per_s,
        files_done: progress.files_done,
        files_total: progress.files_total,
        streams: progress.streams_active,
        streams_target: progress.streams_target,
        tcp: &tcp,
    };
    serde_json::to_writer(&mut *out, &report)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}

fn rate_since((t0, b0): (Duration, u64), now: &Progress) -> f64 {
    let dt = now.elapsed.saturating_sub(t0).as_secs_f64();
    if dt > 0.0 {
        (now.bytes_acked - b0) as f64 * 8.0 / dt / 1e9
    } else {
        0.0
    }
}

fn progress_bar(args: &SendArgs) -> Option<ProgressBar> {
    if args.quiet || args.json {
        return None;
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}  {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(250));
    Some(bar)
}

fn print_summary(args: &SendArgs, summary: &Summary, out: &mut impl Write) -> std::io::Result<()> {
    if args.json {
        let report = SummaryReport {
            r#type: "summary",
            bytes: summary.bytes,
            bytes_skipped: summary.bytes_skipped,
            files: summary.files,
            seconds: summary.seconds,
            gbit_per_s: summary.gbit_per_s(),
            streams_timeline: &summary.streams_timeline,
            retransmits: summary.retransmits,
            transport: summary.transport,
            peak_rss_bytes: crate::peak_rss_bytes(),
        };
        serde_json::to_writer(&mut *out, &report)?;
        writeln!(out)?;
    } else if !args.quiet {
        let max_streams = summary
            .streams_timeline
            .iter()
            .map(|&(_, n)| n)
            .max()
            .unwrap_or(0);
        writeln!(
            out,
            "sent {} in {:.2} s: {:.2} Gbit/s mean, {} file{}, up to {} streams, {} retransmits{}",
            indicatif::BinaryBytes(summary.bytes),
            summary.seconds,
            summary.gbit_per_s(),
            summary.files,
            if summary.files == 1 { "" } else { "s" },
            max_streams,
            summary.retransmits,
            if summary.bytes_skipped > 0 {
                format!(
                    ", {} already at the receiver",
                    indicatif::BinaryBytes(summary.bytes_skipped)
                )
            } else {
                String::new()
            }
        )?;
    }
    out.flush()
}

/// The receiver's key: from `--key-file`, else `XFER_KEY`, else asked on the terminal. A key
/// given on the command line is refused, as every user of the machine could read it in `ps`.
fn session_key(args: &SendArgs) -> anyhow::Result<SessionKey> {
    if args.key.is_some() {
        bail!(
            "--key is not accepted: a key on the command line can be read by every user of this \
             machine; set XFER_KEY, use --key-file FILE (mode 600), or leave both out to be asked"
        );
    }
    if let Some(path) = &args.key_file {
        return Ok(SessionKey::from_file(path)?);
    }
    if let Some(text) = std::env::var_os("XFER_KEY") {
        let text = text
            .into_string()
            .map_err(|_| anyhow::anyhow!("XFER_KEY is not valid UTF-8"))?;
        return Ok(SessionKey::from_text(&text)?);
    }
    if std::io::stdin().is_terminal() {
        let text = rpassword::prompt_password("xfer: session key (printed by `xfer recv`): ")
            .context("reading the session key from the terminal")?;
        return Ok(SessionKey::from_text(&text)?);
    }
    bail!(
        "no session key: set XFER_KEY, pass --key-file FILE, or run in a terminal to be asked \
         for the key `xfer recv` printed"
    )
}
