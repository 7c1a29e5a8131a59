"""copy=True lends ring slots without copying, and never writes a slot something still references."""

from __future__ import annotations

import functools

import numpy as np
import torch

from shmvec import ShmVecEnv
from shmvec.synthetic import SyntheticImageEnv
from tests.envs import DictImageEnv

IMAGE = functools.partial(SyntheticImageEnv, (12, 10, 3), episode_len=(2, 5))
ACTIONS = np.zeros(3, np.int64)


def test_held_arrays_views_and_tensors_never_change(no_leaks):
    with ShmVecEnv([IMAGE] * 3, "fork", n_workers=2) as env:
        env.seed(0)
        kept = [env.reset()]
        for t in range(30):
            obs = env.step(ACTIONS)[0]
            # Keep every third batch whole, a view of every third, a tensor of the rest.
            kept.append(obs if t % 3 == 0 else obs[1:, ::2] if t % 3 == 1 else torch.as_tensor(obs))
        # A tensor read through .numpy(): torch's __array__ predates NumPy 2's copy keyword.
        arrays = [k.numpy() if isinstance(k, torch.Tensor) else k for k in kept]
        snapshots = [np.array(a) for a in arrays]
        for _ in range(30):
            env.step(ACTIONS)
        for a, snap in zip(arrays, snapshots):
            np.testing.assert_array_equal(a, snap)
        assert env.copy_fallbacks > 0  # holding everything forces copies, as it must


def test_no_copy_when_caller_holds_one_batch(no_leaks):
    with ShmVecEnv([IMAGE] * 3, "fork") as env:
        env.reset()
        previous = None
        for _ in range(20):
            obs = env.step(ACTIONS)[0]
            assert previous is None or not np.shares_memory(obs, previous)
            previous = obs  # like SB3's _last_obs
        assert env.copy_fallbacks == 0


def test_dict_obs_lent_per_leaf_and_writable(no_leaks):
    with ShmVecEnv([DictImageEnv] * 2, "fork") as env:
        obs = env.reset()
        image = obs["image"]  # keep one leaf only: its slot stays reserved
        snapshot = image.copy()
        assert image.flags.writeable
        for _ in range(10):
            env.step(np.zeros((2, 2), np.float32))
        np.testing.assert_array_equal(image, snapshot)


def test_single_slot_always_copies(no_leaks):
    with ShmVecEnv([IMAGE] * 3, "fork", n_slots=1) as env:
        first = env.reset()
        second = env.step(ACTIONS)[0]
        assert not np.shares_memory(first, second)
        assert env.copy_fallbacks == 2
