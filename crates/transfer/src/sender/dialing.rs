//! What a new data stream needs to connect and prove itself to the receiver: where the
//! receiver is, over what, the session it joins and the key it proves, and its turn among the
//! streams in their handshake. Set when the control connection is made; read by every stream.

use std::net::SocketAddr;
use std::time::Duration;

use super::quic_stream::QuicStreams;
use crate::auth::SessionKey;
use crate::sync::{unpoisoned, Condvar, Mutex};
use crate::transport::Transport;

/// How a transfer's streams reach the receiver.
pub(super) struct Dialing {
    /// The receiver's addresses, tried in order.
    pub(super) addrs: Vec<SocketAddr>,
    /// The transport in use: the one asked for, or TCP where MPTCP could not be had.
    pub(super) transport: Transport,
    /// Opens the data streams' connections when the transport is QUIC.
    pub(super) quic: Option<QuicStreams>,
    /// The streams in their handshake.
    pub(super) openings: Openings,
    /// The session the streams join.
    pub(super) session: [u8; 16],
    /// What this session's data streams prove (derived in the control handshake).
    pub(super) session_key: SessionKey,
    /// Whether the streams seal their frames ([`super::SendOptions::integrity`]).
    pub(super) sealed: bool,
}

/// The most data streams of one transfer in their handshake at once. A transfer that opens
/// many streams together (a fixed count of 100, say) opens them in waves of this many, so that
/// it never takes every place a receiver keeps for the handshakes of its sessions' addresses
/// ([`crate::receiver::DEFAULT_MAX_HANDSHAKES`]) and is turned away as busy by its own streams.
const OPENING_AT_ONCE: usize = 32;
/// How often a stream waiting for its turn to open asks whether it is still wanted.
const OPENING_POLL: Duration = Duration::from_millis(100);

/// A transfer's data streams in their handshake, at most [`OPENING_AT_ONCE`].
#[derive(Default)]
pub(super) struct Openings {
    opening: Mutex<usize>,
    done: Condvar,
}

/// A stream's turn to open, given back when it drops.
pub(super) struct Opening<'a>(&'a Openings);

impl Openings {
    /// Waits for a stream's turn to open; `None` once `give_up` says so.
    pub(super) fn enter(&self, give_up: impl Fn() -> bool) -> Option<Opening<'_>> {
        let mut opening = unpoisoned(self.opening.lock());
        while *opening >= OPENING_AT_ONCE {
            if give_up() {
                return None;
            }
            opening = unpoisoned(self.done.wait_timeout(opening, OPENING_POLL)).0;
        }
        *opening += 1;
        Some(Opening(self))
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        *unpoisoned(self.0.opening.lock()) -= 1;
        self.0.done.notify_one();
    }
}
