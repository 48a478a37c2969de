//! Command-line arguments and the parsers for destinations, sizes and times.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::controllers::OptimizerList;
use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use optimizer::env::{InitialStreams, RewardKind};
use optimizer::policy::ObservationLayout;
use optimizer::{parse_time, RewardParams, UtilityParams};
use serde::{Deserialize, Serialize};
use transfer::filter::Rule;
use transfer::optimizer_choice::{OptimizerChoice, Tuning};
use transfer::policy_source::PolicyRuntime;
use transfer::quic::Congestion;
use transfer::receiver::{
    Access, DEFAULT_MAX_HANDSHAKES, DEFAULT_MAX_HANDSHAKES_PER_SOURCE, DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_STREAMS,
};
use transfer::sender::{RateSchedule, DEFAULT_UNSENT_LIMIT, MIN_STALL_TIMEOUT};
use transfer::transport::Transport;
use transfer::units::parse_size;

/// Move data fast between sites over parallel TCP streams.
#[derive(Debug, Parser)]
#[command(name = "xfer", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// How log lines on stderr look: text, or json (one object per line, for a log
    /// collector). XFER_LOG sets the level (error, warn, info, debug).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// How log lines look ([`Cli::log_format`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// For people.
    Text,
    /// One JSON object per line.
    Json,
}

/// How the head of a striped transfer starts the sending nodes' senders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
pub enum Launcher {
    /// Over ssh, as for one remote host.
    Ssh,
    /// With srun, inside a Slurm allocation; the transfer is sealed with MUNGE.
    Srun,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Send files, directory trees or generated data to a receiver.
    Send(Box<SendArgs>),
    /// Receive sessions on one port and write them under a root directory.
    Recv(RecvArgs),
    /// Run a stream-count optimiser on a simulated network path.
    Sim(SimArgs),
    /// Serve the environment protocol (reset/step as JSON lines on stdin and stdout) over the
    /// simulator, for training a policy (training/).
    Env(EnvArgs),
    /// Show a learned policy's metadata, check it against its golden vectors and time its
    /// decisions.
    Model(ModelArgs),
    /// Write the manual pages or a shell's completion script, generated from this command
    /// line's definition (the Debian package ships both: scripts/package-deb).
    #[command(subcommand)]
    Generate(GenerateArgs),
}

