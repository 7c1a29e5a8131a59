"""The body of a Ray actor that serves one worker: the local worker loop's own code, in an actor.

:class:`RayWorker` creates its envs with :func:`shmvec.worker.start_worker`, runs every command
through the worker's dispatch table (:func:`shmvec.worker.dispatch_table`, :func:`shmvec.worker.answer`)
and writes into a :class:`~shmvec.transports.ray_wire.PrivateRing`, so env errors, seeds, terminal
observations, autoreset modes and codec streams behave exactly as in a local worker. Each call
returns the pickled reply (as the pipe would carry it) and, for ``step``/``reset``, the packed batch
(:func:`~shmvec.transports.ray_wire.pack`).

Ray imports this module in the actor's process: it imports Ray only inside methods, and neither
SB3 nor torch.
"""

from __future__ import annotations

import functools
import os
import pickle
from typing import Any

import numpy as np

from shmvec.envapi import unpicklable
from shmvec.layout import leaves
from shmvec.process import limit_threads
from shmvec.protocol import Command, RemoteError
from shmvec.transports.ray_wire import Packed, PrivateRing, pack
from shmvec.worker import answer, dispatch_table, start_worker


class RayWorker:
    """One worker's envs in a Ray actor (wrapped with ``ray.remote`` by the main process).

    :param env_fns: the worker's env factories, cloudpickled.
    :param first_env: global index of its first env.
    :param n_threads: BLAS/OpenMP threads allowed in the actor (None: leave as is).
    :param isolate_rng: give each env its own process-global RNG state.
    """

    def __init__(self, env_fns: bytes, first_env: int, n_threads: int | None, isolate_rng: bool) -> None:
        limit_threads(n_threads)
        self.pid = os.getpid()
        self.first_env = first_env
        self.worker, self.started = start_worker(env_fns, first_env, isolate_rng, self.pid)
        self.handlers = {} if self.worker is None else dispatch_table(self.worker)
        self.codecs: tuple[Any, ...] = ()

    def ready(self) -> tuple[bytes, int, str, str]:
        """The start-up reply (pickled), this actor's pid, node IP address and node id."""
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        # Always picklable: spaces, or a RemoteError.
        reply = pickle.dumps(self.started, pickle.HIGHEST_PROTOCOL)
        return reply, self.pid, ray.util.get_node_ip_address(), node_id

    def call(self, message: bytes) -> bytes:
        """Serve one pickled ``(command, payload)``: the pickled ``(reply, batch)``.

        One bytes object each way: Ray serializes it as it is, where a tuple of small arrays costs
        it a buffer per array (measured on 2 busy cores, 2 actors, a null env: 8.5 -> 3.4 ms per step).
        """
        cmd, payload = pickle.loads(message)
        reply, data = self.serve(cmd, payload)
        try:
            return pickle.dumps((reply, data), pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            if not reply[0]:
                raise
            # e.g. an info dict or attribute value that cannot be pickled: an error naming the env.
            env_index, exc = unpicklable(cmd, payload, reply[1], self.first_env, exc)
            error = RemoteError.capture(exc, env_index, Command(cmd).label(payload), self.pid)
            return pickle.dumps(((False, error), None), pickle.HIGHEST_PROTOCOL)

    def serve(self, cmd: str, payload: Any) -> tuple[tuple[bool, Any], Packed | None]:
        """One command: the reply ``(ok, result)``, and the packed batch after a ``step`` or
        ``reset`` that succeeded (None otherwise). ``attach`` takes ``(codecs, verify_every)``."""
        worker = self.worker
        assert worker is not None, "no envs: the start-up reply said why"
        handlers = self.handlers
        if cmd == Command.ATTACH:
            codecs, verify_every = payload
            obs_leaves = leaves(worker.space)
            ring = PrivateRing(obs_leaves, len(worker.envs), codecs)
            self.codecs = tuple(codecs) if codecs else (None,) * len(obs_leaves)
            payload = (None, codecs, verify_every)
            handlers = {**handlers, Command.ATTACH: functools.partial(worker.attach, ring=ring)}
        reply = answer(worker, handlers, cmd, payload, self.pid)
        data = None
        if reply[0] and cmd in (Command.STEP, Command.RESET):
            assert worker.ring is not None
            done: list[int] = []
            if cmd == Command.STEP and worker.autoreset == "same_step":
                # Only same-step autoreset writes terminal observations.
                done = np.flatnonzero(worker.ring.terminated[0] | worker.ring.truncated[0]).tolist()
            data = pack(worker.ring, self.codecs, done)
        return reply, data

    def close(self) -> None:
        """Close the envs and end the actor (so that close() in the main process returns once it is
        gone; a kill follows anyway, for an actor that hangs here)."""
        import ray

        if self.worker is not None:
            self.worker.close()
        ray.actor.exit_actor()
