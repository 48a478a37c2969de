"""Re-runs of an identical tree, compared by content: `xfer send --checksum` against
`rsync -a -c` on the same data, over loopback, in one run.

A tree of many small files (seeded sizes) is copied once by each tool; then every repetition
re-runs, in turn, `xfer send --checksum` (BLAKE3 of every file the receiver holds, on both
sides), plain `xfer send` (size and mtime) and `rsync -a -c` (xxh128 of every file, both ends
on this host), each of which must find nothing to send. The page cache is warm for all three.
The table gives each command's wall times, its median, and its median over rsync -c's. Both
ends of every tool share this machine's cores, as a re-run between two hosts would not.

A first run onto an empty destination, with and without `--checksum`, is timed too, with the
sender's CPU seconds: `--checksum` hashes only what the receiver holds, so with nothing there
it costs what a plain run does. With `--other BINARY`, that build's two commands (labelled
`other`) run beside, each sending to a receiver of its own build.
"""

from __future__ import annotations

import argparse
import random
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from xfer_bench.dataplane import (
    add_common_options,
    empty_dir,
    print_report,
    write_key_file,
    xfer_receiver,
    xfer_summary,
)
from xfer_bench.netns import LOOPBACK

#: The reference re-run, first in the table.
REFERENCE = "rsync -a -c"


@dataclass
class Row:
    """One command's runs: wall seconds, and its median over the reference's."""

    command: str
    wall_s: list[float]
    over_reference: float


@dataclass
class Timed:
    """One command's wall seconds and the CPU seconds its process (and children) used."""

    wall_s: float
    cpu_s: float


def write_tree(root: Path, files: int, min_size: int, max_size: int, seed: int) -> int:
    """Writes `files` files of random sizes in [min_size, max_size] and random bytes under
    `root`, 500 to a directory; returns their total size. The same seed writes the same tree."""
    rng = random.Random(seed)
    total = 0
    for i in range(files):
        directory = root / f"d{i // 500:03d}"
        directory.mkdir(parents=True, exist_ok=True)
        size = rng.randint(min_size, max_size)
        (directory / f"f{i:06d}").write_bytes(rng.randbytes(size))
        total += size
    return total


def timed(argv: Sequence[str]) -> tuple[Timed, str]:
    """Runs `argv` to its end, failing if it fails; its wall and CPU seconds and its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed: {out.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Timed(wall, cpu), out.stdout


def check_nothing_sent(command: str, stdout: str, files: int) -> None:
    """An xfer re-run of the identical tree sent no data byte; with `--checksum` it compared
    every file and found none changed (when it reports it: builds before the comparison was
    counted do not)."""
    summary = xfer_summary(stdout)
    if summary["bytes"] != 0:
        raise RuntimeError(f"{command} sent {summary['bytes']} bytes of an identical tree")
    compared = summary.get("compared")
    if (
        "--checksum" in command
        and compared
        and (compared["files"], compared["changed"])
        != (
            files,
            0,
        )
    ):
        raise RuntimeError(f"{command} compared {compared} of {files} identical files")


def format_table(rows: Sequence[Row]) -> str:
    """One line per command: median seconds, median over the reference's, every run."""
    lines = [
        f"| command | median s | over {REFERENCE} | runs (s) |",
        "|---|---:|---:|---|",
    ]
    for r in rows:
        runs = ", ".join(f"{w:.3f}" for w in r.wall_s)
        lines.append(
            f"| {r.command} | {statistics.median(r.wall_s):.3f} | {r.over_reference:.2f} | {runs} |"
        )
    return "\n".join(lines)


def format_first_runs(first: dict[str, list[Timed]]) -> str:
    """One line per first-run command: its wall and sender CPU seconds, every run."""
    lines = ["| first run | wall s | sender CPU s |", "|---|---|---|"]
    for command, runs in first.items():
        wall = ", ".join(f"{t.wall_s:.2f}" for t in runs)
        cpu = ", ".join(f"{t.cpu_s:.2f}" for t in runs)
        lines.append(f"| {command} | {wall} | {cpu} |")
    return "\n".join(lines)