/// `xfer generate`.
#[derive(Debug, Subcommand)]
pub enum GenerateArgs {
    /// Write one manual page per command (xfer.1, xfer-send.1, xfer-recv.1, ...) into DIR.
    #[command(after_help = "Example:\n  xfer generate man /usr/local/share/man/man1")]
    Man {
        /// Where the pages go (made if missing).
        dir: PathBuf,
    },
    /// Print the completion script of a shell on stdout.
    #[command(
        after_help = "Examples:\n  xfer generate completions bash > /etc/bash_completion.d/xfer\n  xfer generate completions zsh > ~/.zfunc/_xfer"
    )]
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// `xfer sim`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  xfer sim --scenario paper-fig2 --optimizer gd\n  xfer sim --scenario my-path.toml --optimizer fixed:8 --duration 60s --json\n  xfer sim --scenario all --optimizer gd,bo,fixed:8 --seeds 5"
)]
pub struct SimArgs {
    /// Shipped scenarios by name (paper-fig2, chameleon-uc-tacc, cloudlab-1g, lossy-long-haul,
    /// background-arrives, shallow-buffer; paths that change: background-leaves,
    /// deep-buffer-arrive-leave, capacity-halves-doubles, rtt-rises-falls, loss-comes-and-goes;
    /// slow-connect, shallow-long-haul, lossy-80ms), scenario TOML files, or random:FAMILY:SEED
    /// (a random path; families mixed, capped, lossy, shallow, background, fast, changing),
    /// separated by commas; `all` is every shipped scenario.
    #[arg(long, value_delimiter = ',', required = true)]
    pub scenario: Vec<String>,
    /// Controllers, separated by commas: gd, bo, fixed:N, schedule:TIME:N,... (counts on a
    /// timetable, e.g. schedule:0s:1,15s:6: the first is the starting count), ppo (the
    /// built-in policy),
    /// ppo:PATH (an export of training/), auto or auto:PATH (that policy guarded and
    /// fine-tuned by a probing tuner) [default: auto, or gd when --k/--b ask for a utility
    /// the built-in policy was not trained for].
    #[arg(long)]
    pub optimizer: Vec<OptimizerList>,
    /// Simulated time.
    #[arg(long, default_value = "200s", value_parser = parse_positive_time)]
    pub duration: Duration,
    /// Seed of the simulated measurement noise and of the controller's random choices (the
    /// first, with --seeds).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Runs per scenario and controller, with consecutive seeds. More than one run in all
    /// prints a table of means instead of a trace (with --json, every run's summary).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub seeds: u64,
    #[command(flatten)]
    pub tuning: TuningArgs,
    /// Print one JSON object per interval and a JSON summary instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `xfer env`.
#[derive(Debug, Args)]
#[command(
    after_help = "Requests, one JSON object per line on stdin, each answered by one line on stdout:\n  {\"op\":\"describe\"}            input layout, actions, utility, reward\n  {\"op\":\"reset\",\"seed\":7}      start an episode; its first observation\n  {\"op\":\"step\",\"action\":0}     apply action 0..4 (+5, +1, 0, -1, -5 streams), run one interval\n  {\"op\":\"close\"}\n\nExamples:\n  xfer env --randomize 1\n  xfer env --scenario paper-fig2 --duration 60s"
)]
pub struct EnvArgs {
    /// Every episode on this scenario: a shipped name, a TOML file, or random:FAMILY:SEED.
    #[arg(
        long,
        conflicts_with = "randomize",
        required_unless_present = "randomize"
    )]
    pub scenario: Option<String>,
    /// Every episode on a new random scenario; SEED draws the seeds of resets that bring none.
    #[arg(long, value_name = "SEED")]
    pub randomize: Option<u64>,
    /// Family of the random scenarios: mixed, capped, lossy, shallow, background, fast,
    /// changing, or all (each episode's family drawn from its seed among the first six, those
    /// the shipped policies were trained on).
    #[arg(long, default_value = "all", requires = "randomize", value_parser = parse_family)]
    pub family: FamilyChoice,
    /// Simulated time per episode.
    #[arg(long, default_value = "100s", value_parser = parse_positive_time)]
    pub duration: Duration,
    /// Signal vectors in each observation.
    #[arg(long, default_value_t = ObservationLayout::default().history as u32, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub history: u32,
    /// Past changes of the stream count in each observation.
    #[arg(long, default_value_t = ObservationLayout::default().action_history as u32, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub action_history: u32,
    /// Streams in each episode's first interval: a count; random (drawn from the episode's
    /// seed in 1..=--max-streams, so an agent also learns to come down); or random:SHARE
    /// (random in that share of episodes, 1 in the others).
    #[arg(long, default_value = "1")]
    pub initial_streams: InitialStreams,
    /// Reward of each step: utility (the interval's utility over the best reachable) or
    /// change (paper 001: --reward-x, --reward-y or 0 by the change of utility).
    #[arg(long, default_value = "utility", value_parser = parse_reward_kind)]
    pub reward: RewardKind,
    #[command(flatten)]
    pub tuning: TuningArgs,
}

/// A scenario family, or every family (`None`).
#[derive(Debug, Clone, Copy)]
pub struct FamilyChoice(pub Option<optimizer::sim::Family>);

fn parse_family(s: &str) -> Result<FamilyChoice, String> {
    match s {
        "all" => Ok(FamilyChoice(None)),
        _ => s.parse().map(|f| FamilyChoice(Some(f))),
    }
}

fn parse_reward_kind(s: &str) -> Result<RewardKind, String> {
    match s {
        "utility" => Ok(RewardKind::Utility),
        "change" => Ok(RewardKind::Change),
        _ => Err(format!("{s:?} is not a reward: utility or change")),
    }
}

/// `xfer model`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  xfer model\n  xfer model models/default --policy-runtime torchscript"
)]
pub struct ModelArgs {
    /// An export directory of training/ (or its metadata.json) [default: the built-in policy].
    pub path: Option<PathBuf>,
    /// What runs the policy: onnx or torchscript (builds with the tch feature).
    #[arg(long, default_value = "onnx")]
    pub policy_runtime: PolicyRuntime,
    /// Decisions to time.
    #[arg(long, default_value_t = 20_000)]
    pub decisions: u32,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// How the stream-count optimiser measures and judges, for `send` and `sim` alike.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub struct TuningArgs {
    /// Monitoring interval: how often the controller sees the signals and decides.
    #[arg(long, default_value = "1s", value_parser = parse_positive_time)]
    pub mi: Duration,
    /// Most streams the controller may use.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub max_streams: u32,
    /// Utility: cost of each extra stream, K in U = T/K^n - T*L*B (at least 1) [default: the
    /// K a ppo or auto model was trained for, else 1.02].
    #[arg(long)]
    pub k: Option<f64>,
    /// Utility: loss penalty, B in U = T/K^n - T*L*B (at least 0) [default: the B a ppo or auto
    /// model was trained for, else 10].
    #[arg(long)]
    pub b: Option<f64>,
    /// Reward when the utility rose by more than --reward-eps.
    #[arg(long, default_value_t = RewardParams::default().x, allow_negative_numbers = true)]
    pub reward_x: f64,
    /// Reward when the utility fell by more than --reward-eps.
    #[arg(long, default_value_t = RewardParams::default().y, allow_negative_numbers = true)]
    pub reward_y: f64,
    /// Change of utility, relative to the previous interval's, that counts as none.
    #[arg(long, default_value_t = RewardParams::default().eps)]
    pub reward_eps: f64,
    /// What runs a learned policy (ppo): onnx (pure Rust, every build) or torchscript
    /// (libtorch; builds with the tch feature).
    #[arg(long, default_value = "onnx")]
    pub policy_runtime: PolicyRuntime,
}

