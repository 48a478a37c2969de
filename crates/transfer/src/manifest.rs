//! The manifest of a transfer: which directories and files the sender will send, with their
//! relative paths, sizes, modes and mtimes; how the sender walks its sources to stream it in
//! batches; and how the receiver checks that every path stays under its root.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::filter::{Filter, FilterError, Selection};

/// Longest relative path accepted, in bytes (Linux's PATH_MAX).
pub const MAX_PATH_LEN: usize = 4096;
/// Largest file size accepted in a manifest: the most a file can hold (`off_t` is signed).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// A file or directory timestamp: seconds and nanoseconds since the Unix epoch.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use transfer::manifest::Timestamp;
///
/// let t = Timestamp { secs: 1_700_000_000, nanos: 5 };
/// assert_eq!(t.to_system_time(), UNIX_EPOCH + Duration::new(1_700_000_000, 5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timestamp {
    /// Whole seconds (negative before 1970).
    pub secs: i64,
    /// Nanoseconds within the second.
    pub nanos: u32,
}

impl Timestamp {
    /// The modification time recorded in `meta`.
    ///
    /// ```
    /// use transfer::manifest::Timestamp;
    ///
    /// let metadata = std::fs::metadata("Cargo.toml").unwrap();
    /// assert_eq!(Timestamp::mtime_of(&metadata).to_system_time(), metadata.modified().unwrap());
    /// ```
    pub fn mtime_of(meta: &std::fs::Metadata) -> Timestamp {
        Timestamp {
            secs: meta.mtime(),
            nanos: meta.mtime_nsec() as u32,
        }
    }

    /// The status change time recorded in `meta` (ctime): when the file's data or metadata last
    /// changed, which, unlike the mtime, nobody can set.
    ///
    /// ```
    /// use transfer::manifest::Timestamp;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let file = dir.path().join("a");
    /// std::fs::write(&file, "one").unwrap();
    /// let before = std::fs::metadata(&file).unwrap();
    /// std::thread::sleep(std::time::Duration::from_millis(20));
    /// std::fs::write(&file, "two").unwrap();
    /// std::fs::File::options().write(true).open(&file).unwrap().set_modified(before.modified().unwrap()).unwrap();
    /// let after = std::fs::metadata(&file).unwrap();
    /// assert_eq!(Timestamp::mtime_of(&after), Timestamp::mtime_of(&before), "the mtime set back");
    /// assert_ne!(Timestamp::ctime_of(&after), Timestamp::ctime_of(&before), "the ctime not");
    /// ```
    pub fn ctime_of(meta: &std::fs::Metadata) -> Timestamp {
        Timestamp {
            secs: meta.ctime(),
            nanos: meta.ctime_nsec() as u32,
        }
    }

    /// As a `SystemTime`, for setting it on a file.
    ///
    /// ```
    /// use transfer::manifest::Timestamp;
    ///
    /// let before_1970 = Timestamp { secs: -1, nanos: 0 };
    /// assert!(before_1970.to_system_time() < std::time::UNIX_EPOCH);
    /// ```
    pub fn to_system_time(self) -> std::time::SystemTime {
        let nanos = std::time::Duration::new(self.secs.unsigned_abs(), self.nanos.min(999_999_999));
        if self.secs >= 0 {
            std::time::UNIX_EPOCH + nanos
        } else {
            std::time::UNIX_EPOCH - std::time::Duration::from_secs(self.secs.unsigned_abs())
                + std::time::Duration::from_nanos(self.nanos as u64)
        }
    }
}

/// A directory to create (relative path, permission bits, mtime set after its contents arrive).
///
/// ```
/// # let src = tempfile::tempdir().unwrap();
/// # let tree = src.path().join("run42");
/// # std::fs::create_dir_all(tree.join("raw")).unwrap();
/// # std::fs::write(tree.join("raw/a.bin"), [1; 100]).unwrap();
/// # std::fs::write(tree.join("notes.txt"), "calibrated").unwrap();
/// use transfer::manifest::Scanner;
///
/// let batch = Scanner::new(&[tree]).unwrap().next_batch(100).unwrap().batch;
/// let dirs: Vec<_> = batch.dirs.iter().map(|d| String::from_utf8_lossy(&d.path).into_owned()).collect();
/// assert_eq!(dirs, ["run42", "run42/raw"]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// Path relative to the destination, `/`-separated raw bytes.
    pub path: Vec<u8>,
    /// Permission bits (`0o777` part of the mode).
    pub mode: u32,
    /// Modification time.
    pub mtime: Timestamp,
}

