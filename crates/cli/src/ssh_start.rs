//! Starting xfer on another host over ssh, the way bbcp, mscp and qcp do, with the system's
//! ssh client (so the user's ssh config, keys and agent apply).
//!
//! `xfer send PATH... [USER@]HOST:DIR` runs `xfer recv --over-ssh` on HOST, reads the port and
//! the one-time key the receiver prints over the encrypted ssh channel, and sends over direct
//! TCP streams to that port. A pull or a third-party transfer runs `xfer send --over-ssh` on
//! the source's host instead ([`SshHost::start_sender`], [`crate::remote_send`]).
//!
//! The ssh channel stays open for the whole transfer as the remote side's lifeline: when it
//! closes (the transfer finished, failed or was killed), the remote xfer exits.

use std::io::{BufRead, BufReader, Lines, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use transfer::auth::SessionKey;
use transfer::transport::Transport;

/// How long the remote receiver may take to exit once its session is over.
const EXIT_GRACE: Duration = Duration::from_secs(30);

/// A host xfer reaches over ssh.
#[derive(Debug, Clone)]
pub struct SshHost {
    /// The ssh client and its options, as one shell-like string (`ssh -p 2222 -F cfg`).
    pub ssh_command: String,
    /// `[USER@]HOST` as given to ssh.
    pub target: String,
    /// The `xfer` command on HOST, as the remote shell runs it.
    pub remote_xfer: String,
}

/// A receiver to start over ssh for one session.
#[derive(Debug, Clone)]
pub struct SshStart {
    /// Where it runs.
    pub host: SshHost,
    /// Directory everything lands under on HOST (absolute, or relative to the home).
    pub dir: String,
    /// What the remote receiver listens for.
    pub transport: Transport,
    /// The remote receiver writes with direct I/O.
    pub direct_io: bool,
    /// The remote receiver serves a dry run: it makes no directory.
    pub dry_run: bool,
}

/// A receiver started over ssh for one session.
pub struct RemoteReceiver {
    ssh: SshChild,
    /// The name or address ssh connects to for the host (after the user's ssh config): what
    /// a sender on a third host connects to.
    pub host: String,
    /// Where the data streams connect.
    pub addr: SocketAddr,
    /// The remote receiver's one-time key.
    pub key: SessionKey,
    /// Its text, as the receiver printed it: what a sender on a third host proves.
    pub key_text: String,
    /// Where the files land, relative to the remote receiver's root: empty, unless a dry run
    /// found the directory missing and was served from the nearest one above it.
    pub dest: String,
}

/// A sender started over ssh for one transfer: its reports come on `lines`.
pub struct RemoteSender {
    ssh: SshChild,
    /// What it prints on stdout (JSON lines, after anything a login script printed).
    pub lines: Lines<BufReader<ChildStdout>>,
    /// `[USER@]HOST`, for messages.
    target: String,
}

/// The running ssh client (or `srun`, [`crate::srun_start`]), whose stdin is the remote
/// xfer's lifeline; stopped when dropped.
pub struct SshChild {
    child: Child,
    lifeline: Lifeline,
}

/// The ssh channel's stdin, open while the transfer runs: cutting it tells the remote xfer
/// to exit. Shared, so that a signal handler can cut it.
#[derive(Clone)]
pub struct Lifeline(Arc<Mutex<Option<ChildStdin>>>);

impl Lifeline {
    /// Closes the channel's stdin, once.
    pub fn cut(&self) {
        if let Ok(mut stdin) = self.0.lock() {
            *stdin = None;
        }
    }
}

impl SshHost {
    /// The ssh client and its options, split as a shell would.
    fn ssh(&self) -> anyhow::Result<Command> {
        let words = shell_words::split(&self.ssh_command)
            .with_context(|| format!("--ssh-command {:?}", self.ssh_command))?;
        let Some((program, options)) = words.split_first() else {
            bail!("--ssh-command is empty");
        };
        let mut command = Command::new(program);
        command.args(options);
        Ok(command)
    }

    /// The host name ssh itself connects to for the target, after the user's ssh config
    /// (`Host` aliases, `HostName`), from `ssh -G`, and its address.
    pub fn host_address(&self) -> anyhow::Result<(String, IpAddr)> {
        let output = self
            .ssh()?
            .args(["-G", "--", &self.target])
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {:?}", self.ssh_command))?;
        if !output.status.success() {
            bail!(
                "`{} -G {}` failed ({}): {}",
                self.ssh_command,
                self.target,
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let config = String::from_utf8_lossy(&output.stdout);
        let hostname = config
            .lines()
            .find_map(|line| line.strip_prefix("hostname "))
            .with_context(|| format!("`ssh -G {}` names no hostname", self.target))?
            .trim();
        let address = (hostname, 0)
            .to_socket_addrs()
            .with_context(|| format!("resolving {hostname} (the host of {})", self.target))?
            .next()
            .with_context(|| format!("{hostname} (the host of {}) has no address", self.target))?;
        Ok((hostname.to_string(), address.ip()))
    }

    /// Runs `command` on the host, its stdin the lifeline and its stdout piped.
    fn spawn(&self, command: &str) -> anyhow::Result<(SshChild, Lines<BufReader<ChildStdout>>)> {
        let mut ssh = self.ssh()?;
        ssh.args(["-T", "--", &self.target, command]);
        SshChild::spawn(ssh).with_context(|| format!("starting {:?}", self.ssh_command))
    }

    /// Why the `role` (`receiver`, `sender`) started on the host ended before it was ready,
    /// from how ssh ended; `unreachable` is said when ssh itself failed.
    fn why_it_ended(&self, ssh: &mut SshChild, role: &str, unreachable: &str) -> String {
        match ssh.stop().map(|status| status.code()) {
            Some(Some(255)) => format!("ssh to {} failed{unreachable}", self.target),
            Some(Some(127)) => format!(
                "{:?} was not found on {} (--remote-xfer names the xfer command there)",
                self.remote_xfer, self.target
            ),
            Some(status) => format!(
                "the {role} started over ssh on {} ended (exit status {})",
                self.target,
                status.map_or_else(|| "none: killed".into(), |c| c.to_string())
            ),
            None => format!("ssh to {} did not end and was killed", self.target),
        }
    }

    /// Starts `xfer send --over-ssh` on the host and hands it `request` (one JSON line; the
    /// channel then stays open as its lifeline).
    pub fn start_sender(&self, request: &str) -> anyhow::Result<RemoteSender> {
        let (mut ssh, lines) = self.spawn(&format!("{} send --over-ssh", self.remote_xfer))?;
        if let Err(e) = ssh.hand(request) {
            let why = self.why_it_ended(&mut ssh, "sender", "");
            return Err(
                anyhow::Error::new(e).context(format!("{why}; the messages above say more"))
            );
        }
        Ok(RemoteSender {
            ssh,
            lines,
            target: self.target.clone(),
        })
    }
}

impl SshStart {
    /// The command the remote shell runs: a receiver for one session under `dir`, listening on
    /// every address of the family the sender reaches the host by.
    fn remote_command(&self, family: IpAddr) -> String {
        let listen = match family {
            IpAddr::V4(_) => "0.0.0.0:0",
            IpAddr::V6(_) => "[::]:0",
        };
        let dir = if self.dir.is_empty() { "." } else { &self.dir };
        let direct = if self.direct_io { " --direct-io" } else { "" };
        let dry_run = if self.dry_run { " --dry-run" } else { "" };
        format!(
            "{} recv --over-ssh{dry_run} --listen {listen} --transport {}{direct} --root {}",
            self.host.remote_xfer,
            self.transport,
            shell_words::quote(dir)
        )
    }

    /// Starts the remote receiver and waits until it listens.
    pub fn start(&self) -> anyhow::Result<RemoteReceiver> {
        let (host, address) = self.host.host_address()?;
        let (mut ssh, stdout) = self.host.spawn(&self.remote_command(address))?;
        match read_announcement(stdout) {
            Ok((port, key_text, dest)) => Ok(RemoteReceiver {
                ssh,
                host,
                addr: SocketAddr::new(address, port),
                key: SessionKey::from_text(&key_text).context("the remote receiver's key")?,
                key_text,
                dest,
            }),
            Err(e) => {
                // `HOST:DIR` names an ssh destination; a user who meant a receiver already
                // running there left out its port.
                let unreachable = format!(
                    " (a receiver already running there is named with its port: {}:PORT:{})",
                    self.host.target, self.dir
                );
                let why = self.host.why_it_ended(&mut ssh, "receiver", &unreachable);
                Err(e.context(format!("{why}; the messages above say more")))
            }
        }
    }
}

/// Reads what `xfer recv` prints once it listens (`listening on ADDR`, `key KEY`, and for a
/// dry run `dest DIR` before them), skipping anything a login script printed before, then
/// passes its later output on to stderr. The port, the key's text and `dest`.
fn read_announcement(
    mut lines: Lines<BufReader<ChildStdout>>,
) -> anyhow::Result<(u16, String, String)> {
    let (mut port, mut dest) = (None, String::new());
    for line in lines.by_ref() {
        let line = line.context("reading from ssh")?;
        if let Some(rest) = line.strip_prefix("dest ") {
            dest = rest.to_string();
        } else if let Some(addr) = line.strip_prefix("listening on ") {
            let addr: SocketAddr = addr
                .parse()
                .with_context(|| format!("the remote receiver announced {addr:?}"))?;
            port = Some(addr.port());
        } else if let (Some(port), Some(key)) = (port, line.strip_prefix("key ")) {
            let key = key.trim().to_string();
            std::thread::spawn(move || {
                for line in lines.map_while(Result::ok) {
                    eprintln!("xfer recv: {line}");
                }
            });
            return Ok((port, key, dest));
        }
    }
    bail!("ssh ended before the remote receiver announced its port and key")
}

impl RemoteReceiver {
    /// Its ssh channel, which a signal handler may cut.
    pub fn lifeline(&self) -> Lifeline {
        self.ssh.lifeline.clone()
    }

    /// After a successful transfer: waits for the remote receiver to exit on its own, and
    /// fails if it reports an error.
    pub fn finish(mut self) -> anyhow::Result<()> {
        match self
            .ssh
            .exited_within(EXIT_GRACE)
            .context("waiting for ssh")?
        {
            Some(status) if status.success() => Ok(()),
            Some(status) => {
                bail!("the remote receiver ended with {status}; its messages are above")
            }
            None => bail!(
                "the remote receiver did not exit within {}s of the end of its session",
                EXIT_GRACE.as_secs()
            ),
        }
    }
}

impl RemoteSender {
    /// The sender whose client is `ssh`, printing `lines`, on `target` (for messages).
    pub fn new(ssh: SshChild, lines: Lines<BufReader<ChildStdout>>, target: String) -> Self {
        RemoteSender { ssh, lines, target }
    }

    /// Its ssh channel, which a signal handler may cut.
    pub fn lifeline(&self) -> Lifeline {
        self.ssh.lifeline.clone()
    }

    /// Once its output ended: how it exited (ssh passes the remote status on), waited for
    /// at most [`EXIT_GRACE`].
    pub fn exit_status(mut self) -> anyhow::Result<ExitStatus> {
        match self
            .ssh
            .exited_within(EXIT_GRACE)
            .context("waiting for ssh")?
        {
            Some(status) => Ok(status),
            None => bail!(
                "the sender on {} did not exit within {}s of closing its output",
                self.target,
                EXIT_GRACE.as_secs()
            ),
        }
    }
}

/// For xfer started over ssh: exits when the ssh channel (stdin) closes, as it does when the
/// xfer that started this one ends (also when it was killed); one left behind would only hold
/// a port. Exiting mid-session is safe: verified chunks are journaled, and the next run
/// resumes from them.
pub fn exit_when_stdin_closes(role: &'static str) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        tracing::warn!("the ssh channel to the {role} closed before the session ended: exiting");
        std::process::exit(1);
    });
}

impl SshChild {
    /// Runs `command` (ssh or srun with its arguments), its stdin the lifeline, its stdout
    /// piped and its stderr this process's.
    pub fn spawn(
        mut command: Command,
    ) -> std::io::Result<(SshChild, Lines<BufReader<ChildStdout>>)> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
        let lifeline = Lifeline(Arc::new(Mutex::new(child.stdin.take())));
        Ok((SshChild { child, lifeline }, stdout))
    }

    /// Writes `line` to the remote xfer's stdin (nothing once the lifeline is cut).
    pub fn hand(&self, line: &str) -> std::io::Result<()> {
        match self.lifeline.0.lock() {
            Ok(mut stdin) => match stdin.as_mut() {
                Some(stdin) => writeln!(stdin, "{line}").and_then(|()| stdin.flush()),
                None => Ok(()),
            },
            Err(_) => Ok(()),
        }
    }

    /// How ssh ended, if it does within `limit`.
    fn exited_within(&mut self, limit: Duration) -> std::io::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Closes the lifeline and gives ssh a moment to end; kills it if it does not. Returns
    /// how it ended on its own, if it did.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.lifeline.cut();
        let ended = self.exited_within(Duration::from_secs(2)).ok().flatten();
        if ended.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        ended
    }
}

