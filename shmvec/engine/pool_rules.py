"""The rules of pool mode: the orders a batch can be made in, which worker counts fill a batch with
whole groups, and what one ``recv`` gives (:class:`PoolBatch`). The scheduling itself is in
:mod:`shmvec.engine.scheduler`, the reading of a batch in :mod:`shmvec.engine.pool_reader`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# The "reply" of a worker rebuilt by restart mode: its envs end their episode (read no codec frame).
RESTARTED = "restarted"

FIRST_READY = "first_ready"
DETERMINISTIC = "deterministic"
POOL_ORDERS = (FIRST_READY, DETERMINISTIC)


def _fits(num_envs: int, batch_size: int, n_workers: int) -> bool:
    return num_envs % n_workers == 0 and batch_size % (num_envs // n_workers) == 0


def pool_workers(num_envs: int, batch_size: int, n_workers: int | str | None, cpus: int) -> int | str | None:
    """The worker count of a pool: groups of equal size that fill a batch whole.

    ``n_workers=None``: the smallest count >= ``min(num_envs, cpus)`` (as many workers as CPUs, as
    in sync mode, so the envs left stepping while the caller holds a batch can use every CPU) that
    divides ``num_envs`` into groups whose size divides ``batch_size``. With ``batch_size ==
    num_envs`` any worker count fills a batch: ``n_workers`` is returned as given.

    :raises ValueError: for a ``batch_size`` out of range, or an ``n_workers`` whose groups cannot
        fill a batch whole (the message lists the counts that can).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise TypeError(f"batch_size must be an int or None, got {batch_size!r}")
    if not 1 <= batch_size <= num_envs:
        raise ValueError(f"batch_size must be between 1 and num_envs={num_envs}, got {batch_size}")
    if batch_size == num_envs:
        return n_workers  # one batch is every group, whatever their sizes
    valid = [n for n in range(1, num_envs + 1) if _fits(num_envs, batch_size, n)]
    if n_workers is None:
        return next(n for n in valid if n >= min(num_envs, cpus))
    if n_workers not in valid:
        raise ValueError(
            f"pool mode fills each batch with whole worker groups of equal size: n_workers={n_workers} "
            f"cannot split num_envs={num_envs} into groups that fill batch_size={batch_size}; "
            f"use one of n_workers={valid} (or None to choose)"
        )
    return n_workers


@dataclass
class PoolBatch:
    """What one ``recv`` gives: ``batch_size`` envs, in ``env_ids`` order.

    :param env_ids: ``(batch_size,)`` int32, the envs of the batch.
    :param obs: the observation leaves, ``(batch_size, ...)`` each.
    :param rewards: ``(batch_size,)`` float64 (fresh arrays, as the three below).
    :param terminated: ``(batch_size,)`` bool.
    :param truncated: ``(batch_size,)`` bool.
    :param infos: position in the batch -> the env's info, for envs whose info was not empty.
    """

    env_ids: np.ndarray
    obs: list[np.ndarray]
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infos: dict[int, dict[str, Any]]


__all__ = ["DETERMINISTIC", "FIRST_READY", "POOL_ORDERS", "RESTARTED", "PoolBatch", "pool_workers"]
