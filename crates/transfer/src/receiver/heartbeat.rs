//! The receiver's heartbeat on a session's control connection: a `Working` message every
//! [`HEARTBEAT`] from the session's `Welcome` to its end, so that the sender can tell a receiver
//! that is busy for it (preparing a large tree, sealing and verifying a large file) from one that
//! is gone or cut off, however long the busy step takes.

use std::io::{self, Write};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;

use crate::link::LinkWriter;
use crate::seal::{FrameKey, FrameWrite, FrameWriter, TAG_LEN};
use crate::wire::{self, Message, HEARTBEAT};

/// The control connection's writer, shared by the session and its heartbeat. Every frame goes
/// out whole under the lock, its tag numbered under the same hold on a sealed connection, so
/// heartbeats never land inside another message nor take its number.
pub(super) struct SharedWriter<'a>(Mutex<&'a mut FrameWriter<LinkWriter>>);

impl<'a> SharedWriter<'a> {
    fn lock(&self) -> std::sync::MutexGuard<'_, &'a mut FrameWriter<LinkWriter>> {
        self.0.lock().expect("control writer lock")
    }
}

impl Write for &SharedWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.lock().write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.lock().write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.lock().flush()
    }
}

impl FrameWrite for &SharedWriter<'_> {
    fn seals(&self) -> bool {
        self.lock().seals()
    }

    fn next_tag(&mut self, covered: &[&[u8]]) -> Option<[u8; TAG_LEN]> {
        self.lock().next_tag(covered)
    }

    fn seal_with(&mut self, key: FrameKey) -> io::Result<()> {
        self.lock().seal_with(key)
    }

    fn write_frame(&mut self, covered: &[&[u8]], wire: &[&[u8]]) -> io::Result<()> {
        self.lock().write_frame(covered, wire)
    }
}

/// Runs `session` with a heartbeat on `writer` until it returns. The heartbeat stops at the
/// first write that fails (the session's own reads and writes then fail too).
pub(super) fn with_heartbeat<T>(
    writer: &mut FrameWriter<LinkWriter>,
    session: impl FnOnce(&mut &SharedWriter<'_>) -> T,
) -> T {
    let shared = SharedWriter(Mutex::new(writer));
    let (stop, stopped) = mpsc::channel::<()>();
    let heart = &shared;
    std::thread::scope(|scope| {
        scope.spawn(move || {
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(HEARTBEAT) {
                let mut writer = heart;
                if let Err(e) = wire::write_message(&mut writer, &Message::Working) {
                    tracing::debug!("heartbeat stopped: {e}");
                    break;
                }
            }
        });
        let result = session(&mut &shared);
        drop(stop);
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::FrameReader;
    use std::net::{TcpListener, TcpStream};
    use std::time::Instant;

    /// A session that works for a while without writing is heard from every `HEARTBEAT`, and
    /// its own messages arrive whole between the beats, each with the tag of its place on a
    /// sealed connection.
    #[test]
    fn a_busy_session_is_heard_from_every_heartbeat() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let mut writer = FrameWriter::new(LinkWriter::Plain(listener.accept().unwrap().0));
        writer.seal_with(FrameKey::new([1; 32])).unwrap();
        let started = Instant::now();
        with_heartbeat(&mut writer, |writer| {
            std::thread::sleep(HEARTBEAT * 3 + HEARTBEAT / 2);
            wire::write_message(writer, &Message::Done).unwrap();
        });
        drop(writer);
        let mut reader = FrameReader::new(client, 0);
        reader.open_sealed(FrameKey::new([1; 32]));
        let mut messages = Vec::new();
        while let Ok(m) = reader.read_message() {
            messages.push(m);
        }
        assert_eq!(
            messages,
            [
                Message::Working,
                Message::Working,
                Message::Working,
                Message::Done
            ]
        );
        assert!(started.elapsed() < HEARTBEAT * 5);
    }
}
