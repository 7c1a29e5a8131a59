"""ShmVecEnv: SB3's VecEnv interface over a shared-memory ring and a few worker processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection, wait
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from shmvec.errors import (
    ClosedError,
    EnvError,
    EnvTimeoutError,
    ShmVecEnvError,
    WorkerCrashedError,
)
from shmvec.layout import Leaf, leaves, unflatten
from shmvec.protocol import RemoteError
from shmvec.ring import Ring
from shmvec.worker import thread_env, worker_main

_ARRAY_ACTION_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
# How long close() lets a worker finish its current command and exit before terminating it (s).
_CLOSE_GRACE_S = 5.0

_MAIN_GUARD_HINT = (
    "With the '{method}' start method each worker re-imports your main script: if the code that "
    'creates the VecEnv runs at import time, put it under `if __name__ == "__main__":`, or pass '
    "start_method='fork'. The worker's own error, if it printed one, is on stderr above."
)


def usable_cpus() -> int:
    """CPUs this process may run on (affinity mask / cgroup-limited where the OS tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def split_envs(n_envs: int, n_workers: int) -> list[range]:
    """Contiguous groups of env indices, sizes differing by at most one (the first ones larger)."""
    base, extra = divmod(n_envs, n_workers)
    groups, start = [], 0
    for w in range(n_workers):
        size = base + (1 if w < extra else 0)
        groups.append(range(start, start + size))
        start += size
    return groups


class _Resources:
    """What must be released whatever happens: processes, pipes, the ring.

    Kept apart from the VecEnv so a ``weakref.finalize`` can release them without keeping the
    VecEnv alive.
    """

    def __init__(self) -> None:
        self.processes: list[Any] = []
        self.remotes: list[Connection] = []
        self.ring: Ring | None = None

    def release(self, graceful: bool = True) -> None:
        if graceful:
            for remote in self.remotes:
                with suppress(OSError, ValueError):
                    remote.send(("close", None))
            deadline = time.monotonic() + _CLOSE_GRACE_S
            for process, remote in zip(self.processes, self.remotes):
                while process.is_alive() and time.monotonic() < deadline:
                    # Drain a reply the worker may be blocked sending (a step left pending).
                    try:
                        while remote.poll():
                            remote.recv()
                    except (OSError, EOFError, ValueError):
                        pass
                    process.join(0.02)
        for process in self.processes:
            if process.is_alive():
                process.terminate()
                process.join(1.0)
            if process.is_alive():
                process.kill()
                process.join(1.0)
        for remote in self.remotes:
            remote.close()
        for process in self.processes:
            try:
                process.close()
            except ValueError:  # still running after kill: leave it to the OS
                pass
        if self.ring is not None:
            self.ring.close()
            self.ring = None


class ShmVecEnv(VecEnv):
    """A drop-in replacement for SB3's ``SubprocVecEnv`` that moves observations through shared memory.

    Workers step a contiguous group of envs each and write observations (every array leaf of
    Box/Discrete/MultiDiscrete/MultiBinary/Dict/Tuple spaces), rewards, terminated/truncated flags
    and terminal observations into a shared-memory ring; only small control messages and non-empty
    info dicts cross the pipes. It returns exactly what ``DummyVecEnv`` returns for the same seeds and
    actions: observations in the space's dtype, float32 rewards, bool dones, fresh info dicts with
    ``TimeLimit.truncated`` and ``terminal_observation``.

    :param env_fns: callables that each create one env (``gymnasium.Env``); lambdas and closures are
        fine (they are sent with cloudpickle).
    :param start_method: ``"fork"``, ``"forkserver"`` or ``"spawn"``; default (None) as SubprocVecEnv:
        forkserver where available, else spawn.
    :param n_workers: number of worker processes (default: ``min(n_envs, usable CPUs)``). Envs are
        split into contiguous groups, one per worker; the split may be uneven.
    :param copy: True (default): the observation arrays returned by ``reset``/``step`` are yours;
        shmvec never writes to them while anything references them, as SB3's algorithms require.
        They are lent from the ring without copying when a slot is free (a slot is reused only once
        no array or view of it is referenced any more) and copied out otherwise. False: read-only
        views into the ring that stay valid for ``n_slots - 1`` further ``step``/``reset`` calls (1
        by default, what SB3's PPO/A2C/DQN/SAC collectors need); keep them longer and they change
        under you. Rewards, dones and infos are always fresh.
    :param n_slots: ring slots (default None: 3 with ``copy=True`` — the caller holds one batch, one
        is being written, one stays free so the next batch can be lent — and 2 with ``copy=False``).
        Each slot holds one batch of observations.
    :param worker_threads: BLAS/OpenMP/torch/OpenCV threads per worker (default 1; None leaves the
        libraries' defaults). Many workers each running a full-size thread pool on few cores is
        several times slower.
    :param timeout: seconds to wait for a worker's answer before raising :class:`EnvTimeoutError`
        (default None: wait as long as the worker lives; a dead worker is noticed at once either way).
    :param reward_dtype: dtype of the returned rewards (default float32, as DummyVecEnv; float64 gives
        the values SubprocVecEnv returns for float rewards).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        start_method: str | None = None,
        *,
        n_workers: int | None = None,
        copy: bool = True,
        n_slots: int | None = None,
        worker_threads: int | None = 1,
        timeout: float | None = None,
        reward_dtype: type | np.dtype = np.float32,
    ) -> None:
        self.closed = True  # until start-up succeeds, close() has nothing of ours to do
        self.waiting = False
        env_fns = list(env_fns)
        n_envs = len(env_fns)
        if n_envs < 1:
            raise ValueError("ShmVecEnv needs at least one env factory")
        if not all(callable(fn) for fn in env_fns):
            raise TypeError("env_fns must be callables that each create an env (e.g. lambda: gym.make(id))")
        if n_workers is None:
            n_workers = min(n_envs, usable_cpus())
        if not 1 <= n_workers <= n_envs:
            raise ValueError(f"n_workers must be between 1 and n_envs={n_envs}, got {n_workers}")
        if n_slots is None:
            n_slots = 3 if copy else 2
        if n_slots < 1:
            raise ValueError(f"n_slots must be >= 1, got {n_slots}")
        if not copy and n_slots < 2:
            raise ValueError("copy=False needs n_slots >= 2: SB3 keeps the previous observation one step")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout}")
        if start_method is None:
            start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        ctx = mp.get_context(start_method)  # ValueError("cannot find context for ...") like SB3

        self.start_method = start_method
        self.n_workers = n_workers
        self.copy = copy
        self.timeout = timeout
        self.reward_dtype = np.dtype(reward_dtype)
        self.worker_envs: list[range] = split_envs(n_envs, n_workers)
        self._res = _Resources()
        self._finalizer = weakref.finalize(self, self._res.release)
        self._slot = 0
        self._n_slots = n_slots
        # Arrays lent to the caller from each slot (copy=True); see _next_slot.
        self._lent: list[list[np.ndarray]] = [[] for _ in range(n_slots)]
        self.copy_fallbacks = 0  # batches copied because no slot could be lent (diagnostic)
        self._command = "start"
        try:
            obs_space, act_space = self._start(ctx, env_fns, worker_threads)
            self._obs_leaves: list[Leaf] = leaves(obs_space)
            self._action_leaf = self._array_action_leaf(act_space)
            self._res.ring = Ring.create(self._obs_leaves, n_envs, n_slots, self._action_leaf)
            self.closed = False
            self._call_all("attach", [self._res.ring.spec] * n_workers)
            super().__init__(n_envs, obs_space, act_space)
            # Like DummyVecEnv: VecVideoRecorder and others read render_fps from the env's metadata.
            self.metadata = self.get_attr("metadata", indices=[0])[0]
        except BaseException:
            self.closed = True
            self._finalizer()
            raise
        ring = self._res.ring
        self._obs_views = [ring.obs(j) for j in range(len(self._obs_leaves))]
        self._final_views = [ring.final(j) for j in range(len(self._obs_leaves))]
        if not copy:
            for view in self._obs_views:
                view.flags.writeable = False

    # ------------------------------------------------------------------ start-up

    def _start(
        self, ctx: Any, env_fns: list[Callable[[], gym.Env]], worker_threads: int | None
    ) -> tuple[spaces.Space, spaces.Space]:
        for w, group in enumerate(self.worker_envs):
            group_fns = [env_fns[i] for i in group]
            fns: bytes | list[Callable[[], gym.Env]] = group_fns
            if self.start_method != "fork":
                fns = _pickle_factories(group_fns, group.start, self.start_method)
            remote, work_remote = ctx.Pipe()
            # The pipe is created right before its own worker so no other worker inherits the
            # child end: a dead worker then shows up as EOF instead of a silent hang.
            process = ctx.Process(
                target=worker_main,
                args=(work_remote, fns, group.start, worker_threads),
                daemon=True,
                name=f"shmvec-worker-{w}",
            )
            with _environ(thread_env(worker_threads)):
                process.start()
            work_remote.close()
            self._res.processes.append(process)
            self._res.remotes.append(remote)

        replies = self._gather(range(self.n_workers), "make_env")
        env_spaces = [s for (_, per_worker) in replies for s in per_worker]
        obs_space, act_space = env_spaces[0]
        for i, (o, a) in enumerate(env_spaces):
            if o != obs_space or a != act_space:
                raise ValueError(
                    f"all envs must have the same spaces: env {i} has observation space {o} and action "
                    f"space {a}, env 0 has {obs_space} and {act_space}"
                )
        return obs_space, act_space

    @staticmethod
    def _array_action_leaf(action_space: spaces.Space) -> Leaf | None:
        if isinstance(action_space, _ARRAY_ACTION_SPACES):
            return leaves(action_space)[0]
        return None

    # ------------------------------------------------------------------ talking to workers

    @property
    def processes(self) -> list[Any]:
        """The worker processes (``multiprocessing.Process``), in worker order."""
        return self._res.processes

    @property
    def remotes(self) -> list[Connection]:
        """The main-process ends of the worker pipes, in worker order."""
        return self._res.remotes

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError("this ShmVecEnv is closed (close() was called, or a worker crashed)")

    def _send(self, worker: int, cmd: str, payload: Any) -> None:
        try:
            self._res.remotes[worker].send((cmd, payload))
        except (BrokenPipeError, ConnectionResetError, EOFError):
            self._raise_crashed(worker, cmd)

    def _call_all(self, cmd: str, payloads: Sequence[Any], workers: Iterable[int] | None = None) -> list[Any]:
        """Send one command to each worker, then wait for all answers; results in worker order."""
        workers = list(range(self.n_workers)) if workers is None else list(workers)
        self._command = cmd
        for w, payload in zip(workers, payloads):
            self._send(w, cmd, payload)
        return self._gather(workers, cmd)

    def _gather(self, workers: Iterable[int], command: str) -> list[Any]:
        """Wait for one reply from each worker, watching for death and the timeout.

        Every worker is waited for even after one reports an error, so the pipes stay in step and the
        VecEnv remains usable; the first error is raised afterwards.
        """
        workers = list(workers)
        remotes, processes = self._res.remotes, self._res.processes
        results: dict[int, Any] = {}
        error: RemoteError | None = None
        pending = {remotes[w]: w for w in workers}
        sentinels = {processes[w].sentinel: w for w in workers}
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while pending:
            wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait([*pending, *(s for s, w in sentinels.items() if remotes[w] in pending)], wait_s)
            if not ready:
                w = next(iter(pending.values()))
                self._raise_timeout(w, command)
            for obj in ready:
                if isinstance(obj, int):  # a sentinel: the process ended
                    w = sentinels[obj]
                    if remotes[w] in pending and not remotes[w].poll():
                        self._raise_crashed(w, command)
                    continue
                if obj not in pending:
                    continue
                w = pending[obj]
                try:
                    ok, payload = obj.recv()
                except (EOFError, OSError):
                    self._raise_crashed(w, command)
                del pending[obj]
                if ok:
                    results[w] = payload
                else:
                    results[w] = None
                    error = error or payload
        if error is not None:
            self._raise_env_error(error, command)
        return [results[w] for w in workers]

    def _raise_env_error(self, err: RemoteError, command: str) -> None:
        where = f"env {err.env_index}" if err.env_index is not None else "a worker"
        message = f"{where} raised {err.exc_type.rsplit('.', 1)[-1]} during {err.command}: {err.message}"
        if err.command == "make_env":
            message = f"the factory of {where} raised {err.exc_type.rsplit('.', 1)[-1]}: {err.message}"
        exc = EnvError(
            message,
            env_index=err.env_index,
            command=err.command,
            worker_pid=err.pid,
            exc_type=err.exc_type,
            remote_traceback=err.traceback,
        )
        if command in ("make_env", "attach"):
            self.closed = True
            self._finalizer()
        self.waiting = False
        raise exc from err.original()

    def _raise_crashed(self, w: int, command: str) -> None:
        process = self._res.processes[w]
        process.join(1.0)
        code = process.exitcode
        if code is not None and code < 0:
            try:
                import signal

                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        envs, pid = self.worker_envs[w], process.pid
        message = f"worker {w} (pid {pid}, envs {envs.start}..{envs.stop - 1}) {how} during {command}"
        if command == "make_env" and self.start_method != "fork":
            message += ". " + _MAIN_GUARD_HINT.format(method=self.start_method)
        self.closed = True
        self.waiting = False
        self._finalizer()
        raise WorkerCrashedError(
            message,
            worker_index=w,
            env_indices=list(envs),
            worker_pid=pid,
            exitcode=code,
            command=command,
        )

    def _raise_timeout(self, w: int, command: str) -> None:
        envs = self.worker_envs[w]
        pid = self._res.processes[w].pid
        self.closed = True
        self.waiting = False
        self._finalizer.detach()
        self._res.release(graceful=False)
        assert self.timeout is not None
        raise EnvTimeoutError(
            f"worker {w} (pid {pid}, envs {envs.start}..{envs.stop - 1}) did not answer {command} within "
            f"{self.timeout:g} s; it was killed and the VecEnv closed",
            worker_index=w,
            env_indices=list(envs),
            worker_pid=pid,
            command=command,
            timeout=self.timeout,
        )

    # ------------------------------------------------------------------ VecEnv API

    def _slot_free(self, slot: int) -> bool:
        # References to a lent array: our list, the loop variable, getrefcount's argument. Anything
        # above that is the caller (or a view, tensor or memoryview derived from it) still using it.
        return all(sys.getrefcount(a) <= 3 for a in self._lent[slot])

    def _next_slot(self) -> int:
        """The slot the workers write next: the next one in rotation that nobody still reads."""
        for k in range(1, self._n_slots + 1):
            slot = (self._slot + k) % self._n_slots
            if not self.copy or self._slot_free(slot):
                self._lent[slot] = []
                self._slot = slot
                return slot
        # _read_obs never lends the last free slot, so this cannot happen.
        raise AssertionError("no free ring slot")

    def reset(self) -> VecEnvObs:
        """Reset every env with the seeds/options set by ``seed()``/``set_options()`` (used once)."""
        self._check_open()
        if self.waiting:
            raise RuntimeError("reset() called while a step is pending: call step_wait() first")
        slot = self._next_slot()
        payloads = [
            (slot, [self._seeds[i] for i in group], [self._options[i] for i in group])
            for group in self.worker_envs
        ]
        replies = self._call_all("reset", payloads)
        self.reset_infos = [info for infos in replies for info in infos]
        self._reset_seeds()
        self._reset_options()
        return self._read_obs(slot)

    def step_async(self, actions: np.ndarray) -> None:
        """Send one action per env to the workers. ``actions`` may be reused by the caller afterwards.

        :raises ValueError: if the number of actions is not ``num_envs``.
        """
        self._check_open()
        if self.waiting:
            raise RuntimeError("step_async() called twice without step_wait()")
        n = len(actions)
        if n != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions (one per env), got {n}")
        ring_actions = None if self._res.ring is None else self._res.ring.views.get("actions")
        # The typed buffer only takes actions whose dtype and shape already match, so every env sees
        # exactly the object SubprocVecEnv would give it; anything else goes through the pipe.
        in_ring = (
            ring_actions is not None
            and isinstance(actions, np.ndarray)
            and actions.dtype == ring_actions.dtype
            and actions.shape == ring_actions.shape
        )
        if in_ring:
            assert ring_actions is not None
            np.copyto(ring_actions, actions)
        slot = self._next_slot()
        payloads = [(slot, None if in_ring else actions[g.start : g.stop]) for g in self.worker_envs]
        self._command = "step"
        for w, payload in enumerate(payloads):
            self._send(w, "step", payload)
        self.waiting = True

    def step_wait(self) -> VecEnvStepReturn:
        """Wait for the step sent by :meth:`step_async`; return ``(obs, rewards, dones, infos)``."""
        self._check_open()
        if not self.waiting:
            raise RuntimeError("step_wait() called without step_async()")
        replies = self._gather(range(self.n_workers), "step")
        self.waiting = False
        ring = self._res.ring
        assert ring is not None
        slot = self._slot
        rewards = ring.views["rewards"][slot].astype(self.reward_dtype)
        terminated = ring.views["terminated"][slot]
        truncated = ring.views["truncated"][slot]
        dones = terminated | truncated
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for group, reply in zip(self.worker_envs, replies):
            for i, info, reset_info in reply:
                infos[group.start + i] = info
                if reset_info is not None:
                    self.reset_infos[group.start + i] = reset_info
        time_limit = (truncated & ~terminated).tolist()
        for i, info in enumerate(infos):
            info["TimeLimit.truncated"] = time_limit[i]
        for i in np.flatnonzero(dones):
            infos[i]["terminal_observation"] = unflatten(
                self.observation_space, (view[i].copy() for view in self._final_views)
            )
        return self._read_obs(slot), rewards, dones, infos

    def _read_obs(self, slot: int) -> VecEnvObs:
        arrays: Iterator[np.ndarray] | list[np.ndarray]
        if not self.copy:
            arrays = (view[slot] for view in self._obs_views)
        elif any(self._slot_free(s) for s in range(self._n_slots) if s != slot):
            # Lend the slot itself (no copy) while another stays free for the next write.
            ring = self._res.ring
            assert ring is not None
            arrays = self._lent[slot] = [ring.lend_obs(j, slot) for j in range(len(self._obs_views))]
        else:
            self.copy_fallbacks += 1
            arrays = (view[slot].copy() for view in self._obs_views)
        return unflatten(self.observation_space, iter(arrays))

    def close(self) -> None:
        """Stop the workers and free the shared memory. Idempotent; safe while a step is pending."""
        if self.closed:
            return
        self.closed = True
        self.waiting = False
        self._finalizer()

    def __enter__(self) -> ShmVecEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _by_worker(self, indices: VecEnvIndices) -> list[tuple[int, list[int], list[int]]]:
        """Group env indices by worker: ``(worker, local indices, positions in the request)``."""
        groups: dict[int, tuple[list[int], list[int]]] = {}
        for pos, i in enumerate(self._get_indices(indices)):
            if not -self.num_envs <= i < self.num_envs:
                raise IndexError(f"env index {i} out of range for {self.num_envs} envs")
            i %= self.num_envs
            w = next(w for w, g in enumerate(self.worker_envs) if i in g)
            local, positions = groups.setdefault(w, ([], []))
            local.append(i - self.worker_envs[w].start)
            positions.append(pos)
        return [(w, local, positions) for w, (local, positions) in sorted(groups.items())]

    def _call_envs(self, cmd: str, indices: VecEnvIndices, *args: Any) -> list[Any]:
        self._check_open()
        if self.waiting:
            raise RuntimeError(f"{cmd} called while a step is pending: call step_wait() first")
        plan = self._by_worker(indices)
        replies = self._call_all(cmd, [(local, *args) for _, local, _ in plan], [w for w, _, _ in plan])
        out: list[Any] = [None] * sum(len(p) for _, _, p in plan)
        for (_, _, positions), values in zip(plan, replies):
            if values is None:
                continue
            for pos, value in zip(positions, values):
                out[pos] = value
        return out

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Return ``env.get_wrapper_attr(attr_name)`` of the selected envs (default: all)."""
        return self._call_envs("get_attr", indices, attr_name)

    def has_attr(self, attr_name: str) -> bool:
        """True if every env has ``attr_name`` (searched through its wrappers)."""
        return all(self._call_envs("has_attr", None, attr_name))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """``setattr(env, attr_name, value)`` on the outermost wrapper of the selected envs."""
        self._call_envs("set_attr", indices, attr_name, value)

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        """Call ``env.get_wrapper_attr(method_name)(*method_args, **method_kwargs)`` on the selected envs."""
        return self._call_envs("env_method", indices, method_name, method_args, method_kwargs)

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """Whether each selected env is wrapped (at any depth) in ``wrapper_class``."""
        return self._call_envs("is_wrapped", indices, wrapper_class)

    def get_images(self) -> Sequence[np.ndarray | None]:
        """``env.render()`` of every env when ``render_mode == "rgb_array"``, else warns and returns Nones."""
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to "
                "obtain images.",
                stacklevel=2,
            )
            return [None] * self.num_envs
        self._check_open()
        return [
            img
            for images in self._call_all("render", [list(range(len(g))) for g in self.worker_envs])
            for img in images
        ]


def _pickle_factories(fns: list[Callable[[], gym.Env]], first: int, method: str) -> bytes:
    """Cloudpickle a worker's factories now, so an unpicklable one fails here with a useful message."""
    try:
        return cloudpickle.dumps(fns)
    except Exception:
        for i, fn in enumerate(fns):
            try:
                cloudpickle.dumps(fn)
            except Exception as fn_exc:
                exc = fn_exc
                first += i
                break
        raise TypeError(
            f"the factory of env {first} cannot be pickled, which the '{method}' start method needs "
            f"({type(exc).__name__}: {exc}). Make it a module-level function or a functools.partial of "
            "picklable arguments, or use start_method='fork'."
        ) from exc


@contextmanager
def _environ(values: dict[str, str]) -> Any:
    """Set environment variables for the duration of a worker start (spawn children read them)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


__all__ = ["ShmVecEnv", "ShmVecEnvError"]
