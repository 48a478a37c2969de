"""Multi-host runs: an experiment's transfers between real machines (a Chameleon node and a
CloudLab node, say) instead of the emulated WAN, everything started over ssh from the machine
that runs the harness, which may itself be one of the hosts (`ssh = "local"`).

    [receiver]
    ssh = "cc@chi-node"            # an ssh destination, as in your ~/.ssh/config, or "local"
    addr = "10.52.0.7"             # where the senders reach it on the network under test
    xfer = "/home/cc/xfer/target/release/xfer"    # default: xfer on the remote PATH
    port = 50000                   # xfer's port (default: any free one)
    gridftp_port_range = "50100,50199"            # GridFTP's data ports (default: any)
    [[senders]]                    # one for every transfer, or one that sends them all
    ssh = "local"
    xfer = "target/release/xfer"
    [ssh]
    options = ["-o", "ConnectTimeout=10"]          # added to every ssh command
    [path]
    rate_mbit = 10000              # the real bottleneck, for link utilisation and sizes

The runner starts each process under `supervise`, so a stopped run, a crashed harness or a
dropped ssh connection stops it on its host. Logs written on a host (MI logs) are fetched with
`ssh cat` into the run's log directory; everything else (stdout, stderr) comes back over ssh as
it is written. Each host gets a scratch directory made with `mktemp -d` and removed at the end.
"""

from __future__ import annotations

import shlex
import subprocess
import tomllib
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from xfer_bench.wan_commands import busy_share

#: Never ask for a password or a host key: a run has no one to answer.
SSH = ("ssh", "-T", "-o", "BatchMode=yes")


@dataclass(frozen=True)
class Host:
    """A machine commands run on: this one (`ssh` None) or one reached over ssh."""

    ssh: str | None
    xfer: str
    options: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """How messages name it."""
        return self.ssh or "local"

    def _ssh(self, remote: Sequence[str]) -> list[str]:
        assert self.ssh is not None
        return [*SSH, *self.options, self.ssh, shlex.join(remote)]

    def command(self, argv: Sequence[str]) -> list[str]:
        """The local command line that runs `argv` on this host."""
        return self._ssh(argv) if self.ssh else list(argv)

    def run(self, argv: Sequence[str], stdin: str = "") -> str:
        """Runs a short command on this host with `stdin` as its input and returns its
        stdout; a failure raises a RuntimeError naming the host."""
        out = subprocess.run(self.command(argv), capture_output=True, text=True, input=stdin)
        if out.returncode != 0:
            raise RuntimeError(
                f"{self.name}: `{shlex.join(argv)}` failed (exit {out.returncode}): "
                f"{out.stderr.strip()[-300:]}"
            )
        return out.stdout

    def fetch(self, path: str, local: Path) -> None:
        """Copies a file of this host to `local`."""
        if self.ssh is None:
            if Path(path) != local:
                local.write_bytes(Path(path).read_bytes())
            return
        local.write_text(self.run(["cat", "--", path]))

    def busy(self, seconds: float = 0.5) -> float:
        """Share of this host's CPUs busy over `seconds`."""
        out = self.run(["sh", "-c", f"head -n1 /proc/stat; sleep {seconds}; head -n1 /proc/stat"])
        first, second = out.splitlines()[:2]
        return busy_share(first, second)

    def missing(self, programs: Sequence[str]) -> list[str]:
        """Those of `programs` this host cannot run (not on its PATH, or not executable)."""
        script = 'for p; do command -v "$p" >/dev/null 2>&1 || echo "$p"; done'
        return self.run(["sh", "-c", script, "sh", *programs]).split()

    @contextmanager
    def scratch(self) -> Iterator[str]:
        """A fresh directory on this host, removed on exit."""
        path = self.run(["mktemp", "-d", "/tmp/xfer-bench.XXXXXX"]).strip()
        try:
            yield path
        finally:
            try:
                self.run(["rm", "-rf", "--", path])
            except RuntimeError:
                pass


@dataclass(frozen=True)
class Hosts:
    """A loaded hosts file."""

    receiver: Host
    receiver_addr: str
    receiver_port: int
    #: `startport,endport` for the GridFTP server's data connections (a firewall's opening).
    gridftp_port_range: str | None
    senders: tuple[Host, ...]
    rate_mbit: float | None

    def sender(self, index: int) -> Host:
        """The host that runs transfer `index`."""
        return self.senders[index] if len(self.senders) > 1 else self.senders[0]


SENDER_KEYS = {"ssh", "xfer"}
RECEIVER_KEYS = SENDER_KEYS | {"addr", "port", "gridftp_port_range"}


def _host(table: dict, options: tuple[str, ...], allowed: set[str], where: str) -> Host:
    if unknown := sorted(set(table) - allowed):
        raise ValueError(f"{where}: unknown keys {unknown}; allowed: {sorted(allowed)}")
    if "ssh" not in table:
        raise ValueError(f'{where}: missing "ssh" (a destination, or "local")')
    ssh = str(table["ssh"])
    return Host(ssh=None if ssh == "local" else ssh, xfer=str(table.get("xfer", "xfer")),
                options=options)  # fmt: skip


