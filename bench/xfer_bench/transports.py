"""Transports benchmark (issue 7): TCP, MPTCP and QUIC on the same two emulated paths, and
iperf3 beside them, throughput and CPU seconds per Gbit moved, as ratios within one run.

Two namespaces are joined by two veth pairs, paths A and B, each held by htb on the sender's
side to its own rate (B is the faster). TCP runs over path B alone (the best any single-path
transport can do here) and over path A; MPTCP runs with the receiver's path manager
announcing its path-B address, so that every connection gets a subflow on each path; QUIC (one
connection per stream, single-path) runs over path B, with the congestion controller of
`--quic-congestion`. Each cell is `xfer send --mem SIZE --streams N --transport T --json`;
the reference is `iperf3 -P N -n SIZE` over path B, whose CPU per Gbit each xfer case is also
given over (issue 42's target for TCP: at most 1.2 on both sides). With `--other XFER`,
QUIC over path B also runs with another build of xfer (both of its ends), interleaved with the
rest: QUIC's throughput and CPU against TCP's, before and after a change, in one run. Runs are
interleaved and repeated, and the median is reported. CPU is user + system seconds of the
sender and of the receiver during the run, from the supervisor that runs each of them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from xfer_bench import own_cpu, supervise
from xfer_bench.dataplane import (
    add_common_options,
    check_runnable,
    iperf3_gbps,
    iperf3_report,
    parse_size,
    print_report,
    write_key_file,
    xfer_receiver,
    xfer_summary_gbps,
)
from xfer_bench.netns import Topology, namespace_pair, run_ip, tear_down_on_signals
from xfer_bench.wan import add_htb
from xfer_bench.wan_commands import host_busy_seconds

#: The receiver's address on each path; the sender's is .1 of the same /30.
PATH_A = "10.213.1.2"
PATH_B = "10.213.2.2"


@contextmanager
def two_paths(rate_a: float, rate_b: float, prefix: str = "xm") -> Iterator[dict[str, Topology]]:
    """Two namespaces joined by paths A and B at the given rates (Mbit/s), with MPTCP's path
    managers set up; yields the topology that reaches the receiver over each path ("A", "B").

    Needs root. Everything made here is removed on exit, also when the body raises."""
    tag = f"{prefix}{os.getpid() % 100000}"
    with namespace_pair(tag) as (snd, rcv):
        for ns in (snd, rcv):
            run_ip("-n", ns, "mptcp", "limits", "set", "subflows", "2", "add_addr_accepted", "2")
        for path, rate in (("1", rate_a), ("2", rate_b)):
            a, b = f"{tag}{path}a", f"{tag}{path}b"
            run_ip("link", "add", a, "netns", snd, "type", "veth", "peer", b, "netns", rcv)
            run_ip("-n", snd, "addr", "add", f"10.213.{path}.1/30", "dev", a)
            run_ip("-n", rcv, "addr", "add", f"10.213.{path}.2/30", "dev", b)
            for ns, dev in ((snd, a), (rcv, b)):
                run_ip("-n", ns, "link", "set", dev, "up")
            add_htb(snd, a, rate)
        run_ip("-n", rcv, "mptcp", "endpoint", "add", PATH_B, "dev", f"{tag}2b", "signal")
        yield {
            name: Topology(name=f"path {name}", receiver_addr=addr, sender_ns=snd, receiver_ns=rcv)
            for name, addr in (("A", PATH_A), ("B", PATH_B))
        }


@dataclass(frozen=True)
class Case:
    """One way to send: a transport, over the path its receiver address is on, by this build
    of xfer or the other one (`--other`)."""

    transport: str
    path: str
    other_build: bool = False

    @property
    def name(self) -> str:
        # MPTCP uses both paths whichever it starts on.
        name = self.transport if self.transport == "mptcp" else f"{self.transport} via {self.path}"
        return f"{name} (other build)" if self.other_build else name


#: The reference: iperf3 over TCP on path B.
IPERF3 = Case("iperf3", "B")
CASES = (Case("tcp", "B"), Case("tcp", "A"), Case("mptcp", "A"), Case("quic", "B"), IPERF3)
#: What the other build runs when there is one.
OTHER_CASES = (Case("quic", "B", other_build=True),)


@dataclass
class Run:
    """One measured transfer."""

    gbps: float
    sender_cpu: float
    receiver_cpu: float
    #: What the whole machine spent meanwhile (`wan_commands.host_busy_seconds`).
    host_cpu: float = 0.0
    #: Each side's CPU in its own context, when sampled (`own_cpu`).
    sender_own_cpu: float = 0.0
    receiver_own_cpu: float = 0.0


@dataclass
class Row:
    """The median of a case's runs, with ratios to TCP over the faster path."""

    case: str
    streams: int
    gbps: float
    vs_tcp_b: float
    sender_cpu_per_gbit: float
    receiver_cpu_per_gbit: float
    #: CPU per Gbit over iperf3's on the same side.
    sender_cpu_vs_iperf3: float = 0.0
    receiver_cpu_vs_iperf3: float = 0.0
    #: The machine's CPU per Gbit during the runs (everything: both ends, the emulated path,
    #: the kernel's network processing), and over iperf3's.
    host_cpu_per_gbit: float = 0.0
    host_cpu_vs_iperf3: float = 0.0
    #: CPU per Gbit each side spent in its own context, without the interrupt work the kernel
    #: charged to it (`own_cpu`), and over iperf3's; 0 unless sampled.
    sender_own_cpu_per_gbit: float = 0.0
    receiver_own_cpu_per_gbit: float = 0.0
    sender_own_cpu_vs_iperf3: float = 0.0
    receiver_own_cpu_vs_iperf3: float = 0.0


