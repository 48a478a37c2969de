//! The receiver's journal of verified chunks, one per partly received file.
//!
//! A file arrives as `.NAME.xfer-part` beside its final name, with `.NAME.xfer-journal` next to
//! it. The journal starts with the identity of the source version (size, mtime, and the ctime
//! and inode number nobody can set back) and then gets one fixed-size record `(offset, len,
//! xxh3)` appended after each chunk is written, with a check of its own (the xxh3 of those 24
//! bytes), so that a record is never taken from bytes that are not one. A record goes to the
//! page cache right after its data, so a killed process loses nothing it acknowledged.
//! On resume every record is checked again against the part file's bytes, so a record that
//! outlived its data (power loss) or a part file changed behind our back costs a resend, never a
//! corrupt file. A torn last record is ignored.
//!
//! Journals are opened for appending (`O_APPEND`), so that the receiving nodes of a striped
//! transfer ([`crate::stripe`]), each writing its own ranges of a file into the same part file,
//! can append their records to one journal: each record is written whole, with one write, at
//! the journal's end.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rangemap::RangeSet;

use crate::manifest::{FileEntry, Timestamp};
use crate::wire::chunk_checksum;

const MAGIC: &[u8; 8] = b"XFERJNL3";
const HEADER_LEN: usize = 48;
const RECORD_LEN: usize = 32;
const NAME_MAX: usize = 255;

/// The source version a journal belongs to: what the sender's manifest said of the file
/// ([`FileEntry`]). A file rewritten in place with its mtime set back, or another file of the
/// same name, size and mtime, has another ctime or inode: what was received of one version is
/// never resumed onto another.
///
/// ```
/// use transfer::journal::SourceIdentity;
///
/// let metadata = std::fs::metadata("Cargo.toml").unwrap();
/// let identity = SourceIdentity::of_metadata(&metadata);
/// assert_eq!(identity.size, metadata.len());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceIdentity {
    /// Source file size.
    pub size: u64,
    /// Source file mtime.
    pub mtime: Timestamp,
    /// Source file ctime ([`Timestamp::ctime_of`]).
    pub ctime: Timestamp,
    /// Source file inode number.
    pub inode: u64,
}

impl SourceIdentity {
    /// The version a manifest entry names.
    ///
    /// ```
    /// use transfer::journal::SourceIdentity;
    /// use transfer::manifest::ManifestBatch;
    ///
    /// let entry = &ManifestBatch::memory(100).files[0];
    /// assert_eq!(SourceIdentity::of(entry).size, 100);
    /// ```
    pub fn of(entry: &FileEntry) -> SourceIdentity {
        SourceIdentity {
            size: entry.size,
            mtime: entry.mtime,
            ctime: entry.ctime,
            inode: entry.inode,
        }
    }

    /// The version of a file on this host.
    ///
    /// ```
    /// use transfer::journal::SourceIdentity;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    /// std::fs::write(&a, "same").unwrap();
    /// std::fs::copy(&a, &b).unwrap();
    /// let copy = std::fs::File::options().write(true).open(&b).unwrap();
    /// copy.set_modified(std::fs::metadata(&a).unwrap().modified().unwrap()).unwrap();
    /// let (a, b) = (std::fs::metadata(&a).unwrap(), std::fs::metadata(&b).unwrap());
    /// assert_eq!((a.len(), a.modified().unwrap()), (b.len(), b.modified().unwrap()));
    /// assert_ne!(SourceIdentity::of_metadata(&a), SourceIdentity::of_metadata(&b), "another file");
    /// ```
    pub fn of_metadata(meta: &std::fs::Metadata) -> SourceIdentity {
        use std::os::unix::fs::MetadataExt;
        SourceIdentity {
            size: meta.len(),
            mtime: Timestamp::mtime_of(meta),
            ctime: Timestamp::ctime_of(meta),
            inode: meta.ino(),
        }
    }

    fn encode(&self) -> [u8; HEADER_LEN - 8] {
        let mut out = [0u8; HEADER_LEN - 8];
        out[..8].copy_from_slice(&self.size.to_le_bytes());
        for (at, time) in [(8, self.mtime), (20, self.ctime)] {
            out[at..at + 8].copy_from_slice(&time.secs.to_le_bytes());
            out[at + 8..at + 12].copy_from_slice(&time.nanos.to_le_bytes());
        }
        out[32..].copy_from_slice(&self.inode.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8; HEADER_LEN - 8]) -> SourceIdentity {
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let time_at = |i: usize| Timestamp {
            secs: u64_at(i) as i64,
            nanos: u32::from_le_bytes(bytes[i + 8..i + 12].try_into().expect("4 bytes")),
        };
        SourceIdentity {
            size: u64_at(0),
            mtime: time_at(8),
            ctime: time_at(20),
            inode: u64_at(32),
        }
    }
}

