"""Push, pull and third-party throughput over the same emulated path, in one run.

The same files go from sender 0 of `xfer_bench.wan`'s path to its receiver three ways, each
started over ssh (an OpenSSH server in both namespaces, with keys made for the run):

- push: `xfer send SRC receiver:DIR`, run on the sender;
- pull: `xfer send sender0:SRC DIR`, run on the receiver (the sender there connects back);
- third-party: `xfer send sender0:SRC receiver:DIR`, run on the router, a third host.

The data crosses the same bottleneck in the same direction every time; what differs is who
asked, where the reports go, and the start of the remote side. The variants take turns at
going first, the destination is emptied before each run, and the table gives each variant's
runs and its median over push's.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from xfer_bench import sshd
from xfer_bench.dataplane import (
    add_common_options,
    check_runnable,
    empty_dir,
    parse_size,
    print_report,
    write_payload,
    xfer_summary,
)
from xfer_bench.netns import tear_down_on_signals, tmpfs
from xfer_bench.wan import (
    RECEIVER_ADDR,
    Wan,
    add_path_options,
    emulated_wan,
    path_spec,
    sender_addr,
)

#: The three ways, in the order of the table.
VARIANTS = ("push", "pull", "third-party")


@dataclass
class Row:
    """One variant's runs: Gbit/s as the sender measured them, the command's wall seconds (the
    ssh start-up included), and its median Gbit/s over push's."""

    variant: str
    gbps: list[float]
    wall_s: list[float]
    over_push: float


def format_table(rows: Sequence[Row]) -> str:
    """The medians, their ratio to push's and the runs behind them."""
    lines = [
        "| variant | median Gbit/s | / push | median wall s | runs (Gbit/s) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        runs = ", ".join(f"{g:.3f}" for g in r.gbps)
        gbps, wall = statistics.median(r.gbps), statistics.median(r.wall_s)
        lines.append(f"| {r.variant} | {gbps:.3f} | {r.over_push:.3f} | {wall:.1f} | {runs} |")
    return "\n".join(lines)


@contextmanager
def ssh_servers(wan: Wan, work: Path) -> Iterator[Path]:
    """An sshd on sender 0 and on the receiver (`xfer_bench.sshd`); yields an ssh config in
    which `sender0` and `receiver` name them."""
    servers = {
        "sender0": (wan.senders[0], sender_addr(0)),
        "receiver": (wan.receiver, RECEIVER_ADDR),
    }
    with sshd.ssh_servers(servers, work) as config:
        yield config


def measure(
    wan: Wan, xfer: Path, config: Path, source: Path, dest: Path, reps: int, extra: Sequence[str]
) -> list[Row]:
    """`reps` runs of each variant, taking turns at going first."""
    ssh = ["--ssh-command", f"ssh -F {config}", "--remote-xfer", str(xfer)]
    commands = {
        "push": [wan.senders[0], str(source), f"receiver:{dest}"],
        "pull": [wan.receiver, f"sender0:{source}", str(dest)],
        "third-party": [wan.router, f"sender0:{source}", f"receiver:{dest}"],
    }
    runs: dict[str, list[float]] = {v: [] for v in VARIANTS}
    walls: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for rep in range(reps):
        order = VARIANTS[rep % len(VARIANTS) :] + VARIANTS[: rep % len(VARIANTS)]
        for variant in order:
            ns, *what = commands[variant]
            empty_dir(dest)
            argv = ["ip", "netns", "exec", ns, str(xfer), "send", *what, *ssh, *extra, "--json"]
            began = time.monotonic()
            out = subprocess.run(argv, capture_output=True, text=True)
            walls[variant].append(time.monotonic() - began)
            if out.returncode != 0:
                raise RuntimeError(f"{variant} failed: {out.stderr.strip()}")
            gbps = float(xfer_summary(out.stdout)["gbit_per_s"])
            print(f"{variant}: {gbps:.3f} Gbit/s", file=sys.stderr)
            runs[variant].append(gbps)
    push = statistics.median(runs["push"])
    return [Row(v, runs[v], walls[v], statistics.median(runs[v]) / push) for v in VARIANTS]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the comparison and prints the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(p)
    add_path_options(p)
    p.add_argument("--reps", type=int, default=3, help="runs of each variant")
    p.add_argument("--size", default="1GiB", help="the file sent")
    p.add_argument(
        "--send-options",
        default="--streams 8",
        help="options of every xfer send, one shell-like string",
    )
    args = p.parse_args(argv)
    spec = path_spec(p, args)
    check_runnable(p, args, "namespaces, sshd and a tmpfs")
    for tool in ("/usr/sbin/sshd", shutil.which("ssh-keygen")):
        if not tool or not Path(tool).exists():
            p.error("needs OpenSSH's server and client (apt-get install openssh-server)")
    tear_down_on_signals()
    size = parse_size(args.size)
    with tempfile.TemporaryDirectory(prefix="xfer-directions-") as work:
        with tmpfs(work, f"{2 * size + (256 << 20)}", huge="never"):
            work_dir = Path(work)
            source, dest = work_dir / "src" / "payload.bin", work_dir / "dest"
            source.parent.mkdir()
            dest.mkdir()
            write_payload(source, size)
            with (
                emulated_wan(spec, args.xfer, prefix="xd") as wan,
                ssh_servers(wan, work_dir) as config,
            ):
                extra = shlex.split(args.send_options)
                rows = measure(wan, args.xfer, config, source, dest, args.reps, extra)
    command = "scripts/bench-directions " + shlex.join(sys.argv[1:] if argv is None else argv)
    print_report(command, format_table(rows), rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
