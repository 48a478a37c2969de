//! The rules of a session's control connection once it has started, without sockets, files or
//! clock: which message may come when, what answers it, and when the session is over. The
//! connection's task reads a message, hands it to [`ControlSession::handle`] with the
//! session's files ([`SessionFiles`]), writes the reply it gets back and stops when told; the
//! tests below, and the pair tests of `crate::pair_tests` against the sender's rules, drive
//! the same rules with files in memory ([`memory::Files`]).
//!
//! ```text
//! Entries (batch) ──▶ Plan of the batch, or Refused (fails the session); none after `last`
//! Seal (file)     ──▶ Finalized, with the reason if it could not be placed
//! Compare (files) ──▶ Compared: those kept and those whose copy differs (sent again), or
//!                     the Finalized of the first that could not be compared
//! QuicRequest     ──▶ QuicOffer (the certificate's hash), or Refused (fails the session)
//! Finish          ──▶ Done (the session completed, with what it removed), or Error
//! anything else, or a damaged frame ──▶ Error, and the session fails
//! ```

use super::destination::{DestinationError, Sealed};
use super::events::SessionOutcome;
use crate::auth;
use crate::manifest::ManifestBatch;
use crate::wire::{FileStatus, Message, Removal, WireError, BATCH_ENTRIES};

/// What a session's control messages act on: the files of its destination, and its QUIC
/// endpoint. The receiver's is the session's [`super::destination::Destination`], each long
/// step under a heartbeat.
pub(crate) trait SessionFiles {
    /// Checks and plans one batch of the manifest: its first file's number and what the
    /// receiver holds of each.
    fn add_batch(
        &mut self,
        batch: &ManifestBatch,
    ) -> Result<(u32, Vec<FileStatus>), DestinationError>;
    /// Places `file` under its final name once every byte of it is verified (and its BLAKE3
    /// matches, when given), or compares a file already in place with the source's BLAKE3.
    fn seal(&mut self, file: u32, blake3: Option<[u8; 32]>) -> Result<Sealed, DestinationError>;
    /// Checks that every file announced was sealed and, for a mirroring session, removes what
    /// the manifest does not hold (a dry run: finds what it would remove).
    fn finish(&mut self) -> Result<Removal, DestinationError>;
    /// Makes the session's QUIC certificate and returns its hash, or why QUIC cannot be had.
    fn offer_quic(&mut self) -> Result<[u8; 32], String>;
}

/// What a session's manifest announced so far, and how many of its files are in place.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ManifestSoFar {
    /// Files announced.
    pub files: u64,
    /// Bytes of the files announced.
    pub bytes: u64,
    /// Files placed under their final names.
    pub placed: u64,
    /// Files of a striped transfer whose share this session verified, left to the session
    /// that receives their last range ([`Sealed::Held`]).
    pub held: u64,
    /// The batch that said `last` came.
    pub complete: bool,
}

/// What the connection does after one message.
#[derive(Debug, PartialEq)]
pub(crate) struct Step {
    /// Written back first, when there is one.
    pub reply: Option<Message>,
    /// `None`: read the next message; otherwise the session is over, completed (`Ok`) or
    /// failed. A session that failed after its reply was written keeps that failure even if
    /// the reply could not be written: it is the better account of why it ended.
    pub end: Option<Result<(), SessionOutcome>>,
}

impl Step {
    /// Answers and reads on.
    fn reply(message: Message) -> Step {
        Step {
            reply: Some(message),
            end: None,
        }
    }

    /// Answers, then ends the session as `end` says.
    fn reply_and_end(message: Message, end: Result<(), SessionOutcome>) -> Step {
        Step {
            reply: Some(message),
            end: Some(end),
        }
    }

    /// Tells the sender why and fails the session.
    fn fail(reason: String) -> Step {
        Step::reply_and_end(
            Message::Error {
                message: reason.clone(),
            },
            Err(SessionOutcome::Failed(reason)),
        )
    }
}

/// The answer to a seal of `file` that failed with `e`: a file that could not be placed fails
/// the sender's transfer, which ends the session from its side; a sender that broke the rules
/// ends it now, as nothing more it sends can be trusted.
fn unsealed(file: u32, e: DestinationError) -> Step {
    let reply = Message::Finalized {
        file,
        error: Some(e.to_string()),
    };
    match e {
        DestinationError::Protocol(e) => Step::reply_and_end(reply, Err(SessionOutcome::Failed(e))),
        _ => Step::reply(reply),
    }
}

