//! Entry points for the fuzz targets in `crates/transfer/fuzz` (the `fuzzing` feature): the
//! parts of the receiver and sender that take what a peer sent, reachable without a socket.

use std::path::Path;

use crate::manifest::FileEntry;
use crate::wire::{FileStatus, Message};

/// What a session's control connection did with the messages of [`receive_control`].
#[derive(Debug, Default)]
pub struct ControlRun {
    /// The receiver's replies, in order.
    pub replies: Vec<Message>,
    /// How the session ended: completed (`Ok`), or why not; `None` while it goes on.
    pub end: Option<Result<(), String>>,
    /// Files the manifest announced.
    pub files_announced: u64,
    /// Files placed under their final names.
    pub files_placed: u64,
}

/// The receiver's handling of a session's control messages into `dest` under `root`, as its
/// control connection runs them (the session's rules, over the files of a real destination):
/// path checks, directories made, each batch's resume plan read from what is there, seals and
/// the finish. A message that breaks the rules ends the session with a reason, never a panic.
pub fn receive_control(root: &Path, dest: &[u8], messages: Vec<Message>) -> ControlRun {
    crate::receiver::control_for_fuzzing(root, dest, messages)
}

/// A daemon's checks of a fetch `request` for a key whose root is `root` (canonical), at most
/// 8 streams a session: the paths it would send (each under `root`), its count to start with
/// and its controller's ceiling; or why it is refused. Never a panic.
pub fn fetch_request(
    root: &Path,
    request: crate::sender::FetchRequest,
) -> Result<(Vec<std::path::PathBuf>, usize, u32), String> {
    crate::receiver::fetch_for_fuzzing(root, request)
}

/// The sender's handling of the receiver's resume plan for `files`: the units left to send as
/// `(file, offset, len)`, or why the plan is refused.
pub fn plan_units(
    files: &[FileEntry],
    plan: &[FileStatus],
    unit_size: u32,
) -> Result<Vec<(u32, u64, u32)>, String> {
    crate::sender::queue_for_fuzzing(files, plan, unit_size)
}

/// A reader of frames as a sealed connection reads them ([`crate::seal`]), under a fixed key:
/// the lengths and tags of any bytes a peer sends.
pub fn sealed_frames<R: std::io::Read>(inner: R, max_chunk: usize) -> crate::wire::FrameReader<R> {
    let mut reader = crate::wire::FrameReader::new(inner, max_chunk);
    reader.open_sealed(crate::seal::FrameKey::new([7; 32]));
    reader
}

/// The sender's rules under any replies a receiver can send: the manifest is files of `sizes`,
/// all announced in one batch, in a session whose files already at the receiver are
/// `present`; `control` is what the receiver says on the control connection,
/// and `data` what it says on a data stream that sent the units `sent` (`(file, offset, len)`),
/// each taken until the first it refuses. Panics when the rules act against the manifest or
/// the protocol: a range queued outside its file or twice, a file settled twice or never
/// announced, a file compared twice or said changed when it was not compared, the transfer
/// complete before it asked to finish, an answer matched to a unit out of order or never
/// sent.
pub fn sender_rules(
    present: crate::wire::PresentFiles,
    sizes: &[u64],
    control: Vec<Message>,
    sent: &[(u32, u64, u32)],
    data: Vec<Message>,
) {
    use std::collections::{BTreeSet, VecDeque};

    use crate::sender::answers::{Answer, Unanswered};
    use crate::sender::control_session::{Action, Announced, Planner};
    use crate::sender::work_queue::Unit;
    use crate::sender::SendError;

    /// Every file of the manifest announced.
    struct Whole<'a>(&'a [u64]);

    impl Announced for Whole<'_> {
        fn announced(&self) -> (u64, bool) {
            (self.0.len() as u64, true)
        }
        fn size(&self, file: u32) -> Result<u64, SendError> {
            (self.0.get(file as usize).copied())
                .ok_or_else(|| SendError::Protocol(format!("no file {file}")))
        }
        fn share(&self, _file: u32) -> Result<Option<Vec<std::ops::Range<u64>>>, SendError> {
            Ok(None)
        }
        fn shown(&self, file: u32) -> String {
            format!("file {file}")
        }
    }

    let files = Whole(sizes);
    let mut planner = Planner::new(present);
    let (mut queued, mut settled) = (BTreeSet::new(), BTreeSet::new());
    let (mut compared, mut changed) = (BTreeSet::new(), BTreeSet::new());
    let mut finishing = false;
    for message in control {
        let Ok(actions) = planner.handle(message, &files) else {
            break;
        };
        for action in actions {
            match action {
                Action::Queue(file, ranges) => {
                    let size = sizes[file as usize];
                    assert!(queued.insert(file), "file {file} queued twice");
                    let mut end = 0;
                    for r in &ranges {
                        assert!(
                            end <= r.start && r.start < r.end && r.end <= size,
                            "{ranges:?}"
                        );
                        end = r.end;
                    }
                }
                Action::Settle(file) => {
                    assert!((file as usize) < sizes.len(), "file {file} never announced");
                    assert!(settled.insert(file), "file {file} settled twice");
                }
                Action::Seal(file) => assert!(!settled.contains(&file), "{file} sealed settled"),
                Action::Compare(file) => {
                    assert!(!settled.contains(&file), "{file} compared settled");
                    assert!(compared.insert(file), "file {file} compared twice");
                }
                Action::Changed(file) => {
                    assert!(compared.contains(&file), "{file} changed, never compared");
                    assert!(changed.insert(file), "file {file} changed twice");
                }
                Action::Finish => {
                    assert!(!finishing, "finish asked twice");
                    finishing = true;
                }
                Action::Complete(_) => assert!(finishing, "complete before the finish"),
                Action::Count { .. } | Action::CloseQueue => {}
            }
        }
    }

    let mut unanswered = Unanswered::default();
    let mut expected = VecDeque::new();
    for &(file, offset, len) in sent {
        let unit = Unit { file, offset, len };
        unanswered.sent(unit);
        expected.push_back(unit);
    }
    for message in data {
        match unanswered.answer(message) {
            Ok(Answer::Acked(u) | Answer::Nacked(u)) => {
                assert_eq!(expected.pop_front(), Some(u), "an answer out of order");
            }
            Ok(Answer::Ended) => {}
            Err(_) => break,
        }
    }
}
