//! `xfer recv`: serve sessions under a root directory.

use std::io::Write;

use anyhow::Context;
use transfer::auth::SessionKey;
use transfer::receiver::{Receiver, ReceiverConfig};

use crate::args::RecvArgs;

/// Binds, prints the address and key on stdout, and serves.
pub fn run(args: RecvArgs) -> anyhow::Result<()> {
    if args.over_ssh {
        std::fs::create_dir_all(&args.root)
            .with_context(|| format!("creating {}", args.root.display()))?;
        exit_when_stdin_closes();
    }
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
    config.require_encryption = args.encrypt;
    config.transport = args.transport;
    config.direct_io = args.direct_io;
    let receiver = Receiver::bind(&args.listen, config)?;
    tracing::info!("serving over {}", receiver.transport());
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
    receiver
        .serve((args.once || args.over_ssh).then_some(1))
        .context("serving")?;
    tracing::info!(
        "peak memory resident: {} MiB",
        crate::peak_rss_bytes() >> 20
    );
    Ok(())
}

/// Over ssh, stdin is the sender's lifeline: it closes when the sender ends (also when it was
/// killed), and a receiver left behind would only hold a port. Exiting mid-session is safe:
/// verified chunks are journaled, and the next run resumes from them.
fn exit_when_stdin_closes() {
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        tracing::warn!("the ssh channel to the sender closed before the session ended: exiting");
        std::process::exit(1);
    });
}
