"""Typed info columns (:mod:`shmvec.memory.infos`): the info dicts are the ones DummyVecEnv / SyncVectorEnv
give (keys, order, exact types, values) whichever way each value travelled, and the typed path is
really taken (the ring's flags say so) where the infos allow it."""

from __future__ import annotations

import functools
import os
import signal
from typing import Any

import numpy as np
import pytest
from stable_baselines3.common.vec_env import DummyVecEnv

from shmvec import ShmVecEnv
from shmvec.engine.restart import REASON_KEY, RESTARTED_KEY
from shmvec.memory.infos import InfoSchema, learn
from tests import vector_helpers
from tests.helpers import assert_obs_equal, require, sample_actions
from tests.info_envs import make_info_env, stable_info

SB3_KEYS = ("TimeLimit.truncated", "terminal_observation")


def assert_info_identical(got: dict, want: dict, where: str) -> None:
    """Same keys in the same order; values of exactly the same type and equal (Monitor's wall-clock
    ``t`` only by type)."""
    assert list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
    for key, value in want.items():
        at = f"{where}[{key!r}]"
        if key == "terminal_observation":
            assert_obs_equal(got[key], value, at)
        elif key == "episode":
            assert {k: type(v) for k, v in got[key].items()} == {k: type(v) for k, v in value.items()}, at
            assert (got[key]["r"], got[key]["l"]) == (value["r"], value["l"]), at
        else:
            assert type(got[key]) is type(value), f"{at}: {type(got[key])} is not {type(value)}"
            assert got[key] == value, f"{at}: {got[key]!r} != {value!r}"


def typed_flags(venv: ShmVecEnv) -> np.ndarray:
    """Per env, whether its info in the batch just returned came through the typed columns."""
    columns = venv._eng.typed_infos.columns
    if columns is None:
        return np.zeros(venv.num_envs, bool)
    return np.frombuffer(columns.last, np.uint8).astype(bool)


def run_against_dummy(fn, n_envs: int = 4, steps: int = 40, seed: int = 5, **kwargs) -> np.ndarray:
    """Step ShmVecEnv (2 workers, fork) and DummyVecEnv alike; compare every info; the flags per step."""
    kwargs.setdefault("n_workers", 2)
    venv = ShmVecEnv([fn] * n_envs, "fork", **kwargs)
    ref = DummyVecEnv([fn] * n_envs)
    flags = []
    try:
        for env in (venv, ref):
            env.seed(seed)
        assert_obs_equal(venv.reset(), ref.reset())
        for i, (got, want) in enumerate(zip(venv.reset_infos, ref.reset_infos)):
            assert_info_identical(got, want, f"reset_infos[{i}]")
        rng = np.random.default_rng(seed)
        for t in range(steps):
            actions = sample_actions(ref.action_space, n_envs, rng)
            obs, rewards, dones, infos = venv.step(actions)
            w_obs, w_rewards, w_dones, w_infos = ref.step(actions)
            assert_obs_equal(obs, w_obs, f"step {t} obs")
            np.testing.assert_array_equal(dones, w_dones)
            for i, (got, want) in enumerate(zip(infos, w_infos)):
                assert_info_identical(got, want, f"step {t} infos[{i}]")
            flags.append(typed_flags(venv))
    finally:
        venv.close()
        ref.close()
    return np.array(flags)


def test_ale_infos_match_dummy(no_leaks):
    """ALE's lives / episode_frame_number / frame_number (Python ints) are learned at the first step
    and travel typed from the next; episodes end by truncation (terminal_observation,
    TimeLimit.truncated)."""
    ale_py = require("ale_py", 'pip install -e ".[atari]"')
    import gymnasium as gym

    gym.register_envs(ale_py)
    fn = functools.partial(gym.make, "ALE/Pong-v5", max_episode_steps=15)
    flags = run_against_dummy(fn, steps=35)
    assert not flags[0].any() and flags[1:].all(), "ALE's infos should travel typed after the first step"


@pytest.mark.parametrize("monitor", [False, True])
def test_every_supported_type_matches_dummy(no_leaks, monitor):
    """int, float, bool, np.int32, np.float32, np.bool_, np.uint64 (beyond int64) come back as
    themselves; a string and a dict after them and Monitor's ``episode`` at episode ends travel by
    pipe and follow the typed keys in the env's order."""
    flags = run_against_dummy(functools.partial(make_info_env, "stable", monitor), steps=30)
    assert flags[1:].all()


