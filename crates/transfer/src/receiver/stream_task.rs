//! A data stream served as a task of the receiver's runtime instead of a thread of its own, so
//! that the receiver's threads do not grow with its streams: the runtime runs one worker per
//! core. A chunk is copied from the connection into its window of the part file and recorded
//! on the worker; a write from memory, which may wait for another stream's copy of the same
//! bytes, moves its worker aside for a moment ([`tokio::task::block_in_place`]), within the
//! runtime's bound of blocking threads ([`super::BLOCKING_THREADS`]).
//!
//! The stream's task did its key handshake and admitted it ([`super::handshake`]), TCP or QUIC
//! alike. It follows the data stream's rules
//! ([`super::data`]): a chunk's payload goes straight into its file where it can (a sink's is
//! hashed as it arrives and never held), and replies wait until the stream would wait for the
//! peer.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::task::block_in_place;

use super::data::{self, ChunkError, End, Next, Step};
use super::{Session, LINGER, REPLY_BUFFER};
use crate::direct_io::AlignedBuffer;
use crate::seal::ChunkCheck;
use crate::sync::unpoisoned;
use crate::task_io::TaskConn;
use crate::telemetry;
use crate::wire::{self, ChunkHeader, WireError};

/// The longest message a data stream may send (it sends only `EndOfStream`).
pub(super) const MAX_STREAM_MESSAGE: usize = 4 << 10;

/// A stream counted in its session and in telemetry, until it drops.
pub(super) struct OpenStream {
    session: Arc<Session>,
    _telemetry: telemetry::Open,
}

impl OpenStream {
    /// Counts a stream of `session` that was admitted (its count taken already).
    pub(super) fn new(session: Arc<Session>) -> OpenStream {
        OpenStream {
            session,
            _telemetry: telemetry::Open::receiver_stream(),
        }
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.session.streams.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves a data stream of `session` from `peer` on `conn`, past its `Welcome`, until it ends,
/// and closes it. `open` counts the stream until then, however it ends.
pub(super) async fn serve(
    session: Arc<Session>,
    peer: SocketAddr,
    conn: TaskConn,
    open: OpenStream,
) {
    let mut stream = Receiving {
        session: session.clone(),
        conn,
        memory: Vec::new(),
        aligned: AlignedBuffer::default(),
    };
    let end = stream.receive_chunks().await;
    drop(open);
    let failed = super::stream_ended(&session, peer, end);
    stream.conn.close(failed, LINGER).await;
}

/// A stream being served, and the memory it receives chunks into when they go neither straight
/// into their file nor to a sink.
struct Receiving {
    session: Arc<Session>,
    conn: TaskConn,
    memory: Vec<u8>,
    aligned: AlignedBuffer,
}

impl Receiving {
    /// Verifies, writes and acknowledges chunks until the stream ends, as the data stream's
    /// rules say ([`data`]); how it ended. Replies go out before the stream waits for more.
    async fn receive_chunks(&mut self) -> End {
        loop {
            let head = self.conn.next_head().await;
            // Read after the head arrived: the session may have failed while this stream waited.
            let failure = unpoisoned(self.session.failure.lock()).clone();
            let step = match data::on_head(head, failure) {
                Next::Receive(header, len) => {
                    let stored = self.receive_chunk(&header, len).await;
                    if let Ok(true) = stored {
                        super::count_stored(&self.session, len);
                    }
                    data::on_stored(&header, len, stored)
                }
                Next::Then(step) => step,
            };
            match step {
                Step::Answer(answer) => {
                    if let Err(e) = wire::write_message(&mut self.conn.replies, &answer) {
                        return End::Closed(e.to_string());
                    }
                    if self.conn.replies.get_ref().len() >= REPLY_BUFFER {
                        if let Err(e) = self.conn.flush().await {
                            return End::Closed(e.to_string());
                        }
                    }
                }
                Step::End(end, answer) => {
                    if let End::Failed(reason) = &end {
                        self.session.fail(reason);
                    }
                    let answered = match answer {
                        Some(answer) => wire::write_message(&mut self.conn.replies, &answer),
                        None => Ok(()),
                    };
                    let flushed = match answered {
                        Ok(()) => self.conn.flush().await.map_err(WireError::Io),
                        Err(e) => Err(e),
                    };
                    return match (end, flushed) {
                        (End::Finished, Err(e)) => End::Closed(e.to_string()),
                        (end, _) => end,
                    };
                }
            }
        }
    }

    /// Receives a chunk's payload and tag: straight into its part file when the destination
    /// maps it, hashed as it passes for a sink, else into memory; checks it and, when it
    /// matches, writes and journals it. Returns whether it matched.
    async fn receive_chunk(
        &mut self,
        header: &ChunkHeader,
        len: usize,
    ) -> Result<bool, ChunkError> {
        let session = self.session.clone();
        let dest = &session.dest;
        let check = |seal| ChunkCheck {
            checksum: header.checksum,
            seal,
        };
        if let Some(sink) = dest.sink() {
            let hashed = self.conn.payload_hashed(len).await;
            let (checksum, content, seal) = hashed.map_err(ChunkError::Wire)?;
            if checksum != header.checksum || seal.is_some_and(|seal| !seal.matches(&content)) {
                return Ok(false);
            }
            sink.write(header.file, header.offset, len as u64)
                .map_err(ChunkError::Destination)?;
            return Ok(true);
        }
        // Mapping a window and, below, recording the chunk verified are short calls that wait
        // for no other stream: they run on the worker, as the copy into the window does.
        let mapped =
            (dest.map_chunk(header.file, header.offset, len)).map_err(ChunkError::Destination)?;
        if let Some(mut chunk) = mapped {
            let seal = (self.conn.payload_into(chunk.bytes()).await).map_err(ChunkError::Wire)?;
            return (chunk.commit(&check(seal))).map_err(ChunkError::Destination);
        }
        // Memory that cannot be had for direct I/O leaves the chunk to be written through the
        // page cache.
        let direct = if dest.writes_direct() {
            self.aligned.get(len).ok()
        } else {
            None
        };
        let buf = match direct {
            Some(buf) => buf,
            None => {
                self.memory.resize(len, 0);
                &mut self.memory[..]
            }
        };
        let seal = self
            .conn
            .payload_into(buf)
            .await
            .map_err(ChunkError::Wire)?;
        if !check(seal).matches(buf) {
            return Ok(false);
        }
        // A write from memory may wait for another stream's copy of the same bytes.
        block_in_place(|| dest.write(header.file, header.offset, buf, header.checksum))
            .map_err(ChunkError::Destination)?;
        Ok(true)
    }
}