/// A session's control connection between `Start` and its end.
#[derive(Debug, Default)]
pub(crate) struct ControlSession {
    announced: ManifestSoFar,
}

impl ControlSession {
    /// What the manifest announced so far, for the session's report.
    pub fn announced(&self) -> ManifestSoFar {
        self.announced
    }

    /// Acts on one message from the sender.
    pub fn handle(&mut self, message: Message, files: &mut impl SessionFiles) -> Step {
        let failed = |reason: String| Err(SessionOutcome::Failed(reason));
        match message {
            Message::Entries(batch) => {
                if self.announced.complete {
                    return Step::fail("a batch of the manifest after its last".into());
                }
                match files.add_batch(&batch) {
                    Ok((first, files)) => {
                        self.announced.files += batch.files.len() as u64;
                        self.announced.bytes =
                            self.announced.bytes.saturating_add(batch.total_bytes());
                        self.announced.complete = batch.last;
                        Step::reply(Message::Plan {
                            first,
                            files,
                            last: batch.last,
                        })
                    }
                    Err(e) => Step::reply_and_end(
                        Message::Refused {
                            reason: e.to_string(),
                        },
                        failed(e.to_string()),
                    ),
                }
            }
            Message::Seal { file, blake3 } => match files.seal(file, blake3) {
                Ok(Sealed::Placed) => {
                    self.announced.placed += 1;
                    Step::reply(Message::Finalized { file, error: None })
                }
                Ok(Sealed::Held) => {
                    self.announced.held += 1;
                    Step::reply(Message::Finalized { file, error: None })
                }
                Ok(Sealed::Changed) => Step::reply(Message::Compared {
                    kept: Vec::new(),
                    changed: vec![file],
                }),
                Err(e) => unsealed(file, e),
            },
            Message::Compare { files: compared } if compared.len() > BATCH_ENTRIES => {
                Step::fail(format!(
                    "a comparison of {} files, more than {BATCH_ENTRIES}",
                    compared.len()
                ))
            }
            Message::Compare { files: compared } => {
                let (mut kept, mut changed) = (Vec::new(), Vec::new());
                for (file, blake3) in compared {
                    match files.seal(file, Some(blake3)) {
                        Ok(Sealed::Placed) => {
                            self.announced.placed += 1;
                            kept.push(file);
                        }
                        Ok(Sealed::Held) => {
                            self.announced.held += 1;
                            kept.push(file);
                        }
                        Ok(Sealed::Changed) => changed.push(file),
                        Err(e) => return unsealed(file, e),
                    }
                }
                Step::reply(Message::Compared { kept, changed })
            }
            Message::QuicRequest => match files.offer_quic() {
                Ok(certificate) => Step::reply(Message::QuicOffer { certificate }),
                Err(reason) => Step::reply_and_end(
                    Message::Refused {
                        reason: reason.clone(),
                    },
                    failed(reason),
                ),
            },
            Message::Finish => match files.finish() {
                Ok(removed) => Step::reply_and_end(Message::Done { removed }, Ok(())),
                Err(e) => Step::fail(e.to_string()),
            },
            other => Step::fail(format!(
                "unexpected {} on the control connection",
                auth::name(&other)
            )),
        }
    }

    /// A frame that arrived damaged, forged or malformed (anything but the connection
    /// breaking, which ends the session as disconnected): the sender is told why.
    pub fn damaged(&mut self, error: &WireError) -> Step {
        Step::fail(error.to_string())
    }
}

/// Files in memory for the tests of the session's rules: a destination that holds what the
/// test says arrived.
#[cfg(test)]
pub(crate) mod memory {
    use std::collections::{BTreeSet, HashMap};
    use std::ops::Range;

    use rangemap::RangeSet;

    use super::{DestinationError, Sealed, SessionFiles};
    use crate::manifest::ManifestBatch;
    use crate::wire::{FileStatus, Removal};

    /// One file announced: its path, size and the bytes held.
    #[derive(Debug)]
    struct File {
        path: Vec<u8>,
        size: u64,
        held: RangeSet<u64>,
    }

