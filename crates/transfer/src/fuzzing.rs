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
