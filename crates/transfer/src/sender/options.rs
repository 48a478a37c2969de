//! How a transfer sends: the one options type of the sending side ([`SendOptions`]), with the
//! defaults `xfer send` has, set field by field, through its builder methods, or read with
//! serde from a service's configuration.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::SendError;
use crate::filter::Filter;
use crate::quic::Congestion;
use crate::stripe::Stripe;
use crate::transport::Transport;
use crate::wire;

/// Streams a transfer opens at first when nothing else says (`xfer send` without `--streams`).
pub const DEFAULT_STREAMS: usize = 4;
/// Default [`SendOptions::unit_size`] (`xfer send` without `--unit-size`): 4 MiB.
pub const DEFAULT_UNIT_SIZE: u32 = 4 << 20;
/// Default [`SendOptions::stall_timeout`]: one minute.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Shortest [`SendOptions::stall_timeout`]: two heartbeats.
pub const MIN_STALL_TIMEOUT: Duration = Duration::from_secs(2 * wire::HEARTBEAT.as_secs());
/// Default [`SendOptions::unsent_limit`]: 128 KiB. On the development VM it more than doubled
/// single-stream throughput over a veth pair (21 to 51 Gbit/s) against the kernel's default of no
/// limit, which lets each socket queue megabytes that fall out of cache before they are sent.
pub const DEFAULT_UNSENT_LIMIT: u32 = 128 << 10;

/// How to send. Every field has a default (`SendOptions::default()`, the one `xfer send` has);
/// change the ones you need by assignment or with the builder methods of the same names. In a
/// configuration file each may be left out, and times read as `"90s"`, `"2m"` or seconds.
///
/// ```
/// use std::time::Duration;
/// use transfer::sender::SendOptions;
/// use transfer::transport::Transport;
///
/// let options = SendOptions::default()
///     .streams(8)
///     .encrypt(true)
///     .stall_timeout(Duration::from_secs(120));
/// assert_eq!(options.transport, Transport::Tcp);
///
/// let read: SendOptions = toml::from_str("streams = 8\nencrypt = true\nstall_timeout = \"2m\"")?;
/// assert_eq!(read, options);
/// // A misspelt field is an error that names it, not a setting silently ignored.
/// let typo = toml::from_str::<SendOptions>("strems = 4").unwrap_err();
/// assert!(typo.to_string().contains("unknown field `strems`"), "{typo}");
/// # Ok::<(), toml::de::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SendOptions {
    /// Streams to open at first (a controller, or [`super::Transfer::set_target_streams`],
    /// changes the count later). A [`crate::SendJob`] whose controller names its count
    /// (`fixed:N`, a schedule) starts at that count instead.
    pub streams: usize,
    /// Largest work unit in bytes (capped by the receiver's limit).
    pub unit_size: u32,
    /// Also compare a BLAKE3 hash of each whole file end to end.
    pub verify: bool,
    /// Compare files already at the receiver by content, not by size and mtime: a file
    /// rewritten with the same size and mtime is sent again. Both sides hash (BLAKE3) only the
    /// files the receiver holds at the source's size, while other files' data flows
    /// ([`crate::wire::PresentFiles::Compared`]).
    pub checksum: bool,
    /// Read source files with direct I/O (`O_DIRECT`), bypassing the page cache: for parallel
    /// file systems, and so that a transfer does not fill this host's page cache. A file whose
    /// file system does not support it fails the transfer with that reason.
    pub direct_io: bool,
    /// Cap on each stream's sending rate in bytes per second (`SO_MAX_PACING_RATE`, enforced by
    /// TCP's own pacing), as paper 001 throttles each stream; `None`: no cap. TCP only.
    pub stream_rate_cap: Option<u64>,
    /// Which of the source files are sent ([`crate::filter`]); the default sends them all.
    /// Generated data (`SendSource::Memory`) takes none.
    pub filter: Filter,
    /// Mirror the sources (`xfer send --delete`): once every file is in place, the receiver
    /// removes what the directories sent hold and the sources do not, except what
    /// [`SendOptions::filter`] leaves out (as rsync's `--delete`; a file sent alone removes
    /// nothing beside it). [`super::preview`] lists what a run would remove.
    pub delete: bool,
    /// One limit on the whole transfer's sending rate, however many streams share it (any
    /// transport), constant or on a timetable over the day: each stream waits its turn before
    /// it takes a unit; `None`: no limit. The controller keeps choosing the count within it.
    /// In a configuration file, as the command line reads it: `rate_limit = "300Mbit"` or
    /// `rate_limit = "08:00,300Mbit 18:00,off"`.
    pub rate_limit: Option<super::RateSchedule>,
    /// Fewest bytes each stream may keep queued in its socket but not yet sent
    /// (`TCP_NOTSENT_LOWAT`; data already in flight is not counted, so this does not limit the
    /// window). A stream starts with this queue and, on a long path, grows it to twice the
    /// path's bandwidth-delay product (its own rate times the streams sharing the path times its
    /// minimum RTT; at most 16 MiB), so that its writer wakes a few times per round trip rather
    /// than every 64 KiB; on a short path, where the CPU limits, the small queue keeps the data
    /// being sent in cache. [`DEFAULT_UNSENT_LIMIT`] suits most links; 0 leaves the
    /// system default (`net.ipv4.tcp_notsent_lowat`, unlimited unless set) and does not grow it.
    pub unsent_limit: u32,
    /// TLS 1.3 on the control connection and every data stream.
    pub encrypt: bool,
    /// Without `encrypt`: seal every frame after the key handshake with a keyed BLAKE3 tag
    /// ([`crate::seal`]), so that nobody on the path can change, drop, replay or reorder a
    /// chunk or a message unseen, at less cost than encryption.
    pub integrity: bool,
    /// TCP, MPTCP or QUIC. MPTCP falls back to TCP where this host or the receiver lacks it
    /// ([`super::Transfer::transport`] says which is used, [`super::Transfer::notices`] why).
    /// QUIC encrypts everything: the control connection uses TLS as with `encrypt`.
    pub transport: Transport,
    /// The congestion controller of each QUIC connection (TCP and MPTCP use the kernel's).
    pub congestion: Congestion,
    /// How long the receiver may stay silent before its connection is given up (raised to
    /// [`MIN_STALL_TIMEOUT`]): on the control connection, where it says `Working` every
    /// heartbeat however busy it is, the transfer then fails with a clear error; on a data
    /// stream with units in flight and no acknowledgement, the stream is closed and its units
    /// go to the other streams. [`DEFAULT_STALL_TIMEOUT`] suits most links.
    #[serde(with = "crate::duration")]
    pub stall_timeout: Duration,
    /// This node's place in a striped transfer (`xfer send --stripe I/K`, [`crate::stripe`]):
    /// it sends only its share of the sources, which the other nodes of the transfer, reading
    /// the same file system, complete. `None`: the whole sources. Files only, and neither
    /// [`SendOptions::verify`], [`SendOptions::checksum`] nor [`SendOptions::delete`], which
    /// need a node that holds every file whole.
    pub stripe: Option<Stripe>,
}

