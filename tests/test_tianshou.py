"""``shmvec.tianshou.ShmTianshouVectorEnv`` in Tianshou's own loop: a DQN ``Collector`` over it
collects what the same ``Collector`` over Tianshou's ``DummyVectorEnv`` of the same factories
collects, array for array (pixels, and Atari through ``AtariPreprocessing`` + ``FrameStackObservation``),
subsets of envs (``n_episode``) included; asynchronous collection (``wait_num``, ``timeout``) gives
each env the transitions Tianshou's ``SubprocVectorEnv`` gives it; bad calls raise at once; nothing is
left after ``close()``.

Needs the ``tianshou`` extra (marked ``rl_library``: CI's Tianshou stage runs these).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from shmvec.synthetic import SyntheticImageEnv
from tests.envs import DictImageEnv, FaultyEnv, Gate
from tests.helpers import require, run_python

pytestmark = pytest.mark.rl_library

N = 4
PIXELS = functools.partial(SyntheticImageEnv, (4, 42, 42), episode_len=(4, 40))  # (C, H, W), as DQNet takes
WAITING = functools.partial(SyntheticImageEnv, (4, 42, 42), io_s=(0.0005, 0.006), episode_len=(3, 15))


@pytest.fixture(scope="module")
def ts() -> Any:
    require("tianshou", 'pip install -e ".[tianshou]"')
    import shmvec.tianshou

    return shmvec.tianshou


def _dqn(obs_shape: tuple[int, int, int], n_actions: int, seed: int = 0) -> Any:
    """Tianshou's Atari DQN (``DQNet``), untrained, acting eps-greedily (eps 0.3 from numpy's generator)."""
    import torch
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.env.atari.atari_network import DQNet

    torch.manual_seed(seed)
    return DiscreteQLearningPolicy(
        model=DQNet(*obs_shape, n_actions),
        action_space=spaces.Discrete(n_actions),
        eps_inference=0.3,
    )


def _collect(venv: Any, policy: Any, plan: list[dict[str, Any]], seed: int = 3, collector: str = "Collector"):
    """What a Tianshou collector gathers from ``venv`` (seeded with ``seed``) over the ``collect``
    calls of ``plan``: its buffer and the calls' stats. Closes ``venv``."""
    import tianshou.data as data
    import torch

    try:
        venv.seed(seed)
        np.random.seed(seed)  # the exploration noise's generator
        torch.manual_seed(seed)
        buffer = data.VectorReplayBuffer(4000 * len(venv), len(venv))
        c = getattr(data, collector)(policy, venv, buffer, exploration_noise=True)
        c.reset()
        stats = [c.collect(**kwargs) for kwargs in plan]
    finally:
        venv.close()
    return buffer, stats


def assert_same(a: Any, b: Any, where: str) -> None:
    """Tianshou ``Batch`` trees equal, leaf for leaf: keys, dtypes and values."""
    from tianshou.data import Batch

    if isinstance(a, Batch):
        assert isinstance(b, Batch), f"{where}: {type(b).__name__}, not a Batch"
        assert sorted(a.get_keys()) == sorted(b.get_keys()), f"{where}: keys {a.get_keys()} vs {b.get_keys()}"
        for key in a.get_keys():
            assert_same(a[key], b[key], f"{where}.{key}")
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype, f"{where}: dtype {a.dtype} vs {b.dtype}"
    np.testing.assert_array_equal(a, b, err_msg=where)


def assert_collected_same(got: tuple, want: tuple) -> None:
    (buf_a, stats_a), (buf_b, stats_b) = got, want
    assert len(buf_a) == len(buf_b) > 0
    assert_same(buf_a._meta, buf_b._meta, "buffer")
    for k, (x, y) in enumerate(zip(stats_a, stats_b)):
        assert x.n_collected_steps == y.n_collected_steps, f"collect {k}"
        np.testing.assert_array_equal(x.returns, y.returns, err_msg=f"collect {k}: returns")
        np.testing.assert_array_equal(x.lens, y.lens, err_msg=f"collect {k}: lens")


