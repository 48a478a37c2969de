//! Files under the receiver's root. Every directory a session writes into is checked once (no
//! symbolic links, no non-directories on the way, missing ones created) and then held open as a
//! handle beneath the root (cap-std); part files, journals, renames and removals all go through
//! those handles, so a path swapped for a symbolic link mid-session cannot redirect a write
//! outside the root. Each file arrives as a hidden part file, with a journal of verified chunks
//! beside it unless it is small and arrives in one chunk, and is renamed to its name only after
//! every chunk verified. A part file and its journal are open only while chunks are still due,
//! so a session of many small files holds few descriptors however many files wait for their
//! seal.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt as _, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use cap_std::fs::{Dir, MetadataExt, OpenOptions, OpenOptionsExt};
use rangemap::RangeSet;

use super::announced::Announced;
use super::destination::{
    chunk_end, require_complete, ActivePaths, DestinationError, Placement, Sealed, CLAIM_WAIT,
};
use super::mirror::Mirror;
use crate::direct_io;
use crate::journal::{Journal, PartPaths, SourceIdentity};
use crate::manifest::{split_relative, DirEntry, FileEntry, ManifestBatch, PathError, Timestamp};
use crate::seal::ChunkCheck;
use crate::sync::unpoisoned;
use crate::sys::mapped::{self, Detachable, Truncated, WriteWindow, MAPPED_MIN};
use crate::sys::writeback;
use crate::wire::{FileStatus, PresentFiles, Removal};

/// Files smaller than this that arrive in one chunk get no journal: an interruption before
/// their seal costs sending them again, at most this much each, and saves a journal's create,
/// write and removal per file.
const UNJOURNALED_BELOW: u64 = 1 << 20;

/// One file of a tree being received.
struct TreeFile {
    entry: FileEntry,
    /// Path relative to the root: for messages and for the claim against other sessions.
    rel: PathBuf,
    /// The directory the file lands in.
    dir: Arc<Dir>,
    /// Final name in `dir`.
    name: OsString,
    /// Part and journal names in `dir`.
    names: PartPaths,
    state: Mutex<PartState>,
    /// Signalled when a range stops being written.
    written: Condvar,
    /// Write the part file with direct I/O.
    direct: bool,
    /// A copy in place of the entry's size is taken for it whatever its mtime, and its seal
    /// compares its content ([`PresentFiles::Compared`]).
    compared: bool,
    /// Other sessions of a striped transfer write other ranges of it ([`FileTree::striped`]).
    striped: bool,
}

/// A file's part file and journal (open while chunks are due), and which byte ranges verified.
#[derive(Default)]
struct PartState {
    /// The part file holds this attempt's data (made by its first chunk, or resumed); until
    /// then the first chunk makes it afresh.
    started: bool,
    /// The file has a journal: it arrives in several chunks.
    journaled: bool,
    part: Option<Arc<PartFile>>,
    journal: Option<Journal>,
    verified: RangeSet<u64>,
    /// Ranges streams are writing now, so that a copy that fails its checksum never lands over
    /// one that passed ([`TreeFile::claim`]).
    writing: Vec<Writing>,
    /// Claims made so far (each gets its number).
    claims: u64,
    /// The file was in place before the session, and the sender verifies or compares it
    /// ([`Placement::present`]): it is held whole (so no chunk is written to it) and its seal
    /// compares its content.
    present: bool,
}

/// An open part file.
struct PartFile {
    file: File,
    /// The same file opened for direct I/O, when the receiver writes that way.
    direct: Option<File>,
}

impl PartFile {
    /// Writes `data` at `offset`, directly where the receiver writes that way and the data is
    /// aligned ([`direct_io::write_at`]).
    fn write_at(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        match &self.direct {
            Some(direct) => direct_io::write_at(direct, &self.file, data, offset),
            None => self.file.write_all_at(data, offset),
        }
    }

    /// Starts writing `range`, just received, to disk. Without it the kernel keeps a session's
    /// data dirty in memory up to its background limit (a tenth of memory by default), and the
    /// flush at the session's end (`syncfs`) then waits for all of it: seconds after the last
    /// byte arrived, and minutes on a host with hundreds of gigabytes. Nothing depends on it
    /// succeeding: the flush makes the data durable.
    fn start_writeback(&self, range: Range<u64>) {
        if let Err(e) = writeback::start(&self.file, range.start, range.end - range.start) {
            tracing::debug!("starting the write-back of a part file: {e}");
        }
    }

    /// The BLAKE3 hash of the whole file, read the way the receiver writes.
    fn blake3(&self) -> std::io::Result<blake3::Hash> {
        match &self.direct {
            Some(direct) => direct_io::blake3_of(direct, true),
            None => direct_io::blake3_of(&self.file, false),
        }
    }
}

/// A range one stream is writing.
struct Writing {
    claim: u64,
    range: Range<u64>,
    /// The window the stream receives the range into, once mapped.
    window: Option<Detachable>,
    /// Another stream's verified copy detached the window: what this stream still receives
    /// goes nowhere, and it records nothing.
    detached: bool,
}

impl Writing {
    fn blocks(&self, range: &Range<u64>) -> bool {
        !self.detached && self.range.start < range.end && range.start < self.range.end
    }
}

/// Files under the receiver's root for one session.
pub struct FileTree {
    root: Dir,
    /// The destination directory, relative to the root.
    dest: PathBuf,
    /// The session, which claims the paths it writes.
    owner: [u8; 16],
    /// Directory handles (used as batches arrive, as the control connection's task hands them).
    checker: Mutex<DirChecker>,
    /// Directories whose metadata is set at the end.
    dirs: Mutex<Vec<(PathBuf, DirEntry)>>,
    files: Announced<TreeFile>,
    active: Arc<ActivePaths>,
    /// What becomes of files already in place: unless kept, they stay announced until their
    /// seal verifies or compares them.
    present: PresentFiles,
    /// Write with direct I/O.
    direct: bool,
    /// A dry run ([`crate::manifest::SinkKind::Preview`]): batches are planned and nothing
    /// is made, written, removed or claimed.
    preview: bool,
    /// Files a dry run planned so far (the number of the next batch's first).
    previewed: Mutex<u32>,
    /// A dry run's files of the last batch planned complete and compared by content, until
    /// their seals compare them ([`PresentFiles::Compared`]).
    preview_compared: Mutex<BTreeMap<u32, TreeFile>>,
    /// A mirroring session's manifest and filter: what it removes at the end.
    mirror: Option<Mirror>,
    /// One session of a striped transfer ([`crate::stripe`]): other sessions, in this process
    /// or on other nodes sharing the file system, write other ranges of the same files into
    /// the same part files and journal. Whatever decides between them (a part file and
    /// journal made or joined, what survives of an earlier attempt, the file placed) is done
    /// holding the directory's lock ([`TreeFile::stripe_lock`]), and every file has a journal.
    striped: bool,
}

impl Drop for FileTree {
    fn drop(&mut self) {
        let unsealed = self.files.unsettled();
        self.active.release(unsealed.iter().map(|f| &f.rel));
    }
}

fn refused(e: PathError) -> DestinationError {
    DestinationError::Refused(e.to_string())
}

/// A peer-supplied relative path, checked, under the destination directory `dest`.
fn under(dest: &Path, path: &[u8]) -> Result<PathBuf, DestinationError> {
    let components = split_relative(path, false).map_err(refused)?;
    Ok(dest.join(components.iter().collect::<PathBuf>()))
}

