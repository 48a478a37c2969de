//! `xfer send`: a transfer run as the library's [`SendJob`], shown as a live progress bar or
//! per-second JSON, and a summary.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use transfer::auth::SessionKey;
use transfer::filter::Filter;
use transfer::job::{SendEvent, SendJob, SenderSettings};
use transfer::mptcp_info::Subflow;
use transfer::optimizer::ControllerSpec;
use transfer::optimizer_choice::OptimizerChoice;
use transfer::quic::Congestion;
use transfer::sender::{
    MiRecord, Preview, PreviewAction, PreviewFile, Progress, SendOptions, SendSource, StreamSample,
    Summary, DEFAULT_STREAMS,
};
use transfer::tcp_info::TcpInfo;
use transfer::transport::Transport;

use crate::args::{parse_destination, Destination, SendArgs};
use crate::controllers;
use crate::signals::{self, Signal};
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
    /// Every file was verified end to end (`--verify`), those already at the receiver too.
    verified: bool,
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
                dry_run: args.dry_run,
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
        .filter(filter(&args)?)
        .streams(initial)
        .unit_size(args.unit_size)
        .verify(args.verify)
        .checksum(args.checksum)
        .direct_io(args.direct_io)
        .stream_rate_cap(stream_rate_cap)
        .rate_limit(args.rate_limit.clone())
        .unsent_limit(args.unsent_limit)
        .encrypt(args.encrypt)
        .integrity(args.integrity)
        .stall_timeout(args.stall_timeout)
        .transport(args.transport)
        .congestion(congestion);
    options.check()?;
    let mut source = source;
    let (addr, key, remote) = match receiver {
        Receiver::Running(addr) => (addr, session_key(&args)?, None),
        Receiver::OverSsh(start) => {
            let remote = start.start()?;
            if let SendSource::Paths { destination, .. } = &mut source {
                *destination = remote.dest.clone().into();
            }
            (remote.addr.to_string(), remote.key.clone(), Some(remote))
        }
    };
    if args.dry_run {
        let seen = transfer::sender::preview(&addr, key, source, options)?;
        if let Some(remote) = remote {
            remote.finish()?;
        }
        return print_preview(&args, &seen, &mut std::io::stdout().lock())
            .context("writing the dry run");
    }
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
    let resumable = matches!(settings.source, SendSource::Paths { .. });
    let mut job = SendJob::start(settings)?;
    let interrupted = cancel_on_signals(&job)?;

    let mut bar = None;
    let mut stdout = std::io::stdout().lock();
    let mut latest = Progress::default();
    let mut last_report = (Duration::ZERO, 0u64);
    while let Some(event) = job.next_event_blocking() {
        match event {
            SendEvent::Started { .. } => bar = Bar::new(&args),
            SendEvent::Notice(notice) if !args.quiet => {
                above_bar(bar.as_ref(), &format!("xfer: warning: {notice}"));
            }
            SendEvent::Progress(progress) => {
                latest = progress;
                if let Some(bar) = &mut bar {
                    bar.show(&progress);
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
                if args.verbose {
                    above_bar(bar.as_ref(), &interval_line(&record));
                }
            }
            SendEvent::Finished(_) => break,
            _ => {}
        }
    }
    if let Some(bar) = &bar {
        bar.bar.finish_and_clear();
    }
    let result = job.wait();
    // A transfer the signal stopped says so (the error the cancel gave, or one of a receiver
    // over ssh that the same Ctrl-C ended); one that finished before it did is reported as any.
    if let (Some(&signal), Err(_)) = (interrupted.get(), &result) {
        return Err(Interrupted {
            signal,
            sent: latest.bytes_acked,
            total: latest.bytes_total,
            resumable,
        }
        .into());
    }
    let summary = result?;
    if let Some(remote) = remote {
        remote.finish()?;
    }
    print_summary(&args, &summary, &mut stdout).context("writing the summary")
}

/// The filter `--include`, `--exclude` and `--files-from` describe.
fn filter(args: &SendArgs) -> anyhow::Result<Filter> {
    let mut filter = Filter::default();
    filter.rules = args.rules.clone();
    if let Some(list) = &args.files_from {
        filter = filter.files_from(read_files_from(list)?);
    }
    Ok(filter)
}

