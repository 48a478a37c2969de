//! How `xfer send` shows a transfer: the live progress bar, per-second JSON, the MI log and
//! the summary, or, for a sender started over ssh by another xfer, JSON lines that xfer reads
//! back ([`Style::Relay`]). A transfer whose sender runs here and one whose sender runs on
//! another host (a pull, a third-party transfer) are shown by the same [`Shown`] from the same
//! reports, so both look alike.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use transfer::mptcp_info::Subflow;
use transfer::sender::{
    Compared, MiRecord, Preview, PreviewAction, PreviewFile, Progress, StreamSample, Summary,
};
use transfer::tcp_info::TcpInfo;
use transfer::transport::Transport;
use transfer::wire::Removal;

use crate::args::SendArgs;

/// One progress report: once a second with `--json`, at every update of the bar otherwise.
#[derive(Debug, Serialize, Deserialize)]
pub struct ProgressReport {
    /// `progress`.
    pub r#type: String,
    /// Seconds since the transfer started.
    pub t: f64,
    /// Bytes the receiver acknowledged.
    pub bytes_acked: u64,
    /// Bytes this run sends.
    pub bytes_total: u64,
    /// Bytes the receiver already had.
    pub bytes_skipped: u64,
    /// The rate since the previous report.
    pub gbit_per_s: f64,
    /// Files in place.
    pub files_done: u64,
    /// Files announced so far.
    pub files_total: u64,
    /// Streams open or opening.
    pub streams: usize,
    /// The stream count asked for.
    pub streams_target: usize,
    /// Each stream's counters.
    pub tcp: Vec<StreamReport>,
}

impl ProgressReport {
    /// The report of `progress`, with the rate since the report before (`since`: its time and
    /// bytes) and each stream's counters.
    pub fn new(progress: &Progress, since: (Duration, u64), streams: Vec<StreamSample>) -> Self {
        let dt = progress.elapsed.saturating_sub(since.0).as_secs_f64();
        let gbit_per_s = if dt > 0.0 {
            progress.bytes_acked.saturating_sub(since.1) as f64 * 8.0 / dt / 1e9
        } else {
            0.0
        };
        let tcp = streams
            .into_iter()
            .map(|s| StreamReport {
                stream: s.stream,
                retiring: s.retiring,
                tcp: s.tcp,
                subflows: s.subflows,
            })
            .collect();
        ProgressReport {
            r#type: "progress".into(),
            t: progress.elapsed.as_secs_f64(),
            bytes_acked: progress.bytes_acked,
            bytes_total: progress.bytes_total,
            bytes_skipped: progress.bytes_skipped,
            gbit_per_s,
            files_done: progress.files_done,
            files_total: progress.files_total,
            streams: progress.streams_active,
            streams_target: progress.streams_target,
            tcp,
        }
    }

    /// The progress it reports, as the bar shows it.
    pub fn progress(&self) -> Progress {
        Progress {
            elapsed: Duration::try_from_secs_f64(self.t).unwrap_or_default(),
            bytes_total: self.bytes_total,
            bytes_skipped: self.bytes_skipped,
            bytes_acked: self.bytes_acked,
            files_total: self.files_total,
            files_done: self.files_done,
            streams_active: self.streams,
            streams_target: self.streams_target,
            ..Progress::default()
        }
    }
}

/// One stream's counters in a report.
#[derive(Debug, Serialize, Deserialize)]
pub struct StreamReport {
    stream: u64,
    retiring: bool,
    #[serde(flatten)]
    tcp: TcpInfo,
    /// An MPTCP stream's subflows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    subflows: Vec<Subflow>,
}

