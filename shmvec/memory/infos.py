"""Typed info columns: numeric scalar info values in the ring instead of pickled through the pipe.

Many envs return the same few numeric scalars in every step's info (ALE: ``lives``,
``episode_frame_number``, ``frame_number``). Pickling them in the worker and unpickling a dict per env
in the main process is most of what the main process does per env and step on Pong. A *schema* names
the first keys of an info dict and the exact type of each value (``int``, ``float``, ``bool`` or a
numpy scalar type such as ``np.int32``); with one in place the worker writes those values into typed
columns of the ring (see :mod:`shmvec.memory.ring`) and sends only what is left of the info, if anything.

Nothing about the info dicts the caller gets changes: they are rebuilt with the same keys in the same
order, values of the same type (a Python ``int`` stays an ``int``, an ``np.int32`` an ``np.int32``)
and value. A schema only decides *how* values travel, never *what* arrives: an info that does not
start with the schema's keys in order, with values of exactly those types (a key missing, renamed,
reordered, or changing type; an ``int`` beyond int64), goes whole through the pipe, for that env and
step only. The worker marks per env and step which way its info went.

The schema is declared (``info_keys={"lives": int}``, keys in the order the env puts them in its
info) or, by default, learned by the engine from the first step whose infos are not all empty: the
most common run of leading keys with supported values among that step's infos.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np

#: Most typed columns a ring holds (8 bytes each per env and slot).
MAX_COLUMNS = 8

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_PYTHON_CODES: dict[Any, str] = {int: "q", float: "d", bool: "?"}
# struct's standard-size codes of numpy scalar types, by (dtype kind, itemsize).
_NUMPY_CODES = {
    **{("i", n): c for n, c in ((1, "b"), (2, "h"), (4, "i"), (8, "q"))},
    **{("u", n): c for n, c in ((1, "B"), (2, "H"), (4, "I"), (8, "Q"))},
    **{("f", n): c for n, c in ((2, "e"), (4, "f"), (8, "d"))},
    ("b", 1): "?",
}
_ROW = 8 * MAX_COLUMNS  # bytes of one env's row in one slot


def _supported(kind: Any) -> bool:
    """Whether values of exactly this type can travel in a column."""
    if kind in (int, float, bool):
        return True
    return (
        isinstance(kind, type)
        and issubclass(kind, (np.number, np.bool_))
        and (np.dtype(kind).kind, np.dtype(kind).itemsize) in _NUMPY_CODES
    )


@dataclass(frozen=True)
class InfoSchema:
    """The leading info keys that travel in typed columns, and the exact type of each value.

    :param keys: info keys, in the order the env puts them in its info dicts.
    :param types: per key: ``int``, ``float``, ``bool`` or a numpy scalar type of at most 8 bytes.
    """

    keys: tuple[str, ...]
    types: tuple[type, ...]

    def record(self) -> struct.Struct:
        """How one env's values are packed into its row of 8-byte words: each value at the start of
        its word, in its own size (int64 / float64 / bool for Python values, else the numpy type)."""
        fmt = "<"
        for kind in self.types:
            code = _code(kind)
            fmt += code + "x" * (8 - struct.calcsize("<" + code))
        return struct.Struct(fmt)


def _code(kind: type) -> str:
    """The struct code a value of type ``kind`` is packed with."""
    dtype = np.dtype(kind)
    return _PYTHON_CODES.get(kind) or _NUMPY_CODES[dtype.kind, dtype.itemsize]


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
    """The schema of one step's non-empty infos: the most common run of leading typed keys among
    them (the first seen on a tie); None when there is none, or every info is empty. Infos that do
    not match it later simply take the pipe."""
    runs = Counter(tuple(_leading(info)) for info in infos if info)
    if not runs:
        return None
    best = runs.most_common(1)[0][0]
    if not best:
        return None
    return InfoSchema(tuple(k for k, _ in best), tuple(t for _, t in best))


class InfoColumns:
    """The ring's typed info areas for one schema, in a worker or in the main process.

    Values are packed and unpacked with :mod:`struct` straight in the shared bytes: one C call per env
    each way, cheaper than numpy scalar indexing and than pickling the dict.

    :param schema: what the columns hold.
    :param words: the ring's ``(n_slots, n_envs, MAX_COLUMNS)`` uint64 info words (C-contiguous).
    :param mask: the ring's ``(n_slots, n_envs)`` uint8 flags: 1 where the env's info of that slot
        starts with the schema's keys (their values are in the columns).
    """

    def __init__(self, schema: InfoSchema, words: np.ndarray, mask: np.ndarray) -> None:
        assert words.flags.c_contiguous and words.shape[2] == MAX_COLUMNS and mask.flags.c_contiguous
        self.schema, self.mask = schema, mask
        self.keys, self.types = schema.keys, schema.types
        self.n_envs = mask.shape[1]
        self.record = schema.record()
        self.words = memoryview(words).cast("B")  # type: ignore[arg-type]
        self.word_bytes = words.view(np.uint8)  # (n_slots, n_envs, 8 * MAX_COLUMNS)
        self.codes = [_code(kind) for kind in self.types]
        # Per column: its bytes in a row, and the dtype Gymnasium's info batching gives its values.
        self._fields = [
            (c * 8, c * 8 + struct.calcsize("<" + code), np.dtype(kind))
            for c, (kind, code) in enumerate(zip(self.types, self.codes))
        ]
        self.flags = memoryview(mask).cast("B")  # type: ignore[arg-type]
        self.make = _dict_maker(schema)
        self.cleared = bytes(self.n_envs)
        self.last = self.cleared  # the flags of the slot read last (for tests and diagnostics)

    # ------------------------------------------------------------------ worker side

    def put(self, slot: int, i: int, info: dict[str, Any]) -> dict[str, Any]:
        """Write env ``i``'s (its row of the ring) leading schema values into ``slot``; the rest of the
        info, which goes through the pipe: everything if the info does not fit the schema."""
        at = slot * self.n_envs + i
        n = len(self.keys)
        size = len(info)
        if size == n:  # the usual case (ALE): plain tuples, no islice
            fits = tuple(info) == self.keys
            values = tuple(info.values()) if fits else ()
        else:
            fits = size > n and tuple(islice(info, n)) == self.keys
            values = tuple(islice(info.values(), n)) if fits else ()
        if fits and tuple(map(type, values)) == self.types:
            try:
                self.record.pack_into(self.words, at * _ROW, *values)
            except struct.error:  # an int beyond int64
                pass
            else:
                self.flags[at] = 1
                return {} if size == n else dict(islice(info.items(), n, None))
        self.flags[at] = 0
        return info

    # ------------------------------------------------------------------ main side

    def take(self, slot: int, envs: Sequence[range | list[int]]) -> tuple[list[np.ndarray], np.ndarray]:
        """The typed values the workers of ``envs`` wrote into ``slot``, as one array per key over
        those envs' rows (in ``envs`` order; the dtype Gymnasium's info batching gives a value of the
        key's type), and a bool mask of the rows whose info was typed. Consumes the flags read."""
        # One group (every pool batch of one worker, every synchronous step): a slice, so the
        # reads below are views and no index array is built.
        first = envs[0] if len(envs) == 1 else None
        rows: Any = (
            slice(first.start, first.stop) if isinstance(first, range) else [i for g in envs for i in g]
        )
        mask = self.mask[slot, rows].astype(bool)
        self.mask[slot, rows] = 0
        words = self.word_bytes[slot, rows]
        n = len(mask)
        return [
            np.ascontiguousarray(words[:, a:b]).view(dtype).reshape(n) for a, b, dtype in self._fields
        ], mask

    def read(self, slot: int, envs: Sequence[range | list[int]], infos: dict[int, dict[str, Any]]) -> None:
        """Rebuild the infos of the envs of ``envs`` whose values are in the columns of ``slot``:
        schema keys first, then what came through the pipe for them (``infos``, updated in place)."""
        first = slot * self.n_envs
        flags = self.flags[first : first + self.n_envs]
        self.last = row = bytes(flags)
        if not any(row):
            return
        wanted = None if sum(map(len, envs)) == self.n_envs else {i for g in envs for i in g}
        # Consumed: a flag is good for one write only, so a worker without the schema (one being
        # rebuilt) can never leave a stale 1 that makes old values look like this step's. Only the
        # flags read: in pool mode other groups' rows of this slot may still be unread.
        if wanted is None:
            flags[:] = self.cleared
        else:
            for i in wanted:
                flags[i] = 0
        make, unpack, words = self.make, self.record.unpack_from, self.words
        for i, flag in enumerate(row):
            if not flag or (wanted is not None and i not in wanted):
                continue
            info = make(unpack(words, (first + i) * _ROW))
            rest = infos.get(i)
            if rest:
                info.update(rest)
            infos[i] = info


def _dict_maker(schema: InfoSchema) -> Callable[[tuple[Any, ...]], dict[str, Any]]:
    """A function from unpacked values to the info dict, numpy values as numpy scalars of their type.

    Generated as one dict display (``lambda v: {"lives": v[0], ...}``): it builds the dict about twice
    as fast as ``dict(zip(keys, values))``, and the main process builds one per env and step. Keys
    enter the source as ``repr`` of a ``str``, which is always a plain literal.
    """
    names: dict[str, Any] = {}
    items = []
    for c, (key, kind) in enumerate(zip(schema.keys, schema.types)):
        assert type(key) is str
        if kind in _PYTHON_CODES:
            items.append(f"{key!r}: v[{c}]")
        else:
            names[f"t{c}"] = kind
            items.append(f"{key!r}: t{c}(v[{c}])")
    return eval("lambda v: {" + ", ".join(items) + "}", names)  # noqa: S307 - literals only, see above
