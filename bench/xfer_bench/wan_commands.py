"""`xfer-bench-wan`: bring up an emulated wide-area path to use by hand, or measure how fast the
emulator itself can go (its ceiling) at several round-trip times.

    xfer-bench-wan up --rate 1000 --rtt 50 --loss 0.0001
    xfer-bench-wan ceiling --rtts 10,50,100 --rates 1000,2500,5000

The ceiling is iperf3 -P N memory to memory through the path, against the configured rate, with
the delay line's timing (packets more than 1 ms late) and CPU use. Before measuring, the host
is checked for other load, and the report says when something else was running.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from xfer_bench import dataplane
from xfer_bench.netns import tear_down_on_signals
from xfer_bench.wan import DEFAULT_XFER, WanSpec, emulated_wan

CLOCK_TICKS = 100


def _ticks(line: str) -> tuple[int, int]:
    """All ticks and idle ticks (idle and I/O wait) of a `cpu` line of /proc/stat; guest time,
    already counted as user time, is left out."""
    fields = [int(x) for x in line.split()[1:9]]
    return sum(fields), fields[3] + fields[4]


def _cpu_line() -> str:
    return Path("/proc/stat").read_text().split("\n")[0]


def busy_share(first: str, second: str) -> float:
    """Share of all CPUs busy between two readings of the `cpu` line of /proc/stat."""
    (total0, idle0), (total1, idle1) = _ticks(first), _ticks(second)
    return 1 - (idle1 - idle0) / max(total1 - total0, 1)


def cpu_busy(seconds: float = 1.0) -> float:
    """Share of all CPUs of this machine busy over `seconds`."""
    first = _cpu_line()
    time.sleep(seconds)
    return busy_share(first, _cpu_line())


def host_busy_seconds() -> float:
    """CPU seconds all of this machine's CPUs together have been busy since it booted: a
    difference of two readings is what everything on it spent meanwhile, interrupts and the
    kernel's network processing included, which a process's own CPU time leaves to whichever
    process they interrupted."""
    total, idle = _ticks(_cpu_line())
    return (total - idle) / CLOCK_TICKS


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _spec(args: argparse.Namespace, rate: float, rtt: float) -> WanSpec:
    return WanSpec(
        rate_mbit=rate,
        rtt_ms=rtt,
        buffer=args.buffer,
        loss=args.loss,
        senders=getattr(args, "senders", 1),
        delay=args.delay,
        receiving_nodes=getattr(args, "receiving_nodes", 0),
        node_rate_mbit=getattr(args, "node_rate", None),
    )


def up(args: argparse.Namespace) -> int:
    """Holds a path up until Ctrl-C, printing how to use it."""
    with emulated_wan(_spec(args, args.rate, args.rtt), args.xfer) as w:
        print(f"emulated path up ({w.delay_mode}): {args.rate:g} Mbit/s, {args.rtt:g} ms RTT")
        for i, ns in enumerate(w.senders):
            print(f"  sender {i}: ip netns exec {ns} COMMAND")
        address = w.topology().receiver_addr
        print(f"  receiver:  ip netns exec {w.receiver} COMMAND  (address {address})")
        for j, ns in enumerate(w.nodes):
            node = w.node_topology(0, j).receiver_addr
            print(f"  receiving node {j}: ip netns exec {ns} COMMAND  (address {node})")
        print("Ctrl-C to tear it down")
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    for stats in w.delay_stats:
        print(f"delay line: {stats}")
    return 0


def ceiling(args: argparse.Namespace) -> int:
    """Measures iperf3 through the path at each RTT and rate; prints a markdown table."""
    busy = cpu_busy()
    rows = []
    for rtt in [float(x) for x in args.rtts.split(",")]:
        for rate in [float(x) for x in args.rates.split(",")]:
            with emulated_wan(_spec(args, rate, rtt), args.xfer) as w:
                pid = w.delay_line_pid
                cpu0 = process_cpu_seconds(pid) if pid else 0.0
                start = time.monotonic()
                gbps = dataplane.run_iperf3(w.topology(), args.streams, args.seconds)
                elapsed = time.monotonic() - start
                cpu = (process_cpu_seconds(pid) - cpu0) / elapsed if pid else 0.0
            late = sum(s["late_over_1ms"] for s in w.delay_stats)
            packets = sum(s["packets"] for s in w.delay_stats)
            rows.append((rtt, rate, gbps, cpu, late, packets))
            print(
                f"rtt {rtt:g} ms, rate {rate:g} Mbit/s: {gbps * 1e3:.0f} Mbit/s "
                f"({gbps * 1e3 / rate:.2f} of the rate), delay line {cpu:.0%} of a CPU",
                file=sys.stderr,
            )
    command = "xfer-bench-wan ceiling " + shlex.join(sys.argv[2:])
    print(f"\nreproduce: {command}")
    if busy > 0.10:
        print(f"warning: the host was {busy:.0%} busy before the run; figures may be low")
    print(
        f"\n| RTT ms | rate Mbit/s | iperf3 -P {args.streams} Mbit/s | of rate | "
        "delay-line CPU | late > 1 ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for rtt, rate, gbps, cpu, late, packets in rows:
        share = f"{late / packets:.2%}" if packets else "-"
        print(
            f"| {rtt:g} | {rate:g} | {gbps * 1e3:.0f} | {gbps * 1e3 / rate:.2f} | {cpu:.0%} | "
            f"{share} |"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parses the command line and runs `up` or `ceiling`."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("up", "ceiling"):
        s = sub.add_parser(name)
        s.add_argument("--buffer", default="1bdp", help="drop-tail buffer: bytes or N bdp")
        s.add_argument("--loss", type=float, default=0.0, help="random loss rate (0..1)")
        s.add_argument("--delay", default="auto", help="auto, delay-line or netem")
        s.add_argument("--xfer", type=Path, default=DEFAULT_XFER, help="the xfer binary")
    sub.choices["up"].add_argument("--rate", type=float, required=True, help="Mbit/s")
    sub.choices["up"].add_argument("--rtt", type=float, required=True, help="milliseconds")
    sub.choices["up"].add_argument("--senders", type=int, default=1)
    sub.choices["up"].add_argument(
        "--receiving-nodes", type=int, default=0, help="nodes behind the receiver (a site's DTNs)"
    )
    sub.choices["up"].add_argument(
        "--node-rate", type=float, help="each sender's and receiving node's own link, Mbit/s"
    )
    c = sub.choices["ceiling"]
    c.add_argument("--rtts", default="10,50,100", help="RTTs in ms, comma-separated")
    c.add_argument("--rates", default="1000,2500,5000,10000", help="Mbit/s, comma-separated")
    c.add_argument("--streams", type=int, default=4, help="iperf3 -P")
    c.add_argument("--seconds", type=float, default=8.0, help="iperf3 run length")
    args = p.parse_args(argv)
    if not args.xfer.exists():
        p.error(f"{args.xfer} does not exist: build it with cargo build --release")
    tear_down_on_signals()
    return up(args) if args.command == "up" else ceiling(args)


if __name__ == "__main__":
    sys.exit(main())
