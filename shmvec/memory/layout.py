"""From a gymnasium space to its leaves, and back.

An observation is a tree (Dict / Tuple) whose leaves are arrays (Box, Discrete, MultiDiscrete,
MultiBinary) or, for any other space (Text, Sequence, Graph, OneOf, a custom space), objects without
a fixed size. Shared memory holds one batched array per fixed-size leaf; an object leaf has no place
in it and travels pickled in the worker's reply (see :mod:`shmvec.engine.objects`). Three functions
walk the tree, each dispatched on the space type so a new space type is one small function, not
another ``if`` branch:

- :func:`leaves` lists the leaves (path, shape, dtype, fixed size or not) in a fixed order;
- :func:`flatten` turns one observation into its leaf values in that order;
- :func:`unflatten` builds an observation from leaf arrays in that order.

Dict leaves follow ``space.spaces`` order, never the order of the env's dict, so the batched
observation has the key order SB3 expects.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import singledispatch
from typing import Any

import numpy as np
from gymnasium import spaces

from shmvec.errors import ObservationError

Path = tuple[Any, ...]


@dataclass(frozen=True)
class Leaf:
    """One leaf of an observation space.

    :param path: keys (Dict) and indices (Tuple) from the root to this leaf; ``()`` for a plain space.
    :param shape: shape of one env's value (without the batch dimension); ``()`` for an object leaf.
    :param dtype: dtype of the shared-memory array (the space's dtype); ``object`` for an object leaf.
    :param fixed: True: an array of fixed size, kept in the ring; False: an object leaf (Text,
        Sequence, Graph, OneOf, custom spaces), whose values travel pickled in the workers' replies.
    """

    path: Path
    shape: tuple[int, ...]
    dtype: np.dtype
    fixed: bool = True

    @property
    def name(self) -> str:
        """Readable key for error messages: ``"obs"`` for a plain space, else ``"image"``, ``"0.pos"``."""
        return ".".join(str(p) for p in self.path) if self.path else "obs"

    @property
    def nbytes(self) -> int:
        """Bytes of one env's value."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@singledispatch
def leaves(space: spaces.Space, path: Path = ()) -> list[Leaf]:
    """List the leaves of ``space`` in a fixed order (depth first, Dict in ``space.spaces`` order).

    Box, Discrete, MultiDiscrete and MultiBinary are fixed-size leaves; any other space that is not a
    Dict or Tuple (Text, Sequence, Graph, OneOf, custom spaces) is one object leaf, whatever it holds.
    """
    return [Leaf(path, (), np.dtype(object), fixed=False)]


@leaves.register(spaces.Box)
@leaves.register(spaces.Discrete)
@leaves.register(spaces.MultiDiscrete)
@leaves.register(spaces.MultiBinary)
def _array_leaf(space: spaces.Space, path: Path = ()) -> list[Leaf]:
    assert space.shape is not None and space.dtype is not None
    return [Leaf(path, tuple(space.shape), np.dtype(space.dtype))]


@leaves.register(spaces.Dict)
def _dict_leaves(space: spaces.Dict, path: Path = ()) -> list[Leaf]:
    return [leaf for key, sub in space.spaces.items() for leaf in leaves(sub, (*path, key))]


@leaves.register(spaces.Tuple)
def _tuple_leaves(space: spaces.Tuple, path: Path = ()) -> list[Leaf]:
    return [leaf for i, sub in enumerate(space.spaces) for leaf in leaves(sub, (*path, i))]


@singledispatch
def flatten(space: spaces.Space, obs: Any, out: list[Any], path: Path = ()) -> list[Any]:
    """Append the leaf values of one observation to ``out`` in :func:`leaves` order; return ``out``.

    Values are not converted or checked here: :func:`write_leaf` does that against the leaf.
    """
    out.append(obs)
    return out


@flatten.register(spaces.Dict)
def _flatten_dict(space: spaces.Dict, obs: Any, out: list[Any], path: Path = ()) -> list[Any]:
    for key, sub in space.spaces.items():
        try:
            value = obs[key]
        except (KeyError, TypeError, IndexError):
            raise ObservationError(
                f"observation has no key {'.'.join(map(str, (*path, key)))!r} required by the Dict "
                f"observation space (got {type(obs).__name__}"
                f"{' with keys ' + repr(list(obs)) if isinstance(obs, dict) else ''})"
            ) from None
        flatten(sub, value, out, (*path, key))
    return out


@flatten.register(spaces.Tuple)
def _flatten_tuple(space: spaces.Tuple, obs: Any, out: list[Any], path: Path = ()) -> list[Any]:
    if not isinstance(obs, (tuple, list)) or len(obs) != len(space.spaces):
        raise ObservationError(
            f"observation at {'.'.join(map(str, path)) or 'root'!r} should be a tuple of "
            f"{len(space.spaces)} items for the Tuple observation space, got {type(obs).__name__}"
        )
    for i, sub in enumerate(space.spaces):
        flatten(sub, obs[i], out, (*path, i))
    return out


def assemble(space: spaces.Space, arrays: list[Any]) -> Any:
    """The observation (array, dict or tuple) of leaf values listed in :func:`leaves` order."""
    if not isinstance(space, (spaces.Dict, spaces.Tuple)):
        return arrays[0]  # one leaf: no dispatch on the per-step path
    return unflatten(space, iter(arrays))


@singledispatch
def unflatten(space: spaces.Space, arrays: Iterator[Any]) -> Any:
    """Rebuild an observation (array, dict or tuple) from leaf values given in :func:`leaves` order."""
    return next(arrays)


@unflatten.register(spaces.Dict)
def _unflatten_dict(space: spaces.Dict, arrays: Iterator[Any]) -> dict[str, Any]:
    return {key: unflatten(sub, arrays) for key, sub in space.spaces.items()}


@unflatten.register(spaces.Tuple)
def _unflatten_tuple(space: spaces.Tuple, arrays: Iterator[Any]) -> tuple[Any, ...]:
    return tuple(unflatten(sub, arrays) for sub in space.spaces)


#: Key, in the reset info of a same-step autoreset, of the terminal observation's leaves that the
#: ring cannot give back as the env returned them (:func:`leaves_as_returned`); the faces take it out.
AS_RETURNED = "shmvec.terminal_leaves"


def leaves_as_returned(leaves_: list[Leaf], values: list[Any], skip: Sequence[int] = ()) -> dict[int, Any]:
    """``{leaf index: value}`` for the leaf values that reading the ring back would change: anything
    but an ``np.ndarray`` of the leaf's dtype with at least one axis (a Python ``int`` or a numpy
    scalar for a Discrete, a 0-d array, a list, float64 values for a float32 Box), but for the leaves
    of ``skip`` (object leaves: they travel as returned anyway). Copies, since an env may reuse and
    change them in its next ``reset``. Most envs return none of these: empty."""
    return {
        k: copy.deepcopy(v)
        for k, (leaf, v) in enumerate(zip(leaves_, values))
        if k not in skip and (type(v) is not np.ndarray or v.ndim == 0 or v.dtype != leaf.dtype)
    }


def terminal_obs(
    space: spaces.Space,
    arrays: list[Any],
    reset_info: dict[str, Any] | None,
    convert: Callable[[list[Any]], list[Any]] | None = None,
) -> Any:
    """The terminal observation of a same-step autoreset, element types included, as the env
    returned it: the leaf ``arrays`` read from the ring, but for the leaves the worker sent under
    :data:`AS_RETURNED` in ``reset_info`` (taken out of it); ``convert`` (a face's ``device=``
    converter, :mod:`shmvec.device`) turns the leaves into what the face returns before they are
    assembled into ``space``'s structure."""
    returned = reset_info.pop(AS_RETURNED, None) if reset_info else None
    if returned:
        arrays = [returned.get(k, a) for k, a in enumerate(arrays)]
    return assemble(space, arrays if convert is None else convert(arrays))


#: Spaces whose values are arrays (a batch of them is one array, one row per env).
ARRAY_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def array_action_leaf(action_space: spaces.Space) -> Leaf | None:
    """The leaf of an array-shaped action space (a typed buffer can carry it), else None."""
    if isinstance(action_space, ARRAY_SPACES):
        return leaves(action_space)[0]
    return None


def inf_allowed(space: spaces.Space) -> list[bool | None]:
    """Per leaf (in :func:`leaves` order): None for integer leaves (never NaN), else whether the Box
    allows +/-inf (some bound infinite). NaN is in no Box: ``Box.contains`` is False for it."""
    if isinstance(space, spaces.Dict):
        return [x for sub in space.spaces.values() for x in inf_allowed(sub)]
    if isinstance(space, spaces.Tuple):
        return [x for sub in space.spaces for x in inf_allowed(sub)]
    if isinstance(space, spaces.Box) and np.dtype(space.dtype).kind == "f":
        return [not (np.isfinite(space.low).all() and np.isfinite(space.high).all())]
    return [None]


def check_finite(
    arrays: list[np.ndarray], rules: list[bool | None], names: list[str]
) -> tuple[int, str] | None:
    """First ``(row, message)`` whose float leaves hold NaN, or inf where the Box's bounds are finite.

    ``arrays`` are batched leaves (rows = envs); ``rules`` from :func:`inf_allowed`.
    """
    for arr, allow_inf, name in zip(arrays, rules, names):
        if allow_inf is None:
            continue
        bad = ~np.isfinite(arr) if not allow_inf else np.isnan(arr)
        rows = np.flatnonzero(bad.reshape(len(arr), -1).any(axis=1)) if arr.size else np.zeros(0, np.int64)
        if len(rows):
            what = "NaN or inf (its Box bounds are finite)" if not allow_inf else "NaN"
            return int(rows[0]), f"key {name!r}: observation contains {what}"
    return None


def write_leaf(batch: np.ndarray, i: int, value: Any, leaf: Leaf, env_index: int) -> None:
    """Copy one env's leaf value into row ``i`` of a batched shared-memory array, refusing what does not fit.

    A value of the right shape whose dtype casts within the same kind (float64 into a float32 space,
    a Python int into an int64 Discrete) is accepted, as DummyVecEnv accepts it; a different shape or
    a cross-kind cast (float into uint8) would silently corrupt the observation, so it raises.

    :raises ObservationError: naming the env and the key.
    """
    arr = np.asarray(value)
    # A plain space has no key: naming one ("key 'obs'") would send the reader looking for a Dict.
    where = f"env {env_index}, key {leaf.name!r}" if leaf.path else f"env {env_index}"
    if arr.shape != leaf.shape:
        raise ObservationError(
            f"{where}: observation shape {arr.shape} does not match the observation space shape {leaf.shape}"
        )
    if arr.dtype != leaf.dtype and not np.can_cast(arr.dtype, leaf.dtype, "same_kind"):
        raise ObservationError(
            f"{where}: observation dtype {arr.dtype} cannot be stored as the observation space dtype "
            f"{leaf.dtype} without changing its values (DummyVecEnv would cast it, SubprocVecEnv pass "
            f"{arr.dtype} through; shmvec returns the space's dtype and refuses to cast across kinds). "
            f"Fix the env: return np.asarray(obs, dtype=np.{leaf.dtype}) (e.g. in a "
            f"gymnasium.ObservationWrapper), or declare the space with dtype=np.{arr.dtype}"
        )
    batch[i] = arr
