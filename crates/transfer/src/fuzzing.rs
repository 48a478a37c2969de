//! Entry points for the fuzz targets in `crates/transfer/fuzz` (the `fuzzing` feature): the
//! parts of the receiver and sender that take what a peer sent, reachable without a socket.

use std::path::Path;

use crate::manifest::Manifest;
use crate::wire::FileStatus;

/// The receiver's handling of a manifest: path checks, directories made under `root`, and the
/// resume plan from what is there. `Err` is a refusal (with its reason), never a panic.
pub fn receive_manifest(root: &Path, manifest: &Manifest) -> Result<(), String> {
    crate::receiver::prepare_for_fuzzing(root, manifest)
}

/// The sender's handling of the receiver's resume plan for `manifest`: the units left to send
/// as `(file, offset, len)`, or why the plan is refused.
pub fn plan_units(
    manifest: &Manifest,
    plan: &[FileStatus],
    unit_size: u32,
) -> Result<Vec<(u32, u64, u32)>, String> {
    crate::sender::queue_for_fuzzing(manifest, plan, unit_size)
}
