"""`xfer-bench-calibrate`: the simulator against the emulated WAN. For each scenario, the same
path is built on the emulator (rate, RTT, buffer, random loss, per-stream cap), xfer runs with a
fixed stream count for each count of a sweep, and `xfer sim` runs the same counts on the
scenario; the table shows both throughput curves and the gap.

    xfer-bench-calibrate --scenarios paper-fig2,cloudlab-1g --streams 1,2,4,8,16,32

Throughput is the mean over the intervals after the first `--settle` seconds (slow start and
connection set-up excluded), for the emulator and the simulator alike; on the emulator, the
median over `--repetitions` runs, because loss-limited TCP varies a lot from run to run.

With `--schedule`, the count changes on a timetable instead (`--optimizer schedule:...` on
both sides), and the table follows the interval after each change: how fast new streams take
their share, and the streams left after others close take what they leave. Scenarios may be
files as well as shipped names (`bench/calibration/` holds paths for this):

    xfer-bench-calibrate --scenarios bench/calibration/long-deep.toml \
        --schedule 0s:1,15s:6,40s:1 --seconds 65

With `--schedule`, a scenario's path may also change during the run (its `changes` of
capacity, RTT and random loss; not background flows): the emulator plays the same timetable
from the moment each transfer starts (the bottleneck's rate and the loss changed in place, the
delay line's RTT schedule restarted), ramps as a step each second, as `xfer sim` follows them:

    xfer-bench-calibrate --scenarios capacity-halves-doubles --schedule 0s:20 --seconds 200
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xfer_bench import dataplane, supervise
from xfer_bench.netns import tear_down_on_signals
from xfer_bench.wan import DEFAULT_XFER, Wan, WanSpec, emulated_wan
from xfer_bench.wan_commands import cpu_busy

SCENARIOS = Path(__file__).resolve().parents[2] / "crates" / "optimizer" / "scenarios"
#: Bytes of TCP (with timestamps), IP and Ethernet headers on every full segment.
HEADERS = 66
#: Largest relative gap between the curves that counts as calibrated.
TOLERANCE = 0.15


@dataclass(frozen=True)
class Point:
    """Both measurements at one stream count."""

    streams: int
    emulated_mbit: float
    simulated_mbit: float

    @property
    def gap(self) -> float:
        """Simulated over emulated, minus one."""
        return self.simulated_mbit / self.emulated_mbit - 1 if self.emulated_mbit else float("inf")


def scenario_file(name: str) -> Path:
    """The TOML file of a scenario: a shipped one by name, or a file."""
    return Path(name) if name.endswith(".toml") else SCENARIOS / f"{name}.toml"


def line_rate(capacity_mbps: float, mss: float) -> float:
    """The bottleneck's rate for a scenario's capacity, which is goodput: headers count too."""
    return capacity_mbps * (mss + HEADERS) / mss


def scenario_path(name: str, changing: bool = False) -> tuple[WanSpec, float | None]:
    """The emulated path of a simulator scenario (shipped, or a file) as it starts, and its
    per-stream cap in Mbit/s. A scenario whose path changes is refused unless `changing`."""
    data = tomllib.loads(scenario_file(name).read_text())
    flows = [data.get("background_flows", 0)]
    flows += [c.get("background_flows", 0) for c in data.get("changes", [])]
    if any(flows):
        raise ValueError(f"{name} has background flows; calibrate on paths without them")
    if data.get("changes") and not changing:
        raise ValueError(f"{name} changes during the run; calibrate it with --schedule")
    mss = float(data.get("mss", 1448))
    spec = WanSpec(
        rate_mbit=line_rate(float(data["capacity_mbps"]), mss),
        rtt_ms=float(data["base_rtt_ms"]),
        buffer=f"{data['buffer_kib']}KiB",
        loss=float(data.get("random_loss", 0.0)),
        delay="auto",
    )
    return spec, data.get("stream_cap_mbps")


def steady_mean(records: Sequence[dict], settle: float) -> float:
    """Mean throughput in Mbit/s of the records that end after `settle` seconds."""
    kept = [r["throughput"] for r in records if r["time"] > settle]
    return sum(kept) / len(kept) / 1e6 if kept else 0.0


def simulated_intervals(
    xfer: Path, name: str, optimizer: str, seconds: float, seed: int = 1
) -> list[dict]:
    """The intervals of `xfer sim` under `optimizer` on scenario `name`."""
    argv = [str(xfer), "sim", "--scenario", str(scenario_file(name)), "--optimizer", optimizer]
    argv += ["--duration", f"{seconds:g}s", "--seed", str(seed), "--json"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return [r for r in map(json.loads, out.splitlines()) if r["type"] == "mi"]


def simulate(
    xfer: Path, name: str, streams: int, seconds: float, settle: float
) -> tuple[float, float]:
    """`xfer sim` with a fixed count: steady mean throughput in Mbit/s and loss rate."""
    kept = simulated_intervals(xfer, name, f"fixed:{streams}", seconds)
    steady = [r["loss"] for r in kept if r["time"] > settle]
    return steady_mean(kept, settle), sum(steady) / len(steady) if steady else 0.0


#: Fewest losses each stream should see while measured: CUBIC's mean over fewer loss cycles
#: varies too much from run to run (at 20 ms and 1e-5 loss, 8 s runs gave twice the mean).
MIN_LOSS_EVENTS = 10


def seconds_for_losses(mbit: float, loss: float, streams: int) -> float:
    """Seconds of measurement in which each of `streams` streams carrying `mbit` in all at
    loss rate `loss` sees MIN_LOSS_EVENTS losses (0 without loss)."""
    segments_per_s = mbit * 1e6 / streams / (1448 * 8)
    return MIN_LOSS_EVENTS / (loss * segments_per_s) if loss > 0 and mbit > 0 else 0.0


@dataclass(frozen=True)
class PathAt:
    """The emulated path's values from `time` seconds after a transfer's start."""

    time: float
    rate_mbit: float
    rtt_ms: float
    loss: float


def path_timetable(xfer: Path, name: str, seconds: float) -> list[PathAt]:
    """The path of scenario `name` at its start and at every interval of a run of `seconds` in
    which it differs from the interval before, as `xfer sim` follows it (a ramp moves each
    interval)."""
    mss = float(tomllib.loads(scenario_file(name).read_text()).get("mss", 1448))
    timetable: list[PathAt] = []
    start = 0.0
    for r in simulated_intervals(xfer, name, "fixed:1", seconds):
        at = PathAt(start, line_rate(r["capacity_mbps"], mss), r["base_rtt_ms"], r["random_loss"])
        if not timetable or dataclasses.replace(timetable[-1], time=start) != at:
            timetable.append(at)
        start = r["time"]
    return timetable


def with_timetable(spec: WanSpec, timetable: Sequence[PathAt]) -> WanSpec:
    """`spec` with the RTT schedule of `timetable`, on the delay line if the RTT changes."""
    rtts = [(p.time, p.rtt_ms) for p in timetable]
    if len({rtt for _, rtt in rtts}) == 1:
        return spec
    changes = [step for i, step in enumerate(rtts) if i == 0 or step[1] != rtts[i - 1][1]]
    return dataclasses.replace(spec, delay="delay-line", rtt_schedule=tuple(changes))


def play(wan: Wan, timetable: Sequence[PathAt], stop: threading.Event) -> None:
    """Changes the bottleneck's rate and loss as `timetable` says, counting from now, until the
    timetable ends or `stop` is set; the RTT follows the delay line's schedule."""
    start = time.monotonic()
    for before, step in zip(timetable, timetable[1:], strict=False):
        if stop.wait(max(0.0, start + step.time - time.monotonic())):
            return
        if step.rate_mbit != before.rate_mbit:
            wan.set_rate(step.rate_mbit)
        if step.loss != before.loss:
            wan.set_loss(step.loss)


