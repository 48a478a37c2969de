//! Where a session's chunks go: files under the receiver's root (journaled, renamed into place
//! only after they verify) or a sink that verifies and discards (memory-to-memory benchmarks).

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rangemap::RangeSet;

use crate::journal::{Journal, PartPaths, SourceIdentity};
use crate::manifest::{join_components, split_relative, DirEntry, FileEntry, Manifest, SinkKind};
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

/// The set of final paths that sessions are writing now, so two sessions never write one file.
pub type ActivePaths = Arc<Mutex<HashSet<PathBuf>>>;

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
        active: &ActivePaths,
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

/// A sink that checks every byte of every file arrives exactly once and keeps none of them.
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

fn chunk_end(offset: u64, len: u64, size: u64) -> Result<u64, DestinationError> {
    offset
        .checked_add(len)
        .filter(|&end| end <= size)
        .ok_or_else(|| {
            DestinationError::Protocol(format!(
                "chunk {offset}+{len} lies outside a file of {size} bytes"
            ))
        })
}

fn require_complete(ranges: &RangeSet<u64>, size: u64, what: &str) -> Result<(), DestinationError> {
    match ranges.gaps(&(0..size)).next() {
        None => Ok(()),
        Some(gap) => Err(DestinationError::Protocol(format!(
            "{what} sealed with bytes {}..{} missing",
            gap.start, gap.end
        ))),
    }
}

/// One file of a tree being received.
struct TreeFile {
    entry: FileEntry,
    shown: String,
    final_path: PathBuf,
    paths: PartPaths,
    state: Mutex<PartState>,
}

/// The open part file, its journal, and which byte ranges verified.
#[derive(Default)]
struct PartState {
    part: Option<Arc<File>>,
    journal: Option<Journal>,
    verified: RangeSet<u64>,
    sealed: bool,
}

/// Files under the receiver's root.
pub struct FileTree {
    root: PathBuf,
    files: Vec<TreeFile>,
    dirs: Vec<(PathBuf, DirEntry)>,
    active: ActivePaths,
    claimed: Vec<PathBuf>,
}

impl Drop for FileTree {
    fn drop(&mut self) {
        let mut active = self.active.lock().expect("active paths lock");
        for p in &self.claimed {
            active.remove(p);
        }
    }
}

impl FileTree {
    fn prepare(
        root: &Path,
        manifest: &Manifest,
        active: ActivePaths,
    ) -> Result<(FileTree, Vec<FileStatus>), DestinationError> {
        let refused = |e: crate::manifest::PathError| DestinationError::Refused(e.to_string());
        let dest = split_relative(&manifest.dest, true).map_err(refused)?;
        let mut tree = FileTree {
            root: root.to_path_buf(),
            files: Vec::new(),
            dirs: Vec::new(),
            active,
            claimed: Vec::new(),
        };
        let mut dirs = DirChecker {
            root,
            checked: HashSet::new(),
        };
        let dest_dir = dirs.ensure(root, &dest)?;
        let mut seen = HashSet::new();
        for dir in &manifest.dirs {
            let comps = split_relative(&dir.path, false).map_err(refused)?;
            let path = dirs.ensure(&dest_dir, &comps)?;
            tree.dirs.push((path, dir.clone()));
        }
        let mut plan = Vec::with_capacity(manifest.files.len());
        for entry in &manifest.files {
            let comps = split_relative(&entry.path, false).map_err(refused)?;
            let (name, parents) = comps
                .split_last()
                .expect("split_relative never returns an empty list here");
            let parent = dirs.ensure(&dest_dir, parents)?;
            let final_path = parent.join(name);
            let shown = shown_under(root, &final_path);
            if !seen.insert(final_path.clone()) {
                return Err(DestinationError::Refused(format!(
                    "{shown} appears twice in the manifest"
                )));
            }
            let (status, state) = resume_state(&final_path, entry, &shown)?;
            plan.push(status);
            tree.files.push(TreeFile {
                entry: entry.clone(),
                shown,
                paths: PartPaths::for_final(&final_path),
                final_path,
                state: Mutex::new(state),
            });
        }
        {
            let mut active_paths = tree.active.lock().expect("active paths lock");
            if let Some(busy) = tree
                .files
                .iter()
                .find(|f| active_paths.contains(&f.final_path))
            {
                return Err(DestinationError::Refused(format!(
                    "another session is writing {} now",
                    busy.shown
                )));
            }
            for f in &tree.files {
                active_paths.insert(f.final_path.clone());
                tree.claimed.push(f.final_path.clone());
            }
        }
        Ok((tree, plan))
    }

    fn file(&self, file: u32) -> Result<&TreeFile, DestinationError> {
        self.files
            .get(file as usize)
            .ok_or_else(|| DestinationError::Protocol(format!("chunk for unknown file {file}")))
    }

