//! Pair tests: the sender's rules against the receiver's, with the receiver's files in
//! memory, no socket, no thread and no clock.
//!
//! The control session: the sender's rules ([`Planner`]) against the receiver's
//! ([`ControlSession`]). The exchange runs as the live one does: the sender announces its
//! manifest a batch at a time, the receiver plans each batch from what it holds, the ranges the
//! sender queues "arrive" whole, each file is sealed once all of it arrived, and the session
//! finishes once every file is in place. A fault between the two (a message dropped, changed
//! or invented) is injected by a hook on the receiver's replies, and each side must refuse what
//! it cannot accept.
//!
//! The data streams, in simulated time: several streams take units from one [`WorkQueue`],
//! each unit's answer comes back after its stream's delay and is matched by the stream's
//! [`Unanswered`]; a slow stream's units are carried again by idle ones at the tail, a chunk
//! that arrives damaged is sent again, a stream that breaks hands its units to the others, and
//! streams added and retired mid-transfer (as the optimiser changes the count) start and end
//! cleanly.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::manifest::{FileEntry, ManifestBatch, Timestamp};
use crate::receiver::control::memory::Files;
use crate::receiver::control::{ControlSession, SessionFiles};
use crate::sender::answers::{Answer, Unanswered};
use crate::sender::control_session::{Action, Announced, Planner};
use crate::sender::work_queue::{Next, Unit, WorkQueue};
use crate::sender::SendError;
use crate::wire::{Message, PresentFiles};

/// The sender's manifest: files of these paths and sizes, announced `batch` at a time.
struct Manifest {
    files: Vec<(String, u64)>,
    batch: usize,
    /// Files announced so far.
    announced: usize,
}

impl Announced for Manifest {
    fn announced(&self) -> (u64, bool) {
        (self.announced as u64, self.announced == self.files.len())
    }

    fn size(&self, file: u32) -> Result<u64, SendError> {
        match self.files.get(file as usize) {
            Some((_, size)) if (file as usize) < self.announced => Ok(*size),
            _ => Err(SendError::Protocol(format!(
                "file {file} is not waiting to be sent"
            ))),
        }
    }

    fn share(&self, _file: u32) -> Result<Option<Vec<std::ops::Range<u64>>>, SendError> {
        Ok(None)
    }

    fn shown(&self, file: u32) -> String {
        self.files
            .get(file as usize)
            .map_or_else(|| format!("file {file}"), |(path, _)| path.clone())
    }
}

impl Manifest {
    fn new(files: &[(&str, u64)], batch: usize) -> Manifest {
        Manifest {
            files: files.iter().map(|&(p, s)| (p.to_string(), s)).collect(),
            batch,
            announced: 0,
        }
    }

    /// The next batch to announce, if any is left.
    fn next_batch(&mut self) -> Option<Message> {
        if self.announced == self.files.len() && self.announced > 0 {
            return None;
        }
        let end = (self.announced + self.batch).min(self.files.len());
        let time = Timestamp { secs: 0, nanos: 0 };
        let files = self.files[self.announced..end]
            .iter()
            .map(|(path, size)| FileEntry {
                path: path.as_bytes().to_vec(),
                size: *size,
                mode: 0o644,
                mtime: time,
                ctime: time,
                inode: 0,
            })
            .collect();
        self.announced = end;
        Some(Message::Entries(ManifestBatch {
            dirs: Vec::new(),
            files,
            last: end == self.files.len(),
        }))
    }
}

/// How one session between the two ended, and what crossed.
#[derive(Debug)]
struct Run {
    /// The sender's end: completed, or its error.
    sender: Result<(), SendError>,
    /// The receiver's end, if it reached one.
    receiver: Option<Result<(), String>>,
    /// Bytes the sender counted to send, and counted as held already.
    to_send: u64,
    skipped: u64,
    /// Bytes that crossed on the (simulated) data streams.
    sent: u64,
    settled: Vec<u32>,
}

/// Runs one session of `manifest` into `files`; `tamper` sees every reply of the receiver and
/// may change it, drop it (`None`) or let it pass.
fn run(
    manifest: Manifest,
    files: &mut Files,
    tamper: impl FnMut(Message) -> Option<Message>,
) -> Run {
    run_with(Planner::default(), manifest, files, tamper)
}