/// A regular file to send.
///
/// ```
/// # let src = tempfile::tempdir().unwrap();
/// # let tree = src.path().join("run42");
/// # std::fs::create_dir_all(tree.join("raw")).unwrap();
/// # std::fs::write(tree.join("raw/a.bin"), [1; 100]).unwrap();
/// # std::fs::write(tree.join("notes.txt"), "calibrated").unwrap();
/// use transfer::manifest::Scanner;
///
/// let batch = Scanner::new(&[tree]).unwrap().next_batch(100).unwrap().batch;
/// let files: Vec<_> = batch.files.iter().map(|f| (String::from_utf8_lossy(&f.path).into_owned(), f.size)).collect();
/// assert_eq!(files, [("run42/notes.txt".to_string(), 10), ("run42/raw/a.bin".to_string(), 100)]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Path relative to the destination, `/`-separated raw bytes.
    pub path: Vec<u8>,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`0o777` part of the mode).
    pub mode: u32,
    /// Modification time: with the size, what a later run compares to find the file already
    /// at the receiver.
    pub mtime: Timestamp,
    /// Status change time on the sender ([`Timestamp::ctime_of`]): with the inode number it
    /// tells this version of the source from one rewritten in place with its mtime set back,
    /// or from another file of the same name, size and mtime (`cp -p`, `rsync -t`, `tar x`),
    /// so that nothing of one version is ever resumed onto another.
    pub ctime: Timestamp,
    /// Inode number on the sender.
    pub inode: u64,
}

/// Where the receiver puts what arrives.
///
/// ```
/// use transfer::manifest::SinkKind;
/// use transfer::wire::Message;
///
/// // A memory-to-memory benchmark's session starts so.
/// let start = Message::Start {
///     dest: Vec::new(),
///     sink: SinkKind::Discard,
///     present: Default::default(),
///     delete: None,
///     striped: false,
/// };
/// # let _ = start;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum SinkKind {
    /// Files under the receiver's root.
    Files,
    /// Generated data that the receiver verifies and discards (memory-to-memory benchmark).
    Discard,
    /// A dry run over files under the receiver's root: each batch is planned as `Files` would
    /// plan it, and nothing is made, written, removed or claimed.
    Preview,
}

/// One part of the manifest, which the sender streams in batches while data already flows.
/// Files are numbered across batches in the order they are announced: a chunk names its file
/// by that number.
///
/// ```
/// # let src = tempfile::tempdir().unwrap();
/// # let tree = src.path().join("run42");
/// # std::fs::create_dir_all(tree.join("raw")).unwrap();
/// # std::fs::write(tree.join("raw/a.bin"), [1; 100]).unwrap();
/// # std::fs::write(tree.join("notes.txt"), "calibrated").unwrap();
/// use transfer::manifest::Scanner;
///
/// let mut scanner = Scanner::new(&[tree]).unwrap();
/// let mut batches = Vec::new();
/// loop {
///     let batch = scanner.next_batch(2).unwrap().batch; // at most two entries a batch
///     let last = batch.last;
///     batches.push(batch);
///     if last {
///         break;
///     }
/// }
/// assert!(batches.len() >= 2);
/// assert_eq!(batches.iter().map(|b| b.dirs.len() + b.files.len()).sum::<usize>(), 4);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestBatch {
    /// Directories, parents before children (a parent may be in an earlier batch).
    pub dirs: Vec<DirEntry>,
    /// Files, numbered on from the previous batch's last.
    pub files: Vec<FileEntry>,
    /// No batch follows.
    pub last: bool,
}