impl TuningArgs {
    /// The library's tuning these flags give.
    pub fn tuning(&self) -> Tuning {
        Tuning {
            interval: self.mi,
            max_streams: self.max_streams,
            k: self.k,
            b: self.b,
            policy_runtime: self.policy_runtime,
            reward: RewardParams {
                x: self.reward_x,
                y: self.reward_y,
                eps: self.reward_eps,
            },
        }
    }

    /// The utility parameters `--k` and `--b` give, with the defaults for those not given.
    pub fn utility(&self) -> anyhow::Result<UtilityParams> {
        Ok(self.tuning().utility_or(UtilityParams::default())?)
    }
}

/// `xfer send`.
#[derive(Debug, Args)]
#[command(
    after_help = "The session key (printed by `xfer recv`) comes from XFER_KEY, from --key-file, or \
                  from the terminal, which asks for it; never from the command line, where \
                  every user of the machine could read it.\n\n\
                  Examples:\n  \
                  XFER_KEY=KEY xfer send data/ results.h5 host:9000:incoming --streams 8\n  \
                  xfer send --mem 10GiB 127.0.0.1:9000 --key-file ~/.xfer-key --json\n  \
                  xfer send user@dtn1:/data/run7 results/        (pull: dtn1 sends here)\n  \
                  xfer send dtn1:/data/run7 dtn2:/archive        (third-party: dtn1 sends to dtn2)"
)]
// Serialized as the request to a sender started over ssh (`remote_send`), which runs with
// the options given here.
#[derive(Clone, Serialize, Deserialize)]
pub struct SendArgs {
    /// Files and directories to send, then the destination: HOST:PORT[:DEST] for a running
    /// receiver (DEST is a directory under its root; IPv6 hosts in brackets: [::1]:9000), or
    /// [USER@]HOST:[DIR] to start a receiver on HOST over ssh for this transfer (DIR is
    /// absolute or under the remote home, and is created if missing). Sources named
    /// [USER@]HOST:PATH are sent by HOST, started over ssh: to a local directory (a pull), or
    /// to another host (a third-party transfer, whose data goes from HOST to it directly). A
    /// name is remote when a colon comes before any slash (./a:b is a local file). With
    /// --nodes, the paths are on the sending nodes and the destination a directory on the
    /// receiving nodes, without hosts.
    #[arg(required_unless_present_any = ["over_ssh", "over_srun"], num_args = 1.., value_name = "PATH... DESTINATION")]
    pub args: Vec<String>,
    /// Started by another xfer over ssh to send from this host: the transfer comes as JSON on
    /// stdin, the reports go back as JSON lines on stdout, and the sender exits as soon as the
    /// ssh channel (stdin) closes.
    #[arg(long, hide = true)]
    pub over_ssh: bool,
    /// Started by the head of a striped transfer with srun (--launcher srun): as --over-ssh,
    /// but the transfer on stdin is sealed with MUNGE.
    #[arg(long, hide = true, conflicts_with = "over_ssh")]
    pub over_srun: bool,
    /// For a pull: the address and port this host's receiver listens on for the remote
    /// sender's streams, which connect to it directly [default: any free port, on the address
    /// the ssh connection comes from].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,
    /// Not accepted: a key on the command line is visible to every user in `ps`. Kept only to
    /// say so clearly.
    #[arg(long, hide = true)]
    pub key: Option<String>,
    /// Read the receiver's session key from this file (only its owner may read it: mode 600).
    /// Otherwise it comes from XFER_KEY, or the terminal asks for it. Not used when xfer
    /// starts the receiver over ssh: its key comes back over the ssh channel. For a pull from a
    /// daemon (HOST:PORT:PATH... DIR), the daemon's key.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// For a transfer from one daemon to another (HOSTA:PORT:PATH... HOSTB:PORT:DEST): read
    /// the source daemon's key from this file; otherwise from XFER_SOURCE_KEY. The
    /// destination's key is --key-file's (or XFER_KEY), as for a push.
    #[arg(long)]
    pub source_key_file: Option<PathBuf>,
    /// The ssh client that starts a receiver for [USER@]HOST:DIR, with any options, split as a
    /// shell would (e.g. "ssh -p 2222 -F ~/.ssh/xfer_config"). The user's ssh config applies.
    #[arg(long, env = "XFER_SSH", default_value = "ssh")]
    pub ssh_command: String,
    /// The xfer command on the remote host, as its shell runs it (e.g. /opt/xfer/bin/xfer).
    #[arg(long, default_value = "xfer")]
    pub remote_xfer: String,
    /// Parallel TCP streams to start with [default: 4; fixed:N and schedules start at their
    /// own]. Without --optimizer, the count stays at this for the whole transfer (the
    /// controller is fixed:N, not held to --max-streams).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub streams: Option<u32>,
    /// Who chooses the stream count each monitoring interval: gd (gradient ascent on the
    /// utility), bo (Bayesian optimisation), ppo (the built-in learned policy), ppo:PATH (an
    /// export of training/), auto or auto:PATH (that policy, with a tuner that takes over
    /// once it settles, probes the counts next to it and hands back when the path changes),
    /// external:SOCKET (an agent on a Unix socket xfer listens on,
    /// speaking the protocol of `xfer env`), fixed:N or schedule:TIME:N,... (counts on a
    /// timetable, on interval boundaries, e.g. schedule:0s:1,15s:6,40s:1; with --mi 100ms
    /// they change every 100 ms) [default: auto (gd when --k/--b ask for a utility the
    /// built-in policy was not trained for), or fixed:N when --streams N is given].
    #[arg(long)]
    pub optimizer: Option<OptimizerChoice>,
    /// Write one JSON line per monitoring interval here: the signals, utility, reward, the
    /// controller's decision and how long it took.
    #[arg(long, value_name = "FILE")]
    pub mi_log: Option<PathBuf>,
    /// Print a line per monitoring interval above the progress bar: its rate, loss and RTT,
    /// the utility, and the stream count chosen from it, by whom and, when control changed
    /// hands, why.
    #[arg(long, short, conflicts_with_all = ["json", "quiet"])]
    pub verbose: bool,
    /// Seed of the controller's random choices (bo's first stream counts): runs with one seed
    /// try the same counts first.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub tuning: TuningArgs,
    /// Send the files that match this glob (repeatable). --include and --exclude apply in the
    /// order given and the first that matches decides; a file none matches is sent, unless
    /// every rule is an --include (--include '*.h5' alone sends only those). A pattern without
    /// / matches a name at any depth (*.h5), one with / the path from the source's top
    /// (raw/*.h5), one ending in / a directory. With any filter, only directories that hold a
    /// file sent are created.
    #[arg(long, value_name = "PATTERN", conflicts_with = "mem")]
    pub include: Vec<String>,
    /// Leave out the files that match this glob, or the directories (not even read) for a
    /// pattern ending in / (repeatable; see --include).
    #[arg(long, value_name = "PATTERN", conflicts_with = "mem")]
    pub exclude: Vec<String>,
    /// Send only the paths listed in FILE (- for stdin), relative to their source, one per
    /// line (blank lines and lines starting with # or ; are skipped) or NUL-separated; a
    /// directory listed brings all of it. --include and --exclude then choose among them.
    #[arg(long, value_name = "FILE", conflicts_with = "mem")]
    pub files_from: Option<PathBuf>,
    /// The --include and --exclude rules in the order given (from the parsed matches, as
    /// clap keeps each option's values apart).
    #[arg(skip)]
    pub rules: Vec<Rule>,
    /// Send SIZE bytes of generated data to a discarding sink (memory-to-memory benchmark).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub mem: Option<u64>,
    /// Also compare a BLAKE3 hash of every whole file end to end.
    #[arg(long, conflicts_with = "mem")]
    pub verify: bool,
    /// List what a run would send, resume and skip, file by file with sizes and a total, as
    /// the receiver plans it now; nothing is sent, and nothing changes at the receiver.
    #[arg(short = 'n', long, conflicts_with_all = ["mem", "mi_log"])]
    pub dry_run: bool,
    /// Compare files already at the destination by content (BLAKE3, hashed on both sides), not
    /// by size and mtime: one rewritten with the same size and mtime is sent again, one of the
    /// same content is kept (with the source's mode and mtime). Every source file is read once
    /// more to hash it.
    #[arg(long, conflicts_with = "mem")]
    pub checksum: bool,
    /// Mirror: once every file is in place, remove what the directories sent hold at the
    /// destination and the sources do not (as rsync's --delete), keeping what --include,
    /// --exclude and --files-from leave out. A file sent alone removes nothing beside it. See
    /// first what it would remove with --dry-run --delete.
    #[arg(long, conflicts_with = "mem")]
    pub delete: bool,
    /// Send one node's share of a striped transfer: node INDEX of COUNT (0/3, 1/3 and 2/3 for
    /// three), each run on a host that reads the same sources from a shared file system, to
    /// a receiver of its own whose root is on one shared file system too. Every node deals the
    /// files and the 16 MiB pieces of large ones out by the same rule and sends its share; a
    /// file is placed once all its pieces arrived, by whichever receiver got the last. Run
    /// again with any count, the nodes send only what is missing.
    #[arg(long, value_name = "INDEX/COUNT",
          conflicts_with_all = ["mem", "delete", "checksum", "verify", "dry_run"])]
    pub stripe: Option<transfer::stripe::Stripe>,
    /// Stripe the transfer over node pairs, all started from this host (over ssh; see also
    /// --launcher): FILE holds a line per pair, SENDER RECEIVER ([USER@]HOST each; # starts a
    /// comment). The paths name the sources on the sending nodes' shared file system and the
    /// destination a directory on the receiving nodes' (absolute, or under the remote home). Each
    /// pair sends its stripe over its own streams, directly; a pair that fails has its stripe sent
    /// again by another at once, which sends only what is missing, and the summary says so.
    #[arg(long, value_name = "FILE",
          conflicts_with_all = ["stripe", "mem", "delete", "checksum", "verify", "dry_run",
                                "key_file", "listen", "over_ssh", "over_srun"])]
    pub nodes: Option<PathBuf>,
    /// How the head (--nodes) starts the sending nodes' senders: over ssh, or with srun as
    /// steps of the Slurm allocation it runs in (the sending nodes are then named as Slurm
    /// names them). The receiving nodes are started over ssh either way.
    #[arg(long, value_enum, default_value_t = Launcher::Ssh, requires = "nodes")]
    pub launcher: Launcher,
    /// The socket of the munged that seals the transfer each node is handed by srun
    /// (--launcher srun) [default: MUNGE's own].
    #[arg(long, value_name = "PATH")]
    pub munge_socket: Option<PathBuf>,
    /// Read the files with direct I/O (O_DIRECT), bypassing the page cache: for parallel file
    /// systems, and to keep the page cache for other work. A receiver this command starts over
    /// ssh writes with direct I/O too.
    #[arg(long, conflicts_with = "mem")]
    pub direct_io: bool,
    /// Encrypt the control connection and every data stream (TLS 1.3). The key handshake
    /// covers each connection's TLS channel, so no one in the middle can relay it.
    #[arg(long)]
    pub encrypt: bool,
    /// Protect the integrity of every chunk and control message without encrypting them: each
    /// frame carries a keyed BLAKE3 tag only the two ends can make, so nobody on the path can
    /// change, drop or replay what is sent. Costs less CPU than --encrypt (see docs/security.md).
    #[arg(long, conflicts_with = "encrypt")]
    pub integrity: bool,
    /// tcp: one TCP connection per stream. mptcp: one Multipath TCP connection per stream,
    /// with subflows over every path the kernel's path manager is set up for (see
    /// docs/transports.md); falls back to TCP, with a warning, where this host or the receiver
    /// lacks it. quic: one QUIC connection per stream over UDP, encrypted like --encrypt (a
    /// receiver serves QUIC unless started with --no-quic).
    #[arg(long, value_name = "tcp|mptcp|quic", default_value = "tcp")]
    pub transport: Transport,
    /// Congestion controller of each QUIC connection (--transport quic) [default: cubic];
    /// TCP and MPTCP use the kernel's (net.ipv4.tcp_congestion_control).
    #[arg(long, value_name = "cubic|bbr|new_reno")]
    pub congestion: Option<Congestion>,
    /// Cap each stream's sending rate at this many Mbit/s (TCP pacing; paper 001 uses 50).
    #[arg(long, value_name = "MBIT_PER_S")]
    pub stream_rate_cap: Option<f64>,
    /// One limit on the whole transfer's rate, however many streams it uses (any transport):
    /// in bits (300Mbit, 10Gbit/s) or bytes per second (50MB/s, 40MiB/s), or a timetable over
    /// the day in this host's local time, "HH:MM,RATE ..." with off for none (e.g.
    /// "08:00,300Mbit 18:00,off"). The optimiser keeps choosing the stream count within it.
    #[arg(long, value_name = "RATE", value_parser = RateSchedule::from_str)]
    pub rate_limit: Option<RateSchedule>,
    /// Largest work unit (chunk) size.
    #[arg(long, default_value = "4MiB", value_parser = parse_unit_size)]
    pub unit_size: u32,
    /// Fewest unsent bytes each stream may queue in its socket (TCP_NOTSENT_LOWAT; in-flight
    /// data is not counted, so this does not limit the window). On a long path a stream's queue
    /// grows to twice the path's bandwidth-delay product, at most 16 MiB; 0: the system's
    /// default.
    #[arg(long, value_name = "SIZE", default_value_t = DEFAULT_UNSENT_LIMIT, value_parser = parse_unsent_limit)]
    pub unsent_limit: u32,
    /// Give up on the receiver after this long without a word from it: the control connection
    /// (where it says it is working every second) fails the transfer; a data stream whose
    /// chunks go unacknowledged is closed and its chunks go to the other streams. At least 2s.
    #[arg(long, value_name = "TIME", default_value = "60s", value_parser = parse_stall_timeout)]
    pub stall_timeout: Duration,
    /// Serve the transfer's metrics (bytes, streams, retransmits, decisions, errors) for
    /// Prometheus at http://ADDR/metrics while it runs.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Print one JSON object per second and a JSON summary instead of the progress bar.
    #[arg(long, conflicts_with = "quiet")]
    pub json: bool,
    /// Print nothing but errors.
    #[arg(long, short)]
    pub quiet: bool,
}