def _plan(n: int, steps: int) -> list[dict[str, Any]]:
    # n_episode < the episodes left: the Collector steps subsets of the envs at the end.
    return [{"n_step": n * steps}, {"n_episode": n + 2}, {"n_step": n * 5, "random": True}]


@pytest.mark.parametrize("n_workers", [None, 3, N])
def test_dqn_collector_on_pixels_equals_dummy(ts, no_leaks, n_workers):
    """Default workers (as many as CPUs), uneven groups (2, 1, 1) and one env per worker: n_episode
    collection steps fewer envs as episodes end, and a worker steps only the envs named."""
    from tianshou.env import DummyVectorEnv

    policy, plan = _dqn((4, 42, 42), 4), _plan(N, 60)
    options = {} if n_workers is None else {"n_workers": n_workers}
    got = _collect(ts.ShmTianshouVectorEnv([PIXELS] * N, **options), policy, plan)
    want = _collect(DummyVectorEnv([PIXELS] * N), policy, plan)
    assert_collected_same(got, want)
    assert sum(s.n_collected_episodes for s in got[1]) >= 2 * N  # episodes ended and envs were reset
    # The comparison can fail: another seed collects other transitions.
    with pytest.raises(AssertionError):
        assert_collected_same(_collect(DummyVectorEnv([PIXELS] * N), policy, plan, seed=4), want)


@pytest.mark.parametrize("n_workers", [None, 2])
def test_dqn_collector_on_atari_equals_dummy(ts, no_leaks, n_workers):
    """Breakout through AtariPreprocessing + FrameStackObservation(4), one worker per env or two
    groups of two envs (n_step collection steps every env: whole groups)."""
    require("ale_py", 'pip install -e ".[atari]"')
    from tianshou.env import DummyVectorEnv

    from shmvec.bench.envs import atari_preprocessed

    fns = [functools.partial(atari_preprocessed, "ALE/Breakout-v5")] * N
    policy = _dqn((4, 84, 84), 4)
    plan = [{"n_step": N * 250}]  # two or more games end (Breakout v5: five lives each)
    options = {} if n_workers is None else {"n_workers": n_workers}
    got = _collect(ts.ShmTianshouVectorEnv(fns, **options), policy, plan)
    want = _collect(DummyVectorEnv(fns), policy, plan)
    assert_collected_same(got, want)
    assert got[0].obs.dtype == np.uint8 and got[0].obs.shape[1:] == (4, 84, 84)
    assert got[1][0].n_collected_episodes >= 1


@pytest.mark.parametrize("options", [{"n_workers": 2}, {"n_workers": 3, "codec": {"image": "delta"}}])
def test_dict_observations_and_subsets_equal_dummy(ts, no_leaks, options):
    """Step and reset by id, out of order, on a Dict space (a Box action): DummyVectorEnv's results,
    with ids that split worker groups (each worker steps only the envs named) and a stateful codec
    whose streams advance only for those envs."""
    from tianshou.env import DummyVectorEnv

    fns = [functools.partial(DictImageEnv, 8, 6)] * N
    ours, ref = ts.ShmTianshouVectorEnv(fns, verify_every=1, **options), DummyVectorEnv(fns)
    rng = np.random.default_rng(0)
    try:
        assert ours.seed(5) == ref.seed(5)
        _assert_reset_equal(ours.reset(), ref.reset())
        ends = 0
        for t in range(80):
            # Every env now and then; else 1-3 envs in any order, splitting groups (envs 0-1 and 2-3
            # with two workers; 0-1, 2 and 3 with three).
            ids = None if t % 5 == 0 else rng.permutation(N)[: rng.integers(1, N)].tolist()
            k = N if ids is None else len(ids)
            actions = rng.uniform(-1, 1, (k, 2)).astype(np.float32)
            got, want = ours.step(actions, ids), ref.step(actions, ids)
            _assert_step_equal(got, want, t)
            done = np.flatnonzero(got[2] | got[3])
            if len(done):
                ends += len(done)
                which = (np.arange(N) if ids is None else np.asarray(ids))[done][::-1]  # out of order
                _assert_reset_equal(ours.reset(which), ref.reset(which))
        assert ends >= 10
        assert ours.get_env_attr("max_len", [2, 0]) == ref.get_env_attr("max_len", [2, 0]) == [6, 6]
    finally:
        ours.close()
        ref.close()


