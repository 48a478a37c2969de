//! `xfer send`: a transfer run as the library's [`SendJob`] when the sources are here (a push),
//! or by a sender xfer starts over ssh on the host they are on ([`crate::remote_send`]: a
//! pull, a third-party transfer), or by a third-party transfer per node pair
//! ([`crate::nodes`]: `--nodes`); shown by [`Shown`].

use std::io::IsTerminal;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use transfer::auth::SessionKey;
use transfer::filter::Filter;
use transfer::job::{SendEvent, SendJob, SenderSettings};
use transfer::optimizer::ControllerSpec;
use transfer::optimizer_choice::OptimizerChoice;
use transfer::quic::Congestion;
use transfer::sender::{Progress, SendOptions, SendSource, DEFAULT_STREAMS};
use transfer::transport::Transport;

use crate::args::{is_remote, parse_destination, Destination, SendArgs};
use crate::controllers;
use crate::report::{DryRunReport, ProgressReport, Shown, SummaryReport};
use crate::signals::{self, Signal};
use crate::ssh_start::{SshHost, SshStart};

/// How often the progress bar is updated.
const TICK: Duration = Duration::from_millis(200);
/// How often a JSON progress object is printed.
const REPORT_EVERY: Duration = Duration::from_secs(1);

/// Runs `xfer send`.
pub fn run(args: SendArgs) -> anyhow::Result<()> {
    if args.over_ssh {
        return crate::remote_send::serve(None);
    }
    if args.over_srun {
        let request = crate::srun_start::open_request(args.munge_socket.as_deref())?;
        return crate::remote_send::serve(Some(request));
    }
    let Some((destination, sources)) = args.args.split_last() else {
        bail!("missing destination HOST:PORT[:DEST] or [USER@]HOST:DIR");
    };
    if let Some(list) = &args.nodes {
        return crate::nodes::run(&args, list, sources, destination);
    }
    let remote = sources.iter().filter(|s| is_remote(s)).count();
    if remote == 0 {
        if !is_remote(destination) {
            bail!(
                "{destination:?} is a directory on this host, as are the sources: name the \
                 receiver as HOST:PORT[:DEST] (one running there) or [USER@]HOST:DIR (started \
                 over ssh), or fetch from a host with [USER@]HOST:PATH... DIR"
            );
        }
        let (sources, destination) = (sources.to_vec(), parse_destination(destination)?);
        return push(&args, &sources, destination, None);
    }
    if remote < sources.len() {
        bail!(
            "some sources are on another host and some on this one: one transfer sends from \
             one host, so send each side's files with a command of its own"
        );
    }
    // Each remote source is `[USER@]HOST:PATH` (a sender started over ssh) or
    // `HOST:PORT:PATH` (a running daemon, which sends from under its root).
    let mut host = None;
    let mut paths = Vec::new();
    for source in sources {
        let (daemon, at, path) = match parse_destination(source)? {
            Destination::Direct { addr, dest } => (true, addr, dest),
            Destination::Ssh { target, dir } => (false, target, dir),
        };
        match &host {
            Some((_, first)) if *first != at => bail!(
                "the sources are on two hosts ({first} and {at}): one transfer sends from one \
                 host"
            ),
            _ => host = Some((daemon, at)),
        }
        paths.push(path);
    }
    match host.expect("there is a remote source") {
        (true, daemon) => crate::fetch::run(&args, daemon, paths, destination),
        (false, target) => crate::remote_send::run(&args, target, paths, destination),
    }
}

/// What the xfer that started this sender over ssh gave it besides the options: the key of
/// the receiver and the files to send.
pub struct Relayed {
    /// The receiver's key.
    pub key: SessionKey,
    /// What to send, as `--include`, `--exclude` and `--files-from` chose it there.
    pub filter: Filter,
}

