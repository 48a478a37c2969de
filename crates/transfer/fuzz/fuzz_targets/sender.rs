//! Any replies a receiver can send, as the sender's rules take them, whatever the session does
//! with files already there: plans, seals' answers and the end on the control connection,
//! acknowledgements on a data stream. The sender refuses what breaks the protocol and never
//! acts against its manifest (a range outside a file, a file settled twice, done before it
//! finished) nor matches an answer to a unit it did not send.

#![no_main]

use libfuzzer_sys::fuzz_target;
use transfer::wire::{Message, PresentFiles};

/// Files per input.
const MAX_FILES: usize = 64;

type Input = (
    PresentFiles,
    Vec<u64>,
    Vec<Message>,
    Vec<(u32, u64, u32)>,
    Vec<Message>,
);

fuzz_target!(|data: &[u8]| {
    let Ok((present, sizes, control, sent, answers)) = postcard::from_bytes::<Input>(data) else {
        return;
    };
    if sizes.len() > MAX_FILES {
        return;
    }
    transfer::fuzzing::sender_rules(present, &sizes, control, &sent, answers);
});
