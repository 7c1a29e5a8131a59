"""ShmVecEnv: SB3's VecEnv interface over a shared-memory ring and a few worker processes."""

from __future__ import annotations

import functools
import logging
import math
import multiprocessing as mp
import os
import pickle
import select
import signal
import sys
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

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

from shmvec.codecs import Codec, CodecSpec
from shmvec.codecs.channel import Decoder
from shmvec.errors import (
    ClosedError,
    EnvError,
    EnvTimeoutError,
    ShmVecEnvError,
    WorkerCrashedError,
)
from shmvec.frame_stack import ChannelsOrder, stacked_factory
from shmvec.layout import Leaf, leaves, unflatten
from shmvec.openmp import OpenMPPauser
from shmvec.protocol import RemoteError
from shmvec.restart import (
    ON_CRASH_MODES,
    REASON_KEY,
    RESTARTED_KEY,
    Fault,
    RestartBudget,
    restart_seed,
)
from shmvec.ring import Ring
from shmvec.worker import thread_env, worker_main

if TYPE_CHECKING:
    from shmvec.fidelity import Tolerance

_ARRAY_ACTION_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
# How long close() lets a worker finish its current command and exit before terminating it (s).
_CLOSE_GRACE_S = 5.0
# Starting a worker (imports, env factories) may take longer than a step: the start-up wait is at
# least this long even with a short ``timeout`` (s). A dead worker is still noticed at once.
_STARTUP_TIMEOUT_S = 60.0
# Commands after which restart mode rebuilds a worker whose env raised (its envs may be mid-step).
_RESTART_ON_ENV_ERROR = ("step", "reset")

