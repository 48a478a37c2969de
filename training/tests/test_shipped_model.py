"""The policies in models/ (the default, the presets and the light one): Python reproduces their
golden vectors with the ONNX export (the TorchScript export's check needs PyTorch:
torch_tests/test_shipped_torchscript.py)."""

import json

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from xfer_training.env import REPO
from xfer_training.utility import PRESETS


def test_the_default_both_presets_and_the_light_policy_are_shipped(shipped):
    assert [m.name for m in shipped] == ["default", "fill-the-pipe", "gentle", "light"]


def test_onnx_export_reproduces_the_golden_vectors(model, golden):
    session = ReferenceEvaluator(onnx.load(str(model / "policy.onnx")))
    for x, logits, action in golden:
        (y,) = session.run(None, {"observation": np.asarray([x], dtype=np.float32)})
        assert np.max(np.abs(y[0] - np.asarray(logits))) < 1e-5
        assert int(np.argmax(y[0])) == action


def test_the_model_is_small_and_describes_itself(model):
    metadata = json.loads((model / "metadata.json").read_text())
    assert sum((model / f).stat().st_size for f in metadata["files"].values()) < 400_000
    assert metadata["training"]["steps"] > 100_000
    assert metadata["training"]["source_revision"] != "unknown"


def test_the_presets_are_the_default_fine_tuned_or_its_recipe_for_their_utility(shipped):
    default = json.loads((REPO / "models" / "default" / "metadata.json").read_text())["training"]
    for model in shipped:
        if model.name not in PRESETS:
            continue
        metadata = json.loads((model / "metadata.json").read_text())
        assert metadata["utility"] == PRESETS[model.name]
        training = metadata["training"]
        assert training["preset"] == model.name
        if "fine_tuned_from" in training:
            assert training["fine_tuned_from"]["path"] == "models/default"
        else:
            # Trained from scratch: the default's recipe, only the utility differs.
            recipe = ("steps", "seed", "envs", "net", "hyperparameters", "scenarios")
            assert {k: training[k] for k in recipe} == {k: default[k] for k in recipe}


def test_the_light_policy_is_the_default_distilled_to_under_half_its_size():
    light, default = REPO / "models" / "light", REPO / "models" / "default"
    metadata = json.loads((light / "metadata.json").read_text())
    assert metadata["training"]["teacher"]["path"] == "models/default"
    assert metadata["utility"] == json.loads((default / "metadata.json").read_text())["utility"]
    # The student picked the teacher's action on most observations it had not trained on
    # (89 % for the layout-3 teacher, whose decisions rest on more inputs; 93 % before).
    assert metadata["training"]["rounds"][-1]["agreement_before_training"] > 0.85
    for export in ("policy.onnx", "policy.pt"):
        assert (light / export).stat().st_size < (default / export).stat().st_size / 2