fn io_at(path: &Path) -> impl Fn(std::io::Error) -> DestinationError + '_ {
    move |error| DestinationError::Io {
        path: path.display().to_string(),
        error,
    }
}

impl FileTree {
    /// Checks the destination directory and creates it if it is missing (a `preview` only
    /// looks: what is missing is planned as missing).
    pub(super) fn open(
        placement: Placement<'_>,
        preview: bool,
    ) -> Result<FileTree, DestinationError> {
        let dest: PathBuf = split_relative(placement.dest, true)
            .map_err(refused)?
            .into_iter()
            .collect();
        let root = Dir::open_ambient_dir(placement.root, cap_std::ambient_authority())
            .map_err(io_at(Path::new(".")))?;
        let mirror = placement.delete.map(Mirror::new).transpose()?;
        let mut checker = DirChecker::default();
        if preview {
            checker.look(&root, &dest)?;
        } else {
            checker.ensure(&root, &dest)?;
        }
        Ok(FileTree {
            root,
            dest,
            owner: placement.owner,
            checker: Mutex::new(checker),
            dirs: Mutex::default(),
            files: Announced::new(placement.max_unsealed, placement.budget.clone()),
            active: placement.active.clone(),
            direct: placement.direct_io,
            present: placement.present,
            preview,
            previewed: Mutex::new(0),
            preview_compared: Mutex::default(),
            mirror,
            striped: placement.striped,
        })
    }

    /// Whether chunks are written with direct I/O.
    pub(super) fn writes_direct(&self) -> bool {
        self.direct
    }

    /// Takes a batch of the manifest: checks every path, claims its files against other
    /// sessions, creates its directories, and reports what survives of earlier attempts.
    /// Returns the number of the batch's first file and each file's status.
    pub(super) fn add_batch(
        &self,
        batch: &ManifestBatch,
    ) -> Result<(u32, Vec<FileStatus>), DestinationError> {
        let mut rels = Vec::with_capacity(batch.files.len());
        let mut seen = HashSet::new();
        for entry in &batch.files {
            let rel = under(&self.dest, &entry.path)?;
            if !seen.insert(rel.clone()) {
                return Err(DestinationError::Refused(format!(
                    "{} appears twice in the manifest",
                    rel.display()
                )));
            }
            rels.push(rel);
        }
        let dirs = self.check_kinds(batch, &rels)?;
        if let Some(mirror) = &self.mirror {
            mirror.keep(&self.dest, &dirs, &rels);
        }
        if self.preview {
            return self.preview_batch(batch, &rels);
        }
        let room = self.files.reserve(rels.len())?;
        // Claim before touching anything, so that leftovers another session is writing are
        // never taken for stale ones.
        self.active.claim(&rels, self.owner, CLAIM_WAIT)?;
        let prepared = match self.prepare_files(batch, &rels) {
            Ok(prepared) => prepared,
            Err(e) => {
                self.active.release(&rels);
                return Err(e);
            }
        };
        let plan: Vec<_> = prepared.iter().map(|(status, _)| status.clone()).collect();
        // Nothing will be written to a file that is already complete; unless it is to be
        // verified or compared, nothing more is done with it either.
        let kept = self.present == PresentFiles::Kept;
        if kept {
            self.active.release(
                prepared
                    .iter()
                    .filter(|(status, _)| *status == FileStatus::Complete)
                    .map(|(_, file)| &file.rel),
            );
        }
        let first = room.add(prepared.into_iter().map(|(status, file)| match status {
            FileStatus::Complete if !kept => {
                let mut state = file.state.lock().expect("part lock");
                state.present = true;
                if file.entry.size > 0 {
                    state.verified.insert(0..file.entry.size);
                }
                drop(state);
                Some(file)
            }
            FileStatus::Complete => None,
            _ => Some(file),
        }));
        Ok((first, plan))
    }

    /// Refuses a batch that names one path as a file and as a directory (a directory of it, or
    /// the parent of another entry), within the batch or with what the session announced
    /// before: no plan could place both. Returns the batch's directories, checked.
    fn check_kinds(
        &self,
        batch: &ManifestBatch,
        files: &[PathBuf],
    ) -> Result<Vec<PathBuf>, DestinationError> {
        let named: Vec<PathBuf> = batch
            .dirs
            .iter()
            .map(|dir| under(&self.dest, &dir.path))
            .collect::<Result<_, _>>()?;
        let parents = named.iter().chain(files).flat_map(|path| {
            path.ancestors()
                .skip(1)
                .take_while(|a| *a != self.dest)
                .map(Path::to_path_buf)
        });
        let dirs: HashSet<PathBuf> = parents.chain(named.iter().cloned()).collect();
        let both = |path: &Path| {
            DestinationError::Refused(format!(
                "{} is announced both as a file and as a directory",
                path.display()
            ))
        };
        let checker = self.checker.lock().expect("directory checker lock");
        if let Some(file) = files.iter().find(|f| dirs.contains(*f) || checker.has(f)) {
            return Err(both(file));
        }
        match dirs.iter().find(|d| self.active.held_by(d, self.owner)) {
            Some(dir) => Err(both(dir)),
            None => Ok(named),
        }
    }

    /// Makes a batch's directories and its files' state.
    fn prepare_files(
        &self,
        batch: &ManifestBatch,
        rels: &[PathBuf],
    ) -> Result<Vec<(FileStatus, TreeFile)>, DestinationError> {
        let mut checker = self.checker.lock().expect("directory checker lock");
        for dir in &batch.dirs {
            let rel = under(&self.dest, &dir.path)?;
            checker.ensure(&self.root, &rel)?;
            self.dirs
                .lock()
                .expect("directories lock")
                .push((rel, dir.clone()));
        }
        let mut prepared = Vec::with_capacity(rels.len());
        for (entry, rel) in batch.files.iter().zip(rels) {
            let parent = rel.parent().unwrap_or(Path::new(""));
            let dir = checker.ensure(&self.root, parent)?;
            // Nothing of an earlier attempt can be in a directory this session made.
            let fresh = checker.made(parent);
            let file = self.tree_file(entry, rel, dir);
            if fresh {
                prepared.push((FileStatus::Missing, file));
            } else {
                let _lock = file.stripe_lock()?;
                let (status, state) = file.resume_state(false)?;
                *file.state.lock().expect("part lock") = state;
                prepared.push((status, file));
            }
        }
        Ok(prepared)
    }

    /// A file of the manifest at `rel`, in the directory `dir`, with nothing of it received yet.
    fn tree_file(&self, entry: &FileEntry, rel: &Path, dir: Arc<Dir>) -> TreeFile {
        let name = rel
            .file_name()
            .expect("a checked file path ends in a name")
            .to_owned();
        let names = PartPaths::for_final(Path::new(&name));
        TreeFile {
            entry: entry.clone(),
            rel: rel.to_path_buf(),
            dir,
            name,
            names,
            state: Mutex::default(),
            written: Condvar::new(),
            direct: self.direct,
            compared: self.present == PresentFiles::Compared,
            striped: self.striped,
        }
    }