    fn write(
        &self,
        file: u32,
        offset: u64,
        data: &[u8],
        checksum: u64,
    ) -> Result<(), DestinationError> {
        let f = self.file(file)?;
        let end = chunk_end(offset, data.len() as u64, f.entry.size)?;
        if data.is_empty() {
            return Ok(());
        }
        let part = {
            let mut state = f.state.lock().expect("part lock");
            if gaps_empty(&state.verified, offset..end) {
                return Ok(()); // a duplicate of a chunk that already verified: harmless, nothing to write
            }
            f.open_part(&mut state)?
        };
        part.write_all_at(data, offset).map_err(|e| f.io_error(e))?;
        let mut state = f.state.lock().expect("part lock");
        if let Some(journal) = state.journal.as_mut() {
            journal
                .record(offset, data.len() as u64, checksum)
                .map_err(|e| f.io_error(e))?;
        }
        state.verified.insert(offset..end);
        Ok(())
    }

    fn seal(&self, file: u32, expected: Option<[u8; 32]>) -> Result<(), DestinationError> {
        let f = self.file(file)?;
        let mut state = f.state.lock().expect("part lock");
        if state.sealed {
            return Err(DestinationError::Protocol(format!(
                "{} sealed twice",
                f.shown
            )));
        }
        require_complete(&state.verified, f.entry.size, &f.shown)?;
        let part = f.open_part(&mut state)?;
        if let Some(expected) = expected {
            let mut hasher = blake3::Hasher::new();
            let mut reader = std::io::BufReader::with_capacity(1 << 20, &*part);
            std::io::copy(&mut reader, &mut hasher).map_err(|e| f.io_error(e))?;
            if hasher.finalize() != blake3::Hash::from(expected) {
                return Err(DestinationError::Refused(format!(
                    "{}: end-to-end BLAKE3 differs from the sender's; the file was not put in place",
                    f.shown
                )));
            }
        }
        part.set_permissions(std::fs::Permissions::from_mode(f.entry.mode & 0o777))
            .map_err(|e| f.io_error(e))?;
        part.set_modified(f.entry.mtime.to_system_time())
            .map_err(|e| f.io_error(e))?;
        if std::fs::symlink_metadata(&f.final_path).is_ok_and(|m| m.is_dir()) {
            return Err(DestinationError::Refused(format!(
                "{}: a directory is in the way",
                f.shown
            )));
        }
        std::fs::rename(&f.paths.part, &f.final_path).map_err(|e| f.io_error(e))?;
        let _ = std::fs::remove_file(&f.paths.journal);
        state.part = None;
        state.journal = None;
        state.sealed = true;
        Ok(())
    }

    fn finish(&self) -> Result<(), DestinationError> {
        for (path, dir) in self.dirs.iter().rev() {
            let shown = shown_under(&self.root, path);
            let io = |source| DestinationError::Io {
                path: shown.clone(),
                source,
            };
            let handle = File::open(path).map_err(io)?;
            handle
                .set_permissions(std::fs::Permissions::from_mode(dir.mode & 0o777))
                .map_err(io)?;
            handle
                .set_modified(dir.mtime.to_system_time())
                .map_err(io)?;
        }
        let root = File::open(&self.root).map_err(|source| DestinationError::Io {
            path: ".".into(),
            source,
        })?;
        // SAFETY: syncfs only reads the fd, which `root` keeps open for the call.
        if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&root)) } != 0 {
            return Err(DestinationError::Io {
                path: ".".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }
}

impl TreeFile {
    fn io_error(&self, source: std::io::Error) -> DestinationError {
        DestinationError::Io {
            path: self.shown.clone(),
            source,
        }
    }

    /// The open part file, created (and preallocated, so a full disk shows at once) on first use.
    fn open_part(&self, state: &mut PartState) -> Result<Arc<File>, DestinationError> {
        if let Some(part) = &state.part {
            return Ok(part.clone());
        }
        let part = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&self.paths.part)
            .map_err(|e| self.io_error(e))?;
        if state.journal.is_none() {
            part.set_len(0).map_err(|e| self.io_error(e))?;
            preallocate(&part, self.entry.size).map_err(|e| self.io_error(e))?;
            let identity = SourceIdentity {
                size: self.entry.size,
                mtime: self.entry.mtime,
            };
            state.journal =
                Some(Journal::create(&self.paths.journal, identity).map_err(|e| self.io_error(e))?);
        }
        let part = Arc::new(part);
        state.part = Some(part.clone());
        Ok(part)
    }
}

fn gaps_empty(ranges: &RangeSet<u64>, range: std::ops::Range<u64>) -> bool {
    ranges.gaps(&range).next().is_none()
}

/// Reserves the file's blocks so that a full disk fails at the first chunk, not halfway.
fn preallocate(file: &File, size: u64) -> std::io::Result<()> {
    if size == 0 {
        return Ok(());
    }
    // SAFETY: plain syscall on an fd that `file` keeps open.
    let rc = unsafe {
        libc::posix_fallocate(
            std::os::fd::AsRawFd::as_raw_fd(file),
            0,
            size as libc::off_t,
        )
    };
    match rc {
        0 => Ok(()),
        libc::EOPNOTSUPP | libc::EINVAL => file.set_len(size),
        err => Err(std::io::Error::from_raw_os_error(err)),
    }
}