    /// A destination in memory. Paths starting with `/` are refused; a file of the same path
    /// and size that an earlier session left ([`Files::left_by_earlier_session`]) is planned
    /// from what it holds, as the journal does. Comparing by content
    /// ([`Files::compare_by_content`]), a complete one is kept when sealed unless its content
    /// was changed ([`Files::changed_since`]).
    #[derive(Debug, Default)]
    pub(crate) struct Files {
        files: Vec<File>,
        earlier: HashMap<Vec<u8>, (u64, Vec<Range<u64>>)>,
        /// Files complete when announced: never sealed (unless compared by content).
        complete: BTreeSet<u32>,
        sealed: BTreeSet<u32>,
        /// Files complete when announced are compared by content when sealed.
        by_content: bool,
        /// Paths whose copy left by the earlier session differs from the source's content.
        changed: BTreeSet<Vec<u8>>,
        /// Whether QUIC is served.
        pub quic: bool,
    }

    impl Files {
        /// What an earlier session left of `path` (of `size` bytes): these ranges (offset,
        /// length), verified.
        pub fn left_by_earlier_session(&mut self, path: &str, size: u64, held: &[(u64, u64)]) {
            let held = held.iter().map(|&(offset, len)| offset..offset + len);
            self.earlier
                .insert(path.as_bytes().to_vec(), (size, held.collect()));
        }

        /// Compare the files complete when announced by content, as a session with
        /// [`crate::wire::PresentFiles::Compared`] does.
        pub fn compare_by_content(&mut self) {
            self.by_content = true;
        }

        /// The copy of `path` an earlier session left is not the source's content (same
        /// size, other bytes).
        pub fn changed_since(&mut self, path: &str) {
            self.changed.insert(path.as_bytes().to_vec());
        }

        /// The bytes `range` of `file` arrived and were verified.
        pub fn receive(&mut self, file: u32, range: Range<u64>) {
            let file = &mut self.files[file as usize];
            assert!(
                range.end <= file.size,
                "{range:?} past the end of a file of {}",
                file.size
            );
            if !range.is_empty() {
                file.held.insert(range);
            }
        }

        /// Bytes of `file` received so far.
        pub fn held(&self, file: u32) -> u64 {
            self.files[file as usize]
                .held
                .iter()
                .map(|r| r.end - r.start)
                .sum()
        }

        /// Paths of the files in place: sealed, or complete before the session.
        pub fn placed(&self) -> Vec<String> {
            (0..self.files.len() as u32)
                .filter(|f| self.sealed.contains(f) || self.complete.contains(f))
                .map(|f| String::from_utf8_lossy(&self.files[f as usize].path).into_owned())
                .collect()
        }
    }

    impl SessionFiles for Files {
        fn add_batch(
            &mut self,
            batch: &ManifestBatch,
        ) -> Result<(u32, Vec<FileStatus>), DestinationError> {
            if let Some(bad) = batch.files.iter().find(|f| f.path.starts_with(b"/")) {
                return Err(DestinationError::Refused(format!(
                    "{}: an absolute path",
                    String::from_utf8_lossy(&bad.path)
                )));
            }
            let first = self.files.len() as u32;
            let mut plan = Vec::new();
            for (file, entry) in (first..).zip(&batch.files) {
                let mut held = RangeSet::new();
                match self.earlier.get(&entry.path) {
                    Some((size, ranges)) if *size == entry.size => {
                        for r in ranges.iter().filter(|r| !r.is_empty()) {
                            held.insert(r.clone());
                        }
                    }
                    _ => {}
                }
                let whole = held.gaps(&(0..entry.size)).next().is_none();
                plan.push(match held.iter().next() {
                    _ if whole && entry.size > 0 => {
                        self.complete.insert(file);
                        FileStatus::Complete
                    }
                    None => FileStatus::Missing,
                    Some(_) => FileStatus::Partial(
                        held.iter().map(|r| (r.start, r.end - r.start)).collect(),
                    ),
                });
                self.files.push(File {
                    path: entry.path.clone(),
                    size: entry.size,
                    held,
                });
            }
            Ok((first, plan))
        }

