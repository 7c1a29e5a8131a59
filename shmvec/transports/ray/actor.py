"""The body of a Ray actor that serves one worker: the local worker's own code, in an actor.

:class:`RayWorker` creates its envs with :func:`shmvec.worker.serving.start_group`, runs every command
through the same handlers (:func:`shmvec.worker.serving.handlers`, :func:`shmvec.worker.serving.answer`)
and writes into a :class:`~shmvec.transports.ray.wire.PrivateRing`, so env errors, seeds, terminal
observations, autoreset modes and codec streams behave exactly as in a local worker. Each call
returns the pickled reply and, for a step or reset, the packed batch
(:func:`~shmvec.transports.ray.wire.pack`).

Ray imports this module in the actor's process: it imports Ray only inside methods, and neither
SB3 nor torch.

An actor never imports the driver's main script, where packages such as ale-py register their envs
with Gymnasium on import; a factory that calls ``gym.make("PongNoFrameskip-v4")`` without importing
them, as SB3's ``make_atari_env`` makes them, would find no such env there. So the driver lists the
packages it imported that registered envs (:func:`env_packages`) and each actor imports them before
it makes its envs.
"""

from __future__ import annotations

import functools
import importlib
import os
import pickle
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from shmvec.memory.layout import Leaf, leaves
from shmvec.transports.ray.wire import Packed, PrivateRing, pack
from shmvec.wire import messages as m
from shmvec.worker.envapi import unpicklable
from shmvec.worker.process import limit_threads, quiet_ale_banner
from shmvec.worker.serving import answer, handlers, start_group


def env_packages() -> tuple[str, ...]:
    """The top-level packages imported in this process whose code Gymnasium's registry names as an
    env's entry point (``ale_py`` for ``ale_py.env:AtariEnv``): importing them registers their envs."""
    import gymnasium as gym

    names = set()
    for spec in gym.registry.values():
        if isinstance(spec.entry_point, str):
            names.add(spec.entry_point.split(":")[0].split(".")[0])
    names -= {"gymnasium", "__main__"}
    return tuple(sorted(name for name in names if name in sys.modules))


def import_packages(names: Sequence[str]) -> None:
    """Import ``names`` (see :func:`env_packages`). One that fails to import is left out: a factory
    that needs it then fails as it would have, with its own error and the hint shmvec adds to it."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S110 - see the docstring
            pass


class RayWorker:
    """One worker's envs in a Ray actor (wrapped with ``ray.remote`` by the main process).

    :param env_fns: the worker's env factories, cloudpickled.
    :param first_env: global index of its first env.
    :param n_threads: BLAS/OpenMP threads allowed in the actor (None: leave as is).
    :param isolate_rng: give each env its own process-global RNG state.
    :param packages: packages to import first, those that register the driver's envs
        (:func:`env_packages`).
    """

    def __init__(
        self,
        env_fns: bytes,
        first_env: int,
        n_threads: int | None,
        isolate_rng: bool,
        packages: Sequence[str] = (),
    ) -> None:
        quiet_ale_banner()  # as in a local worker: one banner per actor, relayed by Ray, buried the output
        limit_threads(n_threads)
        import_packages(packages)
        self.pid = os.getpid()
        self.first_env = first_env
        self.group, self.started = start_group(env_fns, first_env, isolate_rng, self.pid)
        self.table = {} if self.group is None else handlers(self.group)
        self.codecs: tuple[Any, ...] = ()
        self.leaves: list[Leaf] = []

    def ready(self) -> tuple[bytes, int, str, str]:
        """The start-up reply (pickled), this actor's pid, node IP address and node id."""
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        # Always picklable: spaces, or a RemoteError.
        reply = pickle.dumps(self.started, pickle.HIGHEST_PROTOCOL)
        return reply, self.pid, ray.util.get_node_ip_address(), node_id

    def call(self, message: bytes) -> bytes:
        """Serve one pickled command: the pickled ``(reply, batch)``.

        One bytes object each way: Ray serializes it as it is, where a tuple of small arrays costs
        it a buffer per array (measured on 2 busy cores, 2 actors, a null env: 8.5 -> 3.4 ms per step).
        """
        msg = pickle.loads(message)
        reply, data = self.serve(msg)
        try:
            return pickle.dumps((reply, data), pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            if isinstance(reply, m.Failed):
                raise
            # e.g. an info dict or attribute value that cannot be pickled: an error naming the env.
            return pickle.dumps((unpicklable(msg, reply, self.first_env, exc), None), pickle.HIGHEST_PROTOCOL)

    def serve(self, msg: m.Command) -> tuple[m.Reply, Packed | None]:
        """One command: the reply, and the packed batch after a step or reset that succeeded (None
        otherwise). ``Attach`` maps a private ring of this worker's envs."""
        group = self.group
        assert group is not None, "no envs: the start-up reply said why"
        table = self.table
        if isinstance(msg, m.Attach):
            self.leaves = obs_leaves = leaves(group.space)
            ring = PrivateRing(obs_leaves, len(group.envs), msg.codecs)
            self.codecs = tuple(msg.codecs) if msg.codecs else (None,) * len(obs_leaves)
            table = {**table, m.Attach: functools.partial(group.attach, ring=ring)}
        reply = answer(group, table, msg, self.pid)
        data = None
        if isinstance(reply, m.Stepped | m.ResetDone):
            assert group.ring is not None
            done: list[int] = []
            if isinstance(reply, m.Stepped) and group.autoreset == "same_step":
                # Only same-step autoreset writes terminal observations.
                done = np.flatnonzero(group.ring.terminated[0] | group.ring.truncated[0]).tolist()
                named = getattr(msg, "envs", None)  # a Stepped reply answers a Step
                if named is not None:  # the other envs' rows are from an earlier step
                    done = [i for i in done if i in named]
            data = pack(group.ring, self.leaves, self.codecs, done)
        return reply, data

    def close(self) -> None:
        """Close the envs and end the actor (so that close() in the main process returns once it is
        gone; a kill follows anyway, for an actor that hangs here)."""
        import ray

        if self.group is not None:
            self.group.close()
        ray.actor.exit_actor()
