"""A short training run end to end: train, export, and load the export in Rust."""

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from xfer_training import distill, evaluate, export, train, utility
from xfer_training.env import XferEnv, sim_command


def train_briefly(xfer: Path, out: Path, runs: Path) -> None:
    """2,048 steps of the recipe over two environments, exported to ``out``."""
    args = train.parser().parse_args(
        ["--steps", "2048", "--envs", "2", "--n-steps", "256", "--batch-size", "128"]
        + ["--out", str(out), "--runs", str(runs), "--xfer", str(xfer), "--evaluate", "0"]
    )
    train.train(args)


@pytest.fixture(scope="module")
def exported(xfer, tmp_path_factory):
    out = tmp_path_factory.mktemp("model")
    runs = tmp_path_factory.mktemp("runs")
    train_briefly(xfer, out, runs)
    return out, runs


def test_the_same_seed_trains_the_same_policy_again(xfer, exported, tmp_path):
    out, _ = exported
    train_briefly(xfer, tmp_path / "again", tmp_path / "runs")
    for name in ["policy.onnx", "golden.json"]:
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name


def test_the_export_has_its_files_and_metadata(exported):
    out, runs = exported
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["format"] == "xfer-policy-1"
    assert metadata["layout"]["size"] == 144
    assert metadata["layout"]["actions"] == [5, 1, 0, -1, -5]
    assert metadata["utility"] == {"k": 1.02, "b": 10.0}
    t = metadata["training"]
    assert t["steps"] >= 2048 and t["seed"] == 1 and t["source_revision"]
    for name in metadata["files"].values():
        assert (out / name).stat().st_size > 0
    assert (out / "policy.onnx").stat().st_size < 200_000, "a few hundred KB at most"
    assert list(runs.glob("ppo-seed1*/events.out.tfevents.*")), "TensorBoard log written"


def test_the_revision_is_read_before_the_export_is_written(xfer, tmp_path, monkeypatch):
    # Exporting into a tracked directory (models/) must not mark the checkout modified.
    out = tmp_path / "model"
    seen = []

    def revision():
        seen.append(sorted(p.name for p in out.glob("*")))
        return "abc123"

    monkeypatch.setattr(export, "source_revision", revision)
    args = train.parser().parse_args(
        ["--steps", "512", "--envs", "1", "--n-steps", "256", "--batch-size", "128"]
        + ["--out", str(out), "--runs", str(tmp_path / "runs"), "--xfer", str(xfer)]
        + ["--evaluate", "0"]
    )
    train.train(args)
    assert seen == [[]], "read once, before any file of the export"
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["training"]["source_revision"] == "abc123"


def onnx_logits(directory, inputs):
    """The logits of the ONNX export in ``directory`` for each input, by ONNX's reference
    runtime."""
    model = onnx.load(str(directory / "policy.onnx"))
    onnx.checker.check_model(model)
    session = ReferenceEvaluator(model)
    rows = [np.asarray([x], dtype=np.float32) for x in inputs]
    return np.stack([session.run(None, {"observation": x})[0][0] for x in rows])


def test_python_onnx_and_torch_agree_on_the_golden_vectors(exported):
    out, _ = exported
    golden = json.loads((out / "golden.json").read_text())
    y = onnx_logits(out, golden["inputs"])
    assert np.max(np.abs(y - np.asarray(golden["logits"]))) < 1e-5
    assert y.argmax(axis=1).tolist() == golden["actions"]


