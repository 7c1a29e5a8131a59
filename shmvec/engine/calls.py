"""Env calls (``get_attr``, ``set_attr``, ``env_method``, ``render``...): the engine's
:class:`EnvCalls` posts one to the workers of the envs named (``post_call``) and gathers the replies
(``wait_call``) over one or more waits (Gymnasium's ``call_async`` / ``call_wait``; a synchronous call
is the pair); :class:`CallInFlight` holds a call posted and not yet collected. Steps and resets are
the core's (:mod:`shmvec.engine.core`); an env call is refused while they are in flight.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any

from shmvec.engine.faults import Phase, Verdict, judge
from shmvec.engine.flights import Flights
from shmvec.engine.groups import by_worker
from shmvec.errors import PendingCallError
from shmvec.transports.base import Fault, Outcome, Transport
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


class EnvCalls:
    """The env-call methods of :class:`shmvec.engine.core.Engine` (a mixin: the engine parts it
    uses are declared here and set by the engine). Also :meth:`ask`, the engine's own synchronous
    command to some workers (outside the steps)."""

    in_call: CallInFlight | None  # an env call posted and not collected (call_async)
    flights: Flights
    transport: Transport
    worker_envs: list[range]
    restart: bool
    check_open: Callable[[], None]
    carry_out: Callable[[Verdict, Phase], list[int]]

    def refuse_during_call(self, call: str) -> None:
        """:raises PendingCallError: while an env call is pending (its replies come first)."""
        if self.in_call is not None:
            raise PendingCallError.of(call, "call")

    def call(self, command: Callable[[list[int]], m.Command], indices: Sequence[int]) -> list[Any]:
        """Run an env call on envs ``indices`` (``command(local indices)`` builds each worker's
        message); one result per index. :meth:`post_call` then :meth:`wait_call`."""
        self.post_call(command, indices)
        return self.wait_call()

    def post_call(self, command: Callable[[list[int]], m.Command], indices: Sequence[int]) -> None:
        """Send an env call to the workers of envs ``indices`` without waiting; :meth:`wait_call`
        collects it, and until then the engine's ``pending_call()`` says ``"call"``.

        :raises RuntimeError: while steps are in flight (their replies would be read as this call's)
            or another call is.
        """
        self.check_open()
        flights = self.flights
        if flights.busy or flights.pending or self.in_call is not None:
            name = command([]).label.split(":")[0]
            raise RuntimeError(
                f"{name}() called while envs are stepping (workers {sorted(flights.busy)}) or an env call "
                "is pending: receive them first (step_wait(), recv() or call_wait()), or reset()"
            )
        plan = by_worker(indices, self.worker_envs)
        faults = self.transport.post([w for w, _ in plan], [command(local) for _, (local, _) in plan])
        self.in_call = CallInFlight(plan, len(indices), faults)

    def wait_call(self, limit: float | None = None) -> list[Any]:
        """The results of the call :meth:`post_call` sent, one per env, in the order asked.

        :param limit: seconds to wait at most (None: as long as it takes); past it,
            ``multiprocessing.TimeoutError`` is raised and the call stays pending.
        """
        self.check_open()
        call = self.in_call
        assert call is not None, "no env call pending"
        if call.waiting:
            call.add(self.transport.wait(call.waiting, len(call.waiting), limit))
        if call.waiting:
            raise multiprocessing.TimeoutError(f"the env call's replies did not arrive within {limit:g} s")
        self.in_call = None
        self.carry_out(judge(call.outcome, self.restart, Phase.CALL, self.worker_envs), Phase.CALL)
        return call.values()

    def ask(self, workers: Sequence[int], commands: m.Command | Sequence[m.Command], phase: Phase) -> dict:
        """Send one command to each of ``workers``, wait for all of them and carry out the verdict;
        worker -> reply."""
        faults = self.transport.post(workers, commands)
        failed = {f.worker for f in faults}
        waited = [w for w in workers if w not in failed]
        outcome = self.transport.wait(waited, len(waited))
        outcome.faults = sorted(outcome.faults + faults, key=lambda f: f.worker)
        self.carry_out(judge(outcome, self.restart, phase, self.worker_envs), phase)
        return outcome.results


__all__ = ["CallInFlight", "EnvCalls"]
