"""A gymnasium environment speaking xfer's environment protocol (``crates/optimizer/src/env.rs``).

The protocol is line-delimited JSON: ``describe``, ``reset``, ``step {action}``, ``close``. It is
served by ``xfer env`` over the Rust simulator (on the child's stdin and stdout) and by
``xfer send --optimizer external:SOCKET`` for a live transfer (on a Unix socket). The observation
vector comes from xfer itself, so the policy trains on exactly the inputs it sees when ``xfer``
runs it; this module never computes a feature of its own.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any, BinaryIO

import gymnasium as gym
import numpy as np
import orjson
from gymnasium import spaces

REPO = Path(__file__).resolve().parents[2]
#: The xfer binary the tests and commands use unless told otherwise (``XFER`` overrides).
DEFAULT_XFER = Path(os.environ.get("XFER", REPO / "target" / "release" / "xfer"))


class ProtocolError(RuntimeError):
    """xfer answered a request with an error, or stopped answering."""


class StepInfo(dict):
    """A step's ``info``, as xfer sent it: a fresh dict per reply, never shared.

    Stable-Baselines3's ``DummyVecEnv`` deep-copies every step's infos, object by object: 8 % of
    a training's time (40,960 steps of ``xfer-train`` in 37 s with the copies, 34 s without, the
    same policy exported), for a dict nothing else holds. Its deep copy is itself.
    """

    def __deepcopy__(self, memo: dict[int, Any]) -> StepInfo:
        return self


class _Connection:
    """One protocol session: a request line out, a reply line in."""

    def __init__(self, reader: BinaryIO, writer: BinaryIO, closer: Any, what: str) -> None:
        self._reader = reader
        self._writer = writer
        self._closer = closer
        self._what = what

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        # A training decodes a reply of some 150 numbers per step and environment: with the
        # standard library's json, 81,920 steps of xfer-train took 59 s; with orjson, 53 s.
        try:
            self._writer.write(orjson.dumps(message) + b"\n")
            self._writer.flush()
            line = self._reader.readline()
        except OSError as e:
            raise ProtocolError(f"{self._what}: {e}") from e
        if not line:
            raise ProtocolError(f"{self._what} closed the connection")
        reply = orjson.loads(line)
        if "error" in reply:
            raise ProtocolError(f"{self._what}: {reply['error']}")
        return reply

    def close(self) -> None:
        """Says goodbye, if the other side still listens, and lets go of the connection."""
        try:
            self.request({"op": "close"})
        except (ProtocolError, ValueError):
            pass
        try:
            self._closer()
        except OSError:
            pass  # the other side already went away (a live transfer that ended)


def _spawn(command: list[str]) -> _Connection:
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None

    def close() -> None:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    return _Connection(proc.stdout, proc.stdin, close, " ".join(command[:2]))


def _connect(path: Path) -> _Connection:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    stream = sock.makefile("rwb")
    return _Connection(stream, stream, lambda: (stream.close(), sock.close()), str(path))


def sim_command(
    xfer: Path = DEFAULT_XFER,
    *,
    scenario: str | None = None,
    randomize: int = 0,
    family: str = "all",
    duration_s: float = 100.0,
    history: int = 8,
    action_history: int = 8,
    reward: str = "utility",
    initial_streams: str = "1",
    extra: list[str] | None = None,
) -> list[str]:
    """The ``xfer env`` command line for these settings."""
    where = (
        ["--scenario", scenario]
        if scenario
        else ["--randomize", str(randomize), "--family", family]
    )
    return [
        str(xfer),
        "env",
        *where,
        "--duration",
        f"{duration_s}s",
        "--history",
        str(history),
        "--action-history",
        str(action_history),
        "--reward",
        reward,
        "--initial-streams",
        initial_streams,
        *(extra or []),
    ]


class XferEnv(gym.Env):
    """xfer's stream-count control as a gymnasium environment.

    Observations are the policy input vector xfer builds (the last ``history`` scale-free signal
    vectors and the last ``action_history`` changes of the stream count); actions are indices into
    the action set (+5, +1, 0, -1, -5 streams). Pass ``command`` to run ``xfer env`` (see
    :func:`sim_command`) or ``socket_path`` to act on a live transfer started with
    ``xfer send --optimizer external:SOCKET``.
    """

    metadata = {"render_modes": []}

    def __init__(self, command: list[str] | None = None, socket_path: Path | None = None) -> None:
        if (command is None) == (socket_path is None):
            raise ValueError("give either command (xfer env) or socket_path (a live transfer)")
        self._conn = _spawn(command) if command else _connect(Path(str(socket_path)))
        #: What xfer says about the observation, actions, utility and reward.
        self.description = self._conn.request({"op": "describe"})
        layout = self.description["layout"]
        # Every input lies in [-1, 1] but the RTT ratio's log (up to 3) and the stream count
        # over the layout's scale.
        high = max(3.0, self.description["max_streams"] / layout["stream_scale"])
        self.observation_space = spaces.Box(-1.0, high, shape=(layout["size"],), dtype=np.float32)
        self.action_space = spaces.Discrete(len(layout["actions"]))

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Starts an episode. ``seed`` (or ``options["seed"]``) picks its scenario and noise;
        without one, xfer draws a training scenario from its ``--randomize`` seed."""
        super().reset(seed=seed)
        message: dict[str, Any] = {"op": "reset"}
        episode_seed = (options or {}).get("seed", seed)
        if episode_seed is not None:
            message["seed"] = int(episode_seed)
        reply = self._conn.request(message)
        return np.asarray(reply["observation"], dtype=np.float32), StepInfo(reply["info"])

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reply = self._conn.request({"op": "step", "action": int(action)})
        truncated = bool(reply["truncated"])
        terminated = bool(reply["done"]) and not truncated
        observation = np.asarray(reply["observation"], dtype=np.float32)
        return observation, float(reply["reward"]), terminated, truncated, StepInfo(reply["info"])

    def close(self) -> None:
        self._conn.close()
