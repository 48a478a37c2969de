//! One data stream's units waiting for the receiver's answer, and the rules its answers
//! follow, without I/O: the receiver answers a stream's chunks in the order they came, so each
//! answer must be for the oldest unit unanswered (an `Ack` for exactly that range, a `Nack` for
//! its start), and `EndOfStream` ends the stream. The stream's reader feeds it what it reads
//! (`stream.rs`); the pair tests run it against the receiver with simulated time.

use std::collections::VecDeque;

use super::work_queue::Unit;
use super::SendError;
use crate::auth;
use crate::wire::Message;

/// What an answer of the receiver means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The unit was verified and written.
    Acked(Unit),
    /// The unit arrived damaged: it is to be sent again.
    Nacked(Unit),
    /// The receiver answered `EndOfStream`: nothing more comes on this stream.
    Ended,
}

/// The units a stream sent that the receiver has not answered yet, oldest first, and whether
/// its `EndOfStream` waits for an answer too.
#[derive(Debug, Default)]
pub(crate) struct Unanswered {
    units: VecDeque<Unit>,
    end: bool,
}

impl Unanswered {
    /// `unit` is being sent.
    pub(crate) fn sent(&mut self, unit: Unit) {
        self.units.push_back(unit);
    }

    /// The unit just recorded as sent was not sent after all.
    pub(crate) fn not_sent(&mut self) {
        self.units.pop_back();
    }

    /// `EndOfStream` is being sent: its answer is due after the units'.
    pub(crate) fn end_sent(&mut self) {
        self.end = true;
    }

    /// Whether an answer is due.
    pub(crate) fn waiting(&self) -> bool {
        self.end || !self.units.is_empty()
    }

    /// The units still unanswered, oldest first, which another stream must carry.
    pub(crate) fn take(&mut self) -> Vec<Unit> {
        self.units.drain(..).collect()
    }

    /// Matches one message of the receiver on this stream: what it means, or why the
    /// receiver broke the protocol (or refused).
    pub(crate) fn answer(&mut self, message: Message) -> Result<Answer, SendError> {
        match message {
            Message::Ack { file, offset, len } => match self.units.front() {
                Some(&u) if u == (Unit { file, offset, len }) => {
                    self.units.pop_front();
                    Ok(Answer::Acked(u))
                }
                _ => Err(SendError::Protocol(
                    "acknowledgement for a chunk that was not sent".into(),
                )),
            },
            Message::Nack { file, offset } => match self.units.front() {
                Some(&u) if u.file == file && u.offset == offset => {
                    self.units.pop_front();
                    Ok(Answer::Nacked(u))
                }
                _ => Err(SendError::Protocol(
                    "negative acknowledgement for a chunk that was not sent".into(),
                )),
            },
            Message::EndOfStream => {
                self.end = false;
                Ok(Answer::Ended)
            }
            Message::Error { message } => Err(SendError::refused(message)),
            other => Err(SendError::Protocol(format!(
                "unexpected {} on a data stream",
                auth::name(&other)
            ))),
        }
    }
}
