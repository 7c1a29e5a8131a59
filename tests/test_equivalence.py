"""ShmVecEnv returns exactly what DummyVecEnv returns for the same seeds and actions."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

from shmvec import ShmVecEnv
from shmvec.synthetic import SyntheticImageEnv
from tests.envs import make_dict_env, make_tuple_env
from tests.helpers import assert_obs_equal, require, run_beside_dummy, sample_actions
from tests.vector_envs import OMITTED, OptionsRecorderEnv

ENVS = {
    "image": functools.partial(SyntheticImageEnv, (24, 20, 3), episode_len=(3, 9)),
    "dict": functools.partial(make_dict_env, 12, 8),
    "tuple": make_tuple_env,
}


@pytest.mark.parametrize("kind", sorted(ENVS))
@pytest.mark.parametrize("n_envs,n_workers", [(5, 2), (3, 3), (4, 1), (1, 1)])
def test_matches_dummy(no_leaks, kind, n_envs, n_workers):
    run_beside_dummy(ENVS[kind], n_envs, start_method="fork", n_workers=n_workers)


@pytest.mark.parametrize("kind", sorted(ENVS))
def test_matches_dummy_without_copy(no_leaks, kind):
    run_beside_dummy(ENVS[kind], 4, start_method="fork", n_workers=2, copy=False)


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_matches_dummy_other_start_methods(no_leaks, start_method):
    run_beside_dummy(ENVS["dict"], 3, steps=30, start_method=start_method, n_workers=2)


def test_episodes_end_both_ways():
    """The comparison above is only meaningful if both kinds of episode end happen in it."""
    env = SyntheticImageEnv((4, 4, 1), episode_len=(3, 9))
    env.reset(seed=7)
    ends = set()
    for _ in range(500):
        _, _, terminated, truncated, _ = env.step(0)
        if terminated or truncated:
            ends.add("terminated" if terminated else "truncated")
            env.reset()
    assert ends == {"terminated", "truncated"}


def test_terminal_observation_and_time_limit_flags(no_leaks):
    """Read the flags directly: terminal obs is the last obs of the episode, reset obs is returned."""
    fns = [functools.partial(SyntheticImageEnv, (6, 5, 1), episode_len=(2, 2))] * 2
    with ShmVecEnv(fns, "fork") as env:
        env.seed(0)
        first = env.reset()
        obs1, _, dones, infos = env.step(np.zeros(2, np.int64))
        assert not dones.any() and all(i["TimeLimit.truncated"] is False for i in infos)
        obs2, _, dones, infos = env.step(np.zeros(2, np.int64))
        assert dones.all() and dones.dtype == bool
        for i, info in enumerate(infos):
            term = info["terminal_observation"]
            # The terminal frame is the one after two steps: rows 1 and 2 changed since reset.
            assert not np.array_equal(term, first[i]) and not np.array_equal(term, obs1[i])
            assert term.base is None or term.base is not obs2  # a fresh array, not a view of the batch
    # What each env did on its own, stepped directly with the same seeds.
    for i, info in enumerate(infos):
        single = fns[i]()
        single.reset(seed=i)
        single.step(0)
        frame, _, terminated, truncated, _ = single.step(0)
        assert info["TimeLimit.truncated"] == (truncated and not terminated)
        np.testing.assert_array_equal(info["terminal_observation"], frame)


def test_matches_subproc_on_pong(no_leaks):
    require("ale_py", 'pip install -e ".[atari]"')
    from shmvec.bench.envs import env_factory

    fns = [env_factory("ALE/Pong-v5", max_episode_steps=60)] * 3
    ref = SubprocVecEnv(fns, start_method="fork")
    with ShmVecEnv(fns, "fork", n_workers=2, reward_dtype=np.float64) as env:
        ref.seed(1)
        env.seed(1)
        assert_obs_equal(env.reset(), ref.reset())
        rng = np.random.default_rng(0)
        for t in range(130):  # crosses two truncations at 60 steps
            actions = sample_actions(env.action_space, 3, rng)
            obs, rewards, dones, infos = env.step(actions)
            r_obs, r_rewards, r_dones, r_infos = ref.step(actions)
            assert_obs_equal(obs, r_obs, f"step {t}")
            np.testing.assert_array_equal(rewards, r_rewards)
            np.testing.assert_array_equal(dones, r_dones)
            for x, y in zip(infos, r_infos):
                assert x.keys() == y.keys()
                if "terminal_observation" in y:
                    assert_obs_equal(x["terminal_observation"], y["terminal_observation"])
                    assert x["TimeLimit.truncated"] == y["TimeLimit.truncated"] is True
    ref.close()


def test_reset_passes_options_to_the_envs_as_dummy_does(no_leaks):
    """The SB3 face keeps DummyVecEnv's rule: an env's reset gets ``options`` only when they were set
    and not empty (the Gymnasium face passes them always, as SyncVectorEnv: see test_vector_env)."""
    fns = [OptionsRecorderEnv] * 3
    ref = DummyVecEnv(fns)
    with ShmVecEnv(fns, start_method="fork", n_workers=2) as env:
        for options in (None, None, {}, {"level": 1}, [None, {"level": 2}, {}]):
            for vec in (env, ref):
                if options is not None:
                    vec.set_options(options)
                vec.reset()
        assert env.get_attr("received") == ref.get_attr("received")
        assert ref.get_attr("received")[1] == [OMITTED, OMITTED, OMITTED, {"level": 1}, {"level": 2}]
    ref.close()