SIDES = ("sender", "receiver")


def _run(gbps: float, logs: dict[str, Path], samples: dict[str, Path] | None) -> Run:
    """A run's figures from its supervisors' CPU reports (`logs`) and, when it was sampled,
    its recordings (`samples`), by side."""
    cpu = {side: supervise.cpu_seconds(log) for side, log in logs.items()}
    if None in cpu.values():
        raise RuntimeError(f"no CPU report from the supervisor: {cpu}")
    run = Run(gbps, cpu["sender"] or 0.0, cpu["receiver"] or 0.0)
    if samples is not None:
        run.sender_own_cpu = own_cpu.own_seconds(samples["sender"])
        run.receiver_own_cpu = own_cpu.own_seconds(samples["receiver"])
    return run


def _samples(tmp: Path, tool: str, sample: bool) -> dict[str, Path] | None:
    """Where each side's recording goes when runs are sampled."""
    return {side: tmp / f"{tool}-{side}.perf" for side in SIDES} if sample else None


def _prefixes(samples: dict[str, Path] | None) -> dict[str, list[str]]:
    """The command prefix of each side that records into its `samples` path."""
    return {side: own_cpu.recorded(path) for side, path in (samples or {}).items()}


def run_iperf3(topo: Topology, streams: int, size: int, tmp: Path, sample: bool = False) -> Run:
    """One `iperf3 -P streams -n size` run, server and client each under the supervisor (so
    that both report their CPU time), and sampled when `sample` is set."""
    logs = {side: tmp / f"iperf3-{side}.log" for side in SIDES}
    samples = _samples(tmp, "iperf3", sample)
    report = iperf3_report(
        topo, streams, 0, amount=size, cpu_logs=logs, prefixes=_prefixes(samples)
    )
    return _run(iperf3_gbps(report), logs, samples)


