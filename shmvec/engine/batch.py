"""What the engine returns for one step of every env."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class StepBatch:
    """What one step of every env gave.

    :param obs: the observation leaves (see :mod:`shmvec.layout`), batched; with ``copy=True`` the
        caller's own, else read-only views valid for ``n_slots - 1`` more batches.
    :param rewards: ``(n_envs,)`` float64, a view of the ring valid until the next step.
    :param terminated: ``(n_envs,)`` bool, likewise.
    :param truncated: ``(n_envs,)`` bool, likewise.
    :param infos: env index -> its step info, for envs whose info was not empty (fresh dicts).
    :param reset_infos: env index -> reset info, for envs reset within this step.
    :param finals: env index -> terminal observation leaves (copies), for envs whose episode ended
        in this step (same-step autoreset, and envs rebuilt by restart mode).
    """

    obs: list[np.ndarray]
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infos: dict[int, dict[str, Any]]
    reset_infos: dict[int, dict[str, Any]]
    finals: dict[int, list[np.ndarray]]