/// The summary of a finished transfer, as `--json` prints it.
#[derive(Debug, Serialize, Deserialize)]
pub struct SummaryReport {
    /// `summary`.
    pub r#type: String,
    /// Bytes acknowledged in this run.
    pub bytes: u64,
    /// Bytes the receiver already had.
    pub bytes_skipped: u64,
    /// Files in the manifest.
    pub files: u64,
    /// Wall time of the transfer.
    pub seconds: f64,
    /// Mean goodput.
    pub gbit_per_s: f64,
    /// `(seconds since start, streams)` at each change of the count.
    pub streams_timeline: Vec<(f64, usize)>,
    /// TCP segments retransmitted over all streams.
    pub retransmits: u64,
    /// The transport the streams used.
    pub transport: Transport,
    /// The sender's peak resident memory (0 when the sender is a daemon's, whose memory is
    /// the daemon's).
    pub peak_rss_bytes: u64,
    /// Every file was verified end to end (`--verify`), those already at the receiver too.
    pub verified: bool,
    /// What the receiver removed because the sources do not hold it (`--delete`).
    #[serde(default)]
    pub removed: RemovalReport,
    /// The files the receiver held, compared by content (`--checksum`).
    #[serde(default)]
    pub compared: Compared,
    /// A transfer over several node pairs (`--nodes`): each run of a stripe over a pair, in
    /// the order they started. A stripe whose pair failed was run again over another: it has
    /// a run more.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<RunReport>,
}

/// One run of a stripe over a node pair, in a transfer over several (`--nodes`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    /// The pair, numbered from 0 in the order of the node list.
    pub node: usize,
    /// Its sending host, as ssh reaches it.
    pub sender: String,
    /// Its receiving host, as ssh reaches it.
    pub receiver: String,
    /// The stripe it sent, `INDEX/COUNT`.
    pub stripe: String,
    /// When it started, in seconds since the transfer started.
    pub started: f64,
    /// When it ended, the same way.
    pub ended: f64,
    /// Bytes it sent that its receiver acknowledged (for a failed run, as last reported).
    pub bytes: u64,
    /// Why it failed, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// The pair whose failure it took the stripe over from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub took_over_from: Option<usize>,
}

impl SummaryReport {
    /// The report of `summary`, whose files were all verified end to end if `verified`, by
    /// a sender whose peak resident memory is `peak_rss_bytes`.
    pub fn new(summary: Summary, verified: bool, peak_rss_bytes: u64) -> Self {
        SummaryReport {
            r#type: "summary".into(),
            bytes: summary.bytes,
            bytes_skipped: summary.bytes_skipped,
            files: summary.files,
            seconds: summary.seconds,
            gbit_per_s: summary.gbit_per_s(),
            retransmits: summary.retransmits,
            transport: summary.transport,
            peak_rss_bytes,
            verified,
            removed: RemovalReport::from(&summary.removed),
            compared: summary.compared,
            streams_timeline: summary.streams_timeline,
            runs: Vec::new(),
        }
    }
}

/// What a dry run found, as `--dry-run --json` prints it.
#[derive(Debug, Serialize, Deserialize)]
pub struct DryRunReport {
    /// `dry_run`.
    pub r#type: String,
    /// Bytes a run would send.
    pub bytes_to_send: u64,
    /// Bytes of all the files.
    pub bytes_total: u64,
    /// Every file, with what a run would do with it.
    pub files: Vec<PreviewFile>,
    /// What a run would remove at the receiver (`--delete`).
    #[serde(default)]
    pub removed: RemovalReport,
}

/// What a mirroring run removed, or would (`--delete`), as `--json` prints it.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct RemovalReport {
    /// Files (and links) removed.
    pub files: u64,
    /// Directories removed.
    pub dirs: u64,
    /// Bytes of the files removed.
    pub bytes: u64,
    /// The entries, contents before their directory, at most the first 10,000.
    pub listed: Vec<RemovedReport>,
}

/// One entry of a [`RemovalReport`].
#[derive(Debug, Serialize, Deserialize)]
pub struct RemovedReport {
    /// Its path relative to the destination directory (not UTF-8: replaced characters).
    pub path: String,
    /// Its size (0 for a directory).
    pub size: u64,
    /// A directory.
    pub dir: bool,
}

