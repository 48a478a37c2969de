"""Starting from an exported policy: fine-tuning it for other goals, or distilling it (paper
002_*).

An export holds the actor alone (``policy.pt``, the TorchScript of :class:`export.Actor`), so
fine-tuning loads those weights into a fresh PPO model of the same shape and first trains the
critic with the actor frozen: a new critic's value estimates are noise, and policy updates made
with them would undo what the actor knew before it learns anything new.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from stable_baselines3 import PPO

from .export import METADATA_FILE, TORCHSCRIPT_FILE


def source_metadata(export_dir: Path) -> dict[str, Any]:
    """The metadata of the export to start from; a clear error when it is not one."""
    path = export_dir / METADATA_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"xfer-train: --from {export_dir}: not a policy export ({e})") from e


def load_exported(export_dir: Path) -> torch.nn.Module:
    """The actor network of the export in ``export_dir`` (observation -> logits)."""
    with warnings.catch_warnings():
        # torch.jit is deprecated but is what the tch runtime reads; the export writes it.
        warnings.simplefilter("ignore", DeprecationWarning)
        actor = torch.jit.load(str(export_dir / TORCHSCRIPT_FILE), map_location="cpu")
    actor.eval()
    return actor


def load_actor(model: PPO, export_dir: Path) -> None:
    """Copies the actor weights of the export in ``export_dir`` into ``model``'s policy, which
    must have the same network shape (refused with a clear error otherwise)."""
    state = load_exported(export_dir).state_dict()
    parts = {
        "body.": model.policy.mlp_extractor.policy_net,
        "head.": model.policy.action_net,
    }
    for prefix, module in parts.items():
        own = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        try:
            module.load_state_dict(own)
        except RuntimeError as e:
            raise SystemExit(
                f"xfer-train: --from {export_dir}: its network does not fit this one ({e})"
            ) from e


def freeze_actor(model: PPO, frozen: bool) -> None:
    """Stops (or resumes) updates of the actor; the optimiser skips parameters without
    gradients, so only the critic learns while the actor is frozen."""
    for module in (model.policy.mlp_extractor.policy_net, model.policy.action_net):
        for parameter in module.parameters():
            parameter.requires_grad_(not frozen)
