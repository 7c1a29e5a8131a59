"""An env call (``get_attr``, ``env_method``, ``call``...) posted to the workers and not yet
collected: what :meth:`shmvec.engine.core.Engine.post_call` sent, gathered by ``wait_call`` over one
or more waits (Gymnasium's ``call_async`` / ``call_wait``; a synchronous call is the pair)."""

from __future__ import annotations

from typing import Any

from shmvec.transports.base import Fault, Outcome
from shmvec.wire import messages as m


class CallInFlight:
    """The replies of one env call, as they come in.

    :param plan: per worker asked, the envs' local indices and their positions in the result
        (:func:`shmvec.engine.groups.by_worker`).
    :param n: the number of envs called (results).
    :param faults: the workers that could not take the command.
    """

    def __init__(
        self, plan: list[tuple[int, tuple[list[int], list[int]]]], n: int, faults: list[Fault]
    ) -> None:
        self.plan, self.n = plan, n
        failed = {f.worker for f in faults}
        self.outcome = Outcome(faults=list(faults))
        self.waiting = [w for w, _ in plan if w not in failed]  # workers that have not answered

    def add(self, outcome: Outcome) -> None:
        """What a wait on :attr:`waiting` brought in."""
        got = self.outcome
        got.results.update(outcome.results)
        got.errors.update(outcome.errors)
        got.faults = sorted(got.faults + outcome.faults, key=lambda f: f.worker)
        answered = {*outcome.results, *outcome.errors, *(f.worker for f in outcome.faults)}
        self.waiting = [w for w in self.waiting if w not in answered]

    def values(self) -> list[Any]:
        """One value per env called, in the order asked (None where a worker gave none)."""
        out: list[Any] = [None] * self.n
        for w, (_, positions) in self.plan:
            reply = self.outcome.results.get(w)
            values = reply.values if isinstance(reply, m.Returned) and reply.values is not None else ()
            for pos, value in zip(positions, values):
                out[pos] = value
        return out


__all__ = ["CallInFlight"]
