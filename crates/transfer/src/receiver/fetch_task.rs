//! A fetch served as a task of the receiver's runtime: a client whose key may read
//! ([`super::Access`]) asks for paths under the key's root ([`FetchRequest`]), and the receiver
//! sends them, as a sender, to the receiver the client runs for the transfer, reporting it on
//! the control connection ([`FetchReport`]) until it ends (see [`crate::sender::fetch`]).
//!
//! - Nothing outside the key's root is ever read: each path is checked as a manifest path is
//!   (relative, no `..`), resolved with its links, and refused unless it is still under the
//!   root; the walk below a directory leaves links out, as every sender's does.
//! - The sender dials nowhere but back to the address the fetch came from, unless the
//!   receiver serves third-party transfers ([`super::ReceiverOptions::third_party`]): then to
//!   the receiver the request names, with the one-time credential that receiver granted.
//! - A request that would make the receiver run a program or read a file of its own (an
//!   `external:` controller, a policy by path), or filter by more than 10,000 rules and paths,
//!   is refused; its stream counts are held to what the key's sessions may open.
//! - A fetch takes a session's places (of all sessions and of its key's) while it runs; the
//!   client closing its connection cancels the transfer.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use optimizer::ControllerSpec;
use tokio::time::Interval;

use super::control_task::{heartbeat, refuse, reply};
use super::mirror::MAX_FILTER_ENTRIES;
use super::Shared;
use crate::auth::KeySetting;
use crate::idle::Activity;
use crate::job::{SendEvent, SendJob, SenderSettings};
use crate::manifest::split_relative;
use crate::optimizer_choice::OptimizerChoice;
use crate::sender::{FetchReport, FetchRequest, Progress, SendSource};
use crate::task_io::TaskConn;
use crate::wire::Message;

/// Serves the fetch `request` (JSON) of the client at `peer`, whose key the receiver serves
/// as `tenant`, to its end.
pub(super) async fn serve(
    shared: &Arc<Shared>,
    conn: &mut TaskConn,
    peer: SocketAddr,
    tenant: usize,
    request: String,
) {
    let served = &shared.served[tenant];
    if !served.access.reads() {
        let reason = format!(
            "{} may not fetch files (its access is {}): it can only send them here",
            served.shown(),
            served.access
        );
        return refuse(shared, conn, peer, reason).await;
    }
    let request = match serde_json::from_str::<FetchRequest>(&request) {
        Ok(request) => request,
        Err(e) => {
            let reason = format!("a fetch request that does not read: {e}");
            return refuse(shared, conn, peer, reason).await;
        }
    };
    let paths = request.paths.len();
    let bounds = Bounds {
        root: &served.root,
        max_streams: served.limits.max_streams,
        third_party: shared.options.third_party,
    };
    // Resolving the paths reads the file system: off the runtime's workers.
    let settings = match tokio::task::block_in_place(|| settings(&bounds, peer, request)) {
        Ok(settings) => settings,
        Err(reason) => return refuse(shared, conn, peer, reason).await,
    };
    let tenant_name = served.name.clone();
    tracing::info!(%peer, tenant = tenant_name, paths, "fetch started");
    // The client says nothing more until it goes, however long the transfer takes: only the
    // connection's end is watched for, not its silence.
    conn.watch(Activity::new(), Duration::MAX);
    let (settings, dry_run, capped) = settings;
    if let Some(text) = capped {
        if send(conn, &FetchReport::Notice { text }).await.is_err() {
            return;
        }
    }
    let mut beats = heartbeat();
    let last = match dry_run {
        true => preview(conn, &mut beats, settings).await,
        false => run(conn, &mut beats, settings).await,
    };
    match &last {
        Some(FetchReport::Failed { error }) => {
            tracing::warn!(%peer, tenant = tenant_name, %error, "fetch failed")
        }
        Some(_) => tracing::info!(%peer, tenant = tenant_name, "fetch complete"),
        None => tracing::warn!(%peer, tenant = tenant_name, "fetch cancelled by its client"),
    }
    if let Some(last) = last {
        let _ = send(conn, &last).await;
    }
}

/// What a fetch may reach and take: its key's root (canonical) and stream limit, and whether
/// it may name another receiver.
struct Bounds<'a> {
    root: &'a Path,
    max_streams: u32,
    third_party: bool,
}

