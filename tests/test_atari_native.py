"""The native Atari step path (shmvec.atari) gives exactly what the wrappers give.

Every comparison is against the same factories stepped by SB3's DummyVecEnv (or Gymnasium's
SyncVectorEnv, or the env alone), array for array: observations, rewards, dones, infos with
``terminal_observation`` and Monitor's ``episode``, the wrappers' state read back with ``get_attr``,
and Monitor's CSV files. The larger matrix (seven games, more steps) is marked slow.
"""

from __future__ import annotations

import functools
import os
import signal
from contextlib import closing

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import DummyVecEnv

import shmvec
from shmvec import ShmVecEnv
from tests.atari_helpers import run_sb3
from tests.helpers import assert_step_equal, equivalent_with_statuses, not_checked, require
from tests.vector_helpers import DISABLED, REFERENCE_MODES


@pytest.fixture(autouse=True, scope="module")
def _ale():
    module = require("ale_py", 'pip install -e ".[atari]"')
    gym.register_envs(module)


# ---------------------------------------------------------------- SB3's recipe against DummyVecEnv


def test_pong_one_liner_is_native_and_exact(no_leaks, tmp_path):
    ends = run_sb3("PongNoFrameskip-v4", tmp_path, n_envs=2, steps=1000, n_workers=2)
    assert ends["game over"] >= 1, ends


def test_breakout_lives_frame_stack_and_truncation(no_leaks, tmp_path):
    # TimeLimit counts emulator frames (Monitor and TimeLimit sit under the frame skip).
    ends = run_sb3("BreakoutNoFrameskip-v4", tmp_path, env_kwargs={"max_episode_steps": 600}, frame_stack=4)
    assert ends["life lost"] >= 3 and ends["truncated"] >= 1, ends


@pytest.mark.parametrize(
    "game,wrapper_kwargs,env_kwargs",
    [
        ("SpaceInvaders", {"action_repeat_probability": 0.25, "screen_size": 64}, None),
        (
            "MsPacman",
            {"noop_max": 0, "terminal_on_life_loss": False, "clip_reward": False},
            {"max_episode_steps": 800},
        ),
        ("Qbert", {"frame_skip": 5, "screen_size": 96}, {"max_num_frames_per_episode": 2000}),
        ("Seaquest", {"frame_skip": 2}, None),
    ],
)
def test_recipe_parameters(no_leaks, tmp_path, game, wrapper_kwargs, env_kwargs):
    ends = run_sb3(
        f"{game}NoFrameskip-v4", tmp_path, steps=400, wrapper_kwargs=wrapper_kwargs, env_kwargs=env_kwargs
    )
    assert sum(ends.values()) >= 1, ends


def test_v5_ids_with_sticky_actions_in_ale(no_leaks, tmp_path):
    ends = run_sb3("ALE/Breakout-v5", tmp_path, steps=400, env_kwargs={"frameskip": 1})
    assert ends["life lost"] >= 1, ends


def test_a_changed_seed_is_caught(no_leaks, tmp_path):
    with pytest.raises(AssertionError, match="obs|rewards|dones|infos"):
        run_sb3("BreakoutNoFrameskip-v4", tmp_path, steps=200, ref_seed=1)


def test_wrapper_calls_between_steps_see_the_wrappers_state(no_leaks):
    """get_attr / env_method in the middle of episodes: MaxAndSkipEnv's frames are written back
    first, and the native step goes on from whatever the call left."""
    ref = make_atari_env("BreakoutNoFrameskip-v4", n_envs=2, seed=3)
    got = make_atari_env("BreakoutNoFrameskip-v4", n_envs=2, seed=3, vec_env_cls=ShmVecEnv,
                         vec_env_kwargs={"start_method": "fork"})  # fmt: skip
    with closing(got), closing(ref):
        got.reset(), ref.reset()
        rng = np.random.default_rng(3)
        for t in range(300):
            actions = rng.integers(0, 4, 2)
            assert_step_equal(got.step(actions), ref.step(actions), t)
            if t % 37 == 0:
                for x, y in zip(got.get_attr("_obs_buffer"), ref.get_attr("_obs_buffer")):
                    assert np.array_equal(x, y), t
            if t % 53 == 0:  # a step through the wrappers, not the VecEnv: state must follow
                want = ref.env_method("step", 1)
                for (o1, *r1), (o2, *r2) in zip(got.env_method("step", 1), want):
                    assert np.array_equal(o1, o2) and r1 == r2, t
                if any(r[2] or r[3] for r in want):
                    got.reset(), ref.reset()


# ---------------------------------------------------------------- when the path is (not) taken