impl From<&Removal> for RemovalReport {
    fn from(removal: &Removal) -> Self {
        RemovalReport {
            files: removal.files,
            dirs: removal.dirs,
            bytes: removal.bytes,
            listed: (removal.listed.iter())
                .map(|r| RemovedReport {
                    path: String::from_utf8_lossy(&r.path).into_owned(),
                    size: r.size,
                    dir: r.dir,
                })
                .collect(),
        }
    }
}

impl RemovalReport {
    /// Whether nothing was removed.
    fn is_empty(&self) -> bool {
        self.files == 0 && self.dirs == 0
    }
}

impl DryRunReport {
    /// The report of `seen`.
    pub fn new(seen: &Preview) -> Self {
        DryRunReport {
            r#type: "dry_run".into(),
            bytes_to_send: seen.bytes_to_send(),
            bytes_total: seen.bytes_total(),
            files: seen.files.clone(),
            removed: RemovalReport::from(&seen.removed),
        }
    }
}

/// One line a sender started over ssh prints for the xfer that started it, besides the
/// progress, summary and dry-run reports: a monitoring interval (its MI-log record and the
/// line `--verbose` shows), or a warning.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RelayLine {
    /// One monitoring interval.
    Interval {
        /// Its MI-log record, as the sender wrote it.
        record: serde_json::Value,
        /// What `--verbose` prints for it.
        line: String,
    },
    /// A warning, without the `xfer: warning: ` before it.
    Notice {
        /// The warning.
        text: String,
    },
}

/// How a transfer is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// A progress bar on stderr; with `verbose`, a line per monitoring interval above it.
    Bar {
        /// `--verbose`.
        verbose: bool,
    },
    /// A JSON object per second and a JSON summary on stdout (`--json`).
    Json,
    /// Nothing but errors (`--quiet`).
    Quiet,
    /// JSON lines on stdout for the xfer that started this sender over ssh.
    Relay,
}

/// Shows one transfer in a [`Style`], and writes its MI log.
pub struct Shown {
    style: Style,
    /// `--verify`: the summary says what was verified.
    verify: bool,
    bar: Option<Bar>,
    mi_log: Option<BufWriter<File>>,
    /// Said of the bytes in the summary: `sent`, or `received` where the sender is remote.
    verb: &'static str,
}

impl Shown {
    /// Shows the transfer of `args` (creating its MI log now, before anything starts), or
    /// relays it.
    pub fn new(args: &SendArgs, relay: bool, verb: &'static str) -> anyhow::Result<Shown> {
        let style = if relay {
            Style::Relay
        } else if args.json {
            Style::Json
        } else if args.quiet {
            Style::Quiet
        } else {
            Style::Bar {
                verbose: args.verbose,
            }
        };
        let mi_log = match (&args.mi_log, relay) {
            (Some(path), false) => {
                Some(BufWriter::new(File::create(path).with_context(|| {
                    format!("cannot create {}", path.display())
                })?))
            }
            _ => None,
        };
        Ok(Shown {
            style,
            verify: args.verify,
            bar: None,
            mi_log,
            verb,
        })
    }

    /// The transfer started: the bar appears.
    pub fn started(&mut self) {
        if matches!(self.style, Style::Bar { .. }) && self.bar.is_none() {
            self.bar = Some(Bar::new(self.verify));
        }
    }

    /// A warning.
    pub fn notice(&mut self, text: &str) -> anyhow::Result<()> {
        match self.style {
            Style::Quiet => Ok(()),
            Style::Relay => relay(&RelayLine::Notice { text: text.into() }),
            _ => {
                self.above_bar(&format!("xfer: warning: {text}"));
                Ok(())
            }
        }
    }

