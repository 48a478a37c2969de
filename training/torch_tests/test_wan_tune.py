"""Fine-tuning on live transfers over the emulated WAN (``xfer-tune-wan``)."""

import json
import os
import subprocess

import numpy as np
import pytest
from test_train_export import onnx_logits

from xfer_training import wan_tune
from xfer_training.env import REPO

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")

PATH = """
name = "{name}"
duration_s = 10
[path]
rate_mbit = 100
rtt_ms = {rtt}
delay = "delay-line"
[[transfers]]
streams = 2
stream_rate_cap_mbit = 20
[[variants]]
name = "gd"
optimizer = "gd"
"""


def namespaces():
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}


def test_a_path_comes_from_an_experiments_first_transfer():
    path = wan_tune.LivePath.from_experiment("capacity-halves")
    assert (path.name, path.streams, path.stream_rate_cap_mbit) == ("capacity-halves", 2, 50)
    assert (path.spec.rate_mbit, path.spec.rtt_ms, path.spec.senders) == (1000, 20, 1)
    rises = wan_tune.LivePath.from_experiment("rtt-rises")
    assert rises.spec.rtt_schedule == (), "episodes run on the path as it starts"
    with pytest.raises(ValueError, match="neither a file nor a shipped experiment"):
        wan_tune.LivePath.from_experiment("no-such-experiment")


@needs_root
def test_a_policy_fine_tunes_on_live_transfers_and_exports(xfer, tmp_path):
    paths = []
    for name, rtt in [("near", 2), ("far", 20)]:
        paths.append(tmp_path / f"{name}.toml")
        paths[-1].write_text(PATH.format(name=name, rtt=rtt))
    source, out, runs = REPO / "models" / "default", tmp_path / "out", tmp_path / "runs"
    args = wan_tune.parser().parse_args(
        ["--from", str(source), "--paths", ",".join(map(str, paths)), "--out", str(out)]
        + ["--runs", str(runs), "--xfer", str(xfer), "--steps", "24", "--n-steps", "8"]
        + ["--batch-size", "8", "--episode-steps", "5", "--mi", "250ms"]
        + ["--critic-warmup", "256", "--learning-rate", "0.003"]
    )
    before = namespaces()
    meta = json.loads(wan_tune.tune(args).read_text())

    t = meta["training"]
    assert t["steps"] == 24 and t["fine_tuned_from"]["path"] == str(source)
    episodes = t["scenarios"]["episodes"]
    assert [e["path"] for e in episodes[:4]] == ["near", "far", "near", "far"], episodes
    assert all(e["steps"] == 5 and -5 <= e["reward"] <= 7.5 for e in episodes), episodes
    best = t["scenarios"]["best_utility_mbit"]
    assert set(best) == {"near", "far"} and all(0 < b < 100 for b in best.values()), best
    logs = sorted((runs / "live").glob("episode-*.mi.jsonl"))
    assert len(logs) >= len(episodes)
    first = [json.loads(line) for line in logs[0].read_text().splitlines()]
    assert len(first) >= 5 and {r["controller"] for r in first} == {"external"}

    # The export is one xfer runs, and the actor learned from the live steps.
    run = subprocess.run(
        [str(xfer), "model", str(out), "--json", "--decisions", "10"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(run.stdout)["golden_max_logit_error"] < 1e-5
    inputs = json.loads((out / "golden.json").read_text())["inputs"]
    assert np.max(np.abs(onnx_logits(out, inputs) - onnx_logits(source, inputs))) > 1e-4
    assert namespaces() <= before, "every namespace of the run is gone"