def _sb3_factory(env_id: str, extra: str | None = None, monitor: bool = True, **wrapper_kwargs):
    from stable_baselines3.common.atari_wrappers import AtariWrapper
    from stable_baselines3.common.monitor import Monitor

    env = AtariWrapper(Monitor(gym.make(env_id)) if monitor else gym.make(env_id), **wrapper_kwargs)
    if extra == "outer":
        env = gym.wrappers.RecordEpisodeStatistics(env)
    elif extra == "inner":
        env = AtariWrapper(gym.wrappers.RecordEpisodeStatistics(Monitor(gym.make(env_id))), **wrapper_kwargs)
    return env


def _compare_dummy(fns, steps: int = 150, **options):
    return equivalent_with_statuses(fns, steps, **options)


@pytest.mark.parametrize(
    "fn,reason",
    [
        (functools.partial(_sb3_factory, "BreakoutNoFrameskip-v4", "outer"), "RecordEpisodeStatistics"),
        (functools.partial(_sb3_factory, "BreakoutNoFrameskip-v4", "inner"), "RecordEpisodeStatistics"),
        (functools.partial(_sb3_factory, "BreakoutNoFrameskip-v4", screen_size=10), "INTER_AREA"),
        (functools.partial(_sb3_factory, "AdventureNoFrameskip-v4"), "PAL"),
    ],
    ids=["wrapper-outside", "wrapper-inside", "integer-scale-resize", "pal-game"],
)
def test_chains_it_does_not_recognise_step_through_their_wrappers(no_leaks, fn, reason):
    statuses = _compare_dummy([fn, fn])
    assert all(s.path is None for s in statuses), statuses
    assert reason is None or reason in statuses[0].reason


def test_option_turns_it_off(no_leaks):
    fn = functools.partial(_sb3_factory, "BreakoutNoFrameskip-v4")
    statuses = _compare_dummy([fn, fn], steps=20, native_step=False)
    assert statuses[0].path is None and statuses[0].reason == "native_step=False"


def test_code_it_was_not_checked_against_steps_through_the_wrappers(no_leaks, monkeypatch):
    """A wrapper whose source differs (another SB3 version) is not restated."""
    name = "stable_baselines3.common.atari_wrappers.MaxAndSkipEnv.step"
    not_checked(monkeypatch, name)
    fn = functools.partial(_sb3_factory, "BreakoutNoFrameskip-v4")
    with pytest.warns(shmvec.NativeStepWarning, match=name):
        statuses = _compare_dummy([fn, fn], steps=30)
    assert statuses[0].path is None and name in statuses[0].reason


def test_non_ale_env_named_like_one_is_not_native(no_leaks):
    from stable_baselines3.common.atari_wrappers import WarpFrame

    from shmvec.synthetic import SyntheticImageEnv

    fn = functools.partial(lambda: WarpFrame(SyntheticImageEnv((210, 160, 3), episode_len=(5, 9))))
    statuses = _compare_dummy([fn, fn], steps=30)
    assert statuses[0].path is None and "AtariEnv" in statuses[0].reason


# ---------------------------------------------------------------- the Gymnasium face


def _preprocessed(
    env_id: str = "ALE/Breakout-v5", stack: int = 4, frames: int | None = None, **kwargs
) -> gym.Env:
    """AtariPreprocessing (and FrameStackObservation if ``stack``); ``frames``: TimeLimit's length."""
    env = gym.wrappers.AtariPreprocessing(gym.make(env_id, frameskip=1, max_episode_steps=frames), **kwargs)
    return gym.wrappers.FrameStackObservation(env, stack) if stack else env


@pytest.mark.parametrize("mode", [m for m in REFERENCE_MODES if m is not DISABLED])
@pytest.mark.parametrize(
    "fn",
    [
        functools.partial(_preprocessed, terminal_on_life_loss=True),
        functools.partial(
            _preprocessed, "ALE/MsPacman-v5", stack=0, frames=400, screen_size=64, grayscale_newaxis=True
        ),
        # Without Monitor: its episode record holds wall-clock time, which Gymnasium's infos batch.
        functools.partial(_sb3_factory, "BreakoutNoFrameskip-v4", monitor=False),
    ],
    ids=["preprocessing-stack", "preprocessing", "sb3-recipe"],
)
def test_gymnasium_face_matches_sync(no_leaks, fn, mode):
    from tests.vector_helpers import run_both

    with closing(shmvec.ShmVectorEnv([fn], start_method="fork")) as probe:
        assert probe.native_steps[0].path is not None, probe.native_steps
    ends = run_both((fn, fn), mode, n_envs=3, steps=250)
    assert ends, "no episode ended"


