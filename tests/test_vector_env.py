"""ShmVectorEnv, the Gymnasium face: it returns what ``gymnasium.vector.SyncVectorEnv`` returns, array for
array (observations, rewards, terminations, truncations, infos with their ``_key`` masks,
``final_obs`` / ``final_info``), in all three autoreset modes, and fails the way ShmVecEnv fails.

Where gymnasium itself reports wrong values (envs that reuse and mutate their outputs, #1132), the
reference is a SyncVectorEnv over envs wrapped to deep-copy what they return: the true values.
Every test that builds a ShmVectorEnv uses ``no_leaks``.
"""

from __future__ import annotations

import functools
import os
from contextlib import closing
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv
from gymnasium.wrappers.vector import DictInfoToList, RecordEpisodeStatistics

import shmvec
from shmvec import ClosedError, EnvError, EnvTimeoutError
from shmvec.synthetic import SyntheticImageEnv, misbehave
from tests.envs import FaultyEnv, make_broken_env, make_dict_env
from tests.helpers import assert_obs_equal
from tests.vector_envs import OptionsRecorderEnv
from tests.vector_helpers import (
    DISABLED,
    ENVS,
    NEXT,
    SAME,
    assert_reset_equal,
    assert_step_equal,
    assert_value_equal,
    make,
    run_both,
)

# ---------------------------------------------------------------- equivalence with SyncVectorEnv


@pytest.mark.parametrize("kind", sorted(ENVS))
@pytest.mark.parametrize("mode", [NEXT, SAME, DISABLED], ids=lambda m: m.name)
def test_matches_sync(no_leaks, kind, mode):
    """5 envs on 2 workers (not divisible): every array of every step equals SyncVectorEnv's; for the
    mutating envs, the true values (SAME_STEP's final_obs / final_info of the terminal step, not of the
    reset that followed)."""
    ends = run_both(kind, mode)
    assert ends == {"terminated", "truncated"}, "the run must end episodes both ways to mean anything"


@pytest.mark.parametrize(
    "n_envs,n_workers,mode",
    [(7, 3, NEXT), (3, 3, SAME), (4, 1, SAME), (1, 1, DISABLED), (6, 4, DISABLED)],
    ids=str,
)
def test_matches_sync_worker_layouts(no_leaks, n_envs, n_workers, mode):
    run_both("dict", mode, n_envs=n_envs, n_workers=n_workers, steps=30)


@pytest.mark.parametrize(
    "codec,kind,mode",
    [
        ("lz4", "image", SAME),
        ("delta", "image", SAME),
        ("delta", "image", NEXT),
        ("lz4", "dict", DISABLED),
        ("delta", "mutating", SAME),
    ],
    ids=str,
)
def test_matches_sync_with_codec(no_leaks, codec, kind, mode):
    """Lossless codecs: observations and final observations go through the encoded path unchanged."""
    run_both(kind, mode, codec=codec, steps=30)


@pytest.mark.parametrize("mode", [NEXT, SAME], ids=lambda m: m.name)
def test_matches_sync_without_copy(no_leaks, mode):
    run_both("mutating-dict", mode, copy=False, steps=30)


@pytest.mark.parametrize("start_method", ["forkserver", pytest.param("spawn", marks=pytest.mark.slow)])
def test_matches_sync_other_start_methods(no_leaks, start_method):
    run_both("mutating-dict", SAME, n_envs=3, steps=20, start_method=start_method)


@pytest.mark.slow
def test_matches_sync_spawn_with_codec(no_leaks):
    run_both("image", NEXT, n_envs=3, steps=20, start_method="spawn", codec="delta")


def test_batch_dtypes(no_leaks):
    """The dtypes SyncVectorEnv returns, whatever ShmVecEnv's own defaults are (float32 rewards)."""
    fns = [functools.partial(SyntheticImageEnv, (4, 4, 1), episode_len=(2, 3))] * 3
    with closing(make(fns)) as env:
        obs, infos = env.reset(seed=0)
        assert obs.dtype == np.uint8 and obs.shape == (3, 4, 4, 1) and isinstance(infos, dict)
        obs, rewards, terminations, truncations, infos = env.step(np.zeros(3, np.int64))
        assert rewards.dtype == np.float64 and rewards.shape == (3,)
        assert terminations.dtype == truncations.dtype == np.bool_
        assert terminations.shape == truncations.shape == (3,)