def _assert_obs_equal(got: np.ndarray, want: np.ndarray, where: str) -> None:
    assert got.dtype == want.dtype == object and got.shape == want.shape, where
    for g, w in zip(got, want):
        assert list(g) == sorted(w), where  # the space's key order (the env returns another)
        for key in w:
            np.testing.assert_array_equal(g[key], w[key], err_msg=f"{where}: {key}")


def _assert_step_equal(got: tuple, want: tuple, t: int) -> None:
    _assert_obs_equal(got[0], want[0], f"step {t}")
    for name, g, w in zip(("rew", "terminated", "truncated"), got[1:4], want[1:4]):
        np.testing.assert_array_equal(g, w, err_msg=f"step {t}: {name}")
    assert got[1].dtype == np.float64 and got[2].dtype == got[3].dtype == np.bool_
    assert list(got[4]) == list(want[4]), f"step {t}: infos"


def _assert_reset_equal(got: tuple, want: tuple) -> None:
    _assert_obs_equal(got[0], want[0], "reset")
    assert got[1].dtype == object and list(got[1]) == list(want[1])


def _per_env(buffer: Any) -> list[Any]:
    """Each env's transitions, in the order its env made them (a VectorReplayBuffer's sub-buffers)."""
    return [buffer._meta[off : off + n] for off, n in zip(buffer._offset, buffer._lengths)]


class ObsPolicy:
    """A Tianshou policy whose action is a function of the observation alone: asynchronous
    collection then gives each env the same transitions whatever order the envs finish in."""

    @staticmethod
    def make() -> Any:
        from tianshou.algorithm.algorithm_base import Policy
        from tianshou.data import Batch

        class _Policy(Policy):
            def forward(self, batch: Any, state: Any = None, **kwargs: Any) -> Any:
                obs = np.asarray(batch.obs).reshape(len(batch.obs), -1)
                # A state, as Tianshou's own test policies return: its AsyncCollector indexes the
                # policy's outputs per env, which are empty without one (IndexError).
                state = np.zeros((len(obs), 1)) if state is None else state
                return Batch(act=obs[:, :64].astype(np.int64).sum(axis=1) % 4, state=state)

        return _Policy(action_space=spaces.Discrete(4))


@pytest.mark.parametrize(("wait_num", "timeout"), [(3, None), (None, 0.002)])
def test_async_collection_gives_each_env_what_subproc_gives(ts, no_leaks, wait_num, timeout):
    """AsyncCollector over 6 envs whose steps sleep 0.5-6 ms: the envs come back in whatever order
    they finish, done envs are reset while the others step; each env's transitions equal those
    Tianshou's SubprocVectorEnv gives it (the common part: how many each env made depends on timing).
    Not ShmemVectorEnv: its observation buffers come from multiprocessing's heap, whose file stays
    open for the rest of the process (no_leaks would count it)."""
    from tianshou.env import SubprocVectorEnv

    n, plan = 6, [{"n_step": 240}, {"n_episode": 8}]
    got = _collect(ts.ShmTianshouVectorEnv([WAITING] * n, wait_num, timeout), ObsPolicy.make(), plan,
                   collector="AsyncCollector")  # fmt: skip
    want = _collect(SubprocVectorEnv([WAITING] * n, wait_num, timeout), ObsPolicy.make(), plan,
                    collector="AsyncCollector")  # fmt: skip
    compared = 0
    for i, (a, b) in enumerate(zip(_per_env(got[0]), _per_env(want[0]))):
        k = min(len(a), len(b))
        assert k >= 10, f"env {i}: {len(a)} and {len(b)} transitions"
        assert_same(a[:k], b[:k], f"env {i}")
        assert set(a.info.env_id) == {i}
        compared += k
    assert compared >= 150


