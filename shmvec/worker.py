"""The worker process: builds a contiguous group of envs and serves commands for them.

A plain loop with a dispatch table. Each ``step`` writes observations, rewards and flags of the
worker's envs into the ring slot named by the main process and answers with the few non-empty info
dicts. An exception in an env is sent back (with env index and traceback) and the loop goes on, so
one failing ``get_attr`` or ``step`` never leaves the main process waiting on a dead pipe.

This module must stay light to import: a worker started with spawn or forkserver imports it before
anything else, and importing SB3 here would load torch in every worker (~300 MB each).
"""

from __future__ import annotations

import contextlib
import copy
import os
import pickle
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import cloudpickle
import gymnasium as gym
import numpy as np

from shmvec.envapi import check_reset, check_step, has_wrapper_attr, is_wrapped, make_env, unpicklable
from shmvec.errors import ObservationError
from shmvec.infos import InfoColumns
from shmvec.layout import Leaf, check_finite, flatten, inf_allowed, leaves, write_leaf
from shmvec.process import (
    GlobalRngs,
    enable_faulthandler,
    exit_with_parent,
    limit_threads,
    pin_to_cpu,
    quiet_ale_banner,
)
from shmvec.protocol import READY, Command, RemoteError, read_message, write_message
from shmvec.ring import Ring, RingSpec
from shmvec.waiting import CommandWait

if TYPE_CHECKING:
    from shmvec.codecs import Codec
    from shmvec.codecs.channel import LeafEncoder