impl Default for SendOptions {
    fn default() -> Self {
        SendOptions {
            streams: DEFAULT_STREAMS,
            unit_size: DEFAULT_UNIT_SIZE,
            verify: false,
            checksum: false,
            direct_io: false,
            stream_rate_cap: None,
            rate_limit: None,
            filter: Filter::default(),
            delete: false,
            unsent_limit: DEFAULT_UNSENT_LIMIT,
            encrypt: false,
            integrity: false,
            transport: Transport::Tcp,
            congestion: Congestion::default(),
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            stripe: None,
        }
    }
}

impl SendOptions {
    /// Sets [`SendOptions::streams`].
    pub fn streams(mut self, streams: usize) -> Self {
        self.streams = streams;
        self
    }

    /// Sets [`SendOptions::unit_size`].
    pub fn unit_size(mut self, bytes: u32) -> Self {
        self.unit_size = bytes;
        self
    }

    /// Sets [`SendOptions::verify`].
    pub fn verify(mut self, verify: bool) -> Self {
        self.verify = verify;
        self
    }

    /// Sets [`SendOptions::checksum`].
    pub fn checksum(mut self, checksum: bool) -> Self {
        self.checksum = checksum;
        self
    }

    /// Sets [`SendOptions::direct_io`].
    pub fn direct_io(mut self, direct_io: bool) -> Self {
        self.direct_io = direct_io;
        self
    }

    /// Sets [`SendOptions::stream_rate_cap`].
    pub fn stream_rate_cap(mut self, bytes_per_second: Option<u64>) -> Self {
        self.stream_rate_cap = bytes_per_second;
        self
    }