/// [`run`], with the sender's rules `planner`.
fn run_with(
    mut planner: Planner,
    mut manifest: Manifest,
    files: &mut Files,
    mut tamper: impl FnMut(Message) -> Option<Message>,
) -> Run {
    let mut control = ControlSession::default();
    let mut run = Run {
        sender: Err(SendError::Protocol("the session never ended".into())),
        receiver: None,
        to_send: 0,
        skipped: 0,
        sent: 0,
        settled: Vec::new(),
    };
    // What the sender writes on the control connection, in order.
    let mut outbox: VecDeque<Message> = manifest.next_batch().into_iter().collect();
    while let Some(message) = outbox.pop_front() {
        let step = control.handle(message, files);
        if let Some(end) = step.end.clone() {
            run.receiver = Some(end.map_err(|e| e.to_string()));
        }
        let Some(reply) = step.reply.and_then(&mut tamper) else {
            if run.receiver.is_some() {
                break;
            }
            continue;
        };
        let actions = match planner.handle(reply, &manifest) {
            Ok(actions) => actions,
            Err(e) => {
                run.sender = Err(e);
                break;
            }
        };
        for action in actions {
            match action {
                Action::Count { to_send, skipped } => {
                    run.to_send += to_send;
                    run.skipped += skipped;
                }
                // The data streams carry every range, and the file is sealed once all of it is
                // acknowledged.
                Action::Queue(file, ranges) => {
                    for range in ranges {
                        run.sent += range.end - range.start;
                        files.receive(file, range);
                    }
                    outbox.push_back(Message::Seal { file, blake3: None });
                }
                Action::CloseQueue => {}
                Action::Settle(file) => run.settled.push(file),
                Action::Seal(file) => outbox.push_back(Message::Seal { file, blake3: None }),
                // Files compared together go in one message, as the control writer sends
                // those queued together.
                Action::Compare(file) => match outbox.back_mut() {
                    Some(Message::Compare { files }) => files.push((file, [0; 32])),
                    _ => outbox.push_back(Message::Compare {
                        files: vec![(file, [0; 32])],
                    }),
                },
                Action::Changed(file) => {
                    let size = manifest.size(file).unwrap();
                    run.to_send += size;
                    run.skipped -= size;
                }
                Action::Finish => outbox.push_back(Message::Finish),
                Action::Complete(_) => run.sender = Ok(()),
            }
        }
        // The scanner announces the next batch once the previous one is planned.
        if outbox.is_empty()
            || matches!(
                outbox.back(),
                Some(Message::Seal { .. } | Message::Compare { .. })
            )
        {
            outbox.extend(manifest.next_batch());
        }
        if run.receiver.is_some() {
            break;
        }
    }
    run
}

/// A tree of files of many sizes (empty ones too), 3 to a batch.
fn tree() -> Manifest {
    Manifest::new(
        &[
            ("a", 1000),
            ("b", 0),
            ("c/d", 4096),
            ("c/e", 1),
            ("f", 70_000),
            ("g", 0),
            ("h/i/j", 12_345),
        ],
        3,
    )
}

#[test]
fn a_tree_crosses_whole_and_every_file_is_placed() {
    let mut files = Files::default();
    let run = run(tree(), &mut files, Some);
    assert!(run.sender.is_ok(), "{run:?}");
    assert_eq!(run.receiver, Some(Ok(())));
    let total = 1000 + 4096 + 1 + 70_000 + 12_345;
    assert_eq!((run.to_send, run.skipped, run.sent), (total, 0, total));
    assert_eq!(files.placed(), ["a", "b", "c/d", "c/e", "f", "g", "h/i/j"]);
    let mut settled = run.settled.clone();
    settled.sort_unstable();
    assert_eq!(
        settled,
        (0..7).collect::<Vec<_>>(),
        "every file settled once"
    );
}

#[test]
fn a_resumed_session_sends_only_what_the_receiver_lacks() {
    let mut files = Files::default();
    files.left_by_earlier_session("a", 1000, &[(0, 1000)]);
    files.left_by_earlier_session("f", 70_000, &[(0, 10_000), (30_000, 40_000)]);
    files.left_by_earlier_session("c/d", 4096, &[(0, 100)]);
    // A file rewritten at another size since: sent again whole.
    files.left_by_earlier_session("h/i/j", 99, &[(0, 99)]);
    let run = run(tree(), &mut files, Some);
    assert!(run.sender.is_ok(), "{run:?}");
    assert_eq!(run.receiver, Some(Ok(())));
    let missing = 20_000 + 3996 + 1 + 12_345;
    assert_eq!((run.to_send, run.sent), (missing, missing));
    assert_eq!(run.skipped, 1000 + 50_000 + 100);
    assert_eq!(files.held(4), 70_000);
    assert_eq!(files.placed().len(), 7);
}

