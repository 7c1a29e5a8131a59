"""Comparing what two vector envs returned, value for value: the first difference, named.

Every function here returns what it found (a :class:`Difference`, or None when the values are
equal) rather than raising, so that :func:`shmvec.testing.assert_equivalent` can say at which step
and env it happened, and tests can assert on it. Equal means: the same type (arrays: the same dtype
and shape), the same values (NaN equals NaN), dicts with the same keys (in the same order where
``ordered``), containers element by element.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

#: Info keys never compared, as trailing key paths: SB3's ``Monitor`` and Gymnasium's
#: ``RecordEpisodeStatistics`` record the episode's wall-clock time as ``info["episode"]["t"]``.
WALL_CLOCK_KEYS: tuple[tuple[str, ...], ...] = (("episode", "t"),)

#: Info keys whose value is an observation: its dict keys may come back in the observation space's
#: order rather than the env's (consumers index by key), so their order is not compared.
OBSERVATION_KEYS = ("terminal_observation", "final_obs")


@dataclass(frozen=True)
class Difference:
    """The first place where two results differ.

    :param field: what differs, written as it is read: ``obs['image']``, ``reward``, ``info['time']``.
    :param detail: how, e.g. ``3 != 4`` or ``dtype uint8 != float32`` (the shmvec value first).
    :param env: the index of the env whose value differs, or None for a difference of the whole
        batch (a dtype, a shape, a missing key).
    """

    field: str
    detail: str
    env: int | None = None


class InfoKeys:
    """Which info keys to leave out of a comparison.

    :param keys: each a key name (left out wherever it appears, e.g. ``"time"``) or a tuple of keys
        naming a trailing path (``("episode", "t")``: key ``t`` inside a dict at key ``episode``).
        :data:`WALL_CLOCK_KEYS` are always left out. A left-out key also leaves out its Gymnasium
        presence mask ``_key``.
    """

    def __init__(self, keys: Iterable[str | Sequence[str]] = ()) -> None:
        paths = [(k,) if isinstance(k, str) else tuple(k) for k in keys]
        self.paths = frozenset([*paths, *WALL_CLOCK_KEYS])

    def ignored(self, path: tuple[str, ...]) -> bool:
        """Whether the info value at ``path`` (keys from the info dict down) is left out."""
        key = path[-1]
        candidates = [path]
        if isinstance(key, str) and key.startswith("_"):
            candidates.append((*path[:-1], key[1:]))  # the presence mask of a left-out key
        return any(p[-len(rule) :] == rule for p in candidates for rule in self.paths if len(rule) <= len(p))


def _arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    try:
        return bool(np.array_equal(a, b, equal_nan=True))
    except TypeError:  # equal_nan needs numbers: strings, bytes, structured dtypes
        return bool(np.array_equal(a, b))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def value_difference(
    got: Any,
    want: Any,
    field: str = "value",
    ordered: bool = True,
    ignore: InfoKeys | None = None,
    _path: tuple[str, ...] = (),
) -> Difference | None:
    """The first difference between ``got`` (shmvec's) and ``want`` (the reference's), or None.

    :param field: the name of the whole value, the start of :attr:`Difference.field`.
    :param ordered: whether dicts must also have their keys in the same order (default True);
        never for the values of :data:`OBSERVATION_KEYS`.
    :param ignore: info keys to leave out (default None: compare every key).
    """
    if want is None or got is None:
        return None if got is want else Difference(field, f"{_short(got)} != {_short(want)}")
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return Difference(field, f"a {type(got).__name__}, not a dict")
        keys = [k for k in want if not (ignore and ignore.ignored((*_path, k)))]
        got_keys = [k for k in got if not (ignore and ignore.ignored((*_path, k)))]
        if set(got_keys) != set(keys):
            missing, extra = [k for k in keys if k not in got], [k for k in got_keys if k not in want]
            return Difference(field, f"keys differ: missing {missing}, extra {extra}")
        if ordered and got_keys != keys:
            return Difference(field, f"key order {got_keys} != {keys}")
        for k in keys:
            inner = ordered and k not in OBSERVATION_KEYS
            found = value_difference(got[k], want[k], f"{field}[{k!r}]", inner, ignore, (*_path, k))
            if found:
                return found
        return None
    if isinstance(want, (list, tuple)):
        if type(got) is not type(want) or len(got) != len(want):
            return Difference(field, f"{_short(got)} != {_short(want)}")
        for i, (x, y) in enumerate(zip(got, want)):
            found = value_difference(x, y, f"{field}[{i}]", ordered, ignore, _path)
            if found:
                return found
        return None
    if isinstance(want, np.ndarray):
        if not isinstance(got, np.ndarray):
            return Difference(field, f"a {type(got).__name__}, not an array")
        if got.dtype != want.dtype:
            return Difference(field, f"dtype {got.dtype} != {want.dtype}")
        if got.shape != want.shape:
            return Difference(field, f"shape {got.shape} != {want.shape}")
        if want.dtype == object:
            for i, (x, y) in enumerate(zip(got.ravel(), want.ravel())):
                found = value_difference(x, y, f"{field}[{i}]", ordered, ignore, _path)
                if found:
                    return found
            return None
        if _arrays_equal(got, want):
            return None
        where = tuple(int(i) for i in np.argwhere(~_equal_elements(got, want))[0])
        at = f" at index {where}: {_short(got[where])} != {_short(want[where])}" if where else ""
        return Difference(field, f"values differ{at}")
    if type(got) is not type(want):
        types = f"({_type_name(got)} != {_type_name(want)})"
        return Difference(field, f"{_short(got)} != {_short(want)} {types}")
    if got == want or (_is_nan(got) and _is_nan(want)):
        return None
    return Difference(field, f"{_short(got)} != {_short(want)}")


def _type_name(x: Any) -> str:
    t = type(x)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _equal_elements(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    eq = np.asarray(a == b)
    if a.dtype.kind in "fc":
        eq |= np.isnan(a) & np.isnan(b)
    return eq


def _is_nan(x: Any) -> bool:
    return isinstance(x, (float, np.floating)) and bool(np.isnan(x))


def batch_difference(
    got: Any, want: Any, field: str, env_value: Callable[[Any, int], Any] | None, n_envs: int, **kwargs: Any
) -> Difference | None:
    """:func:`value_difference` of two batches, naming the first env whose own value differs.

    :param env_value: ``env_value(batch, i)``, env ``i``'s part of a batch (None: do not look for
        the env).
    :param kwargs: passed to :func:`value_difference`.
    :returns: the difference of the first env that differs, or the batch's own (``env`` None)
        when no single env's value does (a dtype, a shape, a key of the whole batch).
    """
    whole = value_difference(got, want, field, **kwargs)
    if whole is None or env_value is None:
        return whole
    for i in range(n_envs):
        try:
            x, y = env_value(got, i), env_value(want, i)
        except (IndexError, KeyError, TypeError):
            return whole  # the batches' shapes differ: nothing to split
        found = value_difference(x, y, field, **kwargs)
        if found:
            return Difference(found.field, found.detail, i)
    return whole


def obs_of_env(space: spaces.Space) -> Callable[[Any, int], Any]:
    """``f(batch, i)``: env ``i``'s observation in a batch of observations of ``space`` (one env's
    space): arrays indexed on their first axis, Dict and Tuple spaces leaf by leaf; the leaves
    without a fixed size (Text, Sequence, Graph) are tuples of the envs' values."""

    def env_obs(batch: Any, i: int, sp: spaces.Space = space) -> Any:
        if isinstance(sp, spaces.Dict):
            return {k: env_obs(batch[k], i, s) for k, s in sp.spaces.items()}
        if isinstance(sp, spaces.Tuple):
            return tuple(env_obs(b, i, s) for b, s in zip(batch, sp.spaces))
        return batch[i]

    return env_obs


