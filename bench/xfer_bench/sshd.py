"""OpenSSH servers of a benchmark's own in its namespaces: a host key and a client key pair
made for the run, root login by that key only, and an ssh config whose Host aliases name the
servers, for the commands that start xfer over ssh."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "xfer-bench", "-f", str(path)],
        check=True,
    )


@contextmanager
def ssh_servers(servers: Mapping[str, tuple[str, str]], work: Path) -> Iterator[Path]:
    """An sshd for each alias of `servers` (alias: its namespace and the address it listens
    on), all with one host key and accepting one key pair made here, as root; yields an ssh
    config in which each alias names its server. The servers stop on exit."""
    _keygen(work / "host_key")
    _keygen(work / "id")
    (work / "authorized_keys").write_text((work / "id.pub").read_text())
    host_pub = (work / "host_key.pub").read_text()
    (work / "known_hosts").write_text("".join(f"{a} {host_pub}" for _, a in servers.values()))
    config = work / "ssh_config"
    config.write_text(
        "".join(
            f"Host {alias}\n  HostName {addr}\n  IdentityFile {work}/id\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {work}/known_hosts\n  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n  User root\n"
            for alias, (_, addr) in servers.items()
        )
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    with ExitStack() as stack:
        for alias, (ns, addr) in servers.items():
            cfg = work / f"sshd_config-{alias}"
            cfg.write_text(
                f"ListenAddress {addr}:22\nHostKey {work}/host_key\n"
                f"PidFile {work}/sshd-{alias}.pid\nAuthorizedKeysFile {work}/authorized_keys\n"
                "PubkeyAuthentication yes\nPasswordAuthentication no\nUsePAM no\n"
                "PermitRootLogin prohibit-password\nStrictModes no\nLogLevel ERROR\n"
            )
            argv = ["ip", "netns", "exec", ns, "/usr/sbin/sshd", "-D", "-e", "-f", str(cfg)]
            # INFO for the one line that says it listens; a file, so that its log of every
            # connection never fills a pipe nobody reads.
            argv += ["-o", "LogLevel=INFO"]
            log = work / f"sshd-{alias}.log"
            with log.open("wb") as stderr:
                proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr)
            stack.callback(_stop, proc)
            _wait_for_listening(proc, log)
        yield config


def _stop(proc: subprocess.Popen) -> None:
    """Stops an sshd at once: it ends on SIGTERM (SIGKILL if not within 5 s), not on a closed
    stdin, which `supervise.stop` waits 10 s for first."""
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_for_listening(proc: subprocess.Popen, log: Path, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while b"Server listening" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"sshd did not start: {log.read_text(errors='replace').strip()}")
        time.sleep(0.05)
