//! A chaos proxy for the fault-injection suite: it sits between `xfer send` and `xfer recv` on
//! loopback, forwards every connection it accepts, and injects one fault into one of them (the
//! `n`th accepted connection; 0 is the control connection) once a given number of bytes has passed
//! in one direction: the connection is reset, stalled, or one bit of one byte is flipped.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Which way bytes flow through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Sender to receiver: manifests, seals, chunks.
    ToReceiver,
    /// Receiver to sender: plans, heartbeats, acknowledgements.
    ToSender,
}

/// What happens to the faulted connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Both ends are cut off abortively: the peers see a reset.
    Reset,
    /// The direction stops forwarding for this long, or until the connection closes (`None`).
    Stall(Option<Duration>),
    /// This bit (0-7) of the byte at the trigger offset is inverted.
    Flip(u8),
}

/// One fault: what, on which connection, in which direction, after how many bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Index of the connection in accept order (0: the control connection).
    pub connection: usize,
    /// The direction whose byte count triggers the fault (and that a stall or flip affects).
    pub direction: Direction,
    /// Bytes forwarded in that direction before the fault.
    pub after_bytes: u64,
    /// The fault.
    pub fault: Fault,
}

/// A running proxy; dropping it closes every connection it forwards.
pub struct ChaosProxy {
    /// `HOST:PORT` to give `xfer send` instead of the receiver's address.
    pub addr: String,
    injected: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl ChaosProxy {
    /// Listens on a free loopback port and forwards to `upstream` with `plan` applied.
    pub fn start(upstream: &str, plan: Plan) -> ChaosProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let injected = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let upstream = upstream.to_string();
        let acceptor = {
            let (injected, stop) = (injected.clone(), stop.clone());
            std::thread::spawn(move || accept_loop(listener, &upstream, plan, &injected, &stop))
        };
        ChaosProxy {
            addr,
            injected,
            stop,
            acceptor: Some(acceptor),
        }
    }

    /// Whether the fault has happened (its connection carried enough bytes).
    pub fn injected(&self) -> bool {
        self.injected.load(Ordering::Acquire)
    }
}

impl Drop for ChaosProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// One forwarded connection: both sockets, and whether it has closed.
struct Link {
    sender: TcpStream,
    receiver: TcpStream,
    closed: AtomicBool,
}

impl Link {
    /// Closes both ends once: with FINs, or when `abort`, with resets (`SO_LINGER` 0, and only
    /// the reading sides shut down so that both pumps stop and the sockets close when they drop).
    fn close(&self, abort: bool) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        for socket in [&self.sender, &self.receiver] {
            if abort {
                let _ = socket2::SockRef::from(socket).set_linger(Some(Duration::ZERO));
                let _ = socket.shutdown(Shutdown::Read);
            } else {
                let _ = socket.shutdown(Shutdown::Both);
            }
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    upstream: &str,
    plan: Plan,
    injected: &Arc<AtomicBool>,
    stop: &Arc<AtomicBool>,
) {
    let mut accepted = 0;
    let mut links: Vec<Weak<Link>> = Vec::new();
    let mut pumps = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let sender = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(_) => continue,
        };
        let index = accepted;
        accepted += 1;
        let Ok(receiver) = TcpStream::connect(upstream) else {
            continue; // the receiver is gone: the sender sees its connection close
        };
        sender.set_nonblocking(false).unwrap();
        let link = Arc::new(Link {
            sender,
            receiver,
            closed: AtomicBool::new(false),
        });
        links.push(Arc::downgrade(&link));
        for direction in [Direction::ToReceiver, Direction::ToSender] {
            let fault = (plan.connection == index && plan.direction == direction).then_some(plan);
            let (link, injected, stop) = (link.clone(), injected.clone(), stop.clone());
            pumps.push(std::thread::spawn(move || {
                pump(&link, direction, fault, &injected, &stop)
            }));
        }
    }
    for link in links.iter().filter_map(Weak::upgrade) {
        link.close(false);
    }
    for pump in pumps {
        let _ = pump.join();
    }
}

/// Forwards one direction of `link` until either side closes, applying `fault` on the way.
fn pump(
    link: &Link,
    direction: Direction,
    mut fault: Option<Plan>,
    injected: &AtomicBool,
    stop: &AtomicBool,
) {
    let (mut from, mut to) = match direction {
        Direction::ToReceiver => (&link.sender, &link.receiver),
        Direction::ToSender => (&link.receiver, &link.sender),
    };
    let mut buf = vec![0u8; 64 << 10];
    let mut passed = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut chunk = &mut buf[..n];
        if let Some(plan) = fault.filter(|p| passed + n as u64 > p.after_bytes) {
            fault = None;
            let at = (plan.after_bytes - passed) as usize;
            let (before, after) = chunk.split_at_mut(at);
            if to.write_all(before).is_err() {
                break;
            }
            passed += at as u64;
            injected.store(true, Ordering::Release);
            match plan.fault {
                Fault::Reset => return link.close(true),
                Fault::Stall(pause) => {
                    let until = pause.map(|p| Instant::now() + p);
                    while !stop.load(Ordering::Acquire)
                        && !link.closed.load(Ordering::Acquire)
                        && until.is_none_or(|t| Instant::now() < t)
                    {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
                Fault::Flip(bit) => after[0] ^= 1 << bit,
            }
            chunk = after;
        }
        if to.write_all(chunk).is_err() {
            break;
        }
        passed += chunk.len() as u64;
    }
    link.close(false);
}
