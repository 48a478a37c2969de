//! The live optimiser on real loopback transfers: a controller that takes several intervals to
//! decide does not hold up the data, and its late decision is applied when it lands; the
//! intervals account for every byte while streams are retired and close; a controller that
//! panics ends the transfer with its message.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use optimizer::{Controller, Observation, UtilityParams};
use transfer::auth::SessionKey;
use transfer::optimizer_choice::Tuning;
use transfer::receiver::{Receiver, ReceiverSettings};
use transfer::sender::{MiRecord, SendError, SendOptions, SendSource, Transfer};

const KEY: &str = "live-optimizer-test-key-01234567";
const INTERVAL: Duration = Duration::from_millis(100);

/// Sleeps through its first decision, then asks for `streams` every time.
struct Slow {
    delay: Duration,
    streams: usize,
    calls: u32,
}

impl Controller for Slow {
    fn name(&self) -> String {
        "slow".into()
    }

    fn decide(&mut self, _observation: &Observation) -> usize {
        self.calls += 1;
        if self.calls == 1 {
            std::thread::sleep(self.delay);
        }
        self.streams
    }
}

fn receiver() -> (String, tempfile::TempDir) {
    let root = tempfile::tempdir().unwrap();
    let config = ReceiverSettings::new(
        root.path().to_path_buf(),
        SessionKey::from_text(KEY).unwrap(),
    );
    let receiver = Receiver::bind(&config.listen("127.0.0.1:0")).unwrap();
    let addr = receiver.local_addr().unwrap().to_string();
    std::thread::spawn(move || receiver.serve(None));
    (addr, root)
}

/// Switches between 4 streams and 1 every other interval.
struct Swinging;

impl Controller for Swinging {
    fn name(&self) -> String {
        "swinging".into()
    }

    fn decide(&mut self, observation: &Observation) -> usize {
        if (observation.mi / 2) % 2 == 0 {
            1
        } else {
            4
        }
    }
}

/// Sends `size` bytes of generated data over streams paced to `cap` bytes/s each, starting with
/// `streams`, under `controller`; returns the bytes acknowledged and the MI records.
fn paced_transfer(
    size: u64,
    cap: u64,
    streams: usize,
    controller: Box<dyn Controller>,
) -> (u64, Vec<MiRecord>) {
    let (addr, _root) = receiver();
    let options = SendOptions::default()
        .streams(streams)
        .unit_size(1 << 20)
        .stream_rate_cap(Some(cap));
    let key = SessionKey::from_text(KEY).unwrap();
    let transfer = Transfer::start(&addr, key, SendSource::Memory { size }, options).unwrap();
    let (tx, rx) = mpsc::channel();
    let tuning = Tuning {
        interval: INTERVAL,
        ..Tuning::default()
    };
    let utility = UtilityParams::default();
    transfer
        .optimize(controller, &tuning, utility, Some(tx))
        .unwrap();
    assert!(
        transfer
            .optimize(Box::new(optimizer::Fixed(2)), &tuning, utility, None)
            .is_err(),
        "a second controller is refused"
    );
    let summary = transfer.wait().unwrap();
    (summary.bytes, rx.try_iter().collect())
}

