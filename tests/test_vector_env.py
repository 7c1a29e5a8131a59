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
import re
from collections.abc import Callable
from contextlib import closing
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers.vector import DictInfoToList, RecordEpisodeStatistics

import shmvec
from shmvec import ClosedError, EnvError, EnvTimeoutError, WorkerCrashedError
from shmvec.restart import REASON_KEY, RESTARTED_KEY, restart_seed
from shmvec.synthetic import SyntheticImageEnv, misbehave
from shmvec.testing import assert_equivalent
from shmvec.testing.compare import gymnasium_difference, value_difference
from tests.envs import CRASHES, FaultyEnv, TinyImageEnv, make_broken_env, make_dict_env, make_tuple_env
from tests.helpers import assert_obs_equal, check
from tests.vector_envs import OptionsRecorderEnv, make_mutating

NEXT, SAME, DISABLED = AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED

# name -> factory (shmvec.testing copies what the reference's envs return: the mutating envs' true values)
ENVS = {
    "image": functools.partial(SyntheticImageEnv, (24, 20, 3), episode_len=(3, 9)),
    "dict": functools.partial(make_dict_env, 12, 8),
    "tuple": make_tuple_env,
    "mutating": make_mutating,
    "mutating-dict": functools.partial(make_mutating, True),
}


def make(fns, **kwargs) -> gym.vector.VectorEnv:
    """A ShmVectorEnv, on fork (the fastest start) with 2 workers unless the test says otherwise."""
    kwargs.setdefault("start_method", "fork")
    kwargs.setdefault("n_workers", min(2, len(fns)))
    return shmvec.ShmVectorEnv(fns, **kwargs)


# ---------------------------------------------------------------- comparing results


def assert_value_equal(got: Any, want: Any, where: str) -> None:
    """Equality of any value (infos, lists of them): arrays by dtype, shape and content, containers
    element by element, dicts in any key order, Python scalars by type and value."""
    check(value_difference(got, want, where, ordered=False))


def assert_reset_equal(got: tuple, want: tuple, where: str) -> None:
    check(gymnasium_difference(got, want), where)


def assert_step_equal(got: tuple, want: tuple, where: str) -> None:
    assert len(got) == 5, f"{where}: step returned {len(got)} items"
    check(gymnasium_difference(got, want), where)


def run_both(
    kind: str | Any,
    mode: AutoresetMode,
    n_envs: int = 5,
    steps: int = 40,
    seed: int = 3,
    wrap_reference: Callable[[gym.vector.VectorEnv], gym.vector.VectorEnv] | None = None,
    **kwargs,
):
    """ShmVectorEnv against SyncVectorEnv through :func:`shmvec.testing.assert_equivalent`: every
    array of every step (DISABLED mode resets the envs that ended with ``reset_mask``), an explicit
    ``reset()`` half-way. ``kind``: a key of :data:`ENVS`, a factory, or a pair whose first item is
    the factory (the reference's copy of the outputs is made by shmvec.testing). ``wrap_reference``:
    what the SyncVectorEnv is wrapped in before it is compared (a reference computed in the test).
    Returns how the episodes ended ("terminated", "truncated").
    """
    fn = ENVS[kind] if isinstance(kind, str) else kind
    fn = fn[0] if isinstance(fn, tuple) else fn
    kwargs.setdefault("start_method", "fork")
    kwargs.setdefault("n_workers", min(2, n_envs))
    report = assert_equivalent(
        [fn] * n_envs,
        steps,
        seed,
        "gymnasium",
        options={"level": 1},
        wrap_reference=wrap_reference,
        autoreset_mode=mode,
        **kwargs,
    )
    return {name for name in ("terminated", "truncated") if getattr(report, name)}


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


# ---------------------------------------------------------------- faults: raise mode

N_ENVS = 4
ACTIONS = np.ones(N_ENVS, np.int64)
# Where the victim misbehaves: FaultyEnv's `where`, its `at`, and how the test triggers it.
WHERE = {"step": ("step", 3), "reset": ("reset", 2), "call": ("method", 1)}


def faulty_fns(fault: str | None, where: str = "step", victim: int = 3, **kwargs):
    """4 envs on 2 workers; env ``victim`` (the second env of worker 1) misbehaves."""
    fns = [functools.partial(FaultyEnv, **kwargs)] * N_ENVS
    if fault is not None:
        fault_where, at = WHERE[where]
        fns[victim] = functools.partial(FaultyEnv, fault, at, fault_where, **kwargs)
    return fns