def infos_of_env(infos: Any, i: int) -> Any:
    """Env ``i``'s part of Gymnasium's dict-of-arrays infos (its values and ``_key`` masks)."""
    if isinstance(infos, dict):
        return {k: infos_of_env(v, i) for k, v in infos.items()}
    if isinstance(infos, np.ndarray) and infos.ndim:
        return infos[i]
    return infos


def row(batch: Any, i: int) -> Any:
    """Env ``i``'s entry of a batch array (rewards, flags)."""
    return batch[i]


def sb3_step_difference(
    got: tuple, want: tuple, ignore: InfoKeys | None = None, obs_space: spaces.Space | None = None
) -> Difference | None:
    """The first difference between two results of SB3's ``step_wait()``: observations, rewards,
    dones, then each env's info dict (keys in the same order; ``terminal_observation`` in any).

    :param ignore: info keys to leave out (default None: every key).
    :param obs_space: one env's observation space, to name the env of a difference in the
        observations (default None: the batch is named).
    """
    (obs, rewards, dones, infos), (w_obs, w_rewards, w_dones, w_infos) = got, want
    n = len(w_infos)
    obs_at = None if obs_space is None else obs_of_env(obs_space)
    return (
        batch_difference(obs, w_obs, "obs", obs_at, n)
        or batch_difference(rewards, w_rewards, "reward", row, n)
        or batch_difference(dones, w_dones, "done", row, n)
        or info_dicts_difference(infos, w_infos, "info", ignore)
    )


def info_dicts_difference(
    got: Sequence[dict], want: Sequence[dict], field: str, ignore: InfoKeys | None = None
) -> Difference | None:
    """The first difference between two of SB3's sequences of per-env dicts (infos, ``reset_infos``)."""
    if len(got) != len(want):
        return Difference(field, f"{len(got)} dicts != {len(want)}")
    for i, (x, y) in enumerate(zip(got, want)):
        if d := value_difference(x, y, field, ordered=True, ignore=ignore):
            return Difference(d.field, d.detail, i)
    return None


def gymnasium_difference(
    got: tuple,
    want: tuple,
    ignore: InfoKeys | None = None,
    obs_space: spaces.Space | None = None,
    n_envs: int | None = None,
) -> Difference | None:
    """The first difference between two results of a Gymnasium VectorEnv's ``reset`` (obs, infos) or
    ``step`` (obs, rewards, terminations, truncations, infos); infos are compared key by key in any
    order, with their ``_key`` masks.

    :param ignore: info keys to leave out (default None: every key).
    :param obs_space: one env's observation space, to name the env of a difference in the
        observations (default None: the batch is named).
    :param n_envs: the number of envs, to name the env of a difference (default None: known from a
        step's rewards; a reset's differences then name the batch).
    """
    if len(got) != len(want):
        return Difference("result", f"{len(got)} items != {len(want)}")
    n = n_envs if n_envs is not None else len(want[1]) if len(want) == 5 else 0
    obs_at = None if obs_space is None or not n else obs_of_env(obs_space)
    found = batch_difference(got[0], want[0], "obs", obs_at, n)
    for name, x, y in zip(("reward", "terminated", "truncated"), got[1:-1], want[1:-1]):
        found = found or batch_difference(x, y, name, row, n)
    infos_at = infos_of_env if n else None
    return found or batch_difference(got[-1], want[-1], "infos", infos_at, n, ordered=False, ignore=ignore)
