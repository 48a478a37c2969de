//! Data streams: the manager thread that opens and retires streams to follow the target count,
//! and each stream's writer and acknowledgement reader.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufReader, Read};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::answers::{Answer, Unanswered};
use super::join::{self, Join, Pace};
use super::quic_stream;
use super::source::UnitBuffer;
use super::unsent::UnsentQueue;
use super::{
    connect, guarded, sample_connection, ManagerEvent, SendError, SendOptions, Shared, Unit,
    MAX_STREAM_FAILURES,
};
use crate::auth::{self, AuthError, ChannelBinding};
use crate::link::{self, Connection, LinkWriter};
use crate::mptcp_info::Subflow;
use crate::seal::{FrameWrite, FrameWriter};
use crate::sys::sockopt;
use crate::tcp_info::TcpInfo;
use crate::telemetry;
use crate::transport::Transport;
use crate::wire::{self, ChunkHeader, FrameReader, Limit, Message, Role, WireError};

/// Most checksum failures tolerated in one transfer before it is abandoned.
const MAX_NACKS: u64 = 64;

/// How a stream ended badly.
#[derive(Debug)]
pub(super) enum StreamFailure {
    /// The stream broke; its units went back to the queue and another stream may replace it.
    Broken(String),
    /// The receiver is busy authenticating other connections: no stream is opened for a while,
    /// and the transfer goes on with those it has.
    Busy(Limit),
    /// The stream could not be set up, but every unit had been acknowledged meanwhile
    /// ([`unless_done`]).
    Unneeded(String),
    /// The transfer cannot go on (already reported through `Shared::fail`).
    Fatal,
}

/// What the rest of the transfer sees of one stream.
pub(super) struct StreamHandle {
    pub(super) id: u64,
    retire: AtomicBool,
    connection: OnceLock<Connection>,
    /// The ack clock: since when (ms after the transfer's start) the stream has been waiting
    /// for the receiver's next answer, or `u64::MAX` while it waits for nothing (or was closed
    /// for having waited too long).
    waiting_since_ms: AtomicU64,
    /// The pacing cap its socket starts with, bytes per second, when it joins a running
    /// transfer ([`join`]).
    join_cap: Option<u64>,
}

impl StreamHandle {
    fn new(id: u64, join_cap: Option<u64>) -> StreamHandle {
        StreamHandle {
            id,
            retire: AtomicBool::new(false),
            connection: OnceLock::new(),
            waiting_since_ms: AtomicU64::new(u64::MAX),
            join_cap,
        }
    }

    /// The socket of a connected TCP (or MPTCP) stream.
    fn tcp(&self) -> Option<&TcpStream> {
        match self.connection.get() {
            Some(Connection::Tcp(socket)) => Some(socket),
            _ => None,
        }
    }

    /// Caps the pacing rate of a connected TCP stream's socket (`u64::MAX`: no cap).
    fn set_pacing(&self, rate: u64) -> std::io::Result<()> {
        self.tcp().map_or(Ok(()), |socket| cap_pacing(socket, rate))
    }

    /// Starts the ack clock afresh when `waiting` (an answer is due), stops it otherwise. Called
    /// under the stream's in-flight lock, so the clock always matches the queue.
    fn set_ack_clock(&self, shared: &Shared, waiting: bool) {
        let since = if waiting {
            shared.start.elapsed().as_millis() as u64
        } else {
            u64::MAX
        };
        self.waiting_since_ms.store(since, Ordering::Release);
    }

    /// Closes the stream if it has waited for an answer longer than the stall timeout (and
    /// stops its clock, so that it is closed once; an answer that arrives meanwhile wins).
    fn close_if_stalled(&self, shared: &Shared) {
        let since = self.waiting_since_ms.load(Ordering::Acquire);
        let now = shared.start.elapsed().as_millis() as u64;
        let limit = shared.config.options.stall_timeout;
        if now.saturating_sub(since) > limit.as_millis() as u64
            && self
                .waiting_since_ms
                .compare_exchange(since, u64::MAX, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            tracing::warn!(
                "stream {} had no answer from the receiver for {} s; closing it, its units go to the other streams",
                self.id,
                limit.as_secs_f64()
            );
            self.shutdown();
        }
    }