#[test]
fn a_slow_controller_does_not_stop_the_data_and_its_late_decision_lands() {
    let delay = INTERVAL * 6;
    let size = 240 << 20;
    // 50 MB/s per stream: about 1 s on one stream, then three streams for the rest.
    let controller = Slow {
        delay,
        streams: 3,
        calls: 0,
    };
    let (bytes, records) = paced_transfer(size, 50_000_000, 1, Box::new(controller));
    assert_eq!(bytes, size);
    let mis: Vec<u64> = records.iter().map(|r| r.observation.mi).collect();
    assert_eq!(
        mis,
        (0..records.len() as u64).collect::<Vec<_>>(),
        "one record per interval, in order"
    );
    let first = &records[0];
    assert_eq!(first.decision, Some(3));
    assert!(
        first.decision_latency.unwrap() >= delay.as_secs_f64(),
        "{first:?}"
    );
    // The intervals that ended while the controller slept: data kept flowing on one stream.
    let waited = (delay.as_secs_f64() / INTERVAL.as_secs_f64()) as usize - 1;
    for record in &records[1..waited] {
        let o = &record.observation;
        assert_eq!(
            o.streams, 1,
            "the count stays until the decision lands: {record:?}"
        );
        assert!(
            o.throughput > 100e6,
            "bytes keep being acknowledged: {record:?}"
        );
    }
    assert!(
        records[1..waited]
            .iter()
            .filter(|r| r.decision.is_none())
            .count()
            >= waited - 2,
        "intervals that ended during the delay are passed over for the newest: {records:?}"
    );
    // After the decision: three streams, and they move more data than one did.
    let after: Vec<_> = records
        .iter()
        .skip(waited + 3)
        .filter(|r| r.observation.throughput > 0.0)
        .collect();
    assert!(after.len() >= 3, "{records:?}");
    for record in &after[..after.len() - 1] {
        assert_eq!(record.observation.streams, 3, "{record:?}");
        assert!(
            record.decision.is_some() && record.decision_latency.unwrap() < INTERVAL.as_secs_f64()
        );
    }
    let mean = |rs: &[&MiRecord]| {
        rs.iter().map(|r| r.observation.throughput).sum::<f64>() / rs.len() as f64
    };
    let before: Vec<_> = records[1..waited].iter().collect();
    assert!(
        mean(&after[..after.len() - 1]) > 2.0 * mean(&before),
        "{records:?}"
    );
}

#[test]
fn the_intervals_count_the_data_of_streams_that_closed_in_them() {
    // 10 MB/s per stream, 4 streams and 1 in turn: every other interval retires three streams,
    // which finish their unit of 1 MiB and close between two samples.
    let size = 40 << 20;
    let (bytes, records) = paced_transfer(size, 10_000_000, 4, Box::new(Swinging));
    assert_eq!(bytes, size);
    let mut measured = 0.0;
    let mut previous = None;
    for record in &records {
        let o = &record.observation;
        let duration = previous.map_or(INTERVAL.as_secs_f64(), |t| o.time - t);
        measured += o.throughput * duration / 8.0;
        previous = Some(o.time);
    }
    assert!(
        records
            .iter()
            .filter(|r| r.observation.retiring > 0)
            .count()
            >= 3,
        "the intervals in which retired streams closed say so: {records:?}"
    );
    // What the streams carried before the first interval and after the last one (a unit at
    // most on each stream) is not measured; nothing is counted twice.
    let ratio = measured / size as f64;
    assert!(
        (0.93..1.03).contains(&ratio),
        "the intervals measured {measured:.0} of {size} bytes ({ratio:.3}): {records:?}"
    );
}

/// Panics at its first decision, as a service's own controller with a bug might.
struct Panicking;

impl Controller for Panicking {
    fn name(&self) -> String {
        "panicking".into()
    }

    fn decide(&mut self, _observation: &Observation) -> usize {
        panic!("no decision today")
    }
}

/// A controller that panics ends the transfer at once with an error that names the thread and
/// the panic, instead of leaving it at its last count without a word (before, this transfer
/// ran its 50 s to the end and reported success).
#[test]
fn a_controller_that_panics_ends_the_transfer_with_its_message() {
    let (addr, _root) = receiver();
    // 1 GiB at 20 MB/s: 50 s if nothing stopped it.
    let options = SendOptions::default()
        .streams(1)
        .stream_rate_cap(Some(20_000_000));
    let key = SessionKey::from_text(KEY).unwrap();
    let size = 1 << 30;
    let transfer = Transfer::start(&addr, key, SendSource::Memory { size }, options).unwrap();
    let tuning = Tuning {
        interval: INTERVAL,
        ..Tuning::default()
    };
    let utility = UtilityParams::default();
    transfer
        .optimize(Box::new(Panicking), &tuning, utility, None)
        .unwrap();
    let started = Instant::now();
    let err = transfer.wait().unwrap_err();
    assert!(
        matches!(&err, SendError::Internal(m) if m.contains("xfer-decide") && m.contains("no decision today")),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}
