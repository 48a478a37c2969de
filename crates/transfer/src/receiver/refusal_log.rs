//! The receiver's log of refused connections, summarised: a flood of garbage or of wrong keys
//! from one address must not become a flood of log lines. The first refusal of an address in
//! each [`WINDOW`] is logged whole; the rest are counted and logged as one line per address
//! when the window ends, with the last reason.

use crate::sync::unpoisoned;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long refusals of one address are summarised together.
pub(super) const WINDOW: Duration = Duration::from_secs(10);
/// Most addresses told apart in one window; refusals from further ones are summarised
/// together, so that the log's own memory is bounded under a flood from many addresses.
const ADDRESSES: usize = 1024;

/// What one address was refused for in the window, beyond its first refusal.
#[derive(Debug, Default)]
struct Unlogged {
    count: u64,
    last_reason: String,
}

#[derive(Debug)]
struct Window {
    started: Instant,
    /// Every address refused in the window, and what of it is not logged yet.
    addresses: HashMap<IpAddr, Unlogged>,
    /// Refusals of addresses beyond [`ADDRESSES`].
    others: u64,
}

/// See the module's documentation.
#[derive(Debug)]
pub(super) struct RefusalLog(Mutex<Window>);

impl Default for RefusalLog {
    fn default() -> Self {
        RefusalLog(Mutex::new(Window {
            started: Instant::now(),
            addresses: HashMap::new(),
            others: 0,
        }))
    }
}

impl RefusalLog {
    /// Logs that `peer` was refused for `reason`, or counts it when its address was refused
    /// already in this window.
    pub(super) fn refused(&self, peer: SocketAddr, reason: &str) {
        let mut window = unpoisoned(self.0.lock());
        window.end_if_over(Instant::now());
        let known = window.addresses.len();
        match window.addresses.get_mut(&peer.ip()) {
            Some(unlogged) => {
                unlogged.count += 1;
                reason.clone_into(&mut unlogged.last_reason);
            }
            None if known >= ADDRESSES => window.others += 1,
            None => {
                window.addresses.insert(peer.ip(), Unlogged::default());
                tracing::warn!("refused {peer}: {reason}");
            }
        }
    }

    /// Logs the summaries of a window that has ended; called now and then (the accept loop's
    /// tick) so that a flood that stops is summarised without waiting for the next refusal.
    pub(super) fn tick(&self) {
        unpoisoned(self.0.lock()).end_if_over(Instant::now());
    }
}

impl Window {
    fn end_if_over(&mut self, now: Instant) {
        if now.duration_since(self.started) < WINDOW {
            return;
        }
        let seconds = now.duration_since(self.started).as_secs();
        for (ip, unlogged) in self.addresses.drain().filter(|(_, u)| u.count > 0) {
            tracing::warn!(
                "refused {} more connections from {ip} in the last {seconds} s (the last: {})",
                unlogged.count,
                unlogged.last_reason
            );
        }
        if self.others > 0 {
            tracing::warn!(
                "refused {} connections from further addresses in the last {seconds} s",
                self.others
            );
        }
        self.others = 0;
        self.started = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flood from one address costs one line at once and one per window, and the log keeps
    /// a bounded number of addresses however many there are.
    #[test]
    fn a_flood_is_summarised_per_address_and_window() {
        let log = RefusalLog::default();
        let peer: SocketAddr = "10.0.0.9:5000".parse().unwrap();
        for _ in 0..10_000 {
            log.refused(peer, "not an xfer client");
        }
        {
            let window = log.0.lock().unwrap();
            assert_eq!(window.addresses[&peer.ip()].count, 9_999);
        }
        for i in 0..(ADDRESSES as u32 + 500) {
            let peer = SocketAddr::from((std::net::Ipv4Addr::from(0x0b00_0000 + i), 1));
            log.refused(peer, "wrong key");
        }
        let mut window = log.0.lock().unwrap();
        assert_eq!(window.addresses.len(), ADDRESSES);
        assert_eq!(window.others, 501);
        let later = window.started + WINDOW;
        window.end_if_over(later);
        assert!(window.addresses.is_empty() && window.others == 0);
        assert_eq!(window.started, later);
    }
}
