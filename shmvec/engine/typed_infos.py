"""The engine's side of typed info columns (:mod:`shmvec.infos`): which schema is in force, learning
it from the first infos, and rebuilding the info dicts of each step from the ring."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shmvec.infos import MAX_COLUMNS, InfoColumns, InfoSchema, declared, learn
from shmvec.ring import Ring

#: Step batches whose infos are looked at for a schema before giving up (all of them empty so far).
LEARN_STEPS = 8


def columns_for(info_keys: Any) -> int:
    """Typed columns the ring needs for the ``info_keys`` option ("auto", None or a mapping).

    :raises ValueError: for anything else, or a mapping :func:`shmvec.infos.declared` refuses.
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


class TypedInfos:
    """Typed infos of one engine.

    :param info_keys: "auto" (learn the schema from the first step), None (off) or a mapping from key
        to type (declared; see :func:`shmvec.infos.declared`).
    :param ring: the engine's ring (with info columns unless ``info_keys`` turns them off).
    """

    def __init__(self, info_keys: Any, ring: Ring) -> None:
        self.areas = ring.info_words
        self.columns: InfoColumns | None = None
        self.learning = info_keys == "auto" and self.areas is not None
        self.left = LEARN_STEPS
        if info_keys is not None and not isinstance(info_keys, str):
            self._use(declared(info_keys))

    def _use(self, schema: InfoSchema | None) -> None:
        if schema is not None and self.areas is not None:
            self.columns = InfoColumns(schema, *self.areas)

    def worker_options(self) -> dict[str, Any]:
        """What a worker's ``configure`` needs to write the columns (empty: no schema in force)."""
        return {} if self.columns is None else {"info_schema": self.columns.schema}

    def read(self, slot: int, envs: Sequence[range], infos: dict[int, dict[str, Any]]) -> dict[str, Any]:
        """Complete ``infos`` (env -> what came through the pipe) with the typed values the workers of
        ``envs`` wrote into ``slot``. While learning, look at the infos for a schema: the ``configure``
        options to send every worker when one is found (else empty)."""
        if self.columns is not None:
            self.columns.read(slot, envs, infos)
            return {}
        if not self.learning:
            return {}
        self.left -= 1
        if not infos and self.left > 0:
            return {}
        self.learning = False
        self._use(learn(list(infos.values())))
        return self.worker_options()
