"""Throughput of this build of xfer against another (`scripts/bench-against REV` builds it), on
loopback or over the emulated WAN, in one run: the no-regression check of a change to the data
path.

Each build runs its own receiver (a sender and a receiver from the same build), writing into a
tmpfs, on loopback or, with `--path wan`, across the path of `xfer_bench.wan` (600 Mbit/s and
30 ms unless told), where the link and not the CPU sets the rate. For each stream count, file
to file (one file, `--file-size`) and memory to memory (`--mem-size`) run with `--streams N`,
the two builds alternating and taking turns at going first, so that both meet the machine in
the same states. `--transport` chooses what carries the streams (both ends of both builds), so
QUIC's throughput too can be set against the other build's. The table gives the medians and the
ratio of this build over the other, the ratio of the two builds' fastest runs, and the
individual runs.

File-to-file runs of either build swing severalfold on a VM that hands free
memory back to its host: a run whose receiver is given memory the host took back spends seconds
in the kernel zeroing it (`clear_page_erms` under `shmem_get_folio_gfp`, each first touch a
fault the host must back; one CPU busy in system time, the other idle) and runs at 0.5-6 Gbit/s
instead of 20-26, whichever build it is; which run meets it is not in the benchmark's hands
(writing and freeing as much memory just before each run did not prevent it). A median of a few
such runs says more of the VM than of the build; the fastest runs are those the VM left alone.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from xfer_bench.dataplane import (
    DEFAULT_XFER,
    empty_dir,
    parse_size,
    print_report,
    run_xfer,
    topology,
    write_key_file,
    write_payload,
    xfer_receiver,
)
from xfer_bench.netns import Topology, tear_down_on_signals, tmpfs
from xfer_bench.wan import WanSpec, add_path_options, emulated_wan, path_spec

#: What is moved: one file from tmpfs into tmpfs, or generated data into a discarding sink.
KINDS = ("file", "mem")


@dataclass
class Row:
    """One stream count and kind: each build's runs (Gbit/s) and their medians' ratio."""

    streams: int
    kind: str
    other_gbps: list[float]
    this_gbps: list[float]

    @property
    def ratio(self) -> float:
        """This build's median over the other's."""
        return statistics.median(self.this_gbps) / statistics.median(self.other_gbps)

    @property
    def best_ratio(self) -> float:
        """This build's fastest run over the other's."""
        return max(self.this_gbps) / max(self.other_gbps)


def format_table(rows: Sequence[Row]) -> str:
    """The medians, their ratio, the fastest runs' ratio and the runs behind them."""
    lines = [
        "| streams | what | other Gbit/s | this Gbit/s | this / other | fastest: this / other "
        "| runs (other; this) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        runs = ", ".join(f"{g:.3g}" for g in r.other_gbps)
        runs += "; " + ", ".join(f"{g:.3g}" for g in r.this_gbps)
        lines.append(
            f"| {r.streams} | {r.kind} | {statistics.median(r.other_gbps):.2f} | "
            f"{statistics.median(r.this_gbps):.2f} | {r.ratio:.3f} | {r.best_ratio:.3f} | {runs} |"
        )
    return "\n".join(lines)


@contextmanager
def path(wan: WanSpec | None, xfer: Path) -> Iterator[Topology]:
    """Loopback, or the emulated path of `wan` (its delay line from `xfer`'s build)."""
    if wan is None:
        with topology("loopback") as topo:
            yield topo
    else:
        with emulated_wan(wan, xfer, prefix="xa") as emulated:
            yield emulated.topology(0)


def measure(
    other: Path, this: Path, streams: Sequence[int], reps: int, file_size: int, mem_size: int,
    work: Path, transport: str = "tcp", wan: WanSpec | None = None,
) -> list[Row]:  # fmt: skip
    """Alternating runs of both builds for each stream count and kind, over `transport`, on
    loopback or over the emulated path of `wan`."""
    source = work / "src" / "payload.bin"
    source.parent.mkdir()
    write_payload(source, file_size)
    builds = (other, this)
    roots = {b: work / f"root-{i}" for i, b in enumerate(builds)}
    for root in roots.values():
        root.mkdir()
    rows = []
    options = ["--transport", transport]
    with (
        path(wan, this) as topo,
        xfer_receiver(other, topo, roots[other], options=options) as rx_other,
        xfer_receiver(this, topo, roots[this], options=options) as rx_this,
    ):
        rxs = {other: rx_other, this: rx_this}
        keys = {b: write_key_file(rxs[b], work / f"key-{i}") for i, b in enumerate(builds)}
        for n in streams:
            runs: dict[tuple[Path, str], list[float]] = {(b, k): [] for b in builds for k in KINDS}
            for rep in range(reps):
                for b in builds if rep % 2 == 0 else builds[::-1]:
                    rx = rxs[b]
                    what = {
                        "file": [str(source), *options, rx.addr],
                        "mem": ["--mem", str(mem_size), *options, rx.addr],
                    }
                    for kind in KINDS:
                        runs[(b, kind)].append(run_xfer(topo, b, rx, n, what[kind], keys[b]))
                        empty_dir(roots[b])
            for kind in KINDS:
                row = Row(n, kind, runs[(other, kind)], runs[(this, kind)])
                print(f"N={n} {kind}: this / other {row.ratio:.3f}", file=sys.stderr)
                rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the comparison and prints the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--other", type=Path, required=True, help="the other build's xfer binary")
    p.add_argument("--xfer", type=Path, default=DEFAULT_XFER, help="this build's xfer binary")
    p.add_argument("--streams", default="1,4,16", help="stream counts, comma-separated")
    p.add_argument("--reps", type=int, default=5, help="runs of each build per case")
    p.add_argument("--file-size", default="2GiB", help="the file of the file-to-file runs")
    p.add_argument("--mem-size", default="4GiB", help="the memory-to-memory runs' size")
    p.add_argument(
        "--transport", default="tcp", choices=("tcp", "mptcp", "quic"), help="what carries streams"
    )
    p.add_argument("--path", default="loopback", choices=("loopback", "wan"), help="where")
    add_path_options(p)
    p.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = p.parse_args(argv)
    wan = path_spec(p, args) if args.path == "wan" else None
    if os.geteuid() != 0:
        p.error("needs root (a tmpfs for the files, namespaces for the emulated path)")
    for binary in (args.other, args.xfer):
        if not binary.exists():
            p.error(f"{binary} does not exist")
    tear_down_on_signals()
    file_size, mem_size = parse_size(args.file_size), parse_size(args.mem_size)
    streams = [int(s) for s in args.streams.split(",")]
    with tempfile.TemporaryDirectory(prefix="xfer-against-") as work:
        # Both builds' copies of the file at once, and the source. Over the emulated path, in
        # small pages: a receiver writing into huge pages there fell to 0.32-0.40 Gbit/s of the
        # link's 0.6 in three runs of three, against 0.51-0.54 in small pages alternating with
        # them (why was not pinned down).
        huge = "never" if wan else "always"
        with tmpfs(work, f"{3 * file_size + (256 << 20)}", huge=huge):
            rows = measure(args.other, args.xfer, streams, args.reps, file_size, mem_size,
                           Path(work), args.transport, wan)  # fmt: skip
    command = shlex.join(["xfer-bench-against", *(argv if argv is not None else sys.argv[1:])])
    print_report(command, format_table(rows), rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