class _Worker:
    """State of one worker: its envs and its slice of the ring.

    :param rngs: per-env global RNG states, or None to leave the globals shared.
    """

    def __init__(self, envs: list[gym.Env], first_env: int, rngs: GlobalRngs | None = None) -> None:
        self.rngs = rngs
        self.envs = envs
        self.first_env = first_env
        self.current: int | None = None  # local index of the env being called, for error reports
        self.space = envs[0].observation_space
        self.leaves: list[Leaf] = []
        self.ring: Ring | None = None
        self.obs: list[Any] = []  # per leaf: the batched ring array, or an EncodedArea
        self.final: list[Any] = []
        self.encoders: list[LeafEncoder] = []
        self.finite_rules: list[bool | None] | None = None  # set by ``configure(check_finite=True)``
        self.names: list[str] = []
        # Autoreset: "same_step" (reset inside the step that ends an episode, SB3's way), "next_step"
        # (reset in place of the following step) or "disabled" (the caller resets).
        self.autoreset = "same_step"
        self.ended = [False] * len(envs)  # envs whose next step is a reset (next_step mode, rebuilt)
        self.next_seeds: list[int | None] = [None] * len(envs)  # seeds of those resets
        self.infos: InfoColumns | None = None  # typed info columns, once the engine sends a schema
        self.spin_s = 0.0  # how long the worker process polls for its next command (see waiting.py)

    def attach(
        self, payload: tuple[RingSpec | None, tuple[Codec | None, ...] | None, int], ring: Ring | None = None
    ) -> None:
        """Map the ring. ``payload``: the ring spec, the codec of each leaf (None: no codec at all)
        and how often to checksum encoded frames (see :mod:`shmvec.codecs.channel`). ``ring``: a
        ring of this worker's envs only (a Ray actor's own, rows from 0) instead of the spec's."""
        spec, codecs, verify_every = payload
        # The main process has checked the space can be laid out before sending the ring.
        self.leaves = leaves(self.space)
        self.ring = Ring.attach(spec) if ring is None else ring  # type: ignore[arg-type]
        lo = self.first_env if ring is None else 0
        hi = lo + len(self.envs)
        self.obs, self.final = [], []
        for j, leaf in enumerate(self.leaves):
            codec = codecs[j] if codecs else None
            if codec is None:
                self.obs.append(self.ring.obs(j)[:, lo:hi])
                self.final.append(self.ring.final(j)[lo:hi])
                continue
            # Imported only with a codec: the default path loads nothing more in the worker.
            from shmvec.codecs.channel import LeafEncoder

            encoder = LeafEncoder(codec, leaf, self.ring, j, range(lo, hi), verify_every)
            self.encoders.append(encoder)
            self.obs.append(encoder.obs)
            self.final.append(encoder.final)
        self.rewards = self.ring.rewards[:, lo:hi]
        self.terminated = self.ring.terminated[:, lo:hi]
        self.truncated = self.ring.truncated[:, lo:hi]
        actions = self.ring.actions
        self.actions = None if actions is None else actions[lo:hi]
        self.names = [leaf.name for leaf in self.leaves]

    def configure(self, payload: dict[str, Any]) -> None:
        """Options sent after ``attach``: ``check_finite`` (bool), ``autoreset`` (mode name),
        ``reset_seeds`` (one per env: reset every env, with that seed, in place of its next step),
        ``key_frames`` (every env's next encoded frame is a key frame), ``info_schema`` (an
        :class:`~shmvec.infos.InfoSchema`: write those info values into the ring's typed columns) and
        ``spin_us`` (how long a worker process polls for its next command, in µs)."""
        if "spin_us" in payload:
            self.spin_s = payload["spin_us"] / 1e6
        if payload.get("check_finite"):
            self.finite_rules = inf_allowed(self.space)
        self.autoreset = payload.get("autoreset", self.autoreset)
        if payload.get("key_frames"):
            for encoder in self.encoders:
                for i in range(len(self.envs)):
                    encoder.restart(i)
        schema = payload.get("info_schema")
        if schema is not None and self.ring is not None and self.ring.info_words is not None:
            self.infos = InfoColumns(schema, *self.ring.info_words)
        seeds = payload.get("reset_seeds")
        if seeds is not None:
            self.ended = [True] * len(self.envs)
            self.next_seeds = list(seeds)

    def write(self, dst: list[np.ndarray], i: int, obs: Any, terminal: bool = False) -> None:
        env_index = self.first_env + i
        values = flatten(self.space, obs, [])
        if self.finite_rules is not None:
            # Checked on the values, before any codec: works the same for raw and encoded leaves.
            found = check_finite([np.asarray(v)[None] for v in values], self.finite_rules, self.names)
            if found is not None:
                raise ObservationError(f"env {env_index}, {'terminal ' if terminal else ''}{found[1]}")
        for leaf, arr, value in zip(self.leaves, dst, values):
            write_leaf(arr, i, value, leaf, env_index)

    def step(self, payload: tuple[int, Any]) -> list[tuple[int, dict, dict | None]]:
        slot, actions = payload
        if actions is None:
            actions = self.actions
        obs_slot = [a[slot] for a in self.obs]
        rewards, terminated, truncated = self.rewards[slot], self.terminated[slot], self.truncated[slot]
        same_step = self.autoreset == "same_step"
        ended = self.ended
        rngs = self.rngs
        typed = self.infos
        replies = []
        for i, env in enumerate(self.envs):
            self.current = i
            if rngs is not None:
                rngs.enter(i)
            reset_info = None
            if ended[i]:
                # next_step mode: the episode ended in the last step; this step is its reset.
                ended[i] = False
                seed, self.next_seeds[i] = self.next_seeds[i], None
                obs, info = check_reset(env.reset(seed=seed), self.first_env + i)
                self._restart_codecs(i)
                term = trunc = False
                reward = 0.0
            else:
                action = actions[i]
                if isinstance(action, np.ndarray):
                    # A view into the ring (or into the unpickled batch) must not be kept by the env.
                    action = action.copy()
                obs, reward, term, trunc, info = check_step(env.step(action), self.first_env + i)
                if term or trunc:
                    if same_step:
                        # The terminal observation goes to its own area before the reset obs fills
                        # the slot, and the info is copied: an env may reuse and mutate both in reset().
                        self.write(self.final, i, obs, terminal=True)
                        info = copy.deepcopy(info)
                        obs, reset_info = check_reset(env.reset(), self.first_env + i)
                        self._restart_codecs(i)
                    elif self.autoreset == "next_step":
                        ended[i] = True
            if rngs is not None:
                rngs.leave(i)
            self.write(obs_slot, i, obs)
            rewards[i] = reward
            terminated[i] = term
            truncated[i] = trunc
            if typed is not None:
                info = typed.put(slot, self.first_env + i, info)
            if info or reset_info is not None:
                replies.append((i, info, reset_info))
        self.current = None
        return replies

    def _restart_codecs(self, i: int) -> None:
        for encoder in self.encoders:
            encoder.restart(i)

    def reset(self, payload: tuple[int, list, list[dict], list[bool] | None]) -> list[dict | None]:
        """Reset the envs (all, or those of ``mask``); their reset infos, None for envs not reset.
        Each env's ``reset`` gets its seed and its keyword arguments of ``kwargs`` (the face decides
        whether ``options`` is passed: SB3 only when set, Gymnasium always)."""
        slot, seeds, kwargs, mask = payload
        obs_slot = [a[slot] for a in self.obs]
        infos: list[dict | None] = []
        for i, env in enumerate(self.envs):
            if mask is not None and not mask[i]:
                infos.append(None)
                continue
            self.current = i
            self.ended[i], self.next_seeds[i] = False, None
            if self.rngs is not None:
                self.rngs.enter(i)
            obs, info = check_reset(env.reset(seed=seeds[i], **kwargs[i]), self.first_env + i)
            if self.rngs is not None:
                self.rngs.leave(i)
            self._restart_codecs(i)
            self.write(obs_slot, i, obs)
            infos.append(info)
        self.current = None
        return infos

    def _each(self, indices: list[int], call: Callable[[gym.Env], Any]) -> list[Any]:
        results = []
        for i in indices:
            self.current = i
            if self.rngs is not None:
                self.rngs.enter(i)
            results.append(call(self.envs[i]))
            if self.rngs is not None:
                self.rngs.leave(i)
        self.current = None
        return results

    def get_attr(self, payload: tuple[list[int], str]) -> list[Any]:
        indices, name = payload
        return self._each(indices, lambda env: env.get_wrapper_attr(name))

    def has_attr(self, payload: tuple[list[int], str]) -> list[bool]:
        indices, name = payload
        return self._each(indices, lambda env: has_wrapper_attr(env, name))

    def set_attr(self, payload: tuple[list[int], str, Any]) -> None:
        indices, name, value = payload
        self._each(indices, lambda env: setattr(env, name, value))

    def env_method(self, payload: tuple[list[int], str, tuple, dict]) -> list[Any]:
        indices, name, args, kwargs = payload
        return self._each(indices, lambda env: env.get_wrapper_attr(name)(*args, **kwargs))

    def call(self, payload: tuple[list[int], str, tuple, dict]) -> list[Any]:
        indices, name, args, kwargs = payload

        def one(env: gym.Env) -> Any:
            attr = env.get_wrapper_attr(name)
            return attr(*args, **kwargs) if callable(attr) else attr

        return self._each(indices, one)

    def set_wrapper_attr(self, payload: tuple[list[int], str, list[Any]]) -> None:
        indices, name, values = payload  # values: one per env of the whole vector env
        for i in indices:
            self.current = i
            self.envs[i].set_wrapper_attr(name, values[self.first_env + i])
        self.current = None

    def is_wrapped(self, payload: tuple[list[int], type]) -> list[bool]:
        indices, wrapper_class = payload
        return self._each(indices, lambda env: is_wrapped(env, wrapper_class))

    def render(self, payload: list[int]) -> list[Any]:
        return self._each(payload, lambda env: env.render())

    def close(self) -> None:
        for env in self.envs:
            with contextlib.suppress(Exception):
                env.close()
        # Views into the mapping must go before it can be unmapped.
        self.obs = self.final = []
        self.encoders = []
        if self.ring is not None:
            self.ring.close()


