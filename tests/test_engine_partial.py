"""The engine's primitives for a caller that takes whatever is done (Tianshou's face,
``shmvec.tianshou``): ``send(..., partial=True)`` then ``recv(at_least=k)``, a batch of every worker
ready; ``reset_idle``, a reset of some envs while the others' steps stay in flight; and
``same_spaces=False``, envs whose spaces differ only where the ring does not see it. An env that
must be slower than the others is held inside its step by a gate the test opens, never timed.
"""

from __future__ import annotations

import functools
import multiprocessing
import threading
from contextlib import closing

import numpy as np
import pytest
from gymnasium import spaces

from shmvec.engine.build import build
from shmvec.engine.core import Engine
from shmvec.engine.options import Options
from shmvec.errors import SpaceMismatchError
from tests.envs import FaultyEnv, Gate
from tests.pool_helpers import check_split_steps


def _engine(fns: list, same_spaces: bool = True, **options) -> Engine:
    opts = Options.from_kwargs("test", {"n_workers": len(fns), **options}, autoreset="disabled")
    return build(fns, "fork", opts, "test", info_form="dicts", same_spaces=same_spaces)


def _reference_obs(seed: int, steps: list[int]) -> np.ndarray:
    """A FaultyEnv's observation after reset(seed) and ``steps``, in this process."""
    env = FaultyEnv()
    obs, _ = env.reset(seed=seed)
    for a in steps:
        obs = env.step(a)[0]
    return obs


def _recv_in_thread(engine: Engine, gate: Gate, at_least: int, wait_s: float) -> object:
    """``engine.recv(at_least=...)`` in a thread: its batch once it returns within ``wait_s``, else
    None (then the gate is opened so that it returns, and the thread is joined)."""
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(engine.recv(at_least=at_least)))
    waiter.start()
    waiter.join(wait_s)
    if waiter.is_alive():
        gate.open()
        waiter.join(60)
        return None
    return got[0]


# Envs 0 and 1 take 0.1 s a step: they finish after the main process has first looked, so it must be
# woken for them (a fast env may be done before that and seen without any wake-up).
SLOWISH = functools.partial(FaultyEnv, delay=0.1)


def test_partial_send_returns_the_envs_done_first_and_idle_envs_reset_meanwhile(no_leaks, tmp_path):
    gate = Gate(tmp_path / "gate")
    fns = [SLOWISH, SLOWISH, functools.partial(FaultyEnv, gate=gate.path)]
    with closing(_engine(fns)) as engine:
        engine.reset([0, 1, 2], [{}] * 3)
        gate.close()
        engine.send(np.array([1, 2, 0]), [0, 1, 2], partial=True)
        first = _recv_in_thread(engine, gate, 1, 30.0)
        assert first is not None, "recv(at_least=1) slept until the held env was done"
        got: dict[int, np.ndarray] = dict(zip(first.env_ids.tolist(), first.obs[0]))
        while len(got) < 2:  # envs 0 and 1, in one batch or two; env 2 is held
            batch = engine.recv(at_least=1)
            got.update(zip(batch.env_ids.tolist(), batch.obs[0]))
        assert sorted(got) == [0, 1] and engine.flights.busy.keys() == {2}
        for i, a in ((0, 1), (1, 2)):
            np.testing.assert_array_equal(got[i], _reference_obs(i, [a]))
        with pytest.raises(ValueError, match="are stepping"):
            engine.reset_idle([2], [None] * 3, [{}] * 3)
        reset = engine.reset_idle([1, 0], [10, 11, None], [{}] * 3)  # while env 2 steps
        assert reset.env_ids is not None and reset.env_ids.tolist() == [0, 1]
        assert [reset.infos[k]["seed"] for k in (0, 1)] == [10, 11]
        np.testing.assert_array_equal(reset.obs[0][1], _reference_obs(11, []))
        gate.open()
        last = engine.recv(at_least=3)  # capped at the one env in flight
        assert last.env_ids.tolist() == [2] and last.rewards.tolist() == [1.0]
        np.testing.assert_array_equal(last.obs[0][0], _reference_obs(2, [0]))
        with pytest.raises(RuntimeError, match="no env is stepping"):
            engine.recv(at_least=1)


def test_a_counted_send_wakes_the_caller_only_when_all_are_done(no_leaks, tmp_path):
    """The negative control of the test above: without ``partial`` the local transport wakes the main
    process once, when the last worker finishes, so a wait for one env sleeps while env 1 is held."""
    gate = Gate(tmp_path / "gate")
    with closing(_engine([SLOWISH, functools.partial(FaultyEnv, gate=gate.path)])) as engine:
        engine.reset([0, 1], [{}] * 2)
        gate.close()
        engine.send(np.array([1, 1]), [0, 1])
        assert _recv_in_thread(engine, gate, 1, 2.0) is None  # env 0 was done, nothing woke the caller


