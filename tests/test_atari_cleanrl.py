"""CleanRL's ``ppo_atari.py`` chain, stepped natively on the Gymnasium face, gives exactly what
``gymnasium.vector.SyncVectorEnv`` gives over the same factories.

Compared array for array at every step: observations, rewards, terminations, truncations, the
infos with their masks (RecordEpisodeStatistics' ``episode`` ``r`` and ``l``; its wall-clock ``t``
is left out, as shmvec.testing always leaves it out), then the wrappers' state read back with
``get_attr`` (RecordEpisodeStatistics' sums, count and queues, its ``time_queue`` aside; the lives,
the max buffer, the frame stack).
"""

from __future__ import annotations

import functools
from contextlib import closing

import ale_py  # the atari extra: a core install (tests/core_suite.py) leaves this module out
import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.atari_wrappers import (
    ClipRewardEnv,
    EpisodicLifeEnv,
    FireResetEnv,
    MaxAndSkipEnv,
    NoopResetEnv,
)

import shmvec
from shmvec.testing.compare import InfoKeys, gymnasium_difference
from shmvec.testing.equivalence import sync_vector_env
from shmvec.vector_env import AutoresetMode
from tests.helpers import not_checked

# What get_attr must read as the wrappers leave it (RecordEpisodeStatistics' time_queue: wall clock).
STATE = (
    "episode_returns",
    "episode_lengths",
    "episode_count",
    "return_queue",
    "length_queue",
    "lives",
    "was_real_done",
    "_obs_buffer",
    "stacked_obs",
)


def cleanrl(
    env_id: str,
    size: tuple[int, int] = (84, 84),
    extra: bool = False,
    stack: int = 4,
    keep_dim: bool = False,
    **make,
) -> gym.Env:
    """``make_env``'s thunk of CleanRL's ``ppo_atari.py`` (capture_video off), with Gymnasium 1.x's
    names (``GrayscaleObservation``, ``FrameStackObservation``); ``size``: ResizeObservation's;
    ``extra``: a reward wrapper more, inside the chain; ``stack``: FrameStackObservation's size (0:
    none); ``keep_dim``: GrayscaleObservation's; ``make``: ``gym.make``'s keywords."""
    gym.register_envs(ale_py)
    env = gym.make(env_id, **make)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = NoopResetEnv(env, noop_max=30)
    env = MaxAndSkipEnv(env, skip=4)
    env = EpisodicLifeEnv(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireResetEnv(env)
    env = ClipRewardEnv(env)
    if extra:
        env = gym.wrappers.TransformReward(env, lambda r: r)
    env = gym.wrappers.ResizeObservation(env, size)
    env = gym.wrappers.GrayscaleObservation(env, keep_dim=keep_dim)
    return gym.wrappers.FrameStackObservation(env, stack) if stack else env


def run(fn, n_envs: int, steps: int, seed: int = 0, ref_seed: int | None = None, **options):
    """ShmVectorEnv and SyncVectorEnv (NEXT_STEP autoreset) over ``fn``, the same random actions;
    an explicit reset half-way. Returns (the first difference or None, native_steps, episodes
    ended: game overs (RecordEpisodeStatistics' record), other terminations, truncations)."""
    options.setdefault("start_method", "fork")
    options.setdefault("n_workers", 2)
    mode = AutoresetMode.NEXT_STEP
    ref = sync_vector_env([fn] * n_envs, mode)
    got = shmvec.ShmVectorEnv([fn] * n_envs, autoreset_mode=mode, **options)
    ends = {"game over": 0, "life lost": 0, "truncated": 0}
    ignore = InfoKeys()  # ("episode", "t") always: wall clock
    space = ref.single_observation_space
    with closing(got), closing(ref):
        statuses = got.native_steps
        ref_seed = seed if ref_seed is None else ref_seed
        if d := gymnasium_difference(got.reset(seed=seed), ref.reset(seed=ref_seed), ignore, space, n_envs):
            return f"reset: {d}", statuses, ends
        rng = np.random.default_rng(seed)
        for t in range(steps):
            if t == steps // 2 and (
                d := gymnasium_difference(got.reset(), ref.reset(), ignore, space, n_envs)
            ):
                return f"reset at {t}: {d}", statuses, ends
            actions = rng.integers(0, ref.single_action_space.n, n_envs)
            want = ref.step(actions)
            if d := gymnasium_difference(got.step(actions), want, ignore, space, n_envs):
                return f"step {t}: {d}", statuses, ends
            episode = want[4].get("_episode", np.zeros(n_envs, bool))  # recorded: a game's end
            ends["game over"] += int((episode & want[2]).sum())
            ends["life lost"] += int((want[2] & ~episode).sum())
            ends["truncated"] += int(want[3].sum())
        for name in (n for n in STATE if ref.envs[0].has_wrapper_attr(n)):
            for i, (x, y) in enumerate(zip(got.get_attr(name), ref.get_attr(name))):
                if not np.array_equal(np.asarray(x), np.asarray(y)):
                    return f"get_attr({name!r}) of env {i}: {x} != {y}", statuses, ends
    return None, statuses, ends


@pytest.mark.parametrize(
    "fn,steps",
    [
        (functools.partial(cleanrl, "PongNoFrameskip-v4"), 2000),
        # TimeLimit of 800 frames (200 steps): game overs, lost lives and truncations in one run.
        (functools.partial(cleanrl, "BreakoutNoFrameskip-v4", max_episode_steps=800), 1500),
    ],
    ids=["pong", "breakout"],
)
def test_cleanrl_chain_is_native_and_exact(no_leaks, fn, steps):
    difference, statuses, ends = run(fn, n_envs=4, steps=steps)
    assert [s.path for s in statuses] == ["cleanrl-atari+frame-stack-observation"] * 4, statuses
    assert difference is None, difference
    assert ends["game over"] >= 2, ends
    if "Breakout" in fn.args[0]:
        assert ends["life lost"] and ends["truncated"], ends