impl Drop for SshChild {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(dir: &str, remote_xfer: &str) -> SshStart {
        SshStart {
            host: SshHost {
                ssh_command: "ssh".into(),
                target: "alice@host".into(),
                remote_xfer: remote_xfer.into(),
            },
            dir: dir.into(),
            transport: Transport::Tcp,
            direct_io: false,
            dry_run: false,
        }
    }

    #[test]
    fn remote_commands_quote_the_directory() {
        let v4 = IpAddr::from([10, 0, 0, 1]);
        assert_eq!(
            start("", "xfer").remote_command(v4),
            "xfer recv --over-ssh --listen 0.0.0.0:0 --transport tcp --root ."
        );
        assert_eq!(
            start("my data/$HOME;rm -rf x", "/opt/xfer/bin/xfer").remote_command(v4),
            "/opt/xfer/bin/xfer recv --over-ssh --listen 0.0.0.0:0 --transport tcp --root 'my data/$HOME;rm -rf x'"
        );
        assert!(start("d", "xfer")
            .remote_command(IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]))
            .contains("--listen [::]:0 "));
        let mptcp = SshStart {
            transport: Transport::Mptcp,
            ..start("d", "xfer")
        };
        assert!(mptcp.remote_command(v4).contains(" --transport mptcp "));
        let direct = SshStart {
            direct_io: true,
            ..start("d", "xfer")
        };
        assert!(direct
            .remote_command(v4)
            .ends_with(" --transport tcp --direct-io --root d"));
    }
}