        fn seal(
            &mut self,
            file: u32,
            blake3: Option<[u8; 32]>,
        ) -> Result<Sealed, DestinationError> {
            let Some(f) = self.files.get_mut(file as usize) else {
                return Err(DestinationError::Protocol(format!(
                    "no file {file} to seal"
                )));
            };
            if self.by_content && self.complete.contains(&file) {
                if blake3.is_none() {
                    return Err(DestinationError::Protocol(format!(
                        "file {file} compared without its hash"
                    )));
                }
                self.complete.remove(&file);
                if self.changed.contains(&f.path) {
                    f.held = RangeSet::new();
                    return Ok(Sealed::Changed);
                }
                self.sealed.insert(file);
                return Ok(Sealed::Placed);
            }
            if self.sealed.contains(&file) || self.complete.contains(&file) {
                return Err(DestinationError::Protocol(format!(
                    "file {file} sealed twice"
                )));
            }
            if f.held.gaps(&(0..f.size)).next().is_some() {
                return Err(DestinationError::Refused(format!(
                    "file {file} is incomplete"
                )));
            }
            self.sealed.insert(file);
            Ok(Sealed::Placed)
        }

        fn finish(&mut self) -> Result<Removal, DestinationError> {
            let open = self.files.len() - self.sealed.len() - self.complete.len();
            match open {
                0 => Ok(Removal::default()),
                n => Err(DestinationError::Protocol(format!("{n} files not sealed"))),
            }
        }

