//! A transfer striped over a site's node pairs from one command: `xfer send --nodes FILE
//! PATH... DIR`. This host, the head, starts a third-party transfer per pair over ssh (a sender
//! on the sending node, a receiver on the receiving node: [`crate::remote_send`]), each sending
//! its stripe (`--stripe I/K`; with `--launcher srun` the senders are started as steps of the
//! head's Slurm allocation instead, [`crate::srun_start`]), and shows them as one transfer: one
//! progress bar, one MI log whose records name their node, one summary with a line per run. The
//! data goes from node to node; only the ssh channels reach the head, so it needs no port of
//! its own.
//!
//! A pair whose run fails (a node's process killed, its host or its link down) is not used
//! again, and its stripe is run again at once over the live pair with the least work. The
//! receiving nodes share their journals, so the new run sends only what the failed one left
//! unverified. [`Runs`] holds that bookkeeping without I/O; [`run`] feeds it.

use std::path::Path;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use transfer::sender::Progress;
use transfer::stripe::{Stripe, MAX_NODES};
use transfer::transport::Transport;

use crate::args::{is_remote, SendArgs};
use crate::remote_send::{Report, Started};
use crate::report::{ProgressReport, RunReport, Shown, SummaryReport};
use crate::send::{self, Interrupted};
use crate::signals;
use crate::ssh_start::Lifeline;

/// A sending node and the receiving node it sends to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePair {
    /// `[USER@]HOST` of the sending node, for ssh.
    pub sender: String,
    /// `[USER@]HOST` of the receiving node, for ssh.
    pub receiver: String,
}

/// Reads the node list: a line per pair, `SENDER RECEIVER`; blank lines and everything after
/// a `#` are left out.
pub fn read_pairs(list: &Path) -> anyhow::Result<Vec<NodePair>> {
    let text = std::fs::read_to_string(list)
        .with_context(|| format!("reading the node list {}", list.display()))?;
    parse_pairs(&text).with_context(|| format!("the node list {}", list.display()))
}

/// The pairs of a node list's text.
fn parse_pairs(text: &str) -> anyhow::Result<Vec<NodePair>> {
    let mut pairs = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default();
        let words: Vec<&str> = line.split_whitespace().collect();
        let (sender, receiver) = match words[..] {
            [] => continue,
            [sender, receiver] => (sender, receiver),
            _ => bail!(
                "line {}: a node pair is written SENDER RECEIVER ([USER@]HOST each), not {:?}",
                number + 1,
                line.trim()
            ),
        };
        for host in [sender, receiver] {
            if host.contains([':', '/']) {
                bail!(
                    "line {}: {host:?} is not [USER@]HOST (a host whose name holds a colon, \
                     such as an IPv6 address, is named by a Host alias of the ssh config)",
                    number + 1
                );
            }
        }
        pairs.push(NodePair {
            sender: sender.into(),
            receiver: receiver.into(),
        });
    }
    if pairs.is_empty() {
        bail!("it names no node pair (a line per pair: SENDER RECEIVER)");
    }
    if pairs.len() > MAX_NODES as usize {
        bail!(
            "it names {} node pairs; a striped transfer has at most {MAX_NODES}",
            pairs.len()
        );
    }
    Ok(pairs)
}