/// The sender's settings for `request` from `peer` within `bounds`, whether it is a dry run
/// and what the client is told of how it was bounded, or why it is refused.
fn settings(
    bounds: &Bounds<'_>,
    peer: SocketAddr,
    mut request: FetchRequest,
) -> Result<(SenderSettings, bool, Option<String>), String> {
    let named = match &request.optimizer {
        Some(OptimizerChoice::External(_)) => Some("runs an agent of its own"),
        Some(OptimizerChoice::Ppo(Some(_)) | OptimizerChoice::Auto(Some(_))) => {
            Some("reads a policy from a file")
        }
        _ => None,
    };
    if let (Some(why), Some(choice)) = (named, &request.optimizer) {
        return Err(format!(
            "the optimizer {choice} {why} on the host that sends; a fetch may choose gd, bo, \
             fixed:N, schedule:..., ppo or auto"
        ));
    }
    let filter = &request.options.filter;
    let entries = filter.rules.len() + filter.files_from.as_ref().map_or(0, Vec::len);
    if entries > MAX_FILTER_ENTRIES {
        return Err(format!(
            "a filter of {entries} rules and paths is more than the {MAX_FILTER_ENTRIES} a \
             fetch may have"
        ));
    }
    if request.paths.is_empty() {
        return Err("a fetch names no path to send".into());
    }
    let paths = (request.paths.iter())
        .map(|path| confined(bounds.root, path))
        .collect::<Result<Vec<_>, _>>()?;
    let capped = cap_streams(&mut request, bounds.max_streams);
    let receiver = match request.to {
        Some(_) if !bounds.third_party => {
            return Err(
                "this daemon sends only to the host that asks (third_party is off in \
                        its options): fetch from it to a directory there"
                    .into(),
            )
        }
        Some(to) => to,
        None => SocketAddr::new(peer.ip(), request.port).to_string(),
    };
    let source = SendSource::Paths {
        paths,
        destination: request.destination.into(),
    };
    let mut settings = SenderSettings::new(receiver, KeySetting::Text(request.key), source);
    settings.optimizer = request.optimizer;
    settings.tuning = request.tuning;
    settings.seed = request.seed;
    settings.options = request.options;
    Ok((settings, request.dry_run, capped))
}

/// The paths a daemon serving `root` (canonical) would send for `request`, through the same
/// checks as a fetch's, or why it is refused; with the stream counts it would run with.
#[cfg(feature = "fuzzing")]
pub(crate) fn fetch_for_fuzzing(
    root: &Path,
    request: FetchRequest,
) -> Result<(Vec<PathBuf>, usize, u32), String> {
    let bounds = Bounds {
        root,
        max_streams: 8,
        third_party: false,
    };
    let peer = SocketAddr::from(([127, 0, 0, 1], 9));
    let (settings, _, _) = settings(&bounds, peer, request)?;
    match settings.source {
        SendSource::Paths { paths, .. } => {
            Ok((paths, settings.options.streams, settings.tuning.max_streams))
        }
        _ => Err("a fetch sends paths".into()),
    }
}

/// Holds every stream count `request` names (to start with, the controller's ceiling, a fixed
/// count or a timetable's) to `max`, the most this key's sessions may open, as a receiver's
/// limit holds a push's; says so when it lowered one.
fn cap_streams(request: &mut FetchRequest, max: u32) -> Option<String> {
    let max_count = max as usize;
    let asked = (request.options.streams)
        .max(request.tuning.max_streams as usize)
        .max(match &request.optimizer {
            Some(OptimizerChoice::Builtin(ControllerSpec::Fixed(n))) => *n,
            _ => 0,
        });
    request.options.streams = request.options.streams.min(max_count);
    request.tuning.max_streams = request.tuning.max_streams.min(max);
    request.optimizer = match request.optimizer.take() {
        Some(OptimizerChoice::Builtin(ControllerSpec::Fixed(n))) => Some(OptimizerChoice::Builtin(
            ControllerSpec::Fixed(n.min(max_count)),
        )),
        Some(OptimizerChoice::Builtin(ControllerSpec::Schedule(s))) => Some(
            OptimizerChoice::Builtin(ControllerSpec::Schedule(s.capped(max_count))),
        ),
        other => other,
    };
    (asked > max_count)
        .then(|| format!("this key's sessions open at most {max} streams: the fetch keeps to them"))
}

/// `path` (relative to `root`, which is canonical) resolved, if it is under `root`.
fn confined(root: &Path, path: &str) -> Result<PathBuf, String> {
    let components = split_relative(path.as_bytes(), false).map_err(|e| e.to_string())?;
    let joined: PathBuf = root.join(components.iter().collect::<PathBuf>());
    // The same answer for what is missing and what is outside: neither is there to fetch.
    let missing = || format!("{path}: no such file or directory under the root");
    let resolved = std::fs::canonicalize(&joined).map_err(|_| missing())?;
    match resolved.starts_with(root) {
        true => Ok(resolved),
        false => Err(missing()),
    }
}