impl ManifestBatch {
    /// The whole manifest of `size` bytes of generated data for a discarding sink (memory to
    /// memory).
    ///
    /// ```
    /// use transfer::manifest::ManifestBatch;
    ///
    /// let batch = ManifestBatch::memory(10 << 30);
    /// assert_eq!((batch.files.len(), batch.total_bytes(), batch.last), (1, 10 << 30, true));
    /// ```
    pub fn memory(size: u64) -> ManifestBatch {
        ManifestBatch {
            dirs: Vec::new(),
            files: vec![FileEntry {
                path: b"memory".to_vec(),
                size,
                mode: 0,
                mtime: Timestamp { secs: 0, nanos: 0 },
                ctime: Timestamp { secs: 0, nanos: 0 },
                inode: 0,
            }],
            last: true,
        }
    }

    /// Total bytes of its files (saturating: a peer's batch may claim any sizes).
    ///
    /// ```
    /// use transfer::manifest::ManifestBatch;
    ///
    /// let mut hostile = ManifestBatch::memory(u64::MAX);
    /// hostile.files.push(hostile.files[0].clone());
    /// assert_eq!(hostile.total_bytes(), u64::MAX);
    /// ```
    pub fn total_bytes(&self) -> u64 {
        self.files
            .iter()
            .fold(0, |sum, f| sum.saturating_add(f.size))
    }
}

/// Errors of scanning the sender's sources.
///
/// ```
/// use transfer::manifest::{ScanError, Scanner};
///
/// let dir = tempfile::tempdir().unwrap();
/// for name in ["a", "b"] {
///     std::fs::create_dir_all(dir.path().join(name).join("data")).unwrap();
/// }
/// let twice = [dir.path().join("a/data"), dir.path().join("b/data")];
/// assert!(matches!(Scanner::new(&twice), Err(ScanError::DuplicateName(name)) if name == "data"));
/// assert!(matches!(Scanner::new(&["/nonexistent".into()]), Err(ScanError::Unreadable { .. })));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScanError {
    /// A source could not be read.
    #[error("cannot read source {path}: {error}")]
    Unreadable {
        /// The source.
        path: String,
        /// The cause.
        error: std::io::Error,
    },
    /// Two sources would land at the same destination name.
    #[error("two sources are both named {0:?} at the destination")]
    DuplicateName(String),
    /// A source has no usable name (such as `/`).
    #[error("source {0} has no file name to use at the destination")]
    NoName(String),
    /// A pattern or listed path of the filter cannot be used.
    #[error(transparent)]
    Filter(#[from] FilterError),
}

/// A batch of the manifest plus where each of its files is on the sender's disk.
///
/// ```
/// # let src = tempfile::tempdir().unwrap();
/// # let tree = src.path().join("run42");
/// # std::fs::create_dir_all(tree.join("raw")).unwrap();
/// # std::fs::write(tree.join("raw/a.bin"), [1; 100]).unwrap();
/// # std::fs::write(tree.join("notes.txt"), "calibrated").unwrap();
/// std::os::unix::fs::symlink("notes.txt", tree.join("link")).unwrap();
/// use transfer::manifest::Scanner;
///
/// let scanned = Scanner::new(&[tree.clone()]).unwrap().next_batch(100).unwrap();
/// assert_eq!(scanned.local_paths[0], tree.join("notes.txt"));
/// assert!(scanned.skipped[0].contains("link"));
/// ```
#[derive(Debug, Default)]
pub struct ScannedBatch {
    /// What will be announced to the receiver.
    pub batch: ManifestBatch,
    /// Local path of each `batch.files` entry, same order.
    pub local_paths: Vec<PathBuf>,
    /// Entries that were left out (symbolic links, devices, sockets), with why.
    pub skipped: Vec<String>,
}

