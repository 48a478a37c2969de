//! A receiver's events ([`transfer::receiver::Receiver::subscribe`]): each session's start and
//! end with what it moved and how it ended (completed, its sender gone, ended by the
//! receiver), and refused connections; a session the receiver ends tells its sender why, and
//! the sender resumes it.

use std::time::Duration;

use transfer::auth::KeySetting;
use transfer::job::{SendEvent, SendJob};
use transfer::receiver::{ReceiverEvent, ReceiverEvents, SessionOutcome, SessionReport};
use transfer::sender::{SendError, SendSource};
use transfer::session_id::SessionId;

use crate::common::{contents, one_file, paced, run, run_past, runtime, serve, OneFile};

/// The next event, waiting up to ten seconds for it.
fn next(events: &mut ReceiverEvents) -> ReceiverEvent {
    for _ in 0..1000 {
        if let Some(event) = events.try_next() {
            return event;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no event from the receiver within 10 s");
}

/// The report of the next session to end (passing over other events).
fn ended(events: &mut ReceiverEvents) -> SessionReport {
    loop {
        if let ReceiverEvent::SessionEnded(report) = next(events) {
            return report;
        }
    }
}

#[test]
fn sessions_are_reported_from_start_to_end_and_a_wrong_key_as_refused() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let tree = src.path().join("run42");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("a.bin"), contents(1, 3 << 20)).unwrap();
    std::fs::write(tree.join("sub/b.bin"), contents(2, 1000)).unwrap();
    let mut serving = serve(root.path());

    let mut settings = paced(&serving.addr, tree.clone(), None);
    settings.source = SendSource::Paths {
        paths: vec![tree],
        destination: "incoming".into(),
    };
    let (_, result) = run(SendJob::start(settings.clone()).unwrap());
    let summary = result.unwrap();
    match next(&mut serving.events) {
        ReceiverEvent::SessionStarted {
            session,
            tenant,
            peer,
            dest,
        } => {
            assert_eq!(session, summary.session);
            assert_eq!(tenant, None, "the receiver's own key");
            assert!(peer.ip().is_loopback());
            assert_eq!(dest, "incoming");
        }
        other => panic!("expected the session's start, got {other:?}"),
    }
    let report = ended(&mut serving.events);
    assert_eq!(report.session, summary.session);
    assert_eq!(report.outcome, SessionOutcome::Completed);
    assert_eq!((report.files_announced, report.files_placed), (2, 2));
    assert_eq!(report.bytes_announced, (3 << 20) + 1000);
    assert!(report.bytes_received >= report.bytes_announced);

    // The same transfer again: everything is there already, nothing is received.
    let (_, result) = run(SendJob::start(settings.clone()).unwrap());
    let again = result.unwrap();
    assert_ne!(
        again.session, summary.session,
        "every session has its own id"
    );
    let report = ended(&mut serving.events);
    assert_eq!(report.session, again.session);
    assert_eq!(report.outcome, SessionOutcome::Completed);
    assert_eq!(report.bytes_received, 0);

    settings.key = KeySetting::Text("not-the-receivers-key-0123456789".into());
    let (_, result) = run(SendJob::start(settings).unwrap());
    assert!(matches!(result, Err(SendError::Auth { .. })), "{result:?}");
    match next(&mut serving.events) {
        ReceiverEvent::Refused { peer, reason } => {
            assert!(peer.ip().is_loopback());
            assert!(reason.contains("key"), "{reason}");
        }
        other => panic!("expected the refusal, got {other:?}"),
    }
}

#[test]
fn a_session_the_receiver_ends_tells_its_sender_why_and_resumes_later() {
    let OneFile {
        src: _src,
        root,
        file,
        data,
    } = one_file(3, 24 << 20);
    let mut serving = serve(root.path());
    assert!(
        !serving
            .stopper
            .end_session(SessionId([7; 16]), "no such session"),
        "ending a session that is not running does nothing"
    );

    // 24 MiB at 4 MB/s would take 6 s; the receiver ends it after 2 MiB.
    let job = SendJob::start(paced(&serving.addr, file.clone(), Some(4_000_000))).unwrap();
    let mut ended_session = None;
    let result = run_past(job, 2 << 20, || {
        let ReceiverEvent::SessionStarted { session, .. } = next(&mut serving.events) else {
            panic!("the session's start comes first");
        };
        assert!(serving
            .stopper
            .end_session(session, "cancelled by the portal"));
        ended_session = Some(session);
    });
    match result {
        Err(SendError::Receiver { file: None, reason }) => {
            assert!(reason.contains("cancelled by the portal"), "{reason}")
        }
        other => panic!("the sender of an ended session: {other:?}"),
    }
    let report = ended(&mut serving.events);
    assert_eq!(Some(report.session), ended_session);
    assert_eq!(
        report.outcome,
        SessionOutcome::EndedByReceiver("cancelled by the portal".into())
    );
    assert_eq!(report.files_placed, 0);
    assert!(report.bytes_received >= 2 << 20 && report.bytes_received < 24 << 20);
    assert!(!root.path().join("big.bin").exists());

    // The receiver serves on; the same transfer sends only the rest.
    let (_, result) = run(SendJob::start(paced(&serving.addr, file, None)).unwrap());
    let summary = result.unwrap();
    assert!(summary.bytes_skipped >= 2 << 20);
    assert_eq!(summary.bytes + summary.bytes_skipped, 24 << 20);
    assert!(std::fs::read(root.path().join("big.bin")).unwrap() == data);
    assert!(ended(&mut serving.events).outcome.is_completed());
}

#[test]
fn a_cancelled_sender_leaves_a_session_reported_as_disconnected() {
    let OneFile {
        src: _src,
        root,
        file,
        ..
    } = one_file(4, 16 << 20);
    let mut serving = serve(root.path());

    let mut job = SendJob::start(paced(&serving.addr, file, Some(4_000_000))).unwrap();
    let result = runtime().block_on(async {
        while let Some(event) = job.next_event().await {
            if matches!(event, SendEvent::Progress(ref p) if p.bytes_acked >= 1 << 20) {
                job.cancel();
            }
        }
        job.finish().await
    });
    assert_eq!(result.unwrap_err(), SendError::Cancelled);
    let report = ended(&mut serving.events);
    assert!(
        matches!(report.outcome, SessionOutcome::Disconnected(_)),
        "{:?}",
        report.outcome
    );
    assert!(report.bytes_received >= 1 << 20);
}