def test_copy_true_returns_fresh_arrays(no_leaks):
    """copy=True (the default): a batch, or a final observation, that the caller keeps is not
    overwritten by later steps (the ring's slots are reused every few steps)."""
    fns = [functools.partial(SyntheticImageEnv, (8, 8, 3), episode_len=(2, 3))] * 2
    with closing(make(fns, autoreset_mode=SAME)) as env:
        obs, _ = env.reset(seed=0)
        kept = [obs]
        for _ in range(6):
            obs, _, _, _, infos = env.step(np.ones(2, np.int64))
            kept.append(obs)
            kept.extend(o for o in infos.get("final_obs", ()) if o is not None)
        assert len(kept) > 7  # final observations among them
        snapshot = [k.copy() for k in kept]
        for _ in range(6):
            env.step(np.ones(2, np.int64))
        for i, (a, b) in enumerate(zip(kept, snapshot)):
            np.testing.assert_array_equal(a, b, err_msg=f"kept array {i}")


# ---------------------------------------------------------------- autoreset modes


def test_autoreset_mode_in_metadata(no_leaks):
    # gymnasium's own wrappers (RecordEpisodeStatistics) require the enum here, not a string.
    given = {
        "next_step": NEXT,
        "same_step": SAME,
        "disabled": DISABLED,
        NEXT: NEXT,
        SAME: SAME,
        DISABLED: DISABLED,
    }
    for mode, expected in given.items():
        with closing(make([FaultyEnv], autoreset_mode=mode)) as env:
            assert env.metadata["autoreset_mode"] is expected, mode
    with closing(make([FaultyEnv])) as env:
        assert env.metadata["autoreset_mode"] is NEXT  # the default, as gymnasium's


def test_unknown_autoreset_mode_is_refused(no_leaks):
    with pytest.raises(ValueError):
        make([FaultyEnv], autoreset_mode="sometimes")


@pytest.mark.parametrize("mode", [NEXT, SAME], ids=lambda m: m.name)
def test_reset_mask(no_leaks, mode):
    """A partial reset in the middle of episodes: masked envs restart (with the seeds and options
    given), the others keep their observation and their pending autoreset."""
    fns = [functools.partial(FaultyEnv)] * 4
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    env = make(fns, autoreset_mode=mode)
    actions = np.array([0, 1, 2, 1])
    with closing(env), closing(ref):
        assert_reset_equal(env.reset(seed=0), ref.reset(seed=0), "reset")
        for t in range(8):
            if t == 5:  # every FaultyEnv episode ended at t == 4; env 1 and 2 restart, 0 and 3 do not.
                # (Seeds: all ints or all None among the reset envs; gymnasium's _add_info cannot batch
                # an info key that is an int for one env and None for the next.)
                mask = np.array([False, True, True, False])
                got = env.reset(seed=[None, 21, 22, None], options={"reset_mask": mask.copy()})
                want = ref.reset(seed=[None, 21, 22, None], options={"reset_mask": mask})
                assert_reset_equal(got, want, f"masked reset before step {t}")
            assert_step_equal(env.step(actions), ref.step(actions), f"step {t}")
        assert env.get_attr("resets") == ref.get_attr("resets")


def _reset_options_cases() -> list[dict[str, Any] | None]:
    """What reset() is called with in turn: nothing, None, empty, options, a mask alone, both."""
    return [
        None,
        None,
        {},
        {"level": 1},
        {"reset_mask": np.array([True, False, True])},
        {"reset_mask": np.array([False, True, True]), "level": 2},
    ]


