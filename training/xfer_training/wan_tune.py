"""``xfer-tune-wan``: fine-tunes an exported policy on real transfers over the emulated WAN of
``bench/`` (network namespaces, a delay line, an htb bottleneck; needs root).

Every episode is a live memory-to-memory ``xfer send`` on one of the paths of the given bench
experiments, steered by PPO through ``--optimizer external:SOCKET``
(``crates/optimizer/src/env.rs``), one step per monitoring interval. Real intervals last a
second, so a run has thousands of steps where simulator training has millions: the critic is
first warmed on the simulator with the actor frozen (as ``xfer-train --from`` does), then actor
and critic learn from the live transfers only.

The reward is the interval's utility over the best utility sustained (over
``SUSTAINED_INTERVALS`` intervals) on the same path in any episode so far: the simulator's
reward is the utility over the best the path allows, which a live path does not tell, and
xfer's own live reward (over the best throughput of this one transfer) pays a transfer that
never climbs as much as one that found the best count. Example (about 30 minutes)::

    xfer-tune-wan --from models/default --paths paper-fig2,lossy-long-haul --steps 1536 \\
        --out /tmp/wan-tuned

Compare before and after on the emulated WAN with ``xfer-bench-run EXPERIMENT --variants ppo
--variant tuned=ppo:/tmp/wan-tuned``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import gymnasium as gym
import numpy as np
from stable_baselines3 import PPO
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv
from xfer_bench import experiment, supervise
from xfer_bench.dataplane import (
    XferReceiver,
    optimized_send_command,
    unending_size,
    write_key_file,
    xfer_receiver,
)
from xfer_bench.wan import Wan, WanSpec, emulated_wan

from . import train, warm_start
from .env import DEFAULT_XFER, ProtocolError, XferEnv
from .export import Actor, export

#: PPO rollout and batch of the live phase: short, since every step takes a real interval.
LIVE_N_STEPS, LIVE_BATCH_SIZE = 128, 64
#: Intervals whose mean utility counts as sustained (the best a path is judged against).
SUSTAINED_INTERVALS = 3
#: How long xfer send may take to open its agent socket.
CONNECT_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class LivePath:
    """A path to fine-tune on: a bench experiment's path (without its rate or RTT schedule) and
    its first transfer's starting count and per-stream cap."""

    name: str
    spec: WanSpec
    streams: int
    stream_rate_cap_mbit: float | None

    @staticmethod
    def from_experiment(name_or_path: str) -> LivePath:
        """The path of a bench experiment, by name or file; a ValueError when it has none."""
        exp = experiment.load(name_or_path)
        first = exp.variants[0].transfers[0]
        spec = dataclasses.replace(exp.path, senders=1, rtt_schedule=())
        return LivePath(exp.name, spec, first.streams, first.stream_rate_cap_mbit)


@dataclass
class _Site:
    """One path built for the run, with its receiver and the key its senders use."""

    wan: Wan
    receiver: XferReceiver
    key_file: Path


