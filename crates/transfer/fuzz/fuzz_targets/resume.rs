//! Resume state from outside: the receiver's plan as the sender reads it (ranges anywhere,
//! overlapping, past the end), and a journal file as the receiver reads it after a crash
//! (torn, corrupted, with records that do not verify). Either is refused or used within the
//! file's bounds; never a panic.

#![no_main]

use std::io::Write;

use libfuzzer_sys::fuzz_target;
use transfer::journal::{Journal, SourceIdentity};
use transfer::manifest::{FileEntry, Timestamp};
use transfer::wire::FileStatus;

/// Size of every file in the plans and of the journaled source.
const FILE_SIZE: u64 = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let mtime = Timestamp {
        secs: 1_600_000_000,
        nanos: 7,
    };
    if which & 1 == 0 {
        let Ok(plan) = postcard::from_bytes::<Vec<FileStatus>>(rest) else {
            return;
        };
        let files: Vec<_> = plan
            .iter()
            .enumerate()
            .map(|(i, _)| FileEntry {
                path: format!("f{i}").into_bytes(),
                size: FILE_SIZE >> (i % 17),
                mode: 0o644,
                mtime,
                ctime: mtime,
                inode: i as u64,
            })
            .collect();
        let unit_size = 1 + u32::from(which >> 1) * 512;
        if let Ok(units) = transfer::fuzzing::plan_units(&files, &plan, unit_size) {
            // Units lie inside their file, are at most a unit long, and never overlap.
            let mut sorted = units.clone();
            sorted.sort_unstable();
            for pair in sorted.windows(2) {
                let ((fa, oa, la), (fb, ob, _)) = (pair[0], pair[1]);
                assert!(
                    fa != fb || oa + u64::from(la) <= ob,
                    "overlapping units {pair:?}"
                );
            }
            for (file, offset, len) in units {
                let size = files[file as usize].size;
                assert!(len > 0 && len <= unit_size && offset + u64::from(len) <= size);
            }
        }
    } else {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let journal_path = dir.path().join("journal");
        std::fs::write(&journal_path, rest).expect("the journal");
        let mut part = std::fs::File::create_new(dir.path().join("part")).expect("the part");
        part.write_all(&[0x5a; 4096]).expect("part data");
        let journal = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&journal_path)
            .expect("open the journal");
        let identity = SourceIdentity {
            size: FILE_SIZE,
            mtime,
            ctime: mtime,
            inode: 1,
        };
        if let Some((_, verified)) = Journal::resume(journal, &part, identity) {
            assert!(verified
                .iter()
                .all(|r| r.end <= FILE_SIZE && r.start < r.end));
        }
    }
});
