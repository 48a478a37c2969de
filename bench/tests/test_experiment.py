import json
import os

import pytest

from xfer_bench import experiment, metrics, report, run_experiment
from xfer_bench.metrics import Sample, TransferResult
from xfer_bench.runner import RunResult

SMOKE = """
name = "smoke"
description = "two short overlapping transfers"
duration_s = 8
mi = "500ms"
[path]
rate_mbit = 200
rtt_ms = 10
[[transfers]]
start_s = 0
stop_s = 7
streams = 2
stream_rate_cap_mbit = 40
[[transfers]]
start_s = 2
stop_s = 8
streams = 2
stream_rate_cap_mbit = 30
[[transfers]]
start_s = 0
stop_s = 8
streams = 2
stream_rate_cap_mbit = 20
[[variants]]
name = "mixed"
optimizer = "gd"
tool = ["xfer", "iperf3", "gridftp"]
"""


def test_every_shipped_experiment_loads():
    names = sorted(p.stem for p in experiment.EXPERIMENTS.glob("*.toml"))
    assert {"paper-fig2", "paper-fig4", "paper-fig6", "lossy-long-haul", "capacity-halves"} <= set(
        names
    )
    for name in names:
        exp = experiment.load(name)
        assert exp.variants and all(len(v.transfers) == exp.path.senders for v in exp.variants)
    fig4 = experiment.load("paper-fig4")
    staggered = fig4.variants[0].transfers
    assert [t.start_s for t in staggered] == [0, 50, 100]
    together = next(v for v in fig4.variants if v.name == "one-of-each").transfers
    assert [(t.start_s, t.optimizer) for t in together] == [(0, "gd"), (0, "bo"), (0, "fixed:8")]


def test_variants_override_transfers():
    exp = experiment.parse(SMOKE)
    t1, t2, t3 = exp.variants[0].transfers
    assert (t1.tool, t1.optimizer, t1.stream_rate_cap_mbit) == ("xfer", "gd", 40)
    assert (t2.tool, t2.optimizer, t2.start_s, t2.stop_s) == ("iperf3", None, 2, 8)
    assert (t1.label, t2.label, t3.label) == ("T1 gd", "T2 iperf3 -P 2", "T3 gridftp -p 2")


def test_a_variant_is_added_with_its_own_optimizer_for_every_xfer_transfer():
    exp = experiment.parse(SMOKE.replace('tool = ["xfer", "iperf3", "gridftp"]', ""))
    mine = experiment.with_variant(exp, "mine", "ppo:/tmp/my-policy").variants[-1]
    assert mine.name == "mine"
    assert [t.optimizer for t in mine.transfers] == ["ppo:/tmp/my-policy"] * 3
    assert [t.start_s for t in mine.transfers] == [t.start_s for t in exp.variants[0].transfers]
    with pytest.raises(ValueError, match="already has a variant named 'mixed'"):
        experiment.with_variant(exp, "mixed", "bo")
    with pytest.raises(ValueError, match="no variant that runs xfer alone"):
        experiment.with_variant(experiment.parse(SMOKE), "mine", "bo")