/// `xfer recv`.
#[derive(Debug, Args)]
#[command(
    after_help = "SIGTERM or SIGINT stops the receiver: it takes no new session and lets those \
                  running finish for --shutdown-grace; a second signal ends them at once (what \
                  they verified is kept, and their senders resume by running again).\n\n\
                  Examples:\n  \
                  xfer recv --root /data/incoming --key-file /etc/xfer/key\n  \
                  xfer recv --config /etc/xfer/recv.toml --log-format json"
)]
pub struct RecvArgs {
    /// Read every setting from this TOML file instead of the flags (fields as the flags, times
    /// as "90s" or "10m", and `key = { file = "PATH" }`; see crates/cli/systemd/recv.toml).
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "listen", "root", "key_file", "encrypt", "integrity", "transport", "no_quic", "max_streams",
        "max_sessions", "session_memory", "idle_timeout", "direct_io", "handshake_timeout",
        "max_handshakes", "max_handshakes_per_source", "shutdown_grace", "over_ssh", "access",
        "third_party",
    ])]
    pub config: Option<PathBuf>,
    /// Address and port to listen on (one port serves control and all data streams).
    #[arg(long, default_value = "0.0.0.0:9000")]
    pub listen: String,
    /// Directory everything received is written under.
    #[arg(long, required_unless_present = "config")]
    pub root: Option<PathBuf>,
    /// Read the session key from this file instead of generating a one-time key.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// What holders of the key may do under the root: send files there (write), fetch files
    /// from it (read: `xfer send HOST:PORT:PATH... DIR`), or both (read-write).
    #[arg(long, value_name = "write|read|read-write", default_value = "write", value_parser = parse_access)]
    pub access: Access,
    /// Let a fetch name another receiver to send to (a third-party transfer, HOSTA:PORT:PATH
    /// HOSTB:PORT:DEST, with a one-time credential that receiver granted); otherwise a fetch's
    /// files go only to the host that asks.
    #[arg(long)]
    pub third_party: bool,
    /// Exit after serving one session.
    #[arg(long)]
    pub once: bool,
    /// Started by `xfer send` over ssh: create the root if missing, serve one session with a
    /// one-time key, and exit as soon as the ssh channel (stdin) closes.
    #[arg(long, conflicts_with = "key_file")]
    pub over_ssh: bool,
    /// With --over-ssh, for `xfer send --dry-run`: make no directory; a root that is missing
    /// is served from the nearest directory above it that exists, announced as `dest PATH`.
    #[arg(long, requires = "over_ssh", hide = true)]
    pub dry_run: bool,
    /// Serve only encrypted sessions (xfer send --encrypt); without it both are served.
    #[arg(long)]
    pub encrypt: bool,
    /// Serve only sessions whose integrity is protected (xfer send --integrity or --encrypt).
    #[arg(long)]
    pub integrity: bool,
    /// Listen for tcp, or for mptcp (Multipath TCP, which also serves plain TCP senders;
    /// falls back to TCP, with a warning, where this host lacks it). QUIC senders are served
    /// beside either, on the UDP port of the same number, unless --no-quic; quic insists on
    /// it (no start where the UDP port cannot be bound, instead of a warning).
    #[arg(long, value_name = "tcp|mptcp|quic", default_value = "tcp")]
    pub transport: Transport,
    /// Do not serve QUIC senders (no UDP port): TCP or MPTCP only.
    #[arg(long, conflicts_with = "transport")]
    pub no_quic: bool,
    /// Most data streams one session may open.
    #[arg(long, default_value_t = DEFAULT_MAX_STREAMS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_streams: u32,
    /// Most sessions served at once; more are refused with the reason.
    #[arg(long, default_value_t = DEFAULT_MAX_SESSIONS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_sessions: u64,
    /// Most memory of chunk buffers one session may hold (each stream holds up to one chunk of
    /// 16 MiB): below 4 GiB it lowers the streams a session may open.
    #[arg(long, value_name = "SIZE", default_value = "4GiB", value_parser = parse_size)]
    pub session_memory: u64,
    /// Close a session when none of its connections has received a byte for this long.
    #[arg(long, default_value = "5m", value_parser = parse_positive_time)]
    pub idle_timeout: Duration,
    /// Write the files with direct I/O (O_DIRECT), bypassing the page cache: for parallel file
    /// systems, and to keep the page cache for other work. Refused at start when the root's
    /// file system does not support it.
    #[arg(long)]
    pub direct_io: bool,
    /// Close a connection that has not authenticated (and said where its files go) within this
    /// of its accept, however steadily it trickles bytes.
    #[arg(long, default_value = "10s", value_parser = parse_positive_time)]
    pub handshake_timeout: Duration,
    /// Most connections from addresses without a running session still proving the key at
    /// once; more are refused with "busy authenticating", which senders try again after. An
    /// address with a running session has as many places of its own for its streams.
    #[arg(long, default_value_t = DEFAULT_MAX_HANDSHAKES as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_handshakes: u64,
    /// Most of those from one address (one IPv6 /64).
    #[arg(long, default_value_t = DEFAULT_MAX_HANDSHAKES_PER_SOURCE as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_handshakes_per_source: u64,
    /// Serve the receiver's metrics (bytes, sessions, streams, refusals) for Prometheus at
    /// http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    /// On SIGTERM or SIGINT, how long the sessions running may take to finish before they are
    /// ended (0: at once).
    #[arg(long, value_name = "TIME", default_value = "60s", value_parser = parse_time_arg)]
    pub shutdown_grace: Duration,
}

