"""Pool mode of ShmVectorEnv (``batch_size < num_envs``, ``send``/``recv``).

Each env is driven with actions that depend only on (env id, that env's step count), so whatever
order the batches come in, every env's trajectory must equal the same env stepped alone in this
process (NEXT_STEP autoreset). Refused calls are checked on errors, never on wall-clock time beyond
generous no-hang bounds. Which envs make a batch (order, slow envs, worker counts) is
tests/test_pool_scheduling.py's, faults tests/test_pool_faults.py's.
"""

from __future__ import annotations

import functools
import time
from contextlib import closing

import numpy as np
import pytest

from shmvec import ClosedError, PendingCallError
from tests.envs import DictImageEnv, FaultyEnv
from tests.helpers import assert_obs_equal
from tests.info_envs import make_info_env
from tests.pool_helpers import FAULTY, check_trajectories, make, run_pool

# ---------------------------------------------------------------- trajectories


@pytest.mark.parametrize("order", ["first_ready", "deterministic"])
@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_each_env_matches_itself_alone(no_leaks, order, batch_size):
    """6 envs, batches of 1, 2, 3 (6, 3 and 2 workers on 2 CPUs): per-env trajectories exact."""
    with closing(make([FAULTY] * 6, batch_size=batch_size, pool_order=order)) as env:
        got, _ = run_pool(env, 36 // batch_size)
        assert sorted(got) == list(range(6))
        assert sum(len(r) for r in got.values()) == 36
    check_trajectories(FAULTY, got)


@pytest.mark.parametrize("as_list", [False, True], ids=["array", "list"])
def test_dict_env_with_box_actions(no_leaks, as_list):
    """Box actions through the ring's action buffer (an array) or pickled (a list of arrays)."""
    fn = functools.partial(DictImageEnv, 8, 6)
    with closing(make([fn] * 6, batch_size=2, n_workers=3)) as env:
        got, _ = run_pool(env, 24, seed=3, as_list=as_list)
    check_trajectories(fn, got, seed=3)


@pytest.mark.parametrize("batch_size", [2, 3])
def test_typed_info_columns_reach_each_batch(no_leaks, batch_size):
    """Declared info keys travel in the ring's typed columns from the first step; each batch must
    read its own groups' values, and leave the other groups' (same slot, not yet received) alone."""
    fn = functools.partial(make_info_env, "stable")
    keys = {"t": int, "x": float, "late_in_episode": bool, "n32": np.int32}
    with closing(make([fn] * 6, batch_size=batch_size, info_keys=keys)) as env:
        got, _ = run_pool(env, 48 // batch_size, seed=5)
    assert any("n32" in r[4] for results in got.values() for r in results)
    check_trajectories(fn, got, seed=5)


@pytest.mark.parametrize("batch_size", [2, 4])
def test_learned_info_schema_reaches_every_worker(no_leaks, monkeypatch, batch_size):
    """With ``info_keys="auto"`` pool mode learns the schema from its first batches and tells each
    worker at its next step (the others are busy then): from there every env's info comes through
    the typed columns (one ring write, no pickled reply), and the trajectories stay exact."""
    from shmvec.engine.typed_infos import TypedInfos

    masks: list[np.ndarray] = []
    rows = TypedInfos.rows

    def recording(self, parts, infos):
        typed = rows(self, parts, infos)
        masks.append(np.zeros(0, bool) if typed is None else typed.mask.copy())
        return typed

    monkeypatch.setattr(TypedInfos, "rows", recording)
    # No episode ends (their first info is a reset's, which the schema does not fit): every info typed.
    fn = functools.partial(make_info_env, "stable", max_steps=1000, lengths=(1000, 1001))
    with closing(make([fn] * 6, batch_size=batch_size, n_workers=3)) as env:
        got, _ = run_pool(env, 60 // batch_size, seed=5)
        assert not env._eng.typed_infos.untold
    check_trajectories(fn, got, seed=5)
    assert masks, "no schema was learned"
    # Each worker is told at its first step after the schema is learned; a few batches later all
    # its rows are typed.
    assert all(len(mask) == batch_size and mask.all() for mask in masks[-5:]), masks


@pytest.mark.parametrize("codec", [None, "delta"])
def test_a_masked_reset_after_pool_batches_keeps_each_envs_last_observation(no_leaks, codec):
    """After pool batches the envs' last observations lie in different ring slots (and, encoded, in
    different decoded arrays): a masked reset must return each env not reset as the caller last saw
    it, and the reset env as the same env reset in this process."""
    n, fn = 4, functools.partial(DictImageEnv, 8, 1000)
    refs = [fn() for _ in range(n)]
    for i, ref in enumerate(refs):
        ref.reset(seed=i)
    last: dict[int, dict] = {}
    with closing(make([fn] * n, batch_size=2, n_workers=2, codec=codec, verify_every=1)) as env:
        env.async_reset(seed=0)
        in_flight, rng = set(range(n)), np.random.default_rng(0)
        for k in range(7):
            obs, _, terms, truncs, infos = env.recv()
            ids = infos["env_id"].tolist()
            assert not (terms.any() or truncs.any()), "an episode ended: the test needs longer ones"
            in_flight -= set(ids)
            for pos, i in enumerate(ids):
                last[i] = {key: v[pos].copy() for key, v in obs.items()}
            if k < 5:
                actions = rng.uniform(-1, 1, (len(ids), 2)).astype(np.float32)
                for i, a in zip(ids, actions):
                    refs[i].step(a)
                env.send(actions, ids)
                in_flight |= set(ids)
            if not in_flight:
                break
        assert not in_flight
        counts = [int(last[i]["count"]) for i in range(n)]
        assert len(set(counts)) > 1, f"the groups stepped alike ({counts}): nothing tells slots apart"
        mask = np.array([True] + [False] * (n - 1))
        obs, infos = env.reset(options={"reset_mask": mask})
    want0, _ = refs[0].reset()
    assert_obs_equal({key: v[0] for key, v in obs.items()}, want0, "env 0 (reset)", ordered=False)
    for i in range(1, n):
        assert_obs_equal(
            {key: v[i] for key, v in obs.items()}, last[i], f"env {i} (not reset)", ordered=False
        )


@pytest.mark.parametrize("codec", ["lz4", pytest.param("delta", marks=pytest.mark.slow)])
def test_codec(no_leaks, codec):
    with closing(make([FAULTY] * 4, batch_size=2, n_workers=2, codec=codec, verify_every=1)) as env:
        got, _ = run_pool(env, 20)
    check_trajectories(FAULTY, got)


def test_copy_false_views_stay_valid_for_one_more_recv(no_leaks):
    """copy=False (n_slots=2): read-only views, valid through n_slots - 1 = 1 further recv."""
    with closing(make([FAULTY] * 4, batch_size=2, n_workers=2, copy=False)) as env:
        env.async_reset(seed=0)
        obs, *_ = env.recv()
        kept = obs.copy()
        assert not obs.flags.writeable
        env.send(np.zeros(2, np.int64))
        env.recv()
        assert_obs_equal(obs, kept, "a view one recv later")


def test_envs_ascend_within_a_batch(no_leaks):
    """Worker 0 is slower, so worker 1's group arrives first; the batch still lists envs 0..3 in
    order (with batch_size == num_envs that is step()'s order)."""
    fns = [functools.partial(FaultyEnv, delay=0.05)] * 2 + [FAULTY] * 2
    with closing(make(fns, batch_size=4, n_workers=2)) as env:
        env.async_reset(seed=0)
        env.recv()
        for _ in range(3):
            env.send(np.zeros(4, np.int64))
            assert env.recv()[4]["env_id"].tolist() == [0, 1, 2, 3]


def test_full_batch_step_and_recv_agree(no_leaks):
    """batch_size == num_envs: step() still works, and recv() gives every env (uneven groups); step()
    and send()/recv() mix, one batch at a time."""
    with closing(make([FAULTY] * 5, batch_size=5, n_workers=2)) as a, closing(make([FAULTY] * 5)) as b:
        a.async_reset(seed=0)
        obs, *_ = a.recv()
        assert_obs_equal(obs, b.reset(seed=0)[0])
        actions = np.arange(5) % 3
        a.send(actions)
        got = a.recv()
        want = b.step(actions)
        assert got[4]["env_id"].tolist() == [0, 1, 2, 3, 4]
        for x, y in zip(got[:4], want[:4]):
            assert_obs_equal(x, y)
        # One engine behind both: once every env is received, step() continues where recv() left off.
        for x, y in zip(a.step(actions)[:4], b.step(actions)[:4]):
            assert_obs_equal(x, y)
        a.send(actions)
        with pytest.raises(PendingCallError, match=r"pending call to `step`.*recv\(\)"):
            a.step(actions)  # a send is in flight
        a.reset(seed=1)
        a.step(actions)


# ---------------------------------------------------------------- refused calls


def test_refused_calls(no_leaks):
    with closing(make([FAULTY] * 4, batch_size=2, n_workers=2)) as env:
        with pytest.raises(ValueError, match="no batch to answer"):
            env.send(np.zeros(2, np.int64))
        with pytest.raises(RuntimeError, match=r"batch needs 1 worker group\(s\) of 2 envs, but only 0"):
            env.recv()
        env.async_reset(seed=0)
        with pytest.raises(RuntimeError, match=r"step\(\) needs every env; with batch_size=2 < num_envs=4"):
            env.step(np.zeros(4, np.int64))
        with pytest.raises(ValueError, match="env 0's previous step was not received yet"):
            env.send(np.zeros(2, np.int64), [0, 1])
        with pytest.raises(
            PendingCallError, match="Calling `call_async` while waiting for a pending call to `reset`"
        ):
            env.get_attr("steps")
        *_, infos = env.recv()
        ids = infos["env_id"]
        with pytest.raises(ValueError, match="expected 2 actions"):
            env.send(np.zeros(3, np.int64))
        with pytest.raises(ValueError, match=r"env_ids must be in 0\.\.3"):
            env.send(np.zeros(1, np.int64), [4])
        with pytest.raises(ValueError, match="must not repeat"):
            env.send(np.zeros(2, np.int64), [ids[0], ids[0]])
        env.send(np.zeros(1, np.int64), ids[:1])  # half a group: held until the rest comes
        with pytest.raises(ValueError, match="already has an action waiting"):
            env.send(np.zeros(1, np.int64), ids[:1])
        env.send([0], ids[1:])  # the rest of the group, as a list (pickled, not through the ring)
        env.recv()
        obs, _ = env.reset(seed=0)  # drains what is in flight
        assert obs.shape == (4, 4, 4, 1)
        assert len(env.get_attr("steps")) == 4


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            {"batch_size": 3, "n_workers": 3},
            r"n_workers=3 cannot split num_envs=6 .* use one of n_workers=\[2, 6\]",
        ),
        (
            {"batch_size": 2, "n_workers": 2},
            r"n_workers=2 cannot split num_envs=6 .* use one of n_workers=\[3, 6\]",
        ),
        ({"batch_size": 7}, r"batch_size must be between 1 and num_envs=6, got 7"),
        ({"batch_size": 0}, r"batch_size must be between 1 and num_envs=6, got 0"),
        ({"batch_size": 2, "autoreset_mode": "same_step"}, "needs autoreset_mode NEXT_STEP"),
        ({"batch_size": 2, "pool_order": "fifo"}, "pool_order must be one of"),
    ],
)
def test_bad_pool_options(no_leaks, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make([FAULTY] * 6, **kwargs)


@pytest.mark.timeout(60)  # a hang fails; no bound on how long close() takes
def test_close_with_steps_in_flight(no_leaks):
    fns = [functools.partial(FaultyEnv, delay=0.3)] * 4
    env = make(fns, batch_size=2, n_workers=2)
    env.async_reset(seed=0)
    env.recv()
    env.send(np.zeros(2, np.int64))
    env.close()
    with pytest.raises(ClosedError):
        env.recv()


def test_recv_blocks_without_spinning(no_leaks):
    """While recv() waits for envs that sleep 0.5 s, the main process uses almost no CPU: a loop
    that polled instead of blocking burns the wait (measured: 0.09 s of CPU in 0.3 s at a load of 6
    on 2 cores, its fair share). CPU time, not wall-clock time."""
    fns = [functools.partial(FaultyEnv, delay=0.5)] * 2
    with closing(make(fns, batch_size=1, n_workers=2)) as env:
        env.async_reset(seed=0)
        env.recv()
        env.recv()
        env.send(np.zeros(1, np.int64), [0])
        env.send(np.zeros(1, np.int64), [1])
        cpu = time.process_time()
        env.recv()
        env.recv()
        assert time.process_time() - cpu < 0.03