    /// A dry run's plan of a batch: what [`FileTree::add_batch`] would answer, found by
    /// looking only (a file under a directory that is missing is missing).
    fn preview_batch(
        &self,
        batch: &ManifestBatch,
        rels: &[PathBuf],
    ) -> Result<(u32, Vec<FileStatus>), DestinationError> {
        let mut compared = self.preview_compared.lock().expect("preview lock");
        if !compared.is_empty() {
            return Err(DestinationError::Protocol(
                "a dry run's batch before the last one's files were compared".into(),
            ));
        }
        let mut checker = self.checker.lock().expect("directory checker lock");
        for dir in &batch.dirs {
            checker.look(&self.root, &under(&self.dest, &dir.path)?)?;
        }
        let mut previewed = self.previewed.lock().expect("preview lock");
        let mut plan = Vec::with_capacity(rels.len());
        for (number, (entry, rel)) in (*previewed..).zip(batch.files.iter().zip(rels)) {
            let parent = rel.parent().unwrap_or(Path::new(""));
            let Some(dir) = checker.look(&self.root, parent)? else {
                plan.push(FileStatus::Missing);
                continue;
            };
            let file = self.tree_file(entry, rel, dir);
            let status = file.resume_state(true)?.0;
            if status == FileStatus::Complete && file.compared {
                compared.insert(number, file);
            }
            plan.push(status);
        }
        let first = *previewed;
        *previewed = previewed.saturating_add(plan.len() as u32);
        Ok((first, plan))
    }

    /// Writes a verified chunk at its offset and journals it; a chunk that already verified is
    /// a harmless duplicate and is not written again.
    pub(super) fn write(
        &self,
        file: u32,
        offset: u64,
        data: &[u8],
        checksum: u64,
    ) -> Result<(), DestinationError> {
        let Some(f) = self.files.get(file)? else {
            // Sealed already: a late copy of a chunk it holds.
            return Ok(());
        };
        let end = chunk_end(offset, data.len() as u64, f.entry.size)?;
        if data.is_empty() {
            return Ok(());
        }
        let Some((part, claim)) = f.claim(offset..end, true)? else {
            return Ok(());
        };
        // The part file was made full length: shorter, another process cut it, and a write
        // past its end would extend it again over zeros where verified bytes were. (A mapped
        // window finds the same through the fault it takes, `map_chunk`.)
        let len = part.file.metadata().map_err(io_at(&f.rel))?.len();
        if len < f.entry.size {
            return Err(f.truncated());
        }
        part.write_at(data, offset).map_err(io_at(&f.rel))?;
        part.start_writeback(offset..end);
        claim.commit(checksum).map(drop)
    }

    /// A window of `file`'s part file to receive a chunk of `len` bytes at `offset` straight
    /// into, or `None` when the chunk is better read into a buffer and given to
    /// [`FileTree::write`]: it is short, the receiver writes with direct I/O, the program did
    /// not turn mapping on (`crate::enable_mapped_files`), its file is sealed, it already
    /// verified, another stream is writing it, or the part file cannot be mapped.
    pub(super) fn map_chunk(
        &self,
        file: u32,
        offset: u64,
        len: usize,
    ) -> Result<Option<MappedChunk>, DestinationError> {
        if len < MAPPED_MIN || self.direct || !mapped::enabled() {
            return Ok(None);
        }
        let Some(f) = self.files.get(file)? else {
            return Ok(None);
        };
        let end = chunk_end(offset, len as u64, f.entry.size)?;
        let Some((part, claim)) = f.claim(offset..end, false)? else {
            return Ok(None);
        };
        match WriteWindow::map(&part.file, offset, len) {
            Ok(window) => {
                claim.register(window.detachable());
                Ok(Some(MappedChunk {
                    claim,
                    window,
                    part,
                }))
            }
            Err(_) if part.file.metadata().is_ok_and(|m| m.len() < end) => Err(f.truncated()),
            Err(e) => {
                tracing::debug!(
                    "{}: receiving through a buffer, the part file cannot be mapped: {e}",
                    f.rel.display()
                );
                Ok(None)
            }
        }
    }

    /// Puts a complete file in place: checks every byte verified (and the whole-file BLAKE3 when
    /// given), sets mode and mtime, renames the part file to the final name. A file that was in
    /// place before is verified or compared instead ([`FileTree::seal_present`]).
    pub(super) fn seal(
        &self,
        file: u32,
        expected: Option<[u8; 32]>,
    ) -> Result<Sealed, DestinationError> {
        if self.preview {
            return self.seal_preview(file, expected);
        }
        let f = self.files.to_seal(file)?;
        let io = io_at(&f.rel);
        let mut state = f.state.lock().expect("part lock");
        if state.present {
            drop(state);
            return self.seal_present(file, &f, expected);
        }
        let _lock = f.stripe_lock()?;
        if f.striped {
            match f.striped_seal(&mut state)? {
                Sealed::Placed => {}
                sealed => {
                    // Held for the other nodes' ranges, or placed by the node that wrote the
                    // last: nothing more is done with it here.
                    state.part = None;
                    state.journal = None;
                    drop(state);
                    self.files.settle(file);
                    self.active.release([&f.rel]);
                    return Ok(sealed);
                }
            }
        }
        require_complete(&state.verified, f.entry.size, &f.rel.display().to_string())?;
        // Made here for an empty file, which no chunk started.
        let part = f.open_part(&mut state, true)?;
        if part.file.metadata().map_err(&io)?.len() != f.entry.size {
            return Err(f.truncated());
        }
        if let Some(expected) = expected {
            if part.blake3().map_err(&io)? != blake3::Hash::from(expected) {
                // What it holds is no version of the source: a later run must not resume it.
                *state = PartState::default();
                f.remove_leftovers()?;
                return Err(DestinationError::Refused(format!(
                    "{}: end-to-end BLAKE3 differs from the sender's; the file was not put in \
                     place and what the receiver held of it was discarded: run the same command \
                     again to send it whole",
                    f.rel.display()
                )));
            }
        }
        part.file
            .set_permissions(std::fs::Permissions::from_mode(f.entry.mode & 0o777))
            .map_err(&io)?;
        part.file
            .set_modified(f.entry.mtime.to_system_time())
            .map_err(&io)?;
        if f.dir.symlink_metadata(&f.name).is_ok_and(|m| m.is_dir()) {
            return Err(DestinationError::Refused(format!(
                "{}: a directory is in the way",
                f.rel.display()
            )));
        }
        f.dir.rename(&f.names.part, &f.dir, &f.name).map_err(&io)?;
        if state.journaled {
            let _ = f.dir.remove_file(&f.names.journal);
        }
        // Closed now, whoever still holds the file's state for a moment.
        state.part = None;
        state.journal = None;
        drop(state);
        self.files.settle(file);
        self.active.release([&f.rel]);
        Ok(Sealed::Placed)
    }

    /// Seals `file`, which was in place before the session: its content must hash as the
    /// sender's source did (`expected`). Compared by content, a copy that does is given the
    /// source's mode and mtime (so that a later plain run finds it complete too), and one
    /// that does not is dropped from the plan, to be sent whole. Verified, a copy that
    /// differs fails, and is left as it is: with the source's size and mtime, it may as well
    /// be the one that is right.
    fn seal_present(
        &self,
        file: u32,
        f: &TreeFile,
        expected: Option<[u8; 32]>,
    ) -> Result<Sealed, DestinationError> {
        let io = io_at(&f.rel);
        let held = f.holds_content(expected)?;
        if f.compared && held.is_none() {
            // The copy in place stays until the source's, sent now, is renamed over it.
            *f.state.lock().expect("part lock") = PartState::default();
            return Ok(Sealed::Changed);
        }
        self.files.settle(file);
        self.active.release([&f.rel]);
        match held {
            Some((held, meta)) if f.compared => {
                // Only what differs is set: a re-run of an identical tree changes no inode.
                let mode = f.entry.mode & 0o777;
                if meta.mode() & 0o777 != mode {
                    held.set_permissions(std::fs::Permissions::from_mode(mode))
                        .map_err(&io)?;
                }
                if Timestamp::mtime_of(&meta) != f.entry.mtime {
                    held.set_modified(f.entry.mtime.to_system_time())
                        .map_err(&io)?;
                }
                Ok(Sealed::Placed)
            }
            Some(_) => Ok(Sealed::Placed),
            None => Err(DestinationError::Refused(format!(
                "{}: the file already here has the source's size and mtime but not its content \
                 (end-to-end BLAKE3 differs); it was left as it is: send it again with \
                 --checksum to replace it",
                f.rel.display()
            ))),
        }
    }

