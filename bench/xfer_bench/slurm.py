"""A real Slurm on one machine: Debian's `slurmctld`, one `slurmd` per node namespace and a
`munged` of their own, for striped transfers launched with `srun` (issue 44: a site's
data-transfer nodes as network namespaces).

Each node is a network namespace with an address the controller reaches and that reaches the
controller. A `slurmd` takes its node's name from its host's name, so each runs in a UTS
namespace of its own named after its node; the controller, named `ctl`, likewise. The daemons
enter a node's network namespace with `nsenter` rather than `ip netns exec`, which mounts a
fresh /sys and hides the cgroup hierarchy slurmd needs (it stops with "No filesystem mounted on
/sys/fs/cgroup"). Tasks are tracked by their process ids and no cgroup is made
(`proctrack/linuxproc`, `task/none`).

Everything lives under one work directory: the configuration, a munge key made for this
cluster, the state, spools and logs. The controller listens on a port of its own per process,
so concurrent clusters do not collide. On exit, also when the body raises, every daemon is
stopped (and killed if it does not stop) before the context returns.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

#: The controller's host name (its UTS namespace's): `SlurmctldHost` must name the host it runs on.
CONTROLLER = "ctl"
#: How long the daemons may take to come up, and each to stop.
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Node:
    """A node of the cluster: its name, the network namespace it is, and its address there."""

    name: str
    netns: str
    addr: str


@dataclass(frozen=True)
class Cluster:
    """A running cluster: its configuration and nodes, and how to run Slurm's commands on it."""

    conf: Path
    nodes: tuple[Node, ...]

    @property
    def env(self) -> dict[str, str]:
        """The environment Slurm's commands (`srun`, `sinfo`, `sbatch`) read this cluster from."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def munge_socket(self) -> Path:
        """The socket of the cluster's munged (for `xfer send --munge-socket`)."""
        return self.conf.parent / "munge" / "socket"

    def srun(self, argv: Sequence[str], nodes: int | None = None) -> list[str]:
        """The command line that runs `argv` as one task on each of `nodes` nodes (all)."""
        count = len(self.nodes) if nodes is None else nodes
        return ["srun", f"--nodes={count}", f"--ntasks={count}", "--ntasks-per-node=1", *argv]

    def node_states(self) -> dict[str, str]:
        """Each node's state as `sinfo` reports it (`idle`, `alloc`, `down*`, ...)."""
        out = subprocess.run(
            ["sinfo", "--noheader", "--Node", "--format=%N %T"],
            env=self.env, check=True, capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        return dict(line.split(maxsplit=1) for line in out.stdout.splitlines() if line.strip())


def _config(work: Path, nodes: Sequence[Node], controller_addr: str, port: int) -> str:
    node_lines = "\n".join(
        f"NodeName={n.name} NodeAddr={n.addr} CPUs=1 State=UNKNOWN" for n in nodes
    )
    names = ",".join(n.name for n in nodes)
    return f"""\
ClusterName=xfer
SlurmctldHost={CONTROLLER}({controller_addr})
SlurmctldPort={port}
SlurmdPort={port + 1}
AuthType=auth/munge
AuthInfo=socket={work / "munge" / "socket"}
CryptoType=crypto/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={work / "state"}
SlurmdSpoolDir={work / "spool"}/%n
SlurmctldPidFile={work / "slurmctld.pid"}
SlurmdPidFile={work / "spool"}/slurmd-%n.pid
SlurmctldLogFile={work / "log" / "slurmctld.log"}
SlurmdLogFile={work / "log"}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
{node_lines}
PartitionName=dtn Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


def _logs(work: Path) -> str:
    """The last lines of every daemon's log, for an error that says why it did not come up."""
    tails = []
    for log in sorted((work / "log").glob("*.log")) + [work / "munge" / "log"]:
        if log.exists():
            lines = log.read_text(errors="replace").splitlines()[-5:]
            tails.append(f"{log.name}:\n  " + "\n  ".join(lines))
    return "\n".join(tails)


@contextmanager
def _daemon(argv: Sequence[str]) -> Iterator[subprocess.Popen[bytes]]:
    """`argv` running in the foreground as a child; stopped on exit (killed if it lingers)."""
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _named_host(name: str, argv: Sequence[str], netns: str | None = None) -> list[str]:
    """`argv` in a UTS namespace whose host name is `name`, in network namespace `netns`."""
    inner = ["unshare", "--uts", "sh", "-c", f'hostname {name} && exec "$@"', "sh", *argv]
    return ["nsenter", f"--net=/run/netns/{netns}", *inner] if netns else inner


def _wait_for(what: str, done: Callable[[], bool], work: Path, timeout_s: float) -> None:
    """Waits until `done()`; raises with the daemons' logs when it takes too long."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"Slurm: {what} within {timeout_s:g} s\n{_logs(work)}")
        time.sleep(0.2)


@contextmanager
def slurm_cluster(
    nodes: Sequence[Node], controller_addr: str, work: Path, controller_ns: str | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
) -> Iterator[Cluster]:  # fmt: skip
    """A cluster of `nodes`, its controller at `controller_addr` (in `controller_ns`, or this
    namespace), its files under `work`; every node idle when the body starts, within
    `start_timeout_s`. Needs root and Debian's `slurmctld`, `slurmd`, `slurm-client` and
    `munge`."""
    for d in ("munge", "state", "spool", "log"):
        (work / d).mkdir(parents=True, exist_ok=True)
    (work / "munge").chmod(0o700)
    key = work / "munge" / "key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    port = 20000 + 2 * (os.getpid() % 10000)
    conf = work / "slurm.conf"
    conf.write_text(_config(work, nodes, controller_addr, port))
    cluster = Cluster(conf=conf, nodes=tuple(nodes))
    munge = work / "munge"
    with ExitStack() as running:
        running.enter_context(_daemon([
            "munged", "--foreground", "--force", f"--socket={munge / 'socket'}",
            f"--key-file={key}", f"--pid-file={munge / 'pid'}", f"--seed-file={munge / 'seed'}",
            f"--log-file={munge / 'log'}",
        ]))  # fmt: skip
        _wait_for("munged did not start", (munge / "socket").exists, work, start_timeout_s)
        controller = ["slurmctld", "-D", "-i", "-f", str(conf)]
        running.enter_context(_daemon(_named_host(CONTROLLER, controller, controller_ns)))
        for node in nodes:
            slurmd = ["slurmd", "-D", "-f", str(conf)]
            running.enter_context(_daemon(_named_host(node.name, slurmd, node.netns)))

        def all_idle() -> bool:
            try:
                states = cluster.node_states()
            except subprocess.SubprocessError:
                return False  # the controller is not answering yet
            return len(states) == len(nodes) and all(s == "idle" for s in states.values())

        _wait_for("the nodes were not all idle", all_idle, work, start_timeout_s)
        yield cluster