def test_reset_idle_takes_whole_groups_only(no_leaks):
    with closing(_engine([FaultyEnv] * 4, n_workers=2)) as engine:
        engine.reset([None] * 4, [{}] * 4)
        with pytest.raises(ValueError, match="steps envs 0..1 together"):
            engine.reset_idle([1], [None] * 4, [{}] * 4)
        batch = engine.reset_idle([2, 3], [5, 6, 7, 8], [{}] * 4)
        np.testing.assert_array_equal(batch.obs[0], np.stack([_reference_obs(7, []), _reference_obs(8, [])]))


def test_a_wait_past_its_limit_keeps_what_arrived(no_leaks, tmp_path):
    gate = Gate(tmp_path / "gate")
    with closing(_engine([FaultyEnv, functools.partial(FaultyEnv, gate=gate.path)])) as engine:
        engine.reset([0, 1], [{}] * 2)
        gate.close()
        engine.send(np.array([0, 0]), [0, 1], partial=True)
        with pytest.raises(multiprocessing.TimeoutError):
            engine.recv(limit=1.0, at_least=2)
        assert engine.recv(at_least=1).env_ids.tolist() == [0]
        gate.open()
        assert engine.recv(at_least=1).env_ids.tolist() == [1]


class _Box(FaultyEnv):
    def __init__(self, high: int, width: int = 1) -> None:
        super().__init__()
        self.observation_space = spaces.Box(0, high, (4, 4, width), np.uint8)
        self.action_space = spaces.Discrete(high)


def test_spaces_may_differ_where_the_ring_does_not_see_it(no_leaks):
    with pytest.raises(SpaceMismatchError, match="same spaces"):
        _engine([functools.partial(_Box, 3), functools.partial(_Box, 9)])
    with closing(
        _engine([functools.partial(_Box, 3), functools.partial(_Box, 9)], same_spaces=False)
    ) as engine:
        assert engine.reset([0, 1], [{}] * 2)[0][0].shape == (2, 4, 4, 1)
    with pytest.raises(SpaceMismatchError, match="same shapes and dtypes"):
        _engine([functools.partial(_Box, 3), functools.partial(_Box, 3, 2)], same_spaces=False)


@pytest.mark.parametrize(
    ("autoreset", "options"),
    [
        ("disabled", {}),
        ("disabled", {"transport": "portable"}),
        ("disabled", {"codec": {"image": "delta"}, "verify_every": 1}),
        ("next_step", {"codec": {"image": "delta"}, "verify_every": 1}),
    ],
    ids=["disabled", "portable", "delta", "next-step-delta"],
)
def test_a_split_send_steps_only_the_envs_named(no_leaks, autoreset, options):
    check_split_steps(autoreset, **options)


def test_a_send_without_split_waits_for_the_whole_group(no_leaks):
    """The negative control: without ``split`` a worker steps once every env of its group has an
    action, so envs 0 and 1 of the group 0..2 are not stepped and nothing is in flight."""
    opts = Options.from_kwargs("test", {"n_workers": 2}, autoreset="disabled")
    with closing(build([FaultyEnv] * 5, "fork", opts, "test", info_form="dicts")) as engine:
        engine.reset([None] * 5, [{}] * 5)
        engine.send(np.array([1, 1]), [0, 1])
        assert not engine.flights.busy and sorted(engine.flights.pending[0]) == [0, 1]
        with pytest.raises(RuntimeError, match="no env is stepping"):
            engine.recv(at_least=2)


def test_restart_mode_refuses_a_split_of_a_group(no_leaks):
    opts = Options.from_kwargs("test", {"n_workers": 2, "on_crash": "restart"}, autoreset="disabled")
    with closing(build([FaultyEnv] * 4, "fork", opts, "test", info_form="dicts")) as engine:
        engine.reset([None] * 4, [{}] * 4)
        with pytest.raises(
            ValueError,
            match=r"worker 1 steps envs 2\.\.3 together: name all of them or none, got \[2\] \(with on_crash='restart'",
        ):
            engine.send(np.array([1]), [2], split=True)
        assert engine.flights.idle
        engine.send(np.array([1, 1]), [3, 2], split=True)  # a whole group is fine
        assert engine.recv(at_least=2).env_ids.tolist() == [2, 3]


def test_a_send_of_every_group_in_any_order_steps_each_into_its_own_slot(no_leaks):
    """Workers in different slots (group 0..1 stepped alone first), then every env named, the later
    group first: each worker writes the slot the engine reads it from (the bell once took the slots
    in the order posted as if they were in worker order, and swapped the two groups' rows)."""
    with closing(_engine([FaultyEnv] * 4, n_workers=2)) as engine:
        engine.reset([0, 1, 2, 3], [{}] * 4)
        engine.send(np.array([1, 2]), [0, 1])
        engine.recv(at_least=2)
        engine.send(np.array([3, 0, 2, 1]), [3, 2, 1, 0])
        batch = engine.recv(at_least=4)
        assert batch.env_ids.tolist() == [0, 1, 2, 3]
        want = [
            _reference_obs(0, [1, 1]),
            _reference_obs(1, [2, 2]),
            _reference_obs(2, [0]),
            _reference_obs(3, [3]),
        ]
        np.testing.assert_array_equal(batch.obs[0], np.stack(want))