    /// A dry run's seal of a file it planned complete to compare by content: whether a run
    /// would keep it or send it, changing nothing. Nothing else is sealed in a dry run.
    fn seal_preview(
        &self,
        file: u32,
        expected: Option<[u8; 32]>,
    ) -> Result<Sealed, DestinationError> {
        let compared = self
            .preview_compared
            .lock()
            .expect("preview lock")
            .remove(&file);
        let Some(f) = compared else {
            return Err(DestinationError::Protocol(
                "a seal in a dry run, which places nothing".into(),
            ));
        };
        match f.holds_content(expected)? {
            Some(_) => Ok(Sealed::Placed),
            None => Ok(Sealed::Changed),
        }
    }

    /// Removes what a mirroring session's manifest does not hold ([`Mirror`]), sets directory
    /// modes and mtimes (deepest first, after their contents arrived and the removals, which
    /// change them) and flushes the filesystem. A dry run only finds what it would remove.
    pub(super) fn finish(&self) -> Result<Removal, DestinationError> {
        let removed = match &self.mirror {
            Some(mirror) => {
                mirror.sweep(&self.dest, &self.active, self.owner, self.preview, |top| {
                    self.checker
                        .lock()
                        .expect("directory checker lock")
                        .look(&self.root, top)
                })?
            }
            None => Removal::default(),
        };
        if self.preview {
            return Ok(removed);
        }
        for (rel, dir) in self.dirs.lock().expect("directories lock").iter().rev() {
            let io = io_at(rel);
            let handle = open_dir_read_only(&self.root, rel).map_err(&io)?;
            handle
                .set_permissions(std::fs::Permissions::from_mode(dir.mode & 0o777))
                .map_err(&io)?;
            handle
                .set_modified(dir.mtime.to_system_time())
                .map_err(&io)?;
        }
        let io = io_at(Path::new("."));
        let root = open_dir_read_only(&self.root, Path::new(".")).map_err(&io)?;
        rustix::fs::syncfs(&root).map_err(|e| io(e.into()))?;
        Ok(removed)
    }
}

/// A directory opened read-only beneath `root`, never through a link at its end. Directory
/// handles are path-only descriptors, which can neither change modes and times nor sync a
/// filesystem.
pub(super) fn open_dir_read_only(root: &Dir, rel: &Path) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW);
    Ok(root.open_with(rel, &options)?.into_std())
}

/// Options for opening a part file or journal in its directory: read-write, never through a
/// symbolic link, never blocking (on a FIFO someone left there), private until renamed into
/// place; with `direct`, for direct I/O.
fn part_options(create: bool, direct: bool) -> OpenOptions {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(create);
    let direct = if direct { direct_io::O_DIRECT } else { 0 };
    options
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | direct);
    options
}

/// The error for a part file or journal name taken by something that is not a regular file.
fn not_regular(name: &Path) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!(
            "refusing to write into {}: it is not a regular file",
            name.display()
        ),
    )
}

/// A range of a file that one stream is writing; released when dropped, whether or not it
/// was committed.
struct Claim {
    file: Arc<TreeFile>,
    number: u64,
    range: Range<u64>,
}

impl Claim {
    /// Records the window the range is received into, which another stream's verified copy may
    /// detach (and wakes such a copy waiting for it).
    fn register(&self, window: Detachable) {
        let mut state = self.file.state.lock().expect("part lock");
        if let Some(w) = state.writing.iter_mut().find(|w| w.claim == self.number) {
            w.window = Some(window);
        }
        drop(state);
        self.file.written.notify_all();
    }

    /// Whether another stream's verified copy detached this claim's window.
    fn was_detached(&self, state: &PartState) -> bool {
        state
            .writing
            .iter()
            .any(|w| w.claim == self.number && w.detached)
    }

    /// Records the range as verified (and journals it), once its bytes are in the part file.
    /// Returns whether the range is verified: when the claim was detached, whether the copy
    /// that detached it was recorded (waiting for it while it is written).
    fn commit(&self, checksum: u64) -> Result<bool, DestinationError> {
        let f = &self.file;
        let (start, end) = (self.range.start, self.range.end);
        let mut state = f.state.lock().expect("part lock");
        if self.was_detached(&state) {
            // The verified copy that detached this window may still be writing: its outcome,
            // not these bytes, says whether the range is verified.
            while state.verified.gaps(&self.range).next().is_some()
                && state
                    .writing
                    .iter()
                    .any(|w| w.claim != self.number && w.blocks(&self.range))
            {
                state = f.written.wait(state).expect("part lock");
            }
            return Ok(state.verified.gaps(&self.range).next().is_none());
        }
        if state.journaled {
            f.journal(&mut state)?
                .record(start, end - start, checksum)
                .map_err(io_at(&f.rel))?;
        }
        state.verified.insert(start..end);
        if state.verified.gaps(&(0..f.entry.size)).next().is_none() {
            // Nothing more will be written: close until the seal.
            state.part = None;
            state.journal = None;
        }
        Ok(true)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        // A drop must not panic (one while unwinding aborts), and taking the claim out leaves
        // the state whole.
        let mut state = unpoisoned(self.file.state.lock());
        state.writing.retain(|w| w.claim != self.number);
        drop(state);
        self.file.written.notify_all();
    }
}

/// A chunk being received straight into its part file through a mapped window. The claim is
/// released before the window is unmapped (fields drop in order), so a window is only ever
/// detached while it is mapped.
pub(super) struct MappedChunk {
    claim: Claim,
    window: WriteWindow,
    part: Arc<PartFile>,
}

impl MappedChunk {
    /// Where the chunk's bytes go: read them from the connection into this.
    pub(super) fn bytes(&mut self) -> &mut [u8] {
        self.window.for_kernel()
    }

    /// Checks the received bytes against `check`; when they match, records the range as
    /// verified. Returns whether the range is verified now. A mismatch leaves the range
    /// unverified (a good copy will overwrite it).
    pub(super) fn commit(self, check: &ChunkCheck) -> Result<bool, DestinationError> {
        let matched = self
            .window
            .guard(|bytes| check.matches(bytes))
            .map_err(|Truncated| self.claim.file.truncated())?;
        // Bytes that went partly to the memory a detach mapped over the window do not match,
        // and are no fault of the path: the detaching copy decides.
        let detached = || {
            self.claim
                .was_detached(&self.claim.file.state.lock().expect("part lock"))
        };
        if !matched && !detached() {
            return Ok(false);
        }
        self.part.start_writeback(self.claim.range.clone());
        self.claim.commit(check.checksum)
    }
}

impl TreeFile {
    /// The error for a part file whose size another process changed (it was made full length).
    fn truncated(&self) -> DestinationError {
        DestinationError::Refused(format!(
            "{}: another process changed the size of the part file while it was being received",
            self.rel.display()
        ))
    }