@pytest.mark.parametrize("batch_size", [None, 1])
def test_reset_passes_options_to_the_envs_as_sync_does(no_leaks, batch_size):
    """Each env's reset gets exactly the ``options`` SyncVectorEnv gives it: None when reset() got
    None (passed, not left out), ``{}`` when what is left after ``reset_mask`` is empty. Pool mode
    (``batch_size``) too, for reset() and async_reset()."""
    fns = [OptionsRecorderEnv] * 3
    ref = SyncVectorEnv(fns)
    pool = {} if batch_size is None else {"batch_size": batch_size, "n_workers": 3}
    with closing(make(fns, **pool)) as env, closing(ref):
        for k, options in enumerate(_reset_options_cases()):
            if k == 0:
                env.reset(seed=k)
                ref.reset(seed=k)
            else:
                # Sync pops reset_mask out of the dict it is given: each gets its own.
                env.reset(seed=k, options=None if options is None else dict(options))
                ref.reset(seed=k, options=None if options is None else dict(options))
        assert env.get_attr("received") == ref.get_attr("received")
        assert ref.get_attr("received")[1][:4] == [None, None, {}, {"level": 1}]
        if batch_size is not None:
            for options in (None, {"level": 3}):
                env.async_reset(seed=9, options=options)
                for _ in range(3):
                    env.recv()
            assert [r[-2:] for r in env.get_attr("received")] == [[None, {"level": 3}]] * 3


def test_bad_reset_mask_is_refused_like_sync(no_leaks):
    bad_masks = {
        "nothing to reset": (np.zeros(4, bool), ValueError),
        "wrong length": (np.ones(3, bool), ValueError),
        "not booleans": (np.ones(4, np.int64), TypeError),
        "not an array": ([True, True, True, True], TypeError),
    }
    fns = [FaultyEnv] * 4
    ref = SyncVectorEnv(fns)
    with closing(make(fns)) as env, closing(ref):
        for why, (mask, error) in bad_masks.items():
            with pytest.raises(error):
                ref.reset(options={"reset_mask": mask})
            with pytest.raises(error):
                env.reset(options={"reset_mask": mask})
            assert_reset_equal(env.reset(seed=0), ref.reset(seed=0), f"reset after a mask with {why}")


def test_explicit_reset_after_episode_end_is_not_repeated(no_leaks):
    """NEXT_STEP: after every env ended its episode, the user resets explicitly; the next step must
    step the new episodes, not reset them a second time (AsyncVectorEnv(shared_memory=False) does in
    gymnasium 1.4: its worker clears its autoreset flag only when writing to shared memory)."""
    fns = [FaultyEnv] * 3
    ref = SyncVectorEnv(fns)
    actions = np.array([0, 1, 2])
    with closing(make(fns)) as env, closing(ref):
        assert_reset_equal(env.reset(seed=0), ref.reset(seed=0), "reset")
        for t in range(5):
            got = env.step(actions)
            assert_step_equal(got, ref.step(actions), f"step {t}")
        assert got[2].all()  # FaultyEnv's first episode ends by termination at its 5th step
        assert_reset_equal(env.reset(seed=10), ref.reset(seed=10), "explicit reset")
        got = env.step(actions)
        assert_step_equal(got, ref.step(actions), "first step after the explicit reset")
        assert got[1].tolist() == [1.0, 2.0, 3.0]  # action + t with t == 1: a step, not a reset
        assert env.get_attr("resets") == (2, 2, 2)


# ---------------------------------------------------------------- call, attributes, render


def test_call_get_attr_set_attr_render_match_sync(no_leaks):
    fns = [functools.partial(make_dict_env, 8, 6)] * 3
    ref = SyncVectorEnv(fns)
    with closing(make(fns)) as env, closing(ref):
        assert_reset_equal(env.reset(seed=1), ref.reset(seed=1), "reset")
        for vec in (env, ref):
            vec.step(vec.action_space.sample() * 0)
        assert env.get_attr("t") == ref.get_attr("t") == (1, 1, 1)
        assert env.call("t") == (1, 1, 1)  # a non-callable attribute: its value, like Sync
        env.set_attr("t", 7)
        assert env.get_attr("t") == (7, 7, 7)
        env.set_attr("t", [4, 5, 6])
        assert env.get_attr("t") == (4, 5, 6)
        env.set_attr("t", (1, 2, 3))
        assert env.get_attr("t") == (1, 2, 3)
        with pytest.raises(ValueError):
            env.set_attr("t", [1, 2])
        assert isinstance(env.call("worker_pid"), tuple)
        pids = env.call("worker_pid")
        assert len(set(pids)) == 2 and os.getpid() not in pids  # 3 envs on 2 workers
        assert env.call("modules_loaded", name="numpy") == (True, True, True)  # kwargs reach the env
        assert env.render_mode == ref.render_mode == "rgb_array"
        frames = env.render()
        assert isinstance(frames, tuple) and len(frames) == 3
        for a, b in zip(frames, (np.full((4, 4, 3), t, np.uint8) for t in (1, 2, 3))):
            assert_obs_equal(a, b, "render")


