"""CPU per Gbit at the link's rate on the emulated WAN (issue 42): xfer's sender and receiver
against iperf3's client and server over the same path, as ratios within one run.

One sender namespace reaches the receiver through the emulated path of `xfer_bench.wan`
(htb bottleneck, drop-tail buffer, the round-trip delay on the ACK path), where the link and not
the CPU sets both tools' rate, so CPU per Gbit is what each spends to fill it. Each cell is
`xfer send --mem SIZE --streams N --json` with a receiver of its own, beside
`iperf3 -P N -n SIZE`; with `--other XFER` another build runs the same cell too (before and
after a change). Runs are interleaved and repeated, and the median is reported.

Each side's CPU is given three ways. User + system seconds from the supervisor that runs it
(`xfer_bench.transports`; the sampling's own time included, for both tools alike) are what
`top` shows, but on this path most of them are interrupt work the kernel charges to whichever
process it interrupted: the emulated path's qdisc and delay line, acknowledgements, receive
processing, so that the same tool's figure moves by up to a half between runs a minute apart.
Every side is therefore also sampled with `perf` (`xfer_bench.own_cpu`), and its own CPU (its
code and its system calls, without softirqs) is reported beside; and the whole machine's busy
time says what a run costs the host, whoever is charged. Issue 42's target: at most 1.2 times
iperf3's on both sides.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from xfer_bench.dataplane import add_common_options, check_runnable, parse_size, print_report
from xfer_bench.netns import tear_down_on_signals
from xfer_bench.transports import Case, format_table, measure
from xfer_bench.wan import add_path_options, emulated_wan, path_spec

#: The cases, all on the one path ("W"): this build, then iperf3.
CASES = (Case("tcp", "W"), Case("iperf3", "W"))
#: What the other build runs when there is one.
OTHER_CASES = (Case("tcp", "W", other_build=True),)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark and prints the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_path_options(p)
    p.add_argument("--streams", default="1,4", help="stream counts, comma-separated")
    p.add_argument("--reps", type=int, default=3, help="repetitions per cell (median reported)")
    p.add_argument("--size", default="1GiB", help="bytes of generated data per run")
    add_common_options(p, other="another build's xfer binary, run beside this one")
    args = p.parse_args(argv)
    check_runnable(p, args, "network namespaces")
    if shutil.which("perf") is None:
        p.error("needs perf (Debian's linux-perf) to sample each side's own CPU")
    spec = path_spec(p, args)
    tear_down_on_signals()
    streams = [int(s) for s in args.streams.split(",")]
    command = "scripts/bench-cpu " + shlex.join(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="xfer-cpu-") as tmp:
        with emulated_wan(spec, args.xfer) as wan:
            rows = measure(
                {"W": wan.topology(0)},
                args.xfer,
                streams,
                args.reps,
                parse_size(args.size),
                Path(tmp),
                other=args.other,
                cases=CASES,
                other_cases=OTHER_CASES,
                sample=True,
            )
    print(f"\npath: {args.rate:g} Mbit/s, {args.rtt_ms:g} ms, buffer {args.buffer}")
    print_report(command, format_table(rows, base="vs tcp", own=True), rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
