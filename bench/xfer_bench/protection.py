"""Protection benchmark (issue 40): what integrity (`xfer send --integrity`, a keyed BLAKE3 tag
on every frame) and encryption (`--encrypt`, TLS 1.3) cost against a plain session over loopback
at several stream counts, file to file (a tmpfs) and memory to memory.

Every figure is a ratio against plain sessions measured in the same invocation: the three modes
run interleaved, each repeated, and the medians are compared, because absolute timings on a
shared machine are noisy. On loopback both ends share the machine's cores, so what a mode costs
either side lowers the throughput of both: the ratios bound what the modes cost where the CPU,
not the path, limits the transfer. File to file is the figure that counts: a memory-to-memory
sender repeats one generated block whose checksum and hash it computes once, so there only the
receiver hashes what arrives.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xfer_bench.dataplane import (
    XferReceiver,
    add_common_options,
    check_runnable,
    empty_dir,
    parse_size,
    print_report,
    run_xfer,
    write_key_file,
    write_payload,
    xfer_receiver,
)
from xfer_bench.netns import LOOPBACK, tmpfs

#: The modes compared, with the options `xfer send` takes for each.
MODES: dict[str, list[str]] = {
    "plain": [],
    "integrity": ["--integrity"],
    "encrypt": ["--encrypt"],
}


@dataclass
class Row:
    """Medians of one source and stream count, in Gbit/s."""

    source: str
    streams: int
    plain_gbps: float
    integrity_gbps: float
    encrypt_gbps: float

    @property
    def integrity_ratio(self) -> float:
        """Integrity over plain."""
        return self.integrity_gbps / self.plain_gbps

    @property
    def encrypt_ratio(self) -> float:
        """Encryption over plain."""
        return self.encrypt_gbps / self.plain_gbps


def row_of(source: str, streams: int, runs: dict[str, list[float]]) -> Row:
    """The row of one source and stream count from every run's Gbit/s, by mode."""
    med = {mode: statistics.median(values) for mode, values in runs.items()}
    return Row(source, streams, med["plain"], med["integrity"], med["encrypt"])


def format_table(rows: Sequence[Row]) -> str:
    """The report as a Markdown table."""
    lines = [
        "| source | streams | plain | integrity | encrypt | **integrity / plain** "
        "| **encrypt / plain** |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.source} | {r.streams} | {r.plain_gbps:.2f} | {r.integrity_gbps:.2f} | "
            f"{r.encrypt_gbps:.2f} | {r.integrity_ratio:.2f} | {r.encrypt_ratio:.2f} |"
        )
    lines.append("")
    lines.append("Throughput in Gbit/s over loopback, medians of interleaved runs.")
    return "\n".join(lines)


def measure(
    xfer: Path,
    rx: XferReceiver,
    key: Path,
    streams: Sequence[int],
    reps: int,
    size: int,
    payload: Path,
) -> list[Row]:
    """Interleaved, repeated runs of every mode at each stream count, file to file (`payload`,
    into the receiver's root, emptied after each run) and memory to memory."""
    sources = {"file": [str(payload)], "memory": ["--mem", str(size)]}
    rows = []
    for source, what in sources.items():
        for n in streams:
            runs: dict[str, list[float]] = {mode: [] for mode in MODES}
            for _ in range(reps):
                for mode, options in MODES.items():
                    args = [*what, *options, rx.addr]
                    runs[mode].append(run_xfer(LOOPBACK, xfer, rx, n, args, key))
                    empty_dir(rx.root)
            row = row_of(source, n, runs)
            print(
                f"{source} N={n}: plain {row.plain_gbps:.2f}, integrity {row.integrity_gbps:.2f}"
                f" ({row.integrity_ratio:.2f}x), encrypt {row.encrypt_gbps:.2f}"
                f" ({row.encrypt_ratio:.2f}x)",
                file=sys.stderr,
            )
            rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark and prints the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", default="1,4,16", help="stream counts, comma-separated")
    p.add_argument("--reps", type=int, default=3, help="repetitions per cell (median reported)")
    p.add_argument("--size", default="2GiB", help="bytes each run sends")
    add_common_options(p)
    args = p.parse_args(argv)
    check_runnable(p, args, "a tmpfs mount")
    streams = [int(s) for s in args.streams.split(",")]
    size = parse_size(args.size)
    command = "scripts/bench-protection " + shlex.join(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="xfer-bench-") as tmp:
        with tmpfs(os.path.join(tmp, "tmpfs"), str(2 * size + (64 << 20))) as scratch:
            payload, root = Path(scratch) / "payload.bin", Path(scratch) / "root"
            root.mkdir()
            write_payload(payload, size)
            with xfer_receiver(args.xfer, LOOPBACK, root) as rx:
                key = write_key_file(rx, Path(tmp) / "xfer.key")
                rows = measure(args.xfer, rx, key, streams, args.reps, size, payload)
    print()
    print_report(command, format_table(rows), rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