def trigger(env, where: str):
    """Run the command in which the victim misbehaves: its third step, its second reset, or a call."""
    if where == "step":
        env.step(ACTIONS)
        env.step(ACTIONS)
        return env.step(ACTIONS)
    if where == "reset":
        env.step(ACTIONS)
        return env.reset(seed=10)
    return env.call("misbehave_now")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", sorted(WHERE))
@pytest.mark.parametrize("fault", ["kill", "segv", "raise", "hang"])
def test_fault_in_raise_mode(no_leaks, fault, where):
    env = make(faulty_fns(fault, where), on_crash="raise", timeout=0.5 if fault == "hang" else None)
    try:
        env.reset(seed=0)
        command = {"step": "step", "reset": "reset", "call": r"\S*misbehave_now"}[where]
        if fault == "raise":
            # An env that raises leaves its worker alive: reported, and the env stays usable.
            with pytest.raises(EnvError, match=rf"env 3 raised RuntimeError during {command}") as info:
                trigger(env, where)
            assert info.value.env_index == 3 and isinstance(info.value, RuntimeError)
            assert "misbehave" in info.value.remote_traceback
            env.reset(seed=0)
            env.step(ACTIONS)
            return
        if fault == "hang":
            with pytest.raises(
                EnvTimeoutError,
                match=rf"worker 1 \(pid \d+, envs 2\.\.3\) did not answer {command} within 0.5 s",
            ) as info:
                trigger(env, where)
        else:
            with pytest.raises(WorkerCrashedError, match=CRASHES[fault].format(command=command)) as info:
                trigger(env, where)
            assert info.value.exitcode is not None and info.value.worker_pid is not None
        assert info.value.worker_index == 1 and info.value.env_indices == [2, 3]
        assert env.closed  # a dead or hung worker closes the env in raise mode
        with pytest.raises(ClosedError):
            env.step(ACTIONS)
    finally:
        env.close()


@pytest.mark.parametrize("codec", [None, "delta"])
def test_stepping_on_after_an_env_error(no_leaks, codec):
    """After an EnvError in step (raise mode), stepping on without a reset works; with the delta codec
    too (issue 9: it raised "frame lost" until reset()). The envs that did step in the failed call
    (0, 1 and 2, before the victim) match a run without the fault."""
    ref = SyncVectorEnv(faulty_fns(None))
    with closing(make(faulty_fns("raise"), codec=codec)) as env, closing(ref):
        assert_obs_equal(env.reset(seed=0)[0], ref.reset(seed=0)[0])
        with pytest.raises(EnvError):
            trigger(env, "step")
        for _ in range(3):
            ref.step(ACTIONS)
        for t in (4, 5, 6):
            obs, rewards, terminations, truncations, _ = env.step(ACTIONS)
            r_obs, r_rewards, r_terminations, r_truncations, _ = ref.step(ACTIONS)
            assert_obs_equal(obs[:3], r_obs[:3], f"step {t}")
            np.testing.assert_array_equal(rewards[:3], r_rewards[:3])
            np.testing.assert_array_equal(terminations, r_terminations)  # FaultyEnv's t went on
            np.testing.assert_array_equal(truncations, r_truncations)


# ---------------------------------------------------------------- faults: restart mode


def _restart_reason(fault: str, command: str) -> str:
    if fault in CRASHES:
        return CRASHES[fault].format(command=command)
    if fault == "raise":
        return rf"env 3 raised RuntimeError during {command}: simulated env failure"
    return rf"worker 1 \(pid \d+, envs 2\.\.3\) did not answer {command} within 1 s"


def assert_restarted(infos: dict, envs: list[int], fault: str, command: str) -> None:
    """The restart info keys, with their mask, on exactly the envs of the rebuilt worker."""
    assert RESTARTED_KEY in infos and REASON_KEY in infos, sorted(infos)
    mask = [i in envs for i in range(N_ENVS)]
    assert infos[f"_{RESTARTED_KEY}"].tolist() == mask
    assert infos[f"_{REASON_KEY}"].tolist() == mask
    for i in envs:
        assert infos[RESTARTED_KEY][i] == True  # noqa: E712 (a numpy bool)
        assert re.search(_restart_reason(fault, command), infos[REASON_KEY][i]), infos[REASON_KEY][i]


def not_restarted(infos: dict) -> bool:
    return RESTARTED_KEY not in infos or not infos[f"_{RESTARTED_KEY}"].any()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["kill", "segv", "raise", "hang"])