class LiveTransfers(gym.Env):
    """Episodes of live transfers on the emulated WAN: ``reset`` starts a new transfer on the
    next path in turn and connects to it; the episode ends after ``episode_steps`` intervals
    (truncated; the transfer is stopped) or when the transfer ends by itself. Every path stays
    built, with its receiver, until ``close``; each episode's MI log is kept in ``logs``."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        paths: list[LivePath],
        logs: Path,
        *,
        xfer: Path = DEFAULT_XFER,
        episode_steps: int = 60,
        mi: str = "1s",
        max_streams: int = 64,
        utility: dict[str, float] | None = None,
    ) -> None:
        if not paths:
            raise ValueError("at least one path")
        self._paths = paths
        self._logs = logs
        self._xfer = xfer
        self._episode_steps = episode_steps
        self._mi = mi
        self._tuning = ["--max-streams", str(max_streams)]
        for name, value in (utility or {}).items():
            self._tuning += [f"--{name}", f"{value:g}"]
        self._stack = ExitStack()
        self._sites: dict[int, _Site] = {}
        self._sender: Any = None
        self._sender_log = logs / "none.stderr"
        self._sender_stderr: IO[str] | None = None
        self._agent: XferEnv | None = None
        self._path = 0
        self._episode = 0
        self._steps = 0
        #: The path of every episode started, in order.
        self.episode_paths: list[str] = []
        #: The best utility sustained on each path so far, by path index.
        self.best_utility: dict[int, float] = {}
        self._recent: deque[float] = deque(maxlen=SUSTAINED_INTERVALS)
        logs.mkdir(parents=True, exist_ok=True)
        # The spaces are the protocol's: the first episode's transfer describes them.
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        assert self._agent is not None
        self.description = self._agent.description
        self.observation_space = self._agent.observation_space
        self.action_space = self._agent.action_space

    def _site(self, index: int) -> _Site:
        if index not in self._sites:
            path = self._paths[index]
            wan = self._stack.enter_context(
                emulated_wan(path.spec, self._xfer, prefix=f"xt{index}")
            )
            root = self._logs / f"recv-{index}"
            root.mkdir(exist_ok=True)
            receiver = self._stack.enter_context(
                xfer_receiver(
                    self._xfer, wan.topology(), root, self._logs / f"receiver-{index}.log"
                )
            )
            key = write_key_file(receiver, self._logs / f"xfer-{index}.key")
            self._sites[index] = _Site(wan, receiver, key)
        return self._sites[index]

    def _start(self) -> None:
        """Starts the next episode's transfer and connects to its agent socket."""
        index = self._episode % len(self._paths)
        path, site = self._paths[index], self._site(index)
        sock = self._logs / "agent.sock"
        sock.unlink(missing_ok=True)
        name = f"episode-{self._episode + 1:04d}-{path.name}"
        size = unending_size(path.spec.rate_mbit, 10 * self._episode_steps)
        argv = optimized_send_command(
            self._xfer, site.receiver, ["--mem", str(size)], f"external:{sock}",
            self._logs / f"{name}.mi.jsonl", site.key_file, path.streams,
            path.stream_rate_cap_mbit, self._mi, self._episode,
        )  # fmt: skip
        self._sender_log = self._logs / f"{name}.stderr"
        self._sender_stderr = self._sender_log.open("w")
        self._sender = supervise.start(
            site.wan.sender_cmd(0, supervise.supervised([*argv, *self._tuning])),
            None,
            self._sender_stderr,
        )
        self._agent = self._connect(sock)
        self._path = index
        self._recent.clear()
        self._steps = 0
        self._episode += 1
        self.episode_paths.append(path.name)

    def _connect(self, sock: Path) -> XferEnv:
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            if self._sender.poll() is not None:
                raise RuntimeError(f"xfer send exited: {self._sender_log.read_text()[-500:]}")
            try:
                return XferEnv(socket_path=sock)
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"xfer send did not open {sock} in {CONNECT_TIMEOUT_S:g} s"
                    ) from None
                time.sleep(0.1)

    def _stop(self) -> None:
        """Lets go of the current transfer: says goodbye to it and stops it."""
        if self._agent is not None:
            self._agent.close()
            self._agent = None
        if self._sender is not None:
            supervise.stop(self._sender)
            self._sender = None
        if self._sender_stderr is not None:
            self._sender_stderr.close()
            self._sender_stderr = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if self._agent is None or self._steps > 0:
            self._stop()
            self._start()
        assert self._agent is not None
        return self._agent.reset()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        assert self._agent is not None
        try:
            observation, reward, terminated, truncated, info = self._agent.step(action)
        except ProtocolError as e:
            raise RuntimeError(
                f"the live transfer stopped answering ({e}): {self._sender_log.read_text()[-500:]}"
            ) from e
        self._steps += 1
        reward = self._reward(info["signals"]["utility"], reward)
        if terminated and self._sender.wait(timeout=30) != 0:
            raise RuntimeError(f"xfer send failed: {self._sender_log.read_text()[-500:]}")
        truncated = truncated or self._steps >= self._episode_steps
        return observation, reward, terminated, truncated, info

    def _reward(self, utility: float, transfer_reward: float) -> float:
        """``utility`` over the best sustained on this path so far; xfer's reward for this
        transfer until the path has a best."""
        self._recent.append(utility)
        if len(self._recent) == self._recent.maxlen:
            sustained = sum(self._recent) / len(self._recent)
            self.best_utility[self._path] = max(self.best_utility.get(self._path, 0.0), sustained)
        best = self.best_utility.get(self._path, 0.0)
        return utility / best if best > 0 else transfer_reward

    def close(self) -> None:
        self._stop()
        self._stack.close()