    /// Sets [`SendOptions::stripe`].
    pub fn stripe(mut self, stripe: Option<Stripe>) -> Self {
        self.stripe = stripe;
        self
    }

    /// Sets [`SendOptions::delete`].
    pub fn delete(mut self, delete: bool) -> Self {
        self.delete = delete;
        self
    }

    /// What a session's `Start` asks the receiver to remove (see [`SendOptions::delete`]).
    pub(super) fn deletion(&self) -> Option<Filter> {
        self.delete.then(|| self.filter.clone())
    }

    /// Sets [`SendOptions::filter`].
    pub fn filter(mut self, filter: Filter) -> Self {
        self.filter = filter;
        self
    }

    /// Sets [`SendOptions::rate_limit`].
    pub fn rate_limit(mut self, schedule: Option<super::RateSchedule>) -> Self {
        self.rate_limit = schedule;
        self
    }

    /// Sets [`SendOptions::unsent_limit`].
    pub fn unsent_limit(mut self, bytes: u32) -> Self {
        self.unsent_limit = bytes;
        self
    }

    /// Sets [`SendOptions::encrypt`].
    pub fn encrypt(mut self, encrypt: bool) -> Self {
        self.encrypt = encrypt;
        self
    }

    /// Sets [`SendOptions::integrity`].
    pub fn integrity(mut self, integrity: bool) -> Self {
        self.integrity = integrity;
        self
    }

    /// Sets [`SendOptions::transport`].
    pub fn transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    /// Sets [`SendOptions::congestion`].
    pub fn congestion(mut self, congestion: Congestion) -> Self {
        self.congestion = congestion;
        self
    }

    /// Sets [`SendOptions::stall_timeout`].
    pub fn stall_timeout(mut self, timeout: Duration) -> Self {
        self.stall_timeout = timeout;
        self
    }

    /// Refuses options that cannot work together, with the reason; [`crate::SendJob::start`]
    /// and [`crate::sender::Transfer::start`] check them too, so a program calls this only to
    /// refuse them before it does something else first.
    ///
    /// ```
    /// use transfer::sender::SendOptions;
    /// use transfer::transport::Transport;
    ///
    /// let quic_capped = SendOptions::default().transport(Transport::Quic).stream_rate_cap(Some(1 << 20));
    /// assert!(quic_capped.check().unwrap_err().to_string().contains("needs TCP"));
    /// assert!(SendOptions::default().check().is_ok());
    /// ```
    pub fn check(&self) -> Result<(), SendError> {
        if self.streams == 0 {
            return Err(SendError::Settings("streams must be at least 1".into()));
        }
        let steps = self.rate_limit.iter().flat_map(|s| s.steps());
        if steps.clone().any(|step| step.bytes_per_second == Some(0)) {
            return Err(SendError::Settings(
                "a rate limit must be above 0 bytes per second".into(),
            ));
        }
        if let Some(stripe) = self.stripe {
            let whole = [
                (self.verify, "--verify hashes each whole file"),
                (self.checksum, "--checksum hashes each whole file"),
                (
                    self.delete,
                    "--delete needs the whole manifest at one receiver",
                ),
            ];
            if let Some((_, why)) = whole.iter().find(|(set, _)| *set) {
                return Err(SendError::Settings(format!(
                    "a striped transfer (node {stripe}) sends a share of each file: {why}"
                )));
            }
        }
        if self.transport != Transport::Tcp && self.stream_rate_cap.is_some() {
            return Err(SendError::Settings(format!(
                "a per-stream rate cap needs TCP: {}",
                match self.transport {
                    Transport::Mptcp => "Linux cannot pace MPTCP connections (SO_MAX_PACING_RATE)",
                    _ => "QUIC connections are paced by their congestion controller alone",
                }
            )));
        }
        Ok(())
    }

    /// What the session does with files the receiver already holds: compared by content
    /// (`checksum`, which verifies them too), verified (`verify`), or kept.
    pub(super) fn present(&self) -> wire::PresentFiles {
        match (self.checksum, self.verify) {
            (true, _) => wire::PresentFiles::Compared,
            (false, true) => wire::PresentFiles::Verified,
            (false, false) => wire::PresentFiles::Kept,
        }
    }

    /// Whether its connections seal their frames ([`SendOptions::integrity`]; TLS and QUIC
    /// protect them already).
    pub(super) fn seals(&self) -> bool {
        self.integrity && !self.encrypt && self.transport != Transport::Quic
    }
}