def test_async_step_returns_the_first_done_and_resets_while_others_step(ts, no_leaks, tmp_path):
    """wait_num=1, envs 1 and 2 held in their step by gates: env 0 returns alone, is reset and stepped
    again while they step; they come back as their gates open, each in a step of its own."""
    gates = [Gate(tmp_path / f"gate{i}") for i in (1, 2)]
    fns = [functools.partial(FaultyEnv, delay=0.05)] + [
        functools.partial(FaultyEnv, gate=g.path) for g in gates
    ]
    venv = ts.ShmTianshouVectorEnv(fns, wait_num=1)
    try:
        obs0, _ = venv.reset(seed=0)
        for gate in gates:
            gate.close()
        info = venv.step(np.array([1, 2, 0]), [0, 1, 2])[4]
        assert [d["env_id"] for d in info] == [0] and venv.waiting_id == [1, 2] and venv.ready_id == [0]
        with pytest.raises(ValueError, match="stepping"):
            venv.step(np.array([0]), [1])
        with pytest.raises(ValueError, match="stepping"):
            venv.reset([2])
        with pytest.raises(RuntimeError, match="still stepping"):
            venv.get_env_attr("at")
        with pytest.raises(RuntimeError, match="still stepping"):
            venv.render()
        again, _ = venv.reset(0, seed=0)  # while envs 1 and 2 step
        np.testing.assert_array_equal(again, obs0[:1])
        returned = [d["env_id"] for d in venv.step(np.array([0]), [0])[4]]
        for gate in gates:
            gate.open()
            returned += [d["env_id"] for d in venv.step(None)[4]]
        assert returned == [0, 1, 2]
        with pytest.raises(RuntimeError, match="no env is stepping"):
            venv.step(None)  # Tianshou's own would wait forever
    finally:
        venv.close()


def test_timeout_returns_what_is_done_then(ts, no_leaks, tmp_path):
    gate = Gate(tmp_path / "gate")
    venv = ts.ShmTianshouVectorEnv(
        [FaultyEnv, FaultyEnv, functools.partial(FaultyEnv, gate=gate.path)], timeout=1.0
    )
    try:
        venv.reset()
        gate.close()
        info = venv.step(np.array([0, 0, 0]))[4]
        assert sorted(d["env_id"] for d in info) == [0, 1]
        gate.open()
        assert [d["env_id"] for d in venv.step(None)[4]] == [2]
    finally:
        venv.close()


def test_spaces_may_differ_in_bounds_not_in_shape(ts, no_leaks):
    from shmvec.errors import SpaceMismatchError

    sizes = [3, 5]
    fns = [functools.partial(_Bounded, size) for size in sizes]
    venv = ts.ShmTianshouVectorEnv(fns)
    try:
        assert [s.high[0] for s in venv.observation_space] == [2.0, 4.0]
        assert venv.action_space == [spaces.Discrete(3), spaces.Discrete(5)]
        assert venv.get_env_attr("size") == sizes
        venv.set_env_attr("size", 7, [1])
        assert venv.get_env_attr("size") == [3, 7]
    finally:
        venv.close()
    with pytest.raises(SpaceMismatchError, match="same shapes and dtypes"):
        ts.ShmTianshouVectorEnv([functools.partial(_Bounded, 3), functools.partial(_Bounded, 3, 2)])


class _Bounded(gym.Env):
    """Box(0, size - 1, (width,)) observations and Discrete(size) actions."""

    def __init__(self, size: int, width: int = 1) -> None:
        self.size = size
        self.observation_space = spaces.Box(0, size - 1, (width,), np.float32)
        self.action_space = spaces.Discrete(size)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action):
        return np.zeros(self.observation_space.shape, np.float32), 0.0, False, False, {}


