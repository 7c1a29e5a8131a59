"""``shmvec.torchrl.ShmTorchRLEnv`` in TorchRL's own loop: a ``Collector`` over it collects what the
same ``Collector`` over TorchRL's ``SerialEnv`` of the same factories collects, array for array and
key for key, with the same seeds; TorchRL's spec checks pass; nothing is left after ``close()``.

Needs the ``torchrl`` extra (marked ``rl_library``: CI's TorchRL stage runs these).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from shmvec.synthetic import SyntheticImageEnv
from tests.envs import DictImageEnv
from tests.helpers import ROOT, require, run_script

pytestmark = pytest.mark.rl_library

FRAMES = functools.partial(SyntheticImageEnv, (16, 16, 3), episode_len=(4, 11))  # RGB: TorchRL's "pixels"
STACKED = functools.partial(SyntheticImageEnv, (4, 21, 21), episode_len=(3, 9))  # Atari-like stack
FACTORIES = {"frames": FRAMES, "stacked": STACKED, "dict": DictImageEnv}


@pytest.fixture(scope="module")
def torchrl():
    return require("torchrl", 'pip install -e ".[torchrl]"')


def _serial(fns):
    from torchrl.envs import GymWrapper, SerialEnv

    return SerialEnv(len(fns), [functools.partial(lambda fn: GymWrapper(fn()), fn) for fn in fns])


def _collect(env, seed: int, frames: int = 96, n_envs: int = 4):
    """What TorchRL's Collector (random policy) collects from ``env`` seeded with ``seed``: all
    batches, stacked. The Collector's shutdown closes ``env``."""
    import torch
    from torchrl.collectors import Collector

    env.set_seed(seed)
    torch.manual_seed(seed)  # the random policy draws from torch's generator
    collector = Collector(env, None, frames_per_batch=n_envs * 8, total_frames=frames)
    try:
        return torch.stack([batch.clone() for batch in collector])
    finally:
        collector.shutdown()


def assert_same_data(got, want) -> None:
    """Same keys, and each entry equal in shape, dtype and values."""
    import torch

    got_keys, want_keys = set(got.keys(True, True)), set(want.keys(True, True))
    assert got_keys == want_keys, f"keys differ: {sorted(map(str, got_keys ^ want_keys))}"
    for key in sorted(want_keys, key=str):
        a, b = got.get(key), want.get(key)
        assert (a.shape, a.dtype) == (b.shape, b.dtype), f"{key}: {a.shape} {a.dtype} != {b.shape} {b.dtype}"
        assert torch.equal(a, b), f"{key}: values differ at {torch.nonzero(a != b)[:3].tolist()}"


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_collector_equals_serial_env(torchrl, no_leaks, kind):
    """Four envs in two workers, episodes of a few steps (resets by TorchRL's reset mask mid-batch):
    every entry the Collector returns, observations after resets included, equals SerialEnv's."""
    from shmvec.torchrl import ShmTorchRLEnv

    fns = [FACTORIES[kind]] * 4
    got = _collect(ShmTorchRLEnv(fns, n_workers=2), seed=11)
    want = _collect(_serial(fns), seed=11)
    assert got["next", "done"].any() and got["done"].sum() < got["done"].numel()  # resets happened
    assert_same_data(got, want)


def test_a_different_seed_is_told_apart(torchrl, no_leaks):
    """Negative control: the same comparison fails when one side is seeded otherwise."""
    from shmvec.torchrl import ShmTorchRLEnv

    got = _collect(ShmTorchRLEnv([FRAMES] * 4, n_workers=2), seed=12)
    want = _collect(_serial([FRAMES] * 4), seed=11)
    with pytest.raises(AssertionError, match="values differ"):
        assert_same_data(got, want)


def _leaves(spec) -> dict:
    """A spec's leaves by key, compared leaf by leaf: SerialEnv's Composite says device=cpu, ours None."""
    return dict(spec.items(True, True)) if hasattr(spec, "items") else {(): spec}


def test_keys_and_specs_are_serial_envs(torchrl, no_leaks):
    """RGB frames are ``"pixels"`` as in SerialEnv (a bare GymWrapper of a vector env names them
    ``"observation"``); TorchRL's check_env_specs passes; specs equal SerialEnv's."""
    from torchrl.envs.utils import check_env_specs

    from shmvec.torchrl import ShmTorchRLEnv

    for fn in (FRAMES, DictImageEnv):
        env, ref = ShmTorchRLEnv([fn] * 3, n_workers=1), _serial([fn] * 3)
        try:
            check_env_specs(env)
            assert env.batch_size == ref.batch_size == (3,)
            for name in ("observation_spec", "action_spec", "full_done_spec", "reward_spec"):
                mine, theirs = getattr(env, name), getattr(ref, name)
                assert _leaves(mine) == _leaves(theirs), name
        finally:
            env.close()
            ref.close(raise_if_closed=False)  # SerialEnv never started: its workers never ran


