//! `xfer recv`: serve sessions under a root directory.

use std::io::Write;

use anyhow::Context;
use transfer::auth::SessionKey;
use transfer::receiver::{Receiver, ReceiverConfig};

use crate::args::RecvArgs;

/// Binds, prints the address and key on stdout, and serves.
pub fn run(args: RecvArgs) -> anyhow::Result<()> {
    let (key, key_text) = match &args.key_file {
        Some(path) => (SessionKey::from_file(path)?, None),
        None => {
            let (text, key) = SessionKey::generate();
            (key, Some(text))
        }
    };
    let mut config = ReceiverConfig::new(args.root.clone(), key);
    config.limits.max_streams = args.max_streams;
    config.max_sessions = usize::try_from(args.max_sessions).unwrap_or(usize::MAX);
    config.session_memory = args.session_memory;
    config.idle_timeout = args.idle_timeout;
    config.handshake_timeout = args.handshake_timeout;
    let receiver = Receiver::bind(&args.listen, config)?;
    let addr = receiver.local_addr().context("reading the bound address")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on {addr}")?;
    match key_text {
        Some(text) => writeln!(out, "key {text}")?,
        None => writeln!(
            out,
            "key from {}",
            args.key_file.as_ref().expect("key file given").display()
        )?,
    }
    out.flush()?;
    drop(out);
    receiver.serve(args.once.then_some(1)).context("serving")?;
    Ok(())
}
