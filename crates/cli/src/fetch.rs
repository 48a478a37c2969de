//! Transfers from a running daemon, which sends from under the root of a key it gives read
//! access ([`transfer::sender::fetch`]):
//!
//! - a pull, `xfer send HOST:PORT:PATH... DIR`: the daemon's key (`XFER_KEY`, `--key-file`,
//!   or asked) is proven to it, and it sends the paths to a receiver run here for this one
//!   transfer with a one-time key; its sender connects back to the address the fetch came
//!   from, on that receiver's port (any free one, or the one `--listen` names, for a firewall);
//! - a third-party transfer, `xfer send HOSTA:PORT:PATH... HOSTB:PORT:DEST`: B, proven the
//!   destination's key (`XFER_KEY` or `--key-file`, as for a push), grants a one-time
//!   credential for one session to DEST, and A (the source's key: `XFER_SOURCE_KEY` or
//!   `--source-key-file`) sends there directly with it; neither daemon ever holds the other's
//!   key, and the data never passes through the host that asked.
//!
//! The daemon's reports of the transfer are shown as a push's: the bar, JSON, `--verbose`,
//! the MI log, the dry run, the summary and the exit status.

use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use transfer::auth::SessionKey;
use transfer::sender::{FetchReport, FetchRequest, Progress};

use crate::args::{is_remote, parse_destination, Destination, SendArgs};
use crate::remote_send::LocalReceiver;
use crate::report::{DryRunReport, ProgressReport, Shown, SummaryReport};
use crate::send::{self, Interrupted};
use crate::signals;

/// Fetches `paths` from the daemon at `daemon` (`HOST:PORT`) into `destination`: a directory
/// here, or `HOST:PORT:DEST` on another daemon.
pub fn run(
    args: &SendArgs,
    daemon: String,
    paths: Vec<String>,
    destination: &str,
) -> anyhow::Result<()> {
    if let Some(path) = paths.iter().find(|p| p.is_empty()) {
        bail!("{daemon}:{path} names no path: name what to fetch under the daemon's root, HOST:PORT:PATH");
    }
    let (optimizer, tuning, options) = send::remote_sending(args, &daemon)?;
    let (local, mut request, source_key) = if is_remote(destination) {
        let (to, dest) = match parse_destination(destination)? {
            Destination::Direct { addr, dest } => (addr, dest),
            Destination::Ssh { .. } => bail!(
                "a transfer from the daemon at {daemon} goes to a directory here or to another \
                 running daemon (HOST:PORT:DEST); for a host reached over ssh, run xfer send \
                 {daemon}:PATH DIR there"
            ),
        };
        if args.listen.is_some() {
            bail!("--listen is for a pull: the daemon at {to} receives this transfer");
        }
        let source_key = source_key(args)?;
        let credential = transfer::sender::grant(&to, send::session_key(args)?, &dest, &options)
            .with_context(|| format!("asking {to} for a one-time credential"))?;
        let mut request = FetchRequest::new(paths, 0, credential);
        request.to = Some(to);
        request.destination = dest;
        (None, request, source_key)
    } else {
        // The daemon's key: the source's, if given as such; else the one a push would prove.
        let named = args.source_key_file.is_some() || std::env::var_os("XFER_SOURCE_KEY").is_some();
        let key = if named {
            source_key(args)?
        } else {
            send::session_key(args)?
        };
        let address = (daemon.to_socket_addrs().ok())
            .and_then(|mut addrs| addrs.next())
            .with_context(|| format!("cannot resolve the daemon's address {daemon}"))?;
        let local = LocalReceiver::start(args, address.ip(), PathBuf::from(destination))?;
        if let Some(ip) = local.connect_to {
            bail!(
                "--listen {ip}: the daemon connects back to the address this fetch comes from; \
                 name only a port for a pull from a daemon (--listen 0.0.0.0:PORT)"
            );
        }
        let mut request = FetchRequest::new(paths, local.port, local.key.clone());
        request.destination = local.dest.clone();
        (Some(local), request, key)
    };
    request.optimizer = Some(optimizer);
    request.tuning = tuning;
    request.seed = args.seed;
    request.options = options;
    request.dry_run = args.dry_run;

    let verb = if local.is_some() { "received" } else { "sent" };
    let mut shown = Shown::new(args, false, verb)?;
    let mut fetching = transfer::sender::fetch(&daemon, source_key, &request)?;
    let canceller = fetching.canceller()?;
    // The first signal closes the connection to the daemon, which cancels its transfer (what
    // the receiver here verified is kept).
    let interrupted = signals::stop_on_first(move || canceller.cancel())?;
    let mut latest = Progress::default();
    let mut last_report = (Duration::ZERO, 0u64);
    loop {
        let report = match fetching.next_report() {
            Ok(report) => report,
            Err(e) => {
                shown.finish();
                if let Some(&signal) = interrupted.get() {
                    return Err(Interrupted::at(signal, &latest, true).into());
                }
                return Err(e).with_context(|| format!("fetching from {daemon}"));
            }
        };
        match report {
            FetchReport::Started { .. } => shown.started(),
            FetchReport::Notice { text } => shown.notice(&text)?,
            FetchReport::Progress { progress, streams } => {
                let report = ProgressReport::new(&progress, last_report, streams);
                last_report = (progress.elapsed, progress.bytes_acked);
                latest = progress;
                shown.progress(&report)?;
            }
            FetchReport::Interval { record, line } => shown.interval(record, line)?,
            FetchReport::Finished { summary } => {
                shown.finish();
                local.map(LocalReceiver::finish).transpose()?;
                return shown.summary(&SummaryReport::new(summary, args.verify, 0));
            }
            FetchReport::Previewed { preview } => {
                local.map(LocalReceiver::finish).transpose()?;
                for skipped in &preview.skipped_sources {
                    shown.notice(skipped)?;
                }
                return shown.dry_run(&DryRunReport::new(&preview));
            }
            FetchReport::Failed { error } => {
                shown.finish();
                bail!("the daemon at {daemon} could not send: {error}");
            }
            // Kinds of report a later daemon brings.
            _ => {}
        }
    }
}

/// The source daemon's key: `--source-key-file`, else `XFER_SOURCE_KEY`.
fn source_key(args: &SendArgs) -> anyhow::Result<SessionKey> {
    if let Some(path) = &args.source_key_file {
        return Ok(SessionKey::from_file(path)?);
    }
    match std::env::var("XFER_SOURCE_KEY") {
        Ok(text) => Ok(SessionKey::from_text(&text)?),
        Err(_) => bail!(
            "no key for the source daemon: a transfer from one daemon to another proves the \
             destination's key (XFER_KEY or --key-file) and the source's (XFER_SOURCE_KEY or \
             --source-key-file)"
        ),
    }
}
