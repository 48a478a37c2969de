"""Experiments as files: a path, transfers that start and stop at given times, and variants
(optimisers or tools) to run each of them with, repeated.

    name = "paper-fig4"
    duration_s = 300
    repetitions = 3
    [path]                      # xfer_bench.wan.WanSpec fields (senders: one per transfer)
    rate_mbit = 1000
    rtt_ms = 20
    rate_schedule = [[0, 1000], [100, 500]]   # optional: capacity changing over time
    loss_schedule = [[50, 1e-4], [100, 0]]    # optional: random loss changing over time
    [[transfers]]               # each from its own sender namespace
    start_s = 0
    stop_s = 200                # default: duration_s
    streams = 2                 # to start from (xfer with an optimiser) or fixed (the others)
    stream_rate_cap_mbit = 50   # optional: xfer's --stream-rate-cap, iperf3's --fq-rate,
                                # bench/preload/pace_streams.c for globus-url-copy
    workload = "mem"            # memory to memory until stopped (default), or data generated
                                # on the sender before the run: "file:4GiB" (xfer, iperf3 -F,
                                # globus-url-copy) or "tree:1000x4MiB" (xfer); a finite
                                # workload ends when it has arrived or at stop_s
    [[variants]]
    name = "gd"
    optimizer = "gd"            # xfer's --optimizer, for every transfer ...
    [[variants]]
    name = "one-of-each"
    optimizer = ["gd", "bo", "fixed:20"]      # ... or one per transfer
    start_s = 0                 # variants may also move the transfers' start and stop times
    [[variants]]
    name = "iperf3"
    tool = "iperf3"             # xfer (default), iperf3 or gridftp (globus-url-copy -p N against
                                # Debian's GridFTP server); also a scalar or a list
    seed = 7                    # top level, optional: xfer's --seed is seed + repetition
                                # (the controller's random choices); default 0
    oracle = [1, 5, 10, 20, 40] # top level, optional: fixed counts run as variants of their
                                # own (`fixed:N`: the first variant with its xfer transfers
                                # at N streams) to score each phase of the path
                                # (between changes of its rate, loss or RTT and the arrivals
                                # and departures of other transfers) against the best of them
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xfer_bench.dataplane import parse_size
from xfer_bench.wan import WanSpec

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
TOOLS = ("xfer", "iperf3", "gridftp")


@dataclass(frozen=True)
class Workload:
    """What a transfer moves: generated data until stopped (`mem`), one file of `size` bytes,
    or a tree of `count` files of `size` bytes each."""

    kind: str = "mem"
    count: int = 0
    size: int = 0
    #: As the experiment file wrote it.
    text: str = field(default="mem", compare=False)

    @staticmethod
    def parse(text: str) -> Workload:
        """`mem`, `file:SIZE` or `tree:COUNTxSIZE` (files of at least one byte); a mistake is a
        ValueError."""
        kind, _, rest = text.partition(":")
        try:
            if kind == "mem" and not rest:
                return Workload()
            if kind == "file":
                return Workload("file", 1, parse_size(rest), text)
            if kind == "tree":
                count, _, size = rest.partition("x")
                if int(count) > 0 and parse_size(size) > 0:
                    return Workload("tree", int(count), parse_size(size), text)
        except ValueError:
            pass
        raise ValueError(f"workload {text!r} is not mem, file:SIZE or tree:COUNTxSIZE")


#: The workloads each tool can move.
TOOL_WORKLOADS = {"xfer": {"mem", "file", "tree"}, "iperf3": {"mem", "file"},
                  "gridftp": {"mem", "file"}}  # fmt: skip


@dataclass(frozen=True)
class Transfer:
    """One transfer of one run: who sends, with what, when."""

    index: int
    tool: str
    start_s: float
    stop_s: float
    streams: int
    optimizer: str | None = None
    stream_rate_cap_mbit: float | None = None
    workload: Workload = field(default_factory=Workload)

    @property
    def label(self) -> str:
        """How plots and tables name it: `T1 gd`, `T2 iperf3 -P 8`, `T3 gridftp -p 8`, with a
        finite workload after it (`T1 bo file:4GiB`)."""
        what = {
            "xfer": self.optimizer,
            "iperf3": f"iperf3 -P {self.streams}",
            "gridftp": f"gridftp -p {self.streams}",
        }[self.tool]
        return f"T{self.index + 1} {what}" + (
            f" {self.workload.text}" if self.workload.count else ""
        )


@dataclass(frozen=True)
class Variant:
    """A way to run the experiment's transfers, and what each transfer becomes under it."""

    name: str
    transfers: tuple[Transfer, ...]


