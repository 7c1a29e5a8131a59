"""Observation spaces without a fixed size (Text, Sequence, Graph, OneOf, custom spaces), alone or at
a key of a Dict or an index of a Tuple: their values travel pickled in the workers' replies, every
fixed-size leaf stays in the ring.

Compared with SyncVectorEnv step for step in every autoreset mode (observations, ``final_obs``,
infos), in pool mode with each env stepped alone, on SB3's face with each env's own values, across
masked resets and restarts, and with the real MiniGrid when it is installed.
"""

from __future__ import annotations

import functools
import threading
from contextlib import closing

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv

from shmvec import EnvError, ShmVecEnv
from shmvec.engine.restart import restart_seed
from tests.helpers import assert_obs_equal, require
from tests.object_envs import SPACES, TEXT_IN_DICT, make_faulty_mission, make_object_env
from tests.pool_helpers import check_trajectories, run_pool
from tests.vector_envs import CopyOutputs
from tests.vector_helpers import (
    ACTIONS,
    DISABLED,
    NEXT,
    SAME,
    assert_reset_equal,
    assert_restarted,
    assert_step_equal,
    make,
    run_both,
)

MODES = [NEXT, SAME, DISABLED]


@pytest.mark.parametrize("kind", sorted(SPACES))
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_matches_sync(no_leaks, kind, mode):
    fn = functools.partial(make_object_env, kind)
    ends = run_both((fn, fn), mode)
    assert ends == {"terminated", "truncated"}


def _copied(kind: str, reuse: bool) -> gym.Env:
    return CopyOutputs(make_object_env(kind, reuse))


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_env_that_reuses_its_objects(no_leaks, mode):
    """An env that changes its observation object in place in reset: the terminal value is the one
    the step returned (the worker copies it before the reset)."""
    fns = (
        functools.partial(make_object_env, "sequence-stacked", True),
        functools.partial(_copied, "sequence-stacked", True),
    )
    run_both(fns, mode)


def test_batched_form_is_syncs(no_leaks):
    """A tuple of the envs' values per object leaf, inside Dict and Tuple as at the top, as
    gymnasium.vector.utils.concatenate builds it."""
    for kind, get in [
        ("text", lambda o: o),
        ("text-in-dict", lambda o: o["mission"]),
        ("text-in-tuple", lambda o: o[1]),
    ]:
        fn = functools.partial(make_object_env, kind)
        with closing(make([fn] * 3)) as env, closing(SyncVectorEnv([fn] * 3)) as ref:
            got, want = env.reset(seed=1)[0], ref.reset(seed=1)[0]
            assert type(get(got)) is tuple and get(got) == get(want), kind
            assert all(type(v) is str for v in get(got)), kind


def test_other_options_touch_fixed_leaves_only(no_leaks):
    """A codec encodes the fixed-size leaves, check_finite checks them; object leaves go by as they are."""
    fn = functools.partial(make_object_env, "text-in-dict")
    run_both((fn, fn), SAME, codec="lz4", check_finite=True, copy=False, n_slots=3)


def test_codec_mapping_naming_an_object_leaf_is_refused(no_leaks):
    with pytest.raises(
        ValueError, match=r"codec mapping names 'mission', an observation key whose space has no fixed size"
    ):
        make([TEXT_IN_DICT] * 2, codec={"mission": "lz4"})


def test_pool_mode_each_env_as_alone(no_leaks):
    with closing(make([TEXT_IN_DICT] * 6, batch_size=2, n_workers=3)) as env:
        got, _ = run_pool(env, batches=30, each=8)
    check_trajectories(TEXT_IN_DICT, got)


@pytest.mark.parametrize("kind", ["text", "text-in-dict", "graph"])
def test_sb3_face_gives_object_arrays_of_each_envs_values(no_leaks, kind):
    """SB3's face: a 1-d object array per object leaf (DummyVecEnv cannot hold these spaces), and
    ``terminal_observation`` as the env returned it; compared with each env run alone, SB3's way."""
    fn = functools.partial(make_object_env, kind)
    n = 3
    alone = [fn() for _ in range(n)]
    want_obs = [e.reset(seed=7 + i)[0] for i, e in enumerate(alone)]
    venv = ShmVecEnv([fn] * n, "fork", n_workers=2)
    ends = 0
    with closing(venv):
        venv.seed(7)

        def check(obs, where):
            for path, pick in (
                [((), lambda o: o)]
                if kind != "text-in-dict"
                else [(("mission",), lambda o: o["mission"]), (("image",), lambda o: o["image"])]
            ):
                got = pick(obs)
                if path == ("image",):
                    assert_obs_equal(got, np.stack([pick(o) for o in want_obs]), where)
                    continue
                assert isinstance(got, np.ndarray) and got.dtype == object and got.shape == (n,), where
                for i in range(n):
                    assert_obs_equal(got[i], pick(want_obs[i]), f"{where} env {i}")

        check(venv.reset(), "reset")
        for t in range(20):
            actions = np.array([(t + i) % 3 for i in range(n)])
            obs, rewards, dones, infos = venv.step(actions)
            for i, e in enumerate(alone):
                o, r, term, trunc, _ = e.step(actions[i])
                assert (rewards[i], dones[i]) == (np.float32(r), term or trunc), f"step {t} env {i}"
                if term or trunc:
                    ends += 1
                    assert_obs_equal(
                        infos[i]["terminal_observation"], o, f"step {t} env {i} terminal", ordered=False
                    )
                    o, _ = e.reset()
                want_obs[i] = o
            check(obs, f"step {t}")
    assert ends > 3


