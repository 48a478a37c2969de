//! The crate built without its default features (no tract, no egobox), as a service that
//! runs only `fixed`, `schedule`, `gd` or a controller of its own builds it: a transfer runs
//! under the default optimiser (then `gd`), and the optimisers the build leaves out are
//! refused with the feature that brings them. `scripts/test` runs it so:
//! `cargo test -p transfer --no-default-features --test lean_build`.

#![cfg(not(any(feature = "onnx", feature = "bo")))]

use std::path::PathBuf;
use std::time::Duration;

use transfer::auth::{KeySetting, SessionKey};
use transfer::job::{SendEvent, SendJob, SenderSettings};
use transfer::optimizer::SpecError;
use transfer::optimizer_choice::{OptimizerChoice, OptimizerError, Tuning};
use transfer::receiver::{Receiver, ReceiverSettings};
use transfer::SendSource;

#[test]
fn the_optimisers_left_out_are_refused_with_the_feature_to_turn_on() {
    let bo = "bo".parse::<OptimizerChoice>().unwrap_err();
    assert!(
        matches!(bo, OptimizerError::Spec(SpecError::NotBuilt { .. })),
        "{bo:?}"
    );
    assert!(bo.to_string().contains("\"bo\" feature"), "{bo}");
    for name in ["ppo", "auto"] {
        let choice: OptimizerChoice = name.parse().unwrap();
        let err = choice
            .build(&Tuning::default(), Default::default(), 0)
            .err()
            .unwrap();
        assert!(err.to_string().contains("onnx feature"), "{name}: {err}");
    }
    let (default, note) = Tuning::default().default_choice().unwrap();
    assert_eq!(default.to_string(), "gd");
    assert!(note.unwrap().contains("onnx"));
}

#[tokio::test]
async fn a_transfer_runs_under_the_default_optimiser() {
    let work = tempfile::tempdir().unwrap();
    let (source, root) = (work.path().join("data.bin"), work.path().join("root"));
    let data: Vec<u8> = (0..24u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&source, &data).unwrap();
    std::fs::create_dir(&root).unwrap();
    let (key_text, key) = SessionKey::generate();
    let receiver =
        Receiver::bind(&ReceiverSettings::new(root.clone(), key).listen("127.0.0.1:0")).unwrap();
    let addr = receiver.local_addr().unwrap().to_string();
    std::thread::spawn(move || receiver.serve(None));
    let mut settings = SenderSettings::new(
        addr,
        KeySetting::Text(key_text),
        SendSource::Paths {
            paths: vec![source],
            destination: PathBuf::new(),
        },
    );
    settings.tuning.interval = Duration::from_millis(100);
    settings.options.stream_rate_cap = Some(50_000_000);
    let mut job = SendJob::start(settings).unwrap();
    let mut chosen = None;
    while let Some(event) = job.next_event().await {
        if let SendEvent::Started { optimizer, .. } = event {
            chosen = Some(optimizer);
        }
    }
    let summary = job.finish().await.unwrap();
    assert_eq!(chosen.map(|o| o.to_string()).as_deref(), Some("gd"));
    assert_eq!(summary.bytes, data.len() as u64);
    assert_eq!(std::fs::read(root.join("data.bin")).unwrap(), data);
}