@dataclass(frozen=True)
class Experiment:
    """A loaded experiment file."""

    name: str
    description: str
    duration_s: float
    repetitions: int
    mi: str
    seed: int
    path: WanSpec
    rate_schedule: tuple[tuple[float, float], ...]
    variants: tuple[Variant, ...]
    source: Path | None = field(default=None, compare=False)
    #: Random loss changing at given seconds: ((50, 1e-4), (100, 0)).
    loss_schedule: tuple[tuple[float, float], ...] = ()
    #: Fixed counts whose variants (`fixed:N`) are the per-phase oracle.
    oracle: tuple[int, ...] = ()

    def phase_changes(self) -> list[float]:
        """When the path changes for the first transfer: its rate, loss or RTT, or another
        transfer (of the first variant) starting or stopping."""
        others = {when for t in self.variants[0].transfers[1:] for when in (t.start_s, t.stop_s)}
        steps = [*self.rate_schedule, *self.loss_schedule, *self.path.rtt_schedule]
        return sorted({when for when, _ in steps} | others)

    def oracle_variants(self) -> tuple[Variant, ...]:
        """The fixed-count variants of the oracle."""
        names = {f"fixed:{n}" for n in self.oracle}
        return tuple(v for v in self.variants if v.name in names)


def _pick(value: Any, index: int, count: int, what: str) -> Any:
    """A variant's value for transfer `index`: the scalar itself, or the list's entry."""
    if isinstance(value, list):
        if len(value) != count:
            raise ValueError(f"{what} lists {len(value)} values for {count} transfers")
        return value[index]
    return value


def _check_keys(table: dict, allowed: set[str], where: str) -> None:
    if unknown := sorted(set(table) - allowed):
        raise ValueError(f"{where}: unknown keys {unknown}; allowed: {sorted(allowed)}")


