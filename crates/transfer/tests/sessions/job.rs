//! The service API ([`transfer::job`]): a job built from a configuration file sends a tree
//! byte-identical while reporting progress, its streams' counters and the optimiser's
//! decisions; a cancelled job ends
//! with `Cancelled` and a second run sends only the rest; bad settings are refused before
//! anything is sent, and an unreachable receiver is named; a sender whose control connection is
//! closed at once tries again; errors name the file, the receiver and the limit they concern;
//! streams refused because the session ended while they connected do not fail it.

use std::path::PathBuf;
use std::time::Duration;

use transfer::auth::KeySetting;
use transfer::job::{SendEvent, SendJob, SenderSettings};
use transfer::receiver::{Receiver, ReceiverSettings};
use transfer::sender::SendError;
use transfer::wire::Limit;
use transfer::SendSource;

use crate::common::{
    contents, explain, one_file, paced, run, run_past, runtime, serve, start_receiver, OneFile, KEY,
};

#[test]
fn a_job_from_a_config_file_sends_a_tree_byte_identical_and_reports_what_it_does() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let tree = src.path().join("run42");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    let files = [
        ("a.bin", 12 << 20),
        ("sub/b.bin", 7 << 20),
        ("sub/empty", 0),
    ];
    for (i, (name, len)) in files.iter().enumerate() {
        std::fs::write(tree.join(name), contents(i as u64, *len)).unwrap();
    }
    let addr = start_receiver(root.path());
    // 4 streams paced at 16 MB/s each: about 0.3 s, so that 0.05 s intervals are decided.
    let config = format!(
        r#"
        receiver = "{addr}"
        key = {{ text = "{KEY}" }}
        source = {{ paths = ["{}"], destination = "incoming" }}
        progress_every = "20ms"
        [tuning]
        interval = "50ms"
        [options]
        stream_rate_cap = 16000000
        unit_size = 262144
        verify = true
        "#,
        tree.display()
    );
    let settings: SenderSettings = toml::from_str(&config).unwrap();
    assert_eq!(settings.optimizer, None);
    assert!(
        !format!("{settings:?}").contains(KEY),
        "the key is kept out of Debug"
    );
    let (events, result) = run(SendJob::start(settings).unwrap());

    let summary = result.unwrap();
    assert_eq!(summary.bytes, 19 << 20);
    assert_eq!(summary.files, 3);
    for (i, (name, len)) in files.iter().enumerate() {
        let got = std::fs::read(root.path().join("incoming/run42").join(name)).unwrap();
        assert!(got == contents(i as u64, *len), "{name} differs");
    }
    assert!(
        matches!(&events[0], SendEvent::Started { optimizer, .. } if optimizer == "auto"),
        "{:?}",
        events[0]
    );
    assert_eq!(events.last(), Some(&SendEvent::Finished(Ok(summary))));
    let progress: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            SendEvent::Progress(p) => Some(p.bytes_acked),
            _ => None,
        })
        .collect();
    assert!(progress.len() >= 2, "{} progress events", progress.len());
    assert!(progress.windows(2).all(|w| w[0] <= w[1]), "{progress:?}");
    // Each progress snapshot comes with its streams' counters, and only with it, but for the
    // last, as the transfer ended, which comes just before the end.
    let last_progress = events
        .iter()
        .rposition(|e| matches!(e, SendEvent::Progress(_)))
        .unwrap();
    assert!(
        matches!(
            events.get(last_progress + 1),
            Some(SendEvent::Finished(Ok(_)))
        ),
        "{:?}",
        &events[last_progress..]
    );
    if let SendEvent::Progress(p) = &events[last_progress] {
        assert_eq!(
            p.bytes_acked, p.bytes_total,
            "the last snapshot is of the end"
        );
    }
    for (i, event) in events.iter().enumerate() {
        let follows_progress = i > 0 && matches!(events[i - 1], SendEvent::Progress(_));
        match event {
            SendEvent::Streams(streams) => {
                assert!(follows_progress, "{:?} before {event:?}", events[i - 1]);
                assert!(
                    streams.len() <= 64 && streams.iter().all(|s| s.stream >= 1),
                    "{streams:?}"
                );
            }
            SendEvent::Progress(_) if i != last_progress => {
                assert!(matches!(events.get(i + 1), Some(SendEvent::Streams(_))))
            }
            _ => {}
        }
    }
    let sampled = events
        .iter()
        .any(|e| matches!(e, SendEvent::Streams(s) if s.iter().any(|s| s.tcp.bytes_acked > 0)));
    assert!(sampled, "no stream's counters among {events:?}");
    let decisions = events
        .iter()
        .filter(|e| matches!(e, SendEvent::Decision(mi) if mi.controller == "auto"))
        .count();
    assert!(decisions >= 1, "no decision among {events:?}");
}

