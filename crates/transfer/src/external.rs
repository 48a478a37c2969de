//! `external:SOCKET` ([`crate::optimizer_choice::OptimizerChoice::External`], `xfer send
//! --optimizer external:SOCKET`): an agent outside xfer chooses the stream count of a live
//! transfer through the environment protocol ([`optimizer::env`]) on a Unix socket, so the
//! same agent that trained on `xfer env` can act on, or fine-tune with, real transfers.
//!
//! xfer listens on SOCKET; the agent connects and sends `describe`, `reset` and `step`
//! requests. Each `reset` or `step` is answered at the end of the next monitoring interval with
//! that interval's observation; a `step`'s action is applied at once. The reward is the
//! interval's utility over the best throughput seen so far. When the transfer ends, a pending
//! request is answered with `done: true`. Until an agent connects, or while it is silent, the
//! count stays as it is and data keeps moving.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use optimizer::env::{Description, Reply, Request, RewardKind, StepInfo, StepReply};
use optimizer::policy::{FeatureHistory, ObservationLayout};
use optimizer::{Controller, Observation, RewardParams, UtilityParams};

/// How long one decision waits for the agent's next request before holding the count.
const AGENT_WAIT: Duration = Duration::from_secs(5);

/// A connected agent.
struct Agent {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// A request line read in part when the wait ran out.
    partial: String,
    /// A `reset` or `step` is waiting for the next interval's observation.
    owed: bool,
}

/// The [`Controller`] that asks an external agent. Until an agent connects, or while it is
/// silent, it keeps the count as it is.
pub struct ExternalAgent {
    listener: UnixListener,
    path: PathBuf,
    agent: Option<Agent>,
    features: FeatureHistory,
    description: Description,
    last: Option<StepReply>,
}

impl ExternalAgent {
    /// Listens on `path` (which must not exist) for an agent that controls a transfer of at
    /// most `max_streams` streams, judged by `utility` and rewarded by `reward_params`, with
    /// monitoring intervals of `interval`.
    pub fn listen(
        path: &Path,
        max_streams: usize,
        utility: UtilityParams,
        reward_params: RewardParams,
        interval: Duration,
    ) -> std::io::Result<Self> {
        let listener = UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        let layout = ObservationLayout::default();
        Ok(ExternalAgent {
            listener,
            path: path.to_path_buf(),
            agent: None,
            features: FeatureHistory::new(layout.clone()),
            description: Description {
                layout,
                utility,
                reward: RewardKind::Utility,
                reward_params,
                max_streams,
                mi: interval.as_secs_f64(),
                source: "transfer".into(),
            },
            last: None,
        })
    }

    /// Takes a waiting agent, if one connected.
    fn accept(&mut self) {
        if self.agent.is_some() {
            return;
        }
        let Ok((stream, _)) = self.listener.accept() else {
            return;
        };
        let connected = || -> std::io::Result<Agent> {
            stream.set_nonblocking(false)?;
            stream.set_read_timeout(Some(AGENT_WAIT))?;
            Ok(Agent {
                reader: BufReader::new(stream.try_clone()?),
                writer: stream,
                partial: String::new(),
                owed: false,
            })
        };
        self.agent = connected().ok();
    }

    /// Sends `reply` to the agent; drops the agent when it is gone.
    fn send(&mut self, reply: &Reply) {
        let Some(agent) = &mut self.agent else {
            return;
        };
        let mut line = serde_json::to_vec(reply).expect("replies serialise");
        line.push(b'\n');
        if agent.writer.write_all(&line).is_err() {
            self.agent = None;
        }
    }
}

impl Controller for ExternalAgent {
    fn name(&self) -> String {
        "external".into()
    }

    fn decide(&mut self, observation: &Observation) -> usize {
        let current = observation
            .streams
            .clamp(1, self.description.max_streams.max(1));
        let reply = StepReply {
            observation: self.features.push(observation),
            reward: observation.utility_ratio(),
            done: false,
            truncated: false,
            info: StepInfo {
                signals: observation.clone(),
                best_streams: None,
                utility_fraction: None,
                scenario: None,
            },
        };
        self.last = Some(reply.clone());
        self.accept();
        if self.agent.as_ref().is_some_and(|a| a.owed) {
            self.send(&Reply::Step(reply));
            if let Some(agent) = &mut self.agent {
                agent.owed = false;
            }
        }
        // Serve requests until one asks for the next interval.
        while let Some(agent) = &mut self.agent {
            match agent.reader.read_line(&mut agent.partial) {
                Ok(0) => self.agent = None,
                Ok(_) if !agent.partial.ends_with('\n') => self.agent = None,
                Ok(_) => {
                    let line = std::mem::take(&mut agent.partial);
                    if line.trim().is_empty() {
                        continue;
                    }
                    match serde_json::from_str::<Request>(&line) {
                        Ok(Request::Describe) => {
                            let d = Reply::Description(self.description.clone());
                            self.send(&d);
                        }
                        Ok(Request::Reset { .. }) => {
                            agent.owed = true;
                            return current;
                        }
                        Ok(Request::Step { action }) => {
                            let max = self.description.max_streams;
                            match self.description.layout.apply_action(action, current, max) {
                                Ok(next) => {
                                    agent.owed = true;
                                    return next;
                                }
                                Err(e) => self.send(&Reply::error(e)),
                            }
                        }
                        Ok(Request::Close) => {
                            self.send(&Reply::Closed { closed: true });
                            self.agent = None;
                        }
                        Err(e) => self.send(&Reply::error(format!(
                            "bad request {:?}: {e}",
                            line.trim_end()
                        ))),
                    }
                }
                // The agent is silent: keep the count; its request is read next interval.
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return current;
                }
                Err(_) => self.agent = None,
            }
        }
        current
    }
}

impl Drop for ExternalAgent {
    /// Tells a waiting agent that the transfer is over, and removes the socket.
    fn drop(&mut self) {
        if let (Some(mut last), true) = (
            self.last.take(),
            self.agent.as_ref().is_some_and(|a| a.owed),
        ) {
            last.done = true;
            self.send(&Reply::Step(last));
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
