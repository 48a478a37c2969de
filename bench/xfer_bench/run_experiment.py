"""`xfer-bench-run EXPERIMENT`: runs an experiment file (or a shipped one by name) on the
emulated WAN, or between real hosts over ssh, and writes its logs, plots and markdown report.

    xfer-bench-run paper-fig2
    xfer-bench-run paper-fig4 --repetitions 1 --variants gd,one-of-each --out /tmp/fig4
    xfer-bench-run paper-fig2 --hosts hosts.toml      # see bench/MULTI_HOST.md
    xfer-bench-run paper-fig2 --variants ppo --variant mine=ppo:/tmp/my-policy
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from xfer_bench import experiment, hosts, report, runner
from xfer_bench.netns import tear_down_on_signals
from xfer_bench.wan import DEFAULT_XFER

RESULTS = Path(__file__).resolve().parents[1] / "results"


def main(argv: Sequence[str] | None = None) -> int:
    """Parses the command line, runs the experiment, prints where the report is."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("experiment", help="a TOML file, or a name from bench/experiments/")
    p.add_argument("--out", type=Path, help="results directory (default bench/results/NAME-TIME)")
    p.add_argument("--repetitions", type=int, help="override the file's repetitions")
    p.add_argument("--variants", help="only these variants, comma-separated")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=OPTIMIZER",
        help="also run the experiment's xfer transfers under this optimizer (repeatable)",
    )
    p.add_argument(
        "--xfer", type=Path, default=DEFAULT_XFER,
        help="the xfer binary on the emulated WAN (with --hosts, the hosts file names each one)",
    )  # fmt: skip
    p.add_argument(
        "--hosts", type=Path, help="run between the real hosts of this file instead (over ssh)"
    )
    args = p.parse_args(argv)
    try:
        exp = experiment.load(args.experiment)
        machines = hosts.load(args.hosts) if args.hosts else None
        for added in args.variant:
            name, sep, optimizer = added.partition("=")
            if not (sep and name and optimizer):
                p.error(f"--variant {added!r}: expected NAME=OPTIMIZER")
            exp = experiment.with_variant(exp, name, optimizer)
    except ValueError as e:
        p.error(str(e))
    if args.repetitions is not None:
        exp = experiment.Experiment(**{**exp.__dict__, "repetitions": args.repetitions})
    if machines is None and not args.xfer.exists():
        p.error(f"{args.xfer} does not exist: build it with cargo build --release")
    out = args.out or RESULTS / f"{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    tear_down_on_signals()
    variants = args.variants.split(",") if args.variants else None
    if variants is not None:
        variants += [added.partition("=")[0] for added in args.variant]
    try:
        runs = runner.run(exp, out, args.xfer, variants, machines)
    except (ValueError, RuntimeError) as e:
        print(f"xfer-bench-run: {e}", file=sys.stderr)
        return 1
    command = "xfer-bench-run " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    path = report.write(exp, runs, out, command, machines)
    print(path.read_text())
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