def parse(text: str) -> Hosts:
    """Reads a hosts file; every mistake is a ValueError naming it."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"not valid TOML: {e}") from e
    if unknown := sorted(set(data) - {"receiver", "senders", "ssh", "path"}):
        raise ValueError(f"hosts: unknown keys {unknown}")
    options = tuple(str(o) for o in data.get("ssh", {}).get("options", []))
    if "receiver" not in data:
        raise ValueError("hosts: missing [receiver]")
    receiver = data["receiver"]
    if "addr" not in receiver:
        raise ValueError("receiver: missing addr (where the senders reach it)")
    senders = data.get("senders", [])
    if not senders:
        raise ValueError("hosts: at least one [[senders]]")
    rate = data.get("path", {}).get("rate_mbit")
    return Hosts(
        receiver=_host(receiver, options, RECEIVER_KEYS, "receiver"),
        receiver_addr=str(receiver["addr"]),
        receiver_port=int(receiver.get("port", 0)),
        gridftp_port_range=receiver.get("gridftp_port_range"),
        senders=tuple(
            _host(s, options, SENDER_KEYS, f"sender {i + 1}") for i, s in enumerate(senders)
        ),
        rate_mbit=float(rate) if rate is not None else None,
    )


def load(path: Path) -> Hosts:
    """A hosts file by path."""
    try:
        return parse(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from e


@dataclass
class HostsNetwork:
    """The hosts of a run, each with its scratch directory, as the runner drives a path."""

    hosts: Hosts
    scratch: dict[Host, str]
    #: Whether commands on the receiver's host run as root (GridFTP's server needs to know).
    receiver_is_root: bool

    @property
    def receiver_addr(self) -> str:
        """Where the senders reach the receiver."""
        return self.hosts.receiver_addr

    def xfer(self, index: int | None) -> str:
        """The xfer binary of sender `index`, or of the receiver (None)."""
        return (self.hosts.receiver if index is None else self.hosts.sender(index)).xfer

    def sender_cmd(self, index: int, argv: Sequence[str]) -> list[str]:
        """The local command line that runs `argv` on sender `index`'s host."""
        return self.hosts.sender(index).command(argv)

    def receiver_cmd(self, argv: Sequence[str]) -> list[str]:
        """The local command line that runs `argv` on the receiver's host."""
        return self.hosts.receiver.command(argv)

    def sender_path(self, index: int, name: str) -> str:
        """A file called `name` in sender `index`'s scratch directory (logs, helpers)."""
        return f"{self.scratch[self.hosts.sender(index)]}/{name}"

    def sender_run(self, index: int, argv: Sequence[str], stdin: str = "") -> str:
        """Runs a short command on sender `index`'s host and returns its stdout."""
        return self.hosts.sender(index).run(argv, stdin)

    @property
    def gridftp_port_range(self) -> str | None:
        """The GridFTP server's data ports, if the hosts file fixes them."""
        return self.hosts.gridftp_port_range

    @property
    def receiver_root(self) -> str:
        """The directory `xfer recv` writes under (its host's scratch directory)."""
        return self.scratch[self.hosts.receiver]

    def collect(self, index: int, path: str, local: Path) -> None:
        """Brings a log sender `index` wrote at `path` to `local`."""
        self.hosts.sender(index).fetch(path, local)

    def set_rate(self, rate_mbit: float) -> None:
        """A real path's capacity cannot be changed."""
        raise RuntimeError("a real network cannot follow a rate schedule")

    def set_loss(self, loss: float) -> None:
        """A real path's loss cannot be changed."""
        raise RuntimeError("a real network cannot follow a loss schedule")

    def busy(self) -> float:
        """The largest share of CPUs busy on any of the hosts, just now."""
        return max(h.busy() for h in self.scratch)


def check(hosts: Hosts, transfers: int, tools: set[str]) -> None:
    """Raises a RuntimeError naming what a run of `transfers` transfers with `tools` lacks:
    senders, or programs on a host."""
    if len(hosts.senders) not in (1, transfers):
        raise RuntimeError(
            f"the hosts file lists {len(hosts.senders)} senders for {transfers} transfers: "
            "give one sender for all, or one per transfer"
        )
    # A GridFTP transfer with a per-stream cap builds the pacing library with cc.
    sender_programs = {"iperf3": "iperf3", "gridftp": "globus-url-copy", "paced-gridftp": "cc"}
    receiver_programs = {"iperf3": "iperf3", "gridftp": "globus-gridftp-server",
                         "paced-gridftp": "globus-gridftp-server"}  # fmt: skip
    needs: dict[Host, set[str]] = {}
    for host in hosts.senders:
        needs.setdefault(host, set()).update(
            host.xfer if tool == "xfer" else sender_programs[tool] for tool in tools
        )
    needs.setdefault(hosts.receiver, set()).update(
        hosts.receiver.xfer if tool == "xfer" else receiver_programs[tool] for tool in tools
    )
    problems = []
    for host, programs in needs.items():
        if missing := host.missing(sorted(programs)):
            problems.append(f"{host.name} lacks {', '.join(missing)}")
    if problems:
        raise RuntimeError(
            "; ".join(problems) + " (see bench/MULTI_HOST.md for what to install on each host)"
        )


@contextmanager
def connected(hosts: Hosts) -> Iterator[HostsNetwork]:
    """Checks every host answers and holds a scratch directory on each for the body."""
    with ExitStack() as stack:
        scratch = {}
        for host in dict.fromkeys((hosts.receiver, *hosts.senders)):
            scratch[host] = stack.enter_context(host.scratch())
        is_root = hosts.receiver.run(["id", "-u"]).strip() == "0"
        yield HostsNetwork(hosts, scratch, is_root)