/// Runs a transfer of `sources` (paths on the sending nodes) to `dir` (on the receiving
/// nodes) striped over the pairs `list` names.
pub fn run(args: &SendArgs, list: &Path, sources: &[String], dir: &str) -> anyhow::Result<()> {
    let pairs = read_pairs(list)?;
    if sources.is_empty() {
        bail!(
            "nothing to send: name the sources on the sending nodes, then the directory on the \
             receiving nodes"
        );
    }
    for name in sources.iter().map(String::as_str).chain([dir]) {
        if is_remote(name) {
            bail!(
                "with --nodes, {name:?} is a path on the nodes' shared file system, without a \
                 host: the hosts are those of {}",
                list.display()
            );
        }
    }
    let count = pairs.len() as u32;
    // Checked here before anything starts, and once more by each node's sender.
    send::remote_sending(&node_args(args, Stripe::new(0, count)?), &pairs[0].sender)?;
    let mut shown = Shown::new(args, false, "sent")?;
    let lifelines = Lifelines::default();
    let cut = lifelines.clone();
    // The first signal cuts every ssh channel, which ends the xfer at their other ends
    // (what the receivers verified is kept).
    let interrupted = signals::stop_on_first(move || cut.cut_all())?;
    let clock = Instant::now();
    let (events, received) = mpsc::channel();
    let launch = |run: usize, stripe: Stripe, node: usize| {
        let job = RunJob {
            args: node_args(args, stripe),
            pair: pairs[node].clone(),
            sources: sources.to_vec(),
            dir: dir.to_string(),
            lifelines: lifelines.clone(),
            reporter: Reporter {
                run,
                events: events.clone(),
                ended: false,
            },
        };
        std::thread::Builder::new()
            .name(format!("xfer-node-{node}"))
            .spawn(move || job.serve())
            .map(drop)
            .context("starting a node's thread")
    };
    let mut runs = Runs::new(pairs.clone());
    for index in 0..count {
        let stripe = Stripe::new(index, count)?;
        let run = runs.start(stripe, index as usize, Duration::ZERO, None);
        launch(run, stripe, index as usize)?;
    }
    let mut since = (Duration::ZERO, 0);
    while runs.running() > 0 {
        let event = received
            .recv()
            .expect("the head keeps a sender of the channel");
        let (node, stripe) = runs.placed(event.run);
        match event.what {
            What::Report(Report::Progress(report)) => {
                runs.progress(event.run, report.progress());
                let report = runs.progress_report(clock.elapsed(), since);
                since = (clock.elapsed(), report.bytes_acked);
                shown.progress(&report)?;
            }
            What::Report(Report::Interval { mut record, line }) => {
                if let Some(fields) = record.as_object_mut() {
                    fields.insert("node".into(), node.into());
                    fields.insert("stripe".into(), stripe.to_string().into());
                }
                shown.interval(record, format!("node {node}: {line}"))?;
            }
            What::Report(Report::Notice(text)) => shown.notice(&format!("node {node}: {text}"))?,
            // Striped transfers refuse dry runs, here and on every node.
            What::Report(Report::DryRun(_)) => {}
            What::Ended(result) => {
                let failed = result.as_ref().err().cloned();
                let retry = interrupted.get().is_none();
                let next = runs.ended(event.run, clock.elapsed(), result, retry);
                if let Some(why) = failed {
                    let pair = &pairs[node];
                    let then = match next {
                        Some((_, to)) => format!(
                            "its stripe {stripe} goes to node {to} ({} -> {})",
                            pairs[to].sender, pairs[to].receiver
                        ),
                        None if retry => "no node is left to take its stripe over".into(),
                        None => "stopping".into(),
                    };
                    shown.notice(&format!(
                        "node {node} ({} -> {}) failed: {why}; {then}",
                        pair.sender, pair.receiver
                    ))?;
                }
                if let Some((run, to)) = next {
                    launch(run, stripe, to)?;
                }
            }
        }
    }
    shown.finish();
    match (
        runs.summary(clock.elapsed(), args.transport),
        interrupted.get(),
    ) {
        (Ok(summary), _) => shown.summary(&summary),
        (Err(_), Some(&signal)) => Err(Interrupted::at(
            signal,
            &runs.progress_report(clock.elapsed(), since).progress(),
            true,
        )
        .into()),
        (Err(unsent), None) => Err(anyhow::Error::msg(unsent)),
    }
}

/// The options node `stripe` sends with.
fn node_args(args: &SendArgs, stripe: Stripe) -> SendArgs {
    SendArgs {
        stripe: Some(stripe),
        nodes: None,
        ..args.clone()
    }
}

