//! Where a session's chunks go: files under the receiver's root (journaled, renamed into place
//! only after they verify) or a sink that verifies and discards (memory-to-memory benchmarks).

use std::collections::HashMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rangemap::RangeSet;

use super::announced::{Announced, Budget};
use super::file_tree::{FileTree, MappedChunk};
use crate::filter::Filter;
use crate::manifest::{ManifestBatch, SinkKind, MAX_FILE_SIZE};
use crate::sync::unpoisoned;
use crate::wire::{FileStatus, PresentFiles, Removal};

/// A failure of the destination.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DestinationError {
    /// The peer broke the protocol (a chunk outside its file, an unknown file, ...).
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// A manifest path is refused (leaves the root, goes through a link, is in the way).
    #[error("{0}")]
    Refused(String),
    /// The filesystem failed (disk full, permissions, I/O error).
    #[error("cannot write {path}: {error}")]
    Io {
        /// Destination path relative to the receiver's root.
        path: String,
        /// The cause.
        error: std::io::Error,
    },
}

/// How long a session waits for a path that another session is writing before it is refused.
pub const CLAIM_WAIT: Duration = Duration::from_secs(5);

/// Why paths could not be claimed.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimError {
    /// Another session still holds this path after the wait.
    Busy(PathBuf),
    /// The claiming session holds this path already: its manifest names it twice.
    Twice(PathBuf),
}

impl From<ClaimError> for DestinationError {
    fn from(e: ClaimError) -> Self {
        DestinationError::Refused(match e {
            ClaimError::Busy(path) => {
                format!("another session is writing {} now", path.display())
            }
            ClaimError::Twice(path) => {
                format!("{} appears twice in the manifest", path.display())
            }
        })
    }
}

/// The final paths (relative to the root) that sessions are writing now, each with the session
/// that holds it, so two sessions never write one file. A session that wants a path another one
/// holds waits up to [`CLAIM_WAIT`] for it: a sender killed and run again finds its old session
/// still ending, for the receiver learns of the kill only when it next reads from the dead
/// connections.
#[derive(Debug, Default)]
pub struct ActivePaths {
    paths: Mutex<HashMap<PathBuf, [u8; 16]>>,
    released: Condvar,
}

impl ActivePaths {
    /// Claims all of `rels` for the session `owner` or none, waiting up to `wait` for those
    /// that other sessions hold.
    pub fn claim(
        &self,
        rels: &[PathBuf],
        owner: [u8; 16],
        wait: Duration,
    ) -> Result<(), ClaimError> {
        let deadline = Instant::now() + wait;
        let mut paths = unpoisoned(self.paths.lock());
        loop {
            let held = rels
                .iter()
                .find_map(|rel| paths.get(rel).map(|holder| (rel, *holder)));
            let Some((busy, holder)) = held else {
                paths.extend(rels.iter().map(|rel| (rel.clone(), owner)));
                return Ok(());
            };
            if holder == owner {
                return Err(ClaimError::Twice(busy.clone()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClaimError::Busy(busy.clone()));
            }
            paths = unpoisoned(self.released.wait_timeout(paths, left)).0;
        }
    }

    /// Whether `owner` holds `rel` (a file it announced and has not settled).
    pub(super) fn held_by(&self, rel: &Path, owner: [u8; 16]) -> bool {
        unpoisoned(self.paths.lock()).get(rel) == Some(&owner)
    }

    /// Whether a session other than `owner` holds `rel`.
    pub(super) fn held_by_another(&self, rel: &Path, owner: [u8; 16]) -> bool {
        unpoisoned(self.paths.lock())
            .get(rel)
            .is_some_and(|holder| *holder != owner)
    }

    /// Gives up paths a session claimed.
    pub fn release<'a>(&self, rels: impl IntoIterator<Item = &'a PathBuf>) {
        let mut paths = unpoisoned(self.paths.lock());
        for rel in rels {
            paths.remove(rel);
        }
        drop(paths);
        self.released.notify_all();
    }
}

