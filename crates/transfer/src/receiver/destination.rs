//! Where a session's chunks go: files under the receiver's root (journaled, renamed into place
//! only after they verify) or a sink that verifies and discards (memory-to-memory benchmarks).

use std::collections::HashSet;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rangemap::RangeSet;

use super::file_tree::FileTree;
use crate::manifest::{Manifest, SinkKind};
use crate::wire::FileStatus;

/// A failure of the destination.
#[derive(Debug, thiserror::Error)]
pub enum DestinationError {
    /// The peer broke the protocol (a chunk outside its file, an unknown file, ...).
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// A manifest path is refused (leaves the root, goes through a link, is in the way).
    #[error("{0}")]
    Refused(String),
    /// The filesystem failed (disk full, permissions, I/O error).
    #[error("cannot write {path}: {source}")]
    Io {
        /// Destination path relative to the receiver's root.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// How long a session waits for a path that another session is writing before it is refused.
pub const CLAIM_WAIT: Duration = Duration::from_secs(5);

/// The final paths (relative to the root) that sessions are writing now, so two sessions never
/// write one file. A session that wants a path another one holds waits up to [`CLAIM_WAIT`]
/// for it: a sender killed and run again finds its old session still ending, for the
/// receiver learns of the kill only when it next reads from the dead connections.
#[derive(Debug, Default)]
pub struct ActivePaths {
    paths: Mutex<HashSet<PathBuf>>,
    released: Condvar,
}

impl ActivePaths {
    /// Claims all of `rels` or none, waiting up to `wait` for those that other sessions hold;
    /// the first one still held after that is the error.
    pub fn claim(&self, rels: &[PathBuf], wait: Duration) -> Result<(), PathBuf> {
        let deadline = Instant::now() + wait;
        let mut paths = self.paths.lock().expect("active paths lock");
        loop {
            let Some(busy) = rels.iter().find(|rel| paths.contains(*rel)) else {
                paths.extend(rels.iter().cloned());
                return Ok(());
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(busy.clone());
            }
            paths = self
                .released
                .wait_timeout(paths, left)
                .expect("active paths lock")
                .0;
        }
    }

    /// Gives up paths a session claimed.
    pub fn release(&self, rels: &[PathBuf]) {
        let mut paths = self.paths.lock().expect("active paths lock");
        for rel in rels {
            paths.remove(rel);
        }
        drop(paths);
        self.released.notify_all();
    }
}

/// A session's destination.
pub enum Destination {
    /// Files under the root.
    Files(FileTree),
    /// Verify and discard.
    Discard(DiscardSink),
}

impl Destination {
    /// Prepares the destination for `manifest` and returns what is already there.
    pub fn prepare(
        root: &Path,
        manifest: &Manifest,
        active: &Arc<ActivePaths>,
    ) -> Result<(Destination, Vec<FileStatus>), DestinationError> {
        match manifest.sink {
            SinkKind::Discard => {
                let sink = DiscardSink {
                    received: manifest
                        .files
                        .iter()
                        .map(|f| (f.size, Mutex::new(RangeSet::new())))
                        .collect(),
                };
                let plan = vec![FileStatus::Missing; manifest.files.len()];
                Ok((Destination::Discard(sink), plan))
            }
            SinkKind::Files => {
                let (tree, plan) = FileTree::prepare(root, manifest, active.clone())?;
                Ok((Destination::Files(tree), plan))
            }
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

    /// Finalises a file whose chunks all arrived; `blake3` is the sender's whole-file hash.
    pub fn seal(&self, file: u32, blake3: Option<[u8; 32]>) -> Result<(), DestinationError> {
        match self {
            Destination::Files(t) => t.seal(file, blake3),
            Destination::Discard(s) => s.seal(file),
        }
    }

    /// Ends a successful session: directory metadata, then flush everything to stable storage.
    pub fn finish(&self) -> Result<(), DestinationError> {
        match self {
            Destination::Files(t) => t.finish(),
            Destination::Discard(_) => Ok(()),
        }
    }
}

/// A sink that checks every byte of every file arrives (a chunk that arrives twice, as a
/// sender's copy of a straggler can, counts once) and keeps none of them.
pub struct DiscardSink {
    received: Vec<(u64, Mutex<RangeSet<u64>>)>,
}

impl DiscardSink {
    fn write(&self, file: u32, offset: u64, len: u64) -> Result<(), DestinationError> {
        let (size, ranges) = self
            .received
            .get(file as usize)
            .ok_or_else(|| DestinationError::Protocol(format!("chunk for unknown file {file}")))?;
        let end = chunk_end(offset, len, *size)?;
        if len > 0 {
            ranges.lock().expect("sink lock").insert(offset..end);
        }
        Ok(())
    }

    fn seal(&self, file: u32) -> Result<(), DestinationError> {
        let (size, ranges) = self
            .received
            .get(file as usize)
            .ok_or_else(|| DestinationError::Protocol(format!("seal of unknown file {file}")))?;
        require_complete(&ranges.lock().expect("sink lock"), *size, "generated data")
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

/// Checks at start-up that `root` is a directory this process can create files in.
pub fn check_root_writable(root: &Path) -> std::io::Result<PathBuf> {
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
    std::fs::remove_file(&probe)?;
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(names: &[&str]) -> Vec<PathBuf> {
        names.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn a_claim_waits_for_the_session_that_holds_its_path() {
        let active = Arc::new(ActivePaths::default());
        let old = paths(&["a", "b"]);
        active.claim(&old, Duration::ZERO).unwrap();
        let releaser = {
            let active = active.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                active.release(&old);
            })
        };
        let started = Instant::now();
        active
            .claim(&paths(&["c", "b"]), Duration::from_secs(10))
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(150));
        releaser.join().unwrap();
        // All or nothing: "c" and "b" are held now, "a" is free.
        assert_eq!(
            active.claim(&paths(&["a", "c"]), Duration::ZERO),
            Err(PathBuf::from("c"))
        );
        active.claim(&paths(&["a"]), Duration::ZERO).unwrap();
    }

    #[test]
    fn a_claim_is_refused_when_the_path_stays_held() {
        let active = ActivePaths::default();
        active.claim(&paths(&["x"]), Duration::ZERO).unwrap();
        let started = Instant::now();
        let busy = active.claim(&paths(&["y", "x"]), Duration::from_millis(300));
        assert_eq!(busy, Err(PathBuf::from("x")));
        assert!(started.elapsed() >= Duration::from_millis(300));
        active.claim(&paths(&["y"]), Duration::ZERO).unwrap();
    }
}
