//! Transfers whose sender runs on another host, started over ssh: a pull (`xfer send
//! HOST:PATH... DIR`: HOST sends to a receiver this xfer runs here) and a third-party transfer
//! (`xfer send HOSTA:PATH... HOSTB:DIR`: A sends to a receiver started on B, directly; only
//! the reports pass through the host that asked).
//!
//! A sender's streams connect to its receiver, in a pull as in a push: data goes from the
//! source's host to the destination's, which must accept connections from it (bbcp connects
//! the same way by default). A pull's receiver here listens on any free port of every address
//! unless `--listen` names one, and the remote sender connects to the address its ssh
//! connection came from, or to the address `--listen` names.
//!
//! xfer runs `xfer send --over-ssh` on the source's host, hands it the transfer as one JSON
//! line ([`Request`]: the receiver, its key, the paths, the filter and the options), and shows
//! the reports it prints ([`Style::Relay`](crate::report::Style::Relay)) as its own: the same
//! bar, JSON, MI log, summary and exit status as a push. The head of a transfer striped over
//! node pairs ([`crate::nodes`]) runs one such third-party transfer ([`Started`]) per pair.

use std::io::BufRead;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use transfer::auth::{KeySetting, SessionKey};
use transfer::filter::Filter;
use transfer::receiver::{Receiver, ReceiverSettings};
use transfer::sender::Progress;

use crate::args::{is_remote, parse_destination, Destination, Launcher, SendArgs};
use crate::recv::nearest_existing;
use crate::report::{DryRunReport, ProgressReport, RelayLine, Shown, SummaryReport};
use crate::send::{self, Interrupted, Relayed};
use crate::signals;
use crate::ssh_start::{Lifeline, RemoteReceiver, RemoteSender, SshHost, SshStart};

/// How long a pull's receiver here may take to close its session once the sender reported
/// its end.
const CLOSE_GRACE: Duration = Duration::from_secs(30);

/// What the sender started over ssh is to do.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    /// The receiver's host as the sender connects to it; none: the address the ssh connection
    /// came from (the host that asked, for a pull).
    host: Option<String>,
    /// The receiver's port.
    port: u16,
    /// Directory under the receiver's root the files go to.
    dest: String,
    /// The receiver's one-time key.
    key: String,
    /// What to send, on the sender's host.
    paths: Vec<String>,
    /// Which files of them, as the flags of the xfer that asked chose them (a `--files-from`
    /// list is read there).
    filter: Filter,
    /// Every other option, as given there.
    args: SendArgs,
}

/// Runs a transfer from `paths` on `source` (`[USER@]HOST` for ssh) to `destination`: a
/// directory here (a pull) or `[USER@]HOST:DIR` (a third-party transfer).
pub fn run(
    args: &SendArgs,
    source: String,
    paths: Vec<String>,
    destination: &str,
) -> anyhow::Result<()> {
    let started = Started::start(args, source, paths, destination)?;
    let mut shown = Shown::new(args, false, started.receiving.verb())?;
    let lifelines = started.lifelines();
    // The first signal cuts the ssh channels, which ends the xfer at their other ends (what
    // the receiver verified is kept).
    let interrupted = signals::stop_on_first(move || lifelines.iter().for_each(Lifeline::cut))?;
    let mut latest = Progress::default();
    let (ended, receiving) = started.follow(|report| match report {
        Report::Progress(report) => {
            latest = report.progress();
            shown.progress(&report)
        }
        Report::DryRun(report) => shown.dry_run(&report),
        Report::Interval { record, line } => shown.interval(record, line),
        Report::Notice(text) => shown.notice(&text),
    })?;
    shown.finish();
    if let (Some(&signal), false) = (interrupted.get(), ended.done()) {
        return Err(Interrupted::at(signal, &latest, true).into());
    }
    ended.check()?;
    receiving.finish()?;
    match ended.summary {
        Some(summary) => shown.summary(&summary),
        None => Ok(()),
    }
}

