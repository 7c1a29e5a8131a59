"""Typed info columns: numeric scalar info values in the ring instead of pickled through the pipe.

Many envs return the same few numeric scalars in every step's info (ALE: ``lives``,
``episode_frame_number``, ``frame_number``). Pickling them in the worker and unpickling a dict per env
in the main process is most of what the main process does per env and step on Pong. A *schema* names
the first keys of an info dict and the exact type of each value (``int``, ``float``, ``bool`` or a
numpy scalar type such as ``np.int32``); with one in place the worker writes those values into typed
columns of the ring (see :mod:`shmvec.ring`) and sends only what is left of the info, if anything.

Nothing about the info dicts the caller gets changes: they are rebuilt with the same keys in the same
order, values of the same type (a Python ``int`` stays an ``int``, an ``np.int32`` an ``np.int32``)
and value. A schema only decides *how* values travel, never *what* arrives: an info that does not
start with the schema's keys in order, with values of exactly those types (a key missing, renamed,
reordered, or changing type; an ``int`` beyond int64), goes whole through the pipe, for that env and
step only. The worker marks per env and step which way its info went.

The schema is declared (``info_keys={"lives": int}``, keys in the order the env puts them in its
info) or, by default, learned by the engine from the first step whose infos are not all empty: the
longest run of leading keys with supported values that every non-empty info of that step shares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Most typed columns a ring holds (8 bytes each per env and slot).
MAX_COLUMNS = 8

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _supported(kind: Any) -> bool:
    """Whether values of exactly this type can travel in a column."""
    if kind in (int, float, bool):
        return True
    return (
        isinstance(kind, type)
        and issubclass(kind, (np.number, np.bool_))
        and np.dtype(kind).itemsize <= 8
        and np.dtype(kind).kind in "biuf"
    )


@dataclass(frozen=True)
class InfoSchema:
    """The leading info keys that travel in typed columns, and the exact type of each value.

    :param keys: info keys, in the order the env puts them in its info dicts.
    :param types: per key: ``int``, ``float``, ``bool`` or a numpy scalar type of at most 8 bytes.
    """

    keys: tuple[str, ...]
    types: tuple[type, ...]

    def dtype(self, c: int) -> np.dtype:
        """The column dtype of key ``c``: int64 / float64 / bool for Python values, else the numpy type."""
        kind = self.types[c]
        return np.dtype({int: np.int64, float: np.float64, bool: np.bool_}.get(kind, kind))


def declared(info_keys: Mapping[str, Any]) -> InfoSchema | None:
    """The schema of a user's ``info_keys`` mapping (None when it is empty).

    :raises ValueError: for a key that is not a string, a type that cannot travel in a column, or more
        than :data:`MAX_COLUMNS` keys.
    """
    if not isinstance(info_keys, Mapping):
        raise ValueError(
            f'info_keys must be "auto", None or a mapping from info key to type, got {info_keys!r}'
        )
    if len(info_keys) > MAX_COLUMNS:
        raise ValueError(f"info_keys declares {len(info_keys)} keys; at most {MAX_COLUMNS} fit the ring")
    for key, kind in info_keys.items():
        if not isinstance(key, str):
            raise ValueError(f"info_keys: key {key!r} is not a string")
        if not _supported(kind):
            raise ValueError(
                f"info_keys[{key!r}] = {kind!r}: only int, float, bool or a numpy scalar type of at most "
                "8 bytes (np.int32, np.float32, np.bool_...) can travel in a typed column"
            )
    if not info_keys:
        return None
    return InfoSchema(tuple(info_keys), tuple(info_keys.values()))


def _leading(info: dict[str, Any]) -> list[tuple[str, type]]:
    """The leading (key, type) pairs of ``info`` whose values could travel in a column."""
    out: list[tuple[str, type]] = []
    for key, value in info.items():
        kind = type(value)
        if not isinstance(key, str) or not _supported(kind) or len(out) == MAX_COLUMNS:
            break
        if kind is int and not _INT64_MIN <= value <= _INT64_MAX:
            break
        out.append((key, kind))
    return out


def learn(infos: Sequence[dict[str, Any]]) -> InfoSchema | None:
    """The schema of one step's non-empty infos: the leading typed keys they all share (None: none,
    or every info empty)."""
    common: list[tuple[str, type]] | None = None
    for info in infos:
        if not info:
            continue
        lead = _leading(info)
        if common is None:
            common = lead
        else:
            n = 0
            while n < min(len(common), len(lead)) and common[n] == lead[n]:
                n += 1
            del common[n:]
    if not common:
        return None
    return InfoSchema(tuple(k for k, _ in common), tuple(t for _, t in common))


class InfoColumns:
    """Typed views of the ring's info columns for one schema, in a worker or in the main process.

    :param schema: what the columns hold.
    :param words: the ring's ``(n_slots, n_envs, MAX_COLUMNS)`` uint64 info words.
    :param mask: the ring's ``(n_slots, n_envs)`` uint8 flags: 1 where the env's info of that slot
        starts with the schema's keys (their values are in the columns).
    """

    def __init__(self, schema: InfoSchema, words: np.ndarray, mask: np.ndarray) -> None:
        self.schema, self.mask = schema, mask
        self.keys = schema.keys
        self.types = schema.types
        self.n = len(schema.keys)
        as_bytes = words.view(np.uint8).reshape(*words.shape, 8)
        # One (n_slots, n_envs) view per key, in its own dtype, over the first bytes of its word.
        self.columns = [
            as_bytes[:, :, c, : schema.dtype(c).itemsize].view(schema.dtype(c))[..., 0] for c in range(self.n)
        ]
        # Python values come back as Python objects (tolist), numpy ones as numpy scalars (list).
        self.python = [kind in (int, float, bool) for kind in schema.types]

    # ------------------------------------------------------------------ worker side

    def put(self, slot: int, i: int, info: dict[str, Any]) -> dict[str, Any]:
        """Write env ``i``'s (its row of the ring) leading schema values into ``slot``; the rest of the
        info, which goes through the pipe: everything if the info does not fit the schema."""
        keys, types, n = self.keys, self.types, self.n
        if len(info) < n:
            self.mask[slot, i] = 0
            return info
        values: list[Any] = []
        for (key, value), want_key, want_type in zip(info.items(), keys, types):
            if key != want_key or type(value) is not want_type:
                self.mask[slot, i] = 0
                return info
            if want_type is int and not _INT64_MIN <= value <= _INT64_MAX:  # type: ignore[operator]
                self.mask[slot, i] = 0
                return info
            values.append(value)
        for column, value in zip(self.columns, values):
            column[slot, i] = value
        self.mask[slot, i] = 1
        if len(info) == n:
            return {}
        return dict(list(info.items())[n:])

    # ------------------------------------------------------------------ main side

    def read(self, slot: int, envs: Sequence[range], infos: dict[int, dict[str, Any]]) -> None:
        """Rebuild the infos of the envs of ``envs`` whose values are in the columns of ``slot``:
        schema keys first, then what came through the pipe for them (``infos``, updated in place)."""
        mask = self.mask[slot]
        typed = np.flatnonzero(mask).tolist()
        if not typed:
            return
        values = [
            column[slot].tolist() if python else list(column[slot])
            for column, python in zip(self.columns, self.python)
        ]
        rows = list(zip(*values))
        keys = self.keys
        for group in envs:
            for i in typed:
                if i < group.start or i >= group.stop:
                    continue
                info = dict(zip(keys, rows[i]))
                rest = infos.get(i)
                if rest:
                    info.update(rest)
                infos[i] = info
