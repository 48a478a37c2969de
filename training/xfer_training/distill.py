"""``xfer-distill``: a lighter policy that decides as an exported one does (paper 002_*).

The student is a PPO actor-critic with smaller hidden layers, so it exports, loads in xfer and
fine-tunes (``xfer-train --from``) like any other policy. Its actor learns the teacher's action
probabilities by DAgger: the first round's observations come from the teacher acting on
random simulated paths, every later round's from the student acting, each labelled with the
teacher's logits, so the student learns what to do in the states its own mistakes lead to.
After each round it trains on everything gathered so far (cross-entropy against the teacher's
probabilities) and reports how often it picks the teacher's action on the round it had not
seen yet.

Example (the shipped ``models/light``)::

    xfer-distill --teacher models/default --net 32 --out models/light
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv

from . import train, warm_start
from .env import DEFAULT_XFER
from .export import Actor, export, logits


def environment_args(args: argparse.Namespace, teacher: dict[str, Any]) -> argparse.Namespace:
    """``xfer-train``'s options for environments like the teacher's: its layout and utility,
    random paths of every family, seeds of their own."""
    layout = teacher["layout"]
    return train.resolve(
        train.parser().parse_args(
            [
                *("--xfer", str(args.xfer), "--seed", str(args.seed), "--envs", str(args.envs)),
                *("--history", str(layout["history"])),
                *("--action-history", str(layout["action_history"])),
                *("--max-streams", str(teacher["training"]["max_streams"])),
                *("--k", str(teacher["utility"]["k"]), "--b", str(teacher["utility"]["b"])),
                *("--net", ",".join(str(n) for n in args.net)),
            ]
        )
    )


def collect(venv: DummyVecEnv, actor: torch.nn.Module, steps: int) -> np.ndarray:
    """The observations met in ``steps`` environment steps with ``actor`` choosing the
    actions (its most likely one, as xfer does); episodes restart as they end."""
    observations = [venv.reset()]
    for _ in range(max(1, steps // venv.num_envs) - 1):
        actions = logits(actor, observations[-1]).argmax(axis=1)
        obs, _, _, _ = venv.step(actions)
        observations.append(obs)
    return np.concatenate(observations).astype(np.float32)


def fit(
    actor: torch.nn.Module,
    parameters: list[torch.nn.Parameter],
    inputs: np.ndarray,
    targets: np.ndarray,
    epochs: int,
    seed: int,
) -> None:
    """Trains ``actor`` (through ``parameters``) to give the probabilities ``targets``."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.as_tensor(inputs)
    p = torch.softmax(torch.as_tensor(targets), dim=1)
    optimiser = torch.optim.Adam(parameters, lr=1e-3)
    actor.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(256):
            loss = -(p[batch] * torch.log_softmax(actor(x[batch]), dim=1)).sum(dim=1).mean()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    actor.eval()


def distill(args: argparse.Namespace) -> dict[str, Any]:
    """Distils ``args.teacher`` into a policy with hidden layers ``args.net``, exports it to
    ``args.out`` and returns what happened per round."""
    train.prepare_torch()
    torch.manual_seed(args.seed)
    started = time.monotonic()
    meta = warm_start.source_metadata(args.teacher)
    teacher = warm_start.load_exported(args.teacher)
    env_args = environment_args(args, meta)
    venv = DummyVecEnv([lambda i=i: train.make_env(env_args, i) for i in range(args.envs)])
    student = PPO(
        "MlpPolicy",
        venv,
        policy_kwargs=train.policy_kwargs(args.net),
        seed=args.seed,
        device="cpu",
    )
    actor = Actor(student, share=True)
    parameters = list(actor.body.parameters()) + list(actor.head.parameters())
    inputs = np.zeros((0, venv.observation_space.shape[0]), dtype=np.float32)
    targets = np.zeros((0, venv.action_space.n), dtype=np.float32)
    rounds = []
    for round_ in range(args.rounds):
        new = collect(venv, teacher if round_ == 0 else actor, args.steps_per_round)
        wanted = logits(teacher, new)
        agreement = float((logits(actor, new).argmax(axis=1) == wanted.argmax(axis=1)).mean())
        inputs, targets = np.concatenate([inputs, new]), np.concatenate([targets, wanted])
        fit(actor, parameters, inputs, targets, args.epochs, args.seed + round_)
        rounds.append({"observations": len(inputs), "agreement_before_training": agreement})
        print(
            f"xfer-distill: round {round_ + 1}/{args.rounds}: {len(inputs)} observations; "
            f"the student picked the teacher's action on {agreement:.1%} of the new ones",
            flush=True,
        )
    venv.close()
    wall = time.monotonic() - started
    env = train.make_env(env_args, 999)
    try:
        description = env.unwrapped.description
        golden = train.golden_inputs(Actor(student), env, episodes=6, seed=args.seed)
    finally:
        env.close()
    training = {
        "algorithm": "distilled (DAgger, cross-entropy on the teacher's action probabilities)",
        "teacher": {
            "path": str(args.teacher),
            "net": meta["training"].get("net"),
            "source_revision": meta["training"].get("source_revision"),
        },
        "steps": int(len(inputs)),
        "seed": args.seed,
        "envs": args.envs,
        "net": args.net,
        "rounds": rounds,
        "epochs": args.epochs,
        "scenarios": {"source": "xfer env --randomize", "family": "all"},
        "wall_time_s": round(wall, 1),
    }
    export(student, args.out, description, golden, training)
    print(f"xfer-distill: {len(inputs)} observations in {wall:.0f} s; exported to {args.out}")
    return training


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xfer-distill", description=__doc__.split("\n\n")[0])
    p.add_argument("--teacher", type=Path, default=Path("models/default"), help="an export")
    p.add_argument(
        "--net",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[32],
        help="the student's hidden layer sizes, comma-separated",
    )
    p.add_argument("--out", type=Path, default=Path("models/light"), help="export directory")
    p.add_argument("--rounds", type=int, default=6, help="DAgger rounds")
    p.add_argument("--steps-per-round", type=int, default=100_000, help="observations per round")
    p.add_argument("--epochs", type=int, default=4, help="passes over the data per round")
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--xfer", type=Path, default=DEFAULT_XFER)
    return p


def main() -> None:
    result = distill(parser().parse_args())
    print(json.dumps(result["rounds"], indent=2))


if __name__ == "__main__":
    main()