def worker_main(
    conn: Connection,
    env_fns: bytes | list[Callable[[], Any]],
    first_env: int,
    n_threads: int | None,
    fault_log: str | None = None,
    isolate_rng: bool = False,
    cpu: int | None = None,
) -> None:
    """Entry point of a worker process.

    :param conn: this worker's end of its pipe to the main process.
    :param env_fns: the env factories, cloudpickled (spawn/forkserver) or as objects (fork).
    :param first_env: global index of the first env of this worker.
    :param n_threads: BLAS/OpenMP threads allowed in this worker (None: leave as is).
    :param fault_log: file for faulthandler's traceback if the worker crashes (None: stderr).
    :param isolate_rng: give each env its own process-global RNG state (see :class:`GlobalRngs`).
    :param cpu: the CPU this worker runs on (None: wherever the OS puts it).
    """
    # Ctrl-C reaches the whole process group; the main process decides what happens, then closes us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    enable_faulthandler(fault_log)
    exit_with_parent()
    quiet_ale_banner()
    pin_to_cpu(cpu)
    limit_threads(n_threads)
    pid = os.getpid()
    fd = conn.fileno()
    worker, reply = start_worker(env_fns, first_env, isolate_rng, pid)
    _send(fd, reply)
    if worker is None:
        conn.close()
        return
    handlers = dispatch_table(worker)
    waiting = CommandWait(fd)
    try:
        while True:
            waiting.spin_s = worker.spin_s
            waiting.wait()
            try:
                cmd, payload = pickle.loads(read_message(fd))
            except (EOFError, OSError):
                break  # the main process is gone
            waiting.received()
            if cmd == Command.CLOSE:
                break
            reply = answer(worker, handlers, cmd, payload, pid)
            try:
                _send(fd, reply)
            except OSError:
                break  # the main process is gone
            except Exception as exc:  # e.g. an info dict or attribute value that cannot be pickled
                # Pickling fails before anything is written, so the pipe is still in step.
                env_index, exc = unpicklable(cmd, payload, reply[1], first_env, exc)
                _send(fd, (False, RemoteError.capture(exc, env_index, Command(cmd).label(payload), pid)))
            waiting.done()
    finally:
        worker.close()
        conn.close()


