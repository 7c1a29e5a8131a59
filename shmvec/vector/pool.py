"""Pool mode of :class:`shmvec.ShmVectorEnv` (EnvPool's ``async_reset`` / ``send`` / ``recv``), and
Gymnasium's info batching over a batch of the engine.

With ``batch_size < num_envs`` the caller works on one batch of envs while the others step:

.. code-block:: python

    envs = ShmVectorEnv(fns, batch_size=8)  # 16 envs
    envs.async_reset(seed=0)
    while True:
        obs, rewards, terminations, truncations, infos = envs.recv()
        env_ids = infos["env_id"]  # which 8 envs these are
        envs.send(policy(obs), env_ids)

The scheduling itself is the engine's (:meth:`shmvec.engine.core.Engine.send` /
:meth:`~shmvec.engine.core.Engine.recv`); this module turns its batches into Gymnasium's
conventions (infos as a dict of arrays over the batch, with ``_key`` masks).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import batch_space, iterate

from shmvec.engine.batch import Batch
from shmvec.engine.core import Engine
from shmvec.memory.layout import ARRAY_SPACES

#: ``final_obs(arrays, reset_info)``: a terminal observation from its leaf arrays and the reset info
#: of the same step (see :func:`shmvec.memory.layout.terminal_obs`).
FinalObs = Callable[[list[np.ndarray], dict[str, Any]], Any]


def per_env_actions(batched_space: spaces.Space, actions: Any) -> list[Any]:
    """The per-env actions of ``actions``, a batch of ``batched_space`` (``batch_space(single_action_space,
    n)``), split exactly as ``gymnasium.vector.SyncVectorEnv.step`` splits them (Gymnasium's
    ``iterate``): every leaf of a Tuple or Dict batch, nested ones too, is split along its first axis
    and env ``i`` gets the tuple or dict of the ``i``-th elements, of the types ``iterate`` gives.

    :raises TypeError: for a leaf that cannot be split (e.g. a scalar where a batch is due).
    :raises ValueError: for a batch that does not have the space's structure (a Dict key missing,
        a Tuple part missing, leaves of different lengths).
    """
    try:
        return list(iterate(batched_space, actions))
    except TypeError as e:
        raise TypeError(f"actions must be a batch of {batched_space}: {e}") from e
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"actions must be a batch of {batched_space} (each leaf batched over the envs, as "
            f"action_space.sample() returns it): {type(e).__name__}: {e}"
        ) from e


class _BatchInfos:
    """Gymnasium's info batching (``VectorEnv._add_info``) over the ``n`` positions of a batch."""

    _add_info = VectorEnv._add_info

    def __init__(self, n: int) -> None:
        self.num_envs = n


def batch_infos(owner: Any, batch: Batch, final_obs: FinalObs | None = None) -> dict:
    """Gymnasium's infos of ``batch``: a dict of arrays over its positions with ``_key`` masks, as
    ``SyncVectorEnv`` builds them. ``final_obs``: same-step autoreset (the terminal step's info and
    observation under ``final_info`` / ``final_obs``, then the reset's info, as AsyncVectorEnv lays
    them out). Built from the ring's typed columns with numpy when every position's info was typed
    and no episode ended (the usual step); else one env at a time, exactly as Gymnasium does."""
    n = len(batch.rewards)
    sized: Any = owner if n == owner.num_envs else _BatchInfos(n)
    typed = batch.typed
    infos: dict[str, Any] = {}
    # Gymnasium puts values of numpy types that are not numbers (np.bool_) in object arrays.
    fast = typed is not None and all(t in (int, float, bool) or issubclass(t, np.number) for t in typed.types)
    if fast and typed.mask.all() and not batch.finals:  # type: ignore[union-attr]
        for key, column in zip(typed.keys, typed.columns):  # type: ignore[union-attr]
            infos[key] = column
            infos[f"_{key}"] = np.ones(n, dtype=np.bool_)
        for pos in sorted(batch.infos):
            infos = sized._add_info(infos, batch.infos[pos], pos)
    else:
        per_env = dict(batch.infos)
        if typed is not None:
            for pos in np.flatnonzero(typed.mask).tolist():
                values = {k: t(c[pos]) for k, t, c in zip(typed.keys, typed.types, typed.columns)}
                per_env[pos] = {**values, **per_env.get(pos, {})}
        for pos in sorted(per_env.keys() | batch.finals.keys()):
            info = per_env.get(pos, {})
            if pos in batch.finals and final_obs is not None:
                reset_info = batch.reset_infos.get(pos, {})
                info = {
                    "final_info": info,
                    "final_obs": final_obs(batch.finals[pos], reset_info),
                    **reset_info,
                }
            infos = sized._add_info(infos, info, pos)
    if batch.env_ids is not None:
        infos["env_id"] = batch.env_ids
    return infos