def test_fault_in_step_restarts(no_leaks, fault):
    """NEXT_STEP: the rebuilt worker's envs end their episode by truncation, with the last observation
    the agent saw and reward 0; at the next step they start a new episode. The other worker's envs
    get exactly what a run without the fault gives them."""
    ref = SyncVectorEnv(faulty_fns(None))
    env = make(faulty_fns(fault), on_crash="restart", timeout=1.0 if fault == "hang" else None)
    with closing(env), closing(ref):
        obs, _ = env.reset(seed=0)
        assert_obs_equal(obs, ref.reset(seed=0)[0])
        for t in range(1, 6):
            prev = obs
            obs, rewards, terminations, truncations, infos = env.step(ACTIONS)
            r_obs, r_rewards, r_terminations, r_truncations, _ = ref.step(ACTIONS)
            assert_obs_equal(obs[:2], r_obs[:2], f"step {t}")
            np.testing.assert_array_equal(rewards[:2], r_rewards[:2])
            np.testing.assert_array_equal(terminations[:2], r_terminations[:2])
            np.testing.assert_array_equal(truncations[:2], r_truncations[:2])
            if t == 3:  # the victim fails at its third step
                assert truncations[2:].all() and not terminations[2:].any()
                assert_obs_equal(obs[2:], prev[2:], "last observation of the rebuilt envs")
                assert rewards[2:].tolist() == [0.0, 0.0]
                assert_restarted(infos, [2, 3], fault, "step")
            elif t == 4:  # NEXT_STEP: the rebuilt envs start their new episode now
                assert not truncations[2:].any() and not terminations[2:].any()
                assert rewards[2:].tolist() == [0.0, 0.0]
            else:
                assert not_restarted(infos)
        assert env.get_attr("steps")[2:] == (1, 1)  # rebuilt at step 3, stepped once since (t=5)


@pytest.mark.timeout(120)
def test_fault_in_step_restarts_same_step(no_leaks):
    """SAME_STEP: final_obs of a rebuilt env is the last observation the agent saw; the observation
    returned is the first of its new episode; the restart keys are in the infos or in final_info."""
    env = make(faulty_fns("kill"), on_crash="restart", autoreset_mode=SAME)
    with closing(env):
        obs, _ = env.reset(seed=0)
        for _ in range(2):
            obs, *_ = env.step(ACTIONS)
        new_obs, rewards, terminations, truncations, infos = env.step(ACTIONS)
        assert truncations.tolist() == [False, False, True, True] and not terminations.any()
        assert infos["_final_obs"].tolist() == [False, False, True, True]
        for i in (2, 3):
            assert_obs_equal(infos["final_obs"][i], obs[i], f"final_obs[{i}]")
        where = infos if RESTARTED_KEY in infos else infos["final_info"]
        assert_restarted(where, [2, 3], "kill", "step")
        assert env.get_attr("steps")[2:] == (0, 0)  # a fresh env, reset, not stepped yet
        for i in (2, 3):  # the observation returned is the rebuilt env's first one
            rebuilt = FaultyEnv()
            first, _ = rebuilt.reset(seed=restart_seed(i, 1))
            assert_obs_equal(new_obs[i], first, f"obs[{i}]")
        env.step(ACTIONS)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("codec", ["lz4", "delta"])
def test_restart_with_codec(no_leaks, codec):
    """Restart mode and a codec together: the rebuilt envs end their episode with the last observation
    (decoded), and every env, the rebuilt ones' new episodes included, goes on decoding exactly."""
    ref = SyncVectorEnv(faulty_fns(None))
    env = make(faulty_fns("kill"), on_crash="restart", codec=codec)
    with closing(env), closing(ref):
        obs, _ = env.reset(seed=0)
        assert_obs_equal(obs, ref.reset(seed=0)[0])
        for t in range(1, 9):
            prev = obs
            obs, rewards, terminations, truncations, infos = env.step(ACTIONS)
            r_obs, r_rewards, *_ = ref.step(ACTIONS)
            assert_obs_equal(obs[:2], r_obs[:2], f"step {t}")
            np.testing.assert_array_equal(rewards[:2], r_rewards[:2])
            if t == 3:
                assert truncations[2:].all()
                assert_obs_equal(obs[2:], prev[2:], "last observation of the rebuilt envs")
                assert_restarted(infos, [2, 3], "kill", "step")
            elif t == 4:  # the new episodes' first observations, from their restart seeds
                for i in (2, 3):
                    assert_obs_equal(obs[i], FaultyEnv().reset(seed=restart_seed(i, 1))[0], f"obs[{i}]")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", [NEXT, SAME], ids=lambda m: m.name)
