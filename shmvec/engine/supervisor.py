"""Restart mode: the restart budget, rebuilding failed workers, and resetting the rebuilt envs.

The supervisor decides; the engine (its host) does the work with processes and the ring. A worker
that fails is killed and relaunched from its factories; a relaunch that fails again (the factory
raises, the new worker dies) counts against the same budget. Rebuilt envs are reset before their
next step, with reproducible seeds (:func:`shmvec.restart.restart_seed`), and end their episode in
that step as truncated with the restart info keys.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from shmvec.engine.reader import Reader
from shmvec.failures import add_note
from shmvec.restart import REASON_KEY, RESTARTED_KEY, Fault, RestartBudget, restart_seed
from shmvec.ring import Ring

logger = logging.getLogger("shmvec")


class Host(Protocol):
    """What the supervisor needs from the engine."""

    worker_envs: list[range]
    ring: Ring
    reader: Reader

    def reset_workers(self, workers: list[int], payloads: list[Any]) -> tuple[list[Any], list[Fault]]:
        """Reset ``workers``; their reset infos and the faults to rebuild."""

    def arm(self, workers: list[int], seeds: list[list[int | None]]) -> list[Fault]:
        """Have ``workers`` reset their envs with ``seeds`` in place of their next step."""

    def relaunch(self, w: int) -> Fault | None:
        """Replace worker ``w`` and attach the new one; the fault if that failed."""

    def give_up(self) -> None:
        """Close everything (the budget is spent)."""


class Supervisor:
    """Restart bookkeeping of one engine.

    :param budget: restarts allowed (see :class:`shmvec.restart.RestartBudget`).
    :param n_envs: number of envs.
    """

    def __init__(self, host: Host, budget: RestartBudget, n_envs: int) -> None:
        self.host, self.budget = host, budget
        # Workers rebuilt but not yet reset -> the reason, for their envs' infos.
        self.needs_reset: dict[int, str] = {}
        self.restart_counts = [0] * n_envs
        self.last_seeds: list[int | None] = [None] * n_envs

    def note_seeds(self, seeds: Sequence[int | None]) -> None:
        """Remember the seeds ``reset()`` used, for the seeds of envs rebuilt later."""
        for i, seed in enumerate(seeds):
            if seed is not None:
                self.last_seeds[i] = seed

    def rebuild(self, faults: Sequence[Fault]) -> None:
        """Kill and relaunch each faulty worker, or raise its error when the restart budget is spent."""
        queue = list(faults)
        while queue:
            fault = queue.pop(0)
            if not self.budget.take():
                self.host.give_up()
                raise add_note(fault.error, f" ({self.budget.describe()})")
            w = fault.worker
            stack = getattr(fault.error, "remote_traceback", "")
            logger.warning(
                "shmvec: restarting worker %d (envs %s): %s%s",
                w,
                list(self.host.worker_envs[w]),
                fault.reason,
                f"\n{stack}" if stack else "",
            )
            for i in self.host.worker_envs[w]:
                self.restart_counts[i] += 1
            failed = self.host.relaunch(w)
            if failed is not None:
                # Its envs still end their episode for the first reason; the new error is the one
                # raised if the budget runs out.
                queue.insert(0, Fault(w, fault.reason, failed.error))
                continue
            self.needs_reset[w] = fault.reason

    def reset_seeds(self, w: int, seeds: Sequence[int | None] | None = None) -> list[int | None]:
        """Seeds for the rebuilt envs of worker ``w``: the given ones where set, else
        :func:`~shmvec.restart.restart_seed` of their last seed."""
        envs = self.host.worker_envs[w]
        given = seeds if seeds is not None else [None] * len(envs)
        return [
            s if s is not None else restart_seed(self.last_seeds[i], self.restart_counts[i])
            for i, s in zip(envs, given)
        ]

    def retry_reset(self, faults: list[Fault], payloads: list[Any]) -> dict[int, list[dict | None]]:
        """After a failed ``reset()``: rebuild the failed workers and reset them again with the same
        seeds (unseeded envs: :func:`~shmvec.restart.restart_seed`); worker -> its marked reset infos."""
        out: dict[int, list[dict | None]] = {}
        while faults:
            self.rebuild(faults)
            workers = [f.worker for f in faults]
            reasons = {w: self.needs_reset.pop(w) for w in workers if w in self.needs_reset}
            retry = [(payloads[w][0], self.reset_seeds(w, payloads[w][1]), *payloads[w][2:]) for w in workers]
            results, faults = self.host.reset_workers(workers, retry)
            failed = {f.worker for f in faults}
            for w, reply in zip(workers, results):
                if w not in failed and reply is not None:
                    out[w] = [None if info is None else self.mark(info, reasons.get(w, "")) for info in reply]
        return out

    def end_episodes(
        self, slot: int, same_step: bool, only: int | None = None
    ) -> tuple[dict[int, list[np.ndarray]], dict[int, tuple[dict[str, Any], dict[str, Any] | None]]]:
        """End the episodes of the rebuilt workers' envs in ``slot``: reward 0, truncated.
        ``only``: of that worker alone (pool mode: each worker writes its own slot); the others
        stay in :attr:`needs_reset`.

        ``same_step``: the envs are reset now; the last observation the caller saw becomes their
        terminal observation. Otherwise their row keeps that last observation (the engine carries it
        over) and they reset in place of their next step.

        :returns: env -> terminal observation leaves (same step only), and env -> (step info, reset
            info or None), both with the restart keys.
        """
        host, ring = self.host, self.host.ring
        finals: dict[int, list[np.ndarray]] = {}
        infos: dict[int, tuple[dict[str, Any], dict[str, Any] | None]] = {}
        while True:
            workers = sorted(w for w in self.needs_reset if only is None or w == only)
            if not workers:
                break
            seeds = [self.reset_seeds(w) for w in workers]
            if same_step:
                for w in workers:
                    g = host.worker_envs[w]
                    # The last observation the caller saw is intact in the previous batch (n_slots
                    # >= 2): the failed worker may have half-written this slot, never that one.
                    last = host.reader.previous(slice(g.start, g.stop))
                    for k, i in enumerate(g):
                        finals[i] = [leaf[k] for leaf in last]
                # No options, as an autoreset.
                payloads: list[Any] = [(slot, s, [{}] * len(s), None) for s in seeds]
                results, faults = host.reset_workers(workers, payloads)
            else:
                results, faults = [None] * len(workers), host.arm(workers, seeds)
            failed = {f.worker for f in faults}
            for w, reply in zip(workers, results):
                if w in failed:
                    continue
                reason = self.needs_reset.pop(w)
                g = host.worker_envs[w]
                ring.rewards[slot, g.start : g.stop] = 0.0
                ring.terminated[slot, g.start : g.stop] = False
                ring.truncated[slot, g.start : g.stop] = True
                for k, i in enumerate(g):
                    infos[i] = (self.mark({}, reason), None if reply is None else self.mark(reply[k], reason))
            if faults:
                self.rebuild(faults)
        return finals, infos

    @staticmethod
    def mark(info: dict[str, Any], reason: str) -> dict[str, Any]:
        """``info`` with the restart keys added (a new dict)."""
        return {**info, RESTARTED_KEY: True, REASON_KEY: reason}