    /// Claims `range` for writing and returns the part file to write it into, or `None` when
    /// it already verified (a duplicate) or, unless `verified_copy`, when another stream is
    /// writing it. A `verified_copy` (its checksum matched already) detaches the windows of
    /// streams still receiving the range, rather than wait for a stream that may be stalled
    /// for good, and waits only for a copy being written from memory.
    fn claim(
        self: &Arc<Self>,
        range: Range<u64>,
        verified_copy: bool,
    ) -> Result<Option<(Arc<PartFile>, Claim)>, DestinationError> {
        let mut state: MutexGuard<'_, PartState> = self.state.lock().expect("part lock");
        loop {
            if state.verified.gaps(&range).next().is_none() {
                return Ok(None);
            }
            let mut blocked = false;
            for w in state.writing.iter_mut().filter(|w| w.blocks(&range)) {
                match &w.window {
                    Some(window) if verified_copy => {
                        window.detach().map_err(io_at(&self.rel))?;
                        w.detached = true;
                    }
                    _ if verified_copy => blocked = true,
                    _ => return Ok(None),
                }
            }
            if !blocked {
                break;
            }
            state = self.written.wait(state).expect("part lock");
        }
        let whole = range.start == 0 && range.end == self.entry.size;
        let _lock = match state.started {
            false => self.stripe_lock()?,
            true => None,
        };
        let part = self.open_part(&mut state, whole)?;
        state.claims += 1;
        let number = state.claims;
        state.writing.push(Writing {
            claim: number,
            range: range.clone(),
            window: None,
            detached: false,
        });
        let claim = Claim {
            file: self.clone(),
            number,
            range,
        };
        Ok(Some((part, claim)))
    }

    /// Opens a part file or journal; only a regular file is ever opened, so a device node or
    /// FIFO under that name is neither written nor even opened.
    fn open(&self, name: &Path, create: bool) -> std::io::Result<File> {
        self.open_with(name, &part_options(create, false))
    }

    /// Opens the journal for appending ([`crate::journal`]), as [`TreeFile::open`] opens.
    fn open_journal(&self, create: bool) -> std::io::Result<File> {
        let mut options = part_options(create, false);
        options.append(true);
        self.open_with(&self.names.journal, &options)
    }

    /// In a striped session, the lock of the file's directory, held until the returned file is
    /// dropped: an exclusive `flock` on a descriptor of the directory opened for it, so that
    /// it keeps out the other sessions of the transfer, here and on every node whose kernel
    /// sees the same file system's locks (a local file system, NFSv4, Lustre mounted with
    /// `flock`), and this session's other threads too. `None` outside a striped session.
    fn stripe_lock(&self) -> Result<Option<File>, DestinationError> {
        if !self.striped {
            return Ok(None);
        }
        let io = io_at(&self.rel);
        // Read-only, since a path-only handle (as `dir` is) cannot be locked.
        let dir = open_dir_read_only(&self.dir, Path::new(".")).map_err(&io)?;
        rustix::fs::flock(&dir, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| io(e.into()))?;
        Ok(Some(dir))
    }

    /// A striped session's seal, holding the directory's lock ([`TreeFile::stripe_lock`]):
    /// `Placed` when the file is to be placed now (this session's ranges and those the
    /// journal records cover it all, and its part file is still there), `Held` when ranges are
    /// still missing, `Changed` never; a file another node placed already is `Held` too, with
    /// nothing left here to do.
    fn striped_seal(&self, state: &mut PartState) -> Result<Sealed, DestinationError> {
        let io = io_at(&self.rel);
        let size = self.entry.size;
        if state.verified.gaps(&(0..size)).next().is_some() {
            if let Ok(journal) = self.open_journal(false) {
                if let Some(recorded) = Journal::recorded(journal, self.identity()) {
                    state.verified.extend(recorded);
                }
            }
        }
        let part_there = match self.dir.symlink_metadata(&self.names.part) {
            Ok(meta) => meta.is_file(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(io(e)),
        };
        if !part_there && size > 0 {
            // The node that completed the file placed it, or an earlier attempt left nothing.
            let placed = self
                .dir
                .symlink_metadata(&self.name)
                .is_ok_and(|m| m.is_file() && m.len() == size && self.holds_entry(&m));
            return match placed {
                true => Ok(Sealed::Held),
                false => Err(DestinationError::Refused(format!(
                    "{}: its part file went away while its ranges were being received",
                    self.rel.display()
                ))),
            };
        }
        match state.verified.gaps(&(0..size)).next() {
            Some(_) => Ok(Sealed::Held),
            None => Ok(Sealed::Placed),
        }
    }

    /// Opens the file under its final name for reading, never through a link or into a FIFO.
    fn read_final(&self) -> std::io::Result<File> {
        self.open_read(Path::new(&self.name))
    }

    /// Opens `name` in the file's directory for reading only, never through a link or into a
    /// FIFO.
    fn open_read(&self, name: &Path) -> std::io::Result<File> {
        let mut options = OpenOptions::new();
        options
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        self.open_with(name, &options)
    }

    /// Opens an earlier attempt's part file or journal: to resume it, or, in a `preview`,
    /// only to read it.
    fn open_leftover(&self, name: &Path, preview: bool) -> std::io::Result<File> {
        if preview {
            self.open_read(name)
        } else {
            self.open(name, false)
        }
    }

    /// [`TreeFile::open`] with the given options.
    fn open_with(&self, name: &Path, options: &OpenOptions) -> std::io::Result<File> {
        if let Ok(meta) = self.dir.symlink_metadata(name) {
            if !meta.is_file() {
                return Err(not_regular(name));
            }
        }
        let file = self.dir.open_with(name, options)?.into_std();
        // The name may have been swapped between the check and the open.
        if !file.metadata()?.is_file() {
            return Err(not_regular(name));
        }
        Ok(file)
    }

    /// The open part file. The first chunk creates it (preallocated, so a full disk shows at
    /// once) with a journal beside it unless that chunk is the `whole` of a small file; later
    /// ones reopen it if it was closed. In a striped session the first chunk joins the part
    /// file and journal another session made, if there are any, and its caller holds the
    /// directory's lock ([`TreeFile::stripe_lock`]) while it is not started.
    fn open_part(
        &self,
        state: &mut PartState,
        whole: bool,
    ) -> Result<Arc<PartFile>, DestinationError> {
        if let Some(part) = &state.part {
            return Ok(part.clone());
        }
        let io = io_at(&self.rel);
        let part = self.open(&self.names.part, !state.started).map_err(&io)?;
        let joined = match (state.started, self.striped) {
            // Another receiving node of the transfer made the part file and its journal.
            (false, true) => self
                .open_journal(false)
                .ok()
                .and_then(|journal| Journal::join(journal, self.identity())),
            _ => None,
        };
        if let Some(journal) = joined {
            state.journal = Some(journal);
            state.journaled = true;
            state.started = true;
        }
        if !state.started {
            part.set_len(0).map_err(&io)?;
            preallocate(&part, self.entry.size).map_err(&io)?;
            let unjournaled = whole && self.entry.size < UNJOURNALED_BELOW && !self.striped;
            if !unjournaled && self.entry.size > 0 {
                let journal = self.open_journal(true).map_err(&io)?;
                state.journal = Some(Journal::create(journal, self.identity()).map_err(&io)?);
                state.journaled = true;
            }
            state.started = true;
        }
        let direct = if self.direct {
            let options = part_options(false, true);
            let direct = self
                .open_with(&self.names.part, &options)
                .and_then(|direct| direct_io::check_alignment(&direct).map(|()| direct))
                .map_err(|e| io(direct_io::open_error(e)))?;
            // The name may have been given to another file between the two opens.
            let inode = |f: &File| f.metadata().map(|m| (m.dev(), m.ino()));
            if inode(&direct).map_err(&io)? != inode(&part).map_err(&io)? {
                return Err(DestinationError::Refused(format!(
                    "{}: another process replaced the part file while it was being opened",
                    self.rel.display()
                )));
            }
            Some(direct)
        } else {
            None
        };
        let part = Arc::new(PartFile { file: part, direct });
        state.part = Some(part.clone());
        Ok(part)
    }

    /// The file's journal, reopened for appending if it was closed.
    fn journal<'a>(&self, state: &'a mut PartState) -> Result<&'a mut Journal, DestinationError> {
        let journal = match state.journal.take() {
            Some(journal) => journal,
            None => {
                let file = self.open_journal(false).map_err(io_at(&self.rel))?;
                Journal::append_to(file).map_err(io_at(&self.rel))?
            }
        };
        Ok(state.journal.insert(journal))
    }

    fn identity(&self) -> SourceIdentity {
        SourceIdentity::of(&self.entry)
    }

    /// What survives of an earlier attempt, and the state to continue from. A `preview`
    /// (dry run) finds the same and changes nothing: stale leftovers stay.
    fn resume_state(&self, preview: bool) -> Result<(FileStatus, PartState), DestinationError> {
        if let Ok(meta) = self.dir.symlink_metadata(&self.name) {
            if meta.is_dir() {
                return Err(DestinationError::Refused(format!(
                    "{}: a directory is in the way",
                    self.rel.display()
                )));
            }
            if !meta.is_file() && !meta.is_symlink() {
                return Err(DestinationError::Refused(format!(
                    "{}: a special file (device, FIFO or socket) is in the way; it is not replaced",
                    self.rel.display()
                )));
            }
            if meta.is_file() && meta.len() == self.entry.size && self.holds_entry(&meta) {
                if !preview {
                    // A journal may outlive its rename when the receiver died in between.
                    self.remove_leftovers()?;
                }
                return Ok((FileStatus::Complete, PartState::default()));
            }
        }
        // Both are closed again here: they reopen when the file's next chunk arrives.
        let resumed = self
            .open_leftover(&self.names.part, preview)
            .ok()
            .and_then(|part| {
                let journal = self.open_leftover(&self.names.journal, preview).ok()?;
                let verified = if preview {
                    Journal::verified(journal, &part, self.identity())?
                } else {
                    Journal::resume(journal, &part, self.identity())?.1
                };
                Some(PartState {
                    started: true,
                    journaled: true,
                    verified,
                    ..PartState::default()
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
                if !preview {
                    self.remove_leftovers()?;
                }
                Ok((FileStatus::Missing, PartState::default()))
            }
        }
    }

    /// Whether the file already under the final name, of the entry's size, is taken for the
    /// entry's: when it is compared by content, whatever its mtime (its seal compares the
    /// content), else by the same mtime.
    fn holds_entry(&self, meta: &cap_std::fs::Metadata) -> bool {
        let mtime = Timestamp {
            secs: meta.mtime(),
            nanos: meta.mtime_nsec() as u32,
        };
        self.compared || mtime == self.entry.mtime
    }

    /// Whether the copy under the final name hashes as the sender's source did (`expected`,
    /// which a seal of a file in place must carry): the copy, open, and its metadata if it
    /// does, `None` if it does not.
    fn holds_content(
        &self,
        expected: Option<[u8; 32]>,
    ) -> Result<Option<(File, std::fs::Metadata)>, DestinationError> {
        let Some(expected) = expected else {
            return Err(DestinationError::Protocol(format!(
                "{}: a file already in place sealed without the hash that verifies it",
                self.rel.display()
            )));
        };
        let io = io_at(&self.rel);
        let held = self.read_final().map_err(&io)?;
        let meta = held.metadata().map_err(&io)?;
        let same = meta.len() == self.entry.size
            && direct_io::blake3_of(&held, false).map_err(&io)? == blake3::Hash::from(expected);
        Ok(same.then_some((held, meta)))
    }

    fn remove_leftovers(&self) -> Result<(), DestinationError> {
        for stale in [&self.names.part, &self.names.journal] {
            match self.dir.remove_file(stale) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_at(&self.rel)(e)),
            }
        }
        Ok(())
    }
}