def test_xfer_loads_the_export_and_reproduces_its_golden_vectors(xfer, exported):
    out, _ = exported
    run = subprocess.run(
        [str(xfer), "model", str(out), "--json", "--decisions", "100"],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(run.stdout)
    assert report["golden_vectors"] >= 20
    assert report["golden_max_logit_error"] < 1e-5


def test_xfer_sim_runs_the_export_beside_the_baselines(xfer, exported, tmp_path):
    out, _ = exported
    report = evaluate.evaluate(
        out, xfer, per_family=1, seeds=1, duration_s=20, out=tmp_path, first_path=7
    )
    assert set(report["families"]) == {*evaluate.FAMILIES, "shipped", "changing"}
    assert "--first-path 7" in (tmp_path / "evaluation.md").read_text()
    for stats in report["families"].values():
        assert set(stats) == {"ppo", "auto", "gd", "bo", "fixed:8"}
    md = (tmp_path / "evaluation.md").read_text()
    assert "| shipped | ppo |" in md and "| shipped | auto |" in md
    assert set(report["auto_verdict"]["shipped"]) >= {"utility_close", "not_slower"}
    for png in ["settle.png", "utility.png", "trace-paper-fig2.png"]:
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_verdicts_compare_ppo_with_the_faster_and_the_better_baseline():
    stats = {
        "ppo": {"settle_mis": 3.0, "utility": 0.95},
        "gd": {"settle_mis": 5.0, "utility": 0.94},
        "bo": {"settle_mis": 10.0, "utility": 0.96},
    }
    v = evaluate.verdict(stats)
    assert v["faster"] and v["settle_ratio"] == pytest.approx(0.6)
    stats["auto"] = {"settle_mis": 9.0, "utility": 0.935}
    a = evaluate.auto_verdict(stats)
    assert a["utility_close"] and a["utility_diff"] == pytest.approx(-0.025)
    assert a["not_slower"] and a["slowest_settle_mis"] == 10.0
    stats["auto"] = {"settle_mis": 11.0, "utility": 0.92}
    a = evaluate.auto_verdict(stats)
    assert not a["utility_close"] and not a["not_slower"]
    assert not evaluate.verdict(stats, "auto")["faster"]
    assert not v["utility_as_high"] and v["utility_diff"] == pytest.approx(-0.01)
    immediate = {c: {**v, "settle_mis": 0.0} for c, v in stats.items()}
    assert evaluate.verdict(immediate)["faster"], "nobody beats 95 % from the start"
    rows = [
        {"controller": "gd", "settle_s": 4.0, "utility_fraction": 0.9},
        {"controller": "gd", "settle_s": None, "utility_fraction": 0.7},
    ]
    assert evaluate.aggregate(rows, 200.0)["gd"] == {
        "runs": 2,
        "settle_mis": 102.0,
        "never": 1,
        "utility": pytest.approx(0.8),
    }


def test_a_sharpened_reward_pays_most_for_the_best_count():
    square = train.sharpened(2.0)
    assert square(1.0) == 1.0
    assert square(0.5) == 0.25
    assert square(-0.3) == -0.3, "utility lost to congestion is not made smaller"
    assert square(0.0) == 0.0


@pytest.mark.parametrize(
    ("streams", "at", "paid"), [("1", 0.95, False), ("20", 0.95, True), ("20", 1.5, False)]
)
def test_the_bonus_is_paid_for_intervals_at_its_share_of_the_best(xfer, streams, at, paid):
    def make():
        return XferEnv(sim_command(xfer, scenario="paper-fig2", initial_streams=streams))

    plain, bonused = make(), train.AtBestBonus(make(), 0.5, at)
    try:
        plain.reset(seed=3)
        bonused.reset(seed=3)
        for _ in range(4):
            _, reward, _, _, info = plain.step(2)
            _, with_bonus, _, _, same = bonused.step(2)
            assert same["utility_fraction"] == info["utility_fraction"]
            assert (info["utility_fraction"] >= at) == paid, info["utility_fraction"]
            assert with_bonus == pytest.approx(reward + (0.5 if paid else 0.0))
    finally:
        plain.close()
        bonused.close()


def test_progress_rates_the_steps_of_its_own_phase(capsys, monkeypatch):
    # A fine-tune's second phase goes on counting from the critic warm-up's 200,000 steps.
    clock = iter([10.0, 12.0])
    monkeypatch.setattr(train.time, "monotonic", lambda: next(clock))
    progress = train.Progress(every_s=1.0)
    progress.model = SimpleNamespace(ep_info_buffer=[], num_timesteps=200_000)
    progress.num_timesteps = 200_000
    progress._on_training_start()
    progress.num_timesteps = 203_000
    progress._on_step()
    assert "203000 steps, 1500/s" in capsys.readouterr().out


def test_a_family_list_gives_the_environments_their_families_in_turn(xfer):
    args = train.resolve(
        train.parser().parse_args(["--xfer", str(xfer), "--family", "lossy,shallow"])
    )
    for index, family in [(0, "lossy"), (1, "shallow"), (2, "lossy")]:
        env = train.make_env(args, index)
        try:
            _, info = env.reset()
            assert info["scenario"].startswith(f"random:{family}:"), info["scenario"]
        finally:
            env.close()


def fine_tune(xfer, source, out, runs, *extra):
    args = train.parser().parse_args(
        ["--from", str(source), "--preset", "gentle", "--envs", "2", "--n-steps", "256"]
        + ["--batch-size", "128", "--out", str(out), "--runs", str(runs), "--xfer", str(xfer)]
        + ["--evaluate", "0", *extra]
    )
    train.train(args)
    return json.loads((out / "metadata.json").read_text())


def test_fine_tuning_starts_from_the_export_and_trains_for_the_preset(xfer, exported, tmp_path):
    source, _ = exported
    inputs = json.loads((source / "golden.json").read_text())["inputs"]
    before = onnx_logits(source, inputs)

    # Only the critic trains during the warm-up: the actor is the export's, weight for weight.
    frozen = tmp_path / "frozen"
    meta = fine_tune(xfer, source, frozen, tmp_path / "runs", "--steps", "512")
    assert meta["utility"] == utility.PRESETS["gentle"]
    assert meta["training"]["preset"] == "gentle"
    assert meta["training"]["fine_tuned_from"]["path"] == str(source)
    assert meta["training"]["fine_tuned_from"]["critic_warmup_steps"] == 512
    assert np.max(np.abs(onnx_logits(frozen, inputs) - before)) < 1e-5

    # Then the actor learns too.
    tuned = tmp_path / "tuned"
    meta = fine_tune(
        xfer, source, tuned, tmp_path / "runs", "--steps", "1024", "--critic-warmup", "512"
    )
    assert meta["training"]["steps"] >= 1024
    assert np.max(np.abs(onnx_logits(tuned, inputs) - before)) > 1e-4

    # xfer judges a run of the tuned policy by the utility it was trained for, unless told
    # another one, which the policy refuses.
    sim = [str(xfer), "sim", "--scenario", "paper-fig2", "--duration", "10s"]
    ran = subprocess.run(
        [*sim, "--optimizer", f"ppo:{tuned},gd"], capture_output=True, text=True, check=False
    )
    assert ran.returncode == 0, ran.stderr
    refused = subprocess.run(
        [*sim, "--optimizer", f"ppo:{tuned}", "--k", "1.02", "--b", "10"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode != 0 and "K=1.05 B=30" in refused.stderr, refused.stderr


def test_fine_tuning_refuses_a_network_that_does_not_fit_the_export(xfer, exported, tmp_path):
    source, _ = exported
    with pytest.raises(SystemExit, match="--net"):
        fine_tune(xfer, source, tmp_path / "out", tmp_path / "runs", "--net", "32,32")


def test_distilling_gives_a_smaller_policy_that_learns_the_teachers_actions(xfer, tmp_path):
    # The shipped policy: a teacher whose actions are decided (one trained for a few thousand
    # steps in a test picks nearly at random, and nothing can learn that).
    teacher = Path(__file__).resolve().parents[2] / "models" / "default"
    out = tmp_path / "light"
    args = distill.parser().parse_args(
        ["--teacher", str(teacher), "--net", "16,16", "--rounds", "2"]
        + ["--steps-per-round", "2048", "--envs", "2", "--out", str(out), "--xfer", str(xfer)]
    )
    training = distill.distill(args)
    first, second = training["rounds"]
    assert second["observations"] == 2 * first["observations"] == 4096
    # The second round's observations are new to the student, yet it agrees with the teacher
    # more often than before it learned anything.
    assert second["agreement_before_training"] > first["agreement_before_training"] + 0.1
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["training"]["net"] == [16, 16]
    assert metadata["training"]["teacher"]["path"] == str(teacher)
    assert (out / "policy.onnx").stat().st_size < (teacher / "policy.onnx").stat().st_size / 2
    report = subprocess.run(
        [str(xfer), "model", str(out), "--json", "--decisions", "100"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(report.stdout)["golden_max_logit_error"] < 1e-5
