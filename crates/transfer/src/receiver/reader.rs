//! How the receiver reads a TCP connection on the thread of its key handshake: with a deadline
//! for the handshake, after which the connection is handed over to a task
//! ([`crate::task_io`]) that reads it against its session's idle clock.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A connection's reader for its key handshake: reads fail with `TimedOut` once the handshake's
/// limit has passed since the reader was made, however steadily the peer trickles bytes.
pub(super) struct ConnReader {
    socket: TcpStream,
    limit: Duration,
    deadline: Instant,
}

impl ConnReader {
    /// A reader whose reads fail once `limit` has passed from now.
    pub(super) fn new(socket: TcpStream, limit: Duration) -> std::io::Result<Self> {
        socket.set_read_timeout(Some(limit))?;
        Ok(ConnReader {
            socket,
            limit,
            deadline: Instant::now() + limit,
        })
    }
}

impl Read for ConnReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "handshake not done within {:.0?} (the most a connection may take to \
                         authenticate)",
                        self.limit
                    ),
                ));
            }
            self.socket.set_read_timeout(Some(left))?;
            match self.socket.read(buf) {
                Ok(n) => return Ok(n),
                // The deadline is looked at again.
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        (client, listener.accept().unwrap().0)
    }

    #[test]
    fn a_silent_handshake_times_out_with_a_clear_reason() {
        let (_client, server) = pair();
        let mut reader = ConnReader::new(server, Duration::from_millis(200)).unwrap();
        let started = Instant::now();
        let err = reader.read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TimedOut);
        assert!(
            err.to_string().contains("handshake not done within"),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    /// The handshake's limit is a deadline, not an idle timeout: a peer that trickles a byte
    /// well within every idle period is still cut off once the limit has passed.
    #[test]
    fn a_trickling_handshake_ends_at_its_deadline() {
        let (mut client, server) = pair();
        let limit = Duration::from_millis(600);
        let mut reader = ConnReader::new(server, limit).unwrap();
        let trickle = std::thread::spawn(move || {
            for _ in 0..20 {
                if client.write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let started = Instant::now();
        let mut got = 0;
        let err = loop {
            match reader.read(&mut [0u8; 1]) {
                Ok(n) => got += n,
                Err(e) => break e,
            }
        };
        assert!(got >= 4, "the trickle arrived: {got} bytes");
        let took = started.elapsed();
        assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
        assert!(took >= limit && took < limit * 2, "{took:?}");
        trickle.join().unwrap();
    }
}
