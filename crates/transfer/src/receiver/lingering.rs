//! Connections refused at their accept, told why and closed gracefully by one thread. Closing a
//! socket whose peer's first bytes are still unread resets the connection, and a reset can
//! destroy the reply before the peer reads it ("Connection reset by peer", which says
//! nothing); so each refused connection is half-closed after its reply and kept until the peer
//! closes its side or [`LINGER`] passes, reading and discarding what it sends. One thread does
//! this for up to [`MOST`] connections at once, so that a flood of refusals costs neither a
//! thread each nor unbounded memory; beyond that, under a flood, connections are closed at once.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::time::{Duration, Instant};

use crate::wire::{self, Message};

/// The most a refused connection is kept for its peer to read the reply.
pub(super) const LINGER: Duration = Duration::from_secs(2);
/// Most refused connections kept at once.
const MOST: usize = 1024;
/// How often the lingering connections are looked at.
const TICK: Duration = Duration::from_millis(20);

/// The thread closing refused connections; it ends when this is dropped.
#[derive(Debug)]
pub(super) struct Lingering(SyncSender<TcpStream>);

impl Lingering {
    pub(super) fn start() -> std::io::Result<Lingering> {
        let (tx, rx) = mpsc::sync_channel(MOST);
        std::thread::Builder::new()
            .name("xfer-refusing".into())
            .spawn(move || close_gracefully(rx))?;
        Ok(Lingering(tx))
    }

    /// Replies `reply` on `socket` and closes it once its peer has had the chance to read it.
    pub(super) fn refuse(&self, socket: TcpStream, reply: &Message) {
        let mut frame = Vec::new();
        if wire::write_message(&mut frame, reply).is_err() || socket.set_nonblocking(true).is_err()
        {
            return;
        }
        // What the peer sent first is usually here already: read before the reply, so that
        // a close right after it (when too many linger) resets nothing.
        discard_available(&socket);
        if (&socket).write_all(&frame).is_err() || socket.shutdown(Shutdown::Write).is_err() {
            return;
        }
        let _ = self.0.try_send(socket);
    }
}

/// Reads and discards what has arrived; whether the peer has closed its side (or the
/// connection failed).
fn discard_available(mut socket: &TcpStream) -> bool {
    let mut sink = [0u8; 16 << 10];
    loop {
        match socket.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return true,
        }
    }
}

fn close_gracefully(new: Receiver<TcpStream>) {
    let mut lingering: Vec<(TcpStream, Instant)> = Vec::new();
    loop {
        let now = Instant::now();
        loop {
            match new.try_recv() {
                Ok(socket) => lingering.push((socket, now + LINGER)),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if lingering.is_empty() => return,
                Err(TryRecvError::Disconnected) => break,
            }
        }
        lingering.retain(|(socket, until)| now < *until && !discard_available(socket));
        if lingering.is_empty() {
            match new.recv() {
                Ok(socket) => lingering.push((socket, Instant::now() + LINGER)),
                Err(_) => return,
            }
        } else {
            std::thread::sleep(TICK);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{FrameReader, Limit};
    use std::net::TcpListener;

    /// A refused peer reads the reply and then the end of the connection, even when it sent
    /// bytes the receiver never read.
    #[test]
    fn a_refused_peer_reads_why_before_the_connection_ends() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let lingering = Lingering::start().unwrap();
        let mut clients = Vec::new();
        for _ in 0..50 {
            let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            client.write_all(&[7u8; 300]).unwrap();
            let (socket, _) = listener.accept().unwrap();
            let limit = Limit::Sessions { max: 3 };
            lingering.refuse(socket, &Message::Limited { limit });
            clients.push(client);
        }
        for client in clients {
            client
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut frames = FrameReader::new(&client, 0);
            assert_eq!(
                frames.read_message().unwrap(),
                Message::Limited {
                    limit: Limit::Sessions { max: 3 }
                }
            );
            assert_eq!(
                (&client).read(&mut [0u8; 8]).unwrap(),
                0,
                "then a clean end"
            );
        }
    }
}