@pytest.mark.parametrize("mode", [NEXT, SAME], ids=lambda m: m.name)
def test_masked_reset_keeps_the_last_values_of_the_others(no_leaks, mode):
    fn = functools.partial(make_object_env, "text-in-dict")
    with (
        closing(make([fn] * 4, autoreset_mode=mode)) as env,
        closing(SyncVectorEnv([fn] * 4, autoreset_mode=mode)) as ref,
    ):
        assert_reset_equal(env.reset(seed=0), ref.reset(seed=0), "reset")
        for t in range(6):
            if t in (2, 4):
                mask = np.array([t == 2, True, False, t == 4])
                got = env.reset(seed=[30 + t] * 4, options={"reset_mask": mask.copy()})
                assert_reset_equal(
                    got, ref.reset(seed=[30 + t] * 4, options={"reset_mask": mask}), f"masked reset {t}"
                )
            actions = np.array([t % 3, 1, 2, 0])
            assert_step_equal(env.step(actions), ref.step(actions), f"step {t}")


MISSION = make_faulty_mission


def _victim_fns() -> list:
    """4 envs on 2 workers; env 3 is killed at its third step."""
    return [MISSION] * 3 + [functools.partial(MISSION, fault="kill", at=3, where="step")]


@pytest.mark.timeout(120)
def test_restart_next_step_carries_the_last_values(no_leaks):
    """A killed worker's envs end their episode with the last observation the agent saw, its
    mission string included; their next step starts a new episode with a new one."""
    with closing(make(_victim_fns(), on_crash="restart")) as env:
        obs, _ = env.reset(seed=0)
        for t in range(1, 5):
            prev = obs
            obs, rewards, terminations, truncations, infos = env.step(ACTIONS)
            if t == 3:
                assert truncations[2:].all() and not terminations[2:].any()
                assert obs["mission"][2:] == prev["mission"][2:] == ("step 2 reset 1",) * 2
                assert_obs_equal(obs["image"][2:], prev["image"][2:], "carried image")
                assert_restarted(infos, [2, 3], "kill", "step")
            elif t == 4:
                assert obs["mission"][2:] == ("step 0 reset 1",) * 2  # new envs, reset
        assert obs["mission"][:2] == ("step 4 reset 1",) * 2


@pytest.mark.timeout(120)
def test_restart_same_step_last_values_are_the_final_obs(no_leaks):
    with closing(make(_victim_fns(), on_crash="restart", autoreset_mode=SAME)) as env:
        obs, _ = env.reset(seed=0)
        for _ in range(2):
            obs, *_ = env.step(ACTIONS)
        new_obs, _, _, truncations, infos = env.step(ACTIONS)
        assert truncations.tolist() == [False, False, True, True]
        for i in (2, 3):
            final = infos["final_obs"][i]
            assert final["mission"] == obs["mission"][i] == "step 2 reset 1"
            assert_obs_equal(final["image"], obs["image"][i], f"final_obs[{i}]")
            first, _ = make_faulty_mission().reset(seed=restart_seed(i, 1))
            assert new_obs["mission"][i] == first["mission"] == "step 0 reset 1"
            assert_obs_equal(new_obs["image"][i], first["image"], f"obs[{i}]")
        assert new_obs["mission"][:2] == ("step 3 reset 1",) * 2


class _LockBag(gym.Env):
    observation_space = spaces.Dict({"x": spaces.Discrete(2), "bag": spaces.Sequence(spaces.Discrete(2))})
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return {"x": 0, "bag": ()}, {}

    def step(self, action):
        return {"x": 1, "bag": (threading.Lock(),)}, 0.0, False, False, {}


def test_unpicklable_object_value_names_the_env(no_leaks):
    with ShmVecEnv([_LockBag] * 2, "fork", n_workers=1) as env:
        env.reset()
        with pytest.raises(
            EnvError, match=r"env 0: observation holds a builtins.tuple that cannot be pickled"
        ):
            env.step(np.zeros(2, np.int64))


@pytest.mark.slow  # CI installs MiniGrid for its slow stage only
def test_real_minigrid_default_observation(no_leaks):
    """MiniGrid's default Dict(direction, image, mission) observation, no wrappers."""
    require("minigrid", "pip install minigrid")
    fn = functools.partial(gym.make, "MiniGrid-Empty-5x5-v0", max_steps=12)
    for mode in (NEXT, SAME):
        ends = run_both((fn, fn), mode, n_envs=3, steps=40)
        assert "truncated" in ends


@pytest.mark.timeout(120)
def test_restart_in_reset_gives_the_retried_resets_values(no_leaks):
    fns = [MISSION] * 3 + [functools.partial(MISSION, fault="kill", at=2, where="reset")]
    with closing(make(fns, on_crash="restart")) as env, closing(SyncVectorEnv([MISSION] * 4)) as ref:
        env.reset(seed=0)
        ref.reset(seed=0)
        env.step(ACTIONS)
        ref.step(ACTIONS)
        obs, infos = env.reset(seed=10)
        assert_restarted(infos, [2, 3], "kill", "reset")
        r_obs, _ = ref.reset(seed=10)
        assert_obs_equal(obs["image"], r_obs["image"], "image")  # the same seeds
        # The rebuilt envs are new: no step yet, their one reset the retried one.
        assert obs["mission"] == ("step 1 reset 2",) * 2 + ("step 0 reset 1",) * 2