logger = logging.getLogger("shmvec")

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
        self.decoder: Decoder | None = None
        # Per worker: an fd of the file its faulthandler writes to (unlinked once the worker runs).
        self.fault_logs: list[tuple[int, str]] = []

    def close_fault_log(self, w: int) -> None:
        fd, path = self.fault_logs[w]
        with suppress(OSError):
            os.unlink(path)
        with suppress(OSError):
            os.close(fd)

    def release(self, graceful: bool = True) -> None:
        if self.decoder is not None:
            self.decoder.close()
            self.decoder = None
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
        for w in range(len(self.fault_logs)):
            self.close_fault_log(w)
        self.fault_logs = []
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
    :param codec: compress observations in the workers and decode them here (default None: raw arrays,
        no extra work). A registry name (``"delta"``, ``"lz4"``, ``"zstd"``, ``"png"``...), a
        :class:`shmvec.codecs.Codec` (``shmvec.codecs.get("zstd", level=3)``), or a mapping from Dict
        keys (nested keys joined by ``.``) to either, other keys staying raw. A lossy codec needs
        ``tolerance``. See README, "Codecs", for when this is faster and when it is not.
    :param verify_every: with a codec, every this many frames of each env (default 100) the worker
        sends a crc32 of the raw observation (lossy codecs: the raw observation itself) and the
        decoded one is checked against it: :class:`shmvec.CodecMismatchError` names env, step and key.
        1 checks every frame (debug mode); 0 never.
    :param tolerance: a :class:`shmvec.fidelity.Tolerance` (minimum PSNR and/or maximum absolute
        error, raise or warn) that a lossy codec's sampled frames must meet. Without one, a lossy codec
        is refused (ValueError).
    :param decode_threads: threads decoding a batch in parallel (default None: as many as usable CPUs
        when every codec releases the GIL, else 1).
    :param on_crash: ``"raise"`` (default): a dead or hung worker raises :class:`WorkerCrashedError` /
        :class:`EnvTimeoutError` and closes the VecEnv; an env exception raises :class:`EnvError`.
        ``"restart"``: a worker that dies, hangs past ``timeout``, or whose env raises during
        ``step``/``reset`` is killed and rebuilt from its factories; its envs end their episode in that
        step with ``done=True``, ``info["TimeLimit.truncated"] = True``,
        ``info["shmvec.restarted"] = True``, ``info["shmvec.restart_reason"]`` (a sentence) and their
        last observation as ``terminal_observation``; the batch holds the rebuilt envs' reset
        observations. Other envs are unaffected. Needs ``n_slots >= 2``. See :mod:`shmvec.restart`
        for the seeds of rebuilt envs.
    :param max_restarts: restart mode: worker restarts allowed within ``restart_window`` (default 10);
        one more raises the error that caused it and closes the VecEnv.
    :param restart_window: restart mode: length in seconds of the sliding window ``max_restarts``
        applies to (default 60.0; None: the VecEnv's whole life).
    :param check_finite: if True, workers refuse observations (and terminal observations) with NaN
        in a float Box leaf, or +/-inf in one whose bounds are all finite: an :class:`EnvError` caused by
        :class:`ObservationError` naming env and key (in restart mode the worker is restarted). Off by
        default: it reads every float observation once more per step.
    :param pause_openmp: after sending each step, end the idle OpenMP threads of the calling thread
        (PyTorch's intra-op pool on Linux) so that their spin-wait does not take a core the workers
        need; the policy's next forward pass starts them again. Default True; see
        :mod:`shmvec.openmp` for the measurements.
    :param frame_stack: stack this many consecutive observations of each env in its worker, giving
        exactly what ``VecFrameStack(venv, frame_stack)`` gives (observations, observation space and
        ``terminal_observation``) without the main process's per-step stacking work. Default None: no
        stacking. Box and Dict-of-Box spaces; see :mod:`shmvec.frame_stack`.
    :param frame_stack_channels_order: as ``VecFrameStack``'s ``channels_order``: ``"first"``,
        ``"last"``, None (default: channels first only for images whose smallest dimension is the
        first), or a mapping from Dict key to one of those.
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
        codec: CodecSpec = None,
        verify_every: int = 100,
        tolerance: Tolerance | None = None,
        decode_threads: int | None = None,
        on_crash: str = "raise",
        max_restarts: int = 10,
        restart_window: float | None = 60.0,
        check_finite: bool = False,
        pause_openmp: bool = True,
        frame_stack: int | None = None,
        frame_stack_channels_order: ChannelsOrder = None,
    ) -> None:
        self.closed = True  # until start-up succeeds, close() has nothing of ours to do
        self.waiting = False
        env_fns = list(env_fns)
        n_envs = len(env_fns)
        if n_envs < 1:
            raise ValueError("ShmVecEnv needs at least one env factory")
        if not all(callable(fn) for fn in env_fns):
            raise TypeError("env_fns must be callables that each create an env (e.g. lambda: gym.make(id))")
        if frame_stack is not None:
            if isinstance(frame_stack, bool) or not isinstance(frame_stack, int) or frame_stack < 1:
                raise ValueError(f"frame_stack must be a whole number >= 1 or None, got {frame_stack!r}")
            # Each worker builds its envs already stacked: the main process does no stacking work.
            env_fns = [
                functools.partial(stacked_factory, fn, frame_stack, frame_stack_channels_order)
                for fn in env_fns
            ]
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
        if verify_every < 0:
            raise ValueError(f"verify_every must be >= 0 (0: never verify), got {verify_every}")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout}")
        if on_crash not in ON_CRASH_MODES:
            raise ValueError(f"on_crash must be one of {ON_CRASH_MODES}, got {on_crash!r}")
        if on_crash == "restart" and n_slots < 2:
            raise ValueError(
                "on_crash='restart' needs n_slots >= 2: the last observation of a crashed env is read "
                "from the previous slot"
            )
        if codec is not None and (on_crash == "restart" or check_finite):
            # Both read raw observations from the ring slots, which hold encoded bytes with a codec.
            raise ValueError("on_crash='restart' and check_finite=True do not work with a codec yet")
        budget = RestartBudget(max_restarts, restart_window)
        if start_method is None:
            start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        ctx = mp.get_context(start_method)  # ValueError("cannot find context for ...") like SB3

        self.start_method = start_method
        self.n_workers = n_workers
        self.copy = copy
        self.timeout = timeout
        self.reward_dtype = np.dtype(reward_dtype)
        self.on_crash = on_crash
        self.check_finite = check_finite
        self._openmp = OpenMPPauser() if pause_openmp else None
        self.worker_envs: list[range] = split_envs(n_envs, n_workers)
        self._ctx: Any = ctx
        self._worker_threads = worker_threads
        self._worker_fns: list[bytes | list[Callable[[], gym.Env]]] = []
        # Restart mode: budget, workers rebuilt but not yet reset (-> reason), per-env restart counts
        # and the last seed each env was reset with (for reproducible seeds of rebuilt envs).
        self._budget = budget
        self._needs_reset: dict[int, str] = {}
        self._faults: list[Fault] = []
        self._restart_counts = [0] * n_envs
        self._last_seeds: list[int | None] = [None] * n_envs
        self._stepping: list[int] = list(range(n_workers))
        # Where the last batch the caller saw lives: a slot, or (rarely) a copy; see _note_previous_slot.
        self._prev_slot = 0
        self._prev_copy: list[np.ndarray] | None = None
        self._res = _Resources()
        self._finalizer = weakref.finalize(self, self._res.release)
        self._slot = 0
        self._n_slots = n_slots
        # Arrays lent to the caller from each slot (copy=True); see _next_slot.
        self._lent: list[list[np.ndarray]] = [[] for _ in range(n_slots)]
        self.copy_fallbacks = 0  # batches copied because no slot could be lent (diagnostic)
        try:
            obs_space, act_space = self._start(ctx, env_fns, worker_threads)
            self._obs_leaves: list[Leaf] = leaves(obs_space)
            self._action_leaf = self._array_action_leaf(act_space)
            codecs = self._leaf_codecs(codec, tolerance)
            self._res.ring = Ring.create(self._obs_leaves, n_envs, n_slots, self._action_leaf, codecs)
            self.closed = False
            self._attach_payload = (self._res.ring.spec, codecs, verify_every)
            self._call_all("attach", [self._attach_payload] * n_workers)
            self._configure(range(n_workers))
            if codecs is not None:
                if decode_threads is None:
                    gil_free = all(c is None or c.releases_gil for c in codecs)
                    decode_threads = usable_cpus() if gil_free else 1
                self._res.decoder = Decoder(
                    codecs, self._obs_leaves, self._res.ring, n_envs, n_slots, copy, tolerance, decode_threads
                )
            super().__init__(n_envs, obs_space, act_space)
            # Like DummyVecEnv: VecVideoRecorder and others read render_fps from the env's metadata.
            self.metadata = self.get_attr("metadata", indices=[0])[0]
        except BaseException:
            self.closed = True
            self._finalizer()
            raise
        ring = self._res.ring
        self._decoder = self._res.decoder
        if self._decoder is not None:
            return
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
            # Kept in the main process: restart mode rebuilds a worker from them.
            self._worker_fns.append(fns)
            self._start_worker(w)

        replies = self._gather(range(self.n_workers), "make_env")
        self._unlink_fault_logs(range(self.n_workers))
        env_spaces = [s for (_, per_worker) in replies for s in per_worker]
        obs_space, act_space = env_spaces[0]
        for i, (o, a) in enumerate(env_spaces):
            if o != obs_space or a != act_space:
                raise ValueError(
                    f"all envs must have the same spaces: env {i} has observation space {o} and action "
                    f"space {a}, env 0 has {obs_space} and {act_space}"
                )
        return obs_space, act_space

    def _leaf_codecs(self, codec: CodecSpec, tolerance: Tolerance | None) -> tuple[Codec | None, ...] | None:
        """The codec of each observation leaf, or None when nothing is encoded (the default path)."""
        if codec is None:
            return None
        from shmvec.codecs import per_leaf
        from shmvec.codecs.channel import check_lossy

        names = [leaf.name for leaf in self._obs_leaves]
        codecs = per_leaf(codec, names, [(leaf.shape, leaf.dtype) for leaf in self._obs_leaves])
        check_lossy(codecs, names, tolerance)
        return None if all(c is None for c in codecs) else tuple(codecs)

    def _start_worker(self, w: int) -> None:
        """Start worker ``w`` (new, or in place of a dead one) with its factories."""
        fault_log = tempfile.mkstemp(prefix=f"shmvec-worker-{w}-", suffix=".fault")
        if w < len(self._res.fault_logs):
            self._res.close_fault_log(w)
            self._res.fault_logs[w] = fault_log
        else:
            self._res.fault_logs.append(fault_log)
        remote, work_remote = self._ctx.Pipe()
        # The pipe is created right before its own worker so no other worker inherits the
        # child end: a dead worker then shows up as EOF instead of a silent hang.
        process = self._ctx.Process(
            target=worker_main,
            args=(
                work_remote,
                self._worker_fns[w],
                self.worker_envs[w].start,
                self._worker_threads,
                fault_log[1],
            ),
            daemon=True,
            name=f"shmvec-worker-{w}",
        )
        with _environ(thread_env(self._worker_threads)):
            process.start()
        work_remote.close()
        if w < len(self._res.processes):
            self._res.processes[w], self._res.remotes[w] = process, remote
        else:
            self._res.processes.append(process)
            self._res.remotes.append(remote)

    def _configure(self, workers: Iterable[int]) -> None:
        """Send the per-worker options (only ``check_finite`` so far) once a worker is attached."""
        workers = list(workers)
        if self.check_finite:
            self._call_all("configure", [{"check_finite": True}] * len(workers), workers, "attach")

    def _unlink_fault_logs(self, workers: Iterable[int]) -> None:
        """The workers have opened their fault logs: remove the names, so nothing is left in the temp
        directory whatever happens; the main process reads them through its own fds."""
        for w in workers:
            with suppress(OSError):
                os.unlink(self._res.fault_logs[w][1])

    def _fault_text(self, w: int) -> str:
        try:
            return os.pread(self._res.fault_logs[w][0], 1 << 16, 0).decode(errors="replace")
        except (OSError, IndexError):
            return ""

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
        self._send_as(worker, cmd, payload, cmd)

    def _send_as(self, worker: int, cmd: str, payload: Any, label: str) -> None:
        try:
            # Plain pickle + send_bytes: Connection.send builds a ForkingPickler per message, which
            # costs more than the rest of sending a step command.
            self._res.remotes[worker].send_bytes(pickle.dumps((cmd, payload), pickle.HIGHEST_PROTOCOL))
        except (BrokenPipeError, ConnectionResetError, EOFError):
            if not self._recovering(label):
                self._raise_crashed(worker, label)
            # Restart mode: the wait that follows sees the dead worker and rebuilds it.

    def _recovering(self, command: str) -> bool:
        return self.on_crash == "restart" and command not in ("make_env", "attach") and not self.closed

    def _call_all(
        self,
        cmd: str,
        payloads: Sequence[Any],
        workers: Iterable[int] | None = None,
        label: str | None = None,
    ) -> list[Any]:
        """Send one command to each worker, then wait for all answers; results in worker order.

        ``label`` names the command in errors (e.g. ``"env_method:render"``; default ``cmd``).
        """
        workers = list(range(self.n_workers)) if workers is None else list(workers)
        label = label or cmd
        for w, payload in zip(workers, payloads):
            self._send_as(w, cmd, payload, label)
        return self._gather(workers, label)

    def _gather(self, workers: Iterable[int], command: str) -> list[Any]:
        """Wait for one reply from each worker, watching for death and the timeout.

        Every worker is waited for even after one reports an error, so the pipes stay in step and the
        VecEnv remains usable; the error of the first such worker is raised afterwards.

        Restart mode: a worker that dies, does not answer within ``timeout`` or (for ``step``/``reset``)
        whose env raises is listed in ``self._faults`` and its result is None. After ``step`` and
        ``reset`` the caller rebuilds those workers; after any other command they are rebuilt here and
        the error is raised (the VecEnv stays open).
        """
        workers = list(workers)
        recover = self._recovering(command)
        remotes, processes = self._res.remotes, self._res.processes
        results: dict[int, Any] = {}
        errors: dict[int, RemoteError] = {}
        faults: dict[int, Fault] = {}
        timeout = self.timeout
        if command == "make_env" and timeout is not None:
            timeout = max(timeout, _STARTUP_TIMEOUT_S)
        deadline = None if timeout is None else time.monotonic() + timeout
        # A bare poll object, not multiprocessing.connection.wait: that builds a selectors object on
        # every call, which was a third of the main process's CPU time per step on Pong.
        poller = select.poll()
        watched: dict[int, tuple[int, bool]] = {}  # fd -> (worker, is its process sentinel)
        for w in workers:
            watched[remotes[w].fileno()] = (w, False)
            watched[processes[w].sentinel] = (w, True)
        for fd in watched:
            poller.register(fd, select.POLLIN)
        pending = set(workers)

        def forget(w: int) -> None:
            pending.discard(w)
            for fd in (remotes[w].fileno(), processes[w].sentinel):
                if watched.pop(fd, None) is not None:
                    poller.unregister(fd)

        def lost(w: int) -> None:
            if not recover:
                self._raise_crashed(w, command)
            error = self._crash_error(w, command)
            faults[w] = Fault(w, error.args[0], error)
            forget(w)

        while pending:
            wait_ms = None if deadline is None else math.ceil(max(0.0, deadline - time.monotonic()) * 1000)
            events = poller.poll(wait_ms)
            if not events:
                hung = sorted(pending)
                if not recover:
                    self._raise_timeout(hung[0], command)
                for w in hung:
                    _kill(processes[w])
                    error = self._timeout_error(w, command, "it was killed and will be restarted")
                    faults[w] = Fault(w, error.args[0], error)
                break
            for fd, _ in events:
                if fd not in watched:
                    continue
                w, is_sentinel = watched[fd]
                if is_sentinel:  # the process ended; a reply it sent first is still read
                    if not remotes[w].poll():
                        lost(w)
                    continue
                try:
                    ok, payload = remotes[w].recv()
                except (EOFError, OSError):
                    lost(w)
                    continue
                forget(w)
                if ok:
                    results[w] = payload
                else:
                    results[w] = None
                    errors[w] = payload
        if recover and command in _RESTART_ON_ENV_ERROR:
            for w, err in errors.items():
                env_error = self._env_error(err)
                faults[w] = Fault(w, env_error.args[0], env_error)
            errors = {}
        self._faults = [faults[w] for w in sorted(faults)]
        if errors:
            self._raise_env_error(errors[min(errors)], command)
        if self._faults and command not in _RESTART_ON_ENV_ERROR:
            first = self._faults[0].error
            self._restart(self._faults)
            self._faults = []
            first.args = (
                f"{first.args[0]}; the worker was restarted: its envs end their episode "
                "(done=True) at the next step",
                *first.args[1:],
            )
            raise first
        return [results.get(w) for w in workers]

    def _env_error(self, err: RemoteError) -> EnvError:
        """The :class:`EnvError` for an exception raised in a worker, the original chained."""
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
        exc.__cause__ = err.original()
        return exc

    def _raise_env_error(self, err: RemoteError, command: str) -> None:
        exc = self._env_error(err)
        if command in ("make_env", "attach"):
            self.closed = True
            self._finalizer()
        self.waiting = False
        raise exc

    def _raise_crashed(self, w: int, command: str) -> None:
        error = self._crash_error(w, command)
        self.closed = True
        self.waiting = False
        self._finalizer()
        raise error

    def _crash_error(self, w: int, command: str) -> WorkerCrashedError:
        """The :class:`WorkerCrashedError` for dead worker ``w`` (waits up to 1 s for its exit code)."""
        process = self._res.processes[w]
        process.join(1.0)
        code = process.exitcode
        if code is not None and code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        envs, pid = self.worker_envs[w], process.pid
        message = f"worker {w} (pid {pid}, envs {envs.start}..{envs.stop - 1}) {how} during {command}"
        fault_text = self._fault_text(w)
        if code is not None and -code in (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE):
            message += " (a crash inside the env or a native library"
            message += "; its Python stack is in remote_traceback)" if fault_text else ")"
        if command == "make_env" and self.start_method != "fork":
            message += ". " + _MAIN_GUARD_HINT.format(method=self.start_method)
        return WorkerCrashedError(
            message,
            worker_index=w,
            env_indices=list(envs),
            worker_pid=pid,
            exitcode=code,
            command=command,
            remote_traceback=fault_text,
        )

    def _raise_timeout(self, w: int, command: str) -> None:
        error = self._timeout_error(w, command, "it was killed and the VecEnv closed")
        self.closed = True
        self.waiting = False
        self._finalizer.detach()
        self._res.release(graceful=False)
        raise error

    def _timeout_error(self, w: int, command: str, outcome: str) -> EnvTimeoutError:
        envs = self.worker_envs[w]
        pid = self._res.processes[w].pid
        assert self.timeout is not None
        return EnvTimeoutError(
            f"worker {w} (pid {pid}, envs {envs.start}..{envs.stop - 1}) did not answer {command} within "
            f"{self.timeout:g} s; {outcome}",
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
                self._note_previous_slot(self._slot, slot)
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
        for i, seed in enumerate(self._seeds):
            if seed is not None:
                self._last_seeds[i] = seed
        replies = self._call_all("reset", payloads)
        if self._faults:
            replies = self._recover_reset(payloads, replies)
        self._needs_reset.clear()
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
        try:
            n = len(actions)
        except TypeError:
            raise TypeError(
                f"actions must be a sequence of {self.num_envs} actions (one per env, e.g. an array of "
                f"shape ({self.num_envs}, ...)), got {type(actions).__name__}"
            ) from None
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
        # Restart mode: a worker rebuilt since the last step has fresh envs that are not reset yet;
        # step_wait resets them instead of stepping them (see _gather_step).
        self._stepping = [w for w in range(self.n_workers) if w not in self._needs_reset]
        if self._openmp is not None:
            # This thread has nothing to compute until the workers answer, and its OpenMP pool would
            # spin on a core they need (see shmvec.openmp). Before sending: the pool's threads are
            # still spinning, so they leave at once, and the workers wake up to free cores.
            self._openmp.pause()
        for w in self._stepping:
            self._send(w, "step", payloads[w])
        self.waiting = True

    def step_wait(self) -> VecEnvStepReturn:
        """Wait for the step sent by :meth:`step_async`; return ``(obs, rewards, dones, infos)``."""
        self._check_open()
        if not self.waiting:
            raise RuntimeError("step_wait() called without step_async()")
        replies = self._gather_step()
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
        if self._decoder is not None:
            arrays, finals = self._decoder.read(slot, np.flatnonzero(dones).tolist(), is_step=True)
            for i, final in finals.items():
                infos[i]["terminal_observation"] = unflatten(self.observation_space, iter(final))
            return unflatten(self.observation_space, iter(arrays)), rewards, dones, infos
        for i in np.flatnonzero(dones):
            infos[i]["terminal_observation"] = unflatten(
                self.observation_space, (view[i].copy() for view in self._final_views)
            )
        return self._read_obs(slot), rewards, dones, infos

    # ------------------------------------------------------------------ restart mode

    def _gather_step(self) -> list[Any]:
        """The step replies of every worker, in worker order.

        Restart mode: workers that failed this step, or were rebuilt since the last one, are rebuilt
        and reset; their envs' rows of the slot get the reset observation, reward 0, truncated, and
        their last observation (from the previous slot) as terminal observation; their replies carry
        the restart info keys.
        """
        replies = self._gather(self._stepping, "step")
        out: list[Any] = [[] for _ in range(self.n_workers)]
        for w, reply in zip(self._stepping, replies):
            out[w] = reply
        if self._faults:
            self._restart(self._faults)
        if self._needs_reset:
            for w, reply in self._reset_rebuilt(self._slot).items():
                out[w] = reply
        return out

    def _restart(self, faults: list[Fault]) -> None:
        """Kill and rebuild each faulty worker, or raise its error when the restart budget is spent."""
        self._faults = []
        for fault in faults:
            if not self._budget.take():
                self.closed = True
                self.waiting = False
                self._finalizer()
                error = fault.error
                error.args = (f"{error.args[0]} ({self._budget.describe()})", *error.args[1:])
                raise error
            w = fault.worker
            stack = getattr(fault.error, "remote_traceback", "")
            logger.warning(
                "shmvec: restarting worker %d (envs %s): %s%s",
                w,
                list(self.worker_envs[w]),
                fault.reason,
                f"\n{stack}" if stack else "",
            )
            _kill(self._res.processes[w])
            self._res.remotes[w].close()
            with suppress(ValueError):
                self._res.processes[w].close()
            self._start_worker(w)
            self._gather([w], "make_env")
            self._unlink_fault_logs([w])
            ring = self._res.ring
            assert ring is not None
            self._send(w, "attach", self._attach_payload)
            self._gather([w], "attach")
            self._configure([w])
            for i in self.worker_envs[w]:
                self._restart_counts[i] += 1
            self._needs_reset[w] = fault.reason

    def _note_previous_slot(self, previous: int, slot: int) -> None:
        """Restart mode: remember where the last batch handed out lives before ``slot`` is written.

        It is the previous slot, which the workers do not write in this step, unless no other slot was
        free (copy=True with the caller holding every other one): then the workers write over it, and
        a copy of it is kept for the terminal observations of envs whose worker fails in this step.
        """
        if self.on_crash != "restart":
            return
        self._prev_slot = previous
        self._prev_copy = None
        if slot == previous:
            self._prev_copy = [view[previous].copy() for view in self._obs_views]

    def _reset_rebuilt(self, slot: int) -> dict[int, list[tuple[int, dict, dict]]]:
        """Reset the rebuilt workers into ``slot`` and end their envs' episodes there (see _gather_step)."""
        ring = self._res.ring
        assert ring is not None
        last = self._prev_copy or [view[self._prev_slot] for view in self._obs_views]
        out: dict[int, list[tuple[int, dict, dict]]] = {}
        while self._needs_reset:
            workers = sorted(self._needs_reset)
            for w in workers:
                g = self.worker_envs[w]
                # The last observation the agent saw is intact in the previous slot (n_slots >= 2):
                # the failed worker may have half-written this slot, never that one.
                for final, obs in zip(self._final_views, last):
                    final[g.start : g.stop] = obs[g.start : g.stop]
            payloads = [
                (
                    slot,
                    [restart_seed(self._last_seeds[i], self._restart_counts[i]) for i in self.worker_envs[w]],
                    [None] * len(self.worker_envs[w]),
                )
                for w in workers
            ]
            replies = self._call_all("reset", payloads, workers)
            failed = {f.worker for f in self._faults}
            for w, reset_infos in zip(workers, replies):
                if w in failed:
                    continue
                reason = self._needs_reset.pop(w)
                g = self.worker_envs[w]
                ring.views["rewards"][slot, g.start : g.stop] = 0.0
                ring.views["terminated"][slot, g.start : g.stop] = False
                ring.views["truncated"][slot, g.start : g.stop] = True
                restarted = {RESTARTED_KEY: True, REASON_KEY: reason}
                out[w] = [(k, dict(restarted), {**info, **restarted}) for k, info in enumerate(reset_infos)]
            if self._faults:
                self._restart(self._faults)
        return out

    def _recover_reset(self, payloads: list[Any], replies: list[Any]) -> list[Any]:
        """Restart mode, after a failed ``reset()``: rebuild the failed workers and reset them again with
        the same seeds (or, for unseeded envs, :func:`shmvec.restart.restart_seed`)."""
        replies = list(replies)
        while self._faults:
            faults = self._faults
            self._restart(faults)
            workers = [f.worker for f in faults]
            retry = []
            for w in workers:
                slot, seeds, options = payloads[w]
                seeds = [
                    s if s is not None else restart_seed(self._last_seeds[i], self._restart_counts[i])
                    for i, s in zip(self.worker_envs[w], seeds)
                ]
                retry.append((slot, seeds, options))
            reasons = {w: self._needs_reset[w] for w in workers}
            for w, reply in zip(workers, self._call_all("reset", retry, workers)):
                if reply is not None and w not in {f.worker for f in self._faults}:
                    replies[w] = [{**info, RESTARTED_KEY: True, REASON_KEY: reasons[w]} for info in reply]
                    self._needs_reset.pop(w, None)
        return replies

    @property
    def n_restarts(self) -> int:
        """Worker restarts so far (restart mode)."""
        return self._budget.total

    def _read_obs(self, slot: int) -> VecEnvObs:
        if self._decoder is not None:
            return unflatten(self.observation_space, iter(self._decoder.read(slot, (), is_step=False)[0]))
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
        label = f"{cmd}:{args[0]}" if cmd in ("get_attr", "has_attr", "set_attr", "env_method") else cmd
        replies = self._call_all(
            cmd, [(local, *args) for _, local, _ in plan], [w for w, _, _ in plan], label
        )
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


def _kill(process: Any) -> None:
    """SIGKILL a worker and reap it (a hung or broken env gets no chance to clean up: its envs are
    rebuilt anyway, and the shared memory belongs to the main process)."""
    if process.is_alive():
        process.kill()
    process.join(5.0)


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
