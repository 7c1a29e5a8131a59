"""Restart mode carried out: rebuild failed workers, end their envs' episodes, retry a failed reset.

The supervisor (:mod:`shmvec.engine.supervisor`) admits each fault against the budget; this module
relaunches the worker (:func:`shmvec.engine.startup.relaunch`), and when the rebuilt worker's envs
next appear in a batch, ends their episode there: reward 0, truncated, the restart info keys, and
either the reset observation with the last one the caller saw as terminal observation
(``same_step``) or the last observation carried over with the reset done in place of the next step.
Everything returns what it found; an error (the budget is spent) is returned for the engine to
raise after closing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shmvec.engine.faults import env_fault
from shmvec.engine.obs_reader import Reader
from shmvec.engine.startup import relaunch
from shmvec.engine.supervisor import Supervisor
from shmvec.memory.ring import Ring
from shmvec.transports.base import Fault, Transport
from shmvec.wire import messages as m


@dataclass
class Ended:
    """Envs whose episode a restart ended in this batch (env index keys).

    :param infos: the step info (restart keys only).
    :param reset_infos: the reset info of envs reset within the step (``same_step``).
    :param finals: terminal observation leaves (``same_step``: the last observation the caller saw).
    :param carried: workers whose rows keep the last observation (reset in place of the next step).
    """

    infos: dict[int, dict[str, Any]] = field(default_factory=dict)
    reset_infos: dict[int, dict[str, Any]] = field(default_factory=dict)
    finals: dict[int, list[np.ndarray]] = field(default_factory=dict)
    carried: list[int] = field(default_factory=list)


NOTHING_ENDED = Ended()  # read only: no restart ended an episode in the batch


class Recovery:
    """Carries out restart mode for one engine.

    :param transport: reaches the workers.
    :param supervisor: the budget, seeds and reasons.
    :param ring: the engine's ring (rewards and flags of ended episodes are written there).
    :param reader: the engine's reader (codec streams start over; the last observations).
    :param messages: what a relaunched worker is sent: its ``Attach`` and ``Configure`` (None).
    """

    def __init__(
        self,
        transport: Transport,
        supervisor: Supervisor,
        ring: Ring,
        reader: Reader,
        messages: Callable[[], tuple[m.Attach, m.Configure | None]],
    ) -> None:
        self.transport, self.supervisor, self.ring, self.reader = transport, supervisor, ring, reader
        self.messages = messages
        self.worker_envs = supervisor.worker_envs

    def rebuild(self, faults: list[Fault]) -> tuple[list[int], BaseException | None]:
        """Relaunch each faulty worker (a relaunch that fails counts against the same budget); the
        workers rebuilt, and the error to raise when the budget ran out."""
        queue: list[Fault] = list(faults)
        rebuilt: list[int] = []
        while queue:
            fault = queue.pop(0)
            error = self.supervisor.admit(fault)
            if error is not None:
                return rebuilt, error
            w = fault.worker
            attach, configure = self.messages()
            failed = relaunch(self.transport, w, attach, configure, self.worker_envs)
            if failed is not None:
                # Its envs still end their episode for the first reason; the new error is the one
                # raised if the budget runs out.
                queue.insert(0, Fault(w, fault.reason, failed.error))
                continue
            self.reader.restart(self.worker_envs[w])
            self.supervisor.needs_reset[w] = fault.reason
            if w not in rebuilt:
                rebuilt.append(w)
        return rebuilt, None

    def reason(self, w: int) -> str:
        """Why worker ``w`` was rebuilt (its envs' episodes now end for that reason)."""
        return self.supervisor.needs_reset.pop(w, "")

    def ended_in(
        self, workers: list[int], arrived: list[tuple[m.Command, Any]], slots: list[int], same_step: bool
    ) -> tuple[Ended, BaseException | None]:
        """End the episodes of the batch's workers whose reply is :class:`~shmvec.wire.messages.Restarted`
        (see :meth:`end_episodes`); what ended, and the error to raise if the budget ran out."""
        restarted = {w: (slots[w], r.reason) for w, (_, r) in zip(workers, arrived) if type(r) is m.Restarted}
        return self.end_episodes(restarted, same_step) if restarted else (NOTHING_ENDED, None)

    def end_episodes(
        self, restarted: dict[int, tuple[int, str]], same_step: bool
    ) -> tuple[Ended, BaseException | None]:
        """End the episodes of the envs of ``restarted`` (worker -> (its slot, reason)) in their
        slots. ``same_step``: reset them now (needs the previous batch in the reader); otherwise
        they reset in place of their next step and their rows are carried over by the caller."""
        ended = Ended()
        pending = dict(restarted)
        supervisor, ring = self.supervisor, self.ring
        while pending:
            workers = sorted(pending)
            seeds = [supervisor.reset_seeds(w) for w in workers]
            if same_step:
                for w in workers:
                    g = self.worker_envs[w]
                    # The last observation the caller saw is intact in the previous batch (n_slots
                    # >= 2): the failed worker may have half-written this slot, never that one.
                    last = self.reader.previous(slice(g.start, g.stop))
                    for k, i in enumerate(g):
                        ended.finals[i] = [leaf[k] for leaf in last]
                # No options, as an autoreset.
                commands: list[m.Command] = [
                    m.Reset(pending[w][0], s, [{}] * len(s)) for w, s in zip(workers, seeds)
                ]
            else:
                commands = [m.Configure(reset_seeds=s) for s in seeds]
            faults = self.transport.post(workers, commands)
            failed = {f.worker for f in faults}
            outcome = self.transport.wait([w for w in workers if w not in failed], len(workers) - len(failed))
            faults += outcome.faults
            faults += [env_fault(w, e, self.worker_envs[w]) for w, e in outcome.errors.items()]
            for w, reply in outcome.results.items():
                slot, reason = pending.pop(w)
                g = self.worker_envs[w]
                ring.rewards[slot, g.start : g.stop] = 0.0
                ring.terminated[slot, g.start : g.stop] = False
                ring.truncated[slot, g.start : g.stop] = True
                if not same_step:
                    ended.carried.append(w)
                elif self.reader.objects is not None:
                    self.reader.objects.take(reply, g.start)  # the new episodes' first values
                for k, i in enumerate(g):
                    ended.infos[i] = supervisor.mark({}, reason)
                    if isinstance(reply, m.ResetDone) and reply.infos[k] is not None:
                        ended.reset_infos[i] = supervisor.mark(reply.infos[k], reason)  # type: ignore[arg-type]
            if faults:
                _, error = self.rebuild(sorted(faults, key=lambda f: f.worker))
                if error is not None:
                    return ended, error
                for f in faults:
                    self.supervisor.needs_reset.pop(f.worker, None)  # still pending, first reason kept
        return ended, None

    def retry_reset(self, w: int, cmd: m.Reset) -> tuple[m.ResetDone | None, BaseException | None]:
        """After worker ``w`` failed ``cmd`` and was rebuilt: reset it again with the same seeds
        (unseeded envs: :func:`~shmvec.engine.restart.restart_seed`); its reset infos, marked."""
        while True:
            reason = self.reason(w)
            seeds = self.supervisor.reset_seeds(w, cmd.seeds)
            retry = m.Reset(cmd.slot, seeds, cmd.kwargs, cmd.mask)
            faults = self.transport.post([w], retry)
            outcome = self.transport.wait([w], 1) if not faults else None
            if outcome is not None:
                faults = outcome.faults + [
                    env_fault(w, e, self.worker_envs[w]) for w, e in outcome.errors.items()
                ]
            if not faults:
                reply = outcome.results[w] if outcome is not None else None
                assert isinstance(reply, m.ResetDone)
                infos = [None if i is None else self.supervisor.mark(i, reason) for i in reply.infos]
                return m.ResetDone(infos, reply.objects), None
            _, error = self.rebuild(faults)
            if error is not None:
                return None, error

    def resync(self, workers: list[int] | range) -> None:
        """After a step whose frames were never decoded (an env raised): every env of ``workers``
        starts its codec stream over from a key frame, instead of every later step failing."""
        if not self.reader.decoded:
            return
        workers = list(workers)
        faults = self.transport.post(workers, m.Configure(key_frames=True))
        failed = {f.worker for f in faults}
        self.transport.wait([w for w in workers if w not in failed], len(workers) - len(failed))
        for w in workers:
            self.reader.restart(self.worker_envs[w])