    /// Progress: the bar moves, or the report is printed.
    pub fn progress(&mut self, report: &ProgressReport) -> anyhow::Result<()> {
        match self.style {
            Style::Bar { .. } => {
                self.started();
                if let Some(bar) = &mut self.bar {
                    bar.show(&report.progress());
                }
                Ok(())
            }
            Style::Json | Style::Relay => print_json(report),
            Style::Quiet => Ok(()),
        }
    }

    /// One monitoring interval, made here.
    pub fn decision(&mut self, record: &MiRecord) -> anyhow::Result<()> {
        let value = serde_json::to_value(record).context("writing an MI record")?;
        self.interval(value, record.line())
    }

    /// One monitoring interval: its MI-log record and its `--verbose` line.
    pub fn interval(&mut self, record: serde_json::Value, line: String) -> anyhow::Result<()> {
        if let Some(out) = &mut self.mi_log {
            // Flushed at every line, so a killed transfer leaves a usable log.
            serde_json::to_writer(&mut *out, &record)?;
            writeln!(out)?;
            out.flush().context("writing the MI log")?;
        }
        match self.style {
            Style::Bar { verbose: true } => self.above_bar(&line),
            Style::Relay => relay(&RelayLine::Interval { record, line })?,
            _ => {}
        }
        Ok(())
    }

    /// The transfer is over: the bar goes.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.bar.finish_and_clear();
        }
    }

    /// Prints the summary.
    pub fn summary(&mut self, summary: &SummaryReport) -> anyhow::Result<()> {
        self.finish();
        match self.style {
            Style::Json | Style::Relay => print_json(summary),
            Style::Quiet => Ok(()),
            Style::Bar { .. } => {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{}", summary_line(summary, self.verb))?;
                if summary.compared.files > 0 {
                    writeln!(out, "{}", compared_line(&summary.compared))?;
                }
                if !summary.removed.is_empty() {
                    writeln!(out, "removed {}", removal_line(&summary.removed))?;
                }
                if self.verify {
                    writeln!(out, "{}", verified_line(summary))?;
                }
                for run in &summary.runs {
                    writeln!(out, "{}", run_line(run))?;
                }
                out.flush().context("writing the summary")
            }
        }
    }

    /// Prints what a dry run found: a line per file and a total, or one JSON object.
    pub fn dry_run(&mut self, report: &DryRunReport) -> anyhow::Result<()> {
        match self.style {
            Style::Json | Style::Relay => print_json(report),
            Style::Quiet => Ok(()),
            Style::Bar { .. } => {
                let mut out = std::io::stdout().lock();
                write_dry_run(report, &mut out).context("writing the dry run")
            }
        }
    }

    /// Prints `line` on stderr, above the progress bar if there is one.
    fn above_bar(&self, line: &str) {
        let print = || eprintln!("{line}");
        match &self.bar {
            Some(bar) => bar.bar.suspend(print),
            None => print(),
        }
    }
}

/// Prints `value` as one JSON line on stdout, flushed.
fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)?;
    writeln!(out)?;
    out.flush().context("writing to stdout")
}