    /// Marks the stream for removal: it takes no new unit (a writer waiting for one wakes up).
    pub(super) fn retire(&self, shared: &Shared) {
        shared
            .units
            .wake_after(|| self.retire.store(true, Ordering::Release));
    }

    pub(super) fn is_retiring(&self) -> bool {
        self.retire.load(Ordering::Acquire)
    }

    pub(super) fn sample(&self, transport: Transport) -> Option<(TcpInfo, Vec<Subflow>)> {
        sample_connection(self.connection.get()?, transport)
    }

    pub(super) fn shutdown(&self) {
        if let Some(c) = self.connection.get() {
            c.shutdown();
        }
    }
}

/// Shortest pause in opening streams after the receiver turned one away as busy.
const BUSY_PAUSE_MIN: Duration = Duration::from_millis(250);
/// Longest such pause.
const BUSY_PAUSE_MAX: Duration = Duration::from_secs(8);

/// New streams the receiver turned away as busy authenticating others
/// ([`Limit::Authenticating`]): the manager opens none for a pause that doubles from
/// [`BUSY_PAUSE_MIN`] to [`BUSY_PAUSE_MAX`] and the transfer goes on with the streams it has,
/// until a new stream gets through. A transfer left without any stream for the stall timeout
/// fails with the limit.
#[derive(Default)]
struct BusyReceiver {
    pause: Duration,
    /// No stream is opened before then.
    until: Option<Instant>,
    /// Since when, and the newest stream turned away.
    since: Option<(Instant, u64, Limit)>,
}

impl BusyReceiver {
    fn turned_away(&mut self, stream: u64, limit: Limit, now: Instant) {
        self.pause = (self.pause * 2).clamp(BUSY_PAUSE_MIN, BUSY_PAUSE_MAX);
        self.until = Some(now + super::with_jitter(self.pause));
        let since = self.since.map_or(now, |(since, ..)| since);
        self.since = Some((since, stream, limit));
    }

    fn may_open(&self, now: Instant) -> bool {
        self.until.is_none_or(|until| now >= until)
    }

    /// Forgets the refusals once a stream opened after them got through.
    fn note_streams<'a>(&mut self, streams: impl Iterator<Item = &'a Arc<StreamHandle>>) {
        if let Some((_, newest, _)) = self.since {
            if streams
                .filter(|h| h.id > newest)
                .any(|h| h.connection.get().is_some())
            {
                *self = BusyReceiver::default();
            }
        }
    }

    /// The limit, once the transfer has had no stream for `patience` since it was first hit.
    fn given_up(&self, connected: usize, patience: Duration, now: Instant) -> Option<Limit> {
        let (since, _, limit) = self.since?;
        (connected == 0 && now.duration_since(since) > patience).then_some(limit)
    }
}

