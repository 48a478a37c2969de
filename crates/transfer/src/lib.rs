//! The xfer data plane: move files and directory trees (or generated test data) from a sender to
//! a receiver over N parallel TCP, MPTCP or QUIC streams ([`transport`], [`quic`]) whose count
//! may change at any moment, with per-chunk checksums, journaled resume, and per-stream
//! `TCP_INFO` statistics (per subflow for MPTCP, [`mptcp_info`]; QUIC's path statistics in the
//! same shape) for an optimiser.
//!
//! - [`receiver::Receiver`] serves sessions on one port ([`receiver::ReceiverConfig`]).
//! - [`sender::Transfer`] runs one transfer ([`sender::SendConfig`], [`sender::SendSource`]);
//!   [`sender::Transfer::set_target_streams`] changes the stream count live,
//!   [`sender::Transfer::sample_streams`] reads each stream's counters, and
//!   [`sender::Transfer::optimize`] hands the count to an `optimizer::Controller` that decides
//!   every monitoring interval on its own thread.
//! - [`wire`] is the protocol, [`auth`] the key handshake, [`manifest`] what is sent,
//!   [`journal`] the receiver's record of verified chunks, [`tls`] the optional encryption and
//!   [`link`] a connection's halves, plain, TLS or QUIC.

#![warn(missing_docs)]

pub mod auth;
mod direct_io;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod journal;
pub mod link;
pub mod manifest;
mod mapped;
pub mod mptcp_info;
pub mod optimizer_choice;
pub mod policy_source;
pub mod quic;
pub mod receiver;
pub mod sender;
mod sockopt;
pub mod tcp_info;
pub mod tls;
pub mod transport;
pub mod wire;