def test_seed_and_action_spaces_as_dummy(ts, no_leaks):
    from tianshou.env import DummyVectorEnv

    fns = [PIXELS] * 3
    ours, ref = ts.ShmTianshouVectorEnv(fns), DummyVectorEnv(fns)
    try:
        assert ours.seed(11) == ref.seed(11) == [[11], [12], [13]]
        samples = [[s.sample() for _ in range(5)] for s in ours.action_space]
        assert samples == [[s.sample() for _ in range(5)] for s in ref.action_space]
        np.testing.assert_array_equal(ours.reset()[0], ref.reset()[0])  # after seed(), as Dummy's
        np.testing.assert_array_equal(ours.reset(seed=2)[0], ref.reset(seed=2)[0])  # one seed for all
        for got, want in zip(ours.render(), ref.render(), strict=True):
            np.testing.assert_array_equal(got, want)
    finally:
        ours.close()
        ref.close()


def test_bad_calls_raise_before_anything_is_sent(ts, no_leaks):
    from shmvec.errors import ClosedError

    for kwargs, message in [
        ({"wait_num": 5}, "wait_num should be in"),
        ({"timeout": 0}, "should be positive"),
        ({"device": "cpu"}, "does not take device"),
        ({"copy": False}, "does not take copy=False"),
    ]:
        with pytest.raises(ValueError, match=message):
            ts.ShmTianshouVectorEnv([PIXELS] * 2, **kwargs)
    with pytest.raises(TypeError, match="autoreset"):
        ts.ShmTianshouVectorEnv([PIXELS] * 2, autoreset="next_step")
    venv = ts.ShmTianshouVectorEnv([PIXELS] * 4, n_workers=2)
    try:
        venv.reset()
        for ids, actions, error, message in [
            ([0, 4], [0, 0], ValueError, r"in 0\.\.3"),
            ([1, 1], [0, 0], ValueError, "must not repeat"),
            ([0, 1], [0], ValueError, "expected 2 actions"),
            (None, None, ValueError, "not-None"),
        ]:
            with pytest.raises(error, match=message):
                venv.step(None if actions is None else np.array(actions), ids)
        assert len(venv.step(np.array([0, 0]), [1, 2])[0]) == 2  # a synchronous step may split a group
        assert venv.waiting_id == [] and len(venv.step(np.zeros(4, np.int64))[0]) == 4  # still usable
        obs, infos = venv.reset([1, 0])  # a masked reset may split a group (nothing steps)
        assert obs.shape == (2, 4, 42, 42) and len(infos) == 2
    finally:
        venv.close()
    venv.close()  # idempotent (Tianshou's own raise here)
    assert venv.is_closed
    with pytest.raises(ClosedError):
        venv.step(np.zeros(4, np.int64))
    # Asynchronous collection and restart mode take whole groups only.
    for kwargs, message in [
        ({"wait_num": 2}, r"worker 0 steps envs 0\.\.1 together"),
        (
            {"on_crash": "restart"},
            r"worker 0 steps envs 0\.\.1 together: name all of them or none, got \[1, 2\] \(with on_crash='restart'",
        ),
    ]:
        venv = ts.ShmTianshouVectorEnv([PIXELS] * 4, n_workers=2, **kwargs)
        try:
            venv.reset()
            with pytest.raises(ValueError, match=message):
                venv.step(np.array([0, 0]), [1, 2])
            assert venv.waiting_id == []  # nothing was sent
        finally:
            venv.close()


def test_nothing_imports_tianshou_but_its_face():
    """``import shmvec`` (and its faces) stay free of Tianshou; forkserver workers import neither
    Tianshou nor torch."""
    script = (
        "import sys, shmvec, shmvec.vector_env, shmvec.engine.core, shmvec.worker.loop\n"
        "print(sorted(m for m in ('tianshou', 'torch') if m in sys.modules))\n"
    )
    out = run_python("-c", script)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_workers_import_neither_tianshou_nor_torch(ts, no_leaks):
    venv = ts.ShmTianshouVectorEnv([DictImageEnv] * 2, start_method="forkserver")
    try:
        assert "tianshou" in sys.modules
        loaded = venv.get_env_attr("loaded_modules")
        assert all("gymnasium" in names for names in loaded)  # the probe itself works
        assert [("tianshou" in names, "torch" in names) for names in loaded] == [(False, False)] * 2
    finally:
        venv.close()