/// Names of the part file and journal kept beside a file's final path while it arrives.
///
/// ```
/// use std::path::Path;
/// use transfer::journal::PartPaths;
///
/// let paths = PartPaths::for_final(Path::new("run42/data.h5"));
/// assert_eq!(paths.part, Path::new("run42/.data.h5.xfer-part"));
/// assert_eq!(paths.journal, Path::new("run42/.data.h5.xfer-journal"));
/// ```
#[derive(Debug, Clone)]
pub struct PartPaths {
    /// The data, written in place at each chunk's offset.
    pub part: PathBuf,
    /// The journal of verified chunks.
    pub journal: PathBuf,
}

impl PartPaths {
    /// Derives the hidden part and journal names for `final_path` (hashed when the name is too
    /// long to extend).
    ///
    /// ```
    /// use std::path::Path;
    /// use transfer::journal::PartPaths;
    ///
    /// let long = "x".repeat(250);
    /// let paths = PartPaths::for_final(Path::new(&long));
    /// assert!(paths.part.to_str().unwrap().starts_with(".xfer-"), "a name that fits");
    /// ```
    pub fn for_final(final_path: &Path) -> PartPaths {
        let dir = final_path.parent().unwrap_or(Path::new(""));
        let name = final_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let stem = if name.len() + ".xfer-journal".len() < NAME_MAX {
            format!(".{name}")
        } else {
            format!(".xfer-{}", &blake3::hash(name.as_bytes()).to_hex()[..32])
        };
        PartPaths {
            part: dir.join(format!("{stem}.xfer-part")),
            journal: dir.join(format!("{stem}.xfer-journal")),
        }
    }

    /// Whether `name` is one [`PartPaths::for_final`] makes: a part file or a journal.
    ///
    /// ```
    /// use std::path::Path;
    /// use transfer::journal::PartPaths;
    ///
    /// let paths = PartPaths::for_final(Path::new("run42/data.h5"));
    /// assert!(PartPaths::is_part_name(paths.journal.file_name().unwrap()));
    /// assert!(!PartPaths::is_part_name("data.h5".as_ref()));
    /// ```
    pub fn is_part_name(name: &std::ffi::OsStr) -> bool {
        let name = name.as_encoded_bytes();
        name.starts_with(b".")
            && (name.ends_with(b".xfer-part") || name.ends_with(b".xfer-journal"))
    }
}

/// An open journal that records verified chunks.
///
/// A chunk written and journaled, then found again after a restart:
///
/// ```
/// # use std::os::unix::fs::FileExt;
/// # use transfer::journal::{Journal, PartPaths, SourceIdentity};
/// # use transfer::manifest::Timestamp;
/// # use transfer::wire::chunk_checksum;
/// # let dir = tempfile::tempdir().unwrap();
/// # let paths = PartPaths::for_final(&dir.path().join("run42.h5"));
/// # let t = Timestamp { secs: 1_700_000_000, nanos: 0 };
/// # let identity = SourceIdentity { size: 8, mtime: t, ctime: t, inode: 7 };
/// # let open = |path: &std::path::Path| std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap();
/// # let part = open(&paths.part);
/// # part.set_len(8).unwrap();
/// let mut journal = Journal::create(open(&paths.journal), identity).unwrap();
/// part.write_all_at(b"abcd", 0).unwrap();
/// journal.record(0, 4, chunk_checksum(b"abcd")).unwrap();
/// drop(journal); // the receiver is killed here
///
/// let (_, verified) = Journal::resume(open(&paths.journal), &part, identity).unwrap();
/// assert!(verified.contains(&0) && !verified.contains(&4), "only the first chunk is kept");
/// ```
#[derive(Debug)]
pub struct Journal {
    file: File,
}

