//! Any manifest a sender can send (a destination and batches), handled as the receiver handles
//! it before any data: every path checked, directories made, each batch's resume plan read. It
//! is refused with a reason or accepted, never a panic, and nothing is created outside the
//! receiver's root.

#![no_main]

use libfuzzer_sys::fuzz_target;
use transfer::manifest::ManifestBatch;

/// Entries per input, so that one input cannot make the run create thousands of directories.
const MAX_ENTRIES: usize = 64;

fuzz_target!(|data: &[u8]| {
    let Ok((dest, batches)) = postcard::from_bytes::<(Vec<u8>, Vec<ManifestBatch>)>(data) else {
        return;
    };
    let entries: usize = batches.iter().map(|b| b.files.len() + b.dirs.len()).sum();
    if entries > MAX_ENTRIES {
        return;
    }
    let outer = tempfile::tempdir().expect("a temporary directory");
    let root = outer.path().join("root");
    std::fs::create_dir(&root).expect("the root");
    let _ = transfer::fuzzing::receive_manifest(&root, &dest, &batches);
    let beside: Vec<_> = std::fs::read_dir(outer.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(
        beside,
        ["root"],
        "a manifest created something outside the root"
    );
});
