"""The Gymnasium face against Gymnasium itself where issue 24 found it differed: Tuple, Dict and nested
action spaces (every env gets exactly the action SyncVectorEnv gives it, in ``step`` and in pool
mode's ``send``; the SB3 face as DummyVecEnv), ``np_random_seed`` per env, the element types of
``final_obs`` (and of SB3's ``terminal_observation``), and the error types Gymnasium raises.

Results are compared strictly: arrays by dtype, shape and content, everything else by type and value
(``np.int64(2)`` is not ``2``), infos key by key. Every test that builds a vector env uses
``no_leaks``.
"""

from __future__ import annotations

import functools
from contextlib import closing
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.error import ClosedEnvironmentError
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_space
from stable_baselines3.common.vec_env import DummyVecEnv

import shmvec
from shmvec import ShmVecEnv, ShmVectorEnv, SpaceMismatchError
from tests.vector_envs import ActionEchoEnv, ScalarLeavesEnv
from tests.vector_helpers import assert_value_equal

NEXT, SAME = AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP

# name -> (single action space, number of envs)
ACTION_SPACES = {
    # As many parts as envs: the batch has num_envs "actions" along its first level, so splitting
    # that level instead of each leaf went unnoticed (env 0 got both envs' first parts).
    "tuple-as-many-parts-as-envs": (spaces.Tuple((spaces.Discrete(4), spaces.Discrete(5, start=2))), 2),
    "dict": (
        spaces.Dict(
            {
                "move": spaces.Discrete(3),
                "force": spaces.Box(-1.0, 1.0, (2,), np.float32),
                "keys": spaces.MultiDiscrete([2, 3]),
            }
        ),
        3,
    ),
    "dict-in-tuple": (
        spaces.Tuple(
            (
                spaces.Dict({"a": spaces.Discrete(3), "b": spaces.Box(0.0, 1.0, (3,), np.float64)}),
                spaces.MultiDiscrete([4, 2]),
                spaces.Discrete(2),
            )
        ),
        3,
    ),
}


def echo_fns(name: str) -> list:
    space, n = ACTION_SPACES[name]
    return [functools.partial(ActionEchoEnv, space)] * n