/// A transfer whose sender xfer started over ssh (or srun, for the head of a striped
/// transfer), running: the sender and its receiver.
pub struct Started {
    source: SshHost,
    sender: RemoteSender,
    /// Its receiver, here or on a third host.
    pub receiving: Receiving,
}

/// What a sender started over ssh reported as it ran, besides its summary.
pub enum Report {
    /// How far it got.
    Progress(ProgressReport),
    /// What a dry run found.
    DryRun(DryRunReport),
    /// One monitoring interval: its MI-log record and its `--verbose` line.
    Interval {
        /// The MI-log record.
        record: serde_json::Value,
        /// The `--verbose` line.
        line: String,
    },
    /// A warning.
    Notice(String),
}

/// How a sender started over ssh ended.
pub struct Ended {
    /// Its exit status, as ssh passed it on.
    pub status: std::process::ExitStatus,
    /// Its summary, if it printed one.
    pub summary: Option<SummaryReport>,
    /// It reported a dry run.
    dry_run: bool,
    /// `[USER@]HOST` it ran on.
    target: String,
}

impl Ended {
    /// It reported its end: a summary or a dry run.
    pub fn done(&self) -> bool {
        self.summary.is_some() || self.dry_run
    }

    /// Fails unless it succeeded and reported its end.
    pub fn check(&self) -> anyhow::Result<()> {
        if !self.status.success() || !self.done() {
            bail!(
                "the sender on {} failed ({}); its messages are above",
                self.target,
                self.status
            );
        }
        Ok(())
    }
}

impl Started {
    /// Starts the receiver `destination` names (here, or over ssh on a third host), then the
    /// sender of `paths` on `source` over ssh, which connects to it.
    pub fn start(
        args: &SendArgs,
        source: String,
        paths: Vec<String>,
        destination: &str,
    ) -> anyhow::Result<Started> {
        if args.key_file.is_some() {
            bail!(
                "--key-file is for a running receiver; the receiver of a transfer from {source} \
                 is started for it with a one-time key"
            );
        }
        // Checked here before anything starts, and once more by the sender there.
        let filter = send::remote_sending(args, &source)?.2.filter;
        let source = SshHost {
            ssh_command: args.ssh_command.clone(),
            target: source,
            remote_xfer: args.remote_xfer.clone(),
        };
        let receiving = Receiving::start(args, &source, destination)?;
        let (host, port, dest, key) = receiving.address();
        let request = Request {
            host,
            port,
            dest,
            key,
            paths,
            filter,
            args: forwarded(args),
        };
        let request = serde_json::to_string(&request).context("writing the request")?;
        let sender = match args.launcher {
            Launcher::Ssh => source.start_sender(&request)?,
            Launcher::Srun => crate::srun_start::start_sender(
                &source.target,
                &args.remote_xfer,
                args.munge_socket.as_deref(),
                &request,
            )?,
        };
        Ok(Started {
            source,
            sender,
            receiving,
        })
    }

    /// The ssh channels, whose cutting ends the xfer at their other ends.
    pub fn lifelines(&self) -> Vec<Lifeline> {
        let mut lifelines = vec![self.sender.lifeline()];
        lifelines.extend(self.receiving.lifeline());
        lifelines
    }

    /// Hands each report of the sender to `on` until its output ends; how it ended, and the
    /// receiver (still to be finished after a success).
    pub fn follow(
        mut self,
        mut on: impl FnMut(Report) -> anyhow::Result<()>,
    ) -> anyhow::Result<(Ended, Receiving)> {
        let target = &self.source.target;
        let mut summary = None;
        let mut dry_run = false;
        for line in self.sender.lines.by_ref() {
            let line = line.context("reading from ssh")?;
            let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) else {
                // A login script's words: not a report.
                eprintln!("{target}: {line}");
                continue;
            };
            match value["type"].as_str() {
                Some("progress") => on(Report::Progress(
                    serde_json::from_value(value).context("a progress report of the sender")?,
                ))?,
                Some("summary") => {
                    summary = Some(
                        serde_json::from_value::<SummaryReport>(value)
                            .context("the summary of the sender")?,
                    );
                }
                Some("dry_run") => {
                    dry_run = true;
                    on(Report::DryRun(
                        serde_json::from_value(value).context("the dry run of the sender")?,
                    ))?;
                }
                Some("interval" | "notice") => {
                    match serde_json::from_value(value).context("a report of the sender")? {
                        RelayLine::Interval { record, line } => {
                            on(Report::Interval { record, line })?
                        }
                        RelayLine::Notice { text } => on(Report::Notice(text))?,
                    }
                }
                _ => eprintln!("{target}: {line}"),
            }
        }
        let ended = Ended {
            status: self.sender.exit_status()?,
            summary,
            dry_run,
            target: self.source.target,
        };
        Ok((ended, self.receiving))
    }
}