/// The sender's walk over its sources, handing out the manifest a batch at a time, so that a
/// tree of millions of entries is never held whole. Each source lands under its own name;
/// directories are walked recursively in name order (holding one listing per level); only
/// regular files are sent, and links and special files are skipped and reported.
///
/// ```
/// # let src = tempfile::tempdir().unwrap();
/// # let tree = src.path().join("run42");
/// # std::fs::create_dir_all(tree.join("raw")).unwrap();
/// # std::fs::write(tree.join("raw/a.bin"), [1; 100]).unwrap();
/// # std::fs::write(tree.join("notes.txt"), "calibrated").unwrap();
/// use transfer::manifest::Scanner;
///
/// let mut scanner = Scanner::new(&[tree]).unwrap();
/// let mut files = 0;
/// loop {
///     let scanned = scanner.next_batch(1024).unwrap();
///     files += scanned.batch.files.len();
///     if scanned.batch.last {
///         break;
///     }
/// }
/// assert_eq!(files, 2);
/// ```
pub struct Scanner {
    /// Top-level sources not started yet: path, name at the destination, metadata.
    sources: std::vec::IntoIter<(PathBuf, OsString, std::fs::Metadata)>,
    /// The directory source being walked, with its name at the destination.
    walk: Option<(PathBuf, OsString, walkdir::IntoIter)>,
    /// Which files are sent and which directories read.
    selection: Selection,
    /// While a filter may leave files out: the directories above the walk's place not sent
    /// yet (with their depths), sent only once a file under them is.
    pending_dirs: Vec<(usize, DirEntry)>,
}

impl Scanner {
    /// Checks the top-level sources (each exists, has a name, and no two share one; files can be
    /// opened), so that a wrong command line fails before anything is sent.
    ///
    /// ```
    /// use transfer::manifest::{ScanError, Scanner};
    ///
    /// assert!(matches!(Scanner::new(&["/".into()]), Err(ScanError::NoName(_))));
    /// ```
    pub fn new(sources: &[PathBuf]) -> Result<Scanner, ScanError> {
        let mut checked = Vec::with_capacity(sources.len());
        let mut top_names = std::collections::HashSet::new();
        for source in sources {
            let unreadable = |e: std::io::Error| ScanError::Unreadable {
                path: source.display().to_string(),
                error: e,
            };
            let meta = std::fs::metadata(source).map_err(unreadable)?;
            let name = match source.file_name() {
                Some(n) => n.to_owned(),
                None => std::fs::canonicalize(source)
                    .map_err(unreadable)?
                    .file_name()
                    .ok_or_else(|| ScanError::NoName(source.display().to_string()))?
                    .to_owned(),
            };
            if !top_names.insert(name.clone()) {
                return Err(ScanError::DuplicateName(
                    name.to_string_lossy().into_owned(),
                ));
            }
            if meta.is_file() {
                std::fs::File::open(source).map_err(unreadable)?;
            }
            checked.push((source.clone(), name, meta));
        }
        Ok(Scanner {
            sources: checked.into_iter(),
            walk: None,
            selection: Selection::default(),
            pending_dirs: Vec::new(),
        })
    }

    /// Sends only what `filter` selects ([`crate::filter`]); a pattern that is no glob, or a
    /// listed path that leaves its source, is refused by name.
    ///
    /// ```
    /// # let src = tempfile::tempdir().unwrap();
    /// # let tree = src.path().join("run42");
    /// # std::fs::create_dir_all(tree.join("scratch")).unwrap();
    /// # std::fs::write(tree.join("scratch/tmp.bin"), [0; 10]).unwrap();
    /// # std::fs::write(tree.join("a.h5"), [1; 100]).unwrap();
    /// # std::fs::write(tree.join("notes.txt"), "calibrated").unwrap();
    /// use transfer::filter::Filter;
    /// use transfer::manifest::Scanner;
    ///
    /// let filter = Filter::default().exclude("scratch/").exclude("*.txt");
    /// let batch = Scanner::new(&[tree]).unwrap().with_filter(&filter).unwrap().next_batch(64).unwrap().batch;
    /// let files: Vec<_> = batch.files.iter().map(|f| String::from_utf8_lossy(&f.path).into_owned()).collect();
    /// assert_eq!(files, ["run42/a.h5"]);
    /// assert_eq!(batch.dirs.len(), 1, "run42 alone: scratch is not sent");
    /// ```
    pub fn with_filter(mut self, filter: &Filter) -> Result<Scanner, ScanError> {
        self.selection = filter.compile()?;
        Ok(self)
    }