def run_once(
    paths: dict[str, Topology],
    builds: dict[bool, Path],
    case: Case,
    streams: int,
    size: int,
    tmp: Path,
    quic_congestion: str = "cubic",
    sample: bool = False,
) -> Run:
    """One `xfer send --mem` of `case` with a receiver of its own (so that its CPU time is the
    run's), both ends of `case`'s build (`builds`, by whether it is the other one); both sides
    sampled when `sample` is set (`own_cpu`)."""
    topo = paths[case.path]
    if case.transport == "iperf3":
        return run_iperf3(topo, streams, size, tmp, sample)
    xfer = builds[case.other_build]
    logs = {side: tmp / f"{side}.log" for side in SIDES}
    samples = _samples(tmp, "xfer", sample)
    prefixes = _prefixes(samples)
    options = ["--transport", case.transport]
    # Listening on every address lets MPTCP subflows join on the announced path-B address.
    with xfer_receiver(
        xfer,
        topo,
        tmp / "root",
        logs["receiver"],
        options=options,
        listen_host="0.0.0.0",
        prefix=prefixes.get("receiver", ()),
    ) as rx:
        key = write_key_file(rx, tmp / "key")
        cmd = [*prefixes.get("sender", ()), str(xfer), "send", "--mem", str(size), rx.addr]
        cmd += ["--key-file", str(key)]
        cmd += ["--streams", str(streams), "--json", *options]
        if case.transport == "quic":
            cmd += ["--congestion", quic_congestion]
        with logs["sender"].open("w") as err:
            # The supervisor's stdin stays open until the sender is done (closing it stops it).
            sender = supervise.start(
                topo.sender_cmd(supervise.supervised(cmd)), stdout=subprocess.PIPE, stderr=err
            )
            assert sender.stdout is not None
            stdout = sender.stdout.read().decode()
            returncode = sender.wait()
            supervise.stop(sender)
    if returncode != 0:
        raise RuntimeError(f"xfer send ({case.name}) failed: {logs['sender'].read_text()}")
    return _run(xfer_summary_gbps(stdout), logs, samples)


def measure(
    paths: dict[str, Topology],
    xfer: Path,
    streams: Sequence[int],
    reps: int,
    size: int,
    tmp: Path,
    quic_congestion: str = "cubic",
    other: Path | None = None,
    cases: Sequence[Case] = CASES,
    other_cases: Sequence[Case] = OTHER_CASES,
    sample: bool = False,
) -> list[Row]:
    """Every case at every stream count (with `other`, `other_cases` too), runs interleaved,
    `reps` each, sampled when `sample` is set (`own_cpu`). The first case is the one the
    others' throughput is given over, the iperf3 case the one their CPU is."""
    runs: dict[tuple[Case, int], list[Run]] = {}
    (tmp / "root").mkdir(exist_ok=True)
    builds = {False: xfer, True: other or xfer}
    cases = (*cases, *(other_cases if other else ()))
    iperf3 = next(c for c in cases if c.transport == "iperf3")
    for _ in range(reps):
        for n in streams:
            for case in cases:
                before = host_busy_seconds()
                run = run_once(paths, builds, case, n, size, tmp, quic_congestion, sample)
                run.host_cpu = host_busy_seconds() - before
                runs.setdefault((case, n), []).append(run)
    rows = []
    gbit = size * 8 / 1e9

    def cpu_per_gbit(case: Case, n: int) -> list[float]:
        """Medians per Gbit: sender, receiver, host, sender's own, receiver's own."""
        figures = [
            (r.sender_cpu, r.receiver_cpu, r.host_cpu, r.sender_own_cpu, r.receiver_own_cpu)
            for r in runs[(case, n)]
        ]
        return [statistics.median(column) / gbit for column in zip(*figures, strict=True)]

    for n in streams:
        base = statistics.median(r.gbps for r in runs[(cases[0], n)])
        reference = cpu_per_gbit(iperf3, n)
        for case in cases:
            gbps = statistics.median(r.gbps for r in runs[(case, n)])
            cpu = cpu_per_gbit(case, n)
            vs = [c / ref if ref else 0.0 for c, ref in zip(cpu, reference, strict=True)]
            rows.append(
                Row(
                    case=case.name,
                    streams=n,
                    gbps=gbps,
                    vs_tcp_b=gbps / base if base else 0.0,
                    sender_cpu_per_gbit=cpu[0],
                    receiver_cpu_per_gbit=cpu[1],
                    sender_cpu_vs_iperf3=vs[0],
                    receiver_cpu_vs_iperf3=vs[1],
                    host_cpu_per_gbit=cpu[2],
                    host_cpu_vs_iperf3=vs[2],
                    sender_own_cpu_per_gbit=cpu[3],
                    receiver_own_cpu_per_gbit=cpu[4],
                    sender_own_cpu_vs_iperf3=vs[3],
                    receiver_own_cpu_vs_iperf3=vs[4],
                )
            )
    return rows