/// A session's destination.
#[non_exhaustive]
pub enum Destination {
    /// Files under the root (or a dry run's plan of them); boxed, as it is many times the
    /// sink's size.
    Files(Box<FileTree>),
    /// Verify and discard.
    Discard(DiscardSink),
}

/// Where a session writes and the bounds it works within.
pub struct Placement<'a> {
    /// The root the session's key is served under (the receiver's, or its tenant's).
    pub root: &'a Path,
    /// The session's destination directory, relative to the root, as the sender named it.
    pub dest: &'a [u8],
    /// The session, which claims the paths it writes.
    pub owner: [u8; 16],
    /// Paths under `root` claimed by all sessions.
    pub active: &'a Arc<ActivePaths>,
    /// Most files held unsealed at once.
    pub max_unsealed: usize,
    /// The receiver's bound on the files all its sessions hold unsealed.
    pub budget: &'a Arc<Budget>,
    /// Write files with direct I/O ([`crate::direct_io`]).
    pub direct_io: bool,
    /// What becomes of files already in place ([`crate::wire::Message::Start`]).
    pub present: PresentFiles,
    /// Mirror: what the session removes once it is complete ([`crate::wire::Message::Start`]).
    pub delete: Option<&'a Filter>,
    /// One session of a striped transfer ([`crate::wire::Message::Start`]): other sessions,
    /// here or on other nodes, write other ranges of the same files.
    pub striped: bool,
}

/// What sealing a file came to ([`Destination::seal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sealed {
    /// The file is in place under its final name: sent, or compared by content and found to
    /// be the source's.
    Placed,
    /// Compared by content and found to differ ([`PresentFiles::Compared`]): nothing of it is
    /// held now, and it is sent whole.
    Changed,
    /// A striped session's share of the file is verified and journaled, and other ranges are
    /// not yet: the session whose seal finds the whole file in the journal places it.
    Held,
}

impl Destination {
    /// Opens the destination (creating its directory when files are to land there).
    pub fn open(placement: Placement<'_>, sink: SinkKind) -> Result<Destination, DestinationError> {
        if placement.striped {
            // A stripe's manifest holds a share of the files, and only of some: a mirror would
            // remove the others' files, and a whole-file hash has no node that read it all.
            let whole = [
                (
                    sink != SinkKind::Files,
                    "it needs files, not generated data",
                ),
                (
                    placement.delete.is_some(),
                    "it cannot remove what its manifest lacks (--delete)",
                ),
                (
                    placement.present != PresentFiles::Kept,
                    "it cannot hash a whole file (--verify, --checksum)",
                ),
            ];
            if let Some((_, why)) = whole.iter().find(|(set, _)| *set) {
                return Err(DestinationError::Refused(format!(
                    "a striped session shares its files with other nodes: {why}"
                )));
            }
        }
        Ok(match sink {
            SinkKind::Discard if placement.delete.is_some() => {
                return Err(DestinationError::Refused(
                    "removing what the sources do not hold (--delete) needs files: generated \
                     data has none"
                        .into(),
                ))
            }
            SinkKind::Discard => Destination::Discard(DiscardSink {
                received: Announced::new(placement.max_unsealed, placement.budget.clone()),
            }),
            SinkKind::Files => Destination::Files(Box::new(FileTree::open(placement, false)?)),
            SinkKind::Preview => Destination::Files(Box::new(FileTree::open(placement, true)?)),
        })
    }

    /// Takes the next batch of the manifest: returns the number of its first file and what is
    /// already there of each of its files.
    pub fn add_batch(
        &self,
        batch: &ManifestBatch,
    ) -> Result<(u32, Vec<FileStatus>), DestinationError> {
        if let Some(file) = batch.files.iter().find(|f| f.size > MAX_FILE_SIZE) {
            return Err(DestinationError::Refused(format!(
                "{}: a size of {} bytes is more than any file can hold",
                String::from_utf8_lossy(&file.path),
                file.size
            )));
        }
        match self {
            Destination::Files(t) => t.add_batch(batch),
            Destination::Discard(s) => s.add_batch(batch),
        }
    }