/// The ssh channels of every run, which the first signal cuts; a run that starts after that
/// has its own cut as it registers them.
#[derive(Clone, Default)]
struct Lifelines(Arc<Mutex<(bool, Vec<Lifeline>)>>);

impl Lifelines {
    /// Registers a run's channels.
    fn add(&self, more: Vec<Lifeline>) {
        let mut lifelines = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if lifelines.0 {
            more.iter().for_each(Lifeline::cut);
        }
        lifelines.1.extend(more);
    }

    /// Cuts every channel, and those registered later.
    fn cut_all(&self) {
        let mut lifelines = self.0.lock().unwrap_or_else(|e| e.into_inner());
        lifelines.0 = true;
        lifelines.1.iter().for_each(Lifeline::cut);
    }
}

/// What a run's thread tells the head.
struct Event {
    run: usize,
    what: What,
}

/// A report of a run, or its end.
enum What {
    Report(Report),
    Ended(Result<SummaryReport, String>),
}

/// A run's side of the channel to the head. Dropped without an end (its thread panicked), it
/// reports the run failed, so the head never waits for it.
struct Reporter {
    run: usize,
    events: Sender<Event>,
    ended: bool,
}

impl Reporter {
    fn send(&self, what: What) {
        // The head only stops listening once every run ended.
        let _ = self.events.send(Event {
            run: self.run,
            what,
        });
    }

    fn end(mut self, result: Result<SummaryReport, String>) {
        self.ended = true;
        self.send(What::Ended(result));
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if !self.ended {
            self.send(What::Ended(Err("the head's thread for it failed".into())));
        }
    }
}

/// One run of a stripe over a pair, on a thread of its own.
struct RunJob {
    args: SendArgs,
    pair: NodePair,
    sources: Vec<String>,
    dir: String,
    lifelines: Lifelines,
    reporter: Reporter,
}

impl RunJob {
    /// Starts the pair's receiver and sender over ssh, relays the sender's reports and says
    /// how the run ended.
    fn serve(self) {
        let RunJob {
            args,
            pair,
            sources,
            dir,
            lifelines,
            reporter,
        } = self;
        let destination = format!("{}:{dir}", pair.receiver);
        let result =
            Started::start(&args, pair.sender, sources, &destination).and_then(|started| {
                lifelines.add(started.lifelines());
                let (ended, receiving) = started.follow(|report| {
                    reporter.send(What::Report(report));
                    Ok(())
                })?;
                ended.check()?;
                receiving.finish()?;
                ended.summary.context("the sender reported no summary")
            });
        reporter.end(result.map_err(|e| format!("{e:#}")));
    }
}

/// The head's account of the runs: which stripe runs over which pair, what each reported,
/// which pairs failed, and where a failed run's stripe goes. No I/O and no clock: the times
/// are handed in.
struct Runs {
    pairs: Vec<NodePair>,
    runs: Vec<Run>,
    /// Pairs that failed a run, not used again.
    failed: Vec<bool>,
}

/// One run of a stripe over a pair.
struct Run {
    stripe: Stripe,
    node: usize,
    started: Duration,
    took_over_from: Option<usize>,
    /// Its latest progress; none before its first.
    latest: Option<Progress>,
    ended: Option<(Duration, Result<SummaryReport, String>)>,
}

impl Run {
    /// Bytes its receiver acknowledged: its summary's, or as last reported.
    fn bytes(&self) -> u64 {
        match (&self.ended, &self.latest) {
            (Some((_, Ok(summary))), _) => summary.bytes,
            (_, Some(latest)) => latest.bytes_acked,
            _ => 0,
        }
    }

