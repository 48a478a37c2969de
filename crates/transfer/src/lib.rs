//! The xfer data plane: move files and directory trees (or generated test data) from a sender to
//! a receiver over N parallel TCP, MPTCP or QUIC streams ([`transport`], [`quic`]) whose count
//! may change at any moment, with per-chunk checksums, journaled resume, and per-stream
//! `TCP_INFO` statistics (per subflow for MPTCP, [`mptcp_info`]; QUIC's path statistics in the
//! same shape) for an optimiser that chooses the count.
//!
//! # The model
//!
//! - A **receiver** ([`receiver::Receiver`]) serves **sessions** on one port, under one root
//!   directory, to senders that prove they hold its session key ([`auth`]). Each session is
//!   one transfer: a **control connection** that carries the manifest (which files, how big,
//!   where they land, [`manifest`]) and the receiver's plan for them (what it already has), and
//!   any number of **data streams**.
//! - The sender cuts the files into **work units** (chunks of at most a few MiB). Streams take
//!   units from one shared queue, so a fast stream carries more; the receiver checks each
//!   unit's checksum, writes it, records it in its **journal** ([`journal`]) and acknowledges
//!   it. A file goes into place under its own name only when all of it is verified. A
//!   transfer that is killed or cancelled is resumed by starting it again: the receiver
//!   reports what it holds and only the rest is sent.
//! - **Streams** can be added and removed at any moment: a removed stream finishes its units
//!   first; one that breaks hands its units back to the others.
//! - The **optimiser** chooses the stream count: every **monitoring interval** (1 s by
//!   default) the streams' counters become an `Observation` (throughput, loss, RTT ratio and
//!   gradient, utility `T/K^n - T*L*B`), and a [`optimizer::Controller`] returns the count for
//!   the next interval, on its own thread, never holding up the data. [`optimizer_choice`]
//!   names the built-in ones (`auto`, the default: a learned policy guarded by a tuner; `ppo`,
//!   `gd`, `bo`, `fixed:N`); a service can plug in its own.
//!
//! # For services
//!
//! [`job::SendJob`] runs one transfer from [`job::SenderSettings`] (serde: keep them in your
//! own configuration file): the receiver and its key, what to send ([`sender::SendSource`]),
//! the controller, and how to send ([`sender::SendOptions`], every field with a default). It
//! reports it as a stream of [`job::SendEvent`]s (progress, the
//! optimiser's decisions, notices, the end), can be cancelled at any moment, and ends with a
//! [`sender::Summary`] or a [`sender::SendError`]. Its methods only wait on channels, so they
//! suit any async runtime; a program without one waits on its own thread
//! ([`job::SendJob::wait`]). The `examples/` directory has a send/receive pair
//! (`send_receive`), a directory sent with no async runtime (`send_directory`), a queue of
//! transfers with a concurrency limit (`transfer_queue`) and a controller of one's own
//! (`custom_controller`).
//!
//! A receiver ([`receiver::ReceiverSettings`], serde as well) reports its sessions as a stream
//! of [`receiver::ReceiverEvent`]s ([`receiver::Receiver::subscribe`]): each start, each end
//! with a [`receiver::SessionReport`], and refused connections. Its
//! [`receiver::Stopper`] stops it gracefully or ends one session. Both ends name a session
//! by the same [`session_id::SessionId`]. One receiver serves several projects with
//! [`receiver::Tenant`]s: a key each, each key's sessions confined to its own root and limits.
//!
//! # Below the jobs
//!
//! - [`receiver::Receiver`] serves sessions on one port ([`receiver::ReceiverSettings`],
//!   [`receiver::ReceiverOptions`]).
//! - [`sender::Transfer`] runs one transfer ([`sender::SendOptions`], [`sender::SendSource`]);
//!   [`sender::Transfer::set_target_streams`] changes the stream count live,
//!   [`sender::Transfer::sample_streams`] reads each stream's counters, and
//!   [`sender::Transfer::optimize`] hands the count to a controller.
//! - [`auth`] is the key handshake and the keys, [`manifest`] what is sent, [`policy_source`]
//!   loads learned policies.
//! - The protocol's internals (`wire`, the frames and messages; `journal`, the receiver's
//!   record of verified chunks; `tls` and `seal`, encryption and integrity; `link`, a
//!   connection's halves) are public only for the crate's own tests, fuzz targets and
//!   benchmarks: hidden from this documentation and outside the API's promises.
//!   `docs/architecture.md` in the repository describes them.
//!
//! The types most programs need are re-exported here: [`SendJob`] with [`SenderSettings`],
//! [`SendSource`], [`SendOptions`] and [`SendEvent`], [`Receiver`] with [`ReceiverSettings`] and [`ReceiverEvent`], [`SendError`]
//! and [`Summary`].

#![warn(missing_docs)]

pub mod auth;
mod cause;
mod direct_io;
mod duration;
pub mod external;
pub mod filter;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod idle;
pub mod job;
#[doc(hidden)]
pub mod journal;
#[doc(hidden)]
pub mod link;
pub mod manifest;
pub mod mptcp_info;
pub mod optimizer_choice;
#[cfg(test)]
mod pair_tests;
pub mod policy_source;
pub mod quic;
pub mod receiver;
mod runtime;
#[doc(hidden)]
pub mod seal;
pub mod sender;
pub mod session_id;
pub mod stripe;
mod sync;
mod sys;
mod task_io;
pub mod tcp_info;
pub mod telemetry;
#[doc(hidden)]
pub mod tls;
pub mod transport;
pub mod units;
#[doc(hidden)]
pub mod wire;

pub use auth::{KeySetting, SessionKey};
pub use cause::Cause;
pub use job::{SendEvent, SendJob, SenderSettings};
pub use optimizer_choice::{OptimizerChoice, OptimizerError, Tuning};
pub use receiver::{
    Receiver, ReceiverError, ReceiverEvent, ReceiverOptions, ReceiverSettings, SessionOutcome,
    SessionReport, Stopper,
};
pub use sender::{SendError, SendOptions, SendSource, Summary, Transfer};
pub use session_id::SessionId;
pub use transport::Transport;
pub use wire::Limit;

/// Lets this process's transfers send and receive chunks of 256 KiB and more through files
/// mapped into memory instead of copying them through buffers: less CPU per byte on both
/// sides (the `xfer` command turns it on). It installs a process-wide SIGBUS handler, which
/// turns a truncation of a mapped file by another process into an error instead of a killed
/// process, and hands every other SIGBUS to the handler that was there before. Without this
/// call the library installs no signal handler and copies every chunk.
///
/// ```
/// transfer::enable_mapped_files(); // once, at the start of the program
/// ```
pub fn enable_mapped_files() {
    sys::mapped::enable();
}

/// The optimiser crate, for controllers of one's own ([`optimizer::Controller`]) and the
/// signals they see ([`optimizer::Observation`]).
pub use optimizer;
