//! How the receiver reads a connection on a thread of its own: with a deadline for the key
//! handshake, then with an idle clock shared by every connection of a session, so that a peer
//! that holds a session open without sending anything is cut off while a session whose control
//! connection is quiet because its streams are busy is not.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;

use crate::quic::QuicReader;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a quiet connection looks at its session's idle clock.
pub(super) const CONTROL_POLL: Duration = Duration::from_millis(500);

/// When any connection of a session last received a byte, and whether the receiver itself is
/// busy for the session (sealing or finishing), which does not count as idle.
#[derive(Debug)]
pub(super) struct Activity {
    epoch: Instant,
    last_ms: AtomicU64,
    busy: AtomicU32,
}

impl Activity {
    pub(super) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
            busy: AtomicU32::new(0),
        })
    }

    pub(super) fn touch(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        // Only ever moves forward; a relaxed max keeps concurrent streams from racing it back.
        self.last_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// How long nothing has been received, or `None` while the receiver is busy for the session.
    pub(super) fn idle_for(&self) -> Option<Duration> {
        if self.busy.load(Ordering::Acquire) > 0 {
            return None;
        }
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        Some(self.epoch.elapsed().saturating_sub(last))
    }

    /// Marks the receiver busy for the session until the guard drops; the clock restarts then.
    pub(super) fn busy(&self) -> BusyGuard<'_> {
        self.busy.fetch_add(1, Ordering::AcqRel);
        BusyGuard(self)
    }
}

/// See [`Activity::busy`].
pub(super) struct BusyGuard<'a>(&'a Activity);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a connection's bytes come from.
pub(super) enum Source {
    /// A TCP or MPTCP socket.
    Tcp(TcpStream),
    /// A QUIC connection's stream.
    Quic(QuicReader),
}

impl Source {
    fn set_read_timeout(&mut self, timeout: Duration) -> std::io::Result<()> {
        match self {
            Source::Tcp(socket) => socket.set_read_timeout(Some(timeout)),
            Source::Quic(stream) => {
                stream.set_read_timeout(Some(timeout));
                Ok(())
            }
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::Tcp(socket) => socket.read(buf),
            Source::Quic(stream) => stream.read(buf),
        }
    }
}

/// A connection's reader. Reads fail with `TimedOut` once the watched [`Activity`] has been idle
/// for the limit.
pub(super) struct ConnReader {
    source: Source,
    activity: Arc<Activity>,
    idle_limit: Duration,
    /// Until the session is watched: when the handshake must be done, however steadily the
    /// peer trickles bytes.
    deadline: Option<Instant>,
}

impl ConnReader {
    /// A reader for the handshake: it fails once `limit` has passed since it was made, whether
    /// or not bytes arrive.
    pub(super) fn new(mut source: Source, limit: Duration) -> std::io::Result<Self> {
        source.set_read_timeout(limit)?;
        Ok(ConnReader {
            source,
            activity: Activity::new(),
            idle_limit: limit,
            deadline: Some(Instant::now() + limit),
        })
    }

    /// From now on, fails once `activity` (the session's) has been idle for `limit`.
    pub(super) fn watch_session(
        &mut self,
        activity: Arc<Activity>,
        limit: Duration,
    ) -> std::io::Result<()> {
        self.source.set_read_timeout(limit.min(CONTROL_POLL))?;
        self.activity = activity;
        self.idle_limit = limit;
        self.deadline = None;
        Ok(())
    }

    /// Before a read in the handshake: fails once the deadline passed, else bounds the read's
    /// wait by what is left of it.
    fn within_deadline(&mut self) -> std::io::Result<()> {
        let Some(deadline) = self.deadline else {
            return Ok(());
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                ErrorKind::TimedOut,
                format!(
                    "handshake not done within {:.0?} (the most a connection may take to \
                     authenticate)",
                    self.idle_limit
                ),
            ));
        }
        self.source.set_read_timeout(left)
    }
}

/// The error of a read that found the session idle for `limit`.
pub(super) fn idle(limit: Duration) -> std::io::Error {
    std::io::Error::new(
        ErrorKind::TimedOut,
        format!("session idle: nothing received for {limit:.0?}"),
    )
}

impl Read for ConnReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            self.within_deadline()?;
            match self.source.read(buf) {
                Ok(n) => {
                    self.activity.touch();
                    return Ok(n);
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if self.deadline.is_none()
                        && self
                            .activity
                            .idle_for()
                            .is_some_and(|idle| idle >= self.idle_limit)
                    {
                        return Err(idle(self.idle_limit));
                    }
                }
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
        let mut reader = ConnReader::new(Source::Tcp(server), Duration::from_millis(200)).unwrap();
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
        let mut reader = ConnReader::new(Source::Tcp(server), limit).unwrap();
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

    /// A quiet connection lives as long as another connection of its session receives bytes,
    /// and while the receiver is busy for the session; then it times out.
    #[test]
    fn a_session_is_idle_only_when_none_of_its_connections_receives() {
        let (_quiet_client, quiet) = pair();
        let (mut busy_client, busy) = pair();
        let activity = Activity::new();
        let limit = Duration::from_millis(300);
        let mut quiet = ConnReader::new(Source::Tcp(quiet), limit).unwrap();
        quiet.watch_session(activity.clone(), limit).unwrap();
        let mut busy = ConnReader::new(Source::Tcp(busy), limit).unwrap();
        busy.watch_session(activity.clone(), limit).unwrap();
        let feeder = std::thread::spawn(move || {
            let mut got = 0;
            let mut buf = [0u8; 1];
            while got < 8 {
                busy_client.write_all(b"x").unwrap();
                std::thread::sleep(Duration::from_millis(100));
                got += busy.read(&mut buf).unwrap();
            }
            (busy_client, busy)
        });
        let started = Instant::now();
        {
            let _guard = activity.busy();
            std::thread::sleep(Duration::from_millis(100));
        }
        let err = quiet.read(&mut [0u8; 1]).unwrap_err();
        assert!(err.to_string().contains("session idle"), "{err}");
        // 8 feeds of 100 ms kept it alive; it died about `limit` after the last one.
        assert!(
            started.elapsed() >= Duration::from_millis(800),
            "{:?}",
            started.elapsed()
        );
        let _ = feeder.join().unwrap();
    }
}