class PoolMethods:
    """``async_reset``, ``send`` and ``recv`` of :class:`shmvec.ShmVectorEnv` (see the module
    docstring); with ``batch_size == num_envs`` they work too, one batch of every env at a time."""

    num_envs: int
    batch_size: int
    single_action_space: spaces.Space
    _batched_action_spaces: dict[int, spaces.Space]  # n -> batch_space(single_action_space, n)

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        raise NotImplementedError

    def _obs(self, arrays: list[np.ndarray]) -> Any:
        raise NotImplementedError

    def _fields(self, *arrays: np.ndarray) -> tuple[Any, ...]:
        raise NotImplementedError

    @property
    def _eng(self) -> Engine:
        raise NotImplementedError

    def _engine_actions(self, actions: Any, n: int) -> Any:
        """``actions`` for ``n`` envs as the engine takes them: a batch of array actions unchanged
        (it travels in the ring's typed action buffer, or the engine slices it per env: the same
        elements ``iterate`` gives); a batch of any other space split by :func:`per_env_actions`."""
        if isinstance(self.single_action_space, ARRAY_SPACES):
            return actions
        # batch_space takes ~0.3 ms for a small Dict: pool mode sends over the same few sizes.
        space = self._batched_action_spaces.get(n)
        if space is None:
            space = self._batched_action_spaces[n] = batch_space(self.single_action_space, n)
        return per_env_actions(space, actions)

    def async_reset(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Reset every env without waiting: their first observations come back through :meth:`recv`,
        ``batch_size`` at a time. Steps still in flight are waited for and dropped first.

        :param seed: None (unseeded), an int ``s`` (env ``i`` gets ``s + i``) or one seed per env.
        :param options: passed to every env's ``reset``, None included (as ``reset``).
        """
        self._eng.async_reset(self._seeds(seed), [{"options": options}] * self.num_envs)

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Give envs ``env_ids`` their next actions and return at once; they step while you work.

        A worker steps its envs (a group of ``num_envs / n_workers``) together, once every env of the
        group has its action: send whole groups (a batch from :meth:`recv` always is).

        :param actions: one action per env of ``env_ids``: a batch of
            ``batch_space(single_action_space, len(env_ids))`` (for a Tuple or Dict action space each
            leaf batched, as ``SyncVectorEnv.step`` takes it; for array spaces an array of
            ``(len(env_ids), ...)`` or a sequence); the caller may reuse it afterwards.
        :param env_ids: the envs (ints in ``0..num_envs-1``); default None: the batch :meth:`recv`
            returned last.
        :raises ValueError: for a bad ``env_ids`` or action count, or an env whose previous step was
            not received yet (nothing is sent then).
        """
        engine = self._eng
        if env_ids is None:
            env_ids = engine.flights.last_ids
            if env_ids is None:
                raise ValueError(
                    "send(): no batch to answer (env_ids=None): call recv() first, or pass env_ids"
                )
        if not isinstance(self.single_action_space, ARRAY_SPACES):
            # Copies: the envs of a group whose other envs have no action yet keep theirs until
            # then, and the caller may reuse its batch meanwhile.
            n = len(engine.flights.check_ids(env_ids))
            actions = copy.deepcopy(self._engine_actions(actions, n))
        engine.send(actions, env_ids)
        if engine.flights.last_ids is env_ids:
            engine.flights.last_ids = None

    def recv(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """The next ``batch_size`` envs to finish their step (or reset), as ``step()`` returns them
        but over the batch: ``(obs, rewards, terminations, truncations, infos)``, with
        ``infos["env_id"]`` (int32) naming the env of each position, ascending within the batch.

        Order (``pool_order``): ``"first_ready"`` returns the first worker groups done;
        ``"deterministic"`` returns groups in a fixed round-robin (``0, 1, ...``), the same batches
        in every run. Autoreset is ``NEXT_STEP``: the step after an episode ends is its reset step.

        :raises RuntimeError: if too few envs are stepping to fill a batch (instead of waiting forever).
        """
        batch = self._eng.recv()
        if batch.env_ids is None:  # every env in one slot: lent views, copied like any pool batch
            batch.env_ids = np.arange(self.num_envs, dtype=np.int32)
            batch.obs = [a.copy() for a in batch.obs]
            batch.rewards, batch.terminated, batch.truncated = (
                batch.rewards.copy(),
                batch.terminated.copy(),
                batch.truncated.copy(),
            )
            self._eng.flights.last_ids = batch.env_ids
        infos = batch_infos(self, batch)
        return (self._obs(batch.obs), *self._fields(batch.rewards, batch.terminated, batch.truncated), infos)


__all__ = ["PoolMethods", "batch_infos", "per_env_actions"]