def take(batch: Any, k: int) -> Any:
    """Env ``k``'s part of a batched action, as a batch of one (each leaf's row ``k``), built
    without Gymnasium's ``iterate`` so the reference does not share the code under test."""
    if isinstance(batch, dict):
        return {key: take(value, k) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(take(value, k) for value in batch)
    return batch[k : k + 1]


# ---------------------------------------------------------------- step() against SyncVectorEnv


@pytest.mark.parametrize("mode", [NEXT, SAME], ids=lambda m: m.name)
@pytest.mark.parametrize("name", sorted(ACTION_SPACES))
def test_step_actions_match_sync(no_leaks, name, mode):
    """Batches of ``action_space.sample()`` (the docs' loop): every step's results and every action
    each env received equal SyncVectorEnv's, types included."""
    fns = echo_fns(name)
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    env = ShmVectorEnv(fns, autoreset_mode=mode, start_method="fork", n_workers=2)
    ended = np.zeros(len(fns), bool)
    with closing(env), closing(ref):
        assert env.action_space == ref.action_space
        assert_value_equal(env.reset(seed=11), ref.reset(seed=11), "reset")
        env.action_space.seed(11)
        for t in range(24):
            actions = env.action_space.sample()
            want = ref.step(actions)
            assert_value_equal(env.step(actions), want, f"step {t}")
            ended |= want[2] | want[3]
        assert ended.all(), "every env must end an episode for the autoreset paths to count"
        assert_value_equal(env.get_attr("received"), ref.get_attr("received"), "received")


def test_step_takes_sequences_of_leaves_as_sync(no_leaks):
    """Leaves given as lists, not arrays: split the same way (Gymnasium's ``iterate``)."""
    fns = echo_fns("tuple-as-many-parts-as-envs")
    ref = SyncVectorEnv(fns)
    with closing(ShmVectorEnv(fns, start_method="fork", n_workers=2)) as env, closing(ref):
        env.reset(seed=1)
        ref.reset(seed=1)
        for actions in [([3, 0], [2, 6]), ([1, 2], np.array([4, 5]))]:
            assert_value_equal(env.step(actions), ref.step(actions), f"step {actions}")
        assert_value_equal(env.get_attr("received"), ref.get_attr("received"), "received")


def test_malformed_action_batches_are_refused(no_leaks):
    """A Dict batch without one of its keys, or a batch of the wrong number of envs: a ValueError
    that names the space, and the env stays usable."""
    fns = echo_fns("dict")
    with closing(ShmVectorEnv(fns, start_method="fork", n_workers=2)) as env:
        env.reset(seed=0)
        good = env.action_space.sample()
        with pytest.raises(ValueError, match="actions must be a batch of Dict"):
            env.step({k: v for k, v in good.items() if k != "force"})
        short = batch_space(env.single_action_space, 2).sample()
        with pytest.raises(ValueError, match="expected 3 actions"):
            env.step(short)
        env.step(good)
        assert len(env.get_attr("received")[0]) == 1


# ---------------------------------------------------------------- pool mode's send(actions, env_ids)


@pytest.mark.parametrize("name", sorted(ACTION_SPACES))
def test_pool_send_actions_match_each_env_alone(no_leaks, name):
    """Pool mode, batches of 2 of 4 envs, ``send`` with explicit ``env_ids`` (in the batch's order and
    reversed): each env's observations, rewards and flags, and the actions it received, equal those of
    the same env in a SyncVectorEnv of its own given its part of each batch."""
    single, _ = ACTION_SPACES[name]
    fns = [functools.partial(ActionEchoEnv, single)] * 4
    refs = [SyncVectorEnv([fn]) for fn in fns]
    last = {i: ref.reset(seed=20 + i)[0] for i, ref in enumerate(refs)}
    results: dict[int, tuple] = {}
    batches = batch_space(single, 2)
    batches.seed(20)
    env = ShmVectorEnv(fns, batch_size=2, n_workers=2, pool_order="deterministic", start_method="fork")
    with closing(env):
        env.async_reset(seed=20)
        for t in range(22):  # the last two batches are only received: none stays in flight
            obs, rewards, terminations, truncations, infos = env.recv()
            ids = infos["env_id"]
            for k, i in enumerate(ids.tolist()):
                where = f"recv {t}, env {i}"
                assert_value_equal(obs[k], last[i][0], f"{where} obs")
                if i in results:
                    got = (rewards[k], terminations[k], truncations[k])
                    assert_value_equal(got, results[i], f"{where} reward/flags")
            if t >= 20:
                continue
            order = ids if t % 2 else ids[::-1].copy()
            actions = batches.sample()
            env.send(actions, order)
            for k, i in enumerate(order.tolist()):
                o, r, term, trunc, _ = refs[i].step(take(actions, k))
                last[i] = o
                results[i] = (r[0], term[0], trunc[0])
        received = env.get_attr("received")
    for i, ref in enumerate(refs):
        assert_value_equal(received[i], ref.get_attr("received")[0], f"env {i} received")
        assert len(received[i]) >= 4
        ref.close()


# ---------------------------------------------------------------- the SB3 face


@pytest.mark.parametrize("name", sorted(ACTION_SPACES))
def test_sb3_face_actions_match_dummy(no_leaks, name):
    """ShmVecEnv takes what SB3's VecEnvs take: a sequence of per-env actions (``actions[i]``, here
    tuples and dicts); results and received actions equal DummyVecEnv's."""
    fns = echo_fns(name)
    single, n = ACTION_SPACES[name]
    ref = DummyVecEnv(fns)
    env = ShmVecEnv(fns, start_method="fork", n_workers=2)
    with closing(env), closing(ref):
        env.seed(3)
        ref.seed(3)
        assert_value_equal(env.reset(), ref.reset(), "reset")
        single.seed(3)
        for t in range(16):
            actions = [single.sample() for _ in range(n)]
            assert_value_equal(env.step(actions), ref.step(actions), f"step {t}")
        assert_value_equal(env.get_attr("received"), ref.get_attr("received"), "received")


# ---------------------------------------------------------------- seeds, final_obs, errors


def test_np_random_seed_is_per_env(no_leaks):
    """A tuple of each env's seed, and copies of each env's generator, as SyncVectorEnv returns."""
    fns = [functools.partial(ScalarLeavesEnv)] * 3
    ref = SyncVectorEnv(fns)
    with closing(ShmVectorEnv(fns, start_method="fork", n_workers=2)) as env, closing(ref):
        env.reset(seed=42)
        ref.reset(seed=42)
        assert_value_equal(env.np_random_seed, ref.np_random_seed, "np_random_seed")
        assert env.np_random_seed == (42, 43, 44)
        env.reset()  # no seed: the seeds stay
        ref.reset()
        assert_value_equal(env.np_random_seed, ref.np_random_seed, "np_random_seed after reset()")
        got, want = env.np_random, ref.np_random
        assert type(got) is tuple and len(got) == 3
        for i, (g, w) in enumerate(zip(got, want)):
            assert g.bit_generator.state == w.bit_generator.state, f"env {i}'s np_random"


@pytest.mark.parametrize("dict_obs", [False, True], ids=["int", "dict"])
def test_final_obs_element_types_match_sync(no_leaks, dict_obs):
    """SAME_STEP: ``final_obs`` holds what each env returned, element types included (a Python int
    stays an int, an np.int64 an np.int64, a 0-d array a 0-d array, float64 values for a float32 Box
    stay float64), as in SyncVectorEnv and AsyncVectorEnv."""
    fns = [functools.partial(ScalarLeavesEnv, dict_obs)] * 3
    ref = SyncVectorEnv(fns, autoreset_mode=SAME)
    finals = 0
    with (
        closing(ShmVectorEnv(fns, autoreset_mode=SAME, start_method="fork", n_workers=2)) as env,
        closing(ref),
    ):
        assert_value_equal(env.reset(seed=4), ref.reset(seed=4), "reset")
        for t in range(12):
            actions = np.array([t % 2] * 3)
            want = ref.step(actions)
            assert_value_equal(env.step(actions), want, f"step {t}")
            finals += int(want[4].get("_final_obs", np.zeros(3, bool)).sum())
    assert finals >= 6


def test_sb3_terminal_observation_types_match_dummy(no_leaks):
    """The SB3 face: ``infos[i]["terminal_observation"]`` as DummyVecEnv gives it (the env's own
    values); ``reset_infos`` without shmvec's own key."""
    fns = [functools.partial(ScalarLeavesEnv)] * 3
    ref = DummyVecEnv(fns)
    with closing(ShmVecEnv(fns, start_method="fork", n_workers=2)) as env, closing(ref):
        env.seed(6)
        ref.seed(6)
        env.reset()
        ref.reset()
        for t in range(12):
            actions = np.array([t % 2] * 3)
            got, want = env.step(actions), ref.step(actions)
            assert_value_equal(got, want, f"step {t}")
            assert_value_equal(env.reset_infos, ref.reset_infos, f"reset_infos after step {t}")


def test_mismatched_spaces_raise_what_gymnasium_raises(no_leaks):
    """Gymnasium raises RuntimeError for envs whose spaces differ; shmvec's error is that and still
    the ValueError it was."""
    fns = [functools.partial(ScalarLeavesEnv, True), functools.partial(ScalarLeavesEnv, False)]
    with pytest.raises(RuntimeError):
        SyncVectorEnv(fns)
    with pytest.raises(SpaceMismatchError, match="all envs must have the same spaces") as caught:
        ShmVectorEnv(fns, start_method="fork")
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, RuntimeError)


