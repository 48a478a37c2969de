//! `xfer recv`: serve sessions under a root directory, set up by flags or by a configuration
//! file (`--config`, [`ReceiverSettings`]), until stopped: SIGTERM or SIGINT lets the sessions
//! running finish (for `shutdown_grace`), a second one ends them at once.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use transfer::auth::{KeySetting, SessionKey};
use transfer::receiver::{Receiver, ReceiverSettings, Stopper};

use crate::args::RecvArgs;

/// Binds, prints the address and key on stdout, and serves.
pub fn run(args: RecvArgs) -> anyhow::Result<()> {
    let mut settings = match &args.config {
        Some(path) => read_settings(path)?,
        None => settings_from_flags(&args)?,
    };
    let mut dest = None;
    if args.over_ssh && args.dry_run {
        let (existing, missing) = nearest_existing(&settings.root);
        settings.root = existing;
        dest = Some(missing);
    } else if args.over_ssh {
        std::fs::create_dir_all(&settings.root)
            .with_context(|| format!("creating {}", settings.root.display()))?;
    }
    if args.over_ssh {
        crate::ssh_start::exit_when_stdin_closes("sender");
    }
    let grace = settings.shutdown_grace;
    let receiver = Receiver::bind(&settings)?;
    if let Some(addr) = args.metrics {
        crate::metrics_endpoint::serve(addr)?;
    }
    let quic = if receiver.serves_quic() {
        ", and quic on the UDP port of the same number"
    } else {
        ""
    };
    tracing::info!("serving over {}{quic}", receiver.transport());
    stop_on_signals(receiver.stopper(), grace)?;
    let addr = receiver.local_addr().context("reading the bound address")?;
    let mut out = std::io::stdout().lock();
    if let Some(dest) = dest {
        writeln!(out, "dest {}", dest.display())?;
    }
    writeln!(out, "listening on {addr}")?;
    match (&settings.key, &args.config) {
        (KeySetting::File(path), _) => writeln!(out, "key from {}", path.display())?,
        (KeySetting::Text(_), Some(config)) => writeln!(out, "key in {}", config.display())?,
        (KeySetting::Text(text), None) => writeln!(out, "key {text}")?,
        // Kinds of key setting a later library brings.
        (_, _) => writeln!(out, "key as configured")?,
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

/// The settings of a configuration file (TOML).
fn read_settings(path: &Path) -> anyhow::Result<ReceiverSettings> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the configuration {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("in {}", path.display()))
}

/// The settings the flags give, with a one-time key unless `--key-file` names one.
fn settings_from_flags(args: &RecvArgs) -> anyhow::Result<ReceiverSettings> {
    let root = args
        .root
        .clone()
        .context("--root DIR or --config FILE is needed")?;
    let key = match &args.key_file {
        Some(path) => KeySetting::File(path.clone()),
        None => KeySetting::Text(SessionKey::generate().0),
    };
    let mut settings = ReceiverSettings::new(root, key);
    settings.listen = args.listen.clone();
    settings.access = args.access;
    settings.options.third_party = args.third_party;
    settings.options.max_streams = args.max_streams;
    settings.options.max_sessions = usize::try_from(args.max_sessions).unwrap_or(usize::MAX);
    settings.options.session_memory = args.session_memory;
    settings.options.idle_timeout = args.idle_timeout;
    settings.options.handshake_timeout = args.handshake_timeout;
    settings.options.max_handshakes = usize::try_from(args.max_handshakes).unwrap_or(usize::MAX);
    settings.options.max_handshakes_per_source =
        usize::try_from(args.max_handshakes_per_source).unwrap_or(usize::MAX);
    settings.shutdown_grace = args.shutdown_grace;
    settings.options.require_encryption = args.encrypt;
    settings.options.require_integrity = args.integrity;
    settings.options.transport = args.transport;
    settings.options.quic = !args.no_quic;
    settings.options.direct_io = args.direct_io;
    Ok(settings)
}

/// The first SIGTERM or SIGINT stops the receiver within `grace`; the next ends the sessions
/// left at once.
fn stop_on_signals(stopper: Stopper, grace: std::time::Duration) -> anyhow::Result<()> {
    let mut grace = grace;
    crate::signals::on_stop_signals(move |signal| {
        tracing::info!("{signal}: stopping (again to end the running sessions at once)");
        stopper.stop(grace);
        grace = std::time::Duration::ZERO;
    })
}

/// The nearest directory at or above `root` that exists, and the path from it down to `root`
/// (empty when `root` exists): a dry run plans under a directory a run would make, and makes
/// none.
pub fn nearest_existing(root: &Path) -> (PathBuf, PathBuf) {
    let mut missing = Vec::new();
    let mut at = root;
    while !at.is_dir() {
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name);
                at = if parent.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    parent
                };
            }
            _ => break,
        }
    }
    (at.to_path_buf(), missing.iter().rev().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNIT: &str = include_str!("../systemd/xfer-recv.service");
    const CONFIG: &str = include_str!("../systemd/recv.toml");

    /// The value of `key=` in the unit.
    fn unit_value(key: &str) -> &'static str {
        UNIT.lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("the unit has no {key}"))
    }

    #[test]
    fn the_shipped_unit_runs_a_command_xfer_takes_with_the_shipped_configuration() {
        use clap::Parser;
        let words = shell_words::split(unit_value("ExecStart")).unwrap();
        let cli = crate::args::Cli::try_parse_from(&words).unwrap();
        let crate::args::Command::Recv(args) = cli.command else {
            panic!("ExecStart runs {words:?}, not xfer recv");
        };
        assert_eq!(
            args.config.as_deref(),
            Some(Path::new("/etc/xfer/recv.toml"))
        );
        let settings: ReceiverSettings = toml::from_str(CONFIG).unwrap();
        assert_eq!(settings.key, KeySetting::File("/etc/xfer/key".into()));
        assert!(unit_value("ReadWritePaths").contains(settings.root.to_str().unwrap()));
        let stop_timeout: f64 = unit_value("TimeoutStopSec").parse().unwrap();
        assert!(
            stop_timeout > settings.shutdown_grace.as_secs_f64() + 5.0,
            "systemd must wait longer than the grace period and the 2 s close"
        );
    }

    #[test]
    fn a_dry_run_over_ssh_is_served_from_the_nearest_directory_that_exists() {
        let dir = tempfile::tempdir().unwrap();
        let wanted = dir.path().join("remote/in coming");
        assert_eq!(
            nearest_existing(&wanted),
            (dir.path().to_path_buf(), PathBuf::from("remote/in coming"))
        );
        assert_eq!(
            nearest_existing(dir.path()),
            (dir.path().to_path_buf(), PathBuf::new())
        );
        assert_eq!(
            nearest_existing(Path::new("surely-not-here-xfer/x")),
            (PathBuf::from("."), PathBuf::from("surely-not-here-xfer/x"))
        );
    }

    #[test]
    fn a_configuration_file_with_a_mistake_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("recv.toml");
        std::fs::write(
            &path,
            "root = \"/data\"\nkey = { file = \"/k\" }\nmax_sesions = 3\n",
        )
        .unwrap();
        let err = format!("{:#}", read_settings(&path).unwrap_err());
        assert!(
            err.contains("recv.toml") && err.contains("max_sesions"),
            "{err}"
        );
        let err = format!(
            "{:#}",
            read_settings(&dir.path().join("missing.toml")).unwrap_err()
        );
        assert!(err.contains("missing.toml"), "{err}");
    }
}