/// What survives of an earlier attempt at `final_path`, and the state to continue from.
fn resume_state(
    final_path: &Path,
    entry: &FileEntry,
    shown: &str,
) -> Result<(FileStatus, PartState), DestinationError> {
    if let Ok(meta) = std::fs::symlink_metadata(final_path) {
        if meta.is_dir() {
            return Err(DestinationError::Refused(format!(
                "{shown}: a directory is in the way"
            )));
        }
        if meta.is_file()
            && meta.len() == entry.size
            && crate::manifest::Timestamp::mtime_of(&meta) == entry.mtime
        {
            // A journal may outlive its rename when the receiver died in between.
            remove_leftovers(&PartPaths::for_final(final_path), shown)?;
            return Ok((FileStatus::Complete, PartState::default()));
        }
    }
    let paths = PartPaths::for_final(final_path);
    let part = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&paths.part);
    let identity = SourceIdentity {
        size: entry.size,
        mtime: entry.mtime,
    };
    let resumed = part.ok().and_then(|part| {
        let (journal, verified) = Journal::resume(&paths.journal, &part, identity)?;
        Some(PartState {
            part: Some(Arc::new(part)),
            journal: Some(journal),
            verified,
            sealed: false,
        })
    });
    match resumed {
        Some(state) if !state.verified.is_empty() => {
            let ranges = state
                .verified
                .iter()
                .map(|r| (r.start, r.end - r.start))
                .collect();
            Ok((FileStatus::Partial(ranges), state))
        }
        Some(state) => Ok((FileStatus::Missing, state)),
        None => {
            // Stale or foreign leftovers of another version: start over.
            remove_leftovers(&paths, shown)?;
            Ok((FileStatus::Missing, PartState::default()))
        }
    }
}

/// Removes a part file and journal if they exist.
fn remove_leftovers(paths: &PartPaths, shown: &str) -> Result<(), DestinationError> {
    for stale in [&paths.part, &paths.journal] {
        match std::fs::remove_file(stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(DestinationError::Io {
                    path: shown.to_string(),
                    source,
                })
            }
        }
    }
    Ok(())
}

/// Makes sure directories exist under the root without passing through symbolic links or
/// non-directories, so nothing is ever written outside the root. Remembers what it checked, so a
/// manifest of many files in few directories costs one `lstat` per directory, not per file.
struct DirChecker<'a> {
    root: &'a Path,
    checked: HashSet<PathBuf>,
}

impl DirChecker<'_> {
    /// Walks `components` below `base` (the root or a directory under it), creating what is
    /// missing; returns the resulting directory.
    fn ensure(
        &mut self,
        base: &Path,
        components: &[&std::ffi::OsStr],
    ) -> Result<PathBuf, DestinationError> {
        let mut path = base.to_path_buf();
        for comp in components {
            path = join_components(&path, &[comp]);
            if self.checked.contains(&path) {
                continue;
            }
            let shown = || shown_under(self.root, &path);
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(DestinationError::Refused(format!(
                        "path {} is a symbolic link on the receiver; refusing to write through it",
                        shown()
                    )))
                }
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(DestinationError::Refused(format!(
                        "{} exists and is not a directory",
                        shown()
                    )))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    match std::fs::create_dir(&path) {
                        Ok(()) => {}
                        Err(e)
                            if e.kind() == std::io::ErrorKind::AlreadyExists
                                && path.is_dir()
                                && !path.is_symlink() => {}
                        Err(source) => {
                            return Err(DestinationError::Io {
                                path: shown(),
                                source,
                            })
                        }
                    }
                }
                Err(source) => {
                    return Err(DestinationError::Io {
                        path: shown(),
                        source,
                    })
                }
            }
            self.checked.insert(path.clone());
        }
        Ok(path)
    }
}

fn shown_under(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
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
    use crate::manifest::Timestamp;

    #[test]
    fn a_complete_file_loses_a_journal_left_from_before_its_rename() {
        let dir = tempfile::tempdir().unwrap();
        let final_path = dir.path().join("done.bin");
        std::fs::write(&final_path, b"abc").unwrap();
        let mtime = Timestamp::mtime_of(&std::fs::metadata(&final_path).unwrap());
        let paths = PartPaths::for_final(&final_path);
        std::fs::write(&paths.journal, b"stale").unwrap();
        let entry = FileEntry {
            path: b"done.bin".to_vec(),
            size: 3,
            mode: 0o644,
            mtime,
        };
        let (status, _) = resume_state(&final_path, &entry, "done.bin").unwrap();
        assert_eq!(status, FileStatus::Complete);
        assert!(!paths.journal.exists());
        assert_eq!(std::fs::read(&final_path).unwrap(), b"abc");
    }
}