/// Keeps the number of non-retiring streams equal to the target until all units are
/// acknowledged, closes streams that stall, and returns once the transfer is over and every
/// stream has closed.
pub(super) fn run_manager(shared: &Arc<Shared>, events: mpsc::Receiver<ManagerEvent>) {
    let mut threads = HashMap::new();
    let mut next_id = 1u64;
    let mut failures = 0u32;
    let mut busy = BusyReceiver::default();
    let mut joins: HashMap<u64, Join> = HashMap::new();
    loop {
        if shared.is_over() {
            let streams = shared.streams.lock();
            if streams.open.is_empty() {
                break;
            }
            for handle in streams.open.values() {
                handle.retire(shared);
            }
        } else if !shared.units.is_done() {
            let target = shared.target.load(Ordering::Acquire);
            let mut streams = shared.streams.lock();
            let active: Vec<_> = streams
                .open
                .values()
                .filter(|h| !h.is_retiring())
                .cloned()
                .collect();
            for handle in active
                .iter()
                .rev()
                .take(active.len().saturating_sub(target))
            {
                handle.retire(shared);
            }
            // Streams still draining count against the receiver's limit; top up once they exit.
            let room = shared.max_streams.saturating_sub(streams.open.len());
            let room = if busy.may_open(Instant::now()) {
                room
            } else {
                0
            };
            let wanted = target.min(active.len() + room);
            let share = if wanted > active.len() {
                joining_share(shared, &active)
            } else {
                None
            };
            let now = shared.start.elapsed();
            for _ in active.len()..wanted {
                let join =
                    share.and_then(|s| Join::new(s, shared.config.options.stream_rate_cap, now));
                let handle = Arc::new(StreamHandle::new(
                    next_id,
                    join.as_ref().map(Join::first_cap),
                ));
                if let Some(join) = join {
                    tracing::debug!(
                        "stream {next_id} joins paced at {:.1} Mbit/s, the mean of the others",
                        join.first_cap() as f64 * 8e-6
                    );
                    joins.insert(next_id, join);
                }
                next_id += 1;
                streams.open.insert(handle.id, handle.clone());
                let thread_shared = shared.clone();
                let name = format!("xfer-stream-{}", handle.id);
                let spawned = std::thread::Builder::new()
                    .name(name.clone())
                    .spawn(move || {
                        let id = handle.id;
                        let _open = telemetry::Open::sender_stream();
                        let result = guarded(
                            &name,
                            || run_stream(&thread_shared, &handle),
                            |e| thread_shared.fail(e),
                        );
                        let result = result.unwrap_or(Err(StreamFailure::Fatal));
                        thread_shared.notify_manager(ManagerEvent::StreamExited { id, result });
                    });
                match spawned {
                    Ok(t) => {
                        threads.insert(next_id - 1, t);
                    }
                    Err(e) => {
                        drop(streams);
                        shared.fail(SendError::system("start a stream thread", e));
                        break;
                    }
                }
            }
        }
        {
            let mut streams = shared.streams.lock();
            for handle in streams.open.values() {
                handle.close_if_stalled(shared);
            }
            busy.note_streams(streams.open.values());
            pace_joining(shared, &streams.open, &mut joins);
            let connected = (streams.open.values())
                .filter(|h| h.connection.get().is_some())
                .count();
            let patience = shared.config.options.stall_timeout;
            if let Some(limit) = busy.given_up(connected, patience, Instant::now()) {
                shared.fail(SendError::Limited {
                    addr: shared.config.addr.clone(),
                    limit,
                });
            }
            let active = streams.active();
            streams.note_active(shared.start.elapsed().as_secs_f64(), active);
        }
        let tick = if joins.is_empty() {
            Duration::from_millis(200)
        } else {
            join::STEP
        };
        match events.recv_timeout(tick) {
            Ok(ManagerEvent::StreamExited { id, result }) => {
                shared.remove_stream(id);
                if let Some(t) = threads.remove(&id) {
                    let _ = t.join();
                }
                if let Err(StreamFailure::Busy(limit)) = result {
                    tracing::info!("stream {id} not opened: {limit}; trying again later");
                    busy.turned_away(id, limit, Instant::now());
                }
                if let Err(StreamFailure::Unneeded(reason)) = &result {
                    tracing::debug!("stream {id} not needed any more: {reason}");
                }
                if let Err(StreamFailure::Broken(reason)) = result {
                    telemetry::sender_stream_broke();
                    failures += 1;
                    tracing::info!("stream {id} broke ({reason}); its units go back to the queue");
                    if failures > MAX_STREAM_FAILURES {
                        shared.fail(
                            shared
                                .config
                                .lost(format!("{failures} streams broke; last: {reason}")),
                        );
                    }
                }
            }
            Ok(ManagerEvent::TargetChanged) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    for (_, t) in threads {
        let _ = t.join();
    }
}

/// The rate a stream opened beside the connected streams that are not retiring joins at
/// ([`join::share`]); `None` where it slow-starts unpaced, as it does where streams cannot be
/// paced (MPTCP, QUIC: [`join`] is for TCP).
fn joining_share(shared: &Shared, active: &[Arc<StreamHandle>]) -> Option<f64> {
    if shared.dial.transport != Transport::Tcp {
        return None;
    }
    let carrying: Vec<TcpInfo> = active
        .iter()
        .filter_map(|h| h.sample(shared.dial.transport))
        .map(|(info, _)| info)
        .collect();
    join::share(&carrying)
}

/// The stream's next unit, after its turn in the transfer's rate limit where there is one: a
/// whole unit's worth is reserved before the unit is taken (so that no unit the receiver waits
/// for sits with a stream waiting its turn), and what the unit is shorter by is given back.
fn next_paced_unit(shared: &Shared, handle: &StreamHandle) -> Option<Unit> {
    let Some(limit) = &shared.rate_limit else {
        return shared.next_unit(handle.id, &handle.retire);
    };
    let now = Instant::now();
    let turn = limit.reserve(limit.unit(), now);
    if turn > now {
        // Over meanwhile: the next unit is none.
        shared.wait_over_until(turn);
    }
    let unit = shared.next_unit(handle.id, &handle.retire);
    limit.give_back(limit.unit() - unit.map_or(0, |u| u64::from(u.len)));
    unit
}

/// Raises or lifts the pacing caps of the streams joining the transfer ([`join`]), and forgets
/// those that closed.
fn pace_joining(
    shared: &Shared,
    streams: &BTreeMap<u64, Arc<StreamHandle>>,
    joins: &mut HashMap<u64, Join>,
) {
    let now = shared.start.elapsed();
    joins.retain(|id, join| {
        let Some(handle) = streams.get(id) else {
            return false;
        };
        let Some((info, _)) = handle.sample(shared.dial.transport) else {
            return true; // not connected yet
        };
        let (rate, joining) = match join.pace(&info, now) {
            Pace::Hold => return true,
            Pace::Cap(rate) => (rate, true),
            Pace::Release(rate) => (rate, false),
        };
        match handle.set_pacing(rate) {
            Ok(()) => joining,
            Err(e) => {
                tracing::debug!("stream {id}: cannot change its pacing rate ({e}); left as it is");
                false
            }
        }
    });
}

/// Runs one stream from connect to close, opened in its turn ([`super::dialing::Openings`]).
fn run_stream(shared: &Arc<Shared>, handle: &Arc<StreamHandle>) -> Result<(), StreamFailure> {
    let wanted = || !shared.is_over() && !handle.is_retiring();
    let Some(turn) = shared.dial.openings.enter(|| !wanted()) else {
        if shared.is_over() {
            return Err(StreamFailure::Fatal);
        }
        // Retired before it opened: nothing to carry.
        return Ok(());
    };
    match &shared.dial.quic {
        None => {
            let (reader, mut writer, socket) = open_tcp(shared, handle)?;
            drop(turn);
            let connection = Connection::Tcp(socket);
            carry(shared, handle, connection, |connection, in_flight| {
                exchange(shared, handle, reader, &mut writer, connection, in_flight)
            })
        }
        Some(quic) => {
            let (conn, connection) = quic_stream::open(shared, handle, quic)?;
            drop(turn);
            carry(
                shared,
                handle,
                Connection::Quic(connection.clone()),
                |_, in_flight| {
                    quic_stream::exchange(shared, handle, quic, conn, connection, in_flight)
                },
            )
        }
    }
}

/// An authenticated data stream's reader and writer, and its connection.
type Opened<R, C> = (FrameReader<BufReader<R>>, FrameWriter<LinkWriter>, C);

/// Opens a TCP or MPTCP connection for a stream (with TLS when encrypting) and proves the
/// session on it.
fn open_tcp(
    shared: &Shared,
    handle: &StreamHandle,
) -> Result<Opened<link::LinkReader<link::PollRead>, TcpStream>, StreamFailure> {
    let (socket, _, fallback) = connect(
        &shared.dial.addrs,
        &shared.config.addr,
        shared.dial.transport,
    )
    .map_err(|e| unless_done(shared, e))?;
    if let Some(why) = fallback {
        tracing::info!("stream {}: {why}", handle.id);
    }
    tune_data_socket(&socket, &shared.config.options, handle.join_cap)
        .map_err(|e| unless_done(shared, e))?;
    // The handshake is bounded by the stall timeout; afterwards the ack clock watches the stream.
    socket
        .set_read_timeout(Some(shared.config.options.stall_timeout))
        .map_err(broken)?;
    let (reader, writer, channel) = link::client(&socket, shared.config.options.encrypt)
        .map_err(|e| handshake_failure(shared, AuthError::from_io(e)))?;
    let (mut reader, mut writer) = (
        FrameReader::new(BufReader::new(reader), 0),
        FrameWriter::new(writer),
    );
    prove_session(shared, &mut reader, &mut writer, &channel)?;
    socket.set_read_timeout(None).map_err(broken)?;
    Ok((reader, writer, socket))
}

/// The data stream's half of the key handshake: it proves it belongs to the session.
fn prove_session<R: Read>(
    shared: &Shared,
    reader: &mut FrameReader<R>,
    writer: &mut FrameWriter<LinkWriter>,
    channel: &ChannelBinding,
) -> Result<(), StreamFailure> {
    let role = Role::Data {
        session: shared.dial.session,
    };
    let key = &shared.dial.session_key;
    auth::handshake_as_client(reader, writer, channel, key, role, shared.dial.sealed)
        .map(drop)
        .map_err(|e| handshake_failure(shared, e))
}

/// What a data stream's failed setup means for the transfer.
pub(super) fn handshake_failure(shared: &Shared, e: AuthError) -> StreamFailure {
    match e {
        // Damaged or cut off on the way: another stream may do better.
        AuthError::Wire(w @ (WireError::Io(_) | WireError::Corrupted(_))) => {
            StreamFailure::Broken(w.to_string())
        }
        AuthError::Limited(limit @ Limit::Authenticating { .. }) => StreamFailure::Busy(limit),
        other => unless_done(shared, shared.config.handshake_failed(other)),
    }
}

/// A stream that could not be set up: the end of the transfer with `e`, unless every unit
/// was acknowledged meanwhile. Then the receiver may have ended the session, or exited after
/// serving it (`xfer recv --once`), while the stream connected, and the control connection
/// says how the session ended.
fn unless_done(shared: &Shared, e: SendError) -> StreamFailure {
    if shared.units.is_done() {
        StreamFailure::Unneeded(e.to_string())
    } else {
        fatal(shared, e)
    }
}

/// Ends the transfer with `e`; the stream ends as [`StreamFailure::Fatal`].
fn fatal(shared: &Shared, e: SendError) -> StreamFailure {
    shared.fail(e);
    StreamFailure::Fatal
}

fn broken(e: std::io::Error) -> StreamFailure {
    StreamFailure::Broken(e.to_string())
}

/// Carries units over an authenticated stream on `connection` until it is retired, the transfer
/// ends or the connection breaks: `exchange` sends them and reads their answers; what was not
/// acknowledged is handed back.
fn carry(
    shared: &Shared,
    handle: &StreamHandle,
    connection: Connection,
    exchange: impl FnOnce(&Connection, &Arc<Mutex<Unanswered>>) -> Result<(), StreamFailure>,
) -> Result<(), StreamFailure> {
    let _ = handle
        .connection
        .set(connection.try_clone().map_err(broken)?);
    if shared.is_over() {
        handle.shutdown();
    }
    let in_flight = Arc::new(Mutex::new(Unanswered::default()));
    let result = exchange(&connection, &in_flight);
    let leftover = in_flight.lock().expect("in-flight lock").take();
    if !leftover.is_empty() {
        shared.units.hand_back(handle.id, leftover.into_iter());
    }
    if let Some((tcp, subflows)) = sample_connection(&connection, shared.dial.transport) {
        let retransmits = if subflows.is_empty() {
            u64::from(tcp.total_retrans)
        } else {
            subflows
                .iter()
                .map(|s| u64::from(s.tcp.total_retrans))
                .sum()
        };
        shared.counts.closed_retransmits.add(retransmits);
    }
    // The receiver's last answer has arrived: nothing is left to deliver either way.
    connection.shutdown();
    result
}

/// A TCP stream's exchange: this thread writes the units, a scoped thread beside it reads
/// their answers.
fn exchange<R: Read + Send>(
    shared: &Shared,
    handle: &StreamHandle,
    reader: FrameReader<BufReader<R>>,
    writer: &mut FrameWriter<LinkWriter>,
    connection: &Connection,
    in_flight: &Mutex<Unanswered>,
) -> Result<(), StreamFailure> {
    std::thread::scope(|scope| {
        let acks = scope.spawn(|| {
            let acked = read_acks(shared, handle, reader, in_flight);
            if acked.is_err() {
                // A writer waiting for a unit would otherwise wait for this stream's own.
                handle.retire(shared);
            }
            acked
        });
        let written = write_units(shared, handle, writer, in_flight);
        if written.is_err() {
            connection.shutdown();
        }
        let acked = acks.join().unwrap_or(Err(StreamFailure::Fatal));
        written.and(acked)
    })
}

/// Applies the configured send-queue limit and rate cap to a data stream's socket, or the cap
/// it joins a running transfer with ([`join`]), which is below the configured one.
fn tune_data_socket(
    socket: &TcpStream,
    options: &SendOptions,
    join_cap: Option<u64>,
) -> Result<(), SendError> {
    socket2::SockRef::from(socket)
        .set_tcp_notsent_lowat(options.unsent_limit)
        .map_err(|e| SendError::system("limit the unsent queue", e))?;
    if let Some(rate) = join_cap.or(options.stream_rate_cap) {
        cap_pacing(socket, rate).map_err(|e| SendError::system("cap the stream rate", e))?;
    }
    Ok(())
}

/// Caps a TCP socket's pacing rate, bytes per second (`SO_MAX_PACING_RATE`; `u64::MAX`: no
/// cap). Any cap also turns on the kernel's own pacing of the socket.
fn cap_pacing(socket: &TcpStream, rate: u64) -> std::io::Result<()> {
    sockopt::set(socket, libc::SOL_SOCKET, libc::SO_MAX_PACING_RATE, rate)
}

/// Sends units until the queue says stop, then `EndOfStream`.
pub(super) fn write_units(
    shared: &Shared,
    handle: &StreamHandle,
    writer: &mut impl FrameWrite,
    in_flight: &Mutex<Unanswered>,
) -> Result<(), StreamFailure> {
    let sealed = writer.seals();
    let mut buf = UnitBuffer::default();
    let mut unsent = UnsentQueue::new(shared.config.options.unsent_limit);
    let mut open = None;
    let broken = |e: wire::WireError| StreamFailure::Broken(e.to_string());
    // The clock of the answer runs from the first unit sent while none was due.
    let in_flight_push = |unit: Option<Unit>| {
        let mut unanswered = in_flight.lock().expect("in-flight lock");
        if !unanswered.waiting() {
            handle.set_ack_clock(shared, true);
        }
        match unit {
            Some(unit) => unanswered.sent(unit),
            None => unanswered.end_sent(),
        }
    };
    while let Some(unit) = next_paced_unit(shared, handle) {
        in_flight_push(Some(unit));
        let read = shared
            .source
            .unit_data(unit, sealed, &mut buf, &mut open, || {
                shared.files.get(unit.file)
            });
        let (data, digest) = match read {
            Ok(read) => read,
            // A copy of a straggler whose other copy was acknowledged meanwhile: its file may
            // be finalised and forgotten already, and nothing is left to send.
            Err(_) if !shared.units.awaits_ack(unit) => {
                let mut unanswered = in_flight.lock().expect("in-flight lock");
                unanswered.not_sent();
                handle.set_ack_clock(shared, unanswered.waiting());
                continue;
            }
            Err(e) => {
                shared.fail(e);
                return Err(StreamFailure::Fatal);
            }
        };
        let header = ChunkHeader {
            file: unit.file,
            offset: unit.offset,
            checksum: digest.checksum,
        };
        wire::write_chunk(writer, &header, data, digest.content.as_ref()).map_err(broken)?;
        shared.counts.bytes_sent.add(unit.len as u64);
        if let Some(socket) = handle.tcp() {
            unsent.follow(socket, shared.target.load(Ordering::Relaxed));
        }
    }
    // The receiver's answer to `EndOfStream` is due too.
    in_flight_push(None);
    wire::write_message(writer, &Message::EndOfStream).map_err(broken)
}

/// Reads the receiver's answers to the units in flight and acts on them ([`on_answer`]) until
/// `EndOfStream`.
fn read_acks(
    shared: &Shared,
    handle: &StreamHandle,
    mut reader: FrameReader<BufReader<impl Read>>,
    in_flight: &Mutex<Unanswered>,
) -> Result<(), StreamFailure> {
    while !on_answer(shared, handle, reader.read_message(), in_flight)? {}
    Ok(())
}

/// Acts on what the receiver answered (`read`, as read from the stream) to the units in
/// flight ([`Unanswered::answer`]); whether it was the last answer, to `EndOfStream`.
pub(super) fn on_answer(
    shared: &Shared,
    handle: &StreamHandle,
    read: Result<Message, WireError>,
    in_flight: &Mutex<Unanswered>,
) -> Result<bool, StreamFailure> {
    let message = read.map_err(|e| {
        if shared.is_over() {
            StreamFailure::Fatal
        } else {
            StreamFailure::Broken(e.to_string())
        }
    })?;
    let answer = {
        let mut unanswered = in_flight.lock().expect("in-flight lock");
        let answer = unanswered.answer(message);
        handle.set_ack_clock(shared, unanswered.waiting());
        answer
    };
    match answer.map_err(|e| fatal(shared, e))? {
        Answer::Acked(unit) => shared.unit_acked(unit),
        Answer::Nacked(unit) => {
            tracing::warn!(
                "chunk {} of {} failed its checksum at the receiver; sending it again",
                unit.offset,
                shared.files.shown(unit.file)
            );
            shared.units.hand_back(handle.id, std::iter::once(unit));
            if shared.counts.nacks.add(1) >= MAX_NACKS {
                return Err(fatal(
                    shared,
                    shared.config.lost("too many chunks arrived corrupted"),
                ));
            }
        }
        Answer::Ended => return Ok(true),
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(stream_rate_cap: Option<u64>) -> SendOptions {
        SendOptions::default()
            .unsent_limit(96 << 10)
            .stream_rate_cap(stream_rate_cap)
    }

    #[test]
    fn data_sockets_get_the_configured_unsent_limit() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let socket = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        tune_data_socket(&socket, &options(Some(1_000_000)), None).unwrap();
        let sock = socket2::SockRef::from(&socket);
        assert_eq!(sock.tcp_notsent_lowat().unwrap(), 96 << 10);
        assert_eq!(max_pacing_rate(&socket), 1_000_000);
    }

    fn max_pacing_rate(socket: &TcpStream) -> u64 {
        sockopt::get(socket, libc::SOL_SOCKET, libc::SO_MAX_PACING_RATE).unwrap()
    }

    #[test]
    fn a_joining_stream_starts_under_its_cap_which_the_manager_raises_and_lifts() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let socket = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        tune_data_socket(&socket, &options(Some(1_000_000)), Some(250_000)).unwrap();
        assert_eq!(max_pacing_rate(&socket), 250_000);
        let handle = StreamHandle::new(1, Some(250_000));
        handle
            .connection
            .set(Connection::Tcp(socket.try_clone().unwrap()))
            .unwrap();
        handle.set_pacing(312_500).unwrap();
        assert_eq!(max_pacing_rate(&socket), 312_500);
        handle.set_pacing(u64::MAX).unwrap();
        assert_eq!(max_pacing_rate(&socket), u64::MAX);
    }
}
