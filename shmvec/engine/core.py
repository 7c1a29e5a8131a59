"""The engine: envs in workers, observations in a shared-memory ring, three primitives.

``send(actions, env_ids)`` gives envs their next actions, ``recv()`` returns the next batch,
``reset()`` resets every env (``async_reset()`` without waiting: :mod:`shmvec.engine.resets`). A
synchronous step is ``send(actions) + recv()`` with every env: the same path as pool mode's partial
batches (``batch_size < num_envs``); only how a batch is read differs (lent from one ring slot, or
gathered from several: :mod:`shmvec.engine.batch_reader`). The engine reaches its workers through a
transport (:mod:`shmvec.transports.base`), asks the fault policy (:func:`shmvec.engine.faults.judge`)
what an outcome means and carries the verdict out: raise, or rebuild workers
(:mod:`shmvec.engine.recovery`). Env calls (``get_attr``...) are in :mod:`shmvec.engine.calls`. A face
(:class:`shmvec.ShmVecEnv`, :class:`shmvec.ShmVectorEnv`) turns batches into its library's
conventions.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
import weakref
from typing import Any

import numpy as np

from shmvec.device import HostTensors
from shmvec.engine import startup
from shmvec.engine.batch import Batch
from shmvec.engine.batch_reader import BatchReader
from shmvec.engine.calls import CallInFlight, EnvCalls
from shmvec.engine.faults import Phase, Verdict, judge
from shmvec.engine.flights import FIRST_READY, Flights, check_count
from shmvec.engine.groups import split_envs, usable_cpus
from shmvec.engine.openmp import PolicyThreads
from shmvec.engine.options import Options
from shmvec.engine.recovery import NOTHING_ENDED, Recovery
from shmvec.engine.resets import Resets
from shmvec.engine.slots import Slots
from shmvec.engine.supervisor import Supervisor
from shmvec.errors import ClosedError
from shmvec.transports.base import Outcome, Transport
from shmvec.wire import messages as m


class Engine(EnvCalls, Resets):
    """Steps ``len(env_fns)`` envs in ``options.n_workers`` workers; see :class:`shmvec.ShmVecEnv`
    for the options (they mean the same here). Built by :func:`shmvec.engine.build.build`. Its
    resets come from :class:`~shmvec.engine.resets.Resets`, its env calls from
    :class:`~shmvec.engine.calls.EnvCalls`.

    :param n_envs: the number of envs.
    :param options: checked options (:meth:`Options.checked`).
    :param transport: what reaches the workers (not started yet).
    :param owner: the face's class name, for messages.
    :param batch_size: envs per :meth:`recv` (default: every env).
    :param order: pool mode's batch order (:data:`~shmvec.engine.flights.FIRST_READY` or
        ``"deterministic"``).
    :param info_form: ``"dicts"`` (typed infos merged into each env's dict, SB3's form) or
        ``"arrays"`` (left as columns over the batch, Gymnasium's form).
    :param same_spaces: every env has env 0's spaces (default); False: their shapes and dtypes
        suffice (see :func:`shmvec.engine.startup.start`).
    """

    def __init__(
        self,
        n_envs: int,
        options: Options,
        transport: Transport,
        owner: str = "ShmVecEnv",
        batch_size: int | None = None,
        order: str = FIRST_READY,
        info_form: str = "dicts",
        same_spaces: bool = True,
    ) -> None:
        self.closed = True  # until start-up succeeds, close() has nothing of ours to do
        self.closed_by_close = False  # close() was called while open (else a failure closed it)
        self._openmp: PolicyThreads | None = None
        self.in_call: CallInFlight | None = None  # an env call posted and not collected (call_async)
        self.device: HostTensors | None = None  # options.device's converter (shmvec.device), for the faces
        self.recording: tuple[m.RecordFrames | m.RecordSteps, ...] = ()  # what workers write into tapes
        self.owner, self.options = owner, options
        self.num_envs = n_envs
        assert isinstance(options.n_workers, int) and options.n_slots is not None
        self.n_workers = options.n_workers
        self.restart = options.on_crash == "restart"
        self.same_step = options.autoreset == "same_step"
        self.worker_envs: list[range] = split_envs(n_envs, self.n_workers)
        self.start_method = "fork"  # the start method build() resolved (set by it)
        self.flights = Flights(self.worker_envs, batch_size or n_envs, order)
        self._every_id = np.arange(n_envs, dtype=np.int32)
        self.supervisor = Supervisor(options.budget(), self.worker_envs)
        self.slots = Slots(options.n_slots, options.copy, self.n_workers)
        self.transport = transport
        self._finalizer = weakref.finalize(self, transport.close)
        self.closed = False
        try:
            env_spaces = startup.start(transport, range(self.n_workers), self.worker_envs, same_spaces)
            self.layout = layout = startup.lay_out(env_spaces, options, self.slots, self.n_workers)
            transport.bind(layout.ring)
            self.attach_msg = m.Attach(
                layout.ring.spec, layout.codecs, options.verify_every, options.native_step
            )
            outcome = startup.attach(transport, range(self.n_workers), *self.messages())
            self.carry_out(judge(outcome, False, Phase.START_UP, self.worker_envs), Phase.START_UP)
            #: Each env's :class:`~shmvec.native.NativeStatus`, in env order.
            self.native_steps = [s for w in range(self.n_workers) for s in outcome.results[w].values]  # type: ignore[union-attr]
            self.device = startup.converter(options, layout, self.slots)
        except BaseException:
            self.give_up()
            raise
        self.observation_space, self.action_space = layout.observation_space, layout.action_space
        self.obs_leaves, self.ring, self.reader, self.typed_infos = (
            layout.obs_leaves,
            layout.ring,
            layout.reader,
            layout.typed,
        )
        self.recovery = Recovery(transport, self.supervisor, self.ring, self.reader, self.messages)
        arrays = info_form == "arrays"
        self.reading = BatchReader(
            layout, self.slots, self.worker_envs, batch_size or n_envs, self.same_step, options.copy, arrays
        )
        if options.pause_openmp:
            self._openmp = PolicyThreads(usable_cpus(), transport.processes)

    def messages(self) -> tuple[m.Attach, m.Configure | None]:
        """What a (re)started worker is sent once its envs exist."""
        columns = self.layout.typed.columns
        configure = startup.configure_message(self.options, None if columns is None else columns.schema)
        if self.recording:
            configure = dataclasses.replace(configure or m.Configure(), record=self.recording)
        return self.attach_msg, configure

    def record(self, orders: tuple[m.RecordFrames | m.RecordSteps, ...]) -> None:
        """Have every worker write into recording tapes (:mod:`shmvec.memory.tape`) as ``orders``
        say from its next command on, replacing what it wrote before (``()``: nothing); a worker
        restart mode relaunches is told too.

        :raises RuntimeError: while steps or an env call are in flight.
        """
        self.check_open()
        if not self.flights.idle or self.in_call is not None:
            raise RuntimeError("a recording starts or stops between steps: receive the steps in flight first")
        self.recording = orders
        self.ask(range(self.n_workers), m.Configure(record=orders), Phase.CALL)

    # ------------------------------------------------------------------ lifecycle and faults

    def give_up(self, graceful: bool = True) -> None:
        """The one teardown path: stop the workers, free the ring, mark closed. Idempotent."""
        self.closed = True
        if self._openmp is not None:
            self._openmp.close()
        if self.device is not None:
            self.device.close()  # before the ring goes: no copy may still read it
        # What the engine holds of the ring, its decode threads first (start-up may have failed
        # before any of it existed): a closed engine kept alive keeps no mapping of it.
        for part in (getattr(self, "layout", None), getattr(self, "reading", None)):
            if part is not None:
                part.close()
        self.slots.forget_lent()
        if self._finalizer.detach() is not None:
            self.transport.close(graceful)

    def close(self) -> None:
        """The user's ``close()``: :meth:`give_up`, remembered so a later :class:`ClosedError` says so."""
        if not self.closed:
            self.closed_by_close = True
        self.give_up()

    def check_open(self) -> None:
        """:raises ClosedError: once the engine is closed."""
        if self.closed:
            raise ClosedError.because(self.owner, self.closed_by_close)

    @property
    def waiting(self) -> bool:
        """Whether steps were sent whose batch was not received yet."""
        return not self.closed and not self.flights.idle

    def pending_call(self) -> str | None:
        """``"call"``, ``"reset"`` or ``"step"``: what was sent and not received yet (a reset when any
        worker's command is one), None when nothing is."""
        if self.in_call is not None and not self.closed:
            return "call"
        return self.flights.pending_call() if self.waiting else None

    def carry_out(self, verdict: Verdict, phase: Phase) -> list[int]:
        """Do what the fault policy said: close and raise, or rebuild workers (restart mode; their
        envs end their episode at their next step). The workers rebuilt."""
        if verdict.close:
            self.give_up(graceful=verdict.graceful)
        rebuilt: list[int] = []
        if verdict.rebuild:
            rebuilt, error = self.recovery.rebuild(verdict.rebuild)
            if error is not None:
                self.give_up()
                raise error
        if verdict.error is not None:
            raise verdict.error
        return rebuilt

    # ------------------------------------------------------------------ send

    def send(self, actions: Any, env_ids: Any = None, partial: bool = False, split: bool = False) -> None:
        """Give envs ``env_ids`` (None: every env, in order) their next actions; a worker's group
        steps once all of its envs have one. ``actions`` may be reused by the caller afterwards.
        ``partial`` (with ``env_ids``): the caller takes the results as they come
        (``recv(at_least=...)`` of fewer than these), so each worker is seen to finish on its own.
        ``split`` (with ``env_ids``): every env named steps now, its worker stepping only the envs of
        its group that have an action (the others are left as they were; ``recv(at_least=...)``
        returns them).

        :raises ValueError: for a bad ``env_ids`` or action count, an env still stepping, or a
            ``split`` of a group in restart mode (nothing is sent then).
        :raises RuntimeError: ``env_ids=None`` while steps are in flight.
        """
        self.check_open()
        self.refuse_during_call("send")
        flights, ring = self.flights, self.ring
        if env_ids is not None:
            ids = flights.check_ids(env_ids)
            if split and self.restart:
                # A rebuilt worker's envs all end their episode at their next step: a step of some
                # of them would lose that for the others.
                flights.whole_groups(
                    ids, "step", "with on_crash='restart'; one env per worker takes any envs"
                )
            workers, per_worker, envs = flights.stage(ids, actions, ring, split)
            if workers:
                slots = [self.slots.advance(w) for w in workers]
                self._post_steps(workers, per_worker, slots, partial, envs)
            return
        if not flights.idle:
            raise RuntimeError("step_async() called twice without step_wait() (or send() before recv())")
        check_count(actions, self.num_envs, "")
        if ring.takes_actions(actions):
            np.copyto(ring.actions, actions)  # type: ignore[arg-type]
            per_worker = None
        else:
            per_worker = [list(actions[g.start : g.stop]) for g in self.worker_envs]
        slot = self.slots.advance_all()
        if self.restart:
            self.reader.keep_previous()
        self._post_steps(list(range(self.n_workers)), per_worker, [slot] * self.n_workers)

    def _post_steps(
        self,
        workers: list[int],
        actions: list[Any] | None,
        slots: list[int],
        partial: bool = False,
        envs: list[tuple[int, ...] | None] | None = None,
    ) -> None:
        """Post a step to each of ``workers`` (into its slot of ``slots``; ``actions``: one list per
        worker, or None when they are in the ring; ``partial``: as for :meth:`send`; ``envs``: the
        local envs each steps, None for all)."""
        flights, needs_reset = self.flights, self.supervisor.needs_reset
        typed = self.typed_infos
        if typed.untold and typed.columns is not None:
            # Learned from an earlier batch: from now on they write those values into the ring.
            told = typed.tell(workers)
            if told:
                self.ask(told, m.Configure(info_schema=typed.columns.schema), Phase.STEP)
        every = actions is None and envs is None and len(workers) == self.n_workers and len(set(slots)) == 1
        if every and not needs_reset:  # every synchronous step: one message object for all
            posted: list[int] = workers
            commands: list[m.Step] = [m.Step(slots[0])] * len(workers)
        else:
            posted, commands = [], []
            for k, w in enumerate(workers):
                step = m.Step(
                    slots[k], None if actions is None else actions[k], None if envs is None else envs[k]
                )
                if w in needs_reset:
                    # Restart mode: rebuilt since its last step, its envs are fresh and not reset:
                    # they end their episode in this step instead of stepping.
                    flights.ready[w] = (step, m.Restarted(self.recovery.reason(w)))
                    continue
                posted.append(w)
                commands.append(step)
            if not posted:
                return
        # Before sending: idle policy threads free the workers' cores when they need them, unless
        # the next batch can come from other envs and these step while the policy runs.
        paused = self._openmp is not None and self._openmp.before_step(
            len(flights.ready) + len(flights.busy) >= flights.per_batch
        )
        one = every and len(posted) == self.n_workers and not partial
        # Worker 0 wakes the others unless a pool was just ended (measured: memory/doorbell.py).
        faults = self.transport.post(
            range(self.n_workers) if one else posted, commands[0] if one else commands, partial, not paused
        )
        flights.busy.update(zip(posted, commands))
        if faults:
            self.land(Outcome(faults=faults))

    # ------------------------------------------------------------------ recv

    def recv(self, limit: float | None = None, at_least: int | None = None) -> Batch:
        """Wait for the next batch and read it out of the ring.

        :param limit: seconds to wait at most (None: as long as it takes); past it,
            ``multiprocessing.TimeoutError`` is raised and the steps stay in flight (those that
            arrived meanwhile are kept for the next ``recv``).
        :param at_least: None: the next batch of ``batch_size`` envs; else every worker ready, once
            they hold this many envs (or every env in flight, when fewer are): a batch of any size
            (:meth:`~shmvec.engine.flights.Flights.choose_ready`).
        :raises RuntimeError: when too few envs are stepping to fill a batch (a hang otherwise).
        """
        self.check_open()
        flights = self.flights
        deadline = None if limit is None else time.monotonic() + limit
        while True:
            workers = flights.choose() if at_least is None else flights.choose_ready(at_least)
            if workers is not None:
                break
            awaited, need = flights.awaited(at_least)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            outcome = self.transport.wait(awaited, need, left)
            if left is not None and not (outcome.finished or outcome.faults):
                raise multiprocessing.TimeoutError(f"the next batch did not arrive within {limit:g} s")
            self.land(outcome)
        arrived = list(map(flights.ready.pop, workers))
        if self._openmp is not None:
            # What the workers needed meanwhile decides later pauses (see shmvec.engine.openmp).
            self._openmp.after_step()
        ended = NOTHING_ENDED
        if self.supervisor.total:  # only once restart mode rebuilt a worker can a reply be Restarted
            whole = self.same_step and self.reading.whole(workers, arrived)
            ended, error = self.recovery.ended_in(workers, arrived, self.slots.slot, whole)
            if error is not None:
                self.give_up()
                raise error
        batch = self.reading.read(workers, arrived, ended)
        flights.last_ids = self._every_id if batch.env_ids is None else batch.env_ids
        return batch

    def land(self, outcome: Outcome) -> None:
        """Record what a wait brought in, and carry out the verdict on what went wrong."""
        flights = self.flights
        results = outcome.results
        flights.ready.update(zip(results, zip(map(flights.busy.pop, results), results.values())))
        if not outcome.errors and not outcome.faults:
            return
        failed = list(outcome.errors) + [f.worker for f in outcome.faults]
        sent = {w: flights.busy.pop(w, m.Step(self.slots.slot[w])) for w in failed}
        phase = Phase.RESET if any(isinstance(c, m.Reset) for c in sent.values()) else Phase.STEP
        verdict = judge(outcome, self.restart, phase, self.worker_envs)
        if verdict.error is not None and not verdict.close and outcome.errors and phase is Phase.STEP:
            # An env raised mid-step: the frames its worker (and, for a whole batch, every worker)
            # encoded will never be decoded.
            if flights.every:
                self.drain()
                self.recovery.resync(range(self.n_workers))
            else:
                self.recovery.resync(sorted(outcome.errors))
        for w in self.carry_out(verdict, phase):
            cmd = sent.get(w, m.Step(self.slots.slot[w]))
            if isinstance(cmd, m.Reset):
                reply, error = self.recovery.retry_reset(w, cmd)
                if error is not None:
                    self.give_up()
                    raise error
                flights.ready[w] = (cmd, reply)
            else:
                flights.ready[w] = (cmd, m.Restarted(self.recovery.reason(w)))

    def drain(self) -> None:
        """Wait for every step in flight and drop what was not received (before a reset, or after
        a synchronous batch failed)."""
        flights = self.flights
        while flights.busy:
            busy = sorted(flights.busy)
            outcome = self.transport.wait(busy, len(busy))
            for w in [*outcome.results, *outcome.errors, *(f.worker for f in outcome.faults)]:
                flights.busy.pop(w, None)
            if outcome.faults:
                self.carry_out(
                    judge(Outcome(faults=outcome.faults), self.restart, Phase.STEP, self.worker_envs),
                    Phase.STEP,
                )
        flights.clear()

    @property
    def n_restarts(self) -> int:
        """Worker restarts so far (restart mode)."""
        return self.supervisor.total


__all__ = ["Engine", "Options"]
