"""Export of a trained PPO policy for xfer: ONNX (run by tract in the default build), TorchScript
(run by tch-rs with the ``tch`` feature), a metadata file and golden vectors.

The exported network is the actor alone: the observation vector in, one logit per action out;
xfer takes the largest (the policy's deterministic action).
"""

from __future__ import annotations

import copy
import json
import subprocess
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3 import PPO

from .env import REPO

#: Version of metadata.json that xfer reads (MODEL_FORMAT in crates/optimizer).
MODEL_FORMAT = "xfer-policy-1"
ONNX_FILE = "policy.onnx"
TORCHSCRIPT_FILE = "policy.pt"
GOLDEN_FILE = "golden.json"
METADATA_FILE = "metadata.json"
#: The newest ONNX operator set tract (xfer's ONNX runtime) is tested against.
ONNX_OPSET = 18


class Actor(torch.nn.Module):
    """The policy part of an SB3 actor-critic: observation -> action logits. A copy of the
    model's weights, or with ``share`` the model's own (training it trains the model)."""

    def __init__(self, model: PPO, share: bool = False) -> None:
        super().__init__()
        policy = model.policy
        take = (lambda m: m) if share else copy.deepcopy
        self.features = take(policy.pi_features_extractor)
        self.body = take(policy.mlp_extractor.policy_net)
        self.head = take(policy.action_net)
        self.eval()

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.features(observation)))


def source_revision() -> str:
    """The git commit of this checkout, with ``-dirty`` when it has uncommitted changes."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("-dirty" if dirty else "")


def logits(actor: Actor, observations: np.ndarray) -> np.ndarray:
    """The actor's logits for a batch of observations."""
    with torch.no_grad():
        return actor(torch.as_tensor(observations, dtype=torch.float32)).numpy()


def export(
    model: PPO,
    out: Path,
    description: dict[str, Any],
    golden_inputs: np.ndarray,
    training: dict[str, Any],
) -> Path:
    """Writes the ONNX and TorchScript networks, golden vectors and metadata.json into ``out``.

    ``description`` is what the environment's ``describe`` answered (layout, utility, reward);
    ``golden_inputs`` are observations to record the network's logits and actions for;
    ``training`` says how the policy was trained. Returns the metadata file.
    """
    # Before anything is written: exporting into a tracked directory (models/) must not make
    # the checkout look modified.
    revision = source_revision()
    out.mkdir(parents=True, exist_ok=True)
    actor = Actor(model)
    size = description["layout"]["size"]
    example = torch.zeros(1, size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            actor,
            (example,),
            input_names=["observation"],
            output_names=["logits"],
            opset_version=ONNX_OPSET,
            dynamo=True,
            verbose=False,
        )
        program.save(str(out / ONNX_FILE), external_data=False)
        torch.jit.trace(actor, example).save(str(out / TORCHSCRIPT_FILE))
    inputs = np.asarray(golden_inputs, dtype=np.float32)
    out_logits = logits(actor, inputs)
    golden = {
        "inputs": inputs.tolist(),
        "logits": out_logits.tolist(),
        "actions": out_logits.argmax(axis=1).tolist(),
    }
    (out / GOLDEN_FILE).write_text(json.dumps(golden) + "\n")
    metadata = {
        "format": MODEL_FORMAT,
        "layout": description["layout"],
        "utility": description["utility"],
        "files": {"onnx": ONNX_FILE, "torchscript": TORCHSCRIPT_FILE, "golden": GOLDEN_FILE},
        "training": {
            "reward": description["reward"],
            "reward_params": description["reward_params"],
            "mi_s": description["mi"],
            "max_streams": description["max_streams"],
            "source_revision": revision,
            "torch": torch.__version__.split("+")[0],
            **training,
        },
    }
    path = out / METADATA_FILE
    path.write_text(json.dumps(metadata, indent=2) + "\n")
    return path