/// Sends `sources` from this host to `destination`, shown here or, for a sender started over
/// ssh, `relayed` back to the xfer that started it.
pub fn push(
    args: &SendArgs,
    sources: &[String],
    destination: Destination,
    relayed: Option<Relayed>,
) -> anyhow::Result<()> {
    // Over ssh, the receiver's root is the directory named, so files land directly in it.
    let (receiver, named_dir, dest) = match destination {
        Destination::Direct { addr, dest } => (Receiver::Running(addr), dest.clone(), dest),
        Destination::Ssh { target, dir } => {
            if args.key_file.is_some() {
                bail!("--key-file is for a running receiver; one started over ssh sends its key back over the ssh channel");
            }
            let start = SshStart {
                host: SshHost {
                    ssh_command: args.ssh_command.clone(),
                    target,
                    remote_xfer: args.remote_xfer.clone(),
                },
                dir: dir.clone(),
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
    let (optimizer, tuning) = optimizer_and_tuning(args)?;
    // A controller that names its count starts at it (the job sees to that).
    let initial = args.streams.map_or(DEFAULT_STREAMS, |n| n as usize);
    let mut shown = Shown::new(args, relayed.is_some(), "sent")?;
    let filter = match &relayed {
        Some(relayed) => relayed.filter.clone(),
        None => filter(args)?,
    };
    let options = send_options(args, initial)?.filter(filter);
    options.check()?;
    let mut source = source;
    let (addr, key, remote) = match (receiver, relayed) {
        (Receiver::Running(addr), Some(relayed)) => (addr, relayed.key, None),
        (Receiver::Running(addr), None) => (addr, session_key(args)?, None),
        (Receiver::OverSsh(start), _) => {
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
        for skipped in &seen.skipped_sources {
            shown.notice(skipped)?;
        }
        return shown.dry_run(&DryRunReport::new(&seen));
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
    let canceller = job.canceller();
    let interrupted = signals::stop_on_first(move || canceller.cancel())?;

    let mut latest = Progress::default();
    let mut last_report = (Duration::ZERO, 0u64);
    while let Some(event) = job.next_event_blocking() {
        match event {
            SendEvent::Started { .. } => shown.started(),
            SendEvent::Notice(notice) => shown.notice(&notice.to_string())?,
            SendEvent::Progress(progress) => latest = progress,
            SendEvent::Streams(streams) => {
                let report = ProgressReport::new(&latest, last_report, streams);
                last_report = (latest.elapsed, latest.bytes_acked);
                shown.progress(&report)?;
            }
            SendEvent::Decision(record) => shown.decision(&record)?,
            SendEvent::Finished(_) => break,
            _ => {}
        }
    }
    shown.finish();
    let result = job.wait();
    // A transfer the signal stopped says so (the error the cancel gave, or one of a receiver
    // over ssh that the same Ctrl-C ended); one that finished before it did is reported as any.
    if let (Some(&signal), Err(_)) = (interrupted.get(), &result) {
        return Err(Interrupted::at(signal, &latest, resumable).into());
    }
    let summary = result?;
    if let Some(remote) = remote {
        remote.finish()?;
    }
    shown.summary(&SummaryReport::new(
        summary,
        args.verify,
        crate::peak_rss_bytes(),
    ))
}

/// How the sender on `host` is to send the files named there, as the flags choose it, checked
/// here before anything starts: the controller, its tuning and the options (with the filter).
/// `--mem` and `--metrics` belong to a sender on this host, and are refused.
pub fn remote_sending(
    args: &SendArgs,
    host: &str,
) -> anyhow::Result<(
    OptimizerChoice,
    transfer::optimizer_choice::Tuning,
    SendOptions,
)> {
    if args.mem.is_some() {
        bail!("--mem sends generated data from this host; do not also name remote files");
    }
    if args.metrics.is_some() {
        bail!("--metrics serves the sender's metrics, and the sender runs on {host}");
    }
    let (optimizer, tuning) = optimizer_and_tuning(args)?;
    let initial = args.streams.map_or(DEFAULT_STREAMS, |n| n as usize);
    let options = send_options(args, initial)?.filter(filter(args)?);
    options.check()?;
    Ok((optimizer, tuning, options))
}

/// The controller and tuning the flags choose, checked before anything starts (a receiver
/// over ssh included), as the job checks them again: tuning that cannot work stops nothing.
pub fn optimizer_and_tuning(
    args: &SendArgs,
) -> anyhow::Result<(OptimizerChoice, transfer::optimizer_choice::Tuning)> {
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
    tuning.utility_for(&[&optimizer])?;
    tuning.reward()?;
    Ok((optimizer, tuning))
}

/// The send options of the flags, starting at `initial` streams (without the filter).
pub fn send_options(args: &SendArgs, initial: usize) -> anyhow::Result<SendOptions> {
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
    Ok(SendOptions::default()
        .streams(initial)
        .unit_size(args.unit_size)
        .verify(args.verify)
        .checksum(args.checksum)
        .delete(args.delete)
        .stripe(args.stripe)
        .direct_io(args.direct_io)
        .stream_rate_cap(stream_rate_cap)
        .rate_limit(args.rate_limit.clone())
        .unsent_limit(args.unsent_limit)
        .encrypt(args.encrypt)
        .integrity(args.integrity)
        .stall_timeout(args.stall_timeout)
        .transport(args.transport)
        .congestion(congestion))
}

/// The filter `--include`, `--exclude` and `--files-from` describe.
pub fn filter(args: &SendArgs) -> anyhow::Result<Filter> {
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

impl Interrupted {
    /// A transfer `signal` stopped as far as `latest` got; of files if `resumable`.
    pub fn at(signal: Signal, latest: &Progress, resumable: bool) -> Interrupted {
        Interrupted {
            signal,
            sent: latest.bytes_acked,
            total: latest.bytes_total,
            resumable,
        }
    }
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

/// The receiver a transfer goes to.
enum Receiver {
    /// One already running at `HOST:PORT`; the key comes from the user.
    Running(String),
    /// One to start over ssh for this transfer.
    OverSsh(SshStart),
}

/// The receiver's key: from `--key-file`, else `XFER_KEY`, else asked on the terminal. A key
/// given on the command line is refused, as every user of the machine could read it in `ps`.
pub fn session_key(args: &SendArgs) -> anyhow::Result<SessionKey> {
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
