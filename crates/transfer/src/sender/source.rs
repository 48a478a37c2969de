//! Reading a unit's bytes on the sender: from a file, or from a generated pattern.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{SendError, Unit};
use crate::direct_io::{self, AlignedBuffer};
use crate::journal::SourceIdentity;
use crate::manifest::FileEntry;
use crate::sys::mapped::{self, ReadWindow, MAPPED_MIN};
use crate::wire::chunk_checksum;

/// A file announced to the receiver and not yet settled: what the manifest said of it, where
/// it is on this host (nowhere, for generated data) and, in a striped transfer, the ranges of
/// it this node sends.
#[derive(Debug)]
pub(crate) struct SourceFile {
    pub(crate) entry: FileEntry,
    pub(crate) local: PathBuf,
    /// This node's share of the file ([`crate::stripe::Dealer::deal`]); `None`: all of it.
    pub(crate) share: Option<Vec<std::ops::Range<u64>>>,
}

/// Where unit bytes come from.
pub(crate) enum SourceData {
    /// Local files, at their [`SourceFile::local`] paths.
    Files {
        /// Read them with direct I/O ([`crate::direct_io`]), not through the page cache.
        direct: bool,
    },
    /// A pseudo-random block reused for every unit; its digest is computed once.
    Pattern {
        /// The block, one unit long.
        block: Vec<u8>,
        /// Of the whole block.
        digest: Digest,
    },
}

/// What a unit's header and tag say of its bytes: their xxh3 and, on a sealed connection
/// ([`crate::seal`]), their BLAKE3, both computed where the bytes are read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Digest {
    pub(crate) checksum: u64,
    pub(crate) content: Option<blake3::Hash>,
}

impl Digest {
    fn of(bytes: &[u8], sealed: bool) -> Digest {
        Digest {
            checksum: chunk_checksum(bytes),
            content: sealed.then(|| blake3::hash(bytes)),
        }
    }
}

impl SourceData {
    /// A generated source whose units are all the same incompressible block.
    pub(crate) fn pattern(unit_size: u32) -> SourceData {
        let mut block = vec![0u8; unit_size as usize];
        blake3::Hasher::new_derive_key("xfer generated data")
            .finalize_xof()
            .fill(&mut block);
        let digest = Digest::of(&block, true);
        SourceData::Pattern { block, digest }
    }

    /// The bytes of `unit` and their digest (with their BLAKE3 when `sealed`). `buf` and `open`
    /// are the calling stream's own read buffer and last opened file, kept across calls;
    /// `locate` finds the unit's file when it is not the one open.
    pub(crate) fn unit_data<'a>(
        &'a self,
        unit: Unit,
        sealed: bool,
        buf: &'a mut UnitBuffer,
        open: &mut Option<(u32, File)>,
        locate: impl Fn() -> Result<Arc<SourceFile>, SendError>,
    ) -> Result<(&'a [u8], Digest), SendError> {
        let len = unit.len as usize;
        match self {
            SourceData::Pattern { block, digest } if len == block.len() => {
                Ok((&block[..], *digest))
            }
            SourceData::Pattern { block, .. } => {
                let data = block.get(..len).ok_or_else(|| {
                    SendError::Protocol("unit longer than the generated block".into())
                })?;
                Ok((data, Digest::of(data, sealed)))
            }
            SourceData::Files { direct } => {
                let opened = match open {
                    Some((file, handle)) if *file == unit.file => handle,
                    _ => {
                        let source = locate()?;
                        let handle = open_source(&source.local, *direct)
                            .map_err(|e| source.open_error(e, *direct))?;
                        &open.insert((unit.file, handle)).1
                    }
                };
                if *direct {
                    buf.window = None;
                    let data = direct_io::read_at(opened, unit.offset, len, &mut buf.aligned)
                        .map_err(|e| locate().map_or_else(|e| e, |s| s.read_error(e)))?;
                    return Ok((data, Digest::of(data, sealed)));
                }
                if len >= MAPPED_MIN && mapped::enabled() {
                    let window = ReadWindow::map(opened, unit.offset, len)
                        .map_err(|e| locate().map_or_else(|e| e, |s| s.read_error(e)))?;
                    let digest = window
                        .guard(|bytes| Digest::of(bytes, sealed))
                        .map_err(|_| match locate() {
                            Ok(source) => source.changed(),
                            Err(e) => e,
                        })?;
                    let window = buf.window.insert(window);
                    return Ok((window.for_kernel(), digest));
                }
                buf.window = None;
                buf.bytes.resize(len, 0);
                if let Err(e) = opened.read_exact_at(&mut buf.bytes, unit.offset) {
                    return Err(locate()?.read_error(e));
                }
                Ok((&buf.bytes[..], Digest::of(&buf.bytes, sealed)))
            }
        }
    }

    /// Checks that a source file is still the version in the manifest (its
    /// [`SourceIdentity`]) and, when asked, hashes it.
    pub(crate) fn check_unchanged(
        &self,
        source: &SourceFile,
        hash: bool,
    ) -> Result<Option<[u8; 32]>, SendError> {
        let SourceData::Files { direct } = *self else {
            return Ok(None);
        };
        let (path, entry) = (&source.local, &source.entry);
        let meta = std::fs::metadata(path).map_err(|_| source.changed())?;
        // The ctime and inode too: a file rewritten in place with its mtime set back is
        // another version, however alike its size and mtime.
        if SourceIdentity::of_metadata(&meta) != SourceIdentity::of(entry) {
            return Err(source.changed());
        }
        if !hash {
            return Ok(None);
        }
        let unreadable = |e| source.unreadable(e);
        let file = open_source(path, direct).map_err(unreadable)?;
        let hash = direct_io::blake3_of(&file, direct).map_err(unreadable)?;
        Ok(Some(*hash.as_bytes()))
    }
}

/// A stream's own place for the unit it sends: a read buffer for short units, a mapped window
/// of the file for long ones (kept until the next unit, after the unit is written), aligned
/// memory for direct reads.
#[derive(Default)]
pub(crate) struct UnitBuffer {
    bytes: Vec<u8>,
    window: Option<ReadWindow>,
    aligned: AlignedBuffer,
}

/// Opens a source file for reading, with direct I/O when asked.
fn open_source(path: &Path, direct: bool) -> std::io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    if direct {
        options.custom_flags(direct_io::O_DIRECT);
    }
    let file = options.open(path)?;
    if direct {
        direct_io::check_alignment(&file)?;
    }
    Ok(file)
}

impl SourceFile {
    /// The error for a file that cannot be opened.
    fn open_error(&self, e: std::io::Error, direct: bool) -> SendError {
        self.unreadable(if direct { direct_io::open_error(e) } else { e })
    }

    /// The file cannot be read, for `e`.
    fn unreadable(&self, e: std::io::Error) -> SendError {
        SendError::Source {
            path: self.local.display().to_string(),
            cause: e.into(),
        }
    }

    /// The file changed since it was scanned.
    fn changed(&self) -> SendError {
        SendError::SourceChanged {
            path: self.local.display().to_string(),
        }
    }

    /// The error for a failed read: a file that ended early (or whose window could not be
    /// faulted in, `EFAULT`) changed since it was scanned.
    fn read_error(&self, e: std::io::Error) -> SendError {
        if e.kind() == std::io::ErrorKind::UnexpectedEof || e.raw_os_error() == Some(libc::EFAULT) {
            self.changed()
        } else {
            self.unreadable(e)
        }
    }
}
