"""Pool mode of :class:`shmvec.ShmVectorEnv`: EnvPool's ``async_reset`` / ``send`` / ``recv``.

With ``batch_size < num_envs`` the caller works on one batch of envs while the others step:

.. code-block:: python

    envs = ShmVectorEnv(fns, batch_size=8)  # 16 envs
    envs.async_reset(seed=0)
    while True:
        obs, rewards, terminations, truncations, infos = envs.recv()
        env_ids = infos["env_id"]  # which 8 envs these are
        envs.send(policy(obs), env_ids)

The scheduling itself is in :mod:`shmvec.engine.scheduler`; this module turns its batches into
Gymnasium's conventions (infos as a dict of arrays over the batch, with ``_key`` masks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv

from shmvec.engine.scheduler import PoolScheduler


class _BatchInfos:
    """Gymnasium's info batching (``VectorEnv._add_info``) over the ``n`` positions of a batch."""

    _add_info = VectorEnv._add_info

    def __init__(self, n: int) -> None:
        self.num_envs = n


class PoolMethods:
    """``async_reset``, ``send`` and ``recv`` of :class:`shmvec.ShmVectorEnv` (see the module
    docstring); with ``batch_size == num_envs`` they work too, one batch of every env at a time."""

    _pool: PoolScheduler | None
    num_envs: int
    batch_size: int

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        raise NotImplementedError

    def _obs(self, arrays: list[np.ndarray]) -> Any:
        raise NotImplementedError

    def _scheduler(self) -> PoolScheduler:
        # Built on first use: a VectorEnv used only through step() never makes one.
        if self._pool is None:
            engine = self._eng  # type: ignore[attr-defined]
            if engine.options.backend != "local":
                raise ValueError(
                    f"pool mode (async_reset/send/recv) runs on the local backend only, not "
                    f"backend={engine.options.backend!r}"
                )
            self._pool = PoolScheduler(engine, self.batch_size, self.pool_order)  # type: ignore[attr-defined]
        return self._pool

    def async_reset(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Reset every env without waiting: their first observations come back through :meth:`recv`,
        ``batch_size`` at a time. Steps still in flight are waited for and dropped first.

        :param seed: None (unseeded), an int ``s`` (env ``i`` gets ``s + i``) or one seed per env.
        :param options: passed to every env's ``reset``, None included (as ``reset``).
        """
        pool = self._scheduler()
        pool.async_reset(self._seeds(seed), [{"options": options}] * self.num_envs)

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Give envs ``env_ids`` their next actions and return at once; they step while you work.

        A worker steps its envs (a group of ``num_envs / n_workers``) together, once every env of the
        group has its action: send whole groups (a batch from :meth:`recv` always is).

        :param actions: one action per env of ``env_ids`` (an array of ``(len(env_ids), ...)`` or a
            sequence); the caller may reuse it afterwards.
        :param env_ids: the envs (ints in ``0..num_envs-1``); default None: the batch :meth:`recv`
            returned last.
        :raises ValueError: for a bad ``env_ids`` or action count, or an env whose previous step was
            not received yet (nothing is sent then).
        """
        self._scheduler().send(actions, env_ids)

    def recv(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """The next ``batch_size`` envs to finish their step (or reset), as ``step()`` returns them
        but over the batch: ``(obs, rewards, terminations, truncations, infos)``, with
        ``infos["env_id"]`` (int32) naming the env of each position, ascending within the batch.

        Order (``pool_order``): ``"first_ready"`` returns the first worker groups done;
        ``"deterministic"`` returns groups in a fixed round-robin (``0, 1, ...``), the same batches
        in every run. Autoreset is ``NEXT_STEP``: the step after an episode ends is its reset step.

        :raises RuntimeError: if too few envs are stepping to fill a batch (instead of waiting forever).
        """
        batch = self._scheduler().recv()
        sized = _BatchInfos(len(batch.env_ids))
        infos: dict[str, Any] = {}
        for pos in sorted(batch.infos):
            infos = sized._add_info(infos, batch.infos[pos], pos)  # type: ignore[misc]
        infos["env_id"] = batch.env_ids
        return self._obs(batch.obs), batch.rewards, batch.terminated, batch.truncated, infos

    def _check_pool_idle(self, what: str) -> None:
        """:raises RuntimeError: if steps are in flight (their replies would be read as ``what``'s)."""
        if self._pool is not None and self._pool.busy:
            raise RuntimeError(
                f"{what}() called while envs are stepping in pool mode (workers {self._pool.busy}): "
                "recv() them first, or reset()"
            )


__all__ = ["PoolMethods"]
