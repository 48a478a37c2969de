//! Striped transfers: one transfer split over `k` sending nodes that read the same file system,
//! each node sending its share to a receiving node of its own, the receiving nodes writing into
//! one shared file system too (`xfer send --stripe I/K`).
//!
//! Every node walks the same sources in the same order (the scanner walks in name order), and
//! every node deals the same pieces out by the same rule, so the shares agree without a message
//! between the nodes: a file smaller than [`PIECE_LEN`] is one piece, a larger one is cut into
//! pieces of that length, and each piece goes to the node with the least work dealt so far
//! (a piece's bytes, and [`FILE_COST`] more for a file's first piece, since a file costs its
//! set-up whatever its size), the lowest-numbered on a tie. A node keeps the files of which it
//! was dealt a piece and sends only those pieces; the receiver plans and journals each file as
//! for any transfer, and places it once the journal, which every receiving node appends to,
//! covers all of it ([`crate::wire::Message::Start`]'s `striped`).
//!
//! The shares depend on the node count, not on what the receiver holds: run again with another
//! count, every node is dealt a new share and sends what of it the receiver still lacks.
//!
//! ```
//! use transfer::stripe::{Dealer, Stripe, PIECE_LEN};
//!
//! let sizes = [3 * PIECE_LEN, 10, 0, PIECE_LEN + 1];
//! let shares: Vec<Vec<_>> = (0..2)
//!     .map(|index| {
//!         let mut dealer = Dealer::new(Stripe::new(index, 2).unwrap());
//!         sizes.iter().map(|&size| dealer.deal(size)).collect()
//!     })
//!     .collect();
//! for (file, &size) in sizes.iter().enumerate() {
//!     // Every byte of every file goes to exactly one node, and every file to one node at least.
//!     let mut bytes: Vec<_> = shares.iter().flat_map(|s| s[file].iter().flatten().cloned()).collect();
//!     bytes.sort_by_key(|r| r.start);
//!     assert_eq!(bytes.iter().map(|r| r.end - r.start).sum::<u64>(), size);
//!     assert!(shares.iter().any(|s| s[file].is_some()));
//! }
//! ```

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Length of the pieces a large file is cut into. Small enough that a few files of a few GB
/// spread evenly over a handful of nodes (a 1 GiB file over 3 nodes: 21, 22 and 21 pieces),
/// large enough that each node reads long runs of a file.
pub const PIECE_LEN: u64 = 16 << 20;

/// The work a file's first piece counts for beyond its bytes: a small file costs about a round
/// trip of messages and a file's creation and rename whatever its size.
pub const FILE_COST: u64 = 64 << 10;

/// Most nodes of one striped transfer.
pub const MAX_NODES: u32 = 256;

/// One node's place in a striped transfer: node `index` of `count` (`I/K` on the command
/// line and in configuration files).
///
/// ```
/// use transfer::stripe::Stripe;
///
/// let stripe: Stripe = "1/3".parse().unwrap();
/// assert_eq!((stripe.index(), stripe.count()), (1, 3));
/// assert_eq!(stripe.to_string(), "1/3");
/// assert!("3/3".parse::<Stripe>().unwrap_err().to_string().contains("0 to 2"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Stripe {
    index: u32,
    count: u32,
}

/// Why a stripe was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StripeError {
    /// Not of the form `I/K`.
    #[error("a stripe is written INDEX/COUNT (0/3, 1/3, 2/3 for three nodes), not {0:?}")]
    Form(String),
    /// The count is 0 or above [`MAX_NODES`].
    #[error("a striped transfer has 1 to {MAX_NODES} nodes, not {0}")]
    Count(u32),
    /// The index is not below the count.
    #[error("node {index} of {count}: nodes are numbered 0 to {}", count - 1)]
    Index {
        /// The index given.
        index: u32,
        /// The node count given.
        count: u32,
    },
}

impl Stripe {
    /// Node `index` of `count`.
    pub fn new(index: u32, count: u32) -> Result<Stripe, StripeError> {
        if count == 0 || count > MAX_NODES {
            return Err(StripeError::Count(count));
        }
        if index >= count {
            return Err(StripeError::Index { index, count });
        }
        Ok(Stripe { index, count })
    }

    /// This node's number, from 0.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// How many nodes share the transfer.
    pub fn count(&self) -> u32 {
        self.count
    }
}

impl fmt::Display for Stripe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Stripe {
    type Err = StripeError;

    fn from_str(s: &str) -> Result<Stripe, StripeError> {
        let form = || StripeError::Form(s.to_string());
        let (index, count) = s.trim().split_once('/').ok_or_else(form)?;
        let number = |n: &str| n.trim().parse::<u32>().map_err(|_| form());
        Stripe::new(number(index)?, number(count)?)
    }
}

impl TryFrom<String> for Stripe {
    type Error = StripeError;

    fn try_from(s: String) -> Result<Stripe, StripeError> {
        s.parse()
    }
}

impl From<Stripe> for String {
    fn from(stripe: Stripe) -> String {
        stripe.to_string()
    }
}

/// Deals the pieces of the manifest's files out, file by file in manifest order, as every node
/// of the transfer deals them ([`Stripe`]'s rule), and keeps this node's.
#[derive(Debug, Clone)]
pub struct Dealer {
    stripe: Stripe,
    /// The work dealt to each node so far.
    loads: Vec<u64>,
}