def tune(args: argparse.Namespace) -> Path:
    """Warms a critic on the simulator, fine-tunes the export on live transfers, exports to
    ``args.out`` and returns the metadata file."""
    meta = warm_start.source_metadata(args.from_)
    utility = {"k": meta["utility"]["k"], "b": meta["utility"]["b"]}
    sim_args = train.resolve(
        train.parser().parse_args(
            ["--from", str(args.from_), "--seed", str(args.seed), "--xfer", str(args.xfer)]
            + ["--k", str(utility["k"]), "--b", str(utility["b"])]
        )
    )
    paths = [LivePath.from_experiment(p) for p in args.paths.split(",")]
    train.prepare_torch()
    started = time.monotonic()
    policy_kwargs = train.policy_kwargs(sim_args.net)
    ppo = {**train.HYPERPARAMETERS, "learning_rate": args.learning_rate, "seed": args.seed}
    ppo["device"] = "cpu"
    sim = DummyVecEnv(
        [lambda i=i: Monitor(train.make_env(sim_args, i)) for i in range(sim_args.envs)]
    )
    warm = PPO("MlpPolicy", sim, policy_kwargs=policy_kwargs, **ppo)
    warm_start.load_actor(warm, args.from_)
    warm_start.freeze_actor(warm, frozen=True)
    warm.learn(total_timesteps=args.critic_warmup, callback=train.Progress("xfer-tune-wan"))
    sim.close()
    live_env = LiveTransfers(
        paths,
        args.runs / "live",
        xfer=args.xfer,
        episode_steps=args.episode_steps,
        mi=args.mi,
        max_streams=sim_args.max_streams,
        utility=utility,
    )
    monitor = Monitor(live_env)
    live = DummyVecEnv([lambda: monitor])
    hyper = {
        **train.HYPERPARAMETERS,
        "n_steps": args.n_steps,
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
    }
    model = PPO(
        "MlpPolicy",
        live,
        policy_kwargs=policy_kwargs,
        tensorboard_log=str(args.runs),
        seed=args.seed,
        device="cpu",
        **hyper,
    )
    model.policy.load_state_dict(warm.policy.state_dict())
    try:
        model.learn(
            total_timesteps=args.steps,
            callback=train.Progress("xfer-tune-wan"),
            tb_log_name="wan-tune",
        )
    finally:
        live.close()
    wall = time.monotonic() - started
    golden_env = train.make_env(sim_args, 999)
    try:
        description = golden_env.unwrapped.description
        inputs = train.golden_inputs(Actor(model), golden_env, episodes=6, seed=args.seed)
    finally:
        golden_env.close()
    episodes = [
        {"path": path, "steps": steps, "reward": round(reward, 2)}
        for path, reward, steps in zip(
            live_env.episode_paths,
            monitor.get_episode_rewards(),
            monitor.get_episode_lengths(),
            strict=False,
        )
    ]
    training = {
        "algorithm": "PPO (stable-baselines3 MlpPolicy), fine-tuned on live transfers",
        "steps": model.num_timesteps,
        "seed": args.seed,
        "net": sim_args.net,
        "hyperparameters": hyper,
        "scenarios": {
            "source": "xfer-tune-wan: live transfers on the emulated WAN of bench/",
            "paths": [dataclasses.asdict(p) for p in paths],
            "episode_steps": args.episode_steps,
            "episodes": episodes,
            "best_utility_mbit": {
                paths[i].name: round(best / 1e6, 1) for i, best in live_env.best_utility.items()
            },
        },
        "critic_warmup_steps": args.critic_warmup,
        "fine_tuned_from": {
            "path": str(args.from_),
            "source_revision": meta["training"].get("source_revision"),
            "steps": meta["training"].get("steps"),
        },
        "wall_time_s": round(wall, 1),
    }
    metadata = export(model, args.out, description, inputs, training)
    print(f"xfer-tune-wan: {model.num_timesteps} live steps in {wall:.0f} s; exported: {args.out}")
    return metadata


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xfer-tune-wan", description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="from_", type=Path, required=True, metavar="EXPORT")
    p.add_argument(
        "--paths",
        default="paper-fig2,lossy-long-haul",
        help="bench experiments (names or files) whose paths the episodes take in turn",
    )
    p.add_argument("--steps", type=int, default=1536, help="live intervals to learn from")
    p.add_argument("--episode-steps", type=int, default=60, help="intervals per transfer")
    p.add_argument("--mi", default="1s", help="monitoring interval of the live transfers")
    p.add_argument(
        "--critic-warmup",
        type=int,
        default=200_000,
        metavar="STEPS",
        help="simulator steps that train the new critic first, the actor frozen",
    )
    p.add_argument("--learning-rate", type=float, default=train.FINE_TUNING_LEARNING_RATE)
    p.add_argument("--n-steps", type=int, default=LIVE_N_STEPS, help="live steps per update")
    p.add_argument("--batch-size", type=int, default=LIVE_BATCH_SIZE)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, required=True, help="export directory")
    p.add_argument("--runs", type=Path, default=Path("training/runs/wan-tune"))
    p.add_argument("--xfer", type=Path, default=DEFAULT_XFER, help="the xfer binary")
    return p


def main() -> None:
    tune(parser().parse_args())


if __name__ == "__main__":
    main()
