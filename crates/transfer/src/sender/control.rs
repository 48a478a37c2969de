//! The sender's control connection once the first plan arrived: the writer announces the
//! manifest's further batches and seals files whose units were all acknowledged; the reader takes
//! the receiver's plans, `Finalized` answers and heartbeats, and ends the session.

use std::sync::mpsc;

use super::control_session::Planner;
use super::{ControlEvent, ControlReader, Shared};
use crate::link::LinkWriter;
use crate::seal::FrameWriter;
use crate::wire::{self, Message};

/// Most bytes of source files hashed into one [`Message::Compare`]: the receiver starts
/// comparing a group once it arrives, so that a group of large files does not keep it waiting
/// while the sender hashes them all.
const COMPARE_GROUP_BYTES: u64 = 64 << 20;

/// Writes each batch of the manifest, `Seal` for each file as it completes, `Compare` for the
/// files the receiver holds (those queued together, one message for up to
/// [`wire::BATCH_ENTRIES`] files or [`COMPARE_GROUP_BYTES`]), then `Finish` once every file is
/// finalised.
pub(super) fn run_writer(
    shared: &Shared,
    mut writer: FrameWriter<LinkWriter>,
    events: mpsc::Receiver<ControlEvent>,
) {
    let mut held_back = None;
    while let Some(event) = held_back.take().or_else(|| events.recv().ok()) {
        let message = match event {
            ControlEvent::Entries(batch) => Message::Entries(batch),
            ControlEvent::Seal(file) => {
                let checked = shared.files.get(file).and_then(|source| {
                    shared
                        .source
                        .check_unchanged(&source, shared.config.options.verify)
                });
                match checked {
                    Ok(blake3) => Message::Seal { file, blake3 },
                    Err(e) => return shared.fail(e),
                }
            }
            ControlEvent::Compare(first) => {
                let (mut files, mut bytes, mut next) = (Vec::new(), 0, Some(first));
                while let Some(file) = next.take() {
                    // Hashed here, while the streams carry other files.
                    let hashed = shared.files.get(file).and_then(|source| {
                        let hash = shared.source.check_unchanged(&source, true)?;
                        Ok((hash.unwrap_or_default(), source.entry.size))
                    });
                    match hashed {
                        Ok((hash, size)) => {
                            files.push((file, hash));
                            bytes += size;
                        }
                        Err(e) => return shared.fail(e),
                    }
                    if files.len() < wire::BATCH_ENTRIES && bytes < COMPARE_GROUP_BYTES {
                        match events.try_recv() {
                            Ok(ControlEvent::Compare(file)) => next = Some(file),
                            Ok(other) => held_back = Some(other),
                            Err(_) => {}
                        }
                    }
                }
                Message::Compare { files }
            }
            ControlEvent::AllFinalized => Message::Finish,
            ControlEvent::Abort => return,
        };
        if let Err(e) = wire::write_message(&mut writer, &message) {
            return shared.fail(shared.config.lost(e));
        }
        if message == Message::Finish {
            return;
        }
    }
}

/// Reads the receiver's plans, answers and heartbeats on the control connection and acts on
/// them as the session's rules say ([`Planner`]) until `Done` or a failure (the socket's read
/// timeout is the stall timeout).
pub(super) fn run_reader(shared: &Shared, mut reader: ControlReader, mut planner: Planner) {
    loop {
        let message = match reader.read_message() {
            Ok(m) => m,
            Err(e) => return shared.fail(shared.config.reading(e)),
        };
        let done = matches!(message, Message::Done { .. });
        if let Err(e) = planner
            .handle(message, &shared.files)
            .and_then(|actions| shared.act(actions))
        {
            return shared.fail(e);
        }
        if done {
            return;
        }
    }
}
