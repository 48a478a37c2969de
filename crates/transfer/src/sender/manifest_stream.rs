//! The manifest as a stream: the scanner announces the sources a batch at a time, holding back
//! while [`wire::SENDER_UNSEALED`] files wait for their seal (the receiver's plan of each batch
//! is read by the rules of `control_session.rs`).

use super::{ControlEvent, Shared};
use crate::manifest::Scanner;
use crate::wire;

/// Scans the rest of the sources after the first batch and hands each batch to the control
/// writer; a source that cannot be read fails the transfer.
pub(super) fn run_scanner(shared: &Shared, mut scanner: Scanner) {
    loop {
        if !shared.files.wait_for_room() {
            return;
        }
        let scanned = match scanner.next_batch(wire::BATCH_ENTRIES) {
            Ok(scanned) => scanned,
            Err(e) => return shared.fail(e.into()),
        };
        let batch = match shared.files.announce(scanned) {
            Ok(batch) => batch,
            Err(e) => return shared.fail(e),
        };
        let last = batch.last;
        shared.send_control(ControlEvent::Entries(batch));
        if last {
            return;
        }
    }
}