def test_a_changed_seed_is_caught(no_leaks):
    fn = functools.partial(cleanrl, "BreakoutNoFrameskip-v4")
    difference, statuses, _ = run(fn, n_envs=2, steps=200, ref_seed=1)
    assert statuses[0].path is not None
    assert difference is not None


def _sb3_stacked() -> gym.Env:
    """SB3's recipe (no Monitor: its record is wall-clock) under Gymnasium's FrameStackObservation."""
    from stable_baselines3.common.atari_wrappers import AtariWrapper

    gym.register_envs(ale_py)
    return gym.wrappers.FrameStackObservation(AtariWrapper(gym.make("BreakoutNoFrameskip-v4")), 4)


@pytest.mark.parametrize(
    "fn,path",
    [
        (functools.partial(cleanrl, "BreakoutNoFrameskip-v4", stack=0), "cleanrl-atari"),
        (
            functools.partial(cleanrl, "BreakoutNoFrameskip-v4", keep_dim=True),
            "cleanrl-atari+frame-stack-observation",
        ),
        (_sb3_stacked, "sb3-atari+frame-stack-observation"),
        (
            functools.partial(cleanrl, "ALE/Breakout-v5", frameskip=1, size=(64, 96)),
            "cleanrl-atari+frame-stack-observation",
        ),
    ],
    ids=["no-stack", "v5-sticky-64x96", "keep-dim", "sb3-recipe-stacked"],
)
def test_variants_are_native_and_exact(no_leaks, fn, path):
    difference, statuses, ends = run(fn, n_envs=2, steps=400)
    assert statuses[0].path == path, statuses
    assert difference is None, difference
    assert ends["life lost"], ends


def test_an_episode_cut_before_the_max_pools_frames_goes_through_the_wrappers_functions(no_leaks):
    """A TimeLimit of 30 frames cuts episodes in the first step after a reset, before MaxAndSkipEnv
    has both frames of its max (about one step in 30 here): its buffer, as the reset's steps left
    it, goes through ResizeObservation's and GrayscaleObservation's own functions."""
    fn = functools.partial(cleanrl, "BreakoutNoFrameskip-v4", max_episode_steps=30)
    difference, statuses, ends = run(fn, n_envs=2, steps=300)
    assert statuses[0].path is not None, statuses
    assert difference is None, difference
    assert ends["truncated"] > 100, ends


@pytest.mark.sb3
def test_sb3_face_is_native_and_exact(no_leaks):
    """The same factories under ShmVecEnv against DummyVecEnv (terminal observations included)."""
    from tests.helpers import equivalent_with_statuses

    fn = functools.partial(cleanrl, "BreakoutNoFrameskip-v4", max_episode_steps=800)
    statuses = equivalent_with_statuses([fn, fn], 400)
    assert [s.path for s in statuses] == ["cleanrl-atari+frame-stack-observation"] * 2, statuses


@pytest.mark.parametrize(
    "fn,reason",
    [
        # 210x160 -> 105x80 halves both axes: OpenCV's integer fast path, which shmvec does not restate.
        (functools.partial(cleanrl, "BreakoutNoFrameskip-v4", size=(105, 80)), "INTER_AREA"),
        (functools.partial(cleanrl, "BreakoutNoFrameskip-v4", extra=True), "TransformReward"),
    ],
    ids=["integer-scale-resize", "extra-wrapper"],
)
def test_chains_that_differ_step_through_their_wrappers(no_leaks, fn, reason):
    difference, statuses, _ = run(fn, n_envs=2, steps=150)
    assert all(s.path is None and reason in s.reason for s in statuses), statuses
    assert difference is None, difference


def test_code_it_was_not_checked_against_steps_through_the_wrappers(no_leaks, monkeypatch):
    """GrayscaleObservation's observation function is a lambda of its __init__: another version of
    that __init__ is not restated."""
    name = "gymnasium.wrappers.transform_observation.GrayscaleObservation.__init__"
    not_checked(monkeypatch, name)
    with pytest.warns(shmvec.NativeStepWarning, match=name):
        difference, statuses, _ = run(
            functools.partial(cleanrl, "BreakoutNoFrameskip-v4"), n_envs=2, steps=30
        )
    assert statuses[0].path is None and name in statuses[0].reason, statuses
    assert difference is None, difference


def test_a_replaced_observation_function_steps_through_the_wrappers(no_leaks):
    def fn():
        env = cleanrl("BreakoutNoFrameskip-v4")
        env.env.func = lambda obs: (np.asarray(obs, np.float64).mean(axis=-1)).astype(np.uint8)
        return env

    difference, statuses, _ = run(fn, n_envs=2, steps=30)
    assert statuses[0].path is None and "func" in statuses[0].reason, statuses
    assert difference is None, difference


@pytest.mark.slow
@pytest.mark.parametrize("game", ["Pong", "Breakout", "SpaceInvaders", "MsPacman", "Seaquest", "Qbert"])
def test_every_game(no_leaks, game):
    fn = functools.partial(cleanrl, f"{game}NoFrameskip-v4", max_episode_steps=20000)
    difference, statuses, ends = run(fn, n_envs=4, steps=3000, seed=1)
    assert statuses[0].path == "cleanrl-atari+frame-stack-observation", statuses
    assert difference is None, difference
    assert sum(ends.values()), ends