def emulated_runs(
    xfer: Path, spec: WanSpec, cap: float | None, optimizers: Sequence[str], seconds: float,
    timetable: Sequence[PathAt] = (),
) -> list[list[dict]]:  # fmt: skip
    """The MI log of a memory-to-memory transfer of `seconds` under each of `optimizers` in
    turn, through one emulated path and receiver; with a `timetable`, the path changes as it
    says from each transfer's start, and is set back before the next."""
    logs = []
    with tempfile.TemporaryDirectory() as tmp, emulated_wan(spec, xfer) as wan:
        topo = wan.topology()
        with dataplane.xfer_receiver(xfer, topo, Path(tmp)) as rx:
            key = dataplane.write_key_file(rx, Path(tmp) / "xfer.key")
            for i, optimizer in enumerate(optimizers):
                log = Path(tmp) / f"mi-{i}.jsonl"
                size = dataplane.unending_size(spec.rate_mbit, seconds)
                argv = dataplane.optimized_send_command(
                    xfer, rx, ["--mem", str(size)], optimizer, log, key, stream_rate_cap_mbit=cap
                )
                err = Path(tmp) / f"send-{i}.stderr"
                stop = threading.Event()
                player = threading.Thread(target=play, args=(wan, timetable, stop), daemon=True)
                with err.open("w") as stderr:
                    proc = supervise.start(
                        topo.sender_cmd(supervise.supervised(argv)), None, stderr
                    )
                    if timetable:
                        wan.restart_rtt_schedule()
                        player.start()
                    try:
                        proc.wait(timeout=seconds)
                    except subprocess.TimeoutExpired:
                        pass
                    finally:
                        # Also when the sweep is interrupted: no sender outlives it.
                        supervise.stop(proc)
                        if timetable:
                            stop.set()
                            player.join()
                            wan.set_rate(timetable[0].rate_mbit)
                            wan.set_loss(timetable[0].loss)
                try:
                    logs.append(dataplane.read_mi_log(log))
                except OSError as e:
                    said = err.read_text().split(supervise.CPU_MARKER)[0].strip()
                    raise RuntimeError(f"xfer send --optimizer {optimizer}: {e}; {said}") from e
                mean = _mean([r["throughput"] / 1e6 for r in logs[-1]])
                print(f"  {optimizer}: {mean:.0f} Mbit/s", file=sys.stderr, flush=True)
    return logs