/// Where `xfer send` sends to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// A running receiver.
    Direct {
        /// `HOST:PORT`, ready for name resolution.
        addr: String,
        /// Directory under the receiver's root (empty: the root).
        dest: String,
    },
    /// A receiver that `xfer send` starts over ssh for this transfer.
    Ssh {
        /// `[USER@]HOST` as given to `ssh` (a host alias of the user's ssh config works).
        target: String,
        /// Directory on that host everything lands under: absolute, or relative to the
        /// remote user's home (empty: the home).
        dir: String,
    },
}

/// Parses `[USER@]HOST:PORT[:DEST]` (a running receiver) or `[USER@]HOST:[DIR]` (a receiver
/// started over ssh: a user, or a second field that is not a port number, says so), with IPv6
/// hosts in brackets.
pub fn parse_destination(s: &str) -> anyhow::Result<Destination> {
    let (user, rest) = match s.split_once('@') {
        Some((user, rest)) if !user.contains([':', '[']) => (Some(user), rest),
        _ => (None, s),
    };
    let (host, host_for_ssh, rest) = if let Some(after) = rest.strip_prefix('[') {
        let (host, rest) = after
            .split_once(']')
            .with_context(|| format!("destination {s:?}: missing ']' after an IPv6 host"))?;
        let rest = rest
            .strip_prefix(':')
            .with_context(|| format!("destination {s:?}: expected ':' after the host"))?;
        (format!("[{host}]"), host.to_string(), rest)
    } else {
        let (host, rest) = rest.split_once(':').with_context(|| {
            format!("destination {s:?} is neither HOST:PORT[:DEST] nor [USER@]HOST:DIR")
        })?;
        (host.to_string(), host.to_string(), rest)
    };
    if host_for_ssh.is_empty() || user == Some("") {
        bail!("destination {s:?} has no host");
    }
    let (port, dest) = rest.split_once(':').unwrap_or((rest, ""));
    let is_port = !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
    if user.is_some() || !is_port {
        let target = match user {
            Some(user) => format!("{user}@{host_for_ssh}"),
            None => host_for_ssh,
        };
        return Ok(Destination::Ssh {
            target,
            dir: rest.to_string(),
        });
    }
    let port: u16 = port
        .parse()
        .ok()
        .filter(|&p| p != 0)
        .with_context(|| format!("destination {s:?}: {port:?} is not a port number"))?;
    Ok(Destination::Direct {
        addr: format!("{host}:{port}"),
        dest: dest.trim_end_matches('/').to_string(),
    })
}