    /// Writes one chunk whose checksum already verified.
    pub fn write(
        &self,
        file: u32,
        offset: u64,
        data: &[u8],
        checksum: u64,
    ) -> Result<(), DestinationError> {
        match self {
            Destination::Files(t) => t.write(file, offset, data, checksum),
            Destination::Discard(s) => s.write(file, offset, data.len() as u64),
        }
    }

    /// A window of the file's part file to receive a chunk straight into, when that pays and
    /// nothing stands in the way ([`FileTree::map_chunk`]); `None` for a sink.
    pub(super) fn map_chunk(
        &self,
        file: u32,
        offset: u64,
        len: usize,
    ) -> Result<Option<MappedChunk>, DestinationError> {
        match self {
            Destination::Files(t) => t.map_chunk(file, offset, len),
            Destination::Discard(_) => Ok(None),
        }
    }

    /// The sink, when chunks are verified and discarded: they need no memory of their own.
    pub(super) fn sink(&self) -> Option<&DiscardSink> {
        match self {
            Destination::Discard(sink) => Some(sink),
            Destination::Files(_) => None,
        }
    }

    /// Whether chunks are written with direct I/O (and are best received into aligned memory).
    pub(super) fn writes_direct(&self) -> bool {
        matches!(self, Destination::Files(t) if t.writes_direct())
    }

    /// Finalises a file whose chunks all arrived, or compares one already in place
    /// ([`PresentFiles::Compared`]); `blake3` is the sender's whole-file hash.
    pub fn seal(&self, file: u32, blake3: Option<[u8; 32]>) -> Result<Sealed, DestinationError> {
        match self {
            Destination::Files(t) => t.seal(file, blake3),
            Destination::Discard(s) => s.seal(file).map(|()| Sealed::Placed),
        }
    }

    /// Ends a successful session: for a mirroring one, what the sources do not hold removed;
    /// directory metadata; then everything flushed to stable storage. Returns what was removed.
    pub fn finish(&self) -> Result<Removal, DestinationError> {
        match self {
            Destination::Files(t) => t.finish(),
            Destination::Discard(_) => Ok(Removal::default()),
        }
    }
}

/// A sink that checks every byte of every file arrives (a chunk that arrives twice, as a
/// sender's copy of a straggler can, counts once) and keeps none of them.
pub struct DiscardSink {
    received: Announced<(u64, Mutex<RangeSet<u64>>)>,
}

impl DiscardSink {
    fn add_batch(&self, batch: &ManifestBatch) -> Result<(u32, Vec<FileStatus>), DestinationError> {
        let room = self.received.reserve(batch.files.len())?;
        let files = batch.files.iter().map(|f| Some((f.size, Mutex::default())));
        let first = room.add(files);
        Ok((first, vec![FileStatus::Missing; batch.files.len()]))
    }

    /// Counts the `len` bytes at `offset` of `file` as received (they verified).
    pub(super) fn write(&self, file: u32, offset: u64, len: u64) -> Result<(), DestinationError> {
        let Some(state) = self.received.get(file)? else {
            // Sealed already: a late copy.
            return Ok(());
        };
        let (size, ranges) = &*state;
        let end = chunk_end(offset, len, *size)?;
        if len > 0 {
            ranges.lock().expect("sink lock").insert(offset..end);
        }
        Ok(())
    }

    fn seal(&self, file: u32) -> Result<(), DestinationError> {
        let state = self.received.to_seal(file)?;
        let (size, ranges) = &*state;
        require_complete(&ranges.lock().expect("sink lock"), *size, "generated data")?;
        self.received.settle(file);
        Ok(())
    }
}

pub(super) fn chunk_end(offset: u64, len: u64, size: u64) -> Result<u64, DestinationError> {
    offset
        .checked_add(len)
        .filter(|&end| end <= size)
        .ok_or_else(|| {
            DestinationError::Protocol(format!(
                "chunk {offset}+{len} lies outside a file of {size} bytes"
            ))
        })
}