/// The paths of a `--files-from` list (`-`: stdin): NUL-separated when it holds a NUL, else
/// one per line, blank lines and lines starting with `#` or `;` left out, as rsync reads it.
fn read_files_from(list: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let bytes = if list == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut bytes)
            .context("reading the list of files from stdin")?;
        bytes
    } else {
        std::fs::read(list)
            .with_context(|| format!("reading the list of files {}", list.display()))?
    };
    let nul = bytes.contains(&0);
    let lines = bytes.split(|&b| b == if nul { 0 } else { b'\n' });
    Ok(lines
        .map(|line| {
            if nul {
                line
            } else {
                line.strip_suffix(b"\r").unwrap_or(line)
            }
        })
        .filter(|line| !line.is_empty() && (nul || !matches!(line[0], b'#' | b';')))
        .map(|line| PathBuf::from(std::ffi::OsStr::from_bytes(line)))
        .collect())
}

/// A transfer stopped by SIGINT (Ctrl-C) or SIGTERM: how far it got, and how to go on.
#[derive(Debug)]
pub struct Interrupted {
    /// The signal that stopped it.
    pub signal: Signal,
    /// Bytes the receiver had acknowledged as the transfer stopped.
    sent: u64,
    /// Bytes of the whole transfer.
    total: u64,
    /// Files are sent (what the receiver verified is kept), not generated data.
    resumable: bool,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stopped by {} after sending {} of {}",
            self.signal,
            indicatif::BinaryBytes(self.sent),
            indicatif::BinaryBytes(self.total)
        )?;
        if self.resumable {
            f.write_str("; the receiver keeps what it verified: run the same command again to send the rest")?;
        }
        Ok(())
    }
}

impl std::error::Error for Interrupted {}

/// From now on, the first SIGINT or SIGTERM cancels `job`; the next ends xfer at once. The
/// signal that cancelled it, once one has.
fn cancel_on_signals(job: &SendJob) -> anyhow::Result<Arc<OnceLock<Signal>>> {
    let interrupted = Arc::new(OnceLock::new());
    let (canceller, first) = (job.canceller(), interrupted.clone());
    signals::on_stop_signals(move |signal| {
        if first.set(signal).is_ok() {
            canceller.cancel();
        } else {
            eprintln!("xfer: {signal} again: stopping at once");
            std::process::exit(signal.exit_code());
        }
    })?;
    Ok(interrupted)
}

/// The receiver a transfer goes to.
enum Receiver {
    /// One already running at `HOST:PORT`; the key comes from the user.
    Running(String),
    /// One to start over ssh for this transfer.
    OverSsh(SshStart),
}

/// Prints `line` on stderr, above the progress bar if there is one.
fn above_bar(bar: Option<&Bar>, line: &str) {
    let print = || eprintln!("{line}");
    match bar {
        Some(bar) => bar.bar.suspend(print),
        None => print(),
    }
}

/// One monitoring interval as `--verbose` prints it: when it ended, its streams, rate, loss,
/// RTT (and over the smallest seen), utility, and what was chosen from it, by whom and why
/// control changed hands if it did.
fn interval_line(record: &MiRecord) -> String {
    let o = &record.observation;
    let chosen = match (record.decision, &record.acting) {
        (None, _) => "no decision".to_string(),
        (Some(n), None) => format!("-> {n} ({})", record.controller),
        (Some(n), Some(acting)) => match &acting.switch {
            Some(why) => format!("-> {n} ({}: {why})", acting.controller),
            None => format!("-> {n} ({})", acting.controller),
        },
    };
    format!(
        "{:7.1} s {:4} streams {:8.3} Gbit/s  loss {:.3} %  RTT {:.2} ms (x{:.2})  utility {:.3} Gbit/s  {chosen}",
        o.time,
        o.streams,
        o.throughput / 1e9,
        o.loss * 100.0,
        o.rtt * 1e3,
        o.rtt_ratio,
        o.utility / 1e9,
    )
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

/// What a transfer is doing, as the progress bar shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing acknowledged yet: streams connecting, the first chunks on their way (no rate,
    /// so no time left to show).
    Starting,
    /// Data moving.
    Sending,
    /// Every byte acknowledged: the receiver is verifying the last files and putting them in
    /// place.
    Finishing,
}

