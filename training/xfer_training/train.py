"""``xfer-train``: trains the stream-count policy with PPO on randomised simulated paths, exports
it for xfer, and evaluates it on held-out paths against gd, bo and fixed.

Example (the shipped model)::

    xfer-train --steps 4000000 --seed 1 --out models/default

Fine-tuning the shipped policy for other goals (2 minutes; see ``utility.PRESETS``)::

    xfer-train --from models/default --preset gentle --steps 600000 --out models/gentle

Each of ``--envs`` environments is an ``xfer env --randomize SEED+i`` process that draws a new
random path (link 100 Mbit/s-100 Gbit/s, RTT 1-300 ms, loss 0-1 %, buffers, per-stream caps,
changing background traffic) for every episode. TensorBoard logs go to ``--runs``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
import torch
from gymnasium.wrappers import TransformReward
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

from . import evaluate, warm_start
from .env import DEFAULT_XFER, XferEnv, sim_command
from .export import Actor, export, logits
from .utility import DEFAULT_UTILITY, PRESETS

#: PPO settings of the shipped model; the command line can change the ones it names.
HYPERPARAMETERS: dict[str, Any] = {
    "n_steps": 256,
    "batch_size": 256,
    "n_epochs": 10,
    "gamma": 0.95,
    "gae_lambda": 0.95,
    "ent_coef": 0.01,
    "learning_rate": 3e-4,
    "clip_range": 0.2,
}

#: Learning rate of fine-tuning (``--from``): a third of training's keeps what the policy knew.
FINE_TUNING_LEARNING_RATE = 1e-4


class Progress(BaseCallback):
    """Prints steps done, steps per second and the mean episode reward now and then, after the
    name of the command (``prog``)."""

    def __init__(self, prog: str = "xfer-train", every_s: float = 30.0) -> None:
        super().__init__()
        self._prog = prog
        self._every = every_s
        self._start = self._last = 0.0
        self._start_steps = 0

    def _on_training_start(self) -> None:
        # A fine-tune's second phase goes on counting from its critic warm-up's steps: the
        # rate is of the steps of this phase.
        self._start = self._last = time.monotonic()
        self._start_steps = self.num_timesteps

    def _on_step(self) -> bool:
        now = time.monotonic()
        if now - self._last >= self._every:
            self._last = now
            episodes = self.model.ep_info_buffer
            reward = np.mean([e["r"] for e in episodes]) if episodes else float("nan")
            rate = (self.num_timesteps - self._start_steps) / (now - self._start)
            print(
                f"{self._prog}: {self.num_timesteps} steps, {rate:.0f}/s, "
                f"mean episode reward {reward:.2f}",
                flush=True,
            )
        return True


def sharpened(power: float) -> Callable[[SupportsFloat], float]:
    """The reward raised to ``power`` where it is positive: with the utility reward (a share of
    the best), 0.87 of the best pays 0.87**power, so a policy gains more by finding the best
    count exactly. Negative rewards (utility lost to congestion) stay as they are."""

    def transform(reward: SupportsFloat) -> float:
        r = float(reward)
        return r**power if r > 0 else r

    return transform


class AtBestBonus(gym.Wrapper):
    """Adds ``bonus`` to the reward of every interval whose count keeps at least ``at`` of the
    best utility (the simulator's noise-free ``utility_fraction``; 0.95 is what the evaluation
    times)."""

    def __init__(self, env: gym.Env, bonus: float, at: float) -> None:
        super().__init__(env)
        self.bonus = bonus
        self.at = at

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        if info["utility_fraction"] >= self.at:
            reward = float(reward) + self.bonus
        return observation, reward, terminated, truncated, info


def make_env(args: argparse.Namespace, index: int) -> gym.Env:
    """Environment ``index`` of a training run: ``xfer env`` on its family's random paths, with
    the reward changed as the options ask."""
    families = args.family.split(",")
    command = sim_command(
        args.xfer,
        randomize=args.seed * 1000 + index,
        family=families[index % len(families)],
        duration_s=args.episode_s,
        history=args.history,
        action_history=args.action_history,
        reward=args.reward,
        initial_streams=args.initial_streams,
        extra=[
            *("--k", str(args.k), "--b", str(args.b), "--max-streams", str(args.max_streams)),
            *reward_flags(args),
        ],
    )
    env: gym.Env = XferEnv(command)
    if args.reward_power != 1:
        env = TransformReward(env, sharpened(args.reward_power))
    if args.reward_bonus:
        env = AtBestBonus(env, args.reward_bonus, args.reward_bonus_at)
    return env


def reward_flags(args: argparse.Namespace) -> list[str]:
    """The ``xfer env`` flags for the reward weights the options set (the others: xfer's)."""
    flags = []
    for name in ["x", "y", "eps"]:
        value = getattr(args, f"reward_{name}")
        if value is not None:
            flags += [f"--reward-{name}", str(value)]
    return flags


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fills in what the options leave open: K and B from ``--preset`` (or the defaults) where
    not given, and, with ``--from``, the layout and network of the export to start from."""
    preset = PRESETS[args.preset] if args.preset else DEFAULT_UTILITY
    for name in ["k", "b"]:
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    if args.from_:
        meta = warm_start.source_metadata(args.from_)
        # What a fine-tuned policy takes from the export it starts from.
        inherited = {
            "history": meta["layout"]["history"],
            "action_history": meta["layout"]["action_history"],
            "max_streams": meta["training"]["max_streams"],
            "net": meta["training"]["net"],
        }
        for name in inherited:
            given = getattr(args, name)
            if given is not None and given != inherited[name]:
                raise SystemExit(
                    f"xfer-train: --{name.replace('_', '-')} {given} differs from the "
                    f"{inherited[name]} of {args.from_}, which --from starts from"
                )
            setattr(args, name, inherited[name])
    defaults = {
        "history": 8,
        "action_history": 8,
        "max_streams": 64,
        "net": [64, 64],
        "learning_rate": FINE_TUNING_LEARNING_RATE
        if args.from_
        else HYPERPARAMETERS["learning_rate"],
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def prepare_torch() -> None:
    """Sets torch up as every trainer here runs it: on one thread, so that seeded runs
    reproduce each other, and without checking each distribution's arguments. The policy's
    Categorical checked its every input and sample against its support: 6 % of a training's
    time (81,920 steps of ``xfer-train``: 65 s with the checks, 61 s without, the same
    export)."""
    torch.set_num_threads(1)
    torch.distributions.Distribution.set_default_validate_args(False)


def policy_kwargs(net: list[int]) -> dict[str, Any]:
    """The settings of every trainer's ``MlpPolicy``: hidden layers ``net`` for the actor and
    the critic, and Adam updating all the network's tensors in one call, not one at a time (3 %
    of a training's time). Its sums round differently from one at a time, so an export differs
    from one trained without it; runs with it reproduce each other."""
    return {"net_arch": {"pi": net, "vf": net}, "optimizer_kwargs": {"foreach": True}}


def golden_inputs(actor: Actor, env: gym.Env, episodes: int, seed: int) -> np.ndarray:
    """Observations met when the policy acts (a few per episode), and some random vectors."""
    rng = np.random.default_rng(seed)
    found: list[np.ndarray] = []
    for _ in range(episodes):
        obs, _ = env.reset()
        for step in range(40):
            if step in (0, 3, 10, 39):
                found.append(obs)
            action = int(logits(actor, obs[None, :])[0].argmax())
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
    size = env.observation_space.shape[0]
    found.extend(rng.normal(0.0, 0.5, size=(8, size)).astype(np.float32))
    return np.stack(found)


def train(args: argparse.Namespace) -> Path:
    """Trains (or, with ``--from``, fine-tunes), exports to ``args.out`` and returns the
    metadata file."""
    args = resolve(args)
    prepare_torch()
    started = time.monotonic()
    venv = DummyVecEnv([lambda i=i: Monitor(make_env(args, i)) for i in range(args.envs)])
    hyper = {
        **HYPERPARAMETERS,
        "n_steps": args.n_steps,
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
        "gamma": args.gamma,
    }
    model = PPO(
        "MlpPolicy",
        venv,
        policy_kwargs=policy_kwargs(args.net),
        tensorboard_log=str(args.runs),
        seed=args.seed,
        device="cpu",
        verbose=0,
        **hyper,
    )
    name = f"ppo-seed{args.seed}"
    warmup = 0
    if args.from_:
        warm_start.load_actor(model, args.from_)
        warmup = min(args.critic_warmup, args.steps)
        if warmup > 0:
            warm_start.freeze_actor(model, frozen=True)
            model.learn(total_timesteps=warmup, callback=Progress(), tb_log_name=name)
            warm_start.freeze_actor(model, frozen=False)
    if args.steps > warmup:
        model.learn(
            total_timesteps=args.steps - warmup,
            callback=Progress(),
            tb_log_name=name,
            reset_num_timesteps=not args.from_,
        )
    wall = time.monotonic() - started
    venv.close()
    env = make_env(args, 999)
    try:
        description = env.unwrapped.description
        inputs = golden_inputs(Actor(model), env, episodes=6, seed=args.seed)
    finally:
        env.close()
    training = {
        "algorithm": "PPO (stable-baselines3 MlpPolicy)",
        "steps": model.num_timesteps,
        "seed": args.seed,
        "envs": args.envs,
        "net": args.net,
        "hyperparameters": hyper,
        "scenarios": {
            "source": "xfer env --randomize",
            "family": args.family,
            "episode_s": args.episode_s,
            "initial_streams": args.initial_streams,
            "reward_power": args.reward_power,
            "reward_bonus": args.reward_bonus,
            "reward_bonus_at": args.reward_bonus_at,
            "seeds": f"drawn below 2^40 from --randomize {args.seed}*1000+i, i < {args.envs}",
        },
        "wall_time_s": round(wall, 1),
    }
    if args.preset:
        training["preset"] = args.preset
    if args.from_:
        source = warm_start.source_metadata(args.from_)["training"]
        training["fine_tuned_from"] = {
            "path": str(args.from_),
            "source_revision": source.get("source_revision"),
            "steps": source.get("steps"),
            "critic_warmup_steps": warmup,
        }
    metadata = export(model, args.out, description, inputs, training)
    model.save(args.runs / f"ppo-seed{args.seed}.zip")
    print(f"xfer-train: {model.num_timesteps} steps in {wall:.0f} s; exported to {args.out}")
    return metadata


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xfer-train", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4_000_000, help="environment steps (MIs)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--envs", type=int, default=8, help="environments stepped together")
    p.add_argument("--out", type=Path, default=Path("models/default"), help="export directory")
    p.add_argument("--runs", type=Path, default=Path("training/runs"), help="TensorBoard logs")
    p.add_argument("--xfer", type=Path, default=DEFAULT_XFER, help="the xfer binary")
    p.add_argument(
        "--family",
        default="all",
        help="random scenario family to train on (all: the six the shipped policies were "
        "trained on, all but changing); a comma list gives the environments their families "
        "in turn",
    )
    p.add_argument("--episode-s", type=float, default=100.0, help="simulated seconds/episode")
    p.add_argument(
        "--from",
        dest="from_",
        type=Path,
        metavar="EXPORT",
        help="fine-tune this export (e.g. models/default) instead of starting from scratch; "
        "the layout and network are its own",
    )
    p.add_argument(
        "--critic-warmup",
        type=int,
        default=200_000,
        metavar="STEPS",
        help="with --from: first steps that train only the new critic, the actor frozen",
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="utility weights for another goal: "
        + "; ".join(f"{n}: K={v['k']} B={v['b']}" for n, v in PRESETS.items()),
    )
    p.add_argument("--history", type=int, help="signal vectors per observation [8]")
    p.add_argument("--action-history", type=int, help="past actions per observation [8]")
    p.add_argument("--reward", choices=["utility", "change"], default="utility")
    for name, meaning in [
        ("x", "reward when the utility rose by more than --reward-eps (reward change)"),
        ("y", "reward when it fell by more than --reward-eps (reward change)"),
        ("eps", "relative change of utility that counts as none (reward change)"),
    ]:
        p.add_argument(f"--reward-{name}", type=float, help=f"{meaning} [xfer's default]")
    p.add_argument(
        "--reward-power",
        type=float,
        default=1.0,
        help="raise positive rewards to this power (sharpens the utility reward near the best)",
    )
    p.add_argument(
        "--reward-bonus",
        type=float,
        default=0.0,
        help="added to the reward of intervals at --reward-bonus-at of the best utility or more",
    )
    p.add_argument(
        "--reward-bonus-at",
        type=float,
        default=0.95,
        help="share of the best utility from which an interval earns --reward-bonus [0.95]",
    )
    p.add_argument(
        "--initial-streams",
        default="random:0.25",
        help="streams at the start of an episode: a count, random (1 to --max-streams) or "
        "random:SHARE (random in that share of episodes, 1 in the others)",
    )
    p.add_argument("--k", type=float, help="utility: cost per stream [the preset's, or 1.02]")
    p.add_argument("--b", type=float, help="utility: loss penalty [the preset's, or 10]")
    p.add_argument("--max-streams", type=int, help="[64]")
    p.add_argument(
        "--net", type=lambda s: [int(x) for x in s.split(",")], help="hidden layers [64,64]"
    )
    p.add_argument("--n-steps", type=int, default=HYPERPARAMETERS["n_steps"], help="per env")
    p.add_argument("--batch-size", type=int, default=HYPERPARAMETERS["batch_size"])
    p.add_argument(
        "--gamma",
        type=float,
        default=HYPERPARAMETERS["gamma"],
        help="discount per interval: how far ahead a decision's reward counts (about "
        "1/(1-gamma) intervals)",
    )
    p.add_argument(
        "--learning-rate",
        type=float,
        help=f"[{HYPERPARAMETERS['learning_rate']}; with --from {FINE_TUNING_LEARNING_RATE}]",
    )
    p.add_argument(
        "--evaluate",
        type=int,
        default=100,
        metavar="N",
        help="held-out paths per family to evaluate on afterwards (0: none)",
    )
    return p


def main() -> None:
    args = parser().parse_args()
    train(args)
    if args.evaluate:
        report = evaluate.evaluate(
            args.out, args.xfer, per_family=args.evaluate, seeds=3, out=args.runs / "evaluation"
        )
        print(json.dumps(report["verdict"], indent=2))


if __name__ == "__main__":
    main()
