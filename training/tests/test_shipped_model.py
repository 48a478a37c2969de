"""The policy in models/default: Python reproduces its golden vectors with both exports."""

import json

import numpy as np
import onnx
import torch
from onnx.reference import ReferenceEvaluator

from xfer_training.env import REPO

MODEL = REPO / "models" / "default"


def golden():
    data = json.loads((MODEL / "golden.json").read_text())
    return zip(data["inputs"], data["logits"], data["actions"], strict=True)


def test_onnx_export_reproduces_the_golden_vectors():
    session = ReferenceEvaluator(onnx.load(str(MODEL / "policy.onnx")))
    for x, logits, action in golden():
        (y,) = session.run(None, {"observation": np.asarray([x], dtype=np.float32)})
        assert np.max(np.abs(y[0] - np.asarray(logits))) < 1e-5
        assert int(np.argmax(y[0])) == action


def test_torchscript_export_reproduces_the_golden_vectors():
    module = torch.jit.load(str(MODEL / "policy.pt"))
    for x, logits, action in golden():
        with torch.no_grad():
            y = module(torch.tensor([x], dtype=torch.float32))[0].numpy()
        assert np.max(np.abs(y - np.asarray(logits))) < 1e-5
        assert int(np.argmax(y)) == action


def test_the_model_is_small_and_describes_itself():
    metadata = json.loads((MODEL / "metadata.json").read_text())
    assert sum((MODEL / f).stat().st_size for f in metadata["files"].values()) < 400_000
    assert metadata["training"]["steps"] > 100_000
    assert metadata["training"]["source_revision"] != "unknown"
