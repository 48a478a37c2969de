//! Reading a unit's bytes on the sender: from a file, or from a generated pattern.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use super::{SendError, Unit};
use crate::manifest::FileEntry;
use crate::mapped::{ReadWindow, MAPPED_MIN};
use crate::wire::chunk_checksum;

/// A file announced to the receiver and not yet settled: what the manifest said of it and
/// where it is on this host (nowhere, for generated data).
#[derive(Debug)]
pub(crate) struct SourceFile {
    pub(crate) entry: FileEntry,
    pub(crate) local: PathBuf,
}

/// Where unit bytes come from.
pub(crate) enum SourceData {
    /// Local files, at their [`SourceFile::local`] paths.
    Files,
    /// A pseudo-random block reused for every unit; its checksum is computed once.
    Pattern {
        /// The block, one unit long.
        block: Vec<u8>,
        /// xxh3 of the whole block.
        checksum: u64,
    },
}

impl SourceData {
    /// A generated source whose units are all the same incompressible block.
    pub(crate) fn pattern(unit_size: u32) -> SourceData {
        let mut block = vec![0u8; unit_size as usize];
        blake3::Hasher::new_derive_key("xfer generated data")
            .finalize_xof()
            .fill(&mut block);
        let checksum = chunk_checksum(&block);
        SourceData::Pattern { block, checksum }
    }

    /// The bytes of `unit` and their checksum. `buf` and `open` are the calling stream's own
    /// read buffer and last opened file, kept across calls; `locate` finds the unit's file when
    /// it is not the one open.
    pub(crate) fn unit_data<'a>(
        &'a self,
        unit: Unit,
        buf: &'a mut UnitBuffer,
        open: &mut Option<(u32, File)>,
        locate: impl Fn() -> Result<Arc<SourceFile>, SendError>,
    ) -> Result<(&'a [u8], u64), SendError> {
        let len = unit.len as usize;
        match self {
            SourceData::Pattern { block, checksum } if len == block.len() => {
                Ok((&block[..], *checksum))
            }
            SourceData::Pattern { block, .. } => {
                let data = block.get(..len).ok_or_else(|| {
                    SendError::Protocol("unit longer than the generated block".into())
                })?;
                Ok((data, chunk_checksum(data)))
            }
            SourceData::Files => {
                let opened = match open {
                    Some((file, handle)) if *file == unit.file => handle,
                    _ => {
                        let source = locate()?;
                        let handle = File::open(&source.local).map_err(|e| source.read_error(e))?;
                        &open.insert((unit.file, handle)).1
                    }
                };
                if len >= MAPPED_MIN {
                    buf.bytes = Vec::new();
                    let window = ReadWindow::map(opened, unit.offset, len)
                        .map_err(|e| locate().map_or_else(|e| e, |s| s.read_error(e)))?;
                    let checksum = window.guard(chunk_checksum).map_err(|_| match locate() {
                        Ok(source) => SendError::SourceChanged(source.local.display().to_string()),
                        Err(e) => e,
                    })?;
                    let window = buf.window.insert(window);
                    return Ok((window.for_kernel(), checksum));
                }
                buf.window = None;
                buf.bytes.resize(len, 0);
                if let Err(e) = opened.read_exact_at(&mut buf.bytes, unit.offset) {
                    return Err(locate()?.read_error(e));
                }
                Ok((&buf.bytes[..], chunk_checksum(&buf.bytes)))
            }
        }
    }

    /// Checks that a source file is still the version in the manifest and, when asked, hashes it.
    pub(crate) fn check_unchanged(
        &self,
        source: &SourceFile,
        hash: bool,
    ) -> Result<Option<[u8; 32]>, SendError> {
        let SourceData::Files = self else {
            return Ok(None);
        };
        let (path, entry) = (&source.local, &source.entry);
        let changed = || SendError::SourceChanged(path.display().to_string());
        let meta = std::fs::metadata(path).map_err(|_| changed())?;
        if meta.len() != entry.size || crate::manifest::Timestamp::mtime_of(&meta) != entry.mtime {
            return Err(changed());
        }
        if !hash {
            return Ok(None);
        }
        let mut hasher = blake3::Hasher::new();
        let file_handle = File::open(path)
            .map_err(|e| SendError::Source(format!("cannot read {}: {e}", path.display())))?;
        std::io::copy(
            &mut std::io::BufReader::with_capacity(1 << 20, file_handle),
            &mut hasher,
        )
        .map_err(|e| SendError::Source(format!("cannot read {}: {e}", path.display())))?;
        Ok(Some(*hasher.finalize().as_bytes()))
    }
}

/// A stream's own place for the unit it sends: a read buffer for short units, a mapped window
/// of the file for long ones (kept until the next unit, after the unit is written).
#[derive(Default)]
pub(crate) struct UnitBuffer {
    bytes: Vec<u8>,
    window: Option<ReadWindow>,
}

impl SourceFile {
    /// The error for a failed read: a file that ended early (or whose window could not be
    /// faulted in, `EFAULT`) changed since it was scanned.
    fn read_error(&self, e: std::io::Error) -> SendError {
        if e.kind() == std::io::ErrorKind::UnexpectedEof || e.raw_os_error() == Some(libc::EFAULT) {
            SendError::SourceChanged(self.local.display().to_string())
        } else {
            SendError::Source(format!("cannot read {}: {e}", self.local.display()))
        }
    }
}
