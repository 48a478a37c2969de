//! `xfer`: send files, directory trees or generated data over parallel TCP streams, and run
//! the stream-count optimisers on a simulated path.

// The doc comments of `args` are clap's help text, where brackets mean "optional"
// (`HOST:PORT[:DEST]`), not links.
#![allow(rustdoc::broken_intra_doc_links)]

mod args;
mod controllers;
mod env;
mod fetch;
mod generate;
mod metrics_endpoint;
mod model;
mod nodes;
mod recv;
mod remote_send;
mod report;
mod send;
mod signals;
mod sim;
mod srun_start;
mod ssh_start;

use std::io::IsTerminal;

use clap::{CommandFactory, FromArgMatches};

fn main() {
    // The revision and the built-in policy, so that a report names exactly what ran.
    let version = format!(
        "{} (revision {}; built-in policy {})",
        env!("CARGO_PKG_VERSION"),
        env!("XFER_REVISION"),
        transfer::policy_source::builtin_summary()
    );
    // Made once, for the life of the process (clap takes a version of `'static` text).
    let version: &'static str = Box::leak(version.into_boxed_str());
    let command = args::Cli::command().version(version);
    let matches = command.clone().get_matches();
    let mut cli = args::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let (args::Command::Send(send), Some(("send", sent))) =
        (&mut cli.command, matches.subcommand())
    {
        send.rules = args::filter_rules(sent);
    }
    let default_level = match &cli.command {
        // Over ssh, the receiver's messages reach the sender's terminal: problems only.
        args::Command::Recv(a) if !a.over_ssh => "info",
        _ => "warn",
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("XFER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        // A closed stderr (the ssh channel of a receiver started over ssh, a daemon's closed
        // log pipe) must not make logging panic the thread that logs.
        .log_internal_errors(false)
        .with_target(false);
    match cli.log_format {
        args::LogFormat::Text => logs.init(),
        args::LogFormat::Json => logs.json().with_current_span(false).init(),
    }
    if matches!(cli.command, args::Command::Send(_) | args::Command::Recv(_)) {
        raise_open_file_limit();
        // Large chunks go through mapped files: less CPU per byte than copies.
        transfer::enable_mapped_files();
    }
    let result = match cli.command {
        args::Command::Send(a) => send::run(*a),
        args::Command::Recv(a) => recv::run(a),
        args::Command::Sim(a) => sim::run(a),
        args::Command::Env(a) => env::run(a),
        args::Command::Model(a) => model::run(a),
        args::Command::Generate(a) => generate::run(a, command),
    };
    if let Err(e) = result {
        // Stopped by the user, not failed: said as such, with the status a shell expects.
        if let Some(stopped) = e.downcast_ref::<send::Interrupted>() {
            eprintln!("xfer: {stopped}");
            std::process::exit(stopped.signal.exit_code());
        }
        eprintln!("xfer: error: {e:#}");
        std::process::exit(1);
    }
}

/// The most memory this process has had resident at once (its peak RSS), in bytes: `VmHWM`
/// of /proc/self/status, the figure `getrusage` reports as `ru_maxrss`; 0 where it cannot be
/// read.
fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|kib| kib.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// Raises this process's soft limit on open files to its hard limit: a receiver serving many
/// sessions holds a socket per stream and a file per chunk being written, more than the usual
/// soft limit of 1024. Where it cannot be raised, the lower limit stays (the reason is logged
/// at debug level).
fn raise_open_file_limit() {
    if let Err(e) = rlimit::increase_nofile_limit(u64::MAX) {
        tracing::debug!("cannot raise the open-file limit: {e}");
    }
}
