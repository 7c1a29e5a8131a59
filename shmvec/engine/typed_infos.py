"""The engine's side of typed info columns (:mod:`shmvec.memory.infos`): which schema is in force,
learning it from the first infos, and reading each batch's values back: merged into the info dicts
(SB3's face needs one dict per env) or as one array per key over the batch (Gymnasium's face builds
its dict of arrays from them with numpy, no per-env dict)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shmvec.memory.infos import MAX_COLUMNS, InfoColumns, InfoSchema, declared, learn
from shmvec.memory.ring import Ring

#: Step batches whose infos are looked at for a schema before giving up (all of them empty so far).
LEARN_STEPS = 8


def columns_for(info_keys: Any) -> int:
    """Typed columns the ring needs for the ``info_keys`` option ("auto", None or a mapping).

    :raises ValueError: for anything else, or a mapping :func:`shmvec.memory.infos.declared` refuses.
    """
    if info_keys is None:
        return 0
    if isinstance(info_keys, str):
        if info_keys != "auto":
            raise ValueError(
                f'info_keys must be "auto", None or a mapping from info key to type, got {info_keys!r}'
            )
        return MAX_COLUMNS
    schema = declared(info_keys)
    return 0 if schema is None else MAX_COLUMNS


@dataclass
class TypedRows:
    """The typed info values of a batch: ``columns[k]`` holds key ``keys[k]`` for every position
    (as the dtype Gymnasium's info batching gives a value of ``types[k]``); ``mask`` marks the
    positions whose info was typed (the others' values are meaningless there)."""

    keys: tuple[str, ...]
    types: tuple[type, ...]
    columns: list[np.ndarray]
    mask: np.ndarray


class TypedInfos:
    """Typed infos of one engine.

    :param info_keys: "auto" (learn the schema from the first step), None (off) or a mapping from key
        to type (declared; see :func:`shmvec.memory.infos.declared`).
    :param ring: the engine's ring (with info columns unless ``info_keys`` turns them off).
    :param n_workers: the engine's workers (each is told a learned schema once, see :meth:`tell`).
    """

    def __init__(self, info_keys: Any, ring: Ring, n_workers: int) -> None:
        self.areas = ring.info_words
        self.columns: InfoColumns | None = None
        self.learning = info_keys == "auto" and self.areas is not None
        self.left = LEARN_STEPS
        self.n_workers = n_workers
        self.untold: set[int] = set()  # workers not yet told the schema learned
        if info_keys is not None and not isinstance(info_keys, str):
            self._use(declared(info_keys))

    def close(self) -> None:
        """Let go of the ring's info areas (the engine is closed)."""
        self.areas = self.columns = None
        self.learning = False

    def _use(self, schema: InfoSchema | None) -> None:
        if schema is not None and self.areas is not None:
            self.columns = InfoColumns(schema, *self.areas)

    def read(self, slot: int, envs: Sequence[range | list[int]], infos: dict[int, dict[str, Any]]) -> None:
        """Complete ``infos`` (env -> what came through the pipe) with the typed values the workers of
        ``envs`` wrote into ``slot``; while learning, :meth:`learn` from them instead."""
        if self.columns is not None:
            self.columns.read(slot, envs, infos)
        else:
            self.learn(infos)

    def rows(
        self, parts: Sequence[tuple[int, range | list[int]]], infos: dict[int, dict[str, Any]]
    ) -> TypedRows | None:
        """The typed values of the batch made of ``parts`` (``(slot, group)`` each, in batch order) as
        columns (see :class:`TypedRows`), or None when no schema is in force (then, while learning,
        :meth:`learn` from ``infos``: position -> what came through the pipe)."""
        columns = self.columns
        if columns is None:
            self.learn(infos)
            return None
        taken = [columns.take(slot, [g]) for slot, g in parts]
        if len(taken) == 1:
            values, mask = taken[0]
        else:
            values = [np.concatenate([t[0][k] for t in taken]) for k in range(len(columns.keys))]
            mask = np.concatenate([t[1] for t in taken])
        return TypedRows(columns.keys, columns.types, values, mask)

    def learn(self, infos: dict[int, dict[str, Any]]) -> None:
        """While learning, look at one batch's ``infos`` (what came through the pipe): a schema found
        is in force here from now on, and every worker is to be told it (:meth:`tell`)."""
        if not self.learning:
            return
        self.left -= 1
        if not infos and self.left > 0:
            return
        self.learning = False
        self._use(learn(list(infos.values())))
        if self.columns is not None:
            self.untold = set(range(self.n_workers))

    def tell(self, workers: list[int]) -> list[int]:
        """Which of ``workers`` (idle: about to be given a step) are to be told the learned schema
        now, counted as told: every worker at once on a synchronous step; in pool mode each at its
        next step, as the others are busy meanwhile. Until told, a worker's infos come whole through
        its pipe (the ring's flags say which rows are typed)."""
        now = [w for w in workers if w in self.untold]
        self.untold.difference_update(now)
        return now