def test_missing_attribute_is_an_attribute_error(no_leaks):
    """Client code written for SyncVectorEnv catches AttributeError; the error still names the env."""
    with closing(make([FaultyEnv] * 2)) as env:
        with pytest.raises(AttributeError) as info:
            env.get_attr("no_such_attribute")
        assert isinstance(info.value, EnvError)
        with pytest.raises(AttributeError):
            env.call("no_such_method")
        env.reset(seed=0)


def test_exception_in_call_keeps_its_type(no_leaks):
    with closing(make([functools.partial(make_dict_env, 8, 6)] * 2)) as env:
        with pytest.raises(ValueError, match="custom message") as info:
            env.call("fail", "custom message")
        assert isinstance(info.value, EnvError) and info.value.env_index == 0
        assert "in fail" in info.value.remote_traceback
        env.reset(seed=0)


# ---------------------------------------------------------------- misuse and lifecycle


@pytest.mark.timeout(60)
def test_wrong_number_of_actions_raises_at_once(no_leaks):
    """gymnasium #1417: AsyncVectorEnv hangs on fewer actions than envs. Here: ValueError before any
    env steps, and the next correct step goes on as if the bad call never happened (SyncVectorEnv
    itself steps the first envs before it notices)."""
    fns = [FaultyEnv] * 4
    ref = SyncVectorEnv(fns)
    actions = np.array([0, 1, 2, 0])
    with closing(make(fns)) as env, closing(ref):
        assert_reset_equal(env.reset(seed=0), ref.reset(seed=0), "reset")
        for n_actions in (3, 5, 0):
            with pytest.raises(ValueError):
                env.step(np.ones(n_actions, np.int64))
            assert_step_equal(env.step(actions), ref.step(actions), f"step after {n_actions} actions")


def test_use_after_close_raises_and_close_twice_is_fine(no_leaks):
    env = make([FaultyEnv] * 3)
    env.reset(seed=0)
    env.step(np.zeros(3, np.int64))
    env.close()
    assert env.closed
    with pytest.raises(ClosedError):
        env.step(np.zeros(3, np.int64))
    with pytest.raises(ClosedError):
        env.reset()
    with pytest.raises(ClosedError):
        env.get_attr("t")
    env.close()
    assert env.closed


def test_close_without_reset(no_leaks):
    env = make([FaultyEnv] * 2)
    env.close()
    env.close()


def test_factory_that_raises_names_the_env(no_leaks):
    with pytest.raises(EnvError, match="the factory of env 2 raised RuntimeError: this factory is broken"):
        make([FaultyEnv, FaultyEnv, make_broken_env])


@pytest.mark.timeout(30)
def test_hung_factory_is_bounded_by_timeout(no_leaks):
    """Issue 9: starting a worker used to wait at least 60 s whatever ``timeout`` said (the test's
    own 30 s limit is only a guard against that hang, not a speed requirement)."""
    with pytest.raises(EnvTimeoutError):
        make([FaultyEnv, functools.partial(misbehave, "hang")], timeout=1.0)


# ---------------------------------------------------------------- gymnasium's vector wrappers


def _without_time(infos):
    """RecordEpisodeStatistics' 't' is wall-clock time, never equal between two runs."""
    if isinstance(infos, list):
        return [{k: ({**v, "t": None} if k == "episode" else v) for k, v in i.items()} for i in infos]
    if "episode" in infos:
        infos = {**infos, "episode": {k: v for k, v in infos["episode"].items() if k != "t"}}
    return infos


