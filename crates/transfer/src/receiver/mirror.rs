//! Mirroring (`xfer send --delete`): once a session's files are all in place, what the
//! directories it sent hold and its manifest does not is removed, as rsync's `--delete` does.
//!
//! - Only directories the session sent are swept (each top-level directory of its manifest,
//!   and everything below it); a file sent alone removes nothing beside it, and nothing else
//!   under the destination is touched.
//! - What the sender's filter leaves out is kept, as rsync keeps excluded files: a file is
//!   removed only if the filter would send it, a directory entered only if the filter would
//!   read it, and a directory removed only once nothing is left in it.
//! - The receiver's own part files and journals, and paths another session is writing, are
//!   kept (their directory with them).
//! - The sweep goes through directory handles beneath the root and never follows a link (a
//!   link is removed as the entry it is, never what it points at).
//! - A dry run sweeps the same way and removes nothing: it reports what a run would remove.

use std::collections::HashSet;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cap_std::fs::Dir;

use super::destination::{ActivePaths, DestinationError};
use super::file_tree::open_dir_read_only;
use crate::filter::{Filter, Selection};
use crate::journal::PartPaths;
use crate::wire::{Removal, Removed};

/// Most rules and listed paths a mirroring session's filter may hold: the receiver judges
/// every entry it sweeps by it.
pub(super) const MAX_FILTER_ENTRIES: usize = 10_000;

/// What a mirroring session keeps: its manifest's paths, and the sender's filter.
pub(super) struct Mirror {
    selection: Selection,
    /// Every directory and file of the manifest, relative to the root.
    kept: Mutex<HashSet<PathBuf>>,
    /// The manifest's top-level directories (relative to the root), which are swept.
    tops: Mutex<Vec<PathBuf>>,
}

/// One sweep's fixed parts.
struct Sweep<'a> {
    mirror: &'a Mirror,
    kept: &'a HashSet<PathBuf>,
    dest: &'a Path,
    active: &'a ActivePaths,
    owner: [u8; 16],
    /// A dry run: count, remove nothing.
    dry: bool,
}

impl Mirror {
    /// The mirror of a session whose sender filters with `filter`; a filter too large to
    /// judge by, or that does not compile, is refused.
    pub(super) fn new(filter: &Filter) -> Result<Mirror, DestinationError> {
        let entries = filter.rules.len() + filter.files_from.as_ref().map_or(0, Vec::len);
        if entries > MAX_FILTER_ENTRIES {
            return Err(DestinationError::Refused(format!(
                "a filter of {entries} rules and paths is more than the {MAX_FILTER_ENTRIES} \
                 a mirroring session may have"
            )));
        }
        let selection = filter
            .compile()
            .map_err(|e| DestinationError::Refused(e.to_string()))?;
        Ok(Mirror {
            selection,
            kept: Mutex::default(),
            tops: Mutex::default(),
        })
    }

    /// Keeps a batch's directories `dirs` and files `files` (relative to the root, under
    /// `dest`).
    pub(super) fn keep(&self, dest: &Path, dirs: &[PathBuf], files: &[PathBuf]) {
        let mut kept = self.kept.lock().expect("mirror lock");
        kept.extend(dirs.iter().chain(files).cloned());
        let tops = dirs.iter().filter(|d| d.parent() == Some(dest));
        self.tops.lock().expect("mirror lock").extend(tops.cloned());
    }

    /// Sweeps each top-level directory (`open` gives its handle, `None` if it is not there),
    /// removing what the manifest does not hold, or (`dry`) only finding it.
    pub(super) fn sweep(
        &self,
        dest: &Path,
        active: &ActivePaths,
        owner: [u8; 16],
        dry: bool,
        mut open: impl FnMut(&Path) -> Result<Option<Arc<Dir>>, DestinationError>,
    ) -> Result<Removal, DestinationError> {
        let kept = self.kept.lock().expect("mirror lock");
        let tops = self.tops.lock().expect("mirror lock").clone();
        let sweep = Sweep {
            mirror: self,
            kept: &kept,
            dest,
            active,
            owner,
            dry,
        };
        let mut removal = Removal::default();
        for top in tops {
            if let Some(dir) = open(&top)? {
                sweep.directory(&dir, &top, &top, &mut removal)?;
            }
        }
        Ok(removal)
    }
}

impl Sweep<'_> {
    /// Removes what `dir` (at `rel`, under the top-level directory `top`) holds and should not;
    /// returns whether nothing is left in it.
    fn directory(
        &self,
        dir: &Dir,
        rel: &Path,
        top: &Path,
        removal: &mut Removal,
    ) -> Result<bool, DestinationError> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |error| DestinationError::Io { path, error }
        };
        let mut left = 0usize;
        for entry in dir.entries().map_err(io(rel))? {
            let entry = entry.map_err(io(rel))?;
            let name = entry.file_name();
            let path = rel.join(&name);
            if PartPaths::is_part_name(&name) || self.active.held_by_another(&path, self.owner) {
                left += 1;
                continue;
            }
            let in_source = path.strip_prefix(top).expect("swept below its top");
            // lstat, not the directory entry's type, which some file systems leave unknown.
            let meta = entry.metadata().map_err(io(&path))?;
            let kind = meta.file_type();
            let kept = self.kept.contains(&path);
            let removed = if kind.is_dir() {
                if !self.mirror.selection.walks(in_source) {
                    false
                } else {
                    // Opened anew, refusing a link: the entry may have changed since it was read.
                    let sub = open_dir_read_only(dir, Path::new(&name)).map_err(io(&path))?;
                    let sub = Dir::from_std_file(sub);
                    let emptied = self.directory(&sub, &path, top, removal)?;
                    let gone = !kept && emptied;
                    if gone && !self.dry {
                        dir.remove_dir(&name).map_err(io(&path))?;
                    }
                    gone
                }
            } else if !kept && self.mirror.selection.sends(in_source) {
                if !self.dry {
                    dir.remove_file(&name).map_err(io(&path))?;
                }
                removal.add(Removed {
                    path: self.shown(&path),
                    size: meta.len(),
                    dir: false,
                });
                true
            } else {
                false
            };
            if removed && kind.is_dir() {
                removal.add(Removed {
                    path: self.shown(&path),
                    size: 0,
                    dir: true,
                });
            }
            if !removed {
                left += 1;
            }
        }
        Ok(left == 0)
    }

    /// `path` as a [`Removed`] names it: relative to the destination directory.
    fn shown(&self, path: &Path) -> Vec<u8> {
        let below = path.strip_prefix(self.dest).unwrap_or(path);
        below.as_os_str().as_bytes().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_larger_than_the_bound_is_refused_by_its_size() {
        let mut filter = Filter::default();
        for i in 0..=MAX_FILTER_ENTRIES {
            filter = filter.exclude(format!("f{i}"));
        }
        let refused = Mirror::new(&filter).err().expect("refused").to_string();
        assert!(refused.contains("10001 rules and paths"), "{refused}");
    }
}