    /// The next batch of at most `max_entries` directories and files; the one that exhausts the
    /// sources says `last`.
    ///
    /// ```
    /// # let src = tempfile::tempdir().unwrap();
    /// # let tree = src.path().join("run42");
    /// # std::fs::create_dir_all(tree.join("raw")).unwrap();
    /// # std::fs::write(tree.join("raw/a.bin"), [1; 100]).unwrap();
    /// # std::fs::write(tree.join("notes.txt"), "calibrated").unwrap();
    /// use transfer::manifest::Scanner;
    ///
    /// let batch = Scanner::new(&[tree.join("notes.txt")]).unwrap().next_batch(1024).unwrap().batch;
    /// assert!(batch.last && batch.dirs.is_empty());
    /// assert_eq!(batch.files[0].path, b"notes.txt");
    /// ```
    pub fn next_batch(&mut self, max_entries: usize) -> Result<ScannedBatch, ScanError> {
        let mut out = ScannedBatch::default();
        while out.batch.dirs.len() + out.batch.files.len() < max_entries.max(1) {
            if let Some((source, name, walk)) = &mut self.walk {
                let Some(entry) = walk.next() else {
                    self.walk = None;
                    continue;
                };
                let entry = entry.map_err(|e| ScanError::Unreadable {
                    path: e.path().unwrap_or(source).display().to_string(),
                    error: e
                        .into_io_error()
                        .unwrap_or_else(|| std::io::Error::other("filesystem loop")),
                })?;
                let rel = (entry.path().strip_prefix(&*source))
                    .expect("walkdir stays under its root")
                    .to_path_buf();
                if entry.depth() > 0 && entry.file_type().is_dir() && !self.selection.walks(&rel) {
                    walk.skip_current_dir();
                    continue;
                }
                let found = Found {
                    entry,
                    rel: &rel,
                    selection: &self.selection,
                    pending_dirs: &mut self.pending_dirs,
                };
                out.add_walked(name, found)?;
                continue;
            }
            let Some((source, name, meta)) = self.sources.next() else {
                out.batch.last = true;
                break;
            };
            if meta.is_file() {
                if self.selection.sends(Path::new(&name)) {
                    out.push_file(name.as_bytes().to_vec(), source, &meta);
                }
            } else if meta.is_dir() {
                let walk = walkdir::WalkDir::new(&source)
                    .follow_links(false)
                    .sort_by_file_name()
                    .into_iter();
                self.walk = Some((source, name, walk));
            } else {
                out.skipped.push(format!(
                    "{}: not a regular file or directory",
                    source.display()
                ));
            }
        }
        Ok(out)
    }
}

/// What the walk of a directory source found, with what decides whether it is sent.
struct Found<'a> {
    entry: walkdir::DirEntry,
    /// Its path below the source.
    rel: &'a Path,
    selection: &'a Selection,
    /// The directories above it not sent yet ([`Scanner::pending_dirs`]).
    pending_dirs: &'a mut Vec<(usize, DirEntry)>,
}

impl ScannedBatch {
    /// Adds what the walk of a directory source (named `name` at the destination) found, if
    /// the selection sends it; a file sent brings the directories above it not sent yet.
    fn add_walked(&mut self, name: &OsStr, found: Found<'_>) -> Result<(), ScanError> {
        let Found {
            entry,
            rel,
            selection,
            pending_dirs,
        } = found;
        let mut path = name.as_bytes().to_vec();
        for comp in rel.components() {
            path.push(b'/');
            path.extend_from_slice(comp.as_os_str().as_bytes());
        }
        let kind = entry.file_type();
        let meta = if kind.is_symlink() {
            None
        } else {
            Some(entry.metadata().map_err(|e| {
                ScanError::Unreadable {
                    path: entry.path().display().to_string(),
                    error: e
                        .into_io_error()
                        .unwrap_or_else(|| std::io::Error::other("metadata")),
                }
            })?)
        };
        let depth = entry.depth();
        match meta {
            Some(m) if kind.is_dir() => {
                let dir = DirEntry {
                    path,
                    mode: m.mode() & 0o777,
                    mtime: Timestamp::mtime_of(&m),
                };
                if selection.filters() {
                    pending_dirs.retain(|&(above, _)| above < depth);
                    pending_dirs.push((depth, dir));
                } else {
                    self.batch.dirs.push(dir);
                }
            }
            Some(m) if kind.is_file() => {
                if !selection.sends(rel) {
                    return Ok(());
                }
                pending_dirs.retain(|&(above, _)| above < depth);
                self.batch
                    .dirs
                    .extend(pending_dirs.drain(..).map(|(_, dir)| dir));
                self.push_file(path, entry.into_path(), &m);
            }
            _ if selection.sends(rel) => self.skipped.push(format!(
                "{}: symbolic link or special file, skipped",
                entry.path().display()
            )),
            _ => {}
        }
        Ok(())
    }

