//! How a receiver serves: the one options type of the receiving side ([`ReceiverOptions`]):
//! the limits that keep one peer from taking the receiver down, the transport and what it
//! requires of sessions, with defaults, builder methods and serde.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ReceiverError;
use crate::transport::Transport;
use crate::wire::{self, SessionLimits};

/// Default [`ReceiverOptions::max_streams`]: data streams one session may open.
pub const DEFAULT_MAX_STREAMS: u32 = 256;
/// Default [`ReceiverOptions::max_chunk`]: 16 MiB.
pub const DEFAULT_MAX_CHUNK: u32 = 16 << 20;
/// Default [`ReceiverOptions::max_sessions`].
pub const DEFAULT_MAX_SESSIONS: usize = 32;
/// Default [`ReceiverOptions::session_memory`]: 4 GiB.
pub const DEFAULT_SESSION_MEMORY: u64 = 4 << 30;
/// Default [`ReceiverOptions::idle_timeout`]: five minutes.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Default [`ReceiverOptions::handshake_timeout`]: 10 seconds, enough for a TLS and a key
/// handshake over the longest paths (a few round trips of 250 ms).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`ReceiverOptions::max_handshakes`].
pub const DEFAULT_MAX_HANDSHAKES: usize = 64;
/// Default [`ReceiverOptions::max_handshakes_per_source`].
pub const DEFAULT_MAX_HANDSHAKES_PER_SOURCE: usize = 8;

/// How a receiver serves. A peer that breaks a limit loses its connection or its session, with
/// the reason logged; the receiver goes on serving everyone else. Every field has a default
/// (`ReceiverOptions::default()`, the one `xfer recv` has): 256 streams per session, 16 MiB
/// chunks, 4 GiB of buffers per session, 32 sessions, 64 MiB manifest batches, 262,144 unsealed
/// files a session and 524,288 in all, 64 connections in their handshake (8 from one address),
/// a 10 s handshake and a 5 min idle timeout; plain, sealed and encrypted sessions; TCP; writes
/// through the page cache. Change fields by assignment or with the builder methods of the same
/// names; in a configuration file each may be left out, and times read as `"90s"` or `"5m"`.
///
/// ```
/// use std::time::Duration;
/// use transfer::receiver::ReceiverOptions;
///
/// let options = ReceiverOptions::default()
///     .max_sessions(8)
///     .max_streams(64)
///     .idle_timeout(Duration::from_secs(60))
///     .require_encryption(true);
/// let read: ReceiverOptions = toml::from_str(
///     "max_sessions = 8\nmax_streams = 64\nidle_timeout = \"1m\"\nrequire_encryption = true",
/// )?;
/// assert_eq!(read, options);
/// # Ok::<(), toml::de::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ReceiverOptions {
    /// Listen for TCP, or for MPTCP (which also takes plain TCP senders; where this host
    /// cannot make MPTCP sockets the receiver listens for TCP and logs why). QUIC is served
    /// beside either (see `quic`); `Quic` here insists on it: the receiver does not start
    /// where it cannot serve QUIC.
    pub transport: Transport,
    /// Also serve QUIC senders (`xfer send --transport quic`) on the UDP port of the same
    /// number; TCP still carries every session's control connection. Where that UDP port
    /// cannot be bound, the receiver serves TCP alone and logs why.
    pub quic: bool,
    /// Refuse sessions that are not encrypted (TLS); encrypted ones are always accepted.
    pub require_encryption: bool,
    /// Refuse sessions whose frames are neither sealed ([`crate::seal`], `xfer send
    /// --integrity`) nor encrypted.
    pub require_integrity: bool,
    /// Write received files with direct I/O (`O_DIRECT`), bypassing the page cache: for
    /// parallel file systems, and so that transfers do not fill this host's page cache. The
    /// receiver refuses to start when a root's file system does not support it.
    pub direct_io: bool,
    /// Most data streams one session may open (further bounded by `session_memory`).
    pub max_streams: u32,
    /// Largest chunk a sender may send, in bytes.
    pub max_chunk: u32,
    /// Most sessions served at once; more are refused with the reason.
    pub max_sessions: usize,
    /// Most bytes of chunk buffers one session may hold: each data stream holds up to one
    /// chunk, so this bounds its streams to `session_memory / max_chunk`.
    pub session_memory: u64,
    /// Largest batch of the manifest a session may send, in encoded bytes.
    pub max_manifest: usize,
    /// Most files a session may have announced and not yet sealed (a sender holds back its
    /// manifest to stay below [`wire::SENDER_UNSEALED`]); each costs the receiver some
    /// hundreds of bytes until its seal.
    pub max_unsealed: usize,
    /// Most files all sessions together may have announced and not yet sealed: a batch beyond
    /// it waits up to 30 s for other sessions to seal theirs, then is refused. It bounds the
    /// memory announced files take however many sessions there are (about 0.5 KiB each: the
    /// default is some 280 MiB).
    pub max_unsealed_total: usize,
    /// Most connections from addresses without a running session that may be in their key
    /// handshake at once; an address with a running session has as many places of its own, so
    /// that its new data streams never wait behind strangers. More are refused at once with
    /// [`wire::Limit::Authenticating`], which a sender takes as "try again in a moment".
    pub max_handshakes: usize,
    /// Most of those places one address (an IPv6 /64) may hold, so that a peer at one address
    /// cannot hold them all.
    pub max_handshakes_per_source: usize,
    /// How long a new connection may take, from its accept, to authenticate and, for control,
    /// to say where its files go: a deadline, however steadily the peer trickles bytes.
    #[serde(with = "crate::duration")]
    pub handshake_timeout: Duration,
    /// How long a session may go without receiving a byte on any of its connections (while the
    /// receiver is not itself busy for it) before it is closed.
    #[serde(with = "crate::duration")]
    pub idle_timeout: Duration,
    /// A fetch may name another receiver to send to (a third-party transfer, with a one-time
    /// credential that receiver granted); off, a fetch's files go only to the host that
    /// asked, so that nobody can make this host connect elsewhere.
    pub third_party: bool,
}

