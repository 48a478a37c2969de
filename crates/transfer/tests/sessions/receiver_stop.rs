//! A receiver asked to stop ([`transfer::receiver::Stopper`]): sessions running finish within
//! the grace period while new ones are refused with the reason, and serving ends once none is
//! left; a session still running after the grace period is ended with the reason, and its
//! sender, started again against the next receiver on the same root, sends only the rest.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use transfer::job::SendJob;
use transfer::sender::SendError;
use transfer::wire::Limit;

use crate::common::{contents, one_file, paced, run, run_past, serve, OneFile, Serving};

/// Waits up to `limit` for `serving` to return.
fn ends_within(serving: JoinHandle<std::io::Result<()>>, limit: Duration) {
    let started = Instant::now();
    while !serving.is_finished() {
        assert!(
            started.elapsed() < limit,
            "serving did not end within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    serving.join().unwrap().unwrap();
}

#[test]
fn a_stopping_receiver_finishes_running_sessions_refuses_new_ones_and_ends() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let (first, second) = (src.path().join("first.bin"), src.path().join("second.bin"));
    let data = contents(1, 12 << 20);
    std::fs::write(&first, &data).unwrap();
    std::fs::write(&second, contents(2, 1 << 20)).unwrap();
    let Serving {
        addr,
        stopper,
        thread: serving,
        ..
    } = serve(root.path());

    // 12 MiB at 8 MB/s: the stop comes about a second and a half before the end.
    let job = SendJob::start(paced(&addr, first, Some(8_000_000))).unwrap();
    let mut refused = None;
    let result = run_past(job, 2 << 20, || {
        stopper.stop(Duration::from_secs(60));
        let job = SendJob::start(paced(&addr, second, None)).unwrap();
        refused = Some(std::thread::spawn(move || run(job).1).join().unwrap());
    });
    let summary = result.unwrap();
    assert_eq!(summary.bytes, 12 << 20);
    assert!(std::fs::read(root.path().join("first.bin")).unwrap() == data);
    match refused.unwrap() {
        Err(SendError::Limited {
            limit: Limit::ShuttingDown,
            addr: refused_by,
        }) => assert_eq!(refused_by, addr),
        other => panic!("a new session while stopping: {other:?}"),
    }
    assert!(!root.path().join("second.bin").exists());
    ends_within(serving, Duration::from_secs(5));
}

#[test]
fn a_session_left_after_the_grace_period_is_ended_and_resumes_at_the_next_receiver() {
    let OneFile {
        src: _src,
        root,
        file,
        data,
    } = one_file(3, 24 << 20);
    let Serving {
        addr,
        stopper,
        thread: serving,
        ..
    } = serve(root.path());

    // 24 MiB at 4 MB/s would take 6 s; the grace period is half a second.
    let job = SendJob::start(paced(&addr, file.clone(), Some(4_000_000))).unwrap();
    let stopped_at = std::cell::Cell::new(None);
    let result = run_past(job, 2 << 20, || {
        stopper.stop(Duration::from_millis(500));
        stopped_at.set(Some(Instant::now()));
    });
    match result {
        Err(SendError::Receiver { file: None, reason }) => {
            assert!(reason.contains("shutting down"), "{reason}")
        }
        other => panic!("a session past the grace period: {other:?}"),
    }
    let ended = stopped_at.get().unwrap().elapsed();
    assert!(
        ended < Duration::from_secs(4),
        "ended {ended:?} after the stop"
    );
    ends_within(serving, Duration::from_secs(5));
    assert!(!root.path().join("big.bin").exists());

    let addr = serve(root.path()).addr;
    let (_, result) = run(SendJob::start(paced(&addr, file, None)).unwrap());
    let summary = result.unwrap();
    assert!(
        summary.bytes_skipped >= 2 << 20 && summary.bytes + summary.bytes_skipped == 24 << 20,
        "{} sent, {} already there",
        summary.bytes,
        summary.bytes_skipped
    );
    assert!(std::fs::read(root.path().join("big.bin")).unwrap() == data);
}