@pytest.mark.parametrize("face", ["gymnasium", "sb3"])
def test_closed_env_raises_gymnasiums_closed_error(no_leaks, face):
    fns = [functools.partial(ScalarLeavesEnv)] * 2
    env: Any = (ShmVectorEnv if face == "gymnasium" else ShmVecEnv)(fns, start_method="fork")
    env.close()
    with pytest.raises(ClosedEnvironmentError):
        env.reset()
    with pytest.raises(shmvec.ClosedError):
        env.step(np.zeros(2, np.int64))


def test_gymnasium_make_vec_like_loop(no_leaks):
    """The docs' loop, ``envs.step(envs.action_space.sample())``, on a registered Tuple-action env
    made by ``shmvec.make_vec`` (Blackjack has a Tuple observation and a Discrete action; the Tuple
    action comes from wrapping it)."""
    wrap = functools.partial(_TupleActions)
    with closing(shmvec.make_vec("Blackjack-v1", 2, wrappers=[wrap], start_method="fork")) as env:
        ref = gym.make_vec("Blackjack-v1", 2, vectorization_mode="sync", wrappers=[wrap])
        with closing(ref):
            assert_value_equal(env.reset(seed=9), ref.reset(seed=9), "reset")
            env.action_space.seed(9)
            for t in range(10):
                actions = env.action_space.sample()
                assert_value_equal(env.step(actions), ref.step(actions), f"step {t}")


class _TupleActions(gym.ActionWrapper):
    """A Tuple(Discrete(2), Discrete(2)) action whose first part is the env's action."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.action_space = spaces.Tuple((spaces.Discrete(2), spaces.Discrete(2)))

    def action(self, action: Any) -> Any:
        return int(action[0])
