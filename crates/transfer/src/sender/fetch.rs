//! Fetching from a daemon (`xfer send HOST:PORT:PATH... DIR`): the client proves a key the
//! daemon serves with read access, asks it to send paths from under that key's root
//! ([`FetchRequest`]) to a receiver the client runs for this one transfer, and reads the
//! daemon's reports of the transfer ([`FetchReport`]) until it ends. A third-party transfer
//! between daemons (`xfer send HOSTA:PORT:PATH... HOSTB:PORT:DEST`) asks B for a one-time
//! credential first ([`grant`]) and names B in the request instead.
//!
//! The data goes as in any transfer: the daemon runs a sender, whose streams connect to the
//! client's receiver, at the address the fetch came from and the port the request names, with
//! the one-time key the request hands it. The daemon never receives the client's own key, and
//! dials nowhere but back to the host that asked.
//!
//! ```text
//! client                                    daemon
//! Hello / Challenge / Auth / Welcome ◀──▶  (a key with read access)
//! Fetch (the request, as JSON) ──────────▶  paths confined under the key's root
//!       ◀────────────────────────────────── Fetched (a report, as JSON), every second ...
//!       ◀────────────────────────────────── Fetched (finished, failed or previewed)
//! ```
//!
//! Request and reports travel as JSON inside their frames: the same text a service's
//! configuration reads these options in, durations and rates included.

use std::io::BufReader;
use std::net::{Shutdown, TcpStream};

use serde::{Deserialize, Serialize};

use super::{open_control, read_answer, resolve, Config, ControlLink, SendError, SendOptions};
use super::{MiRecord, Preview, Progress, StreamSample, Summary};
use crate::auth::SessionKey;
use crate::link::{LinkReader, PollRead};
use crate::optimizer_choice::{OptimizerChoice, Tuning};
use crate::seal::FrameWriter;
use crate::transport::Transport;
use crate::wire::{self, FrameReader, Message};

/// What a client asks a daemon to send ([`Message::Fetch`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct FetchRequest {
    /// Files and directories under the key's root (relative, `/`-separated), each sent as a
    /// push sends its sources.
    pub paths: Vec<String>,
    /// The port of the receiver that takes the files, on the host the fetch comes from.
    pub port: u16,
    /// Another receiver that takes the files instead (`HOST:PORT`, a third-party transfer),
    /// if the daemon allows it ([`crate::receiver::ReceiverOptions::third_party`]); `port` is
    /// then unused.
    pub to: Option<String>,
    /// That receiver's key, made for this transfer (a one-time credential it granted, for
    /// another receiver: see [`grant`]).
    pub key: String,
    /// The directory under that receiver's root the files go to (empty: its root).
    pub destination: String,
    /// The controller that chooses the stream count; `None`: the daemon's default, `auto`.
    /// One that names a file or a program (`ppo:PATH`, `auto:PATH`, `external:SOCKET`) is
    /// refused: they would be the daemon's.
    pub optimizer: Option<OptimizerChoice>,
    /// How the controller measures and judges.
    pub tuning: Tuning,
    /// Seeds the controller's random choices.
    pub seed: u64,
    /// How to send.
    pub options: SendOptions,
    /// Plan only (`--dry-run`): the daemon previews the transfer and reports what it would
    /// do, sending nothing.
    pub dry_run: bool,
}

impl FetchRequest {
    /// A request for `paths`, sent to the receiver on `port` that holds `key`, with every
    /// default.
    pub fn new(paths: Vec<String>, port: u16, key: String) -> FetchRequest {
        FetchRequest {
            paths,
            port,
            to: None,
            key,
            destination: String::new(),
            optimizer: None,
            tuning: Tuning::default(),
            seed: 0,
            options: SendOptions::default(),
            dry_run: false,
        }
    }
}

/// One report of a transfer a daemon runs for a fetch ([`Message::Fetched`]), as its
/// [`crate::SendEvent`]s tell it; the last is `Finished`, `Failed` or `Previewed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum FetchReport {
    /// Connected and authenticated to the client's receiver.
    Started {
        /// The transport its streams use.
        transport: Transport,
        /// The controller choosing the stream count.
        optimizer: String,
    },
    /// Something that did not stop the transfer.
    Notice {
        /// What.
        text: String,
    },
    /// Bytes, files and streams so far, with each open stream's counters.
    Progress {
        /// The transfer's progress.
        progress: Progress,
        /// Its streams, when they were sampled with it.
        streams: Vec<StreamSample>,
    },
    /// One monitoring interval.
    Interval {
        /// Its MI-log record, as a push writes it.
        record: serde_json::Value,
        /// Its line, as `--verbose` shows it ([`MiRecord::line`]).
        line: String,
    },
    /// The transfer completed.
    Finished {
        /// Its summary.
        summary: Summary,
    },
    /// The transfer failed, or was refused before it started.
    Failed {
        /// Why.
        error: String,
    },
    /// What a run would do (a dry run's only report).
    Previewed {
        /// The dry run's finding.
        preview: Preview,
    },
}