impl Journal {
    /// Starts a journal for `identity` in `file` (opened for writing; anything in it is replaced).
    ///
    /// ```
    /// # use std::os::unix::fs::FileExt;
    /// # use transfer::journal::{Journal, PartPaths, SourceIdentity};
    /// # use transfer::manifest::Timestamp;
    /// # use transfer::wire::chunk_checksum;
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let paths = PartPaths::for_final(&dir.path().join("run42.h5"));
    /// # let t = Timestamp { secs: 1_700_000_000, nanos: 0 };
    /// # let identity = SourceIdentity { size: 8, mtime: t, ctime: t, inode: 7 };
    /// # let open = |path: &std::path::Path| std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap();
    /// # let part = open(&paths.part);
    /// # part.set_len(8).unwrap();
    /// let journal = Journal::create(open(&paths.journal), identity).unwrap();
    /// assert_eq!(std::fs::metadata(&paths.journal).unwrap().len(), 48, "the header alone");
    /// # drop(journal);
    /// ```
    pub fn create(mut file: File, identity: SourceIdentity) -> std::io::Result<Journal> {
        file.set_len(0)?;
        file.seek(SeekFrom::Start(0))?;
        let mut header = [0u8; HEADER_LEN];
        header[..8].copy_from_slice(MAGIC);
        header[8..].copy_from_slice(&identity.encode());
        file.write_all(&header)?;
        Ok(Journal { file })
    }

    /// Appends the record of one verified chunk.
    ///
    /// ```
    /// # use std::os::unix::fs::FileExt;
    /// # use transfer::journal::{Journal, PartPaths, SourceIdentity};
    /// # use transfer::manifest::Timestamp;
    /// # use transfer::wire::chunk_checksum;
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let paths = PartPaths::for_final(&dir.path().join("run42.h5"));
    /// # let t = Timestamp { secs: 1_700_000_000, nanos: 0 };
    /// # let identity = SourceIdentity { size: 8, mtime: t, ctime: t, inode: 7 };
    /// # let open = |path: &std::path::Path| std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap();
    /// # let part = open(&paths.part);
    /// # part.set_len(8).unwrap();
    /// let mut journal = Journal::create(open(&paths.journal), identity).unwrap();
    /// part.write_all_at(b"efgh", 4).unwrap();
    /// journal.record(4, 4, chunk_checksum(b"efgh")).unwrap();
    /// assert_eq!(std::fs::metadata(&paths.journal).unwrap().len(), 48 + 32);
    /// ```
    pub fn record(&mut self, offset: u64, len: u64, checksum: u64) -> std::io::Result<()> {
        let mut rec = [0u8; RECORD_LEN];
        rec[..8].copy_from_slice(&offset.to_le_bytes());
        rec[8..16].copy_from_slice(&len.to_le_bytes());
        rec[16..24].copy_from_slice(&checksum.to_le_bytes());
        let check = chunk_checksum(&rec[..24]);
        rec[24..].copy_from_slice(&check.to_le_bytes());
        // One write, so that writers appending to one journal never interleave within a record.
        self.file.write_all(&rec)
    }

    /// Appends to the journal in `file`, which [`Journal::create`] or [`Journal::resume`] left
    /// ending in whole records.
    ///
    /// ```
    /// # use std::os::unix::fs::FileExt;
    /// # use transfer::journal::{Journal, PartPaths, SourceIdentity};
    /// # use transfer::manifest::Timestamp;
    /// # use transfer::wire::chunk_checksum;
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let paths = PartPaths::for_final(&dir.path().join("run42.h5"));
    /// # let t = Timestamp { secs: 1_700_000_000, nanos: 0 };
    /// # let identity = SourceIdentity { size: 8, mtime: t, ctime: t, inode: 7 };
    /// # let open = |path: &std::path::Path| std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap();
    /// # let part = open(&paths.part);
    /// # part.set_len(8).unwrap();
    /// Journal::create(open(&paths.journal), identity).unwrap();
    /// let mut journal = Journal::append_to(open(&paths.journal)).unwrap();
    /// journal.record(0, 4, chunk_checksum(&[0; 4])).unwrap();
    /// let (_, verified) = Journal::resume(open(&paths.journal), &part, identity).unwrap();
    /// assert!(verified.contains(&3), "the part file holds zeros there");
    /// ```
    pub fn append_to(mut file: File) -> std::io::Result<Journal> {
        file.seek(SeekFrom::End(0))?;
        Ok(Journal { file })
    }