    /// Adds a file found at `local` with `meta`.
    fn push_file(&mut self, path: Vec<u8>, local: PathBuf, meta: &std::fs::Metadata) {
        self.batch.files.push(FileEntry {
            path,
            size: meta.len(),
            mode: meta.mode() & 0o777,
            mtime: Timestamp::mtime_of(meta),
            ctime: Timestamp::ctime_of(meta),
            inode: meta.ino(),
        });
        self.local_paths.push(local);
    }
}

/// Why a relative path from a peer was refused.
///
/// ```
/// use transfer::manifest::{split_relative, PathError};
///
/// assert!(matches!(split_relative(b"/etc/passwd", false), Err(PathError::Absolute(_))));
/// assert!(matches!(split_relative(b"run42/../../etc", false), Err(PathError::ParentComponent(_))));
/// assert!(matches!(split_relative(b"a//b", false), Err(PathError::Malformed(_))));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// Absolute paths would leave the root.
    #[error("absolute path {0:?} refused: paths must stay under the receiver's root")]
    Absolute(String),
    /// `..` would leave the root.
    #[error("path {0:?} refused: '..' would leave the receiver's root")]
    ParentComponent(String),
    /// Empty paths, empty or `.` components, NUL bytes, or over-long paths.
    #[error("malformed path {0:?} refused")]
    Malformed(String),
}

/// Checks a peer-supplied relative path and splits it into its components. The empty path is
/// accepted only when `allow_empty` (it means the root itself).
///
/// ```
/// use transfer::manifest::split_relative;
///
/// assert_eq!(split_relative(b"run42/raw/a.bin", false).unwrap(), ["run42", "raw", "a.bin"]);
/// assert!(split_relative(b"", true).unwrap().is_empty());
/// assert!(split_relative(b"", false).is_err());
/// ```
pub fn split_relative(path: &[u8], allow_empty: bool) -> Result<Vec<&OsStr>, PathError> {
    let shown = || String::from_utf8_lossy(path).into_owned();
    if path.is_empty() {
        return if allow_empty {
            Ok(Vec::new())
        } else {
            Err(PathError::Malformed(shown()))
        };
    }
    if path[0] == b'/' {
        return Err(PathError::Absolute(shown()));
    }
    if path.len() > MAX_PATH_LEN || path.contains(&0) {
        return Err(PathError::Malformed(shown()));
    }
    path.split(|&b| b == b'/')
        .map(|comp| match comp {
            b".." => Err(PathError::ParentComponent(shown())),
            b"" | b"." => Err(PathError::Malformed(shown())),
            c => Ok(OsStr::from_bytes(c)),
        })
        .collect()
}