def test_a_bad_added_variant_is_refused_before_anything_runs(tmp_path, capsys):
    source = tmp_path / "smoke.toml"
    source.write_text(SMOKE)
    for bad, message in [("mine", "expected NAME=OPTIMIZER"), ("mine=bo", "no variant that")]:
        with pytest.raises(SystemExit):
            run_experiment.main([str(source), "--variant", bad, "--out", str(tmp_path / "o")])
        assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        (("duration_s = 8", "duration_s = 0"), "duration_s must be positive"),
        (('tool = ["xfer", "iperf3", "gridftp"]', 'tool = ["xfer"]'), "1 values for 3 transfers"),
        (('tool = ["xfer", "iperf3", "gridftp"]', 'tool = "scp"'), "tool 'scp'"),
        (("stop_s = 8", "stop_s = 9"), "start_s < stop_s <= duration_s"),
        (("rtt_ms = 10", "rtt_ms = 10\nbandwidth = 3"), "unexpected keyword argument"),
        (('optimizer = "gd"\n', ""), "need an optimizer"),
        (("[[transfers]]\nstart_s = 0", "[[transfers]]\nstart = 0"), "unknown keys ['start']"),
        (('name = "mixed"', 'name = "mixed"\nworkload = "disk"'), "workload 'disk' is not"),
        (('name = "mixed"', 'name = "mixed"\nworkload = "tree:9xQ"'), "is not mem, file"),
        (('name = "mixed"', 'name = "mixed"\nworkload = "tree:9x0"'), "is not mem, file"),
        (('name = "mixed"', 'name = "mixed"\nworkload = "tree:4x1M"'), "iperf3 cannot move a tree"),
    ],
)
def test_mistakes_are_named(change, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        experiment.parse(SMOKE.replace(*change))


def test_workloads_parse():
    assert experiment.Workload.parse("mem") == experiment.Workload()
    tree = experiment.Workload.parse("tree:1000x4MiB")
    assert (tree.kind, tree.count, tree.size) == ("tree", 1000, 4 << 20)
    exp = experiment.parse(SMOKE.replace('name = "mixed"', 'name = "mixed"\nworkload = "file:1M"'))
    assert exp.variants[0].transfers[0].label == "T1 gd file:1M"
    assert exp.seed == 0 and experiment.parse("seed = 5\n" + SMOKE).seed == 5


def test_metrics():
    assert metrics.jain([5, 5, 5]) == pytest.approx(1)
    assert metrics.jain([9, 0, 0]) == pytest.approx(1 / 3)
    a = TransferResult("A", 0, [Sample(t, 100, 4, 1e-3) for t in range(1, 11)])
    b = TransferResult("B", 4, [Sample(t, 50, 2, 0) for t in range(5, 11)])
    ws = metrics.windows([a, b])
    assert [(w.start, w.end, w.labels) for w in ws] == [(0, 4, ("A",)), (4, 10, ("A", "B"))]
    assert ws[1].means == (100, 50) and ws[1].fairness == pytest.approx(0.9)
    # Four streams of 25 Mbit/s beside two of 25: fair per flow, not per application.
    assert ws[1].streams == (4, 2) and ws[1].flow_fairness == pytest.approx(1)
    assert ws[1].losses == (pytest.approx(1e-3), 0)
    one = TransferResult("C", 4, [Sample(t, 50, 1, None) for t in range(5, 11)])
    w = metrics.windows([a, one])[1]
    # Flows of 25, 25, 25, 25 and 50: (150)^2 / (5 * (4 * 625 + 2500)).
    assert w.flow_fairness == pytest.approx(0.9) and w.losses == (pytest.approx(1e-3), None)
    assert metrics.per_second_totals([a, b])[5] == 150
    assert metrics.link_utilisation([a, b], 200) == pytest.approx((4 * 100 + 6 * 150) / 10 / 200)
    ramp = TransferResult("R", 2, [Sample(2 + t, min(10 * t, 100), 1, 0) for t in range(1, 20)])
    assert ramp.time_to_95() == 10
    assert TransferResult("short", 0, [Sample(1, 5, 1, 0)]).time_to_95() is None
    # Against another best than its own: 95 % of 50 Mbit/s at one stream is reached sooner.
    assert ramp.best_sustained() == pytest.approx(100 / metrics.K)
    assert ramp.time_to_95(best=50 / metrics.K) == 5
    assert ramp.time_to_95(best=110 / metrics.K) is None
    lossy = TransferResult("L", 0, [Sample(1, 100, 0, 0.01)])
    assert lossy.mean_utility() == pytest.approx(100 - 100 * 0.01 * metrics.B)


def test_the_report_compares_runs_on_the_best_utility_any_of_them_sustained(tmp_path):
    def run(variant: str, mbit: list[float], repetition: int = 0) -> RunResult:
        t = TransferResult(f"T1 {variant}", 0, [Sample(i + 1, m, 0, 0) for i, m in enumerate(mbit)])
        return RunResult(variant, repetition, [t], [], 0.5, 0.0, tmp_path)

    slow, fast = run("slow", [10, 40, 80, 90, 90, 90, 90, 90]), run("fast", [100] * 8)
    table = "\n".join(report._across_runs([slow, fast]))
    assert "| slow | 1 | T1 slow | 72 | 0.725 | - |" in table, table
    assert "| fast | 1 | T1 fast | 100 | 1.000 | 1 |" in table, table
    assert "Over repetitions" not in table, "one run per variant needs no summary"
    assert report._across_runs([fast]) == []
    # With repetitions, each variant's runs are summarised against the same best.
    slow2 = run("slow", [10, 96, 96, 96, 96, 96, 96, 96], repetition=1)
    fast2 = run("fast", [50] * 8, repetition=1)
    table = "\n".join(report._across_runs([slow, fast, slow2, fast2]))
    assert "| slow | T1 | 2 | 0.789 (0.725-0.853) | 2.0 | 1 |" in table, table
    assert "| fast | T1 | 2 | 0.750 (0.500-1.000) | 1.0 | 1 |" in table, table


def test_each_phase_is_scored_against_the_best_fixed_count_of_that_phase():
    # 30 s; at 10 s capacity halves (the best count falls from 20 to 10), at 20 s it is back.
    def result(label: str, mbit) -> TransferResult:
        return TransferResult(label, 0, [Sample(t, *mbit(t)) for t in range(1, 31)])

    def fixed(n: int, per_stream: float):
        return result(
            f"T1 fixed:{n}", lambda t: (min(n * per_stream, 500 if 10 < t <= 20 else 1000), n, 0)
        )

    oracles = [fixed(10, 50), fixed(20, 50)]
    # A controller at 20 throughout that only comes down to 10 at 17 s.
    late = result(
        "T1 auto", lambda t: (500 if 10 < t <= 20 else 1000, 10 if 16 < t <= 20 else 20, 0)
    )
    bounds = metrics.phases(30, [10, 20, 45])
    assert bounds == [(0, 10), (10, 20), (20, 30)]
    scores = metrics.phase_scores(late, oracles, bounds)
    assert [p.oracle for p in scores] == ["T1 fixed:20", "T1 fixed:10", "T1 fixed:20"]
    assert scores[0].utility_fraction == pytest.approx(1) and scores[0].recovery_s == 0
    # 6 intervals at 500/K^20 against 500/K^10, then 4 at the best: the phase is too short
    # to stay near for 10, so near means the whole phase: never.
    expected = (6 * metrics.K**-20 + 4 * metrics.K**-10) / 10 / metrics.K**-10
    assert scores[1].utility_fraction == pytest.approx(expected)
    assert scores[1].recovery_s is None
    assert scores[2].recovery_s == 0
    # A phase no oracle measured is left out; a run without samples in a phase has no score.
    assert metrics.phase_scores(late, oracles, [(30, 40)]) == []
    quiet = TransferResult("T1 quiet", 0, [])
    assert metrics.phase_scores(quiet, oracles, bounds)[0].utility_fraction is None


def test_an_oracle_adds_fixed_count_variants_and_the_phases_follow_every_change(tmp_path):
    exp = experiment.parse(
        SMOKE.replace("rtt_ms = 10", "rtt_ms = 10\nloss_schedule = [[3, 1e-4], [6, 0]]")
        .replace('name = "smoke"', 'name = "smoke"\noracle = [1, 4]')
        .replace('tool = ["xfer", "iperf3", "gridftp"]', "")
    )
    assert [v.name for v in exp.variants] == ["mixed", "fixed:1", "fixed:4"]
    assert [t.optimizer for t in exp.variants[2].transfers] == ["fixed:4"] * 3
    assert exp.loss_schedule == ((3, 1e-4), (6, 0))
    # The loss changes, and the other transfers starting (2 s) and stopping (8 s, the end).
    assert exp.phase_changes() == [0, 2, 3, 6, 8]
    assert metrics.phases(exp.duration_s, exp.phase_changes()) == [(0, 2), (2, 3), (3, 6), (6, 8)]

    def run(variant: str, mbit: float, streams: int) -> RunResult:
        samples = [Sample(t / 2, mbit, streams, 0) for t in range(1, 17)]
        return RunResult(
            variant, 0, [TransferResult(f"T1 {variant}", 0, samples)], [], 0.5, 0, tmp_path
        )

    table = "\n".join(
        report._per_phase(exp, [run("mixed", 90, 4), run("fixed:1", 20, 1), run("fixed:4", 100, 4)])
    )
    assert "| mixed | 1 | 0-2 | T1 fixed:4 | 0.900 | never |" in table, table
    assert "fixed:1 | 1 |" not in table, "the oracle is not scored against itself"
    with pytest.raises(ValueError, match="loss_schedule"):
        experiment.parse(SMOKE.replace("rtt_ms = 10", "rtt_ms = 10\nloss_schedule = [[3, 2]]"))


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def _run(tmp_path, text: str):
    """Runs an experiment file's text through the command; returns the results directory."""
    source = tmp_path / "experiment.toml"
    source.write_text(text)
    out = tmp_path / "out"
    assert run_experiment.main([str(source), "--out", str(out)]) == 0
    return out


@needs_root
def test_an_experiment_runs_end_to_end_with_report_and_plots(tmp_path):
    out = _run(tmp_path, SMOKE)
    report = (out / "report.md").read_text()
    for label in ("T1 gd", "T2 iperf3 -P 2", "T3 gridftp -p 2"):
        assert f"| mixed | 1 | {label} |" in report, report
    assert "## Fairness while transfers overlap" in report
    assert (out / "mixed-r1.png").stat().st_size > 10_000
    runs = json.loads((out / "runs.json").read_text())
    transfers = runs[0]["transfers"]
    assert all(t["error"] is None for t in transfers), runs
    assert all(10 < t["mean_mbit"] < 150 for t in transfers), runs
    assert all(t["cpu_s"] > 0 for t in transfers), "every sender's CPU time is reported"
    assert transfers[2]["mean_loss"] is None, "GridFTP reports no loss"
    assert transfers[1]["mean_mbit"] < 2 * 30 * 1.05, "iperf3 paces each stream to its cap"
    assert transfers[2]["mean_mbit"] < 2 * 20 * 1.05, "so does the preload for GridFTP"
    overlap = [w for w in runs[0]["windows"] if len(w["labels"]) > 1]
    assert overlap and 0.5 <= overlap[0]["jain"] <= 1.0
    mi_log = (out / "mixed-r1" / "T1.mi.jsonl").read_text().splitlines()
    assert len(mi_log) >= 8 and json.loads(mi_log[0])["controller"] == "gd"
    assert all(t["completed_s"] is None for t in transfers), "memory to memory never completes"


FINITE = """
name = "finite"
duration_s = 20
mi = "500ms"
seed = 3
[path]
rate_mbit = 200
rtt_ms = 10
[[transfers]]
workload = "file:24MiB"
[[transfers]]
workload = "tree:60x256KiB"
[[transfers]]
workload = "file:24MiB"
[[transfers]]
workload = "file:24MiB"
[[variants]]
name = "finite"
optimizer = "bo"
tool = ["xfer", "xfer", "gridftp", "iperf3"]
[[variants]]
name = "typo"
optimizer = "fixed:0"
"""


@needs_root
def test_files_and_trees_arrive_and_report_when(tmp_path):
    out = _run(tmp_path, FINITE)
    runs = json.loads((out / "runs.json").read_text())
    transfers = runs[0]["transfers"]
    assert runs[0]["seed"] == 3
    # A sender that refuses its arguments is an error in the report, not an empty result.
    assert all("exited with status 2" in t["error"] for t in runs[1]["transfers"]), runs[1]
    assert all("fixed:0" in t["error"] for t in runs[1]["transfers"]), runs[1]
    assert all(t["error"] is None for t in transfers), transfers
    # 24 MiB at a share of 200 Mbit/s takes a few seconds, well before the 20 s deadline.
    assert all(
        t["completed_s"] is not None and 0.5 < t["completed_s"] < 19 for t in transfers
    ), transfers
    assert "| done s |" in (out / "report.md").read_text()
