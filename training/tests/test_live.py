"""An agent acts on a live loopback transfer through ``xfer send --optimizer external:SOCKET``."""

import json
import os
import subprocess
import time

import pytest

from xfer_training.env import XferEnv


@pytest.fixture
def receiver(xfer, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    proc = subprocess.Popen(
        [str(xfer), "recv", "--listen", "127.0.0.1:0", "--root", str(root), "--once"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    lines = {}
    for _ in range(2):
        key, _, value = proc.stdout.readline().strip().partition(" ")
        lines[key] = value
    yield lines["listening"].removeprefix("on "), lines["key"]
    proc.kill()
    proc.wait()


def connect(path, deadline_s=10.0):
    end = time.monotonic() + deadline_s
    while True:
        try:
            return XferEnv(socket_path=path)
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def test_an_agent_steers_a_live_transfer_until_it_ends(xfer, receiver, tmp_path):
    addr, key = receiver
    sock = tmp_path / "agent.sock"
    log = tmp_path / "mi.jsonl"
    sender = subprocess.Popen(
        [str(xfer), "send", "--mem", "3GiB", addr, "--streams", "1"]
        + ["--optimizer", f"external:{sock}", "--mi", "200ms", "--max-streams", "12"]
        + ["--stream-rate-cap", "2000", "--mi-log", str(log), "--quiet"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "XFER_KEY": key},
    )
    env = connect(sock)
    try:
        assert env.description["source"] == "transfer"
        obs, info = env.reset()
        assert obs.shape == (144,)
        counts, done, steps = [info["signals"]["streams"]], False, 0
        while not done and steps < 500:
            action = 0 if steps < 3 else 2  # +5 three times, then hold
            obs, reward, terminated, truncated, info = env.step(action)
            counts.append(info["signals"]["streams"])
            done = terminated or truncated
            steps += 1
            assert -1.0 <= reward <= 1.05
        assert terminated and not truncated, "the transfer's end ends the episode"
    finally:
        env.close()
    _, stderr = sender.communicate(timeout=60)
    assert sender.returncode == 0, stderr
    assert max(counts) == 12, f"+5 three times from 1, capped at 12: {counts}"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert {r["controller"] for r in records} == {"external"}
    assert 12 in [r["decision"] for r in records]
    assert not sock.exists(), "the socket is removed at the end"


def test_an_agent_socket_is_refused_on_the_simulator_and_a_missing_one_named(xfer, tmp_path):
    run = subprocess.run(
        [str(xfer), "sim", "--scenario", "paper-fig2", "--optimizer", f"external:{tmp_path}/a"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1 and "xfer env" in run.stderr
    with pytest.raises(FileNotFoundError):
        XferEnv(socket_path=tmp_path / "nobody.sock")