impl Dealer {
    /// Nothing dealt yet.
    pub fn new(stripe: Stripe) -> Dealer {
        Dealer {
            stripe,
            loads: vec![0; stripe.count as usize],
        }
    }

    /// Deals the next file of the manifest, of `size` bytes: this node's pieces of it (in
    /// order, adjacent ones joined; empty for an empty file dealt to this node), or `None`
    /// when no piece of it is this node's.
    pub fn deal(&mut self, size: u64) -> Option<Vec<Range<u64>>> {
        let mut share: Option<Vec<Range<u64>>> = None;
        let mut start = 0;
        loop {
            let end = size.min(start + PIECE_LEN);
            let cost = (end - start) + if start == 0 { FILE_COST } else { 0 };
            let node = (0..self.loads.len())
                .min_by_key(|&n| self.loads[n])
                .expect("a stripe has a node");
            self.loads[node] += cost;
            if node == self.stripe.index as usize {
                let ranges = share.get_or_insert_with(Vec::new);
                match ranges.last_mut() {
                    Some(last) if last.end == start => last.end = end,
                    _ if end > start => ranges.push(start..end),
                    _ => {}
                }
            }
            if end >= size {
                return share;
            }
            start = end;
        }
    }
}

/// The parts of `ranges` (in order, not overlapping) that lie within `share` (the same), in
/// order and none empty.
///
/// ```
/// use transfer::stripe::within;
///
/// assert_eq!(within(&[0..10, 20..30], &[5..25]), vec![5..10, 20..25]);
/// ```
pub fn within(ranges: &[Range<u64>], share: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    for range in ranges {
        for piece in share {
            let (start, end) = (range.start.max(piece.start), range.end.min(piece.end));
            if start < end {
                out.push(start..end);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn deal_all(count: u32, sizes: &[u64]) -> Vec<Vec<Option<Vec<Range<u64>>>>> {
        (0..count)
            .map(|index| {
                let mut dealer = Dealer::new(Stripe::new(index, count).unwrap());
                sizes.iter().map(|&size| dealer.deal(size)).collect()
            })
            .collect()
    }

    proptest! {
        /// Whatever the files and the node count, the nodes' shares tile every file exactly,
        /// every file has a node, and no node is dealt more than a piece beyond another.
        #[test]
        fn the_shares_of_all_nodes_tile_every_file_once(
            count in 1u32..8,
            sizes in prop::collection::vec(
                prop_oneof![0u64..4096, 0u64..(5 * PIECE_LEN)], 0..40),
        ) {
            let shares = deal_all(count, &sizes);
            let mut loads = vec![0u64; count as usize];
            for (file, &size) in sizes.iter().enumerate() {
                let mut ranges: Vec<Range<u64>> = Vec::new();
                let mut owners = 0;
                for (node, share) in shares.iter().enumerate() {
                    if let Some(share) = &share[file] {
                        owners += 1;
                        loads[node] += share.iter().map(|r| r.end - r.start).sum::<u64>();
                        ranges.extend(share.iter().cloned());
                    }
                }
                prop_assert!(owners >= 1, "file {} of {} bytes has no node", file, size);
                ranges.sort_by_key(|r| r.start);
                let mut at = 0;
                for r in &ranges {
                    prop_assert_eq!(r.start, at, "a gap or an overlap in file {}", file);
                    prop_assert!(r.end > r.start);
                    at = r.end;
                }
                prop_assert_eq!(at, size);
            }
            let (least, most) = (loads.iter().min().unwrap(), loads.iter().max().unwrap());
            let files = sizes.len() as u64;
            prop_assert!(most - least <= PIECE_LEN + FILE_COST * (files + 1),
                "loads {:?}", loads);
        }
    }

    #[test]
    fn a_large_file_is_spread_evenly_and_its_pieces_joined() {
        let shares = deal_all(3, &[1 << 30]);
        let pieces: Vec<u64> = shares
            .iter()
            .map(|s| s[0].as_ref().unwrap().iter().map(|r| r.end - r.start).sum())
            .collect();
        assert_eq!(pieces, vec![21 * PIECE_LEN, 22 * PIECE_LEN, 21 * PIECE_LEN]);
        let one = deal_all(1, &[1 << 30]);
        let whole: Vec<Range<u64>> = std::iter::once(0..1 << 30).collect();
        assert_eq!(one[0][0], Some(whole), "one node: one range");
    }

    #[test]
    fn stripes_are_read_as_written_and_refused_with_the_reason() {
        assert_eq!(
            " 2 / 4 ".parse::<Stripe>().unwrap(),
            Stripe::new(2, 4).unwrap()
        );
        for (text, says) in [
            ("2", "INDEX/COUNT"),
            ("a/3", "INDEX/COUNT"),
            ("0/0", "1 to 256"),
            ("0/257", "1 to 256"),
            ("4/4", "0 to 3"),
        ] {
            let error = text.parse::<Stripe>().unwrap_err().to_string();
            assert!(error.contains(says), "{text}: {error}");
        }
        let json = serde_json::to_string(&Stripe::new(1, 3).unwrap()).unwrap();
        assert_eq!(json, "\"1/3\"");
        assert!(serde_json::from_str::<Stripe>("\"5/3\"").is_err());
    }
}