pub(super) fn require_complete(
    ranges: &RangeSet<u64>,
    size: u64,
    what: &str,
) -> Result<(), DestinationError> {
    match ranges.gaps(&(0..size)).next() {
        None => Ok(()),
        Some(gap) => Err(DestinationError::Protocol(format!(
            "{what} sealed with bytes {}..{} missing",
            gap.start, gap.end
        ))),
    }
}

/// Checks at start-up that `root` is a directory this process can create files in (and, with
/// `direct_io`, open them for direct I/O).
/// Returns the root made canonical.
///
/// ```
/// use transfer::receiver::check_root_writable;
///
/// let dir = tempfile::tempdir()?;
/// assert_eq!(check_root_writable(dir.path(), false)?, dir.path().canonicalize()?);
/// assert!(check_root_writable(&dir.path().join("missing"), false).is_err());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn check_root_writable(root: &Path, direct_io: bool) -> std::io::Result<PathBuf> {
    let root = std::fs::canonicalize(root)?;
    if !root.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            "not a directory",
        ));
    }
    let probe = root.join(format!(".xfer-probe-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&probe)?;
    let direct = if direct_io {
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | crate::direct_io::O_DIRECT)
            .open(&probe)
            .and_then(|file| crate::direct_io::check_alignment(&file))
            .map_err(crate::direct_io::open_error)
    } else {
        Ok(())
    };
    std::fs::remove_file(&probe)?;
    direct?;
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: [u8; 16] = [1; 16];
    const NEW: [u8; 16] = [2; 16];

    fn paths(names: &[&str]) -> Vec<PathBuf> {
        names.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn a_claim_waits_for_the_session_that_holds_its_path() {
        let active = Arc::new(ActivePaths::default());
        let old = paths(&["a", "b"]);
        active.claim(&old, OLD, Duration::ZERO).unwrap();
        let releaser = {
            let active = active.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                active.release(&old);
            })
        };
        let started = Instant::now();
        active
            .claim(&paths(&["c", "b"]), NEW, Duration::from_secs(10))
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(150));
        releaser.join().unwrap();
        // All or nothing: "c" and "b" are held now, "a" is free.
        assert_eq!(
            active.claim(&paths(&["a", "c"]), OLD, Duration::ZERO),
            Err(ClaimError::Busy(PathBuf::from("c")))
        );
        assert_eq!(
            active.claim(&paths(&["a", "c"]), NEW, Duration::ZERO),
            Err(ClaimError::Twice(PathBuf::from("c"))),
            "a session's own path is a duplicate, not a wait"
        );
        active.claim(&paths(&["a"]), OLD, Duration::ZERO).unwrap();
    }

    #[test]
    fn a_claim_is_refused_when_the_path_stays_held() {
        let active = ActivePaths::default();
        active.claim(&paths(&["x"]), OLD, Duration::ZERO).unwrap();
        let started = Instant::now();
        let busy = active.claim(&paths(&["y", "x"]), NEW, Duration::from_millis(300));
        assert_eq!(busy, Err(ClaimError::Busy(PathBuf::from("x"))));
        assert!(started.elapsed() >= Duration::from_millis(300));
        active.claim(&paths(&["y"]), NEW, Duration::ZERO).unwrap();
    }

    /// Every session under a root shares its active paths: a thread that panicked holding
    /// them fails no later claim or release.
    #[test]
    fn a_panic_holding_the_active_paths_fails_no_later_session() {
        let active = ActivePaths::default();
        active.claim(&paths(&["x"]), OLD, Duration::ZERO).unwrap();
        crate::sync::panic_holding(|| active.paths.lock());
        assert!(active.held_by(Path::new("x"), OLD));
        active.release(&paths(&["x"]));
        active.claim(&paths(&["x"]), NEW, Duration::ZERO).unwrap();
    }
}
