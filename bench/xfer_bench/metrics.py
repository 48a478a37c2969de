"""What a run measured: each transfer's throughput over time, and the figures derived from it
(mean throughput, loss, time to 95 % of the best utility, Jain's fairness index over the windows
in which transfers overlap, link utilisation, and the score of each phase of a path that changes
against the best fixed stream count of that phase)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

#: Utility parameters (U = T/K^n - T*L*B), as xfer's optimisers use by default.
K, B = 1.02, 10.0

#: A sample counts as near a phase's oracle at this fraction of its mean utility, and a run has
#: recovered after a change once SETTLE_SAMPLES samples in a row (the whole phase, if shorter)
#: are near: the simulator's rule (`crates/optimizer/src/sim/score.rs`).
NEAR = 0.95
SETTLE_SAMPLES = 10


@dataclass(frozen=True)
class Sample:
    """One interval of one transfer, ending `t` seconds after the run started."""

    t: float
    mbit: float
    streams: int
    #: Retransmitted over sent segments; None when the tool does not report it (GridFTP).
    loss: float | None


@dataclass
class TransferResult:
    """What one transfer did in a run."""

    label: str
    start_s: float
    samples: list[Sample] = field(default_factory=list)
    #: CPU seconds of the sending process (None when not measured).
    cpu_s: float | None = None
    #: Seconds from its start until a finite workload (a file, a tree) had arrived; None when
    #: it was stopped first or ran memory to memory.
    completed_s: float | None = None
    error: str | None = None

    def mean_mbit(self) -> float:
        """Mean throughput over the transfer's samples."""
        return sum(s.mbit for s in self.samples) / len(self.samples) if self.samples else 0.0

    def mean_loss(self) -> float | None:
        """Mean loss rate over the transfer's samples; None when it was not measured."""
        losses = [s.loss for s in self.samples]
        if not losses or None in losses:
            return None
        return sum(losses) / len(losses)  # type: ignore[arg-type]

    def utilities(self) -> list[float]:
        """Each sample's utility, U = T/K^n - T*L*B with T in Mbit/s (no loss term when the
        tool does not report loss)."""
        return [s.mbit / K**s.streams - s.mbit * (s.loss or 0.0) * B for s in self.samples]

    def mean_utility(self) -> float | None:
        """Mean utility over the transfer's samples; None without samples."""
        u = self.utilities()
        return sum(u) / len(u) if u else None

    def best_sustained(self, window: int = 5) -> float | None:
        """The best mean utility over `window` consecutive samples; None for a shorter run."""
        u = self.utilities()
        if len(u) < window:
            return None
        return max(sum(u[i : i + window]) / window for i in range(len(u) - window + 1))

    def time_to_95(self, window: int = 5, best: float | None = None) -> float | None:
        """Seconds from the transfer's start until its utility first reached 95 % of `best`,
        by default of the best utility it sustained itself (:meth:`best_sustained`): on a real
        path the best count is not known, so the best a run achieved stands in for it."""
        best = self.best_sustained(window) if best is None else best
        if best is None:
            return None
        for s, value in zip(self.samples, self.utilities(), strict=True):
            if best > 0 and value >= 0.95 * best:
                return max(s.t - self.start_s, 0.0)
        return None


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all values are equal, 1/n when one takes everything."""
    if not values or not any(values):
        return 1.0
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


@dataclass(frozen=True)
class Window:
    """A stretch of whole seconds during which the same transfers were active."""

    start: int
    end: int
    labels: tuple[str, ...]
    means: tuple[float, ...]
    #: Each transfer's mean stream count in the window.
    streams: tuple[float, ...]
    #: Each transfer's mean retransmission rate in the window; None when its tool does not
    #: report one.
    losses: tuple[float | None, ...]

    @property
    def fairness(self) -> float:
        """Jain's index over the transfers' mean throughputs in the window (per application)."""
        return jain(self.means)

    @property
    def flow_fairness(self) -> float:
        """Jain's index over the flows (TCP connections) in the window: each transfer counts as
        its mean stream count of flows that share its throughput equally (a transfer's own
        streams are not measured apart)."""
        flows = list(zip(self.streams, self.means, strict=True))
        total = sum(m for _, m in flows)
        square = sum(m * m / n for n, m in flows if n > 0)
        if total <= 0 or square <= 0:
            return 1.0
        return total * total / (sum(n for n, _ in flows) * square)

    def utilisation(self, rate_mbit: float) -> float:
        """The transfers' summed mean throughput over the link rate."""
        return sum(self.means) / rate_mbit


