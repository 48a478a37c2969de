//! Pair tests of the control session: the sender's rules ([`Planner`]) against the receiver's
//! ([`ControlSession`]) with the receiver's files in memory, no socket and no thread. The
//! exchange runs as the live one does: the sender announces its manifest a batch at a time, the
//! receiver plans each batch from what it holds, the ranges the sender queues "arrive" whole,
//! each file is sealed once all of it arrived, and the session finishes once every file is
//! in place. A fault between the two (a message dropped, changed or invented) is injected by
//! a hook on the receiver's replies, and each side must refuse what it cannot accept.

use std::collections::VecDeque;

use crate::manifest::{FileEntry, ManifestBatch, Timestamp};
use crate::receiver::control::memory::Files;
use crate::receiver::control::ControlSession;
use crate::sender::control_session::{Action, Announced, Planner};
use crate::sender::SendError;
use crate::wire::Message;

/// The sender's manifest: files of these paths and sizes, announced `batch` at a time.
struct Manifest {
    files: Vec<(String, u64)>,
    batch: usize,
    /// Files announced so far.
    announced: usize,
}

impl Announced for Manifest {
    fn announced(&self) -> (u64, bool) {
        (self.announced as u64, self.announced == self.files.len())
    }

    fn size(&self, file: u32) -> Result<u64, SendError> {
        match self.files.get(file as usize) {
            Some((_, size)) if (file as usize) < self.announced => Ok(*size),
            _ => Err(SendError::Protocol(format!(
                "file {file} is not waiting to be sent"
            ))),
        }
    }

    fn shown(&self, file: u32) -> String {
        self.files
            .get(file as usize)
            .map_or_else(|| format!("file {file}"), |(path, _)| path.clone())
    }
}

impl Manifest {
    fn new(files: &[(&str, u64)], batch: usize) -> Manifest {
        Manifest {
            files: files.iter().map(|&(p, s)| (p.to_string(), s)).collect(),
            batch,
            announced: 0,
        }
    }

    /// The next batch to announce, if any is left.
    fn next_batch(&mut self) -> Option<Message> {
        if self.announced == self.files.len() && self.announced > 0 {
            return None;
        }
        let end = (self.announced + self.batch).min(self.files.len());
        let time = Timestamp { secs: 0, nanos: 0 };
        let files = self.files[self.announced..end]
            .iter()
            .map(|(path, size)| FileEntry {
                path: path.as_bytes().to_vec(),
                size: *size,
                mode: 0o644,
                mtime: time,
                ctime: time,
                inode: 0,
                content: None,
            })
            .collect();
        self.announced = end;
        Some(Message::Entries(ManifestBatch {
            dirs: Vec::new(),
            files,
            last: end == self.files.len(),
        }))
    }
}

/// How one session between the two ended, and what crossed.
#[derive(Debug)]
struct Run {
    /// The sender's end: completed, or its error.
    sender: Result<(), SendError>,
    /// The receiver's end, if it reached one.
    receiver: Option<Result<(), String>>,
    /// Bytes the sender counted to send, and counted as held already.
    to_send: u64,
    skipped: u64,
    /// Bytes that crossed on the (simulated) data streams.
    sent: u64,
    settled: Vec<u32>,
}

/// Runs one session of `manifest` into `files`; `tamper` sees every reply of the receiver and
/// may change it, drop it (`None`) or let it pass.
fn run(
    mut manifest: Manifest,
    files: &mut Files,
    mut tamper: impl FnMut(Message) -> Option<Message>,
) -> Run {
    let (mut planner, mut control) = (Planner::default(), ControlSession::default());
    let mut run = Run {
        sender: Err(SendError::Protocol("the session never ended".into())),
        receiver: None,
        to_send: 0,
        skipped: 0,
        sent: 0,
        settled: Vec::new(),
    };
    // What the sender writes on the control connection, in order.
    let mut outbox: VecDeque<Message> = manifest.next_batch().into_iter().collect();
    while let Some(message) = outbox.pop_front() {
        let step = control.handle(message, files);
        if let Some(end) = step.end.clone() {
            run.receiver = Some(end.map_err(|e| e.to_string()));
        }
        let Some(reply) = step.reply.and_then(&mut tamper) else {
            if run.receiver.is_some() {
                break;
            }
            continue;
        };
        let actions = match planner.handle(reply, &manifest) {
            Ok(actions) => actions,
            Err(e) => {
                run.sender = Err(e);
                break;
            }
        };
        for action in actions {
            match action {
                Action::Count { to_send, skipped } => {
                    run.to_send += to_send;
                    run.skipped += skipped;
                }
                // The data streams carry every range, and the file is sealed once all of it is
                // acknowledged.
                Action::Queue(file, ranges) => {
                    for range in ranges {
                        run.sent += range.end - range.start;
                        files.receive(file, range);
                    }
                    outbox.push_back(Message::Seal { file, blake3: None });
                }
                Action::CloseQueue => {}
                Action::Settle(file) => run.settled.push(file),
                Action::Seal(file) => outbox.push_back(Message::Seal { file, blake3: None }),
                Action::Finish => outbox.push_back(Message::Finish),
                Action::Complete => run.sender = Ok(()),
            }
        }
        // The scanner announces the next batch once the previous one is planned.
        if outbox.is_empty() || matches!(outbox.back(), Some(Message::Seal { .. })) {
            outbox.extend(manifest.next_batch());
        }
        if run.receiver.is_some() {
            break;
        }
    }
    run
}