def test_restart_when_the_autoreset_fails(no_leaks, mode):
    """Env 3 dies in its second reset: the autoreset after its first episode (at its 5th step), inside
    step(). The worker is rebuilt, its envs report the restart, the other envs are unaffected."""
    ref = SyncVectorEnv(faulty_fns(None), autoreset_mode=mode)
    env = make(faulty_fns("kill", "reset"), on_crash="restart", autoreset_mode=mode)
    restarted_at = []
    with closing(env), closing(ref):
        assert_obs_equal(env.reset(seed=0)[0], ref.reset(seed=0)[0])
        for t in range(1, 10):
            obs, rewards, terminations, truncations, infos = env.step(ACTIONS)
            r_obs, r_rewards, r_terminations, r_truncations, _ = ref.step(ACTIONS)
            assert_obs_equal(obs[:2], r_obs[:2], f"step {t}")
            np.testing.assert_array_equal(rewards[:2], r_rewards[:2])
            np.testing.assert_array_equal(terminations[:2], r_terminations[:2])
            np.testing.assert_array_equal(truncations[:2], r_truncations[:2])
            where = infos.get("final_info", {}) if RESTARTED_KEY not in infos else infos
            if RESTARTED_KEY in where and where[f"_{RESTARTED_KEY}"].any():
                assert where[f"_{RESTARTED_KEY}"].tolist() == [False, False, True, True]
                restarted_at.append(t)
        # NEXT_STEP resets at the step after the 5th, SAME_STEP within the 5th.
        assert restarted_at == ([6] if mode == NEXT else [5])


def test_restart_seeds(no_leaks):
    """A rebuilt env is reset with restart_seed(its last seed, restart count), as on the SB3 face:
    the same run gives the same seeds, different envs get different ones."""
    env = make(faulty_fns("kill"), on_crash="restart")
    with closing(env):
        env.reset(seed=0)
        trigger(env, "step")
        obs, _, _, _, infos = env.step(ACTIONS)  # NEXT_STEP: the reset of the new episode
        assert infos["_seed"][2:].tolist() == [True, True]
        assert infos["seed"][2:].tolist() == [restart_seed(2, 1), restart_seed(3, 1)]
        for i in (2, 3):
            rebuilt = FaultyEnv()
            assert_obs_equal(obs[i], rebuilt.reset(seed=restart_seed(i, 1))[0], f"obs[{i}]")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["kill", "segv", "raise", "hang"])
def test_fault_in_reset_restarts(no_leaks, fault):
    """The rebuilt envs are reset with the seeds reset() asked for: the batch equals a clean run's."""
    ref = SyncVectorEnv(faulty_fns(None))
    env = make(faulty_fns(fault, "reset"), on_crash="restart", timeout=1.0 if fault == "hang" else None)
    with closing(env), closing(ref):
        env.reset(seed=0)
        obs, infos = trigger(env, "reset")  # reset(seed=10)
        ref.reset(seed=0)
        r_obs, r_infos = ref.reset(seed=10)
        assert_obs_equal(obs, r_obs)
        assert infos["seed"].tolist() == r_infos["seed"].tolist() == [10, 11, 12, 13]
        assert_restarted(infos, [2, 3], fault, "reset")
        _, _, terminations, truncations, infos = env.step(ACTIONS)
        assert not terminations.any() and not truncations.any() and not_restarted(infos)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["kill", "segv", "raise", "hang"])
def test_fault_in_call_in_restart_mode(no_leaks, fault):
    """A query (call/get_attr/render) is never retried: a raising env is reported and nothing is
    restarted; a dead or hung worker is rebuilt, its error raised, and the env stays open with the
    rebuilt envs ending their episode at the next step."""
    env = make(faulty_fns(fault, "call"), on_crash="restart", timeout=1.0 if fault == "hang" else None)
    with closing(env):
        obs, _ = env.reset(seed=0)
        if fault == "raise":
            with pytest.raises(EnvError, match=r"env 3 raised RuntimeError during \S*misbehave_now"):
                trigger(env, "call")
            _, _, terminations, truncations, infos = env.step(ACTIONS)
            assert not truncations.any() and not_restarted(infos)
            return
        error = EnvTimeoutError if fault == "hang" else WorkerCrashedError
        with pytest.raises(error, match="restarted"):
            trigger(env, "call")
        assert not env.closed
        new_obs, rewards, terminations, truncations, infos = env.step(ACTIONS)
        assert truncations.tolist() == [False, False, True, True] and not terminations.any()
        assert_obs_equal(new_obs[2:], obs[2:], "last observation of the rebuilt envs")
        assert_restarted(infos, [2, 3], fault, r"\S*misbehave_now")
        env.step(ACTIONS)
        env.step(ACTIONS)


