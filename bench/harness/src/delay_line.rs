//! `xfer-harness delay-line`: the propagation delay of the emulated WAN (`bench/xfer_bench/wan.py`), for
//! kernels without netem.
//!
//! Each link joins two TUN devices that the harness made, usually in different network
//! namespaces: every packet the kernel routes into the first comes out of the second after the
//! configured delay, in order. The harness routes the reverse (ACK) path of a transfer through a
//! link, so the data path stays in the kernel (router namespace, htb bottleneck, drop-tail
//! buffer) and the whole round-trip time is added here.
//!
//! One thread serves all links: it sleeps in `poll` until a device is readable or the oldest
//! held packet is due, and keeps packets in a preallocated ring per link (no allocation per
//! packet). Real-time priority and pinning to one CPU keep its timing within a fraction of a
//! millisecond while both cores are busy; the harness steers the receiving stack's work to the
//! other CPU (RPS), since writing a packet into a TUN device runs the stack in the writer.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use optimizer::Timetable;
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::thread::{CpuSet, LinkNameSpaceType};
use serde::Serialize;

use crate::{sys, DelayLineArgs};

/// Largest packet a link carries (the TUN devices' MTU must not exceed it).
const SLOT: usize = 2048;

/// A TUN device in some network namespace, attached for reading and writing.
struct Tun {
    name: String,
    file: File,
}

/// Runs `f` with the calling thread inside the network namespace `netns` (as made by
/// `ip netns add`), and moves it back afterwards.
fn in_netns<T>(netns: &str, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let home = File::open("/proc/thread-self/ns/net").context("opening this thread's netns")?;
    let target = File::open(format!("/var/run/netns/{netns}"))
        .with_context(|| format!("network namespace {netns:?}"))?;
    let enter = |ns: &File| {
        rustix::thread::move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network))
    };
    enter(&target).with_context(|| format!("entering network namespace {netns:?}"))?;
    let result = f();
    enter(&home).context("returning to the original netns")?;
    result
}

impl Tun {
    /// Attaches to the existing TUN device `name` (made with `ip tuntap add mode tun`) of the
    /// calling thread's network namespace, non-blocking, without packet-information headers.
    fn attach(name: &str) -> anyhow::Result<Tun> {
        let file = File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/net/tun")
            .context("opening /dev/net/tun")?;
        sys::attach_tun(&file, name)
            .with_context(|| format!("attaching to TUN device {name:?}"))?;
        Ok(Tun {
            name: name.to_string(),
            file,
        })
    }