def test_set_seed_chains_as_serial_env(torchrl, no_leaks):
    """``set_seed`` returns SerialEnv's next seed and seeds each env as SerialEnv does (static too)."""
    from shmvec.torchrl import ShmTorchRLEnv

    env, ref = ShmTorchRLEnv([FRAMES] * 3, n_workers=1), _serial([FRAMES] * 3)
    try:
        for static in (False, True):
            assert env.set_seed(5, static_seed=static) == ref.set_seed(5, static_seed=static)
            assert_same_data(env.reset(), ref.reset())
        seeds = env.vector_env.np_random_seed
        assert len(set(seeds)) == 1  # static: every env got 5
    finally:
        env.close()
        ref.close(raise_if_closed=False)


def test_device_puts_specs_and_data_there(torchrl, no_leaks):
    """``device=`` is TorchRL's env device (here the CPU, the one device on this machine)."""
    import torch

    from shmvec.torchrl import ShmTorchRLEnv

    env = ShmTorchRLEnv([FRAMES] * 2, n_workers=1, device="cpu")
    try:
        assert env.device == torch.device("cpu")
        assert env.observation_spec["pixels"].device == torch.device("cpu")
        td = env.rollout(5)
        assert td.device == torch.device("cpu") and td["pixels"].dtype == torch.uint8
    finally:
        env.close()


def test_close_leaves_nothing_and_is_idempotent(torchrl, no_leaks):
    from shmvec.torchrl import ShmTorchRLEnv

    env = ShmTorchRLEnv([FRAMES] * 4, n_workers=2)
    env.rollout(3)
    env.close()  # no_leaks: no worker, segment or fd left after this
    assert env.is_closed and env.vector_env.closed
    env.close(raise_if_closed=False)


@pytest.mark.parametrize(
    "option", [{"autoreset_mode": "next_step"}, {"batch_size": 2}, {"pool_order": "deterministic"}]
)
def test_options_torchrl_cannot_use_are_refused(torchrl, no_leaks, option):
    from shmvec.torchrl import ShmTorchRLEnv

    with pytest.raises(ValueError, match=f"{next(iter(option))}= is not taken"):
        ShmTorchRLEnv([FRAMES] * 4, **option)


def test_a_bare_gym_wrapper_differs(torchrl, no_leaks):
    """Why the adapter exists: TorchRL's GymWrapper over a ShmVectorEnv refuses Gymnasium's default
    autoreset mode, and in DISABLED mode names RGB frames "observation" and seeds env i with s + i."""
    from torchrl.envs import GymWrapper

    from shmvec import ShmVectorEnv

    venv = ShmVectorEnv([FRAMES] * 2, n_workers=1)
    try:
        with pytest.raises(RuntimeError, match="auto-reset mode"):
            GymWrapper(venv)
    finally:
        venv.close()
    bare = GymWrapper(ShmVectorEnv([FRAMES] * 2, n_workers=1, autoreset_mode="disabled"))
    try:
        assert list(bare.observation_spec.keys()) == ["observation"]
        bare.set_seed(5)
        assert bare._env.np_random_seed == (5, 6)
    finally:
        bare.close()


@pytest.mark.slow
def test_breakout_recipe_equals_serial_env(torchrl, no_leaks):
    """The benchmark's workload (Breakout, AtariPreprocessing + FrameStackObservation(4)), 8 envs
    in the default number of workers: 1,024 frames equal SerialEnv's."""
    require("ale_py", 'pip install -e ".[atari]"')
    from shmvec.bench.envs import atari_preprocessed
    from shmvec.torchrl import ShmTorchRLEnv

    fns = [functools.partial(atari_preprocessed, "ALE/Breakout-v5")] * 8
    got = _collect(ShmTorchRLEnv(fns), seed=3, frames=1024, n_envs=8)
    want = _collect(_serial(fns), seed=3, frames=1024, n_envs=8)
    assert np.asarray(got["next", "reward"]).any()
    assert_same_data(got, want)


@pytest.mark.slow
def test_the_guides_loop_runs(torchrl, tmp_path):
    """The guide's whole loop (its ```py block: the docs' snippet test runs ```python blocks in a
    stage without TorchRL) runs as written."""
    import re

    blocks = re.findall(r"^```py\n(.*?)^```", (ROOT / "docs/guides/torchrl.md").read_text(), re.S | re.M)
    assert len(blocks) == 1
    done = run_script(tmp_path / "loop.py", blocks[0], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("torch.Size([8, 32, 4, 84, 84])") == 4, done.stdout
