//! SIGTERM and SIGINT, which stop `xfer send` and `xfer recv` gracefully: each command says
//! what a signal does, and a second one ends it at once.

use std::sync::{Arc, OnceLock};

use anyhow::Context;
use signal_hook::consts::{SIGINT, SIGTERM};

/// Runs `on_signal` with each SIGTERM or SIGINT (Ctrl-C) this process receives, on a thread of
/// its own, from now on: neither ends the process by itself any more.
pub fn on_stop_signals(mut on_signal: impl FnMut(Signal) + Send + 'static) -> anyhow::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
        .context("installing signal handlers")?;
    std::thread::Builder::new()
        .name("xfer-signals".into())
        .spawn(move || {
            for number in signals.forever() {
                on_signal(Signal(number));
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

/// From now on, the first SIGINT or SIGTERM runs `stop`, and the next ends xfer at once. The
/// signal that ran it, once one has.
pub fn stop_on_first(stop: impl Fn() + Send + 'static) -> anyhow::Result<Arc<OnceLock<Signal>>> {
    let received = Arc::new(OnceLock::new());
    let first = received.clone();
    on_stop_signals(move |signal| {
        if first.set(signal).is_ok() {
            stop();
        } else {
            eprintln!("xfer: {signal} again: stopping at once");
            std::process::exit(signal.exit_code());
        }
    })?;
    Ok(received)
}

/// A stopping signal received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signal(i32);

impl Signal {
    /// The exit status of a process this signal ended, as shells report it: 128 + its number
    /// (130 for SIGINT, 143 for SIGTERM).
    pub fn exit_code(self) -> i32 {
        128 + self.0
    }
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            SIGTERM => "SIGTERM",
            SIGINT => "SIGINT",
            _ => "a signal",
        })
    }
}