/// Joins checked components under `base`.
///
/// ```
/// use std::path::Path;
/// use transfer::manifest::{join_components, split_relative};
///
/// let parts = split_relative(b"run42/a.bin", false).unwrap();
/// assert_eq!(join_components(Path::new("/data/incoming"), &parts), Path::new("/data/incoming/run42/a.bin"));
/// ```
pub fn join_components(base: &Path, components: &[&OsStr]) -> PathBuf {
    let mut out = base.to_path_buf();
    out.extend(components);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The batches of a scan, in order, together: every entry once, parents before children,
    /// at most the batch size each, and only the last says so.
    #[test]
    fn a_scan_hands_out_the_tree_in_bounded_batches() {
        let top = tempfile::tempdir().unwrap();
        let tree = top.path().join("tree");
        for d in 0..3 {
            let dir = tree.join(format!("d{d}"));
            std::fs::create_dir_all(&dir).unwrap();
            for f in 0..700 {
                std::fs::write(dir.join(format!("f{f:03}")), [d as u8; 3]).unwrap();
            }
        }
        std::os::unix::fs::symlink("/", tree.join("d1/link")).unwrap();
        let single = top.path().join("single");
        std::fs::write(&single, b"12345").unwrap();
        let mut scanner = Scanner::new(&[tree.clone(), single]).unwrap();
        let (mut dirs, mut files, mut skipped, mut lasts) = (vec![], vec![], vec![], vec![]);
        loop {
            let scanned = scanner.next_batch(1000).unwrap();
            let batch = &scanned.batch;
            assert!(batch.dirs.len() + batch.files.len() <= 1000);
            assert_eq!(batch.files.len(), scanned.local_paths.len());
            dirs.extend(batch.dirs.iter().map(|d| d.path.clone()));
            files.extend(
                batch
                    .files
                    .iter()
                    .zip(&scanned.local_paths)
                    .map(|(f, local)| {
                        assert_eq!(f.size, std::fs::metadata(local).unwrap().len());
                        f.path.clone()
                    }),
            );
            skipped.extend(scanned.skipped);
            lasts.push(batch.last);
            if batch.last {
                break;
            }
        }
        assert_eq!(lasts, [false, false, true]);
        assert_eq!(dirs, [&b"tree"[..], b"tree/d0", b"tree/d1", b"tree/d2"]);
        assert_eq!(files.len(), 2101);
        assert_eq!(files[0], b"tree/d0/f000");
        assert_eq!(files[2100], b"single");
        let unique: std::collections::HashSet<_> = files.iter().collect();
        assert_eq!(unique.len(), files.len());
        assert_eq!(skipped.len(), 1);
        assert!(skipped[0].ends_with("d1/link: symbolic link or special file, skipped"));
    }

    #[test]
    fn sources_are_checked_before_anything_is_scanned() {
        let top = tempfile::tempdir().unwrap();
        let (a, b) = (top.path().join("a"), top.path().join("x/a"));
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(&a, b"").unwrap();
        let twice = Scanner::new(&[a, b]).err().unwrap();
        assert!(matches!(twice, ScanError::DuplicateName(_)), "{twice}");
        let missing = Scanner::new(&[top.path().join("nope")]).err().unwrap();
        assert!(matches!(missing, ScanError::Unreadable { .. }), "{missing}");
    }

    #[test]
    fn escaping_paths_are_refused() {
        assert!(matches!(
            split_relative(b"/etc/passwd", false),
            Err(PathError::Absolute(_))
        ));
        assert!(matches!(
            split_relative(b"a/../../x", false),
            Err(PathError::ParentComponent(_))
        ));
        assert!(matches!(
            split_relative(b"a//b", false),
            Err(PathError::Malformed(_))
        ));
        assert!(matches!(
            split_relative(b"a/./b", false),
            Err(PathError::Malformed(_))
        ));
        assert!(matches!(
            split_relative(b"a\0b", false),
            Err(PathError::Malformed(_))
        ));
        assert!(split_relative(b"", false).is_err());
        assert_eq!(split_relative(b"", true).unwrap().len(), 0);
        assert_eq!(
            split_relative("d/é/ü.txt".as_bytes(), false).unwrap().len(),
            3
        );
    }

    proptest! {
        #[test]
        fn accepted_paths_stay_under_the_base(path in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(comps) = split_relative(&path, true) {
                let joined = join_components(Path::new("/base"), &comps);
                prop_assert!(joined.starts_with("/base"));
                prop_assert!(joined.components().all(|c| matches!(c, std::path::Component::RootDir | std::path::Component::Normal(_))));
            }
        }
    }
}
