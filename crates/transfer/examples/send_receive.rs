//! A minimal send/receive pair: a receiver serving a directory on loopback, and a job that
//! sends a small tree to it with the default optimiser, printing progress and the
//! optimiser's decisions, then checks that every byte arrived and that the receiver's report
//! of the session (from its event stream) says the same.
//!
//! `cargo run --release -p transfer --example send_receive`

use std::time::Duration;

use transfer::auth::{KeySetting, SessionKey};
use transfer::job::{SendEvent, SendJob, SenderSettings};
use transfer::receiver::{Receiver, ReceiverEvent, ReceiverSettings};
use transfer::SendSource;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let work = tempfile::tempdir()?;
    let (source, root) = (work.path().join("source"), work.path().join("root"));
    std::fs::create_dir_all(source.join("results"))?;
    std::fs::create_dir_all(&root)?;
    for (name, mib) in [("results/a.h5", 24), ("results/b.h5", 8), ("log.txt", 1)] {
        let data: Vec<u8> = (0..mib << 20).map(|i: usize| (i % 251) as u8).collect();
        std::fs::write(source.join(name), data)?;
    }

    // The receiver: a key (the text is what `xfer recv` prints), a root, a port.
    let (key_text, key) = SessionKey::generate();
    let receiver = Receiver::bind(&ReceiverSettings::new(root.clone(), key).listen("127.0.0.1:0"))?;
    let addr = receiver.local_addr()?.to_string();
    let mut receiver_events = receiver.subscribe();
    std::thread::spawn(move || receiver.serve(None));

    // The sender: settings as a service would keep them, then a job observed to its end.
    let mut settings = SenderSettings::new(
        addr,
        KeySetting::Text(key_text),
        SendSource::Paths {
            paths: vec![source.clone()],
            destination: "incoming".into(),
        },
    );
    settings.tuning.interval = Duration::from_millis(100);
    settings.progress_every = Duration::from_millis(100);
    // Paced so that the optimiser has some intervals to decide on.
    settings.options.stream_rate_cap = Some(25_000_000);
    let mut job = SendJob::start(settings)?;
    while let Some(event) = job.next_event().await {
        match event {
            SendEvent::Started {
                session,
                transport,
                optimizer,
            } => println!(
                "session {session} started over {transport}, {optimizer} chooses the stream count"
            ),
            SendEvent::Progress(p) => println!(
                "{:>5.2} s  {:>9} of {} bytes  {} streams",
                p.elapsed.as_secs_f64(),
                p.bytes_acked,
                p.bytes_total,
                p.streams_active
            ),
            SendEvent::Decision(mi) => println!(
                "interval {}: {:.0} Mbit/s on {} streams -> {:?}",
                mi.observation.mi,
                mi.observation.throughput / 1e6,
                mi.observation.streams,
                mi.decision
            ),
            SendEvent::Notice(notice) => println!("notice: {notice}"),
            // The end (`Finished`), and kinds of event a later library brings.
            _ => {}
        }
    }
    let summary = job.finish().await?;
    println!(
        "sent {} bytes in {} files at {:.2} Gbit/s",
        summary.bytes,
        summary.files,
        summary.gbit_per_s()
    );
    for name in ["results/a.h5", "results/b.h5", "log.txt"] {
        let landed = root.join("incoming/source").join(name);
        if std::fs::read(&landed)? != std::fs::read(source.join(name))? {
            return Err(format!("{} differs from its source", landed.display()).into());
        }
    }
    println!("every file arrived byte-identical");

    // What the receiver says of the same session.
    let report = loop {
        match receiver_events.next().await {
            Some(ReceiverEvent::SessionEnded(report)) => break report,
            Some(other) => println!("receiver: {other:?}"),
            None => return Err("the receiver ended without reporting the session".into()),
        }
    };
    println!(
        "receiver: session {} from {} {}: {} files placed, {} bytes received",
        report.session, report.peer, report.outcome, report.files_placed, report.bytes_received
    );
    if report.session != summary.session
        || !report.outcome.is_completed()
        || report.files_placed != summary.files
        || report.bytes_received < summary.bytes
    {
        return Err("the receiver's report differs from the sender's summary".into());
    }
    Ok(())
}
