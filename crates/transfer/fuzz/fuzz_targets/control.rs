//! Any control session a sender can hold (a destination, then any messages: manifest batches,
//! seals, QUIC requests, the finish, messages that belong elsewhere), driven through the
//! receiver's session rules over the files of a real destination: every path checked,
//! directories made, each batch's resume plan read, files sealed. The session ends with a
//! reason or goes on, never a panic; nothing is created outside the receiver's root; and a
//! session that completes has placed every file it announced.

#![no_main]

use libfuzzer_sys::fuzz_target;
use transfer::wire::Message;

/// Entries per input, so that one input cannot make the run create thousands of directories.
const MAX_ENTRIES: usize = 64;

fuzz_target!(|data: &[u8]| {
    let Ok((dest, messages)) = postcard::from_bytes::<(Vec<u8>, Vec<Message>)>(data) else {
        return;
    };
    let entries: usize = messages
        .iter()
        .map(|m| match m {
            Message::Entries(batch) => batch.files.len() + batch.dirs.len(),
            _ => 0,
        })
        .sum();
    if entries > MAX_ENTRIES {
        return;
    }
    let outer = tempfile::tempdir().expect("a temporary directory");
    let root = outer.path().join("root");
    std::fs::create_dir(&root).expect("the root");
    let run = transfer::fuzzing::receive_control(&root, &dest, messages);
    if let Some(Ok(())) = run.end {
        assert_eq!(
            run.files_placed, run.files_announced,
            "a session completed with files not placed: {:?}",
            run.replies
        );
    }
    let beside: Vec<_> = std::fs::read_dir(outer.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(
        beside,
        ["root"],
        "a session created something outside the root"
    );
});
