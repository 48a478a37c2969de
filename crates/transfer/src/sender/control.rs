//! The sender's control connection after the plan: seal files whose units were all
//! acknowledged, collect the receiver's `Finalized` answers, and end the session.

use std::io::BufReader;
use std::net::TcpStream;

use crate::link::{LinkReader, LinkWriter};
use std::sync::atomic::Ordering;
use std::sync::mpsc;

use super::{SealEvent, SendError, Shared};
use crate::auth;
use crate::wire::{self, FrameReader, Message};

/// Writes `Seal` for each file as it completes, then `Finish` once every file is finalised.
pub(super) fn run_sealer(
    shared: &Shared,
    mut writer: LinkWriter,
    events: mpsc::Receiver<SealEvent>,
) {
    for event in events {
        let message = match event {
            SealEvent::Seal(file) => {
                let entry = &shared.manifest.files[file as usize];
                match shared
                    .source
                    .check_unchanged(file, entry, shared.config.verify)
                {
                    Ok(blake3) => Message::Seal { file, blake3 },
                    Err(e) => return shared.fail(e),
                }
            }
            SealEvent::AllFinalized => Message::Finish,
            SealEvent::Abort => return,
        };
        if let Err(e) = wire::write_message(&mut writer, &message) {
            return shared.fail(SendError::Connection(e.to_string()));
        }
        if message == Message::Finish {
            return;
        }
    }
}

/// Reads the receiver's answers and heartbeats on the control connection until `Done` or a
/// failure (the socket's read timeout is the stall timeout).
pub(super) fn run_control_reader(
    shared: &Shared,
    mut reader: FrameReader<BufReader<LinkReader<TcpStream>>>,
    to_seal: u64,
) {
    let mut finalized = 0u64;
    if to_seal == 0 {
        shared.send_seal(SealEvent::AllFinalized);
    }
    loop {
        let message = match reader.read_message() {
            Ok(m) => m,
            Err(e) => return shared.fail(SendError::reading(e, shared.config.stall_timeout)),
        };
        match message {
            Message::Working => {}
            Message::Finalized { file, error: None } => {
                finalized += 1;
                shared.files_done.fetch_add(1, Ordering::Relaxed);
                if finalized == to_seal {
                    shared.send_seal(SealEvent::AllFinalized);
                }
                tracing::debug!("finalised {}", shared.file_shown(file));
            }
            Message::Finalized {
                error: Some(error), ..
            } => return shared.fail(SendError::Receiver(error)),
            Message::Done => return shared.complete(),
            Message::Error { message } => return shared.fail(SendError::Receiver(message)),
            other => {
                return shared.fail(SendError::Protocol(format!(
                    "unexpected {} on the control connection",
                    auth::name(&other)
                )))
            }
        }
    }
}