#[test]
fn a_cancelled_job_ends_cancelled_and_the_next_run_sends_only_the_rest() {
    let OneFile {
        src: _src,
        root,
        file,
        data,
    } = one_file(7, 24 << 20);
    let addr = start_receiver(root.path());
    let mut settings = SenderSettings::new(
        addr,
        KeySetting::Text(KEY.into()),
        SendSource::Paths {
            paths: vec![file.clone()],
            destination: PathBuf::new(),
        },
    );
    settings.optimizer = Some("fixed:1".parse().unwrap());
    settings.options.streams = 1;
    settings.options.unit_size = 1 << 20;
    // One stream at 8 MB/s: 3 s for the whole file, cancelled after the first units.
    settings.options.stream_rate_cap = Some(8_000_000);
    settings.progress_every = Duration::from_millis(20);

    let mut job = SendJob::start(settings.clone()).unwrap();
    let (cancelled_at, result) = runtime().block_on(async {
        let mut acked = 0;
        while let Some(event) = job.next_event().await {
            if let SendEvent::Progress(p) = event {
                if p.bytes_acked >= 2 << 20 {
                    acked = p.bytes_acked;
                    job.cancel();
                    break;
                }
            }
        }
        (acked, job.finish().await)
    });
    assert_eq!(result, Err(SendError::Cancelled));
    assert!(cancelled_at >= 2 << 20);
    assert!(
        !root.path().join("big.bin").exists(),
        "a cancelled file is not in place"
    );

    settings.options.stream_rate_cap = None;
    let (_, result) = run(SendJob::start(settings).unwrap());
    let summary = result.unwrap();
    assert!(
        summary.bytes_skipped >= 2 << 20 && summary.bytes + summary.bytes_skipped == 24 << 20,
        "second run: {} sent, {} already there",
        summary.bytes,
        summary.bytes_skipped
    );
    assert!(std::fs::read(root.path().join("big.bin")).unwrap() == data);
}

#[test]
fn a_controller_that_names_its_count_starts_the_transfer_at_it() {
    let root = tempfile::tempdir().unwrap();
    let addr = start_receiver(root.path());
    // (controller, most streams allowed, the count the transfer must start at)
    for (optimizer, max_streams, first) in [
        ("fixed:3", 64, 3),
        ("schedule:0s:2,10s:6", 64, 2),
        ("fixed:8", 5, 5),
    ] {
        let mut settings = SenderSettings::new(
            addr.clone(),
            KeySetting::Text(KEY.into()),
            SendSource::Memory { size: 64 << 20 },
        );
        settings.optimizer = Some(optimizer.parse().unwrap());
        settings.tuning.max_streams = max_streams;
        assert_eq!(settings.options.streams, transfer::sender::DEFAULT_STREAMS);
        let (_, result) = run(SendJob::start(settings).unwrap());
        let summary = result.unwrap();
        assert_eq!(
            summary.streams_timeline.first().map(|&(_, n)| n),
            Some(first),
            "{optimizer}: {:?}",
            summary.streams_timeline
        );
    }
}

#[test]
fn a_job_cancelled_before_it_connects_sends_nothing() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("f"), contents(3, 1 << 20)).unwrap();
    let addr = start_receiver(root.path());
    let settings = SenderSettings::new(
        addr,
        KeySetting::Text(KEY.into()),
        SendSource::Paths {
            paths: vec![src.path().join("f")],
            destination: PathBuf::new(),
        },
    );
    let job = SendJob::start(settings).unwrap();
    job.cancel();
    let (events, result) = run(job);
    assert_eq!(result, Err(SendError::Cancelled), "{events:?}");
    assert!(!root.path().join("f").exists());
}