        fn offer_quic(&mut self) -> Result<[u8; 32], String> {
            self.quic
                .then_some([7; 32])
                .ok_or_else(|| "this receiver does not serve QUIC".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::memory::Files;
    use super::*;
    use crate::manifest::{FileEntry, ManifestBatch, Timestamp};

    /// A batch of files of 100 bytes each.
    fn batch(paths: &[&str], last: bool) -> Message {
        let time = Timestamp { secs: 0, nanos: 0 };
        Message::Entries(ManifestBatch {
            dirs: Vec::new(),
            files: paths
                .iter()
                .map(|p| FileEntry {
                    path: p.as_bytes().to_vec(),
                    size: 100,
                    mode: 0o644,
                    mtime: time,
                    ctime: time,
                    inode: 0,
                })
                .collect(),
            last,
        })
    }

    fn plan(first: u32, n: usize, last: bool) -> Step {
        Step::reply(Message::Plan {
            first,
            files: vec![FileStatus::Missing; n],
            last,
        })
    }

    fn failed(reason: &str) -> Step {
        Step::reply_and_end(
            Message::Error {
                message: reason.into(),
            },
            Err(SessionOutcome::Failed(reason.into())),
        )
    }

    /// Comparing by content, one `Compare` answers for all its files: those kept are placed,
    /// those changed are to be sent and sealed; a file compared twice, or one compared
    /// without having been held, breaks the protocol, and so does a comparison of more files
    /// than a batch holds.
    #[test]
    fn a_comparison_answers_for_all_its_files_at_once() {
        let (mut control, mut files) = (ControlSession::default(), Files::default());
        files.compare_by_content();
        for path in ["a", "b", "c"] {
            files.left_by_earlier_session(path, 100, &[(0, 100)]);
        }
        files.changed_since("b");
        let step = control.handle(batch(&["a", "b", "c", "d"], true), &mut files);
        let complete = vec![FileStatus::Complete; 3];
        assert_eq!(
            step,
            Step::reply(Message::Plan {
                first: 0,
                files: [complete, vec![FileStatus::Missing]].concat(),
                last: true
            })
        );
        let compare = |files: &[u32]| Message::Compare {
            files: files.iter().map(|&f| (f, [1; 32])).collect(),
        };
        assert_eq!(
            control.handle(compare(&[0, 1, 2]), &mut files),
            Step::reply(Message::Compared {
                kept: vec![0, 2],
                changed: vec![1]
            })
        );
        assert_eq!(control.announced().placed, 2);
        let twice = control.handle(compare(&[0]), &mut files);
        assert!(
            matches!(&twice.end, Some(Err(SessionOutcome::Failed(e))) if e.contains("sealed twice")),
            "{twice:?}"
        );

        let (mut control, mut files) = (ControlSession::default(), Files::default());
        let many: Vec<u32> = (0..=BATCH_ENTRIES as u32).collect();
        let step = control.handle(compare(&many), &mut files);
        assert_eq!(step, failed("a comparison of 1025 files, more than 1024"));
    }

    #[test]
    fn a_session_plans_each_batch_places_each_sealed_file_and_completes() {
        let (mut control, mut files) = (ControlSession::default(), Files::default());
        assert_eq!(
            control.handle(batch(&["a", "b"], false), &mut files),
            plan(0, 2, false)
        );
        assert_eq!(
            control.handle(batch(&["c"], true), &mut files),
            plan(2, 1, true)
        );
        for file in 0..3 {
            files.receive(file, 0..100);
        }
        for file in 0..3 {
            let step = control.handle(Message::Seal { file, blake3: None }, &mut files);
            assert_eq!(step, Step::reply(Message::Finalized { file, error: None }));
        }
        let done = control.handle(Message::Finish, &mut files);
        assert_eq!(
            done,
            Step::reply_and_end(
                Message::Done {
                    removed: Removal::default()
                },
                Ok(())
            )
        );
        let announced = control.announced();
        assert_eq!(
            (announced.files, announced.bytes, announced.placed),
            (3, 300, 3)
        );
        assert!(announced.complete);
    }

    #[test]
    fn a_file_that_cannot_be_placed_is_answered_and_the_session_goes_on() {
        let (mut control, mut files) = (ControlSession::default(), Files::default());
        control.handle(batch(&["a"], true), &mut files);
        let step = control.handle(
            Message::Seal {
                file: 0,
                blake3: None,
            },
            &mut files,
        );
        assert_eq!(
            step,
            Step::reply(Message::Finalized {
                file: 0,
                error: Some("file 0 is incomplete".into())
            })
        );
        assert_eq!(control.announced().placed, 0);
        // Finishing with a file unsealed is refused, and the session fails.
        assert_eq!(
            control.handle(Message::Finish, &mut files),
            failed("protocol violation: 1 files not sealed")
        );
    }

    #[test]
    fn rule_breaking_messages_fail_the_session_with_the_reason_told() {
        let (mut control, mut files) = (ControlSession::default(), Files::default());
        // A seal of a file never announced: answered, then the session fails.
        let step = control.handle(
            Message::Seal {
                file: 9,
                blake3: None,
            },
            &mut files,
        );
        let reason = "protocol violation: no file 9 to seal";
        assert_eq!(
            step,
            Step::reply_and_end(
                Message::Finalized {
                    file: 9,
                    error: Some(reason.into())
                },
                Err(SessionOutcome::Failed("no file 9 to seal".into()))
            )
        );
        // A batch after the last one.
        let mut control = ControlSession::default();
        control.handle(batch(&["a"], true), &mut files);
        assert_eq!(
            control.handle(batch(&["b"], false), &mut files),
            failed("a batch of the manifest after its last")
        );
        // A path the destination refuses: refused, and the session fails.
        let mut control = ControlSession::default();
        let step = control.handle(batch(&["/etc/passwd"], false), &mut files);
        let reason = "/etc/passwd: an absolute path".to_string();
        assert_eq!(
            step,
            Step::reply_and_end(
                Message::Refused {
                    reason: reason.clone()
                },
                Err(SessionOutcome::Failed(reason))
            )
        );
        assert_eq!(control.announced(), ManifestSoFar::default());
        // A message that belongs elsewhere, and a frame that arrived damaged.
        assert_eq!(
            control.handle(Message::EndOfStream, &mut files),
            failed("unexpected EndOfStream on the control connection")
        );
        let damaged = WireError::Malformed("bad tag".into());
        assert_eq!(control.damaged(&damaged), failed(&damaged.to_string()));
    }

    #[test]
    fn quic_is_offered_only_where_it_is_served() {
        let (mut control, mut files) = (ControlSession::default(), Files::default());
        let refused = control.handle(Message::QuicRequest, &mut files);
        let reason = "this receiver does not serve QUIC".to_string();
        assert_eq!(
            refused,
            Step::reply_and_end(
                Message::Refused {
                    reason: reason.clone()
                },
                Err(SessionOutcome::Failed(reason))
            )
        );
        files.quic = true;
        assert_eq!(
            control.handle(Message::QuicRequest, &mut files),
            Step::reply(Message::QuicOffer {
                certificate: [7; 32]
            })
        );
    }
}
