//! Reading a unit's bytes on the sender: from a file, or from a generated pattern.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use super::{SendError, Unit};
use crate::wire::chunk_checksum;

/// Where unit bytes come from.
pub(crate) enum SourceData {
    /// Local files, same order as the manifest.
    Files(Vec<PathBuf>),
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
    /// read buffer and last opened file, kept across calls.
    pub(crate) fn unit_data<'a>(
        &'a self,
        unit: Unit,
        buf: &'a mut Vec<u8>,
        open: &mut Option<(u32, File)>,
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
            SourceData::Files(paths) => {
                let path = &paths[unit.file as usize];
                let read_error = |e: std::io::Error| {
                    if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        SendError::SourceChanged(path.display().to_string())
                    } else {
                        SendError::Source(format!("cannot read {}: {e}", path.display()))
                    }
                };
                if open.as_ref().is_none_or(|(file, _)| *file != unit.file) {
                    *open = Some((unit.file, File::open(path).map_err(read_error)?));
                }
                let (_, file) = open.as_ref().expect("just opened");
                buf.resize(len, 0);
                file.read_exact_at(buf, unit.offset).map_err(read_error)?;
                Ok((&buf[..], chunk_checksum(buf)))
            }
        }
    }

    /// Checks that a source file is still the version in the manifest and, when asked, hashes it.
    pub(crate) fn check_unchanged(
        &self,
        file: u32,
        entry: &crate::manifest::FileEntry,
        hash: bool,
    ) -> Result<Option<[u8; 32]>, SendError> {
        let SourceData::Files(paths) = self else {
            return Ok(None);
        };
        let path = &paths[file as usize];
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