#[test]
fn bad_settings_are_refused_before_anything_is_sent_and_a_silent_receiver_is_named() {
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("f"), b"x").unwrap();
    let base =
        "receiver = \"127.0.0.1:9\"\nkey = { text = \"job-api-test-key-0123456789abcdef\" }\n";
    let parse = |extra: &str| toml::from_str::<SenderSettings>(&format!("{base}{extra}"));
    // Mistakes in the file name the field.
    for (extra, says) in [
        (
            "source = { paths = [\"f\"] }\noptimizer = \"ppx\"",
            "unknown optimizer \"ppx\"",
        ),
        (
            "source = { paths = [\"f\"] }\n[options]\nstrems = 3",
            "unknown field `strems`",
        ),
        ("source = { files = [\"f\"] }", "unknown field `files`"),
        ("", "missing field `source`"),
        (
            "source = { paths = [\"f\"] }\n[options]\ntransport = \"udp\"",
            "udp",
        ),
        (
            "source = { memory = 10, destination = \"x\" }",
            "discarding sink",
        ),
        (
            "source = { paths = [\"f\"] }\nprogress_every = -1",
            "a time like",
        ),
    ] {
        let err = parse(extra).err().unwrap().to_string();
        assert!(err.contains(says), "{extra:?}: {err}");
    }
    // Settings that parse but cannot work are refused by start.
    let paths = |extra: &str| {
        parse(&format!(
            "source = {{ paths = [\"{}\"] }}\n{extra}",
            src.path().join("f").display()
        ))
        .unwrap()
    };
    for (settings, says) in [
        (parse("source = { paths = [] }").unwrap(), "names no path"),
        (paths("[options]\nstreams = 0"), "at least 1"),
        (
            paths("progress_every = 0"),
            "progress_every must be longer than zero",
        ),
        (paths("[tuning]\nk = 0.5"), "K=0.5"),
        (
            paths("optimizer = \"ppo:/nonexistent/model\""),
            "/nonexistent/model",
        ),
        (
            {
                let mut settings = paths("");
                settings.key = KeySetting::File("/nonexistent/key".into());
                settings
            },
            "/nonexistent/key",
        ),
    ] {
        let err = explain(&SendJob::start(settings).err().unwrap());
        assert!(err.contains(says), "{says}: {err}");
    }
    // Nobody listens on the discard port of loopback.
    let (events, result) = run(SendJob::start(paths("")).unwrap());
    assert!(
        matches!(&result, Err(SendError::Connect { addr, .. }) if addr == "127.0.0.1:9"),
        "{result:?}"
    );
    assert_eq!(events.last(), Some(&SendEvent::Finished(result)));
}