/// Serves the transfer another xfer asked this one, started over ssh or srun, to send (`xfer
/// send --over-ssh`, `--over-srun`): the [`Request`] read from stdin (over ssh) or already
/// opened (`opened`, over srun), and sends, reporting on stdout.
pub fn serve(opened: Option<String>) -> anyhow::Result<()> {
    let line = match opened {
        Some(line) => line,
        None => {
            let mut line = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut line)
                .context("reading the transfer from the ssh channel")?;
            line
        }
    };
    let request: Request = serde_json::from_str(&line).context(
        "the transfer the xfer that started this sender asked for (are both the same version?)",
    )?;
    crate::ssh_start::exit_when_stdin_closes("xfer that started this sender");
    let host = match request.host {
        Some(host) => host,
        None => ssh_client()?,
    };
    let addr = match host.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, request.port).to_string(),
        Err(_) => format!("{host}:{}", request.port),
    };
    let relayed = Relayed {
        key: SessionKey::from_text(&request.key).context("the receiver's key")?,
        filter: request.filter,
    };
    let destination = Destination::Direct {
        addr,
        dest: request.dest,
    };
    send::push(&request.args, &request.paths, destination, Some(relayed))
}

/// The address the ssh connection to this host came from (`SSH_CONNECTION`'s first field).
fn ssh_client() -> anyhow::Result<String> {
    let connection = std::env::var("SSH_CONNECTION")
        .context("SSH_CONNECTION is not set: `xfer send --over-ssh` is run by xfer over ssh")?;
    connection
        .split_whitespace()
        .next()
        .map(str::to_string)
        .context("SSH_CONNECTION names no client address")
}

/// The options the sender there runs with: these, without what only this side uses (the MI
/// log, metrics, the files list, which is read here) and quiet about the defaults, which were
/// announced here.
fn forwarded(args: &SendArgs) -> SendArgs {
    SendArgs {
        args: Vec::new(),
        mi_log: None,
        metrics: None,
        files_from: None,
        listen: None,
        verbose: false,
        quiet: true,
        ..args.clone()
    }
}

/// The receiving side of a transfer whose sender is remote.
pub enum Receiving {
    /// A receiver in this process (a pull).
    Here(LocalReceiver),
    /// One started over ssh on a third host.
    There(RemoteReceiver),
}

impl Receiving {
    /// Starts the receiver `destination` names: here for a directory, over ssh for
    /// `[USER@]HOST:DIR`.
    fn start(args: &SendArgs, source: &SshHost, destination: &str) -> anyhow::Result<Receiving> {
        if !is_remote(destination) {
            let family = source.host_address()?.1;
            let local = LocalReceiver::start(args, family, PathBuf::from(destination))?;
            return Ok(Receiving::Here(local));
        }
        let (target, dir) = match parse_destination(destination)? {
            Destination::Ssh { target, dir } => (target, dir),
            Destination::Direct { addr, .. } => bail!(
                "a third-party transfer goes to a receiver xfer starts over ssh for it \
                 ([USER@]HOST:DIR), whose one-time key the sender may hold; a running \
                 receiver ({addr}) would need its own key handed to {}",
                source.target
            ),
        };
        if args.listen.is_some() {
            bail!("--listen is for a pull: a third-party transfer's receiver runs on {target}");
        }
        let start = SshStart {
            host: SshHost {
                target,
                ..source.clone()
            },
            dir,
            transport: args.transport,
            direct_io: args.direct_io,
            dry_run: args.dry_run,
        };
        Ok(Receiving::There(start.start()?))
    }