/// Prints one [`RelayLine`].
fn relay(line: &RelayLine) -> anyhow::Result<()> {
    print_json(line)
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
    fn new(verify: bool) -> Bar {
        let bar = ProgressBar::new(0);
        bar.enable_steady_tick(Duration::from_millis(250));
        Bar {
            bar,
            phase: None,
            verify,
        }
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

/// A dry run as text: a line per file and a total.
fn write_dry_run(seen: &DryRunReport, out: &mut impl Write) -> std::io::Result<()> {
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
    for removed in &seen.removed.listed {
        let path = &removed.path;
        match removed.dir {
            true => writeln!(out, "{:<7} {:>11}  {path}/", "delete", "")?,
            false => writeln!(out, "{:<7} {:>11}  {path}", "delete", size(removed.size))?,
        }
    }
    // Counted by the receiver, which may be anyone's: never below the entries it named.
    let counted = seen.removed.files.saturating_add(seen.removed.dirs);
    let unlisted = counted.saturating_sub(seen.removed.listed.len() as u64);
    if unlisted > 0 {
        writeln!(out, "{:<7} {:>11}  and {unlisted} more", "delete", "")?;
    }
    let sent = count(PreviewAction::Send);
    let removal = match seen.removed.is_empty() {
        true => String::new(),
        false => format!(" and remove {}", removal_line(&seen.removed)),
    };
    writeln!(
        out,
        "dry run: a run would send {} of {} ({sent} file{} whole, {} resumed, {} \
         skipped){removal}; nothing was sent or changed",
        size(seen.bytes_to_send),
        size(seen.bytes_total),
        if sent == 1 { "" } else { "s" },
        count(PreviewAction::Resume),
        count(PreviewAction::Skip),
    )?;
    out.flush()
}

/// A size as the reports show it.
fn size(bytes: u64) -> String {
    indicatif::BinaryBytes(bytes).to_string()
}

/// What a mirroring run removed (or would): its files with their bytes, and its directories.
fn removal_line(removed: &RemovalReport) -> String {
    let plural = |n: u64, one: &str, many: &str| match n {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    };
    format!(
        "{} ({}) and {} the sources do not hold",
        plural(removed.files, "file", "files"),
        size(removed.bytes),
        plural(removed.dirs, "directory", "directories"),
    )
}

/// The summary as one line of text.
fn summary_line(summary: &SummaryReport, verb: &str) -> String {
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
    format!(
        "{verb} {} in {:.2} s: {:.2} Gbit/s mean, {} file{}, up to {} streams, {} retransmits{present}",
        indicatif::BinaryBytes(summary.bytes),
        summary.seconds,
        summary.gbit_per_s,
        summary.files,
        if summary.files == 1 { "" } else { "s" },
        max_streams,
        summary.retransmits,
    )
}

/// What one run of a stripe over a node pair did.
fn run_line(run: &RunReport) -> String {
    let took = match run.took_over_from {
        Some(node) => format!(" (taken over from node {node})"),
        None => String::new(),
    };
    let failed = match &run.failed {
        Some(why) => format!("; failed: {why}"),
        None => String::new(),
    };
    format!(
        "node {} ({} -> {}): stripe {}{took}, {} from {:.2} s to {:.2} s{failed}",
        run.node,
        run.sender,
        run.receiver,
        run.stripe,
        indicatif::BinaryBytes(run.bytes),
        run.started,
        run.ended,
    )
}

/// What `--checksum` found of the files the receiver held.
fn compared_line(compared: &Compared) -> String {
    let files = match compared.files {
        1 => "1 file".to_string(),
        n => format!("{n} files"),
    };
    let changed = match (compared.files, compared.changed) {
        (1, 0) => "identical".to_string(),
        (_, 0) => "all identical".to_string(),
        (n, c) if n == c => "all changed and sent".to_string(),
        (n, c) => format!("{} identical, {c} changed and sent", n - c),
    };
    format!("compared by content (BLAKE3): {files} already at the receiver, {changed}")
}

/// What `--verify` confirms once the transfer succeeded: every file, sent or already there,
/// hashed on both sides and found the same.
fn verified_line(summary: &SummaryReport) -> String {
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
    fn a_relayed_progress_report_reads_back_as_the_progress_it_reported() {
        let mut sent = progress(300, 1000, (1, 3));
        sent.elapsed = Duration::from_millis(2500);
        sent.bytes_skipped = 7;
        sent.streams_target = 6;
        let report = ProgressReport::new(&sent, (Duration::from_millis(1500), 100), Vec::new());
        assert!((report.gbit_per_s - 200.0 * 8.0 / 1e9).abs() < 1e-12);
        let line = serde_json::to_string(&report).unwrap();
        let back: ProgressReport = serde_json::from_str(&line).unwrap();
        assert_eq!(back.progress(), sent);
        assert_eq!(serde_json::to_string(&back).unwrap(), line);
    }

    #[test]
    fn the_summary_line_names_what_moved_and_what_verify_confirmed() {
        let summary = SummaryReport {
            r#type: "summary".into(),
            bytes: 3 << 20,
            bytes_skipped: 1 << 20,
            files: 2,
            seconds: 1.5,
            gbit_per_s: 0.02,
            streams_timeline: vec![(0.0, 4), (1.0, 7), (1.2, 2)],
            retransmits: 5,
            transport: Transport::Tcp,
            peak_rss_bytes: 0,
            verified: true,
            removed: RemovalReport::default(),
            compared: Compared::default(),
            runs: Vec::new(),
        };
        assert_eq!(
            summary_line(&summary, "received"),
            "received 3.00 MiB in 1.50 s: 0.02 Gbit/s mean, 2 files, up to 7 streams, 5 \
             retransmits, 1.00 MiB already at the receiver"
        );
        assert_eq!(
            verified_line(&summary),
            "verified end to end (BLAKE3): all 2 files are identical (those already at the \
             receiver too)"
        );
    }

    #[test]
    fn the_comparison_by_content_says_what_changed() {
        let line = |files, changed| compared_line(&Compared { files, changed });
        assert_eq!(
            line(20, 0),
            "compared by content (BLAKE3): 20 files already at the receiver, all identical"
        );
        assert_eq!(
            line(20, 1),
            "compared by content (BLAKE3): 20 files already at the receiver, 19 identical, 1 \
             changed and sent"
        );
        assert_eq!(
            line(1, 1),
            "compared by content (BLAKE3): 1 file already at the receiver, all changed and sent"
        );
        assert_eq!(
            line(1, 0),
            "compared by content (BLAKE3): 1 file already at the receiver, identical"
        );
    }

    #[test]
    fn a_dry_run_lists_each_removal_and_trusts_no_count_below_what_it_names() {
        let entry = |path: &str, size, dir| RemovedReport {
            path: path.into(),
            size,
            dir,
        };
        let mut report = DryRunReport {
            r#type: "dry_run".into(),
            bytes_to_send: 0,
            bytes_total: 0,
            files: Vec::new(),
            removed: RemovalReport {
                files: 1,
                dirs: 1,
                bytes: 2048,
                listed: vec![
                    entry("run/old.bin", 2048, false),
                    entry("run/gone", 0, true),
                ],
            },
        };
        let mut out = Vec::new();
        write_dry_run(&report, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("delete     2.00 KiB  run/old.bin\n"),
            "{text}"
        );
        assert!(text.contains("delete               run/gone/\n"), "{text}");
        assert!(
            text.contains("and remove 1 file (2.00 KiB) and 1 directory"),
            "{text}"
        );
        // A receiver that counts fewer than it names, or more: no wrap, no panic.
        report.removed.files = 0;
        report.removed.dirs = 0;
        let mut out = Vec::new();
        write_dry_run(&report, &mut out).unwrap();
        assert!(!String::from_utf8(out).unwrap().contains("more"));
        report.removed.files = u64::MAX;
        report.removed.dirs = 5;
        let mut out = Vec::new();
        write_dry_run(&report, &mut out).unwrap();
        assert!(String::from_utf8(out)
            .unwrap()
            .contains("and 18446744073709551613 more"));
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
            record.line(),
            "    3.0 s    4 streams    2.500 Gbit/s  loss 0.010 %  RTT 1.20 ms (x1.00)  \
             utility 2.500 Gbit/s  -> 9 (tuner: the policy holds 4)"
        );
        record.acting = None;
        assert!(record.line().ends_with("-> 9 (auto)"));
        record.decision = None;
        assert!(record.line().ends_with("no decision"));
    }
}