def _send(fd: int, reply: tuple[bool, Any]) -> None:
    # Plain pickle, as the main process sends: Connection.send builds a ForkingPickler per message.
    write_message(fd, pickle.dumps(reply, pickle.HIGHEST_PROTOCOL))


def start_worker(
    env_fns: bytes | list[Callable[[], Any]], first_env: int, isolate_rng: bool, pid: int
) -> tuple[_Worker | None, tuple[bool, Any]]:
    """Create a worker's envs (in a worker process or a Ray actor): the worker and its start-up
    reply ``(True, (READY, spaces of each env))``, or None and ``(False, RemoteError)``."""
    envs: list[gym.Env] = []
    try:
        fns = cloudpickle.loads(env_fns) if isinstance(env_fns, bytes) else env_fns
        rngs = GlobalRngs(len(fns)) if isolate_rng else None
        for i, fn in enumerate(fns):
            if rngs is not None:
                rngs.enter(i)
            envs.append(make_env(fn))
            if rngs is not None:
                rngs.leave(i)
        spaces_ = [(env.observation_space, env.action_space) for env in envs]
        worker = _Worker(envs, first_env, rngs)
    except BaseException as exc:  # noqa: BLE001 - anything a user factory raises goes back
        return None, (False, RemoteError.capture(exc, first_env + len(envs), "make_env", pid))
    return worker, (True, (READY, spaces_))


def dispatch_table(worker: _Worker) -> dict[str, Callable[[Any], Any]]:
    """The handler of each command a worker serves (all but ``close``)."""
    # Keyed by Command members, which hash and compare equal to the plain strings that arrive.
    return {
        Command.ATTACH: worker.attach,
        Command.STEP: worker.step,
        Command.RESET: worker.reset,
        Command.GET_ATTR: worker.get_attr,
        Command.HAS_ATTR: worker.has_attr,
        Command.SET_ATTR: worker.set_attr,
        Command.ENV_METHOD: worker.env_method,
        Command.CALL: worker.call,
        Command.SET_WRAPPER_ATTR: worker.set_wrapper_attr,
        Command.IS_WRAPPED: worker.is_wrapped,
        Command.RENDER: worker.render,
        Command.CONFIGURE: worker.configure,
    }


def answer(
    worker: _Worker, handlers: dict[str, Callable[[Any], Any]], cmd: str, payload: Any, pid: int
) -> tuple[bool, Any]:
    """Run one command: ``(True, result)``, or ``(False, RemoteError)`` naming the env that raised."""
    try:
        return True, handlers[cmd](payload)
    except Exception as exc:
        env_index = None if worker.current is None else worker.first_env + worker.current
        worker.current = None
        return False, RemoteError.capture(exc, env_index, Command(cmd).label(payload), pid)