def parse(text: str, source: Path | None = None) -> Experiment:
    """Reads an experiment from TOML text; every mistake is a ValueError naming it."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"not valid TOML: {e}") from e
    _check_keys(
        data,
        {
            "name",
            "description",
            "duration_s",
            "repetitions",
            "mi",
            "seed",
            "path",
            "transfers",
            "variants",
            "oracle",
        },
        "experiment",
    )
    for key in ("name", "duration_s", "path", "transfers", "variants"):
        if key not in data:
            raise ValueError(f"experiment: missing {key!r}")
    duration = float(data["duration_s"])
    if duration <= 0:
        raise ValueError("duration_s must be positive")
    path = dict(data["path"])
    schedule = tuple((float(t), float(r)) for t, r in path.pop("rate_schedule", []))
    losses = tuple((float(t), float(loss)) for t, loss in path.pop("loss_schedule", []))
    if any(not 0 <= loss < 1 for _, loss in losses):
        raise ValueError("path.loss_schedule: each loss must be a rate from 0 to below 1")
    path["rtt_schedule"] = tuple(tuple(step) for step in path.get("rtt_schedule", ()))
    path.setdefault("senders", len(data["transfers"]))
    try:
        spec = WanSpec(**path)
    except TypeError as e:
        raise ValueError(f"path: {e}") from e
    if spec.senders != len(data["transfers"]):
        raise ValueError("path.senders must equal the number of transfers (one sender each)")
    base = data["transfers"]
    count = len(base)
    variants = []
    for v in data["variants"]:
        _check_keys(
            v, {"name", "tool", "optimizer", "streams", "start_s", "stop_s", "workload"}, "variant"
        )
        if "name" not in v:
            raise ValueError("every variant needs a name")
        transfers = []
        for i, t in enumerate(base):
            _check_keys(
                t,
                {"start_s", "stop_s", "streams", "stream_rate_cap_mbit", "workload"},
                f"transfer {i + 1}",
            )
            tool = _pick(v.get("tool", "xfer"), i, count, "tool")
            if tool not in TOOLS:
                raise ValueError(f"variant {v['name']}: tool {tool!r} is not one of {TOOLS}")
            start = float(_pick(v.get("start_s", t.get("start_s", 0)), i, count, "start_s"))
            stop = float(_pick(v.get("stop_s", t.get("stop_s", duration)), i, count, "stop_s"))
            if not 0 <= start < stop <= duration:
                raise ValueError(f"transfer {i + 1}: need 0 <= start_s < stop_s <= duration_s")
            workload = Workload.parse(
                str(_pick(v.get("workload", t.get("workload", "mem")), i, count, "workload"))
            )
            if workload.kind not in TOOL_WORKLOADS[tool]:
                raise ValueError(
                    f"variant {v['name']}: {tool} cannot move a {workload.kind} workload"
                )
            optimizer = _pick(v.get("optimizer"), i, count, "optimizer")
            if tool == "xfer" and optimizer is None:
                raise ValueError(f"variant {v['name']}: xfer transfers need an optimizer")
            transfers.append(
                Transfer(
                    index=i,
                    tool=tool,
                    start_s=start,
                    stop_s=stop,
                    streams=int(_pick(v.get("streams", t.get("streams", 4)), i, count, "streams")),
                    optimizer=optimizer if tool == "xfer" else None,
                    stream_rate_cap_mbit=t.get("stream_rate_cap_mbit"),
                    workload=workload,
                )
            )
        variants.append(Variant(str(v["name"]), tuple(transfers)))
    if not variants:
        raise ValueError("at least one variant")
    oracle = tuple(int(n) for n in data.get("oracle", []))
    if any(n < 1 for n in oracle):
        raise ValueError("oracle: stream counts must be at least 1")
    exp = Experiment(
        name=str(data["name"]),
        description=str(data.get("description", "")),
        duration_s=duration,
        repetitions=int(data.get("repetitions", 1)),
        mi=str(data.get("mi", "1s")),
        seed=int(data.get("seed", 0)),
        path=spec,
        rate_schedule=schedule,
        variants=tuple(variants),
        source=source,
        loss_schedule=losses,
        oracle=oracle,
    )
    # The oracle runs the first variant's transfers (other traffic included) with the xfer
    # ones at a fixed count.
    fixed = tuple(
        Variant(
            f"fixed:{n}",
            tuple(
                dataclasses.replace(t, optimizer=f"fixed:{n}") if t.tool == "xfer" else t
                for t in variants[0].transfers
            ),
        )
        for n in oracle
    )
    if clash := {v.name for v in fixed} & {v.name for v in variants}:
        raise ValueError(f"oracle: variants named {sorted(clash)} already exist")
    return dataclasses.replace(exp, variants=(*exp.variants, *fixed))


def with_variant(exp: Experiment, name: str, optimizer: str) -> Experiment:
    """`exp` with one more variant, `name`: the transfers of its first variant that runs xfer
    alone, every one under `optimizer` (say, a policy of one's own: `ppo:/tmp/mine`)."""
    if any(v.name == name for v in exp.variants):
        raise ValueError(f"{exp.name} already has a variant named {name!r}")
    base = next((v for v in exp.variants if all(t.tool == "xfer" for t in v.transfers)), None)
    if base is None:
        raise ValueError(f"{exp.name} has no variant that runs xfer alone to base {name!r} on")
    transfers = tuple(dataclasses.replace(t, optimizer=optimizer) for t in base.transfers)
    return dataclasses.replace(exp, variants=(*exp.variants, Variant(name, transfers)))


def load(name_or_path: str) -> Experiment:
    """An experiment by file path, or by the name of one shipped in bench/experiments/."""
    path = Path(name_or_path)
    if not path.exists():
        path = EXPERIMENTS / f"{name_or_path}.toml"
    if not path.exists():
        shipped = sorted(p.stem for p in EXPERIMENTS.glob("*.toml"))
        raise ValueError(f"{name_or_path!r} is neither a file nor a shipped experiment {shipped}")
    try:
        return parse(path.read_text(), path)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