/// A name of `xfer send` is on another host when a colon comes before any slash, as rsync
/// reads it (`dtn1:data`, `alice@[::1]:/data`, `host:9000:in`); `./a:b` and `/x/a:b` are
/// local files.
pub fn is_remote(name: &str) -> bool {
    match (name.find(':'), name.find('/')) {
        (Some(colon), Some(slash)) => colon < slash,
        (colon, _) => colon.is_some(),
    }
}

/// The --include and --exclude rules of `xfer send`'s `matches`, in command-line order.
pub fn filter_rules(matches: &clap::ArgMatches) -> Vec<Rule> {
    let mut rules = Vec::new();
    for (id, rule) in [
        ("include", Rule::Include as fn(String) -> Rule),
        ("exclude", Rule::Exclude),
    ] {
        if let (Some(indices), Some(values)) =
            (matches.indices_of(id), matches.get_many::<String>(id))
        {
            rules.extend(
                indices
                    .zip(values)
                    .map(|(at, value)| (at, rule(value.clone()))),
            );
        }
    }
    rules.sort_by_key(|&(at, _)| at);
    rules.into_iter().map(|(_, rule)| rule).collect()
}

/// A key's access, as a configuration file names it.
fn parse_access(s: &str) -> Result<Access, String> {
    serde_json::from_value(serde_json::Value::String(s.into()))
        .map_err(|_| format!("{s:?} is not an access: write, read or read-write"))
}

