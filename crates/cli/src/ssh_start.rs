//! Starting the receiver over ssh, the way bbcp, mscp and qcp do: `xfer send PATH...
//! [USER@]HOST:DIR` runs `xfer recv --over-ssh` on HOST with the system's ssh client (so the
//! user's ssh config, keys and agent apply), reads the port and the one-time key the receiver
//! prints over the encrypted ssh channel, and sends over direct TCP streams to that port.
//!
//! The ssh channel stays open for the whole transfer as the receiver's lifeline: when it
//! closes (the sender finished, failed or was killed), the remote receiver exits.

use std::io::{BufRead, BufReader, Lines};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use transfer::auth::SessionKey;
use transfer::transport::Transport;

/// How long the remote receiver may take to exit once its session is over.
const EXIT_GRACE: Duration = Duration::from_secs(30);

/// How to reach the remote host and what to run there.
#[derive(Debug, Clone)]
pub struct SshStart {
    /// The ssh client and its options, as one shell-like string (`ssh -p 2222 -F cfg`).
    pub ssh_command: String,
    /// `[USER@]HOST` as given to ssh.
    pub target: String,
    /// Directory everything lands under on HOST (absolute, or relative to the home).
    pub dir: String,
    /// The `xfer` command on HOST, as the remote shell runs it.
    pub remote_xfer: String,
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
    /// Where the data streams connect.
    pub addr: SocketAddr,
    /// The remote receiver's one-time key.
    pub key: SessionKey,
    /// Where the files land, relative to the remote receiver's root: empty, unless a dry run
    /// found the directory missing and was served from the nearest one above it.
    pub dest: String,
}

/// The running ssh client; stopped when dropped.
struct SshChild {
    child: Child,
    /// Open while the transfer runs; closing it tells the remote receiver to exit.
    lifeline: Option<ChildStdin>,
}

impl SshStart {
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

    /// The address ssh itself connects to for the target, after the user's ssh config
    /// (`Host` aliases, `HostName`), from `ssh -G`.
    fn host_address(&self) -> anyhow::Result<IpAddr> {
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
        Ok(address.ip())
    }

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
            self.remote_xfer,
            self.transport,
            shell_words::quote(dir)
        )
    }

    /// Starts the remote receiver and waits until it listens.
    pub fn start(&self) -> anyhow::Result<RemoteReceiver> {
        let host = self.host_address()?;
        let mut child = self
            .ssh()?
            .args(["-T", "--", &self.target, &self.remote_command(host)])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {:?}", self.ssh_command))?;
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
        let mut ssh = SshChild {
            lifeline: child.stdin.take(),
            child,
        };
        match read_announcement(stdout) {
            Ok((port, key, dest)) => Ok(RemoteReceiver {
                ssh,
                addr: SocketAddr::new(host, port),
                key,
                dest,
            }),
            Err(e) => {
                let why = match ssh.stop().map(|status| status.code()) {
                    // `HOST:DIR` names an ssh destination; a user who meant a receiver
                    // already running there left out its port.
                    Some(Some(255)) => format!(
                        "ssh to {} failed (a receiver already running there is named with its \
                         port: {}:PORT:{})",
                        self.target, self.target, self.dir
                    ),
                    Some(Some(127)) => format!(
                        "{:?} was not found on {} (--remote-xfer names the xfer command there)",
                        self.remote_xfer, self.target
                    ),
                    Some(status) => format!(
                        "the receiver started over ssh on {} ended (exit status {})",
                        self.target,
                        status.map_or_else(|| "none: killed".into(), |c| c.to_string())
                    ),
                    None => format!("ssh to {} did not end and was killed", self.target),
                };
                Err(e.context(format!("{why}; the messages above say more")))
            }
        }
    }
}

/// Reads what `xfer recv` prints once it listens (`listening on ADDR`, `key KEY`, and for a
/// dry run `dest DIR` before them), skipping anything a login script printed before, then
/// passes its later output on to stderr.
fn read_announcement(
    mut lines: Lines<BufReader<ChildStdout>>,
) -> anyhow::Result<(u16, SessionKey, String)> {
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
            let key = SessionKey::from_text(key).context("the remote receiver's key")?;
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

impl SshChild {
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
    fn stop(&mut self) -> Option<ExitStatus> {
        self.lifeline = None;
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
            ssh_command: "ssh".into(),
            target: "alice@host".into(),
            dir: dir.into(),
            remote_xfer: remote_xfer.into(),
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
