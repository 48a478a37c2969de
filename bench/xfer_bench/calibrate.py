"""`xfer-bench-calibrate`: the simulator against the emulated WAN. For each scenario, the same
path is built on the emulator (rate, RTT, buffer, random loss, per-stream cap), xfer runs with a
fixed stream count for each count of a sweep, and `xfer sim` runs the same counts on the
scenario; the table shows both throughput curves and the gap.

    xfer-bench-calibrate --scenarios paper-fig2,cloudlab-1g --streams 1,2,4,8,16,32

Throughput is the mean over the intervals after the first `--settle` seconds (slow start and
connection set-up excluded), for the emulator and the simulator alike; on the emulator, the
median over `--repetitions` runs, because loss-limited TCP varies a lot from run to run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xfer_bench import dataplane, supervise
from xfer_bench.netns import tear_down_on_signals
from xfer_bench.wan import DEFAULT_XFER, WanSpec, emulated_wan
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


def scenario_path(name: str) -> tuple[WanSpec, float | None]:
    """The emulated path of a shipped simulator scenario, and its per-stream cap in Mbit/s."""
    data = tomllib.loads((SCENARIOS / f"{name}.toml").read_text())
    if any(step.get("flows", 0) for step in data.get("background", [])):
        raise ValueError(f"{name} has background flows; calibrate on paths without them")
    mss = float(data.get("mss", 1448))
    spec = WanSpec(
        # The scenario's capacity is goodput; the bottleneck's rate counts headers too.
        rate_mbit=float(data["capacity_mbps"]) * (mss + HEADERS) / mss,
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


def simulate(
    xfer: Path, name: str, streams: int, seconds: float, settle: float
) -> tuple[float, float]:
    """`xfer sim` with a fixed count: steady mean throughput in Mbit/s and loss rate."""
    argv = [str(xfer), "sim", "--scenario", name, "--optimizer", f"fixed:{streams}"]
    argv += ["--duration", f"{seconds:g}s", "--json"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    records = [json.loads(line) for line in out.splitlines()]
    kept = [r for r in records if r["type"] == "mi"]
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


def emulate(
    xfer: Path, spec: WanSpec, cap: float | None, counts: Sequence[int], seconds: float,
    settle: float, repetitions: int,
) -> list[float]:  # fmt: skip
    """xfer with each fixed count through the emulated path: the median over `repetitions` of
    the steady mean throughput (counts interleaved, so drift hits every count alike)."""
    runs: dict[int, list[float]] = {n: [] for n in counts}
    with tempfile.TemporaryDirectory() as tmp, emulated_wan(spec, xfer) as wan:
        topo = wan.topology()
        with dataplane.xfer_receiver(xfer, topo, Path(tmp)) as rx:
            key = dataplane.write_key_file(rx, Path(tmp) / "xfer.key")
            for n in [n for _ in range(repetitions) for n in counts]:
                log = Path(tmp) / f"mi-{n}.jsonl"
                size = dataplane.unending_size(spec.rate_mbit, seconds)
                argv = dataplane.optimized_send_command(
                    xfer, rx, ["--mem", str(size)], f"fixed:{n}", log, key, stream_rate_cap_mbit=cap
                )
                err = Path(tmp) / f"send-{n}.stderr"
                with err.open("w") as stderr:
                    proc = supervise.start(
                        topo.sender_cmd(supervise.supervised(argv)), None, stderr
                    )
                    try:
                        proc.wait(timeout=seconds)
                    except subprocess.TimeoutExpired:
                        pass
                    finally:
                        # Also when the sweep is interrupted: no sender outlives it.
                        supervise.stop(proc)
                try:
                    runs[n].append(steady_mean(dataplane.read_mi_log(log), settle))
                except OSError as e:
                    said = err.read_text().split(supervise.CPU_MARKER)[0].strip()
                    raise RuntimeError(f"xfer send with {n} streams: {e}; {said}") from e
                print(f"  {n} streams: {runs[n][-1]:.0f} Mbit/s", file=sys.stderr, flush=True)
    return [statistics.median(runs[n]) for n in counts]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the sweep for each scenario and prints the table; exit 1 when a gap exceeds 15 %."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", default="paper-fig2,cloudlab-1g", help="shipped scenarios")
    p.add_argument("--streams", default="1,2,4,8,16,32", help="stream counts")
    p.add_argument("--seconds", type=float, default=12.0, help="length of each run")
    p.add_argument("--settle", type=float, default=4.0, help="seconds left out at the start")
    p.add_argument("--repetitions", type=int, default=3, help="emulated runs per count (median)")
    p.add_argument("--xfer", type=Path, default=DEFAULT_XFER, help="the xfer binary")
    args = p.parse_args(argv)
    if not args.xfer.exists():
        p.error(f"{args.xfer} does not exist: build it with cargo build --release")
    tear_down_on_signals()
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
    command = "xfer-bench-calibrate " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    print(f"\nreproduce: {command}\n")
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


if __name__ == "__main__":
    sys.exit(main())
