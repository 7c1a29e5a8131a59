"""Restart mode's bookkeeping: the restart budget, which workers were rebuilt and why, the seeds of
their envs' next episodes, and the info keys that report a restart.

The supervisor decides and remembers; it calls nothing. :meth:`Supervisor.admit` says whether a
fault may be rebuilt (the budget) or which error ends the run; the engine's recovery
(:mod:`shmvec.engine.recovery`) does the work with the transport, the ring and the reader.
Rebuilt envs are reset before their next step, with reproducible seeds
(:func:`shmvec.engine.restart.restart_seed`), and end their episode in that step as truncated with the
restart info keys.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from shmvec.engine.restart import REASON_KEY, RESTARTED_KEY, RestartBudget, restart_seed
from shmvec.transports.base import Fault
from shmvec.transports.failures import add_note

logger = logging.getLogger("shmvec")


class Supervisor:
    """Restart bookkeeping of one engine.

    :param budget: restarts allowed (see :class:`shmvec.engine.restart.RestartBudget`).
    :param worker_envs: the env indices of each worker.
    """

    def __init__(self, budget: RestartBudget, worker_envs: list[range]) -> None:
        self.budget, self.worker_envs = budget, worker_envs
        n_envs = worker_envs[-1].stop
        # Workers rebuilt whose envs have not ended their episode yet -> the reason, for their infos.
        self.needs_reset: dict[int, str] = {}
        self.restart_counts = [0] * n_envs
        self.last_seeds: list[int | None] = [None] * n_envs

    def note_seeds(self, seeds: Sequence[int | None]) -> None:
        """Remember the seeds ``reset()`` used, for the seeds of envs rebuilt later."""
        for i, seed in enumerate(seeds):
            if seed is not None:
                self.last_seeds[i] = seed

    def admit(self, fault: Fault) -> BaseException | None:
        """Take one restart from the budget for ``fault`` and log it; or, when the budget is spent,
        the error that ends the run (the fault's own, with the budget named)."""
        if not self.budget.take():
            return add_note(fault.error, f" ({self.budget.describe()})")
        w = fault.worker
        stack = getattr(fault.error, "remote_traceback", "")
        logger.warning(
            "shmvec: restarting worker %d (envs %s): %s%s",
            w,
            list(self.worker_envs[w]),
            fault.reason,
            f"\n{stack}" if stack else "",
        )
        for i in self.worker_envs[w]:
            self.restart_counts[i] += 1
        return None

    def reset_seeds(self, w: int, seeds: Sequence[int | None] | None = None) -> list[int | None]:
        """Seeds for the rebuilt envs of worker ``w``: the given ones where set, else
        :func:`~shmvec.engine.restart.restart_seed` of their last seed."""
        envs = self.worker_envs[w]
        given = seeds if seeds is not None else [None] * len(envs)
        return [
            s if s is not None else restart_seed(self.last_seeds[i], self.restart_counts[i])
            for i, s in zip(envs, given)
        ]

    @property
    def total(self) -> int:
        """Worker restarts so far."""
        return self.budget.total

    @staticmethod
    def mark(info: dict[str, Any], reason: str) -> dict[str, Any]:
        """``info`` with the restart keys added (a new dict)."""
        return {**info, RESTARTED_KEY: True, REASON_KEY: reason}
