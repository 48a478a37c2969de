"""The report of an experiment: a markdown file with the tables of every run, the per-phase
scores against the best fixed count (when the experiment names an oracle), the fairness
windows, and PNG plots (throughput and stream count over time per run, like paper 001's
Fig. 2/4/5; box plots over repetitions, like its Fig. 3)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from xfer_bench.experiment import Experiment  # noqa: E402
from xfer_bench.hosts import Hosts  # noqa: E402
from xfer_bench.metrics import (  # noqa: E402
    NEAR,
    SETTLE_SAMPLES,
    per_second_totals,
    phase_scores,
    phases,
)
from xfer_bench.runner import RunResult, bottleneck_mbit  # noqa: E402


def plot_run(run: RunResult, rate_mbit: float, png: Path) -> None:
    """Throughput (with the link rate and the total) and stream count over time."""
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6), height_ratios=[2, 1])
    for t in run.transfers:
        xs = [s.t for s in t.samples]
        top.plot(xs, [s.mbit for s in t.samples], label=t.label, linewidth=1.2)
        bottom.step(xs, [s.streams for s in t.samples], where="post", label=t.label)
    totals = per_second_totals(run.transfers)
    if len(run.transfers) > 1 and totals:
        # Plotted at the end of each second, where the samples it averages end.
        top.plot([s + 1 for s in totals], list(totals.values()), "k--", linewidth=0.8,
                 label="total")  # fmt: skip
    top.axhline(rate_mbit, color="grey", linewidth=0.6, linestyle=":")
    top.set_ylabel("throughput (Mbit/s)")
    top.set_title(f"{run.variant}, repetition {run.repetition + 1}")
    top.legend(loc="lower right", fontsize="small")
    bottom.set_ylabel("streams")
    bottom.set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def plot_boxes(runs: Sequence[RunResult], rate_mbit: float, png: Path) -> None:
    """Per variant over its repetitions: mean total throughput and mean loss rate."""
    variants = list(dict.fromkeys(r.variant for r in runs))
    throughput = [[r.utilisation * rate_mbit for r in runs if r.variant == v] for v in variants]
    loss = [
        [
            sum(t.mean_loss() or 0.0 for t in r.transfers) / len(r.transfers)
            for r in runs
            if r.variant == v
        ]
        for v in variants
    ]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.boxplot(throughput, tick_labels=variants)
    left.set_ylabel("mean total throughput (Mbit/s)")
    right.boxplot(loss, tick_labels=variants)
    right.set_ylabel("mean loss rate")
    for ax in (left, right):
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _path(exp: Experiment, hosts: Hosts | None) -> tuple[float, str]:
    """The bottleneck rate and a sentence describing the path."""
    rate = bottleneck_mbit(exp, hosts)
    if hosts is None:
        return rate, (
            f"Emulated path: {rate:g} Mbit/s bottleneck, {exp.path.rtt_ms:g} ms RTT, buffer "
            f"{exp.path.buffer_bytes()} bytes, random loss {exp.path.loss:g}; capacity schedule "
            f"{list(exp.rate_schedule) or '-'}, RTT schedule {list(exp.path.rtt_schedule) or '-'}."
        )
    senders = ", ".join(h.name for h in hosts.senders)
    return rate, (
        f"Real hosts: receiver {hosts.receiver.name} ({hosts.receiver_addr}), senders "
        f"{senders}; bottleneck taken as {rate:g} Mbit/s."
    )


def _across_runs(runs: Sequence[RunResult]) -> list[str]:
    """The utility table that compares runs: each transfer against the best utility that the
    same transfer (by position) sustained in any run, when there is more than one run."""
    if len(runs) < 2 or len({len(r.transfers) for r in runs}) > 1:
        return []
    lines = [
        "## Utility across runs",
        "",
        "| variant | rep | transfer | mean U | mean U / best | t95 of best s |",
        "|---|---:|---|---:|---:|---:|",
    ]
    # Per transfer position, per variant: (mean U / best, t95 of best) of each repetition.
    scores: dict[tuple[int, str], list[tuple[float, float | None]]] = {}
    for i in range(len(runs[0].transfers)):
        sustained = [r.transfers[i].best_sustained() for r in runs if not r.transfers[i].error]
        best = max((b for b in sustained if b is not None), default=None)
        if best is None or best <= 0:
            continue
        for r in runs:
            t = r.transfers[i]
            if t.error or (mean := t.mean_utility()) is None:
                continue
            t95 = t.time_to_95(best=best)
            scores.setdefault((i, r.variant), []).append((mean / best, t95))
            lines.append(
                f"| {r.variant} | {r.repetition + 1} | {t.label} | {mean:.0f} | "
                f"{mean / best:.3f} | {_fmt(t95, '.0f')} |"
            )
    lines += [
        "",
        "U = T/K^n - T*L*B (T in Mbit/s, K 1.02, B 10). Best: the best mean utility over 5 "
        "intervals that this transfer sustained in any run; t95 of best: seconds until the "
        "transfer first reached 95 % of it. Where the runs share one path, this compares the "
        "optimisers on one scale.",
        "",
    ]
    if all(len(s) < 2 for s in scores.values()):
        return lines
    lines += [
        "### Over repetitions",
        "",
        "| variant | transfer | runs | mean U / best: mean (min-max) | t95 of best s: mean "
        "| never at 95 % |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for (i, variant), s in scores.items():
        fractions = [f for f, _ in s]
        reached = [t for _, t in s if t is not None]
        mean_t95 = sum(reached) / len(reached) if reached else None
        lines.append(
            f"| {variant} | T{i + 1} | {len(s)} | {sum(fractions) / len(s):.3f} "
            f"({min(fractions):.3f}-{max(fractions):.3f}) | {_fmt(mean_t95, '.1f')} | "
            f"{len(s) - len(reached)} |"
        )
    return lines + [
        "",
        "t95 is averaged over the runs that reached 95 % of the best; the others are counted "
        "in the last column.",
        "",
    ]


def _per_phase(exp: Experiment, runs: Sequence[RunResult]) -> list[str]:
    """The first transfer of each run that is not the oracle's, phase by phase, against the
    best of the oracle's fixed-count runs (every repetition's) in the same phase."""
    names = {v.name for v in exp.oracle_variants()}
    oracles = [r.transfers[0] for r in runs if r.variant in names and r.transfers]
    if not oracles:
        return []
    bounds = phases(exp.duration_s, exp.phase_changes())
    lines = [
        "## Per phase, against the best fixed count",
        "",
        "| variant | rep | phase s | best fixed | U / best | recovery s |",
        "|---|---:|---|---|---:|---:|",
    ]
    for r in runs:
        if r.variant in names or not r.transfers or r.transfers[0].error:
            continue
        for p in phase_scores(r.transfers[0], oracles, bounds):
            lines.append(
                f"| {r.variant} | {r.repetition + 1} | {p.start_s:g}-{p.end_s:g} | "
                f"{p.oracle} | {_fmt(p.utility_fraction, '.3f')} | "
                f"{_fmt(p.recovery_s, '.0f') if p.recovery_s is not None else 'never'} |"
            )
    changes = ", ".join(f"{t:g} s" for t in exp.phase_changes()) or "none"
    return lines + [
        "",
        f"Phases run between the path's changes ({changes}). "
        f"Best fixed: the run of `--optimizer fixed:N` (N in {list(exp.oracle)}, any repetition) "
        "with the highest mean utility in the phase; U / best: the first transfer's mean "
        "utility there over it, ramp-up included; recovery: seconds from the phase's start until "
        f"{SETTLE_SAMPLES} intervals in a row (the whole phase, if shorter) stayed at "
        f"{NEAR:.0%} of it.",
        "",
    ]


def write(
    exp: Experiment, runs: Sequence[RunResult], out: Path, command: str, hosts: Hosts | None = None
) -> Path:
    """Writes report.md, the plots and runs.json under `out`; returns the report's path."""
    rate, path = _path(exp, hosts)
    lines = [
        f"# {exp.name}",
        "",
        exp.description,
        "",
        f"Reproduce: `{command}`",
        "",
        path,
        f"Each run {exp.duration_s:g} s, MI {exp.mi}, xfer's --seed {exp.seed} + repetition - 1.",
        "",
    ]
    if busy := [r for r in runs if r.busy_before > 0.10]:
        lines += [
            f"**Warning:** a host was busy before {len(busy)} run(s) "
            f"(up to {max(r.busy_before for r in busy):.0%} of the CPUs): figures may be low.",
            "",
        ]
    lines += [
        "## Transfers",
        "",
        "| variant | rep | transfer | mean Mbit/s | mean loss | t95 s | done s | CPU s "
        "| link use |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        for t in r.transfers:
            if t.error:
                error = " ".join(t.error.replace("|", "/").split())
                lines.append(f"| {r.variant} | {r.repetition + 1} | {t.label} | error: "
                             f"{error} | | | | | |")  # fmt: skip
                continue
            lines.append(
                f"| {r.variant} | {r.repetition + 1} | {t.label} | {t.mean_mbit():.0f} | "
                f"{_fmt(t.mean_loss(), '.5f')} | {_fmt(t.time_to_95(), '.0f')} | "
                f"{_fmt(t.completed_s, '.1f')} | {_fmt(t.cpu_s, '.1f')} | {r.utilisation:.2f} |"
            )
    lines += [
        "",
        "t95: seconds from a transfer's start until its utility first reached 95 % of the best "
        "it sustained over 5 intervals in that run. Link use: summed throughput over the rate, "
        "averaged over the seconds in which anything was sent. Done: seconds until a file or "
        "tree workload had arrived. GridFTP reports no loss, and its progress only every few "
        "seconds.",
        "",
    ]
    lines += _across_runs(runs)
    lines += _per_phase(exp, runs)
    overlaps = [(r, w) for r in runs for w in r.windows if len(w.labels) > 1]
    if overlaps:
        lines += [
            "## Fairness while transfers overlap",
            "",
            "Jain's index per application takes each transfer's throughput; per flow, each "
            "transfer counts as its mean number of streams sharing its throughput equally. "
            "Retransmitted: each transfer's retransmitted over sent segments.",
            "",
            "| variant | rep | seconds | transfers | mean Mbit/s each | streams each | "
            "retransmitted each | Jain, applications | Jain, flows | link use |",
            "|---|---:|---|---|---|---|---|---:|---:|---:|",
        ]
        for r, w in overlaps:
            lost = ", ".join("-" if x is None else f"{x:.1e}" for x in w.losses)
            lines.append(
                f"| {r.variant} | {r.repetition + 1} | {w.start}-{w.end} | {', '.join(w.labels)} | "
                f"{', '.join(f'{m:.0f}' for m in w.means)} | "
                f"{', '.join(f'{n:.1f}' for n in w.streams)} | {lost} | {w.fairness:.3f} | "
                f"{w.flow_fairness:.3f} | {w.utilisation(rate):.2f} |"
            )
        lines.append("")
    lines += ["## Plots", ""]
    for r in runs:
        png = out / f"{r.variant}-r{r.repetition + 1}.png"
        plot_run(r, rate, png)
        lines.append(f"![{r.variant} repetition {r.repetition + 1}]({png.name})")
    if len(runs) > 1:
        plot_boxes(runs, rate, out / "boxplot.png")
        lines += ["", "![throughput and loss over repetitions](boxplot.png)"]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    raw = [
        {
            "variant": r.variant,
            "repetition": r.repetition + 1,
            "utilisation": r.utilisation,
            "busy_before": r.busy_before,
            "seed": exp.seed + r.repetition,
            "logs": str(r.log_dir),
            "transfers": [
                {
                    "label": t.label,
                    "mean_mbit": t.mean_mbit(),
                    "mean_loss": t.mean_loss(),
                    "time_to_95": t.time_to_95(),
                    "mean_utility": t.mean_utility(),
                    "cpu_s": t.cpu_s,
                    "completed_s": t.completed_s,
                    "error": t.error,
                }
                for t in r.transfers
            ],
            "windows": [
                {
                    "start": w.start,
                    "end": w.end,
                    "labels": w.labels,
                    "means": w.means,
                    "streams": w.streams,
                    "losses": w.losses,
                    "jain": w.fairness,
                    "jain_flows": w.flow_fairness,
                }  # fmt: skip
                for w in r.windows
            ],
        }
        for r in runs
    ]
    (out / "runs.json").write_text(json.dumps(raw, indent=2))
    return report