def emulate(
    xfer: Path, spec: WanSpec, cap: float | None, counts: Sequence[int], seconds: float,
    settle: float, repetitions: int,
) -> list[float]:  # fmt: skip
    """xfer with each fixed count through the emulated path: the median over `repetitions` of
    the steady mean throughput (counts interleaved, so drift hits every count alike)."""
    order = [n for _ in range(repetitions) for n in counts]
    logs = emulated_runs(xfer, spec, cap, [f"fixed:{n}" for n in order], seconds)
    runs: dict[int, list[float]] = {n: [] for n in counts}
    for n, log in zip(order, logs, strict=True):
        runs[n].append(steady_mean(log, settle))
    return [statistics.median(runs[n]) for n in counts]


@dataclass(frozen=True)
class Step:
    """One step of a schedule, measured on both sides: the mean throughput over its first
    `window` intervals (while the change settles) and over all its intervals."""

    start: float
    streams: int
    emulated_first: float
    simulated_first: float
    emulated_all: float
    simulated_all: float

    @property
    def gaps(self) -> tuple[float, float]:
        """Simulated over emulated, minus one: over the first intervals and over all."""
        return (Point(self.streams, self.emulated_first, self.simulated_first).gap,
                Point(self.streams, self.emulated_all, self.simulated_all).gap)  # fmt: skip