@pytest.mark.parametrize("mode", [NEXT, SAME], ids=lambda m: m.name)
def test_under_record_episode_statistics_and_dict_info_to_list(no_leaks, mode):
    fns = [functools.partial(SyntheticImageEnv, (6, 6, 1), episode_len=(2, 6))] * 3
    ref = DictInfoToList(RecordEpisodeStatistics(SyncVectorEnv(fns, autoreset_mode=mode)))
    env = DictInfoToList(RecordEpisodeStatistics(make(fns, autoreset_mode=mode)))
    episodes = 0
    with closing(env), closing(ref):
        obs, infos = env.reset(seed=5)
        r_obs, r_infos = ref.reset(seed=5)
        assert_obs_equal(obs, r_obs)
        assert_value_equal(infos, r_infos, "reset infos")
        ref.action_space.seed(5)
        for t in range(30):
            actions = ref.action_space.sample()
            got, want = env.step(actions), ref.step(actions)
            for name, x, y in zip(("obs", "rewards", "terminations", "truncations"), got, want):
                assert_obs_equal(x, y, f"step {t} {name}")
            assert isinstance(got[4], list) and len(got[4]) == 3
            assert_value_equal(_without_time(got[4]), _without_time(want[4]), f"step {t} infos")
            episodes += sum("episode" in i for i in want[4])
        assert episodes > 3
        assert list(env.env.return_queue) == list(ref.env.return_queue)
        assert list(env.env.length_queue) == list(ref.env.length_queue)


def test_under_record_episode_statistics_dict_infos(no_leaks):
    fns = [functools.partial(SyntheticImageEnv, (6, 6, 1), episode_len=(2, 6))] * 3
    ref = RecordEpisodeStatistics(SyncVectorEnv(fns, autoreset_mode=SAME))
    env = RecordEpisodeStatistics(make(fns, autoreset_mode=SAME))
    with closing(env), closing(ref):
        assert_reset_equal(env.reset(seed=2), ref.reset(seed=2), "reset")
        for t in range(20):
            actions = np.full(3, t % 4)
            got, want = env.step(actions), ref.step(actions)
            assert_step_equal(
                (*got[:4], _without_time(got[4])), (*want[:4], _without_time(want[4])), f"step {t}"
            )


# ---------------------------------------------------------------- make_vec


def test_make_vec_matches_gymnasium_make_vec(no_leaks):
    wrappers = [functools.partial(gym.wrappers.TimeLimit, max_episode_steps=9)]
    env = shmvec.make_vec(
        "CartPole-v1",
        3,
        wrappers=wrappers,
        env_kwargs={"sutton_barto_reward": True},
        start_method="fork",
        n_workers=2,
        autoreset_mode="same_step",
    )
    ref = gym.make_vec(
        "CartPole-v1",
        3,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": SAME},
        wrappers=wrappers,
        sutton_barto_reward=True,
    )
    with closing(env), closing(ref):
        assert isinstance(env, shmvec.ShmVectorEnv) and isinstance(env, gym.vector.VectorEnv)
        assert env.num_envs == 3 and env.metadata["autoreset_mode"] is SAME
        assert_reset_equal(env.reset(seed=4), ref.reset(seed=4), "reset")
        truncated = False
        for t in range(25):
            actions = np.array([t % 2, 1, 0])
            want = ref.step(actions)
            assert_step_equal(env.step(actions), want, f"step {t}")
            truncated |= bool(want[3].any())
        assert truncated  # the wrapper was applied in the workers


def test_make_vec_imports_the_module_named_in_the_id(no_leaks):
    """ "module:EnvId", as gymnasium.make_vec takes it: the module is imported (in the workers too,
    where it registers its envs) before the id is looked up. examples/cleanrl_ppo_atari.py relies on
    it with "ale_py:ALE/Pong-v5"."""
    env_id = "gymnasium.envs.classic_control:CartPole-v1"
    ref = gym.make_vec(env_id, 2, vectorization_mode="sync")
    with closing(shmvec.make_vec(env_id, 2, start_method="forkserver", n_workers=1)) as env, closing(ref):
        assert_reset_equal(env.reset(seed=1), ref.reset(seed=1), "reset")
        assert_step_equal(env.step(np.array([0, 1])), ref.step(np.array([0, 1])), "step")