/// Runs the transfer, reporting it to the client, until it ends (its last report, to send)
/// or the client goes (`None`: the transfer is cancelled).
async fn run(
    conn: &mut TaskConn,
    beats: &mut Interval,
    settings: SenderSettings,
) -> Option<FetchReport> {
    // Starting builds the controller (a policy is loaded): off the runtime's workers.
    let mut job = match tokio::task::block_in_place(|| SendJob::start(settings)) {
        Ok(job) => job,
        Err(e) => {
            return Some(FetchReport::Failed {
                error: e.to_string(),
            })
        }
    };
    // A progress report waits for the streams' counters that follow it.
    let mut progress: Option<Progress> = None;
    let progressed = |progress, streams| Out::Report(FetchReport::Progress { progress, streams });
    loop {
        let out = tokio::select! {
            event = job.next_event() => match event {
                Some(SendEvent::Progress(p)) => match progress.replace(p) {
                    Some(before) => progressed(before, Vec::new()),
                    None => continue,
                },
                Some(SendEvent::Streams(streams)) => match progress.take() {
                    Some(p) => progressed(p, streams),
                    None => continue,
                },
                Some(SendEvent::Started { transport, optimizer, .. }) => {
                    Out::Report(FetchReport::Started { transport, optimizer })
                }
                Some(SendEvent::Notice(text)) => Out::Report(FetchReport::Notice { text }),
                Some(SendEvent::Decision(record)) => Out::Report(FetchReport::interval(&record)),
                Some(SendEvent::Finished(Ok(summary))) => {
                    return Some(FetchReport::Finished { summary })
                }
                Some(SendEvent::Finished(Err(e))) => {
                    return Some(FetchReport::Failed { error: e.to_string() })
                }
                None => return Some(FetchReport::Failed {
                    error: "the sender ended without a word".into(),
                }),
            },
            // The client says nothing after its request: whatever comes, or its end, means it
            // is gone.
            _ = conn.next_message() => Out::Gone,
            _ = beats.tick() => Out::Beat,
        };
        let sent = match out {
            Out::Report(report) => {
                // A report says the receiver is there as well as a heartbeat does.
                beats.reset();
                send(conn, &report).await
            }
            Out::Beat => reply(conn, &Message::Working)
                .await
                .map_err(|e| e.to_string()),
            Out::Gone => Err("the client went".into()),
        };
        if sent.is_err() {
            job.cancel();
            let _ = job.finish().await;
            return None;
        }
    }
}

/// What the connection carries next while the transfer runs.
enum Out {
    /// A report.
    Report(FetchReport),
    /// The heartbeat: nothing else was said for a while.
    Beat,
    /// The client closed its connection, or broke the rules by speaking.
    Gone,
}

/// A dry run of the fetch, with the heartbeat while it plans: what a run would do, or `None`
/// if the client went.
async fn preview(
    conn: &mut TaskConn,
    beats: &mut Interval,
    settings: SenderSettings,
) -> Option<FetchReport> {
    let mut previewing = tokio::task::spawn_blocking(move || {
        let key = settings.key.key().map_err(|e| e.to_string())?;
        crate::sender::preview(&settings.receiver, key, settings.source, settings.options)
            .map_err(|e| e.to_string())
    });
    loop {
        tokio::select! {
            previewed = &mut previewing => return Some(match previewed {
                Ok(Ok(preview)) => FetchReport::Previewed { preview },
                Ok(Err(error)) => FetchReport::Failed { error },
                Err(e) => FetchReport::Failed {
                    error: format!("the dry run failed: {e}"),
                },
            }),
            // A dry run changes nothing: once the client is gone it may finish unheard.
            _ = conn.next_message() => return None,
            _ = beats.tick() => {
                reply(conn, &Message::Working).await.ok()?;
            }
        }
    }
}

/// Writes `report` to the client.
async fn send(conn: &mut TaskConn, report: &FetchReport) -> Result<(), String> {
    let report = serde_json::to_string(report).map_err(|e| e.to_string())?;
    reply(conn, &Message::Fetched { report })
        .await
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_confined_to_the_root_whatever_links_it_goes_through() {
        let site = tempfile::tempdir().unwrap();
        let root = site.path().join("root");
        std::fs::create_dir_all(root.join("data/run")).unwrap();
        std::fs::write(site.path().join("secret"), b"not yours").unwrap();
        std::os::unix::fs::symlink(site.path().join("secret"), root.join("out")).unwrap();
        std::os::unix::fs::symlink("run", root.join("data/in")).unwrap();
        let root = root.canonicalize().unwrap();
        assert_eq!(confined(&root, "data/in").unwrap(), root.join("data/run"));
        for refused in [
            "out",
            "../secret",
            "/etc/passwd",
            "data/../../secret",
            "missing",
            "",
        ] {
            assert!(confined(&root, refused).is_err(), "{refused}");
        }
        let told = confined(&root, "out").unwrap_err();
        assert_eq!(told, "out: no such file or directory under the root");
    }
}