/// Reserves the file's blocks so that a full disk fails at the first chunk, not halfway. A
/// file system that cannot reserve them (`EOPNOTSUPP`) gets the file's length alone: writing
/// every block, as glibc's `posix_fallocate` would, costs a whole pass over the disk first.
fn preallocate(file: &File, size: u64) -> std::io::Result<()> {
    if size == 0 {
        return Ok(());
    }
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, size) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::INVAL) => file.set_len(size),
        Err(e) => Err(e.into()),
    }
}

/// Makes sure directories exist under the root without passing through symbolic links or
/// non-directories, creating what is missing, and hands out one open handle per directory.
/// A manifest of many files in few directories costs one check per directory, not per file.
#[derive(Default)]
struct DirChecker {
    handles: HashMap<PathBuf, Arc<Dir>>,
    /// The directories this checker created: nothing was in them before this session.
    made: HashSet<PathBuf>,
}

impl DirChecker {
    /// The directory `rel`, made with what is missing above it.
    fn ensure(&mut self, root: &Dir, rel: &Path) -> Result<Arc<Dir>, DestinationError> {
        let made = self.walk(root, rel, true)?;
        Ok(made.expect("a directory made where it was missing"))
    }

    /// The directory `rel` if it exists, making nothing (a dry run); refused as
    /// [`DirChecker::ensure`] would refuse it.
    fn look(&mut self, root: &Dir, rel: &Path) -> Result<Option<Arc<Dir>>, DestinationError> {
        self.walk(root, rel, false)
    }

    /// Walks down to `rel` refusing links and non-directories, making what is missing when
    /// `create`, else stopping there (`None`).
    fn walk(
        &mut self,
        root: &Dir,
        rel: &Path,
        create: bool,
    ) -> Result<Option<Arc<Dir>>, DestinationError> {
        if let Some(handle) = self.handles.get(rel) {
            return Ok(Some(handle.clone()));
        }
        let mut path = PathBuf::new();
        for comp in rel.components() {
            path.push(comp);
            if self.handles.contains_key(&path) {
                continue;
            }
            let io = io_at(&path);
            match root.symlink_metadata(&path) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(DestinationError::Refused(format!(
                        "path {} is a symbolic link on the receiver; refusing to write through it",
                        path.display()
                    )))
                }
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(DestinationError::Refused(format!(
                        "{} exists and is not a directory",
                        path.display()
                    )))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => {
                    return Ok(None);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    match root.create_dir(&path) {
                        Ok(()) => {
                            self.made.insert(path.clone());
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(io(e)),
                    }
                }
                Err(e) => return Err(io(e)),
            }
        }
        let handle = if rel.as_os_str().is_empty() {
            root.try_clone()
        } else {
            root.open_dir(rel)
        };
        let handle = Arc::new(handle.map_err(io_at(rel))?);
        self.handles.insert(rel.to_path_buf(), handle.clone());
        Ok(Some(handle))
    }

    /// Whether `rel` is a directory this checker has made sure of.
    fn has(&self, rel: &Path) -> bool {
        self.handles.contains_key(rel)
    }

    /// Whether this checker created `rel`, so that only what this session writes is in it.
    fn made(&self, rel: &Path) -> bool {
        self.made.contains(rel)
    }
}