def _per_second(results: Sequence[TransferResult]) -> dict[int, dict[str, list[Sample]]]:
    bins: dict[int, dict[str, list[Sample]]] = {}
    for r in results:
        for s in r.samples:
            bins.setdefault(math.floor(s.t - 1e-9), {}).setdefault(r.label, []).append(s)
    return bins


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def windows(results: Sequence[TransferResult]) -> list[Window]:
    """The maximal runs of consecutive seconds with the same set of active transfers."""
    bins = _per_second(results)
    out: list[Window] = []
    current: list[int] = []

    def mean_of(label: str, value: Callable[[Sample], float]) -> float:
        """The mean over the window's seconds of each second's mean `value` of `label`."""
        return _mean([_mean([value(s) for s in bins[sec][label]]) for sec in current])

    def loss_of(label: str) -> float | None:
        """`label`'s mean retransmission rate; None when its tool does not report one."""
        samples = [s for sec in current for s in bins[sec][label]]
        if any(s.loss is None for s in samples):
            return None
        return mean_of(label, lambda s: s.loss or 0.0)

    def close() -> None:
        if not current:
            return
        labels = tuple(sorted(bins[current[0]]))
        out.append(
            Window(
                current[0],
                current[-1] + 1,
                labels,
                tuple(mean_of(label, lambda s: s.mbit) for label in labels),
                tuple(mean_of(label, lambda s: s.streams) for label in labels),
                tuple(loss_of(label) for label in labels),
            )
        )
        current.clear()

    for second in sorted(bins):
        same = current and second == current[-1] + 1 and set(bins[second]) == set(bins[current[0]])
        if not same:
            close()
        current.append(second)
    close()
    return out


def per_second_totals(results: Sequence[TransferResult]) -> dict[int, float]:
    """For each whole second in which anything was sent, the transfers' summed throughput
    (each transfer's samples within the second averaged first)."""
    return {
        sec: sum(_mean([s.mbit for s in v]) for v in per.values())
        for sec, per in sorted(_per_second(results).items())
    }


def link_utilisation(results: Sequence[TransferResult], rate_mbit: float) -> float:
    """Mean over the seconds in which anything was sent of the summed throughput over the rate."""
    totals = per_second_totals(results)
    return sum(totals.values()) / len(totals) / rate_mbit if totals else 0.0


def phases(duration_s: float, changes: Sequence[float]) -> list[tuple[float, float]]:
    """The stretches between the changes of a path (times in seconds from the run's start;
    those outside the run are ignored), as (start, end) pairs covering the whole run."""
    times = sorted({t for t in changes if 0 < t < duration_s})
    edges = [0.0, *times, duration_s]
    return list(zip(edges, edges[1:], strict=False))


@dataclass(frozen=True)
class PhaseScore:
    """One phase of a run against the best fixed stream count of the same phase."""

    start_s: float
    end_s: float
    #: The label of the fixed-count run with the best mean utility in the phase.
    oracle: str
    #: Its mean utility there.
    oracle_utility: float
    #: The run's mean utility in the phase over the oracle's; None without samples in it.
    utility_fraction: float | None
    #: Seconds from the phase's start to the first sample of the first SETTLE_SAMPLES in a row
    #: near the oracle (the whole phase's, if it is shorter); None: never.
    recovery_s: float | None


def _in_phase(result: TransferResult, start: float, end: float) -> list[tuple[Sample, float]]:
    """The samples ending within (start, end], with their utilities."""
    return [
        (s, u)
        for s, u in zip(result.samples, result.utilities(), strict=True)
        if start < s.t <= end
    ]


def phase_scores(
    result: TransferResult,
    oracles: Sequence[TransferResult],
    bounds: Sequence[tuple[float, float]],
) -> list[PhaseScore]:
    """`result` scored in each phase of `bounds` against the best of the fixed-count runs
    `oracles` of the same schedule (those without samples in a phase do not count there).
    Utility is as measured, ramp-up included; a phase no oracle measured is left out."""
    scores = []
    for start, end in bounds:
        means = [
            (sum(u for _, u in got) / len(got), o.label)
            for o in oracles
            if not o.error and (got := _in_phase(o, start, end))
        ]
        if not means:
            continue
        best, label = max(means)
        got = _in_phase(result, start, end)
        fraction = recovery = None
        if got and best > 0:
            fraction = sum(u for _, u in got) / len(got) / best
            near = [u >= NEAR * best for _, u in got]
            window = min(SETTLE_SAMPLES, len(near))
            first = next(
                (i for i in range(len(near) - window + 1) if all(near[i : i + window])), None
            )
            if first is not None:
                recovery = (got[first - 1][0].t if first > 0 else start) - start
        scores.append(PhaseScore(start, end, label, best, fraction, recovery))
    return scores