    /// Continues the journal in `file` (opened for reading and writing): re-verifies its records
    /// against `part` and returns it positioned for appending, with the ranges that still
    /// verify. `None` when the journal is unreadable or belongs to another version of the source.
    ///
    /// ```
    /// # use std::os::unix::fs::FileExt;
    /// # use transfer::journal::{Journal, PartPaths, SourceIdentity};
    /// # use transfer::manifest::Timestamp;
    /// # use transfer::wire::chunk_checksum;
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let paths = PartPaths::for_final(&dir.path().join("run42.h5"));
    /// # let t = Timestamp { secs: 1_700_000_000, nanos: 0 };
    /// # let identity = SourceIdentity { size: 8, mtime: t, ctime: t, inode: 7 };
    /// # let open = |path: &std::path::Path| std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap();
    /// # let part = open(&paths.part);
    /// # part.set_len(8).unwrap();
    /// Journal::create(open(&paths.journal), identity).unwrap();
    /// let changed = SourceIdentity { size: 9, ..identity };
    /// assert!(Journal::resume(open(&paths.journal), &part, changed).is_none(), "the source changed");
    /// let rewritten = SourceIdentity { ctime: Timestamp { secs: t.secs + 1, nanos: 0 }, ..identity };
    /// assert!(Journal::resume(open(&paths.journal), &part, rewritten).is_none(), "rewritten in place");
    /// ```
    pub fn resume(
        mut file: File,
        part: &File,
        identity: SourceIdentity,
    ) -> Option<(Journal, RangeSet<u64>)> {
        let (verified, keep, len) = Journal::read_verified(&mut file, part, identity)?;
        // Drop a torn tail so that new records stay aligned; only a torn one, since another
        // writer of the same journal may have appended a record since it was read.
        if keep != len {
            file.set_len(keep).ok()?;
        }
        file.seek(SeekFrom::Start(keep)).ok()?;
        let journal = Journal { file };
        Some((journal, verified))
    }

    /// Joins the journal in `file` that another writer of the same part file started for
    /// `identity` (a receiving node of the same striped transfer), to append to it, without
    /// reading its records; `None` when `file` holds no journal of that version.
    ///
    /// ```
    /// # use transfer::journal::{Journal, PartPaths, SourceIdentity};
    /// # use transfer::manifest::Timestamp;
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let paths = PartPaths::for_final(&dir.path().join("run42.h5"));
    /// # let t = Timestamp { secs: 1_700_000_000, nanos: 0 };
    /// # let identity = SourceIdentity { size: 8, mtime: t, ctime: t, inode: 7 };
    /// # let open = |path: &std::path::Path| std::fs::OpenOptions::new().read(true).append(true).create(true).open(path).unwrap();
    /// let mut one = Journal::create(open(&paths.journal), identity).unwrap();
    /// let mut other = Journal::join(open(&paths.journal), identity).unwrap();
    /// one.record(0, 4, 1).unwrap();
    /// other.record(4, 4, 2).unwrap();
    /// let recorded = Journal::recorded(open(&paths.journal), identity).unwrap();
    /// assert_eq!(recorded.iter().cloned().collect::<Vec<_>>(), vec![0..8]);
    /// let other_version = SourceIdentity { inode: 8, ..identity };
    /// assert!(Journal::join(open(&paths.journal), other_version).is_none());
    /// ```
    pub fn join(mut file: File, identity: SourceIdentity) -> Option<Journal> {
        let mut header = [0u8; HEADER_LEN];
        file.read_exact(&mut header).ok()?;
        Journal::header_is(&header, identity).then_some(())?;
        Journal::append_to(file).ok()
    }