impl Phase {
    fn of(p: &Progress) -> Phase {
        if p.bytes_acked >= p.bytes_total && p.files_total > 0 {
            Phase::Finishing
        } else if p.bytes_acked == 0 {
            Phase::Starting
        } else {
            Phase::Sending
        }
    }
}

/// The progress bar, whose look follows the phase.
struct Bar {
    bar: ProgressBar,
    phase: Option<Phase>,
    verify: bool,
}

impl Bar {
    /// The bar of a transfer that has started; none with `--quiet` or `--json`.
    fn new(args: &SendArgs) -> Option<Bar> {
        if args.quiet || args.json {
            return None;
        }
        let bar = ProgressBar::new(0);
        bar.enable_steady_tick(Duration::from_millis(250));
        Some(Bar {
            bar,
            phase: None,
            verify: args.verify,
        })
    }

    /// Shows `progress`.
    fn show(&mut self, progress: &Progress) {
        let phase = Phase::of(progress);
        if self.phase != Some(phase) {
            // The rate and time left only while data moves: before it, there is no rate.
            let template = match phase {
                Phase::Sending => {
                    "{bar:30.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}  {msg}"
                }
                Phase::Starting | Phase::Finishing => {
                    "{bar:30.cyan/blue} {bytes}/{total_bytes} {spinner} {msg}"
                }
            };
            self.bar.set_style(
                ProgressStyle::with_template(template)
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            self.phase = Some(phase);
        }
        self.bar.set_length(progress.bytes_total);
        self.bar.set_position(progress.bytes_acked);
        self.bar
            .set_message(bar_message(phase, progress, self.verify));
    }
}

/// The words after the bar.
fn bar_message(phase: Phase, p: &Progress, verify: bool) -> String {
    let files = format!("files {}/{}", p.files_done, p.files_total);
    match phase {
        Phase::Starting => format!("starting: {} streams  {files}", p.streams_active),
        Phase::Sending => format!("{files}  streams {}", p.streams_active),
        Phase::Finishing if verify => format!("all sent; verifying and placing {files}"),
        Phase::Finishing => format!("all sent; placing {files}"),
    }
}

/// Prints what a dry run found: a line per file and a total, or one JSON object.
fn print_preview(args: &SendArgs, seen: &Preview, out: &mut impl Write) -> std::io::Result<()> {
    for skipped in &seen.skipped_sources {
        if !args.quiet {
            eprintln!("xfer: warning: {skipped}");
        }
    }
    if args.json {
        let report = PreviewReport {
            r#type: "dry_run",
            bytes_to_send: seen.bytes_to_send(),
            bytes_total: seen.bytes_total(),
            files: &seen.files,
        };
        serde_json::to_writer(&mut *out, &report)?;
        return writeln!(out);
    }
    if args.quiet {
        return Ok(());
    }
    let count = |action| seen.files.iter().filter(|f| f.action == action).count();
    for file in &seen.files {
        // indicatif's sizes take no width: padded as text.
        let size = indicatif::BinaryBytes(file.size).to_string();
        let (action, shown, note) = match file.action {
            PreviewAction::Send => ("send", size, String::new()),
            PreviewAction::Resume => (
                "resume",
                indicatif::BinaryBytes(file.to_send).to_string(),
                format!(" (of {size})"),
            ),
            PreviewAction::Skip => ("skip", size, " (already there)".into()),
            _ => ("?", size, String::new()),
        };
        writeln!(out, "{action:<7} {shown:>11}  {}{note}", file.path)?;
    }
    writeln!(
        out,
        "dry run: a run would send {} of {} ({} file{} whole, {} resumed, {} skipped); nothing was \
         sent or changed",
        indicatif::BinaryBytes(seen.bytes_to_send()),
        indicatif::BinaryBytes(seen.bytes_total()),
        count(PreviewAction::Send),
        if count(PreviewAction::Send) == 1 { "" } else { "s" },
        count(PreviewAction::Resume),
        count(PreviewAction::Skip),
    )
}

/// `--dry-run --json`'s one object.
#[derive(Serialize)]
struct PreviewReport<'a> {
    r#type: &'static str,
    bytes_to_send: u64,
    bytes_total: u64,
    files: &'a [PreviewFile],
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
            verified: args.verify,
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
        let present = if summary.bytes_skipped > 0 {
            format!(
                ", {} already at the receiver",
                indicatif::BinaryBytes(summary.bytes_skipped)
            )
        } else {
            String::new()
        };
        writeln!(
            out,
            "sent {} in {:.2} s: {:.2} Gbit/s mean, {} file{}, up to {} streams, {} retransmits{present}",
            indicatif::BinaryBytes(summary.bytes),
            summary.seconds,
            summary.gbit_per_s(),
            summary.files,
            if summary.files == 1 { "" } else { "s" },
            max_streams,
            summary.retransmits,
        )?;
        if args.verify {
            writeln!(out, "{}", verified_line(summary))?;
        }
    }
    out.flush()
}