def test_restart_limit_raises_and_closes(no_leaks):
    fns = [functools.partial(FaultyEnv)] * N_ENVS
    fns[3] = functools.partial(FaultyEnv, "kill", 1, "step")  # every rebuilt env dies at its 1st step
    env = make(fns, on_crash="restart", max_restarts=2, restart_window=None)
    env.reset(seed=0)
    with pytest.raises(WorkerCrashedError, match=r"restart limit reached: max_restarts=2"):
        for _ in range(10):
            env.step(ACTIONS)
    assert env.closed
    env.close()


# ---------------------------------------------------------------- training equivalence (last: torch makes
# every later gc.collect() of no_leaks slower)


def _cleanrl_ppo(envs, seed: int = 0, num_steps: int = 32, updates: int = 3) -> list:
    """The core of CleanRL's ppo_atari.py, shrunk: a tiny CNN, GAE, clipped surrogate, minibatches."""
    import torch
    from torch import nn
    from torch.distributions import Categorical

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    n_envs, n_actions = envs.num_envs, envs.single_action_space.n
    trunk = nn.Sequential(
        nn.Conv2d(1, 4, 8, stride=4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 32), nn.ReLU()
    )
    actor, critic = nn.Linear(32, n_actions), nn.Linear(32, 1)
    params = [*trunk.parameters(), *actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.Adam(params, lr=2.5e-4, eps=1e-5)

    def policy(x):
        hidden = trunk(x.permute(0, 3, 1, 2) / 255.0)
        return Categorical(logits=actor(hidden)), critic(hidden).squeeze(-1)

    obs_shape = envs.single_observation_space.shape
    obs_buf = torch.zeros((num_steps, n_envs, *obs_shape))
    actions, logprobs, rewards, dones, values = (torch.zeros((num_steps, n_envs)) for _ in range(5))
    next_obs = torch.tensor(envs.reset(seed=seed)[0], dtype=torch.float32)
    next_done = torch.zeros(n_envs)
    for _ in range(updates):
        for step in range(num_steps):
            obs_buf[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                dist, value = policy(next_obs)
                action = dist.sample()
            actions[step], logprobs[step], values[step] = action, dist.log_prob(action), value
            obs, reward, terminations, truncations, _ = envs.step(action.numpy())
            rewards[step] = torch.tensor(reward, dtype=torch.float32)
            next_obs = torch.tensor(obs, dtype=torch.float32)
            next_done = torch.tensor(np.logical_or(terminations, truncations), dtype=torch.float32)
        with torch.no_grad():
            next_value = policy(next_obs)[1]
            advantages = torch.zeros_like(rewards)
            last = 0
            for t in reversed(range(num_steps)):
                nonterminal = 1.0 - (next_done if t == num_steps - 1 else dones[t + 1])
                following = next_value if t == num_steps - 1 else values[t + 1]
                delta = rewards[t] + 0.99 * following * nonterminal - values[t]
                advantages[t] = last = delta + 0.99 * 0.95 * nonterminal * last
            returns = advantages + values
        b_obs, b_actions, b_logprobs = obs_buf.flatten(0, 1), actions.flatten(), logprobs.flatten()
        b_advantages, b_returns = advantages.flatten(), returns.flatten()
        for _ in range(2):
            for idx in torch.randperm(num_steps * n_envs).split(32):
                dist, value = policy(b_obs[idx])
                ratio = (dist.log_prob(b_actions[idx]) - b_logprobs[idx]).exp()
                adv = b_advantages[idx]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
                loss = pg_loss + 0.5 * ((value - b_returns[idx]) ** 2).mean() - 0.01 * dist.entropy().mean()
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, 0.5)
                optimizer.step()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize("mode", [NEXT, SAME], ids=lambda m: m.name)
def test_cleanrl_ppo_update_matches_sync(no_leaks, mode):
    """384 env steps and 3 PPO updates on 4 envs: parameters bit-equal to the same loop on
    SyncVectorEnv (any difference in any observation, reward or flag would show)."""
    import torch

    fns = [TinyImageEnv] * 4
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    with closing(ref):
        want = _cleanrl_ppo(ref)
    with closing(make(fns, autoreset_mode=mode)) as env:
        got = _cleanrl_ppo(env)
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"parameter {i} differs by up to {(a - b).abs().max().item()}"
