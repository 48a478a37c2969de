//! A controller of one's own plugged into the optimiser: it sees the signals of every
//! monitoring interval (throughput, loss, RTT ratio and gradient, utility) and returns the
//! stream count for the next. This one climbs by one stream while the utility grows by more
//! than 5 % and steps back when it falls; a transfer runs it in place of a named optimiser.
//!
//! `cargo run --release -p transfer --example custom_controller`

use std::time::Duration;

use transfer::auth::{KeySetting, SessionKey};
use transfer::job::{SendEvent, SendJob, SenderSettings};
use transfer::optimizer::{Controller, Observation};
use transfer::receiver::{Receiver, ReceiverSettings};
use transfer::SendSource;

/// Adds a stream while that pays, steps back once when it stops paying, then holds.
struct Climb {
    best: f64,
    holding: bool,
}

impl Controller for Climb {
    fn name(&self) -> String {
        "climb".into()
    }

    fn decide(&mut self, interval: &Observation) -> usize {
        let n = interval.streams.max(1);
        if self.holding {
            return n;
        }
        if interval.utility > self.best * 1.05 {
            self.best = interval.utility;
            return n + 1;
        }
        self.holding = true;
        (n - 1).max(1)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = tempfile::tempdir()?;
    let (key_text, key) = SessionKey::generate();
    let receiver =
        Receiver::bind(&ReceiverSettings::new(root.path().into(), key).listen("127.0.0.1:0"))?;
    let addr = receiver.local_addr()?.to_string();
    std::thread::spawn(move || receiver.serve(None));

    // 200 MB of generated data; each stream paced at 40 MB/s, so more streams pay.
    let mut settings = SenderSettings::new(
        addr,
        KeySetting::Text(key_text),
        SendSource::Memory { size: 200_000_000 },
    );
    settings.options.streams = 1;
    settings.options.stream_rate_cap = Some(40_000_000);
    settings.tuning.interval = Duration::from_millis(200);
    let controller = Climb {
        best: 0.0,
        holding: false,
    };
    let mut job = SendJob::start_with(settings, Box::new(controller))?;
    let mut most = 0;
    while let Some(event) = job.next_event().await {
        if let SendEvent::Decision(mi) = event {
            println!(
                "{}: {:>6.0} Mbit/s on {} streams, utility {:>6.0} Mbit/s -> {:?}",
                mi.controller,
                mi.observation.throughput / 1e6,
                mi.observation.streams,
                mi.observation.utility / 1e6,
                mi.decision
            );
            most = most.max(mi.decision.unwrap_or(0));
        }
    }
    let summary = job.finish().await?;
    println!(
        "sent {} bytes at {:.2} Gbit/s, up to {most} streams",
        summary.bytes,
        summary.gbit_per_s()
    );
    if most < 2 {
        return Err("the controller never added a stream".into());
    }
    Ok(())
}
