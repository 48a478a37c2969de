//! Entry points for the fuzz targets in `crates/transfer/fuzz` (the `fuzzing` feature): the
//! parts of the receiver and sender that take what a peer sent, reachable without a socket.

use std::path::Path;

use crate::manifest::{FileEntry, ManifestBatch};
use crate::wire::FileStatus;

/// The receiver's handling of a manifest sent into `dest` in `batches`: path checks,
/// directories made under `root`, and each batch's resume plan from what is there. `Err` is a
/// refusal (with its reason), never a panic.
pub fn receive_manifest(root: &Path, dest: &[u8], batches: &[ManifestBatch]) -> Result<(), String> {
    crate::receiver::prepare_for_fuzzing(root, dest, batches)
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