/// A tree of files of many sizes (empty ones too), 3 to a batch.
fn tree() -> Manifest {
    Manifest::new(
        &[
            ("a", 1000),
            ("b", 0),
            ("c/d", 4096),
            ("c/e", 1),
            ("f", 70_000),
            ("g", 0),
            ("h/i/j", 12_345),
        ],
        3,
    )
}

#[test]
fn a_tree_crosses_whole_and_every_file_is_placed() {
    let mut files = Files::default();
    let run = run(tree(), &mut files, Some);
    assert!(run.sender.is_ok(), "{run:?}");
    assert_eq!(run.receiver, Some(Ok(())));
    let total = 1000 + 4096 + 1 + 70_000 + 12_345;
    assert_eq!((run.to_send, run.skipped, run.sent), (total, 0, total));
    assert_eq!(files.placed(), ["a", "b", "c/d", "c/e", "f", "g", "h/i/j"]);
    let mut settled = run.settled.clone();
    settled.sort_unstable();
    assert_eq!(
        settled,
        (0..7).collect::<Vec<_>>(),
        "every file settled once"
    );
}

#[test]
fn a_resumed_session_sends_only_what_the_receiver_lacks() {
    let mut files = Files::default();
    files.left_by_earlier_session("a", 1000, &[(0, 1000)]);
    files.left_by_earlier_session("f", 70_000, &[(0, 10_000), (30_000, 40_000)]);
    files.left_by_earlier_session("c/d", 4096, &[(0, 100)]);
    // A file rewritten at another size since: sent again whole.
    files.left_by_earlier_session("h/i/j", 99, &[(0, 99)]);
    let run = run(tree(), &mut files, Some);
    assert!(run.sender.is_ok(), "{run:?}");
    assert_eq!(run.receiver, Some(Ok(())));
    let missing = 20_000 + 3996 + 1 + 12_345;
    assert_eq!((run.to_send, run.sent), (missing, missing));
    assert_eq!(run.skipped, 1000 + 50_000 + 100);
    assert_eq!(files.held(4), 70_000);
    assert_eq!(files.placed().len(), 7);
}

#[test]
fn a_path_the_receiver_refuses_fails_both_sides_with_its_reason() {
    let manifest = Manifest::new(&[("a", 10), ("b", 10), ("/etc/passwd", 10)], 2);
    let mut files = Files::default();
    let run = run(manifest, &mut files, Some);
    let reason = "/etc/passwd: an absolute path";
    assert_eq!(run.receiver, Some(Err(format!("failed: {reason}"))));
    match run.sender {
        Err(SendError::Receiver {
            file: None,
            reason: r,
        }) => assert_eq!(r, reason),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_receiver_that_lies_is_refused_by_the_sender() {
    type Tamper = Box<dyn FnMut(Message) -> Option<Message>>;
    let cases: Vec<(&str, Tamper)> = vec![
        (
            "said done before the sender finished",
            // A receiver that claims the transfer done after the first plan.
            Box::new(|m| match m {
                Message::Finalized { .. } => Some(Message::Done),
                other => Some(other),
            }),
        ),
        (
            "finalised when it was not waiting",
            Box::new(|m| match m {
                Message::Finalized { file, error } => Some(Message::Finalized {
                    file: file + 100,
                    error,
                }),
                other => Some(other),
            }),
        ),
        (
            "a plan for files 5..",
            Box::new(|m| match m {
                Message::Plan { files, last, .. } => Some(Message::Plan {
                    first: 5,
                    files,
                    last,
                }),
                other => Some(other),
            }),
        ),
        (
            "outside a file of",
            Box::new(|m| match m {
                Message::Plan { first, files, last } => Some(Message::Plan {
                    first,
                    files: files
                        .iter()
                        .map(|_| crate::wire::FileStatus::Partial(vec![(0, 1 << 40)]))
                        .collect(),
                    last,
                }),
                other => Some(other),
            }),
        ),
        (
            "the last before the manifest's end",
            Box::new(|m| match m {
                Message::Plan { first, files, .. } => Some(Message::Plan {
                    first,
                    files,
                    last: true,
                }),
                other => Some(other),
            }),
        ),
        (
            "unexpected Ack on the control connection",
            Box::new(|m| match m {
                Message::Finalized { file, .. } => Some(Message::Ack {
                    file,
                    offset: 0,
                    len: 1,
                }),
                other => Some(other),
            }),
        ),
    ];
    for (needle, tamper) in cases {
        let mut files = Files::default();
        let run = run(tree(), &mut files, tamper);
        match &run.sender {
            Err(SendError::Protocol(e)) if e.contains(needle) => {}
            other => panic!("{needle}: {other:?}"),
        }
        assert!(
            files.placed().len() < 7,
            "{needle}: the session went on to its end"
        );
    }
}

#[test]
fn a_file_the_receiver_cannot_place_fails_the_transfer_naming_it() {
    // The seal's answer is lost in favour of a failure, as a receiver whose disk broke says.
    let mut files = Files::default();
    let run = run(tree(), &mut files, |m| match m {
        Message::Finalized { file: 2, .. } => Some(Message::Finalized {
            file: 2,
            error: Some("No space left on device".into()),
        }),
        other => Some(other),
    });
    match run.sender {
        Err(SendError::Receiver {
            file: Some(file),
            reason,
        }) => assert_eq!(
            (file.as_str(), reason.as_str()),
            ("c/d", "No space left on device")
        ),
        other => panic!("{other:?}"),
    }
}