#[cfg(test)]
mod tests {
    use super::super::announced::Budget;
    use super::*;

    /// A whole manifest of one file of `size` bytes at `path`, last modified at `mtime`.
    fn one_file(path: &[u8], size: u64, mtime: Timestamp) -> ManifestBatch {
        let entry = FileEntry {
            path: path.to_vec(),
            size,
            mode: 0o644,
            mtime,
            ctime: mtime,
            inode: 1,
        };
        ManifestBatch {
            dirs: Vec::new(),
            files: vec![entry],
            last: true,
        }
    }

    /// Where a session's files land at `root`, room for one file unsealed.
    fn placement<'a>(
        root: &'a Path,
        active: &'a Arc<ActivePaths>,
        present: PresentFiles,
    ) -> Placement<'a> {
        static ONE: std::sync::LazyLock<Arc<Budget>> =
            std::sync::LazyLock::new(|| Budget::new(1 << 20));
        Placement {
            root,
            dest: b"",
            owner: [0; 16],
            active,
            max_unsealed: 1,
            budget: &ONE,
            direct_io: false,
            present,
            delete: None,
            striped: false,
        }
    }

    /// A session's tree at `root`, room for one file unsealed.
    fn tree_at(root: &Path, active: &Arc<ActivePaths>, present: PresentFiles) -> FileTree {
        FileTree::open(placement(root, active, present), false).unwrap()
    }

    /// Two striped sessions on one root (as two receiving nodes on one shared file system,
    /// each with its own claims) write the two halves of a file: the first seal holds it, the
    /// second finds the other's records in the one journal and places it; a session that
    /// plans it after that finds it complete.
    #[test]
    fn striped_sessions_share_a_part_file_and_the_last_seal_places_it() {
        let root = tempfile::tempdir().unwrap();
        let mtime = Timestamp {
            secs: 1_700_000_000,
            nanos: 0,
        };
        let size = 3 << 20;
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let batch = one_file(b"run/big.bin", size as u64, mtime);
        let striped = |active| {
            let placement = Placement {
                striped: true,
                ..placement(root.path(), active, PresentFiles::Kept)
            };
            FileTree::open(placement, false).unwrap()
        };
        let (one_claims, other_claims) = (Arc::default(), Arc::default());
        let (one, other) = (striped(&one_claims), striped(&other_claims));
        let half = size / 2;
        assert_eq!(one.add_batch(&batch).unwrap().1, vec![FileStatus::Missing]);
        one.write(
            0,
            0,
            &data[..half],
            crate::wire::chunk_checksum(&data[..half]),
        )
        .unwrap();
        // The other node plans after the first chunk: it resumes what the journal holds.
        let plan = other.add_batch(&batch).unwrap().1;
        assert_eq!(plan, vec![FileStatus::Partial(vec![(0, half as u64)])]);
        let rest = &data[half..];
        other
            .write(0, half as u64, rest, crate::wire::chunk_checksum(rest))
            .unwrap();
        let placed = root.path().join("run/big.bin");
        assert_eq!(other.seal(0, None).unwrap(), Sealed::Placed);
        assert_eq!(std::fs::read(&placed).unwrap(), data);
        assert_eq!(
            one.seal(0, None).unwrap(),
            Sealed::Held,
            "placed by the other"
        );
        let left: Vec<_> = std::fs::read_dir(root.path().join("run"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            vec![OsString::from("big.bin")],
            "no part file or journal"
        );

        // Sealed before the other half arrived, the first seal holds the file and the last
        // places it.
        std::fs::remove_file(&placed).unwrap();
        let claims: [Arc<ActivePaths>; 3] = Default::default();
        let (one, other) = (striped(&claims[0]), striped(&claims[1]));
        assert_eq!(one.add_batch(&batch).unwrap().1, vec![FileStatus::Missing]);
        assert_eq!(
            other.add_batch(&batch).unwrap().1,
            vec![FileStatus::Missing]
        );
        one.write(
            0,
            0,
            &data[..half],
            crate::wire::chunk_checksum(&data[..half]),
        )
        .unwrap();
        assert_eq!(one.seal(0, None).unwrap(), Sealed::Held, "half of it");
        assert!(!placed.exists());
        other
            .write(0, half as u64, rest, crate::wire::chunk_checksum(rest))
            .unwrap();
        assert_eq!(other.seal(0, None).unwrap(), Sealed::Placed);
        assert_eq!(std::fs::read(&placed).unwrap(), data);
        let later = striped(&claims[2]);
        assert_eq!(
            later.add_batch(&batch).unwrap().1,
            vec![FileStatus::Complete]
        );
    }

    #[test]
    fn a_complete_file_loses_a_journal_left_from_before_its_rename() {
        let root = tempfile::tempdir().unwrap();
        let final_path = root.path().join("done.bin");
        std::fs::write(&final_path, b"abc").unwrap();
        let mtime = Timestamp::mtime_of(&std::fs::metadata(&final_path).unwrap());
        let journal = root
            .path()
            .join(PartPaths::for_final(Path::new("done.bin")).journal);
        std::fs::write(&journal, b"stale").unwrap();
        let batch = one_file(b"done.bin", 3, mtime);
        let active = Arc::default();
        let tree = tree_at(root.path(), &active, PresentFiles::Kept);
        let (first, plan) = tree.add_batch(&batch).unwrap();
        assert_eq!(first, 0);
        assert_eq!(plan, vec![FileStatus::Complete]);
        assert!(!journal.exists());
        assert_eq!(std::fs::read(&final_path).unwrap(), b"abc");
    }

    /// Verifying files in place, a file in place stays announced: no chunk is written to it, a
    /// seal without the sender's hash breaks the protocol, one with another hash is refused
    /// naming the file and leaves it as it is, and one with its own hash settles it.
    #[test]
    fn a_file_in_place_is_verified_by_its_seal_and_never_written() {
        let root = tempfile::tempdir().unwrap();
        let final_path = root.path().join("kept.bin");
        std::fs::write(&final_path, b"abcdef").unwrap();
        let mtime = Timestamp::mtime_of(&std::fs::metadata(&final_path).unwrap());
        let batch = one_file(b"kept.bin", 6, mtime);
        let active = Arc::default();
        let open = || tree_at(root.path(), &active, PresentFiles::Verified);
        let tree = open();
        assert_eq!(
            tree.add_batch(&batch).unwrap(),
            (0, vec![FileStatus::Complete])
        );
        tree.write(0, 0, b"XYZ", crate::wire::chunk_checksum(b"XYZ"))
            .unwrap();
        assert_eq!(
            std::fs::read(&final_path).unwrap(),
            b"abcdef",
            "never written"
        );
        match tree.seal(0, None) {
            Err(DestinationError::Protocol(e)) => assert!(e.contains("without the hash"), "{e}"),
            other => panic!("{other:?}"),
        }
        drop(tree);

        let tree = open();
        tree.add_batch(&batch).unwrap();
        match tree.seal(0, Some(*blake3::hash(b"abcdeF").as_bytes())) {
            Err(DestinationError::Refused(e)) => {
                assert!(e.starts_with("kept.bin: the file already here has"), "{e}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            std::fs::read(&final_path).unwrap(),
            b"abcdef",
            "left as it is"
        );
        drop(tree);

        let tree = open();
        tree.add_batch(&batch).unwrap();
        tree.seal(0, Some(*blake3::hash(b"abcdef").as_bytes()))
            .unwrap();
        assert!(tree.seal(0, None).is_err(), "settled: sealed once");
    }

    /// Comparing by content, a copy of the source's size is planned complete whatever its
    /// mtime and compared when sealed: one that hashes the same is kept with the source's mode
    /// and mtime; one that differs is answered `Changed`, then receives the source's bytes
    /// and is replaced by them when sealed again.
    #[test]
    fn a_file_compared_by_content_is_kept_if_the_same_and_sent_again_if_not() {
        let root = tempfile::tempdir().unwrap();
        let (same, changed) = (
            root.path().join("same.bin"),
            root.path().join("changed.bin"),
        );
        std::fs::write(&same, b"abcdef").unwrap();
        std::fs::write(&changed, b"abcdef").unwrap();
        let mtime = Timestamp {
            secs: 1_000_000,
            nanos: 5,
        };
        let mut batch = one_file(b"same.bin", 6, mtime);
        batch.files[0].mode = 0o600;
        batch.files.push(FileEntry {
            path: b"changed.bin".to_vec(),
            ..batch.files[0].clone()
        });
        let active = Arc::default();
        let tree = FileTree::open(
            Placement {
                max_unsealed: 2,
                ..placement(root.path(), &active, PresentFiles::Compared)
            },
            false,
        )
        .unwrap();
        let plan = tree.add_batch(&batch).unwrap();
        assert_eq!(plan, (0, vec![FileStatus::Complete, FileStatus::Complete]));

        let source = *blake3::hash(b"abcdef").as_bytes();
        assert_eq!(tree.seal(0, Some(source)).unwrap(), Sealed::Placed);
        let meta = std::fs::metadata(&same).unwrap();
        assert_eq!(Timestamp::mtime_of(&meta), mtime, "the source's mtime");
        assert_eq!(meta.mode() & 0o777, 0o600, "the source's mode");

        let source = *blake3::hash(b"ABCDEF").as_bytes();
        assert_eq!(tree.seal(1, Some(source)).unwrap(), Sealed::Changed);
        assert_eq!(
            std::fs::read(&changed).unwrap(),
            b"abcdef",
            "kept until replaced"
        );
        assert!(
            tree.seal(1, None).is_err(),
            "nothing of it is held any more"
        );
        tree.write(1, 0, b"ABCDEF", crate::wire::chunk_checksum(b"ABCDEF"))
            .unwrap();
        assert_eq!(tree.seal(1, Some(source)).unwrap(), Sealed::Placed);
        assert_eq!(std::fs::read(&changed).unwrap(), b"ABCDEF");
    }

    /// A dry run that compares by content answers each seal of a file it planned complete as
    /// a run would, and changes nothing; its next batch waits for those seals.
    #[test]
    fn a_dry_run_compares_by_content_and_changes_nothing() {
        let root = tempfile::tempdir().unwrap();
        let held = root.path().join("held.bin");
        std::fs::write(&held, b"abcdef").unwrap();
        let before = std::fs::metadata(&held).unwrap();
        let batch = one_file(b"held.bin", 6, Timestamp { secs: 1, nanos: 0 });
        let active = Arc::default();
        let tree = FileTree::open(
            placement(root.path(), &active, PresentFiles::Compared),
            true,
        )
        .unwrap();
        assert_eq!(
            tree.add_batch(&batch).unwrap(),
            (0, vec![FileStatus::Complete])
        );
        match tree.add_batch(&one_file(b"next.bin", 1, Timestamp { secs: 1, nanos: 0 })) {
            Err(DestinationError::Protocol(e)) => assert!(e.contains("compared"), "{e}"),
            other => panic!("{other:?}"),
        }
        let other = *blake3::hash(b"ABCDEF").as_bytes();
        assert_eq!(tree.seal(0, Some(other)).unwrap(), Sealed::Changed);
        assert!(tree.seal(0, Some(other)).is_err(), "compared once");
        let after = std::fs::metadata(&held).unwrap();
        assert_eq!(std::fs::read(&held).unwrap(), b"abcdef");
        assert_eq!(Timestamp::mtime_of(&after), Timestamp::mtime_of(&before));

        let tree = FileTree::open(
            placement(root.path(), &active, PresentFiles::Compared),
            true,
        )
        .unwrap();
        tree.add_batch(&batch).unwrap();
        let source = *blake3::hash(b"abcdef").as_bytes();
        assert_eq!(tree.seal(0, Some(source)).unwrap(), Sealed::Placed);
        assert_eq!(
            Timestamp::mtime_of(&std::fs::metadata(&held).unwrap()),
            Timestamp::mtime_of(&before),
            "a dry run sets no mtime"
        );
    }

    /// A chunk being received into a mapped window, overtaken by a verified copy of the same
    /// range (a straggler's unit sent again on another stream): the detach leaves the window's
    /// bytes half in memory, and the chunk is answered as verified by the copy, not refused as
    /// a checksum failure that would make the sender send it a third time.
    #[test]
    fn a_mapped_chunk_overtaken_by_a_verified_copy_is_verified_by_it() {
        crate::sys::mapped::enable();
        let root = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..MAPPED_MIN).map(|i| (i * 7 % 251) as u8).collect();
        let mtime = Timestamp { secs: 1, nanos: 0 };
        let active = Arc::default();
        let tree = tree_at(root.path(), &active, PresentFiles::Kept);
        let batch = one_file(b"big.bin", data.len() as u64, mtime);
        assert_eq!(
            tree.add_batch(&batch).unwrap(),
            (0, vec![FileStatus::Missing])
        );
        let mut slow = tree.map_chunk(0, 0, data.len()).unwrap().expect("mapped");
        let half = data.len() / 2;
        slow.bytes()[..half].copy_from_slice(&data[..half]);

        let checksum = crate::wire::chunk_checksum(&data);
        tree.write(0, 0, &data, checksum).unwrap();
        slow.bytes()[half..].copy_from_slice(&data[half..]);
        let check = ChunkCheck {
            checksum,
            seal: None,
        };
        assert!(slow.commit(&check).unwrap(), "verified by the copy");

        tree.seal(0, None).unwrap();
        assert_eq!(std::fs::read(root.path().join("big.bin")).unwrap(), data);
    }

    /// A dry run's tree plans what a run's would and leaves everything as it is: the stale
    /// leftovers of another version stay, no directory is made, and a seal is refused.
    #[test]
    fn a_preview_plans_as_a_run_and_changes_nothing() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("old.bin.xfer-part"), b"stale").unwrap();
        std::fs::write(root.path().join("old.bin.xfer-journal"), b"not a journal").unwrap();
        let mtime = Timestamp { secs: 1, nanos: 0 };
        let mut batch = one_file(b"old.bin", 5, mtime);
        batch.files.push(FileEntry {
            path: b"new/deep/file.bin".to_vec(),
            ..batch.files[0].clone()
        });
        let active = Arc::default();
        let tree =
            FileTree::open(placement(root.path(), &active, PresentFiles::Kept), true).unwrap();
        let plan = tree.add_batch(&batch).unwrap();
        assert_eq!(plan, (0, vec![FileStatus::Missing, FileStatus::Missing]));
        assert!(
            root.path().join("old.bin.xfer-part").exists(),
            "leftovers stay"
        );
        assert!(!root.path().join("new").exists(), "no directory made");
        assert!(matches!(
            tree.seal(0, None),
            Err(DestinationError::Protocol(_))
        ));
        // Beyond the one file a run would hold unsealed: a preview holds none.
        assert_eq!(
            tree.add_batch(&one_file(b"more.bin", 1, mtime)).unwrap().0,
            2
        );
    }
}