/// A relay to `upstream` that closes the first `drop_first` connections as soon as they
/// arrive, as a receiver busy authenticating others does; its address.
fn closing_relay(upstream: String, drop_first: usize) -> String {
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for (n, client) in listener.incoming().enumerate() {
            let client = client.unwrap();
            if n < drop_first {
                // A reset, not a polite end: what a receiver that closes at once sends when
                // data has already arrived.
                socket2::SockRef::from(&client)
                    .set_linger(Some(std::time::Duration::ZERO))
                    .unwrap();
                drop(client);
                continue;
            }
            let server = TcpStream::connect(&upstream).unwrap();
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
    addr
}

#[test]
fn a_sender_tries_again_when_the_receiver_closes_the_control_connection_at_once() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let file = src.path().join("f.bin");
    let data = contents(9, 3 << 20);
    std::fs::write(&file, &data).unwrap();
    let upstream = start_receiver(root.path());
    let settings = |addr: String| {
        let mut settings = SenderSettings::new(
            addr,
            KeySetting::Text(KEY.into()),
            SendSource::Paths {
                paths: vec![file.clone()],
                destination: PathBuf::new(),
            },
        );
        settings.optimizer = Some("fixed:2".parse().unwrap());
        settings
    };

    // Three closed attempts, then through.
    let (_, result) = run(SendJob::start(settings(closing_relay(upstream.clone(), 3))).unwrap());
    assert_eq!(result.unwrap().bytes, 3 << 20);
    assert!(std::fs::read(root.path().join("f.bin")).unwrap() == data);

    // Closed every time: the sender gives up, saying so.
    std::fs::remove_file(root.path().join("f.bin")).unwrap();
    let relay = closing_relay(upstream, usize::MAX);
    let (_, result) = run(SendJob::start(settings(relay.clone())).unwrap());
    match result {
        Err(SendError::Connection { addr, cause }) => {
            assert_eq!(addr, relay);
            assert!(cause.to_string().contains("reset"), "{cause}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn errors_name_the_file_the_receiver_and_the_limit_they_concern() {
    let OneFile {
        src, root, file, ..
    } = one_file(5, 8 << 20);
    let serving = serve(root.path());

    // A directory appears where the file is to go while it is on its way: the receiver cannot
    // put it in place, and the error says which file.
    let job = SendJob::start(paced(&serving.addr, file.clone(), Some(8_000_000))).unwrap();
    let result = run_past(job, 1 << 20, || {
        std::fs::create_dir(root.path().join("big.bin")).unwrap();
    });
    match result {
        Err(SendError::Receiver {
            file: Some(file),
            reason,
        }) => {
            assert_eq!(file, "big.bin");
            assert!(reason.contains("a directory is in the way"), "{reason}");
        }
        other => panic!("a file that cannot be put in place: {other:?}"),
    }

    // A source that cannot be read is named.
    let (_, result) =
        run(SendJob::start(paced(&serving.addr, src.path().join("gone"), None)).unwrap());
    match result {
        Err(SendError::Source { path, .. }) => assert!(path.ends_with("gone"), "{path}"),
        other => panic!("a missing source: {other:?}"),
    }

    // A receiver serving its most sessions refuses one more, saying which limit.
    let busy_root = tempfile::tempdir().unwrap();
    let mut config = ReceiverSettings::new(
        busy_root.path().into(),
        transfer::auth::SessionKey::from_text(KEY).unwrap(),
    );
    config.options.max_sessions = 1;
    let receiver = Receiver::bind(&config.listen("127.0.0.1:0")).unwrap();
    let addr = receiver.local_addr().unwrap().to_string();
    std::thread::spawn(move || receiver.serve(None));
    let slow = SendJob::start(paced(&addr, file.clone(), Some(4_000_000))).unwrap();
    let mut second = None;
    let first = run_past(slow, 1 << 20, || {
        let job = SendJob::start(paced(&addr, file.clone(), None)).unwrap();
        second = Some(std::thread::spawn(move || run(job).1).join().unwrap());
    });
    assert_eq!(first.unwrap().bytes, 8 << 20);
    match second.unwrap() {
        Err(SendError::Limited {
            addr: refused_by,
            limit: Limit::Sessions { max: 1 },
        }) => assert_eq!(refused_by, addr),
        other => panic!("a session over the limit: {other:?}"),
    }
}

#[test]
fn streams_still_connecting_when_the_receiver_ends_the_session_do_not_fail_it() {
    // A small file is done by the first stream to connect; the receiver answers `Done` and
    // forgets the session while the other streams are still in their handshakes, and refuses
    // them as belonging to no session (or exits). Those refusals come after everything
    // arrived: the transfer succeeds. Many streams and several runs make the overlap near
    // certain.
    let OneFile {
        src: _src,
        root,
        file,
        data,
    } = one_file(11, 4096);
    // Sends the file over 48 streams to `addr` as `destination`; it must arrive whole.
    let send = |addr: &str, destination: String| {
        let mut settings = paced(addr, file.clone(), None);
        settings.optimizer = Some("fixed:48".parse().unwrap());
        settings.options.streams = 48;
        settings.source = SendSource::Paths {
            paths: vec![file.clone()],
            destination: destination.clone().into(),
        };
        let (_, result) = run(SendJob::start(settings).unwrap());
        let summary = result.unwrap_or_else(|e| panic!("{destination}: {e}"));
        assert_eq!(summary.bytes, data.len() as u64);
        let landed = std::fs::read(root.path().join(&destination).join("big.bin")).unwrap();
        assert!(landed == data, "{destination}: the file differs");
    };
    let serving = serve(root.path());
    for run_no in 0..20 {
        send(&serving.addr, format!("run{run_no}"));
    }
    // A receiver that serves one session (`xfer recv --once`) closes its port after `Done`:
    // the late streams' connections are refused outright.
    for run_no in 0..10 {
        let config = ReceiverSettings::new(
            root.path().into(),
            transfer::auth::SessionKey::from_text(KEY).unwrap(),
        );
        let receiver = Receiver::bind(&config.listen("127.0.0.1:0")).unwrap();
        let addr = receiver.local_addr().unwrap().to_string();
        let once = std::thread::spawn(move || receiver.serve(Some(1)));
        send(&addr, format!("once{run_no}"));
        once.join().unwrap().unwrap();
    }
}