impl FetchReport {
    /// The report of one interval.
    pub fn interval(record: &MiRecord) -> FetchReport {
        FetchReport::Interval {
            record: serde_json::to_value(record).unwrap_or_default(),
            line: record.line(),
        }
    }

    /// Whether it is the last of a fetch.
    pub fn ends(&self) -> bool {
        matches!(
            self,
            FetchReport::Finished { .. }
                | FetchReport::Failed { .. }
                | FetchReport::Previewed { .. }
        )
    }
}

/// A fetch under way: the daemon's reports, read one by one.
pub struct Fetching {
    reader: FrameReader<BufReader<LinkReader<PollRead>>>,
    /// Kept open while the fetch runs: the daemon cancels its transfer when it closes.
    _writer: FrameWriter<crate::link::LinkWriter>,
    socket: TcpStream,
    config: Config,
}

/// Ends a fetch from another thread (a signal handler's): the daemon cancels its transfer.
pub struct FetchCanceller(TcpStream);

impl FetchCanceller {
    /// Closes the connection to the daemon, which cancels its transfer; the client's receiver
    /// keeps what it verified, so fetching again sends only the rest.
    pub fn cancel(&self) {
        let _ = self.0.shutdown(Shutdown::Both);
    }
}

impl Fetching {
    /// The daemon's next report (its heartbeats skipped); the connection's end, or a refusal,
    /// as an error.
    pub fn next_report(&mut self) -> Result<FetchReport, SendError> {
        match read_answer(&mut self.reader, &self.config)? {
            Message::Fetched { report } => serde_json::from_str(&report).map_err(|e| {
                SendError::Protocol(format!("a report of the daemon that does not read: {e}"))
            }),
            Message::Refused { reason } | Message::Error { message: reason } => {
                Err(SendError::refused(reason))
            }
            other => Err(SendError::Protocol(format!(
                "unexpected {} from the daemon of a fetch",
                crate::auth::name(&other)
            ))),
        }
    }

    /// A handle that cancels the fetch from another thread.
    pub fn canceller(&self) -> Result<FetchCanceller, SendError> {
        let socket = self.socket.try_clone();
        socket
            .map(FetchCanceller)
            .map_err(|e| SendError::system("clone the connection to the daemon", e))
    }
}

/// Asks the receiver at `receiver` (`HOST:PORT`), whose key `key` is, with write access, for a
/// one-time credential with which another host may send one session of files to `dest` under
/// that key's root ([`Message::Grant`]): the key to hand to that host, never `key` itself. The
/// receiver accepts it once, within [`crate::wire::GRANT_LIFETIME`].
pub fn grant(
    receiver: &str,
    key: SessionKey,
    dest: &str,
    options: &SendOptions,
) -> Result<String, SendError> {
    let config = Config {
        addr: receiver.to_string(),
        key,
        options: options.clone(),
    };
    let ControlLink {
        mut reader,
        mut writer,
        ..
    } = open_control(&resolve(&config.addr)?, &config)?;
    let dest = dest.as_bytes().to_vec();
    wire::write_message(&mut writer, &Message::Grant { dest }).map_err(|e| config.lost(e))?;
    match read_answer(&mut reader, &config)? {
        Message::Granted { key } => Ok(key),
        Message::Refused { reason } | Message::Error { message: reason } => {
            Err(SendError::refused(reason))
        }
        other => Err(SendError::Protocol(format!(
            "unexpected {} in answer to a Grant",
            crate::auth::name(&other)
        ))),
    }
}

/// Asks the daemon at `daemon` (`HOST:PORT`), whose key `key` is, to send what `request`
/// names; returns once the daemon took the request, to read its reports from.
///
/// The control connection is made as a sender's would be, with `request.options`' TLS and
/// integrity; a key without read access, a path outside the key's root and a request the
/// daemon will not run are refused in the first report read (as an error).
pub fn fetch(daemon: &str, key: SessionKey, request: &FetchRequest) -> Result<Fetching, SendError> {
    request.options.check()?;
    let config = Config {
        addr: daemon.to_string(),
        key,
        options: request.options.clone(),
    };
    let ControlLink {
        socket,
        reader,
        mut writer,
        ..
    } = open_control(&resolve(&config.addr)?, &config)?;
    let request = serde_json::to_string(request)
        .map_err(|e| SendError::Settings(format!("the fetch request does not write: {e}")))?;
    wire::write_message(&mut writer, &Message::Fetch { request }).map_err(|e| config.lost(e))?;
    Ok(Fetching {
        reader,
        _writer: writer,
        socket,
        config,
    })
}
