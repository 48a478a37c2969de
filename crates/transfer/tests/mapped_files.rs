//! Large chunks arrive whole both ways the library can move them: copied through buffers (the
//! default, with no process-wide signal handler) and, once the program calls
//! `enable_mapped_files`, through mapped files. One test, so that nothing else in this process
//! turns mapping on first. (That `enable` installs the SIGBUS handler, and nothing else does,
//! is tested in `src/sys/mapped.rs`, where the handler can be read.)

use std::path::PathBuf;

use transfer::auth::{KeySetting, SessionKey};
use transfer::{Receiver, ReceiverSettings, SendJob, SendSource, SenderSettings};

/// Sends `data` as one file into a fresh root; what landed.
fn round_trip(data: &[u8]) -> Vec<u8> {
    let work = tempfile::tempdir().unwrap();
    let (source, root) = (work.path().join("big.bin"), work.path().join("root"));
    std::fs::write(&source, data).unwrap();
    std::fs::create_dir(&root).unwrap();
    let (key_text, key) = SessionKey::generate();
    let receiver =
        Receiver::bind(&ReceiverSettings::new(root.clone(), key).listen("127.0.0.1:0")).unwrap();
    let addr = receiver.local_addr().unwrap().to_string();
    std::thread::spawn(move || receiver.serve(Some(1)));
    let mut settings = SenderSettings::new(
        addr,
        KeySetting::Text(key_text),
        SendSource::Paths {
            paths: vec![source],
            destination: PathBuf::new(),
        },
    );
    settings.optimizer = Some("fixed:2".parse().unwrap());
    SendJob::start(settings).unwrap().wait().unwrap();
    std::fs::read(root.join("big.bin")).unwrap()
}

#[test]
fn large_chunks_arrive_whole_copied_by_default_and_mapped_once_asked() {
    let data: Vec<u8> = (0..32u32 << 20).map(|i| (i % 253) as u8).collect();
    assert!(round_trip(&data) == data, "copied");
    transfer::enable_mapped_files();
    assert!(round_trip(&data) == data, "mapped");
}