    /// Reads one packet into `buf`; `None` when none is waiting.
    fn read(&self, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
        match rustix::io::read(&self.file, buf) {
            Ok(n) => Ok(Some(n)),
            Err(Errno::AGAIN | Errno::INTR) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes one packet; `false` when the device could not take it now (it is dropped).
    fn write(&self, packet: &[u8]) -> std::io::Result<bool> {
        match rustix::io::write(&self.file, packet) {
            Ok(_) => Ok(true),
            Err(Errno::AGAIN) => Ok(false),
            // The kernel refused this packet (e.g. no route in the far namespace): drop it.
            Err(Errno::INVAL) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// Packets held by one link: a ring of fixed slots, filled at the tail, sent from the head.
struct HeldPackets {
    data: Vec<u8>,
    len: Vec<u16>,
    due: Vec<Instant>,
    head: usize,
    count: usize,
}

impl HeldPackets {
    fn new(capacity: usize) -> Self {
        HeldPackets {
            data: vec![0; capacity * SLOT],
            len: vec![0; capacity],
            due: vec![Instant::now(); capacity],
            head: 0,
            count: 0,
        }
    }

    fn capacity(&self) -> usize {
        self.len.len()
    }

    /// The free slot at the tail, if any.
    fn tail_slot(&mut self) -> Option<&mut [u8]> {
        if self.count == self.capacity() {
            return None;
        }
        let tail = (self.head + self.count) % self.capacity();
        Some(&mut self.data[tail * SLOT..(tail + 1) * SLOT])
    }

    /// Keeps the `len` bytes just read into the tail slot until `due`. Packets leave in arrival
    /// order: one made due earlier than the packet ahead of it (the delay shrank) waits for it.
    fn push(&mut self, len: usize, due: Instant) {
        let tail = (self.head + self.count) % self.capacity();
        self.len[tail] = len as u16;
        self.due[tail] = due;
        self.count += 1;
    }

    fn head_due(&self) -> Option<Instant> {
        (self.count > 0).then(|| self.due[self.head])
    }

    fn head_packet(&self) -> &[u8] {
        let start = self.head * SLOT;
        &self.data[start..start + self.len[self.head] as usize]
    }

    fn pop(&mut self) {
        self.head = (self.head + 1) % self.capacity();
        self.count -= 1;
    }
}

/// One direction of delay: packets read from `from` come out of `to`.
struct Link {
    from: Tun,
    to: Tun,
    held: HeldPackets,
    stats: LinkStats,
}

/// What a link did, printed when the delay line stops.
#[derive(Debug, Default, Serialize)]
struct LinkStats {
    from: String,
    to: String,
    packets: u64,
    bytes: u64,
    dropped_full: u64,
    dropped_refused: u64,
    most_held: usize,
    /// Latest a packet left after it was due, in microseconds.
    max_late_us: u64,
    /// Packets that left more than 1 ms after they were due.
    late_over_1ms: u64,
}

/// A `NETNS/DEVICE` pair as given on the command line.
fn parse_end(text: &str) -> anyhow::Result<(&str, &str)> {
    text.split_once('/')
        .filter(|(ns, dev)| !ns.is_empty() && !dev.is_empty())
        .with_context(|| format!("{text:?} is not NETNS/DEVICE"))
}

/// Gives this thread real-time FIFO priority and pins it to `cpu`, when asked and permitted.
fn tune_thread(realtime: bool, cpu: Option<usize>) -> anyhow::Result<()> {
    if let Some(cpu) = cpu {
        let mut set = CpuSet::new();
        set.set(cpu);
        rustix::thread::sched_setaffinity(None, &set)
            .with_context(|| format!("pinning the delay line to CPU {cpu}"))?;
    }
    if realtime {
        if let Err(e) = sys::set_realtime_fifo(50) {
            eprintln!(
                "xfer-harness: warning: no real-time priority for the delay line ({e}); timing \
                 may suffer under load"
            );
        }
    }
    Ok(())
}

/// Runs `xfer-harness delay-line` until SIGINT or SIGTERM.
pub fn run(args: DelayLineArgs) -> anyhow::Result<()> {
    if let Some(cpu) = args.cpu {
        if cpu >= CpuSet::MAX_CPU {
            bail!("--cpu {cpu} is beyond the CPUs this system can name");
        }
    }
    let mut links = Vec::new();
    for spec in &args.link {
        let (from, to) = spec
            .split_once('=')
            .with_context(|| format!("--link {spec:?} is not NETNS/DEV=NETNS/DEV"))?;
        let (from_ns, from_dev) = parse_end(from)?;
        let (to_ns, to_dev) = parse_end(to)?;
        links.push(Link {
            from: in_netns(from_ns, || Tun::attach(from_dev))?,
            to: in_netns(to_ns, || Tun::attach(to_dev))?,
            held: HeldPackets::new(args.capacity as usize),
            stats: LinkStats {
                from: from.to_string(),
                to: to.to_string(),
                ..LinkStats::default()
            },
        });
    }
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handlers")?;
    }
    // The harness starts the path before the transfer it measures: SIGUSR1 tells the delay
    // line that the transfer starts now, so the schedule's times count from there.
    let restart = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, restart.clone())
        .context("installing signal handlers")?;
    tune_thread(args.realtime, args.cpu)?;
    let schedule = args
        .schedule
        .clone()
        .unwrap_or_else(|| Timetable::constant(args.delay));
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    serve(&mut links, &schedule, &restart, &stop)?;
    for link in &links {
        serde_json::to_writer(&mut out, &link.stats)?;
        writeln!(out)?;
    }
    Ok(())
}

/// Moves packets until `stop` is set, delaying them as `schedule` says for the time since the
/// start or since `restart` was last set.
fn serve(
    links: &mut [Link],
    schedule: &Timetable<Duration>,
    restart: &AtomicBool,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let mut start = Instant::now();
    let mut scratch = vec![0u8; SLOT];
    // The poll set is built once, over duplicates of the devices' descriptors, so that it does
    // not borrow `links`, which the loop changes.
    let watched = links
        .iter()
        .map(|l| l.from.file.as_fd().try_clone_to_owned())
        .collect::<std::io::Result<Vec<OwnedFd>>>()
        .context("duplicating the devices' descriptors")?;
    let mut polls: Vec<PollFd<'_>> = watched
        .iter()
        .map(|fd| PollFd::new(fd, PollFlags::IN))
        .collect();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let next_due = links.iter().filter_map(|l| l.held.head_due()).min();
        // Wake for the next due packet, and at least every 100 ms to notice a stop.
        let wait = next_due
            .map_or(Duration::from_millis(100), |due| {
                due.saturating_duration_since(now)
            })
            .min(Duration::from_millis(100));
        let timeout = Timespec::try_from(wait).expect("at most 100 ms");
        match rustix::event::poll(&mut polls, Some(&timeout)) {
            Ok(_) => {}
            Err(Errno::INTR) => continue,
            Err(e) => return Err(std::io::Error::from(e)).context("waiting for packets"),
        }
        let now = Instant::now();
        if restart.swap(false, Ordering::Relaxed) {
            start = now;
        }
        let delay = *schedule.at(now - start);
        for (link, poll) in links.iter_mut().zip(&polls) {
            if poll.revents().contains(PollFlags::IN) {
                receive(link, now + delay, &mut scratch)?;
            }
            send_due(link, Instant::now())?;
        }
    }
    Ok(())
}

/// Reads every waiting packet of `link` into its ring, due at `due`.
fn receive(link: &mut Link, due: Instant, scratch: &mut [u8]) -> anyhow::Result<()> {
    loop {
        let read = match link.held.tail_slot() {
            Some(slot) => link.from.read(slot),
            None => {
                // Ring full: the packet is lost, as on a link whose buffer overflows.
                match link.from.read(scratch) {
                    Ok(Some(_)) => {
                        link.stats.dropped_full += 1;
                        continue;
                    }
                    other => other,
                }
            }
        }
        .with_context(|| format!("reading from {}", link.from.name))?;
        match read {
            Some(len) => {
                link.held.push(len, due);
                link.stats.most_held = link.stats.most_held.max(link.held.count);
            }
            None => return Ok(()),
        }
    }
}

/// Writes every packet of `link` that is due by `now`.
fn send_due(link: &mut Link, now: Instant) -> anyhow::Result<()> {
    while let Some(due) = link.held.head_due().filter(|d| *d <= now) {
        let packet = link.held.head_packet();
        let sent = link
            .to
            .write(packet)
            .with_context(|| format!("writing to {}", link.to.name))?;
        if sent {
            link.stats.packets += 1;
            link.stats.bytes += packet.len() as u64;
        } else {
            link.stats.dropped_refused += 1;
        }
        let late = now.saturating_duration_since(due).as_micros() as u64;
        link.stats.max_late_us = link.stats.max_late_us.max(late);
        link.stats.late_over_1ms += u64::from(late > 1000);
        link.held.pop();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_packets_leave_in_order_and_a_full_ring_takes_no_more() {
        let mut held = HeldPackets::new(2);
        let t0 = Instant::now();
        for (i, due) in [(1u8, t0 + Duration::from_millis(5)), (2, t0)] {
            let slot = held.tail_slot().unwrap();
            slot[0] = i;
            held.push(1, due);
        }
        assert!(held.tail_slot().is_none());
        // The second packet is due first but waits behind the first: no reordering.
        assert_eq!(held.head_due(), Some(t0 + Duration::from_millis(5)));
        assert_eq!(held.head_packet(), &[1]);
        held.pop();
        assert_eq!(held.head_packet(), &[2]);
        let slot = held.tail_slot().unwrap();
        slot[0] = 3;
        held.push(1, t0);
        held.pop();
        assert_eq!(held.head_packet(), &[3], "the ring wraps around");
        held.pop();
        assert_eq!(held.head_due(), None);
    }

    #[test]
    fn ends_are_netns_slash_device() {
        assert_eq!(parse_end("rcv/dl0").unwrap(), ("rcv", "dl0"));
        for bad in ["rcv", "/dl0", "rcv/", ""] {
            assert!(parse_end(bad).is_err(), "{bad}");
        }
    }
}
