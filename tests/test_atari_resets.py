"""A life lost while the game goes on is reset natively (``AtariStep.reset``): ``EpisodicLifeEnv``'s
no-op step, then ``FireResetEnv``'s two steps, without the wrappers' steps, and exactly as the
wrappers reset. (Through a ShmVecEnv, tests/test_atari_native.py compares whole runs with life
losses against DummyVecEnv; here the env alone, so that a reset that quietly went through the
wrappers is caught too.)"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.atari_wrappers import AtariWrapper
from stable_baselines3.common.monitor import Monitor

from shmvec.atari import sb3
from tests.helpers import require


@pytest.fixture(autouse=True, scope="module")
def _ale():
    gym.register_envs(require("ale_py", 'pip install -e ".[atari]"'))


def _recipe(game: str) -> gym.Env:
    return AtariWrapper(Monitor(gym.make(f"{game}NoFrameskip-v4")))


def _untimed(info: dict) -> dict:
    """The info with Monitor's wall-clock ``t`` left out."""
    if "episode" in info:
        info = {**info, "episode": {k: v for k, v in info["episode"].items() if k != "t"}}
    return info


def _episodic_life(env: gym.Env) -> gym.Env:
    while type(env).__name__ != "EpisodicLifeEnv":
        env = env.env
    return env


def _forbidden(*args, **kwargs):
    raise AssertionError("a life-loss reset stepped through MaxAndSkipEnv.step")


@pytest.mark.parametrize("game,fire", [("Breakout", True), ("MsPacman", False)])
def test_life_loss_resets_are_native_and_exact(game, fire):
    env, twin = _recipe(game), _recipe(game)
    native, reason = sb3.recognise(env)
    assert native is not None, reason
    assert native.resets and (native.fire is not None) == fire
    obs = np.zeros(env.observation_space.shape, np.uint8)
    assert np.array_equal(env.reset(seed=3)[0], twin.reset(seed=3)[0])
    rng = np.random.default_rng(3)
    life_resets = 0
    for t in range(3000):
        action = int(rng.integers(env.action_space.n))
        reward, terminated, truncated, info = native.step_into(action, obs)
        want = twin.step(action)
        assert np.array_equal(obs, want[0]), t
        assert (reward, terminated, truncated, _untimed(info)) == (*want[1:4], _untimed(want[4])), t
        if not (terminated or truncated):
            continue
        if native.life.was_real_done:
            native.sync()
            got = env.reset()
        else:
            if life_resets % 2:
                # One life more than the game has, on both envs: FireResetEnv's first step then
                # loses a life and resets again (by play, a life is never lost that fast).
                native.life.lives = twin.get_wrapper_attr("lives") + 1
                _episodic_life(twin).lives = native.life.lives
            # The wrappers' own reset would step MaxAndSkipEnv: forbidden on this env for this reset.
            native.max_skip.step = _forbidden
            got = native.reset()
            del native.max_skip.step
            life_resets += 1
        want = twin.reset()
        assert np.array_equal(got[0], want[0]) and got[1] == want[1], f"reset after step {t}"
        native.sync()
        for attr in ("lives", "was_real_done", "total_steps", "rewards", "_obs_buffer"):
            assert np.array_equal(env.get_wrapper_attr(attr), twin.get_wrapper_attr(attr)), attr
    assert life_resets >= 3, life_resets


@pytest.mark.parametrize("at", [1, 2])
def test_a_life_lost_during_fire_reset_steps(at):
    # By play a life is never lost in FireResetEnv's two steps; Breakout's lives counter (RAM 0x39)
    # lowered before its step ``at`` makes one, on both envs alike: FireResetEnv then resets again,
    # and its obs is that step's, taken before the reset.
    env, twin = _recipe("Breakout"), _recipe("Breakout")
    native, _ = sb3.recognise(env)
    obs = np.zeros(env.observation_space.shape, np.uint8)
    env.reset(seed=4)
    twin.reset(seed=4)
    rng = np.random.default_rng(4)
    while True:
        action = int(rng.integers(env.action_space.n))
        _, terminated, _, _ = native.step_into(action, obs)
        twin.step(action)
        if terminated and not native.life.was_real_done:
            break
    native._skip = _losing_a_life(native._skip, env, at)
    twin_skip = _max_skip(twin)
    twin_skip.step = _losing_a_life(twin_skip.step, twin, at)
    got, want = native.reset(), twin.reset()
    assert np.array_equal(got[0], want[0]) and got[1] == want[1]
    native.sync()
    for attr in ("lives", "was_real_done", "total_steps", "rewards", "_obs_buffer"):
        assert np.array_equal(env.get_wrapper_attr(attr), twin.get_wrapper_attr(attr)), attr
    assert native.ale.getFrameNumber() == twin.unwrapped.ale.getFrameNumber()


def _max_skip(env: gym.Env) -> gym.Env:
    while type(env).__name__ != "MaxAndSkipEnv":
        env = env.env
    return env


def _losing_a_life(step, env: gym.Env, at: int):
    """``step`` (a MaxAndSkipEnv-level step), with the game's lives counter lowered before call
    ``at`` (counted from 0)."""
    calls = [0]

    def hooked(action):
        if calls[0] == at:
            ale = env.unwrapped.ale
            ale.setRAM(0x39, ale.getRAM()[0x39] - 1)
        calls[0] += 1
        return step(action)

    return hooked
