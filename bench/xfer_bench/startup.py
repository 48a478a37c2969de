"""Start-up benchmark: how soon `xfer send` carries data, and how much memory its sender holds,
for small and huge transfers (memory to memory, and a sparse file), on loopback.

A sender whose memory or start-up time grows with the size of the data pays for it on every
large transfer before the first byte (issue 42: 813 MiB and 1.2-3.3 s for `--mem 100TiB`).
Each case runs `xfer send --optimizer fixed:4 --mi 50ms --mi-log` with its streams capped in
rate (so a huge transfer writes little), is stopped once it has logged a few intervals that
carried data, and is measured by:

- the sender's own clock (seconds since its transfer started) at the end of the first interval
  that carried data: data flowed by then;
- the sender's peak resident memory (the kernel's `ru_maxrss` of the process).

Small and huge cases alternate, repeated, and the table gives medians and the ratio of huge to
small, measured in the same invocation.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xfer_bench.dataplane import (
    add_common_options,
    check_runnable,
    empty_dir,
    parse_size,
    print_report,
    read_mi_log,
    write_key_file,
    xfer_receiver,
)
from xfer_bench.netns import LOOPBACK, sparse_ext4, tear_down_on_signals

#: Intervals with data a run logs before it is stopped.
INTERVALS_WITH_DATA = 3
#: A run that has not logged them by then failed.
RUN_TIMEOUT_S = 20.0
#: The length of an interval.
MI = "50ms"
#: Each of the four streams' rate cap (Mbit/s): what a stopped huge transfer writes stays small.
STREAM_CAP_MBIT = 800


@dataclass
class Sample:
    """One run: seconds since the sender's start at the end of its first interval with data,
    and its peak resident memory in MiB."""

    first_data_s: float
    peak_rss_mib: float


@dataclass
class Row:
    """Medians of one kind of transfer at a small and a huge size."""

    kind: str
    small: str
    huge: str
    small_first_data_s: float
    huge_first_data_s: float
    small_rss_mib: float
    huge_rss_mib: float

    @property
    def rss_ratio(self) -> float:
        """Peak memory of the huge transfer over the small one's."""
        return self.huge_rss_mib / self.small_rss_mib


def run_once(argv: list[str], mi_log: Path) -> Sample:
    """Runs `argv` (an `xfer send` writing `mi_log`) until it has logged
    `INTERVALS_WITH_DATA` intervals that carried data, stops it, and measures it."""
    mi_log.unlink(missing_ok=True)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    records: list[dict] = []
    # Reaped with wait4 rather than Popen's own wait, which keeps no resource usage.
    ended = None
    try:
        while time.monotonic() < deadline:
            records = read_mi_log(mi_log) if mi_log.exists() else []
            if sum(r["throughput"] > 0 for r in records) >= INTERVALS_WITH_DATA:
                break
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                ended = (status, usage)
                break
            time.sleep(0.01)
    finally:
        if ended is None:
            # Not Popen.send_signal, which reaps a sender that just ended and leaves wait4
            # nothing to wait for; an unreaped sender keeps its pid, so this kills no other.
            os.kill(proc.pid, signal.SIGKILL)
            _, status, usage = os.wait4(proc.pid, 0)
            ended = (status, usage)
        status, usage = ended
        proc.returncode = os.waitstatus_to_exitcode(status)
        stderr = proc.stderr.read().decode() if proc.stderr else ""
    with_data = [r for r in records if r["throughput"] > 0]
    if len(with_data) < INTERVALS_WITH_DATA:
        raise RuntimeError(
            f"{shlex.join(argv)}: {len(with_data)} intervals with data in {RUN_TIMEOUT_S} s "
            f"(exit {proc.returncode}): {stderr.strip()[-500:]}"
        )
    # ru_maxrss is in KiB on Linux.
    return Sample(with_data[0]["time"], usage.ru_maxrss / 1024)