def test_changing_infos_fall_back_without_error(no_leaks):
    """Keys that appear late, disappear, change type (int -> float / np.int64 / bool), change order,
    or hold an int beyond int64: those infos go whole through the pipe, the others typed, all equal."""
    flags = run_against_dummy(functools.partial(make_info_env, "changing"), n_envs=5, steps=60)
    assert flags.any() and not flags.all(), "both paths should have been taken"


def test_declared_info_keys(no_leaks):
    """Declared keys travel typed from the very first step; keys declared in another order than the
    env's never match (every info by pipe), with the same results."""
    fn = functools.partial(make_info_env, "stable")
    declared = {"t": int, "x": float, "late_in_episode": bool, "n32": np.int32}
    assert run_against_dummy(fn, steps=12, info_keys=declared).all()
    assert not run_against_dummy(fn, steps=12, info_keys={"x": float, "t": int}).any()
    assert not run_against_dummy(fn, steps=12, info_keys=None).any()


@pytest.mark.parametrize(
    "info_keys, message",
    [
        ("sometimes", 'info_keys must be "auto", None or a mapping'),
        ({"lives": str}, "info_keys['lives']"),
        ({1: int}, "key 1 is not a string"),
        ({f"k{i}": int for i in range(9)}, "at most 8"),
        ([("lives", int)], "info_keys must be"),
    ],
)
def test_bad_info_keys_are_refused(no_leaks, info_keys, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ShmVecEnv([make_info_env], "fork", info_keys=info_keys)


def test_learn_takes_the_shared_leading_keys():
    assert learn([{}, {}]) is None
    assert learn([{"a": 1, "b": 2.0, "c": "s", "d": 3}, {}, {"a": 4, "b": 1.0}]) == InfoSchema(
        ("a", "b"), (int, float)
    )
    assert learn([{"a": 1}, {"a": 1.0}, {"a": 2.0}]) == InfoSchema(("a",), (float,))
    assert learn([{"s": "text", "a": 1}]) is None
    assert learn([{"a": np.int32(1), "b": 2**64}]) == InfoSchema(("a",), (np.int32,))


@pytest.mark.parametrize("pattern", ["stable", "changing-gym"])
@pytest.mark.parametrize("mode", [vector_helpers.NEXT, vector_helpers.SAME])
def test_gymnasium_face_matches_sync(no_leaks, monkeypatch, pattern, mode):
    """ShmVectorEnv's dict-of-arrays infos (with ``_key`` masks, ``final_info``) equal SyncVectorEnv's."""
    fn = functools.partial(make_info_env, pattern)
    monkeypatch.setitem(vector_helpers.ENVS, "infos", (fn, fn))
    vector_helpers.run_both("infos", mode, n_envs=5, steps=30)


def test_restart_mode(no_leaks):
    """A worker killed from outside is rebuilt: its envs' infos in that step are the restart keys only
    (no stale typed values from the slot), the other envs' infos are untouched, and the new worker
    gets the schema again (its envs travel typed afterwards)."""
    venv = ShmVecEnv(
        [functools.partial(make_info_env, "stable")] * 4, "fork", n_workers=2, on_crash="restart"
    )
    try:
        venv.seed(1)
        venv.reset()
        actions = np.zeros(4, np.int64)

        def check(obs: np.ndarray, infos: list[dict[str, Any]], skip: tuple[int, ...] = ()) -> None:
            for i, info in enumerate(infos):
                if i in skip:
                    continue
                last = info.get("terminal_observation", obs[i])  # the observation carries t and s
                want = {
                    **stable_info(int(last[0]), int(last[1])),
                    **{k: info[k] for k in SB3_KEYS if k in info},
                }
                assert_info_identical(info, want, f"infos[{i}]")

        for _ in range(4):
            obs, _, _, infos = venv.step(actions)
            check(obs, infos)
        os.kill(venv.processes[1].pid, signal.SIGKILL)
        venv.processes[1].join(5)
        obs, _, dones, infos = venv.step(actions)
        assert venv.n_restarts == 1 and dones[2:].all()
        for i in (2, 3):
            assert list(infos[i]) == [RESTARTED_KEY, REASON_KEY, *SB3_KEYS], infos[i]
        check(obs, infos, skip=(2, 3))
        for _ in range(5):
            obs, _, _, infos = venv.step(actions)
            check(obs, infos)
            assert typed_flags(venv).all(), "the rebuilt worker should write typed infos again"
    finally:
        venv.close()
