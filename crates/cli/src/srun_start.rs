//! Starting a sending node's sender with `srun`, for the head of a striped transfer inside a
//! Slurm allocation (`xfer send --nodes FILE --launcher srun`). `srun` runs `xfer send
//! --over-srun` as one task on the node, as a step of the head's allocation that may share
//! the node with the allocation's other steps (`--overlap`), and relays its stdin and stdout
//! as ssh does for `--over-ssh`: stdin brings the transfer and stays open as the lifeline,
//! stdout carries the reports back.
//!
//! Slurm relays a task's stdin over the cluster's network in the clear, and the transfer
//! holds the key of the pair's receiver. It therefore travels as a MUNGE credential, the
//! authentication every Slurm cluster with `AuthType=auth/munge` already runs: encrypted with
//! the cluster's MUNGE key, decodable only by this user (`--restrict-uid`), once (munged
//! refuses a replayed credential) and within a minute of its making.

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

use crate::ssh_start::{RemoteSender, SshChild};

/// How long a sealed transfer can be opened after it was sealed: the task starts within
/// seconds of `srun`, and a credential caught on the way is useless after.
const SEAL_TTL: Duration = Duration::from_secs(60);

/// Starts `xfer send --over-srun` on Slurm node `node` with `srun` (`remote_xfer` is the xfer
/// command there) and hands it `request`, sealed with MUNGE through the munged at `socket`
/// (munge's own default without).
pub fn start_sender(
    node: &str,
    remote_xfer: &str,
    socket: Option<&Path>,
    request: &str,
) -> anyhow::Result<RemoteSender> {
    let sealed = seal(request, socket)?;
    let xfer = shell_words::split(remote_xfer)
        .with_context(|| format!("--remote-xfer {remote_xfer:?}"))?;
    let mut srun = Command::new("srun");
    srun.args(["--nodes=1", "--ntasks=1", "--overlap", "--quiet"])
        .arg(format!("--nodelist={node}"))
        .args(&xfer)
        .args(["send", "--over-srun"]);
    if let Some(socket) = socket {
        srun.arg("--munge-socket").arg(socket);
    }
    let (mut child, lines) = SshChild::spawn(srun)
        .context("starting srun (--launcher srun runs inside a Slurm allocation)")?;
    if let Err(e) = child.hand(&sealed) {
        let status = child.stop();
        return Err(anyhow::Error::new(e).context(format!(
            "srun for node {node} ended before it took the transfer ({}); its messages are above",
            status.map_or_else(|| "killed".into(), |s| s.to_string())
        )));
    }
    Ok(RemoteSender::new(child, lines, node.to_string()))
}

/// For `xfer send --over-srun`: reads the sealed transfer from stdin and opens it through the
/// munged at `socket`, refusing one sealed by another user.
pub fn open_request(socket: Option<&Path>) -> anyhow::Result<String> {
    let mut sealed = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut sealed)
        .context("reading the transfer from srun")?;
    let opened = munge_command("unmunge", socket, &["--keys=STATUS,UID"], sealed.trim())?;
    payload(&opened, rustix::process::getuid().as_raw()).map(str::to_string)
}

/// The payload of what unmunge printed for a credential (the metadata asked for, a blank
/// line, then the payload), if user `mine` sealed it.
fn payload(opened: &str, mine: u32) -> anyhow::Result<&str> {
    let Some((metadata, payload)) = opened.split_once("\n\n") else {
        bail!("unmunge printed no payload");
    };
    let uid = metadata
        .lines()
        .find_map(|line| line.strip_prefix("UID:"))
        // `root (0)`: the name, then the number.
        .and_then(|uid| {
            uid.trim()
                .rsplit_once('(')?
                .1
                .strip_suffix(')')?
                .parse::<u32>()
                .ok()
        })
        .context("unmunge named no user")?;
    if uid != mine {
        bail!("the transfer was sealed by user {uid}, not by this one ({mine})");
    }
    Ok(payload)
}

/// Seals `request` for this user, for [`SEAL_TTL`].
fn seal(request: &str, socket: Option<&Path>) -> anyhow::Result<String> {
    let uid = rustix::process::getuid().as_raw().to_string();
    let ttl = SEAL_TTL.as_secs().to_string();
    let options = ["--restrict-uid", uid.as_str(), "--ttl", ttl.as_str()];
    let sealed = munge_command("munge", socket, &options, request)?;
    Ok(sealed.trim().to_string())
}

/// Runs MUNGE's `program` (`munge` or `unmunge`) with `options`, `input` on its stdin; what it
/// printed, or why it failed.
fn munge_command(
    program: &str,
    socket: Option<&Path>,
    options: &[&str],
    input: &str,
) -> anyhow::Result<String> {
    let mut command = Command::new(program);
    command.args(options);
    if let Some(socket) = socket {
        command.arg("--socket").arg(socket);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| {
            format!(
                "running {program} (MUNGE's, which --launcher srun needs to seal the transfer \
                 it hands each node: Debian's package munge)"
            )
        })?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    // Written on a thread of its own while the output is read: a large request (a long
    // --files-from list) fills the pipe before munge prints anything.
    let (written, output) = std::thread::scope(|scope| {
        let writer = scope.spawn(move || stdin.write_all(input.as_bytes()));
        let output = child.wait_with_output();
        (writer.join(), output)
    });
    let output = output.with_context(|| format!("waiting for {program}"))?;
    if !output.status.success() {
        // unmunge says why in its metadata (`STATUS: Replayed credential (17)`), on stdout.
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let why = match stderr.trim() {
            "" => stdout
                .lines()
                .find_map(|line| line.strip_prefix("STATUS:"))
                .unwrap_or_default()
                .trim(),
            stderr => stderr,
        };
        bail!("{program} failed ({}): {why}", output.status);
    }
    match written {
        Ok(written) => written.with_context(|| format!("writing to {program}"))?,
        Err(_) => bail!("writing to {program} failed"),
    }
    String::from_utf8(output.stdout).with_context(|| format!("{program} printed no text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_transfer_opens_only_for_the_user_who_sealed_it() {
        let opened =
            "STATUS:          Success (0)\nUID:             alice (1001)\n\n{\"port\":1}\n";
        assert_eq!(payload(opened, 1001).unwrap(), "{\"port\":1}\n");
        let err = payload(opened, 0).unwrap_err().to_string();
        assert_eq!(
            err,
            "the transfer was sealed by user 1001, not by this one (0)"
        );
        let err = payload("STATUS:          Success (0)\n\n{}", 0).unwrap_err();
        assert_eq!(err.to_string(), "unmunge named no user");
        assert!(payload("UID: root (0)", 0).is_err(), "no payload");
    }
}
