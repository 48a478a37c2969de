//! Who may be in the key handshake at once. A connection that has not yet proven a key holds a
//! task, its socket and a place until it does or its deadline passes ([`super::handshake`]);
//! the places are bounded so that peers without the key cannot take the receiver down:
//!
//! - strangers (addresses without a running session) share [`ReceiverOptions::max_handshakes`]
//!   places, and one address (an IPv6 /64) holds at most
//!   [`ReceiverOptions::max_handshakes_per_source`] of them, so a peer at one address can never
//!   hold all of them;
//! - an address with a running session has `max_handshakes` places of its own, so the new data
//!   streams of an authenticated session never wait behind strangers elsewhere;
//! - an address whose connection reached its handshake deadline without authenticating is
//!   suspect for [`SUSPECT_FOR`]: its connections may only take places while fewer than half
//!   are taken, so that strangers trickling bytes from many addresses hold at most half the
//!   places after their first deadline, and newcomers find the other half free.
//!
//! A connection over its bound is refused at once with [`Limit::Authenticating`], which a
//! sender takes as "try again in a moment".
//!
//! [`ReceiverOptions::max_handshakes`]: super::ReceiverOptions::max_handshakes
//! [`ReceiverOptions::max_handshakes_per_source`]: super::ReceiverOptions::max_handshakes_per_source

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::sync::unpoisoned;
use crate::wire::Limit;

/// How long an address stays suspect after a connection of its reached the handshake deadline.
pub(super) const SUSPECT_FOR: Duration = Duration::from_secs(60);
/// Most suspect addresses remembered; beyond that, under a flood from very many addresses, the
/// one whose suspicion ends first is forgotten.
const SUSPECTS: usize = 4096;

/// How connections are counted: by address, IPv6 by its /64 (one host or one site's subnet
/// holds a whole /64, so its addresses are one peer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct SourceKey(u128);

impl SourceKey {
    pub(super) fn of(ip: IpAddr) -> SourceKey {
        match ip.to_canonical() {
            IpAddr::V4(v4) => SourceKey(u128::from(u32::from(v4))),
            // The mark keeps every IPv6 key apart from every IPv4 one.
            IpAddr::V6(v6) => SourceKey((u128::from(v6) & !((1u128 << 64) - 1)) | (1 << 32)),
        }
    }
}

/// One address's connections in their handshake and sessions running.
#[derive(Debug, Default)]
struct Source {
    authenticating: usize,
    sessions: usize,
}

#[derive(Debug, Default)]
struct Places {
    /// Connections in their handshake from addresses without a running session.
    strangers: usize,
    sources: HashMap<SourceKey, Source>,
    /// Addresses suspect until then.
    suspects: HashMap<SourceKey, Instant>,
}

impl Places {
    fn is_suspect(&mut self, source: SourceKey, now: Instant) -> bool {
        match self.suspects.get(&source) {
            Some(&until) if now < until => true,
            Some(_) => {
                self.suspects.remove(&source);
                false
            }
            None => false,
        }
    }

    fn suspect(&mut self, source: SourceKey, now: Instant) {
        if self.suspects.len() >= SUSPECTS && !self.suspects.contains_key(&source) {
            self.suspects.retain(|_, until| now < *until);
            if self.suspects.len() >= SUSPECTS {
                let soonest = self.suspects.iter().min_by_key(|(_, until)| **until);
                if let Some((&first, _)) = soonest {
                    self.suspects.remove(&first);
                }
            }
        }
        self.suspects.insert(source, now + SUSPECT_FOR);
    }
}

/// The places of connections in their handshake.
#[derive(Debug)]
pub(super) struct Admission {
    max: usize,
    per_source: usize,
    places: Mutex<Places>,
}

/// A connection's place, given back when it drops.
#[derive(Debug)]
pub(super) struct Place {
    admission: Arc<Admission>,
    source: SourceKey,
    stranger: bool,
    /// The connection reached its deadline: its address becomes suspect.
    timed_out: bool,
}

impl Place {
    /// The connection reached its handshake deadline without authenticating.
    pub(super) fn timed_out(&mut self) {
        self.timed_out = true;
    }
}

/// An address's running session, counted while it lives.
#[derive(Debug)]
pub(super) struct Known {
    admission: Arc<Admission>,
    source: SourceKey,
}

impl Admission {
    pub(super) fn new(max: usize, per_source: usize) -> Arc<Admission> {
        Arc::new(Admission {
            max,
            per_source: per_source.min(max),
            places: Mutex::default(),
        })
    }

