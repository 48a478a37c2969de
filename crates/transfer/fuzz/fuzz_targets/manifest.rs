//! Any manifest a sender can send, handled as the receiver handles it before any data: every
//! path checked, directories made, the resume plan read. It is refused with a reason or
//! accepted, never a panic, and nothing is created outside the receiver's root.

#![no_main]

use libfuzzer_sys::fuzz_target;
use transfer::manifest::Manifest;

/// Entries per input, so that one input cannot make the run create thousands of directories.
const MAX_ENTRIES: usize = 64;

fuzz_target!(|data: &[u8]| {
    let Ok(manifest) = postcard::from_bytes::<Manifest>(data) else {
        return;
    };
    if manifest.files.len() + manifest.dirs.len() > MAX_ENTRIES {
        return;
    }
    let outer = tempfile::tempdir().expect("a temporary directory");
    let root = outer.path().join("root");
    std::fs::create_dir(&root).expect("the root");
    let _ = transfer::fuzzing::receive_manifest(&root, &manifest);
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