impl Default for ReceiverOptions {
    fn default() -> Self {
        ReceiverOptions {
            transport: Transport::Tcp,
            quic: true,
            require_encryption: false,
            require_integrity: false,
            direct_io: false,
            max_streams: DEFAULT_MAX_STREAMS,
            max_chunk: DEFAULT_MAX_CHUNK,
            max_sessions: DEFAULT_MAX_SESSIONS,
            session_memory: DEFAULT_SESSION_MEMORY,
            max_manifest: wire::MAX_MESSAGE_LEN,
            max_unsealed: 4 * wire::SENDER_UNSEALED,
            max_unsealed_total: 8 * wire::SENDER_UNSEALED,
            max_handshakes: DEFAULT_MAX_HANDSHAKES,
            max_handshakes_per_source: DEFAULT_MAX_HANDSHAKES_PER_SOURCE,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            third_party: false,
        }
    }
}

impl ReceiverOptions {
    /// Sets [`ReceiverOptions::third_party`].
    pub fn third_party(mut self, allow: bool) -> Self {
        self.third_party = allow;
        self
    }

    /// Sets [`ReceiverOptions::transport`].
    pub fn transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    /// Sets [`ReceiverOptions::quic`].
    pub fn quic(mut self, quic: bool) -> Self {
        self.quic = quic;
        self
    }

    /// Sets [`ReceiverOptions::require_encryption`].
    pub fn require_encryption(mut self, require: bool) -> Self {
        self.require_encryption = require;
        self
    }

    /// Sets [`ReceiverOptions::require_integrity`].
    pub fn require_integrity(mut self, require: bool) -> Self {
        self.require_integrity = require;
        self
    }

    /// Sets [`ReceiverOptions::direct_io`].
    pub fn direct_io(mut self, direct_io: bool) -> Self {
        self.direct_io = direct_io;
        self
    }

    /// Sets [`ReceiverOptions::max_streams`].
    pub fn max_streams(mut self, streams: u32) -> Self {
        self.max_streams = streams;
        self
    }

    /// Sets [`ReceiverOptions::max_chunk`].
    pub fn max_chunk(mut self, bytes: u32) -> Self {
        self.max_chunk = bytes;
        self
    }

    /// Sets [`ReceiverOptions::max_sessions`].
    pub fn max_sessions(mut self, sessions: usize) -> Self {
        self.max_sessions = sessions;
        self
    }

    /// Sets [`ReceiverOptions::session_memory`].
    pub fn session_memory(mut self, bytes: u64) -> Self {
        self.session_memory = bytes;
        self
    }

    /// Sets [`ReceiverOptions::max_manifest`].
    pub fn max_manifest(mut self, bytes: usize) -> Self {
        self.max_manifest = bytes;
        self
    }

    /// Sets [`ReceiverOptions::max_unsealed`].
    pub fn max_unsealed(mut self, files: usize) -> Self {
        self.max_unsealed = files;
        self
    }

    /// Sets [`ReceiverOptions::max_unsealed_total`].
    pub fn max_unsealed_total(mut self, files: usize) -> Self {
        self.max_unsealed_total = files;
        self
    }

    /// Sets [`ReceiverOptions::max_handshakes`].
    pub fn max_handshakes(mut self, connections: usize) -> Self {
        self.max_handshakes = connections;
        self
    }

    /// Sets [`ReceiverOptions::max_handshakes_per_source`].
    pub fn max_handshakes_per_source(mut self, connections: usize) -> Self {
        self.max_handshakes_per_source = connections;
        self
    }

    /// Sets [`ReceiverOptions::handshake_timeout`].
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Sets [`ReceiverOptions::idle_timeout`].
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Refuses options that cannot work, naming the field.
    pub(super) fn check(&self) -> Result<(), ReceiverError> {
        if self.max_streams == 0 || self.max_sessions == 0 {
            return Err(ReceiverError::Settings(
                "max_streams and max_sessions must be at least 1".into(),
            ));
        }
        if self.max_handshakes == 0 || self.max_handshakes_per_source == 0 {
            return Err(ReceiverError::Limits(
                "max_handshakes and max_handshakes_per_source must be at least 1".into(),
            ));
        }
        for (name, time) in [
            ("idle_timeout", self.idle_timeout),
            ("handshake_timeout", self.handshake_timeout),
        ] {
            crate::duration::positive(name, time).map_err(ReceiverError::Settings)?;
        }
        Ok(())
    }

    /// The limits announced to a session that may open `max_streams` streams: streams bounded
    /// by what `session_memory` can buffer.
    pub(super) fn announced_limits(
        &self,
        max_streams: u32,
    ) -> Result<SessionLimits, ReceiverError> {
        let streams = self.session_memory / u64::from(self.max_chunk.max(1));
        if streams == 0 {
            return Err(ReceiverError::Limits(format!(
                "a session's memory limit of {} bytes cannot hold one stream's chunk of {} bytes",
                self.session_memory, self.max_chunk
            )));
        }
        Ok(SessionLimits {
            max_streams: max_streams
                .min(u32::try_from(streams).unwrap_or(u32::MAX))
                .max(1),
            max_chunk: self.max_chunk,
        })
    }
}
