"""What the engine's ``recv`` returns: one batch of envs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from shmvec.engine.typed_infos import TypedRows


@dataclass
class Batch:
    """What one batch of envs gave. Positions are places in the batch: the env index itself when
    ``env_ids`` is None (every env, in order).

    :param env_ids: ``(batch_size,)`` int32, the envs of the batch; None: every env, in env order.
    :param obs: the observation leaves (see :mod:`shmvec.memory.layout`), batched; with ``copy=True``
        the caller's own, else read-only views valid for ``n_slots - 1`` more batches.
    :param rewards: ``(batch_size,)`` float64; for every env, a view of the ring valid until the next
        step, else a fresh array (as the two below).
    :param terminated: ``(batch_size,)`` bool.
    :param truncated: ``(batch_size,)`` bool.
    :param infos: position -> its step info, for the envs whose info was not empty (fresh dicts; a
        reset's infos when the batch is reset observations).
    :param reset_infos: position -> reset info, for envs reset within this step.
    :param finals: position -> terminal observation leaves (copies), for envs whose episode ended
        in this step (same-step autoreset, and envs rebuilt by restart mode).
    :param typed: with the engine's ``info_form="arrays"``: the typed info values of the batch as
        columns, not merged into ``infos`` (None otherwise, or when nothing was typed).
    """

    env_ids: np.ndarray | None
    obs: list[np.ndarray]
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infos: dict[int, dict[str, Any]]
    reset_infos: dict[int, dict[str, Any]]
    finals: dict[int, list[np.ndarray]]
    typed: TypedRows | None = None