def test_pool_mode_each_env_matches_itself_alone(no_leaks):
    from tests.pool_helpers import check_trajectories, run_pool

    fn = functools.partial(_preprocessed, terminal_on_life_loss=True)
    with closing(shmvec.ShmVectorEnv([fn] * 4, start_method="fork", batch_size=2)) as env:
        assert all(s.path for s in env.native_steps)
        got, _ = run_pool(env, 200)
    check_trajectories(fn, got)


# ---------------------------------------------------------------- restart mode, allocation


def test_restart_mode_rebuilds_a_native_worker_and_the_others_go_on_exactly(no_leaks):
    fn = functools.partial(_sb3_factory, "BreakoutNoFrameskip-v4")
    ref = DummyVecEnv([fn] * 4)
    with ShmVecEnv([fn] * 4, start_method="fork", n_workers=2, on_crash="restart") as got, closing(ref):
        got.seed(2), ref.seed(2)
        assert np.array_equal(got.reset(), ref.reset())
        rng = np.random.default_rng(2)
        for t in range(120):
            if t == 60:
                os.kill(got.processes[0].pid, signal.SIGKILL)
            actions = rng.integers(0, 4, 4)
            obs, rewards, dones, infos = got.step(actions)
            w_obs, w_rewards, w_dones, w_infos = ref.step(actions)
            # Worker 1's envs (2, 3) never noticed.
            assert np.array_equal(obs[2:], w_obs[2:]) and np.array_equal(rewards[2:], w_rewards[2:]), t
        assert got.n_restarts == 1


def test_a_native_step_allocates_no_frame(no_leaks):
    """Each of 1,000 steps of a worker (``EnvGroup.step``, traced in the worker), resets aside (they
    go through the wrappers): the memory it allocates and frees again (tracemalloc's peak over what
    stays) holds no frame. Through the wrappers, every step allocates 210x160x3 screens."""
    fn = functools.partial(_traced, "PongNoFrameskip-v4")
    for native in (True, False):
        with ShmVecEnv([fn], start_method="fork", native_step=native, frame_stack=4) as env:
            env.reset()
            for _ in range(1000):
                env.step(np.array([2]))
            peaks = env.env_method("step_peaks")[0]
        assert len(peaks) >= 900, len(peaks)
        if native:
            assert max(peaks) < 84 * 84, max(peaks)
        else:
            assert min(peaks) > 210 * 160 * 3, min(peaks)


def _traced(env_id: str) -> gym.Env:
    """SB3's recipe, in a worker whose ``EnvGroup.step`` records its allocation peak per step (the
    steps that reset an env left out)."""
    import tracemalloc

    from shmvec.worker.envs import EnvGroup

    tracemalloc.start()
    peaks: list[int] = []
    step = EnvGroup.step

    def traced(self, msg):
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        reply = step(self, msg)
        if not any(reset_info is not None for _, _, reset_info in reply.items):
            peaks.append(tracemalloc.get_traced_memory()[1] - before)
        return reply

    EnvGroup.step = traced  # this worker process's class only
    env = _sb3_factory(env_id)
    env.step_peaks = lambda: peaks[50:]  # an instance attribute: the classes stay the recognised ones
    return env


# ---------------------------------------------------------------- the whole matrix (slow)

GAMES = ["Pong", "Breakout", "SpaceInvaders", "MsPacman", "Seaquest", "Qbert", "MontezumaRevenge"]


@pytest.mark.slow
@pytest.mark.parametrize("game", GAMES)
@pytest.mark.parametrize("seed", [0, 1])
def test_every_game(no_leaks, tmp_path, game, seed):
    run_sb3(f"{game}NoFrameskip-v4", tmp_path, steps=2500, seed=seed, frame_stack=4 if seed else None,
            env_kwargs={"max_episode_steps": 4000})  # fmt: skip


def test_a_game_whose_colours_are_not_the_palette_steps_through_its_wrappers():
    """The first native step checks the game's screen against the palette: colours that differ (a
    palette shmvec does not know) turn the path off before any frame was warped with it."""
    from shmvec.atari.sb3 import recognise

    env, ref = _sb3_factory("BreakoutNoFrameskip-v4"), _sb3_factory("BreakoutNoFrameskip-v4")
    native, _ = recognise(env)
    native.rgb = native.rgb[::-1].copy()  # another palette than the game's
    env.reset(seed=4), ref.reset(seed=4)
    out = np.zeros((84, 84, 1), np.uint8)
    for t in range(40):
        want = ref.step(t % 4)
        got = native.step_into(t % 4, out)
        assert np.array_equal(out, want[0]) and got[1:3] == want[2:4] and got[0] == want[1], t
    assert native.off is not None and "palette" in native.off
    env.close(), ref.close()
