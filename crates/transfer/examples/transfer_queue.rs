//! A data-movement service in miniature: a queue of transfers run at most `CONCURRENCY` at a
//! time, each reporting its progress under its own name, one of them cancelled by the
//! service; at the end, what each transfer came to.
//!
//! `cargo run --release -p transfer --example transfer_queue`

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use transfer::auth::{KeySetting, SessionKey};
use transfer::job::{SendEvent, SendJob, SenderSettings};
use transfer::receiver::{Receiver, ReceiverSettings};
use transfer::sender::SendError;
use transfer::SendSource;

/// Transfers running at once.
const CONCURRENCY: usize = 3;
/// Transfers in the queue.
const QUEUED: usize = 8;
/// The transfer the service cancels (as a user would from a portal).
const CANCELLED: usize = 5;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let work = tempfile::tempdir()?;
    let root = work.path().join("root");
    std::fs::create_dir_all(&root)?;
    let (key_text, key) = SessionKey::generate();
    let receiver = Receiver::bind(&ReceiverSettings::new(root.clone(), key).listen("127.0.0.1:0"))?;
    let addr = receiver.local_addr()?.to_string();
    std::thread::spawn(move || receiver.serve(None));

    let limit = Arc::new(Semaphore::new(CONCURRENCY));
    let mut running = JoinSet::new();
    for n in 0..QUEUED {
        let dataset = work.path().join(format!("dataset-{n}"));
        std::fs::create_dir_all(&dataset)?;
        std::fs::write(dataset.join("data.bin"), vec![n as u8; (4 + n) << 20])?;
        let mut settings = SenderSettings::new(
            addr.clone(),
            KeySetting::Text(key_text.clone()),
            SendSource::Paths {
                paths: vec![dataset],
                destination: format!("user-{}", n % 2).into(),
            },
        );
        settings.optimizer = Some("fixed:2".parse()?);
        settings.options.stream_rate_cap = Some(4_000_000);
        settings.progress_every = Duration::from_millis(200);
        let limit = limit.clone();
        running.spawn(async move {
            let _slot = limit
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            let mut job = SendJob::start(settings)?;
            let mut cancelled = false;
            while let Some(event) = job.next_event().await {
                if let SendEvent::Progress(p) = event {
                    println!(
                        "transfer {n}: {} MiB of {} MiB",
                        p.bytes_acked >> 20,
                        p.bytes_total >> 20
                    );
                    // On the first data handed to the sockets, not the first acknowledged:
                    // acknowledgements come a whole 4 MiB unit at a time, and on a busy
                    // machine the last of them can arrive between two progress reports.
                    if n == CANCELLED && p.bytes_sent > 0 && !cancelled {
                        println!("transfer {n}: cancelled by the service");
                        job.cancel();
                        cancelled = true;
                    }
                }
            }
            Ok::<_, SendError>((n, job.finish().await))
        });
    }

    let mut results = Vec::new();
    while let Some(joined) = running.join_next().await {
        results.push(joined??);
    }
    results.sort_by_key(|(n, _)| *n);
    for (n, result) in &results {
        match result {
            Ok(summary) => println!(
                "transfer {n}: {} bytes in {:.2} s",
                summary.bytes, summary.seconds
            ),
            Err(e) => println!("transfer {n}: {e}"),
        }
    }
    let completed = results.iter().filter(|(_, r)| r.is_ok()).count();
    let cancelled = results
        .iter()
        .filter(|(_, r)| *r == Err(SendError::Cancelled))
        .count();
    println!("{completed} completed, {cancelled} cancelled");
    if completed != QUEUED - 1 || cancelled != 1 {
        return Err(
            "expected every transfer but one to complete and that one to be cancelled".into(),
        );
    }
    for (n, _) in results.iter().filter(|(_, r)| r.is_ok()) {
        let landed = root.join(format!("user-{}/dataset-{n}/data.bin", n % 2));
        if std::fs::read(&landed)? != vec![*n as u8; (4 + n) << 20] {
            return Err(format!("{} differs from its source", landed.display()).into());
        }
    }
    println!("every completed transfer arrived byte-identical");
    Ok(())
}