def per_interval(logs: Sequence[Sequence[dict]], seconds: float) -> list[float]:
    """Mbit/s in each whole second of the runs, the median over the runs (an interval counts
    for the second it ends in)."""
    columns: list[list[float]] = [[] for _ in range(int(seconds))]
    for log in logs:
        for r in log:
            second = int(r["time"] - 1e-6)
            if 0 <= second < len(columns):
                columns[second].append(r["throughput"] / 1e6)
    return [statistics.median(c) if c else 0.0 for c in columns]


def schedule_steps(schedule: str, seconds: float) -> list[tuple[float, int, float]]:
    """`(start, count, end)` of each step of a `TIME:COUNT,...` schedule within `seconds`."""
    steps = []
    for part in schedule.split(","):
        when, count = part.split(":")
        steps.append((float(when.strip().removesuffix("s")), int(count)))
    ends = [t for t, _ in steps[1:]] + [seconds]
    return [
        (t, n, min(end, seconds)) for (t, n), end in zip(steps, ends, strict=True) if t < seconds
    ]


def compare_steps(
    emulated: Sequence[float], simulated: Sequence[float], schedule: str, window: int,
    path_changes: Sequence[float] = (),
) -> list[Step]:  # fmt: skip
    """Each step of `schedule`, split where the path changes (seconds since the start), with
    its means on both sides (per-second throughputs)."""
    out = []
    for start, n, end in schedule_steps(schedule, len(emulated)):
        cuts = [start, *sorted(t for t in path_changes if start < t < end), end]
        for begin, stop in zip(cuts, cuts[1:], strict=False):
            first, last = int(begin), int(stop)
            head = slice(first, min(first + window, last))
            out.append(Step(begin, n, _mean(emulated[head]), _mean(simulated[head]),
                            _mean(emulated[first:last]), _mean(simulated[first:last])))  # fmt: skip
    return out


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def transient(args: argparse.Namespace, name: str) -> list[Step]:
    """Runs `args.schedule` on scenario `name` on both sides, prints the per-second table and
    returns each step's comparison."""
    spec, cap = scenario_path(name, changing=True)
    timetable = path_timetable(args.xfer, name, args.seconds)
    spec = with_timetable(spec, timetable)
    optimizer = f"schedule:{args.schedule}"
    runs = [optimizer] * args.repetitions
    logs = emulated_runs(args.xfer, spec, cap, runs, args.seconds, timetable)
    emulated = per_interval(logs, args.seconds)
    simulated = per_interval(
        [simulated_intervals(args.xfer, name, optimizer, args.seconds, seed)
         for seed in range(1, args.repetitions + 1)],
        args.seconds,
    )  # fmt: skip
    print(f"\n{name}, {optimizer} (Mbit/s each second, median of {args.repetitions} runs)\n")
    print("| second | emulated | simulated |")
    print("|---:|---:|---:|")
    for second, (e, s) in enumerate(zip(emulated, simulated, strict=True)):
        print(f"| {second + 1} | {e:.0f} | {s:.0f} |")
    changes = [p.time for p in timetable[1:]]
    return compare_steps(emulated, simulated, args.schedule, args.window, changes)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the sweep for each scenario and prints the table; exit 1 when a gap exceeds 15 %."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", default="paper-fig2,cloudlab-1g",
                   help="shipped scenarios, or scenario files (.toml)")  # fmt: skip
    p.add_argument("--streams", default="1,2,4,8,16,32", help="stream counts")
    p.add_argument("--schedule", help="counts on a timetable instead, e.g. 0s:1,15s:6,40s:1")
    p.add_argument(
        "--window", type=int, default=5, help="with --schedule: seconds after each change"
    )
    p.add_argument("--seconds", type=float, default=12.0, help="length of each run")
    p.add_argument("--settle", type=float, default=4.0, help="seconds left out at the start")
    p.add_argument("--repetitions", type=int, default=3, help="emulated runs per count (median)")
    p.add_argument("--xfer", type=Path, default=DEFAULT_XFER, help="the xfer binary")
    args = p.parse_args(argv)
    if not args.xfer.exists():
        p.error(f"{args.xfer} does not exist: build it with cargo build --release")
    tear_down_on_signals()
    if args.schedule:
        try:
            schedule_steps(args.schedule, args.seconds)
        except ValueError as e:
            p.error(f"--schedule {args.schedule}: {e}")
        return transient_main(args, argv)
    counts = [int(n) for n in args.streams.split(",")]
    rows: list[tuple[str, Point]] = []
    short: list[str] = []
    busy = 0.0
    for name in args.scenarios.split(","):
        try:
            spec, cap = scenario_path(name)
        except (OSError, ValueError, KeyError) as e:
            p.error(f"scenario {name}: {e}")
        print(f"{name}: {spec}", file=sys.stderr)
        busy = max(busy, cpu_busy(0.5))
        emulated = emulate(
            args.xfer, spec, cap, counts, args.seconds, args.settle, args.repetitions
        )
        for n, e in zip(counts, emulated, strict=True):
            s, loss = simulate(args.xfer, name, n, args.seconds, args.settle)
            rows.append((name, Point(n, e, s)))
            needed = seconds_for_losses(s, loss, n)
            if needed > args.seconds - args.settle:
                short.append(f"{name} at {n} streams needs {args.settle + needed:.0f} s")
    print(f"\nreproduce: {reproduce(argv)}\n")
    if busy > 0.10:
        print(f"**Warning:** the host was busy before a sweep ({busy:.0%} of the CPUs): the "
              "emulated figures may be low.\n")  # fmt: skip
    print("| scenario | streams | emulated Mbit/s | simulated Mbit/s | gap |")
    print("|---|---:|---:|---:|---:|")
    for name, pt in rows:
        print(f"| {name} | {pt.streams} | {pt.emulated_mbit:.0f} | {pt.simulated_mbit:.0f} | "
              f"{pt.gap:+.0%} |")  # fmt: skip
    if short:
        print(
            f"\n**Too short:** fewer than {MIN_LOSS_EVENTS} random losses per stream while "
            f"measured, so the emulated mean is unstable: {'; '.join(short)} (--seconds)."
        )
    worst = max(rows, key=lambda r: abs(r[1].gap))
    print(f"\nlargest gap: {worst[1].gap:+.0%} ({worst[0]}, {worst[1].streams} streams); "
          f"tolerance {TOLERANCE:.0%}")  # fmt: skip
    return 0 if abs(worst[1].gap) <= TOLERANCE else 1


