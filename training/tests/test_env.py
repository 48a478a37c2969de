import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from xfer_training.env import ProtocolError, XferEnv, sim_command
from xfer_training.evaluate import HELD_OUT_SEEDS


def test_the_env_passes_gymnasiums_checks_and_follows_its_actions(xfer):
    env = XferEnv(sim_command(xfer, scenario="paper-fig2", duration_s=12))
    try:
        check_env(env, skip_render_check=True)
        obs, info = env.reset(seed=5)
        assert obs.shape == env.observation_space.shape == (144,)
        assert obs.dtype == np.float32
        assert info["signals"]["streams"] == 1
        counts = []
        for action in [0, 0, 0, 0, 3]:
            obs, reward, terminated, truncated, info = env.step(action)
            counts.append(info["signals"]["streams"])
        assert counts == [6, 11, 16, 21, 20]
        assert info["best_streams"] == 20
        assert 0.9 < reward < 1.05
        assert not terminated and not truncated
        steps = 5
        while not truncated:
            _, _, terminated, truncated, _ = env.step(2)
            steps += 1
        assert steps == 11 and not terminated, "12 s episode: a reset and 11 steps"
    finally:
        env.close()


def test_random_episodes_are_training_paths_and_seeded_ones_repeat(xfer):
    env = XferEnv(sim_command(xfer, randomize=7))
    try:
        for _ in range(10):
            _, info = env.reset()
            seed = int(info["scenario"].rsplit(":", 1)[1])
            assert seed < HELD_OUT_SEEDS, "unseeded episodes never use held-out paths"
        a, _ = env.reset(seed=HELD_OUT_SEEDS + 3)
        b, _ = env.reset(seed=HELD_OUT_SEEDS + 3)
        assert np.array_equal(a, b)
    finally:
        env.close()


def test_protocol_errors_are_raised_with_xfers_reason(xfer):
    env = XferEnv(sim_command(xfer, scenario="cloudlab-1g"))
    try:
        with pytest.raises(ProtocolError, match="reset first"):
            env.step(0)
        env.reset()
        with pytest.raises(ProtocolError, match="action 7"):
            env.step(7)
    finally:
        env.close()
    with pytest.raises(ValueError):
        XferEnv()