/// A size of 1 byte to `max` bytes (named `max_text` in errors), as a `u32`.
fn parse_bounded_size(s: &str, what: &str, max: u32, max_text: &str) -> Result<u32, String> {
    let size = parse_size(s)?;
    if !(1..=u64::from(max)).contains(&size) {
        return Err(format!(
            "{what} must be between 1 byte and {max_text}, not {size}"
        ));
    }
    Ok(size as u32)
}

fn parse_unit_size(s: &str) -> Result<u32, String> {
    parse_bounded_size(s, "unit size", 64 << 20, "64 MiB")
}

fn parse_unsent_limit(s: &str) -> Result<u32, String> {
    parse_bounded_size(s, "unsent limit", 1 << 30, "1 GiB")
}

fn parse_positive_time(s: &str) -> Result<Duration, String> {
    parse_time(s)
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{s:?} is not a positive time like 200s, 500ms or 2m"))
}

fn parse_time_arg(s: &str) -> Result<Duration, String> {
    parse_time(s).ok_or_else(|| format!("{s:?} is not a time like 60s, 500ms or 2m"))
}

fn parse_stall_timeout(s: &str) -> Result<Duration, String> {
    let timeout = parse_positive_time(s)?;
    if timeout < MIN_STALL_TIMEOUT {
        return Err(format!(
            "{s:?} is too short: the receiver's heartbeat comes every second, so allow at least 2s"
        ));
    }
    Ok(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations() {
        let direct = |addr: &str, dest: &str| Destination::Direct {
            addr: addr.into(),
            dest: dest.into(),
        };
        let ssh = |target: &str, dir: &str| Destination::Ssh {
            target: target.into(),
            dir: dir.into(),
        };
        let parsed = |s| parse_destination(s).unwrap();
        assert_eq!(
            parsed("host:9000:in/coming/"),
            direct("host:9000", "in/coming")
        );
        assert_eq!(parsed("[::1]:9000"), direct("[::1]:9000", ""));
        assert_eq!(parsed("[::1]:9000:x"), direct("[::1]:9000", "x"));
        assert_eq!(parsed("alice@host:data/in"), ssh("alice@host", "data/in"));
        assert_eq!(parsed("alice@host:9000"), ssh("alice@host", "9000"));
        assert_eq!(parsed("host:/srv/in:coming"), ssh("host", "/srv/in:coming"));
        assert_eq!(parsed("host:"), ssh("host", ""));
        assert_eq!(parsed("bob@[fe80::1]:x"), ssh("bob@fe80::1", "x"));
        assert!(parse_destination("host").is_err());
        assert!(parse_destination(":9000").is_err());
        assert!(parse_destination("@host:x").is_err());
        assert!(parse_destination("host:0").is_err());
        assert!(parse_destination("host:70000").is_err());
    }

    #[test]
    fn names_with_a_colon_before_any_slash_are_remote() {
        for remote in [
            "dtn1:data",
            "alice@dtn1:/data/run 7",
            "[::1]:9000:in",
            "bob@[fe80::1]:x",
            "host:",
        ] {
            assert!(is_remote(remote), "{remote}");
        }
        for local in ["data", "./a:b", "/srv/a:b", "run/7:00", "", "results/"] {
            assert!(!is_remote(local), "{local}");
        }
    }

    #[test]
    fn stall_timeouts() {
        assert_eq!(parse_stall_timeout("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_stall_timeout("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_stall_timeout("1500ms")
            .unwrap_err()
            .contains("at least 2s"));
        assert!(parse_stall_timeout("0s").is_err());
        assert!(parse_stall_timeout("soon").is_err());
    }
}