    /// What it said of its stripe: the bytes it sends, those already there, files in place
    /// and files announced. None before it said anything.
    fn figures(&self) -> Option<(u64, u64, u64, u64)> {
        match (&self.ended, &self.latest) {
            (Some((_, Ok(s))), _) => Some((s.bytes, s.bytes_skipped, s.files, s.files)),
            (_, Some(p)) => Some((p.bytes_total, p.bytes_skipped, p.files_done, p.files_total)),
            _ => None,
        }
    }

    fn running(&self) -> bool {
        self.ended.is_none()
    }

    /// Its summary, if it completed.
    fn summary(&self) -> Option<&SummaryReport> {
        match &self.ended {
            Some((_, Ok(summary))) => Some(summary),
            _ => None,
        }
    }

    fn completed(&self) -> bool {
        self.summary().is_some()
    }
}

/// A stripe's figures over its runs.
#[derive(Debug, Default, PartialEq, Eq)]
struct StripeFigures {
    /// Acknowledged, over every run.
    acked: u64,
    /// To send in this transfer, over every run.
    total: u64,
    /// At the receivers before this transfer.
    skipped: u64,
    files_done: u64,
    files_total: u64,
}

impl Runs {
    fn new(pairs: Vec<NodePair>) -> Runs {
        let failed = vec![false; pairs.len()];
        Runs {
            pairs,
            runs: Vec::new(),
            failed,
        }
    }

    /// Records that `stripe` starts over pair `node` at `at`, taking over from pair `from`;
    /// the run's number.
    fn start(&mut self, stripe: Stripe, node: usize, at: Duration, from: Option<usize>) -> usize {
        self.runs.push(Run {
            stripe,
            node,
            started: at,
            took_over_from: from,
            latest: None,
            ended: None,
        });
        self.runs.len() - 1
    }

    /// The pair and the stripe of run `run`.
    fn placed(&self, run: usize) -> (usize, Stripe) {
        (self.runs[run].node, self.runs[run].stripe)
    }

    /// Runs not yet ended.
    fn running(&self) -> usize {
        self.runs.iter().filter(|r| r.running()).count()
    }

    /// Run `run` reported `progress`.
    fn progress(&mut self, run: usize, progress: Progress) {
        self.runs[run].latest = Some(progress);
    }

    /// Run `run` ended at `at`. A failed one's pair is not used again and, if `retry`, its
    /// stripe starts over the live pair with the fewest runs going (then the fewest runs, then
    /// the first): that run's number and pair.
    fn ended(
        &mut self,
        run: usize,
        at: Duration,
        result: Result<SummaryReport, String>,
        retry: bool,
    ) -> Option<(usize, usize)> {
        let failed = result.is_err();
        self.runs[run].ended = Some((at, result));
        if !failed {
            return None;
        }
        let (from, stripe) = self.placed(run);
        self.failed[from] = true;
        if !retry {
            return None;
        }
        let load = |node: usize| {
            let on = self.runs.iter().filter(|r| r.node == node);
            (on.clone().filter(|r| r.running()).count(), on.count(), node)
        };
        let to = (0..self.pairs.len())
            .filter(|&node| !self.failed[node])
            .min_by_key(|&node| load(node))?;
        Some((self.start(stripe, to, at, Some(from)), to))
    }

    /// The figures of `stripe` over its runs. What a run sends is counted with the run; what
    /// a later run found at the receivers that an earlier run sent is the earlier run's, not
    /// what was there before, so `acked` plus `skipped` is the stripe's share once a run of
    /// it completed.
    fn stripe(&self, stripe: Stripe) -> StripeFigures {
        let runs: Vec<&Run> = self.runs.iter().filter(|r| r.stripe == stripe).collect();
        let acked = runs.iter().map(|r| r.bytes()).sum();
        let Some(last) = runs.iter().rposition(|r| r.figures().is_some()) else {
            return StripeFigures {
                acked,
                ..StripeFigures::default()
            };
        };
        let earlier: u64 = runs[..last].iter().map(|r| r.bytes()).sum();
        let (total, skipped, files_done, files_total) = runs[last]
            .figures()
            .expect("the last run that said anything");
        StripeFigures {
            acked,
            total: earlier + total,
            skipped: skipped.saturating_sub(earlier),
            files_done,
            files_total,
        }
    }

