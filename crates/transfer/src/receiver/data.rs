//! The rules of a data stream at the receiver, without sockets or files: what each frame that
//! arrives asks for, what answers it, and when the stream ends. The stream's thread reads a
//! frame's head, asks [`on_head`], receives a chunk's payload when told to (straight into its
//! file where it can), and asks [`on_stored`] for the answer.
//!
//! ```text
//! Chunk              ──▶ receive it: verified and written, Ack; damaged, Nack;
//!                        refused by the destination, Error (the session fails)
//! EndOfStream        ──▶ EndOfStream, and the stream is over
//! any other message,
//! an oversized or
//! malformed frame    ──▶ Error, and the session fails
//! a broken connection──▶ the stream is over; what was answered stands
//! ```
//! A session that failed meanwhile (on another stream) answers the next chunk with its reason.

use super::destination::DestinationError;
use crate::auth;
use crate::wire::{ChunkHeader, Head, Message, WireError};

/// What the stream does with the head of a frame.
#[derive(Debug, PartialEq)]
pub(crate) enum Next {
    /// Receive the chunk's payload of `len` bytes, check it, store it if it matches, and ask
    /// [`on_stored`].
    Receive(ChunkHeader, usize),
    /// Nothing to receive: this is what follows.
    Then(Step),
}

/// What the stream does once a frame is handled.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// Send this answer and read on.
    Answer(Message),
    /// The stream is over as `End` says, after this answer, if any.
    End(End, Option<Message>),
}

/// How a data stream ended.
#[derive(Debug, PartialEq)]
pub(crate) enum End {
    /// The sender ended it with `EndOfStream`.
    Finished,
    /// The connection closed or broke; the session may go on with other streams.
    Closed(String),
    /// The peer broke a rule or the receiver failed: the session cannot go on.
    Failed(String),
}

/// Why a chunk could not be received.
#[derive(Debug)]
pub(crate) enum ChunkError {
    /// The connection broke while the payload arrived.
    Wire(WireError),
    /// The destination refused or failed to write it.
    Destination(DestinationError),
}

/// Ends the stream, and the session with it, telling the sender why.
fn fail(reason: String) -> Step {
    Step::End(
        End::Failed(reason.clone()),
        Some(Message::Error { message: reason }),
    )
}

/// What to do with the head of a frame (or the error reading it); `session_failure` is why the
/// session failed, if it did, as it stands once the head has arrived (another stream may have
/// failed it while this one waited).
pub(crate) fn on_head(head: Result<Head, WireError>, session_failure: Option<String>) -> Next {
    Next::Then(match head {
        Ok(Head::Chunk(header, len)) => match session_failure {
            Some(reason) => fail(reason),
            None => return Next::Receive(header, len),
        },
        Ok(Head::Message(Message::EndOfStream)) => {
            Step::End(End::Finished, Some(Message::EndOfStream))
        }
        Ok(Head::Message(other)) => fail(format!(
            "unexpected {} on a data stream",
            auth::name(&other)
        )),
        Err(e @ (WireError::Oversized { .. } | WireError::Malformed(_))) => fail(e.to_string()),
        // What was verified and written is answered, whatever broke after it.
        Err(e) => Step::End(End::Closed(e.to_string()), None),
    })
}

/// The answer to a chunk once it was received: whether it matched its checksum (and was
/// stored), or why it could not be received.
pub(crate) fn on_stored(
    header: &ChunkHeader,
    len: usize,
    stored: Result<bool, ChunkError>,
) -> Step {
    match stored {
        Ok(true) => Step::Answer(Message::Ack {
            file: header.file,
            offset: header.offset,
            // The frame reader admits no chunk longer than a u32 can say.
            len: len as u32,
        }),
        Ok(false) => Step::Answer(Message::Nack {
            file: header.file,
            offset: header.offset,
        }),
        Err(ChunkError::Wire(e)) => Step::End(End::Closed(e.to_string()), None),
        Err(ChunkError::Destination(e)) => fail(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: ChunkHeader = ChunkHeader {
        file: 3,
        offset: 1 << 20,
        checksum: 7,
    };

    #[test]
    fn a_chunk_is_received_then_acknowledged_or_asked_again() {
        let head = Ok(Head::Chunk(HEADER, 4096));
        assert_eq!(on_head(head, None), Next::Receive(HEADER, 4096));
        assert_eq!(
            on_stored(&HEADER, 4096, Ok(true)),
            Step::Answer(Message::Ack {
                file: 3,
                offset: 1 << 20,
                len: 4096
            })
        );
        assert_eq!(
            on_stored(&HEADER, 4096, Ok(false)),
            Step::Answer(Message::Nack {
                file: 3,
                offset: 1 << 20
            })
        );
    }

    #[test]
    fn the_stream_ends_cleanly_on_end_of_stream_and_quietly_when_it_breaks() {
        let end = on_head(Ok(Head::Message(Message::EndOfStream)), None);
        let finished = Step::End(End::Finished, Some(Message::EndOfStream));
        assert_eq!(end, Next::Then(finished));
        let broken = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let closed = on_head(Err(WireError::Io(broken)), None);
        assert!(
            matches!(closed, Next::Then(Step::End(End::Closed(_), None))),
            "{closed:?}"
        );
        let cut = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "cut");
        let closed = on_stored(&HEADER, 10, Err(ChunkError::Wire(WireError::Io(cut))));
        assert!(
            matches!(closed, Step::End(End::Closed(_), None)),
            "{closed:?}"
        );
    }

    #[test]
    fn what_breaks_the_rules_fails_the_session_with_the_reason_told() {
        let fails = |step: Step, reason: &str| {
            assert_eq!(step, fail(reason.into()));
        };
        let then = |next: Next| match next {
            Next::Then(step) => step,
            receive => panic!("{receive:?}"),
        };
        fails(
            then(on_head(
                Ok(Head::Chunk(HEADER, 10)),
                Some("disk full".into()),
            )),
            "disk full",
        );
        fails(
            then(on_head(Ok(Head::Message(Message::Finish)), None)),
            "unexpected Finish on a data stream",
        );
        let malformed = WireError::Malformed("bad tag".into());
        let reason = malformed.to_string();
        fails(then(on_head(Err(malformed), None)), &reason);
        let refused = DestinationError::Protocol("chunk past the end of file 3".into());
        let reason = refused.to_string();
        fails(
            on_stored(&HEADER, 10, Err(ChunkError::Destination(refused))),
            &reason,
        );
    }
}