/// Comparing by content, the files the receiver holds whole are compared when sealed: the
/// one whose copy changed is sent whole and sealed again; the others cross no byte.
#[test]
fn a_compared_file_that_changed_is_sent_whole_and_the_rest_stay() {
    let mut files = Files::default();
    files.compare_by_content();
    files.left_by_earlier_session("a", 1000, &[(0, 1000)]);
    files.left_by_earlier_session("c/d", 4096, &[(0, 4096)]);
    files.left_by_earlier_session("f", 70_000, &[(0, 70_000)]);
    files.changed_since("f");
    let planner = Planner::new(PresentFiles::Compared);
    let run = run_with(planner, tree(), &mut files, Some);
    assert!(run.sender.is_ok(), "{run:?}");
    assert_eq!(run.receiver, Some(Ok(())));
    let missing = 1 + 12_345;
    assert_eq!(
        (run.to_send, run.sent),
        (missing + 70_000, missing + 70_000)
    );
    assert_eq!(run.skipped, 1000 + 4096);
    assert_eq!(files.held(4), 70_000);
    assert_eq!(files.placed().len(), 7);
}

#[test]
fn a_path_the_receiver_refuses_fails_both_sides_with_its_reason() {
    let manifest = Manifest::new(&[("a", 10), ("b", 10), ("/etc/passwd", 10)], 2);
    let mut files = Files::default();
    let run = run(manifest, &mut files, Some);
    let reason = "/etc/passwd: an absolute path";
    assert_eq!(run.receiver, Some(Err(format!("failed: {reason}"))));
    match run.sender {
        Err(SendError::Receiver {
            file: None,
            reason: r,
        }) => assert_eq!(r, reason),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_receiver_that_lies_is_refused_by_the_sender() {
    type Tamper = Box<dyn FnMut(Message) -> Option<Message>>;
    let cases: Vec<(&str, Tamper)> = vec![
        (
            "said done before the sender finished",
            // A receiver that claims the transfer done after the first plan.
            Box::new(|m| match m {
                Message::Finalized { .. } => Some(Message::Done {
                    removed: Default::default(),
                }),
                other => Some(other),
            }),
        ),
        (
            "finalised when it was not waiting",
            Box::new(|m| match m {
                Message::Finalized { file, error } => Some(Message::Finalized {
                    file: file + 100,
                    error,
                }),
                other => Some(other),
            }),
        ),
        (
            "a plan for files 5..",
            Box::new(|m| match m {
                Message::Plan { files, last, .. } => Some(Message::Plan {
                    first: 5,
                    files,
                    last,
                }),
                other => Some(other),
            }),
        ),
        (
            "outside a file of",
            Box::new(|m| match m {
                Message::Plan { first, files, last } => Some(Message::Plan {
                    first,
                    files: files
                        .iter()
                        .map(|_| crate::wire::FileStatus::Partial(vec![(0, 1 << 40)]))
                        .collect(),
                    last,
                }),
                other => Some(other),
            }),
        ),
        (
            "the last before the manifest's end",
            Box::new(|m| match m {
                Message::Plan { first, files, .. } => Some(Message::Plan {
                    first,
                    files,
                    last: true,
                }),
                other => Some(other),
            }),
        ),
        (
            "unexpected Ack on the control connection",
            Box::new(|m| match m {
                Message::Finalized { file, .. } => Some(Message::Ack {
                    file,
                    offset: 0,
                    len: 1,
                }),
                other => Some(other),
            }),
        ),
    ];
    for (needle, tamper) in cases {
        let mut files = Files::default();
        let run = run(tree(), &mut files, tamper);
        match &run.sender {
            Err(SendError::Protocol(e)) if e.contains(needle) => {}
            other => panic!("{needle}: {other:?}"),
        }
        assert!(
            files.placed().len() < 7,
            "{needle}: the session went on to its end"
        );
    }
}

#[test]
fn a_file_the_receiver_cannot_place_fails_the_transfer_naming_it() {
    // The seal's answer is lost in favour of a failure, as a receiver whose disk broke says.
    let mut files = Files::default();
    let run = run(tree(), &mut files, |m| match m {
        Message::Finalized { file: 2, .. } => Some(Message::Finalized {
            file: 2,
            error: Some("No space left on device".into()),
        }),
        other => Some(other),
    });
    match run.sender {
        Err(SendError::Receiver {
            file: Some(file),
            reason,
        }) => assert_eq!(
            (file.as_str(), reason.as_str()),
            ("c/d", "No space left on device")
        ),
        other => panic!("{other:?}"),
    }
}

/// One simulated data stream.
struct Stream {
    /// Time from a unit's hand-out to its answer.
    delay: Duration,
    unanswered: Unanswered,
    /// Units sent and not answered.
    in_flight: usize,
    /// It broke at this time: answers after it are lost and its units go back to the queue.
    breaks_at: Option<Duration>,
    /// It opens at this time (the optimiser added it).
    joins_at: Duration,
    /// It is retired at this time: it takes no new unit and ends once its units are answered.
    retires_at: Option<Duration>,
    /// Its `EndOfStream` was answered (or it broke).
    ended: bool,
}

/// What happens next in a simulated run.
#[derive(Debug)]
enum Event {
    /// The stream asks the queue for work.
    Ask(u64),
    /// The receiver's answer reaches the stream.
    Answer(u64, Message),
}

/// What a simulated run of the data streams did.
#[derive(Debug, Default)]
struct DataRun {
    /// When the queue was done.
    finished: Duration,
    /// Bytes the first acknowledgements counted.
    acked: u64,
    /// Units sent, copies included.
    units_sent: u64,
    /// The number of times each file was reported complete.
    completed: BTreeMap<u32, u32>,
    /// Which stream took each unit (copies included) and when.
    taken: Vec<(u64, Duration)>,
    /// Whether each stream ended, its `EndOfStream` answered or its connection broken.
    ended: Vec<bool>,
}

/// Sends files of `sizes` in units of `unit` bytes over `streams` in simulated time; the
/// receiver answers the first copy of each unit in `damaged` with a `Nack`. Returns what
/// happened, or the first protocol error.
fn run_streams(
    sizes: &[u64],
    unit: u32,
    mut streams: Vec<Stream>,
    damaged: &[Unit],
    files: &mut Files,
) -> Result<DataRun, SendError> {
    /// Units a stream keeps unanswered at most (its window).
    const WINDOW: usize = 4;
    let t0 = Instant::now();
    let time = Timestamp { secs: 0, nanos: 0 };
    let entries = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| FileEntry {
            path: format!("f{i}").into_bytes(),
            size,
            mode: 0o644,
            mtime: time,
            ctime: time,
            inode: i as u64,
        })
        .collect();
    let batch = ManifestBatch {
        dirs: Vec::new(),
        files: entries,
        last: true,
    };
    files.add_batch(&batch).expect("a plan");
    let mut queue = WorkQueue::new(unit);
    for (file, &size) in (0..).zip(sizes) {
        if size > 0 {
            queue.add_file(file, std::iter::once(0..size));
        }
    }
    queue.close();
    let mut damaged: Vec<Unit> = damaged.to_vec();
    let mut run = DataRun::default();
    // Events by their time, then in the order they were made.
    let mut events: BTreeMap<(Duration, u64), Event> = BTreeMap::new();
    let mut seq = 0u64;
    let mut at = |events: &mut BTreeMap<_, _>, when: Duration, event: Event| {
        seq += 1;
        events.insert((when, seq), event);
    };
    for (id, stream) in (0..).zip(&streams) {
        at(&mut events, stream.joins_at, Event::Ask(id));
        if let Some(retires_at) = stream.retires_at {
            at(&mut events, retires_at, Event::Ask(id));
        }
    }
    while let Some(((now, _), event)) = events.pop_first() {
        let ask_all = match event {
            Event::Ask(id) => {
                let stream = &mut streams[id as usize];
                if stream.ended || stream.breaks_at.is_some_and(|b| now >= b) {
                    continue;
                }
                if stream.in_flight >= WINDOW || now < stream.joins_at {
                    continue;
                }
                let next = if stream.retires_at.is_some_and(|r| now >= r) {
                    Next::Done
                } else {
                    queue.next(id, t0 + now)
                };
                match next {
                    Next::Unit(u) => {
                        stream.unanswered.sent(u);
                        stream.in_flight += 1;
                        run.units_sent += 1;
                        run.taken.push((id, now));
                        let answer = match damaged.iter().position(|d| *d == u) {
                            Some(i) => {
                                damaged.swap_remove(i);
                                Message::Nack {
                                    file: u.file,
                                    offset: u.offset,
                                }
                            }
                            None => {
                                files.receive(u.file, u.offset..u.offset + u64::from(u.len));
                                Message::Ack {
                                    file: u.file,
                                    offset: u.offset,
                                    len: u.len,
                                }
                            }
                        };
                        let delay = stream.delay;
                        at(&mut events, now + delay, Event::Answer(id, answer));
                        // The next unit goes out once this one is on its way.
                        at(
                            &mut events,
                            now + Duration::from_micros(100),
                            Event::Ask(id),
                        );
                    }
                    Next::Wait(Some(wait)) => at(&mut events, now + wait, Event::Ask(id)),
                    // Asked again when an answer arrives anywhere.
                    Next::Wait(None) => {}
                    Next::Done if !stream.unanswered.waiting() => {
                        stream.unanswered.end_sent();
                        let delay = stream.delay;
                        at(
                            &mut events,
                            now + delay,
                            Event::Answer(id, Message::EndOfStream),
                        );
                    }
                    Next::Done => {}
                }
                false
            }
            Event::Answer(id, message) => {
                let stream = &mut streams[id as usize];
                if stream.ended {
                    continue;
                }
                if stream.breaks_at.is_some_and(|b| now >= b) {
                    // The connection broke: what it carried and was not answered goes back.
                    stream.ended = true;
                    for u in stream.unanswered.take().into_iter().rev() {
                        queue.give_back(u, id);
                    }
                    true
                } else {
                    let answer = stream.unanswered.answer(message)?;
                    if matches!(answer, Answer::Acked(_) | Answer::Nacked(_)) {
                        stream.in_flight -= 1;
                    }
                    match answer {
                        Answer::Acked(u) => {
                            if let Some(done) = queue.acked(u, t0 + now) {
                                run.acked += u64::from(u.len);
                                if done {
                                    *run.completed.entry(u.file).or_default() += 1;
                                }
                            }
                        }
                        Answer::Nacked(u) => queue.give_back(u, id),
                        Answer::Ended => stream.ended = true,
                    }
                    at(&mut events, now, Event::Ask(id));
                    true
                }
            }
        };
        if queue.is_done() && run.finished == Duration::ZERO {
            run.finished = now;
        }
        if ask_all {
            for other in 0..streams.len() as u64 {
                at(&mut events, now, Event::Ask(other));
            }
        }
    }
    assert!(
        queue.is_done(),
        "the streams ended with units unacknowledged"
    );
    run.ended = streams.iter().map(|s| s.ended).collect();
    Ok(run)
}

fn stream(delay_ms: u64) -> Stream {
    Stream {
        delay: Duration::from_millis(delay_ms),
        unanswered: Unanswered::default(),
        in_flight: 0,
        breaks_at: None,
        joins_at: Duration::ZERO,
        retires_at: None,
        ended: false,
    }
}

/// Files of many sizes, empty ones among them.
const SIZES: [u64; 6] = [1 << 20, 0, 300_000, 1, 65_536, 2_000_003];
/// The units they are cut into.
const UNIT: u32 = 64 << 10;

/// Sends [`SIZES`] over `streams` (answering the first copy of each unit in `damaged` with a
/// `Nack`) and checks what every run must end with: each byte acknowledged once (a copy's
/// second answer counts for nothing) and held by the receiver, each file with bytes completed
/// exactly once.
fn sent_whole(streams: Vec<Stream>, damaged: &[Unit]) -> DataRun {
    let mut files = Files::default();
    let run = run_streams(&SIZES, UNIT, streams, damaged, &mut files).unwrap();
    assert_eq!(run.acked, SIZES.iter().sum::<u64>());
    for (file, &size) in (0..).zip(&SIZES) {
        assert_eq!(files.held(file), size, "file {file}");
        let completed = run.completed.get(&file).copied().unwrap_or(0);
        assert_eq!(completed, u32::from(size > 0), "file {file}");
    }
    run
}

#[test]
fn every_byte_crosses_once_and_every_file_completes_once() {
    sent_whole(vec![stream(10), stream(10), stream(10)], &[]);
}

#[test]
fn at_the_tail_idle_streams_carry_a_slow_streams_units_and_the_first_answer_counts() {
    let even = sent_whole(vec![stream(10), stream(10), stream(10)], &[]);
    // One stream answers 50 times slower: without copies, the transfer would wait for it.
    let slow = sent_whole(vec![stream(10), stream(10), stream(500)], &[]);
    assert!(
        slow.units_sent > even.units_sent,
        "no straggler was carried again"
    );
    assert!(
        slow.finished < Duration::from_millis(500),
        "done in {:?}: it waited for the slow stream",
        slow.finished
    );
}

#[test]
fn a_damaged_chunk_is_sent_again_and_a_broken_streams_units_go_to_the_others() {
    let damaged = [(0, 0), (5, 128 << 10)].map(|(file, offset)| Unit {
        file,
        offset,
        len: UNIT,
    });
    let mut breaking = stream(10);
    breaking.breaks_at = Some(Duration::from_millis(25));
    let run = sent_whole(vec![stream(10), breaking, stream(20)], &damaged);
    // Each damaged unit went twice, and so did what the broken stream had not had answered.
    let units: u64 = SIZES.iter().map(|s| s.div_ceil(u64::from(UNIT))).sum();
    assert!(
        run.units_sent > units + 2,
        "{} units sent of {units}",
        run.units_sent
    );
}

/// The optimiser changes the count mid-transfer: a stream retired takes no new unit, has what
/// it carries answered and ends, with a copy of a straggler perhaps still in flight; a stream
/// added later takes its share. Every byte still crosses once.
#[test]
fn streams_added_and_retired_mid_transfer_carry_every_byte_once() {
    let ms = Duration::from_millis;
    let mut leaving = stream(10);
    leaving.retires_at = Some(ms(15));
    let mut joining = stream(10);
    joining.joins_at = ms(20);
    let mut brief = stream(40);
    (brief.joins_at, brief.retires_at) = (ms(5), Some(ms(30)));
    let windows = [
        (0, ms(0), None),
        (1, ms(0), Some(ms(15))),
        (2, ms(20), None),
        (3, ms(5), Some(ms(30))),
    ];
    let run = sent_whole(vec![stream(10), leaving, joining, brief], &[]);
    for (id, from, until) in windows {
        let taken: Vec<_> = run.taken.iter().filter(|(s, _)| *s == id).collect();
        assert!(!taken.is_empty(), "stream {id} took no unit");
        assert!(
            taken
                .iter()
                .all(|(_, at)| *at >= from && until.is_none_or(|u| *at < u)),
            "stream {id} took a unit outside {from:?}..{until:?}: {taken:?}"
        );
    }
    assert_eq!(run.ended, [true; 4], "every stream ended");
}

#[test]
fn an_answer_for_a_unit_the_stream_did_not_send_is_a_protocol_error() {
    let mut unanswered = Unanswered::default();
    let unit = Unit {
        file: 1,
        offset: 0,
        len: 10,
    };
    unanswered.sent(unit);
    unanswered.sent(Unit {
        file: 1,
        offset: 10,
        len: 10,
    });
    // Out of order, a wrong length, and a nack for another file.
    for message in [
        Message::Ack {
            file: 1,
            offset: 10,
            len: 10,
        },
        Message::Ack {
            file: 1,
            offset: 0,
            len: 9,
        },
        Message::Nack { file: 2, offset: 0 },
        Message::Plan {
            first: 0,
            files: Vec::new(),
            last: true,
        },
    ] {
        match unanswered.answer(message.clone()) {
            Err(SendError::Protocol(_)) => {}
            other => panic!("{message:?}: {other:?}"),
        }
    }
    let ack = Message::Ack {
        file: 1,
        offset: 0,
        len: 10,
    };
    assert_eq!(unanswered.answer(ack).unwrap(), Answer::Acked(unit));
    let refused = unanswered.answer(Message::Error {
        message: "disk full".into(),
    });
    assert!(matches!(refused, Err(SendError::Receiver { reason, .. }) if reason == "disk full"));
}