def send_command(xfer: Path, addr: str, key_file: Path, what: list[str], mi_log: Path) -> list[str]:
    """`xfer send WHAT` at four capped streams, logging intervals to `mi_log`."""
    argv = [str(xfer), "send", *what, addr, "--key-file", str(key_file), "--quiet"]
    argv += ["--optimizer", "fixed:4", "--mi", MI, "--mi-log", str(mi_log)]
    return argv + ["--stream-rate-cap", str(STREAM_CAP_MBIT)]


def measure(xfer: Path, cases: Sequence[Case], reps: int, work: Path) -> list[Row]:
    """Runs each case at its small and huge size, `reps` times alternating, against one
    receiver whose root (emptied after every run) is a 2 TiB file system on a sparse image:
    the receiver preallocates each file whole, so a huge file needs room for all of it."""
    key_file = work / "key"
    mi_log = work / "mi.jsonl"
    rows = []
    with (
        sparse_ext4(str(work / "root"), "2T") as root,
        xfer_receiver(xfer, LOOPBACK, root) as rx,
    ):
        write_key_file(rx, key_file)
        for case in cases:
            samples: dict[int, list[Sample]] = {case.small: [], case.huge: []}
            for _ in range(reps):
                for size in samples:
                    what = case.source(size, work)
                    argv = send_command(xfer, rx.addr, key_file, what, mi_log)
                    samples[size].append(run_once(argv, mi_log))
                    empty_dir(Path(root))

            def median(size: int, field: str, s: dict[int, list[Sample]] = samples) -> float:
                return statistics.median(getattr(x, field) for x in s[size])

            rows.append(
                Row(
                    case.kind,
                    human(case.small),
                    human(case.huge),
                    median(case.small, "first_data_s"),
                    median(case.huge, "first_data_s"),
                    median(case.small, "peak_rss_mib"),
                    median(case.huge, "peak_rss_mib"),
                )
            )
    return rows


@dataclass
class Case:
    """A kind of transfer at a small and a huge size."""

    kind: str
    small: int
    huge: int

    def source(self, size: int, work: Path) -> list[str]:
        """What `xfer send` is given to send `size` bytes of this kind: generated data, or a
        sparse file of that size made under `work` (once)."""
        if self.kind == MEMORY:
            return ["--mem", str(size)]
        path = work / f"sparse-{size}.bin"
        if not path.exists():
            with path.open("wb") as f:
                f.truncate(size)
        return [str(path)]


#: The two kinds of case.
MEMORY, SPARSE_FILE = "memory to memory", "sparse file"


def human(size: int) -> str:
    """`size` in the largest binary unit that divides it."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def format_table(rows: Sequence[Row]) -> str:
    """A Markdown table of the rows."""
    lines = [
        "| kind | small | huge | first data, small (s) | first data, huge (s) "
        "| peak RSS small (MiB) | peak RSS huge (MiB) | RSS huge / small |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.kind} | {r.small} | {r.huge} | {r.small_first_data_s:.3f} "
            f"| {r.huge_first_data_s:.3f} | {r.small_rss_mib:.1f} | {r.huge_rss_mib:.1f} "
            f"| {r.rss_ratio:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark and prints the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", default="1GiB", help="the small transfers' size")
    p.add_argument("--mem-huge", default="100TiB", help="the huge memory-to-memory size")
    p.add_argument("--file-huge", default="1TiB", help="the huge sparse file's size")
    p.add_argument("--reps", type=int, default=3, help="repetitions per case (median reported)")
    add_common_options(p)
    args = p.parse_args(argv)
    check_runnable(p, args, "a tmpfs mount for the receiver's root")
    tear_down_on_signals()
    with tempfile.TemporaryDirectory(prefix="xfer-startup-") as work:
        small = parse_size(args.small)
        cases = [
            Case(MEMORY, small, parse_size(args.mem_huge)),
            Case(SPARSE_FILE, small, parse_size(args.file_huge)),
        ]
        rows = measure(args.xfer, cases, args.reps, Path(work))
    command = shlex.join(["xfer-bench-startup", *(argv if argv is not None else sys.argv[1:])])
    print_report(command, format_table(rows), rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