def format_table(rows: Sequence[Row], base: str = "vs tcp B", own: bool = False) -> str:
    """The rows as an aligned text table; `base` heads the column of throughput over the first
    case's; with `own`, each side's own CPU (sampled runs) follows."""
    head = f"{'case':<26} {'streams':>7} {'Gbit/s':>8} {base:>9} {'snd CPU s/Gbit':>15} "
    head += f"{'rcv CPU s/Gbit':>15} {'snd vs iperf3':>14} {'rcv vs iperf3':>14} "
    head += f"{'host CPU s/Gbit':>16} {'host vs iperf3':>15}"
    if own:
        head += f" {'snd own s/Gbit':>15} {'rcv own s/Gbit':>15} "
        head += f"{'snd own vs':>11} {'rcv own vs':>11}"
    lines = [head]
    for r in rows:
        line = (
            f"{r.case:<26} {r.streams:>7} {r.gbps:>8.3f} {r.vs_tcp_b:>9.2f} "
            f"{r.sender_cpu_per_gbit:>15.3f} {r.receiver_cpu_per_gbit:>15.3f} "
            f"{r.sender_cpu_vs_iperf3:>14.2f} {r.receiver_cpu_vs_iperf3:>14.2f} "
            f"{r.host_cpu_per_gbit:>16.3f} {r.host_cpu_vs_iperf3:>15.2f}"
        )
        if own:
            line += (
                f" {r.sender_own_cpu_per_gbit:>15.3f} {r.receiver_own_cpu_per_gbit:>15.3f}"
                f" {r.sender_own_cpu_vs_iperf3:>11.2f} {r.receiver_own_cpu_vs_iperf3:>11.2f}"
            )
        lines.append(line)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark and prints the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate-a", type=float, default=300, help="path A's rate, Mbit/s")
    p.add_argument("--rate-b", type=float, default=600, help="path B's rate, Mbit/s")
    p.add_argument("--streams", default="1,4", help="stream counts, comma-separated")
    p.add_argument("--reps", type=int, default=3, help="repetitions per cell (median reported)")
    p.add_argument("--size", default="256MiB", help="bytes of generated data per run")
    p.add_argument(
        "--quic-congestion",
        default="cubic",
        choices=("cubic", "bbr", "new_reno"),
        help="QUIC's congestion controller (TCP and MPTCP use the kernel's, cubic by default)",
    )
    add_common_options(p, other="another build's xfer binary: QUIC runs with it too")
    args = p.parse_args(argv)
    check_runnable(p, args, "network namespaces")
    if not 0 < args.rate_a < args.rate_b:
        p.error("path B must be the faster: 0 < --rate-a < --rate-b")
    tear_down_on_signals()
    streams = [int(s) for s in args.streams.split(",")]
    command = "scripts/bench-transports " + shlex.join(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="xfer-transports-") as tmp:
        with two_paths(args.rate_a, args.rate_b) as paths:
            size = parse_size(args.size)
            rows = measure(
                paths,
                args.xfer,
                streams,
                args.reps,
                size,
                Path(tmp),
                args.quic_congestion,
                args.other,
            )
    print(f"\npaths: A {args.rate_a:g} Mbit/s, B {args.rate_b:g} Mbit/s (htb)")
    print(f"QUIC congestion control: {args.quic_congestion}")
    print_report(command, format_table(rows), rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