def measure(
    builds: Sequence[tuple[str, Path]], work: Path, files: int, reps: int, first_reps: int
) -> tuple[list[Row], dict[str, list[Timed]]]:
    """Runs the first runs and the re-runs under `work`, where the tree is (`work/src/tree`),
    for each build (a label, `xfer` or `other`, and its binary, each sending to a receiver of
    its own build); returns the re-runs' rows, `rsync -a -c` first as the reference, and the
    first runs' timings."""
    source = work / "src" / "tree"
    rsync_dest = work / "rsync-dest"
    rsync_dest.mkdir(exist_ok=True)
    empty_dir(rsync_dest)
    argv: dict[str, list[str]] = {
        REFERENCE: ["rsync", "-a", "-c", f"{source}/", f"{rsync_dest}/tree/"]
    }
    first: dict[str, list[Timed]] = {}
    with ExitStack() as stack:
        for label, xfer in builds:
            root = work / f"{label}-root"
            root.mkdir(exist_ok=True)
            empty_dir(root)
            rx = stack.enter_context(xfer_receiver(xfer, LOOPBACK, root))
            key_file = write_key_file(rx, work / f"{label}-key")
            send = [str(xfer), "send", str(source), f"{rx.addr}:t", "--key-file", str(key_file)]
            send.append("--json")
            for options in (["--checksum"], []):
                command = shlex.join([label, *options])
                argv[command] = [*send, *options]
                first[command] = []
                for _ in range(first_reps):
                    empty_dir(root)
                    subprocess.run(["sync"], check=True)
                    first[command].append(timed(argv[command])[0])
        subprocess.run(["rsync", "-a", f"{source}/", f"{rsync_dest}/tree/"], check=True)
        # Written back now, not during the first re-run.
        subprocess.run(["sync"], check=True)
        commands = list(argv)
        walls: dict[str, list[float]] = {c: [] for c in commands}
        for rep in range(reps):
            # Each command goes first in turn.
            order = commands[rep % len(commands) :] + commands[: rep % len(commands)]
            for command in order:
                run, stdout = timed(argv[command])
                if command != REFERENCE:
                    check_nothing_sent(command, stdout, files)
                walls[command].append(run.wall_s)
    reference = statistics.median(walls[REFERENCE])
    rows = [Row(c, walls[c], statistics.median(walls[c]) / reference) for c in commands]
    return rows, first


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark and prints its tables."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=10_000, help="files in the tree")
    p.add_argument("--min-size", type=int, default=1_000, help="smallest file, bytes")
    p.add_argument("--max-size", type=int, default=120_000, help="largest file, bytes")
    p.add_argument("--seed", type=int, default=43, help="seed of the tree's sizes and bytes")
    p.add_argument("--reps", type=int, default=5, help="re-runs of each command")
    p.add_argument("--first-reps", type=int, default=2, help="first runs of each xfer command")
    p.add_argument(
        "--dir",
        type=Path,
        help="where the tree and its copies go (default: a " "temporary directory, removed after)",
    )
    add_common_options(p, other="another build of xfer (the previous release, say), run beside")
    args = p.parse_args(argv)
    if not args.xfer.exists():
        p.error(f"{args.xfer} does not exist: build it with cargo build --release")
    if args.other and not args.other.exists():
        p.error(f"{args.other} does not exist")
    if shutil.which("rsync") is None:
        p.error("rsync is not installed (scripts/bench-rerun installs it)")
    command = "./scripts/bench-rerun " + shlex.join(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        total = write_tree(
            work / "src" / "tree", args.files, args.min_size, args.max_size, args.seed
        )
        print(f"tree: {args.files} files, {total / 1e6:.0f} MB")
        builds = [("xfer", args.xfer)] + ([("other", args.other)] if args.other else [])
        rows, first = measure(builds, work, args.files, args.reps, args.first_reps)
    print_report(command, format_table(rows), rows, args.json)
    print()
    print(format_first_runs(first))
    return 0


if __name__ == "__main__":
    sys.exit(main())