    fn places(&self) -> std::sync::MutexGuard<'_, Places> {
        // The counts stay consistent whatever panicked while holding the lock: every change is
        // one statement.
        unpoisoned(self.places.lock())
    }

    /// A place for a new connection from `ip`, or the limit that refuses it.
    pub(super) fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Place, Limit> {
        let source = SourceKey::of(ip);
        let mut places = self.places();
        let strangers = places.strangers;
        let open = if places.is_suspect(source, Instant::now()) {
            self.max / 2
        } else {
            self.max
        };
        let entry = places.sources.entry(source).or_default();
        let stranger = entry.sessions == 0;
        let refused = if stranger {
            if entry.authenticating >= self.per_source {
                Some(Limit::Authenticating {
                    from_address: self.per_source as u64,
                    max: self.max as u64,
                })
            } else if strangers >= open {
                Some(Limit::Authenticating {
                    from_address: entry.authenticating as u64,
                    max: self.max as u64,
                })
            } else {
                None
            }
        } else if entry.authenticating >= self.max {
            Some(Limit::Authenticating {
                from_address: entry.authenticating as u64,
                max: self.max as u64,
            })
        } else {
            None
        };
        if let Some(limit) = refused {
            if entry.authenticating == 0 && entry.sessions == 0 {
                places.sources.remove(&source);
            }
            return Err(limit);
        }
        entry.authenticating += 1;
        if stranger {
            places.strangers += 1;
        }
        Ok(Place {
            admission: self.clone(),
            source,
            stranger,
            timed_out: false,
        })
    }

    /// Counts a session from `ip` for as long as the guard lives.
    pub(super) fn session_from(self: &Arc<Self>, ip: IpAddr) -> Known {
        let source = SourceKey::of(ip);
        self.places().sources.entry(source).or_default().sessions += 1;
        Known {
            admission: self.clone(),
            source,
        }
    }

    /// Connections in their handshake now: from strangers, and in all.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let places = self.places();
        let all = places.sources.values().map(|s| s.authenticating).sum();
        (places.strangers, all)
    }

    /// Applies `change` to the counts of `source` (and forgets it once it has nothing);
    /// gives back a stranger's place, and makes the address suspect when it timed out.
    fn release(&self, source: SourceKey, change: impl FnOnce(&mut Source), place: Option<&Place>) {
        let mut places = self.places();
        if let Some(place) = place.filter(|p| p.stranger) {
            places.strangers -= 1;
            if place.timed_out {
                places.suspect(source, Instant::now());
            }
        }
        if let Some(entry) = places.sources.get_mut(&source) {
            change(entry);
            if entry.authenticating == 0 && entry.sessions == 0 {
                places.sources.remove(&source);
            }
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.admission
            .release(self.source, |s| s.authenticating -= 1, Some(self));
    }
}

impl Drop for Known {
    fn drop(&mut self) {
        self.admission
            .release(self.source, |s| s.sessions -= 1, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// One address holds at most its share; others still get in until all places are taken;
    /// every place dropped is given back, and only then.
    #[test]
    fn strangers_are_bounded_per_address_and_in_all() {
        let admission = Admission::new(4, 2);
        let a: Vec<_> = (0..2)
            .map(|_| admission.admit(ip("10.0.0.1")).unwrap())
            .collect();
        assert!(matches!(
            admission.admit(ip("10.0.0.1")),
            Err(Limit::Authenticating {
                from_address: 2,
                max: 4
            })
        ));
        let b = admission.admit(ip("10.0.0.2")).unwrap();
        let c = admission.admit(ip("10.0.0.3")).unwrap();
        assert!(admission.admit(ip("10.0.0.4")).is_err(), "all four taken");
        assert_eq!(admission.counts(), (4, 4));
        drop(b);
        let d = admission.admit(ip("10.0.0.4")).unwrap();
        drop((a, c, d));
        assert_eq!(admission.counts(), (0, 0));
        assert!(
            admission.places().sources.is_empty(),
            "no address is remembered"
        );
    }

    /// An address with a running session has places of its own: strangers elsewhere holding
    /// every shared place do not keep its new streams out.
    #[test]
    fn an_address_with_a_session_never_waits_behind_strangers() {
        let admission = Admission::new(4, 2);
        let strangers: Vec<_> = (1..=4)
            .map(|i| admission.admit(ip(&format!("10.0.0.{i}"))).unwrap())
            .collect();
        assert!(admission.admit(ip("10.0.9.9")).is_err());
        let session = admission.session_from(ip("10.0.9.9"));
        let streams: Vec<_> = (0..4)
            .map(|_| admission.admit(ip("10.0.9.9")).unwrap())
            .collect();
        assert!(
            admission.admit(ip("10.0.9.9")).is_err(),
            "its own places are bounded too"
        );
        assert_eq!(admission.counts(), (4, 8));
        drop((streams, session, strangers));
        assert!(admission.places().sources.is_empty());
    }

    /// After a connection of its reached the deadline, an address takes places only while
    /// fewer than half are taken; others still take them all.
    #[test]
    fn an_address_whose_handshake_timed_out_gets_at_most_half_the_places() {
        let admission = Admission::new(4, 4);
        let mut slow = admission.admit(ip("10.0.0.1")).unwrap();
        slow.timed_out();
        drop(slow);
        let first: Vec<_> = (0..2)
            .map(|_| admission.admit(ip("10.0.0.1")).unwrap())
            .collect();
        assert!(
            admission.admit(ip("10.0.0.1")).is_err(),
            "half the places are taken"
        );
        let others: Vec<_> = (2..4)
            .map(|i| admission.admit(ip(&format!("10.0.0.{i}"))).unwrap())
            .collect();
        assert!(admission.admit(ip("10.0.0.5")).is_err(), "all are taken");
        drop((first, others));
        assert_eq!(admission.counts(), (0, 0));
    }

    /// The addresses of one IPv6 /64 count as one; IPv4 mapped into IPv6 counts as IPv4.
    #[test]
    fn an_ipv6_subnet_is_one_source() {
        assert_eq!(
            SourceKey::of(ip("2001:db8::1")),
            SourceKey::of(ip("2001:db8::ffff:1"))
        );
        assert_ne!(
            SourceKey::of(ip("2001:db8::1")),
            SourceKey::of(ip("2001:db8:0:1::1"))
        );
        assert_eq!(
            SourceKey::of(ip("::ffff:10.0.0.1")),
            SourceKey::of(ip("10.0.0.1"))
        );
        assert_ne!(SourceKey::of(ip("10.0.0.1")), SourceKey::of(ip("::a00:1")));
    }
}