    /// The ranges the journal in `file` records for `identity`, taken as they were recorded
    /// (every writer verified its chunks before recording them), without reading the part
    /// file: what a striped transfer's seal checks before it places a file that other nodes
    /// wrote in part. `None` for a journal of another version.
    pub fn recorded(mut file: File, identity: SourceIdentity) -> Option<RangeSet<u64>> {
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).ok()?;
        let records = Journal::records(&bytes, identity)?;
        Some(records.map(|(offset, end, _)| offset..end).collect())
    }

    /// What [`Journal::resume`] would find verified, changing nothing (a dry run's plan).
    pub fn verified(
        mut file: File,
        part: &File,
        identity: SourceIdentity,
    ) -> Option<RangeSet<u64>> {
        Journal::read_verified(&mut file, part, identity).map(|(verified, ..)| verified)
    }

    /// The ranges a journal read from its start records and the part file still holds, the
    /// length of its whole records and its length as read; `None` for a journal of another
    /// source version.
    fn read_verified(
        file: &mut File,
        part: &File,
        identity: SourceIdentity,
    ) -> Option<(RangeSet<u64>, u64, u64)> {
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).ok()?;
        let mut verified = RangeSet::new();
        let mut buf = Vec::new();
        for (offset, end, checksum) in Journal::records(&bytes, identity)? {
            buf.resize((end - offset) as usize, 0);
            if part.read_exact_at(&mut buf, offset).is_ok() && chunk_checksum(&buf) == checksum {
                verified.insert(offset..end);
            }
        }
        let keep = HEADER_LEN + (bytes.len() - HEADER_LEN) / RECORD_LEN * RECORD_LEN;
        Some((verified, keep as u64, bytes.len() as u64))
    }

    /// Whether a journal's first bytes are the header of one for `identity`.
    fn header_is(bytes: &[u8], identity: SourceIdentity) -> bool {
        bytes.len() >= HEADER_LEN
            && &bytes[..8] == MAGIC
            && SourceIdentity::decode(bytes[8..HEADER_LEN].try_into().expect("header")) == identity
    }

    /// The whole records of a journal read whole (`bytes`), as `(offset, end, checksum)`,
    /// leaving out those outside the file, empty, or failing their own check (after a record
    /// torn by a crash, the bytes of the whole records that other writers appended behind it
    /// are misaligned, and fail it); `None` for a journal of another version.
    fn records(
        bytes: &[u8],
        identity: SourceIdentity,
    ) -> Option<impl Iterator<Item = (u64, u64, u64)> + '_> {
        if !Journal::header_is(bytes, identity) {
            return None;
        }
        let records = bytes[HEADER_LEN..]
            .chunks_exact(RECORD_LEN)
            .filter_map(move |rec| {
                let offset = u64::from_le_bytes(rec[..8].try_into().expect("8 bytes"));
                let len = u64::from_le_bytes(rec[8..16].try_into().expect("8 bytes"));
                let checksum = u64::from_le_bytes(rec[16..24].try_into().expect("8 bytes"));
                let check = u64::from_le_bytes(rec[24..].try_into().expect("8 bytes"));
                if chunk_checksum(&rec[..24]) != check {
                    return None;
                }
                let end = offset
                    .checked_add(len)
                    .filter(|&e| e <= identity.size && len > 0)?;
                Some((offset, end, checksum))
            });
        Some(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_rw(path: &Path) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .unwrap()
    }

    #[test]
    fn resume_keeps_only_records_whose_bytes_still_verify() {
        let dir = tempfile::tempdir().unwrap();
        let paths = PartPaths::for_final(&dir.path().join("data.bin"));
        let identity = SourceIdentity {
            size: 300,
            mtime: Timestamp { secs: 5, nanos: 6 },
            ctime: Timestamp { secs: 8, nanos: 9 },
            inode: 42,
        };
        let part = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&paths.part)
            .unwrap();
        part.set_len(300).unwrap();
        let mut journal = Journal::create(open_rw(&paths.journal), identity).unwrap();
        for (off, fill) in [(0u64, 1u8), (100, 2), (200, 3)] {
            let data = vec![fill; 100];
            part.write_all_at(&data, off).unwrap();
            journal.record(off, 100, chunk_checksum(&data)).unwrap();
        }
        // Corrupt the middle chunk behind the journal's back and tear a record at the end.
        part.write_all_at(&[9u8; 1], 150).unwrap();
        journal.file.write_all(&[1, 2, 3]).unwrap();
        drop(journal);

        let (mut journal, verified) =
            Journal::resume(open_rw(&paths.journal), &part, identity).unwrap();
        let ranges: Vec<_> = verified.iter().cloned().collect();
        assert_eq!(ranges, vec![0..100, 200..300]);
        journal.record(100, 100, 0).unwrap();
        let len = std::fs::metadata(&paths.journal).unwrap().len() as usize;
        assert_eq!((len - HEADER_LEN) % RECORD_LEN, 0);

        for other in [
            SourceIdentity {
                mtime: Timestamp { secs: 5, nanos: 7 },
                ..identity
            },
            SourceIdentity {
                ctime: Timestamp { secs: 8, nanos: 10 },
                ..identity
            },
            SourceIdentity {
                inode: 43,
                ..identity
            },
        ] {
            assert!(Journal::resume(open_rw(&paths.journal), &part, other).is_none());
        }
        // A journal of the earlier format is another version's: the file is sent again.
        let mut old = std::fs::read(&paths.journal).unwrap();
        old[..8].copy_from_slice(b"XFERJNL2");
        std::fs::write(&paths.journal, old).unwrap();
        assert!(Journal::resume(open_rw(&paths.journal), &part, identity).is_none());
    }

    #[test]
    fn long_names_get_hashed_part_names() {
        let long = "x".repeat(250);
        let paths = PartPaths::for_final(Path::new(&format!("/d/{long}")));
        assert!(paths.part.file_name().unwrap().len() <= NAME_MAX);
        assert!(paths.journal.file_name().unwrap().len() <= NAME_MAX);
        let short = PartPaths::for_final(Path::new("/d/a.txt"));
        assert_eq!(short.part, Path::new("/d/.a.txt.xfer-part"));
    }
}