    /// Where the sender connects (its host, none for the address ssh came from; the port),
    /// the directory under the receiver's root and the receiver's key.
    fn address(&self) -> (Option<String>, u16, String, String) {
        match self {
            Receiving::Here(local) => (
                local.connect_to.map(|ip| ip.to_string()),
                local.port,
                local.dest.clone(),
                local.key.clone(),
            ),
            Receiving::There(remote) => (
                Some(remote.host.clone()),
                remote.addr.port(),
                remote.dest.clone(),
                remote.key_text.clone(),
            ),
        }
    }

    /// What the summary says of the bytes.
    fn verb(&self) -> &'static str {
        match self {
            Receiving::Here(_) => "received",
            Receiving::There(_) => "sent",
        }
    }

    /// The ssh channel of a receiver started over ssh.
    fn lifeline(&self) -> Option<Lifeline> {
        match self {
            Receiving::Here(_) => None,
            Receiving::There(remote) => Some(remote.lifeline()),
        }
    }

    /// After the sender reported success: waits for the receiver to end its session.
    pub fn finish(self) -> anyhow::Result<()> {
        match self {
            Receiving::Here(local) => local.finish(),
            Receiving::There(remote) => remote.finish(),
        }
    }
}

/// A pull's receiver, serving one session in this process.
pub struct LocalReceiver {
    serving: JoinHandle<std::io::Result<()>>,
    /// Its port.
    pub port: u16,
    /// The address the remote sender connects to, when `--listen` names one; none: the
    /// address the sender's host reached this one from.
    pub connect_to: Option<IpAddr>,
    /// Directory under the root the files go to: empty, unless a dry run found the directory
    /// missing and is served from the nearest one above it.
    pub dest: String,
    /// Its one-time key.
    pub key: String,
}

impl LocalReceiver {
    /// Binds a receiver for one session under `dir` (made if missing, but not for a dry run)
    /// on `--listen`, or on any port of every address of the family of `source` (the
    /// sender's host).
    pub fn start(args: &SendArgs, source: IpAddr, dir: PathBuf) -> anyhow::Result<LocalReceiver> {
        let listen = match args.listen {
            Some(addr) => addr,
            None => {
                let any: IpAddr = match source {
                    IpAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
                    IpAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
                };
                SocketAddr::new(any, 0)
            }
        };
        let (root, dest) = if args.dry_run {
            nearest_existing(&dir)
        } else {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            (dir, PathBuf::new())
        };
        let dest = dest
            .into_os_string()
            .into_string()
            .map_err(|dest| anyhow::anyhow!("{dest:?} is not UTF-8, as names sent must be"))?;
        let (key, _) = SessionKey::generate();
        let mut settings =
            ReceiverSettings::new(root, KeySetting::Text(key.clone())).listen(listen.to_string());
        settings.options.transport = args.transport;
        settings.options.direct_io = args.direct_io;
        let receiver = Receiver::bind(&settings)?;
        let port = receiver
            .local_addr()
            .context("reading the bound address")?
            .port();
        let serving = std::thread::Builder::new()
            .name("xfer-recv".into())
            .spawn(move || receiver.serve(Some(1)))
            .context("starting the receiver")?;
        Ok(LocalReceiver {
            serving,
            port,
            connect_to: (!listen.ip().is_unspecified()).then_some(listen.ip()),
            dest,
            key,
        })
    }

    /// Waits, for at most [`CLOSE_GRACE`], for the receiver to end its session.
    pub fn finish(self) -> anyhow::Result<()> {
        let deadline = Instant::now() + CLOSE_GRACE;
        while !self.serving.is_finished() {
            if Instant::now() >= deadline {
                bail!(
                    "the receiver here did not end its session within {}s of the sender's end",
                    CLOSE_GRACE.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        match self.serving.join() {
            Ok(served) => served.context("the receiver here"),
            Err(_) => bail!("the receiver here failed"),
        }
    }
}