def reproduce(argv: Sequence[str] | None) -> str:
    """The command line of this run."""
    return "xfer-bench-calibrate " + shlex.join(sys.argv[1:] if argv is None else list(argv))


def transient_main(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """`--schedule`: each scenario's table, then every step's means and gaps; exit 1 when a
    gap exceeds the tolerance."""
    rows: list[tuple[str, Step]] = []
    for name in args.scenarios.split(","):
        print(f"{name}: {scenario_path(name, changing=True)[0]}", file=sys.stderr)
        rows += [(name, step) for step in transient(args, name)]
    print(f"\nreproduce: {reproduce(argv)}\n")
    print(f"| scenario | from | streams | emulated, first {args.window} s | simulated | gap | "
          "emulated, whole step | simulated | gap |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, st in rows:
        first, whole = st.gaps
        print(f"| {name} | {st.start:g} s | {st.streams} | {st.emulated_first:.0f} | "
              f"{st.simulated_first:.0f} | {first:+.0%} | {st.emulated_all:.0f} | "
              f"{st.simulated_all:.0f} | {whole:+.0%} |")  # fmt: skip
    worst = max((abs(g) for _, st in rows for g in st.gaps), default=0.0)
    print(f"\nlargest gap: {worst:.0%}; tolerance {TOLERANCE:.0%}")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