    /// The stripes, in order.
    fn stripes(&self) -> impl Iterator<Item = Stripe> + '_ {
        let count = self.pairs.len() as u32;
        (0..count).map(move |index| Stripe::new(index, count).expect("index below count"))
    }

    /// The whole transfer's progress at `at`, with the rate since `since` (time and bytes).
    fn progress_report(&self, at: Duration, since: (Duration, u64)) -> ProgressReport {
        let mut progress = Progress {
            elapsed: at,
            ..Progress::default()
        };
        for stripe in self.stripes() {
            let figures = self.stripe(stripe);
            progress.bytes_acked += figures.acked;
            progress.bytes_total += figures.total;
            progress.bytes_skipped += figures.skipped;
            progress.files_done += figures.files_done;
            progress.files_total += figures.files_total;
        }
        for latest in self
            .runs
            .iter()
            .filter(|r| r.running())
            .flat_map(|r| &r.latest)
        {
            progress.streams_active += latest.streams_active;
            progress.streams_target += latest.streams_target;
        }
        ProgressReport::new(&progress, since, Vec::new())
    }

    /// The summary of the whole transfer, ended at `at`: every stripe sent by one of its runs.
    /// Files are counted per stripe (a file cut into pieces on several nodes once per node),
    /// and the stream count over time is the sum of the runs that completed. The error names
    /// the stripes no run completed.
    fn summary(&self, at: Duration, transport: Transport) -> Result<SummaryReport, String> {
        let unsent: Vec<String> = self
            .stripes()
            .filter(|&stripe| {
                !self
                    .runs
                    .iter()
                    .any(|r| r.stripe == stripe && r.completed())
            })
            .map(|stripe| stripe.to_string())
            .collect();
        if !unsent.is_empty() {
            return Err(format!(
                "stripe {} not sent: every node pair that ran it failed (the notices above say \
                 why); the receivers keep what they verified, so run the same command again to \
                 send the rest",
                unsent.join(", ")
            ));
        }
        let done: Vec<&SummaryReport> = self.runs.iter().filter_map(Run::summary).collect();
        let (mut bytes, mut bytes_skipped, mut files) = (0, 0, 0);
        for stripe in self.stripes() {
            let figures = self.stripe(stripe);
            bytes += figures.acked;
            bytes_skipped += figures.skipped;
            files += figures.files_total;
        }
        let seconds = at.as_secs_f64();
        Ok(SummaryReport {
            r#type: "summary".into(),
            bytes,
            bytes_skipped,
            files,
            seconds,
            gbit_per_s: if seconds > 0.0 {
                bytes as f64 * 8.0 / seconds / 1e9
            } else {
                0.0
            },
            streams_timeline: self.streams_timeline(),
            retransmits: done.iter().map(|s| s.retransmits).sum(),
            transport: done.first().map_or(transport, |s| s.transport),
            peak_rss_bytes: done.iter().map(|s| s.peak_rss_bytes).max().unwrap_or(0),
            verified: false,
            removed: Default::default(),
            compared: Default::default(),
            runs: self.runs.iter().map(|r| self.report(r)).collect(),
        })
    }

    /// The streams of every completed run over time, each run's timeline placed where it
    /// ended (its end less its own length) on the head's clock.
    fn streams_timeline(&self) -> Vec<(f64, usize)> {
        let mut changes: Vec<(f64, usize, usize)> = Vec::new();
        for (number, run) in self.runs.iter().enumerate() {
            let (Some(summary), Some((end, _))) = (run.summary(), &run.ended) else {
                continue;
            };
            let start = (end.as_secs_f64() - summary.seconds).max(run.started.as_secs_f64());
            changes.extend(
                summary
                    .streams_timeline
                    .iter()
                    .map(|&(t, n)| (start + t, number, n)),
            );
            changes.push((end.as_secs_f64(), number, 0));
        }
        changes.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut now = vec![0; self.runs.len()];
        let mut timeline: Vec<(f64, usize)> = Vec::new();
        for (t, number, n) in changes {
            now[number] = n;
            let total = now.iter().sum();
            match timeline.last_mut() {
                Some(last) if last.0 == t => last.1 = total,
                Some(last) if last.1 == total => {}
                _ => timeline.push((t, total)),
            }
        }
        timeline
    }

    /// What run `run` did, for the summary.
    fn report(&self, run: &Run) -> RunReport {
        let pair = &self.pairs[run.node];
        RunReport {
            node: run.node,
            sender: pair.sender.clone(),
            receiver: pair.receiver.clone(),
            stripe: run.stripe.to_string(),
            started: run.started.as_secs_f64(),
            ended: run.ended.as_ref().map_or(0.0, |(at, _)| at.as_secs_f64()),
            bytes: run.bytes(),
            failed: match &run.ended {
                Some((_, Err(why))) => Some(why.clone()),
                _ => None,
            },
            took_over_from: run.took_over_from,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(n: usize) -> Vec<NodePair> {
        (0..n)
            .map(|i| NodePair {
                sender: format!("s{i}"),
                receiver: format!("r{i}"),
            })
            .collect()
    }

    fn progress(total: u64, skipped: u64, acked: u64, streams: usize) -> Progress {
        Progress {
            elapsed: Duration::from_secs(1),
            bytes_total: total,
            bytes_skipped: skipped,
            bytes_acked: acked,
            files_total: 2,
            files_done: 1,
            streams_active: streams,
            streams_target: streams,
            ..Progress::default()
        }
    }

    fn summary(
        bytes: u64,
        skipped: u64,
        seconds: f64,
        timeline: Vec<(f64, usize)>,
    ) -> SummaryReport {
        SummaryReport {
            r#type: "summary".into(),
            bytes,
            bytes_skipped: skipped,
            files: 2,
            seconds,
            gbit_per_s: 0.0,
            streams_timeline: timeline,
            retransmits: 3,
            transport: Transport::Tcp,
            peak_rss_bytes: 10,
            verified: false,
            removed: Default::default(),
            compared: Default::default(),
            runs: Vec::new(),
        }
    }

    fn stripe(i: u32, k: u32) -> Stripe {
        Stripe::new(i, k).unwrap()
    }

    #[test]
    fn the_node_list_is_a_pair_per_line_and_anything_else_is_refused_by_line() {
        let text = "# site A to site B\n\ndtn1 dtn-b1\n  alice@dtn2\tbob@dtn-b2  # the second\n";
        assert_eq!(
            parse_pairs(text).unwrap(),
            vec![
                NodePair {
                    sender: "dtn1".into(),
                    receiver: "dtn-b1".into()
                },
                NodePair {
                    sender: "alice@dtn2".into(),
                    receiver: "bob@dtn-b2".into()
                },
            ]
        );
        let err = |text: &str| format!("{:#}", parse_pairs(text).unwrap_err());
        assert!(err("a b\nc\n").contains("line 2: a node pair is written SENDER RECEIVER"));
        assert!(err("a b c\n").contains("line 1"));
        assert!(err("a b:/x\n").contains("\"b:/x\" is not [USER@]HOST"));
        assert!(err("# nothing\n").contains("names no node pair"));
        assert!(err(&"a b\n".repeat(MAX_NODES as usize + 1)).contains("at most 256"));
    }

    #[test]
    fn a_failed_runs_stripe_goes_to_the_least_busy_live_pair_and_the_bytes_add_up() {
        let mut runs = Runs::new(pairs(3));
        for i in 0..3 {
            runs.start(stripe(i, 3), i as usize, Duration::ZERO, None);
        }
        // Each stripe is 100 bytes; 10 of stripe 1 were at the receivers before.
        runs.progress(0, progress(100, 0, 40, 4));
        runs.progress(1, progress(90, 10, 30, 4));
        runs.progress(2, progress(100, 0, 50, 4));
        let report = runs.progress_report(Duration::from_secs(1), (Duration::ZERO, 0));
        assert_eq!(
            (report.bytes_acked, report.bytes_total, report.bytes_skipped),
            (120, 290, 10)
        );
        assert_eq!(report.streams, 12);
        // Pair 0 completes; pair 1 fails: its stripe goes to pair 0, now idle, not to pair 2.
        let done = runs.ended(
            0,
            Duration::from_secs(2),
            Ok(summary(100, 0, 2.0, vec![(0.0, 4)])),
            true,
        );
        assert_eq!(done, None);
        let next = runs.ended(1, Duration::from_secs(3), Err("killed".into()), true);
        assert_eq!(next, Some((3, 0)));
        assert_eq!(runs.placed(3), (0, stripe(1, 3)));
        assert_eq!(runs.running(), 2);
        // Before the new run reports, stripe 1 counts what the failed one said.
        assert_eq!(
            runs.stripe(stripe(1, 3)),
            StripeFigures {
                acked: 30,
                total: 90,
                skipped: 10,
                files_done: 1,
                files_total: 2
            }
        );
        // The new run finds the 10 that were there and the 35 the failed one got verified
        // (5 more than its last report said), and sends the other 55.
        runs.progress(3, progress(55, 45, 20, 4));
        assert_eq!(runs.stripe(stripe(1, 3)).total, 85);
        let early = runs
            .summary(Duration::from_secs(4), Transport::Tcp)
            .unwrap_err();
        assert!(early.starts_with("stripe 1/3, 2/3 not sent"), "{early}");
        runs.ended(
            3,
            Duration::from_secs(5),
            Ok(summary(55, 45, 2.0, vec![(0.0, 2)])),
            true,
        );
        runs.ended(
            2,
            Duration::from_secs(6),
            Ok(summary(100, 0, 6.0, vec![(0.0, 4), (1.0, 8)])),
            true,
        );
        let summary = runs
            .summary(Duration::from_secs(6), Transport::Tcp)
            .unwrap();
        // Every stripe's bytes sent and found add up to its share.
        assert_eq!(summary.bytes + summary.bytes_skipped, 300);
        assert_eq!((summary.bytes, summary.bytes_skipped), (285, 15));
        assert_eq!(summary.retransmits, 9);
        assert_eq!(
            summary.streams_timeline,
            vec![(0.0, 8), (1.0, 12), (2.0, 8), (3.0, 10), (5.0, 8), (6.0, 0)]
        );
        let failed = &summary.runs[1];
        assert_eq!(
            (failed.node, failed.bytes, failed.failed.as_deref()),
            (1, 30, Some("killed"))
        );
        let took = &summary.runs[3];
        assert_eq!(
            (took.node, took.took_over_from, &took.stripe[..]),
            (0, Some(1), "1/3")
        );
    }

    #[test]
    fn without_a_live_pair_or_after_a_signal_nothing_is_run_again_and_the_summary_says_what_is_missing(
    ) {
        let mut runs = Runs::new(pairs(2));
        runs.start(stripe(0, 2), 0, Duration::ZERO, None);
        runs.start(stripe(1, 2), 1, Duration::ZERO, None);
        assert_eq!(
            runs.ended(0, Duration::from_secs(1), Err("down".into()), false),
            None
        );
        assert_eq!(runs.running(), 1);
        let next = runs.ended(1, Duration::from_secs(1), Err("down".into()), true);
        assert_eq!(next, None, "both pairs failed");
        let err = runs
            .summary(Duration::from_secs(1), Transport::Tcp)
            .unwrap_err();
        assert!(err.starts_with("stripe 0/2, 1/2 not sent"), "{err}");
    }
}