/// What `--verify` confirms once the transfer succeeded: every file, sent or already there,
/// hashed on both sides and found the same.
fn verified_line(summary: &Summary) -> String {
    let already = if summary.bytes_skipped > 0 {
        " (those already at the receiver too)"
    } else {
        ""
    };
    match summary.files {
        0 => "verified end to end (BLAKE3): no file to verify".to_string(),
        1 => format!("verified end to end (BLAKE3): the file is identical{already}"),
        n => format!("verified end to end (BLAKE3): all {n} files are identical{already}"),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use transfer::optimizer::Acting;

    fn progress(acked: u64, total: u64, files: (u64, u64)) -> Progress {
        Progress {
            bytes_acked: acked,
            bytes_total: total,
            files_done: files.0,
            files_total: files.1,
            streams_active: 4,
            ..Progress::default()
        }
    }

    #[test]
    fn the_bar_names_the_phase_before_data_moves_and_after_it_all_arrived() {
        let starting = progress(0, 100, (0, 3));
        assert_eq!(Phase::of(&starting), Phase::Starting);
        assert_eq!(
            bar_message(Phase::Starting, &starting, false),
            "starting: 4 streams  files 0/3"
        );
        assert_eq!(Phase::of(&progress(40, 100, (1, 3))), Phase::Sending);
        let finishing = progress(100, 100, (2, 3));
        assert_eq!(Phase::of(&finishing), Phase::Finishing);
        assert_eq!(
            bar_message(Phase::Finishing, &finishing, true),
            "all sent; verifying and placing files 2/3"
        );
        // Before the manifest announced anything, nothing is finishing.
        assert_eq!(Phase::of(&progress(0, 0, (0, 0))), Phase::Starting);
        // A re-run whose files are all at the receiver already: nothing to send, only to place.
        assert_eq!(Phase::of(&progress(0, 0, (0, 5))), Phase::Finishing);
    }

    #[test]
    fn a_verbose_interval_line_shows_the_rate_the_choice_and_why_control_moved() {
        use optimizer::{MiStats, RewardParams, SignalTracker, UtilityParams};
        // 2.5 Gbit/s over 1 s on 4 streams, one segment in 10,000 retransmitted, judged with
        // no cost per stream or for loss.
        let stats = MiStats {
            end: 3.0,
            duration: 1.0,
            bytes_acked: 312_500_000,
            data_segs_out: 10_000,
            retrans_segs: 1,
            rtt: Some(0.0012),
            streams: 4,
            ..MiStats::default()
        };
        let utility = UtilityParams { k: 1.0, b: 0.0 };
        let observation = SignalTracker::new(utility, RewardParams::default(), 8).observe(&stats);
        let mut record = MiRecord {
            observation,
            controller: "auto".into(),
            decision: Some(9),
            decision_latency: Some(0.001),
            acting: Some(Acting {
                controller: "tuner",
                switch: Some("the policy holds 4".into()),
            }),
            paths: Vec::new(),
        };
        assert_eq!(
            interval_line(&record),
            "    3.0 s    4 streams    2.500 Gbit/s  loss 0.010 %  RTT 1.20 ms (x1.00)  \
             utility 2.500 Gbit/s  -> 9 (tuner: the policy holds 4)"
        );
        record.acting = None;
        assert!(interval_line(&record).ends_with("-> 9 (auto)"));
        record.decision = None;
        assert!(interval_line(&record).ends_with("no decision"));
    }
}
