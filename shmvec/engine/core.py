"""The engine: envs in worker processes, observations in a shared-memory ring, no SB3 anywhere.

A face (:class:`shmvec.ShmVecEnv` for SB3, :class:`shmvec.ShmVectorEnv` for Gymnasium) turns what
the engine returns into its library's conventions. The engine starts the workers, lays out the
ring, sends commands and reads batches; what goes wrong is raised as the errors of
:mod:`shmvec.errors` (raise mode) or handed to the restart supervisor (restart mode).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shmvec._start_methods import exit_if_reimported_main
from shmvec.engine.autoworkers import resolve_auto
from shmvec.engine.batch import StepBatch
from shmvec.engine.groups import by_worker, split_envs, usable_cpus
from shmvec.engine.options import Options, context, pool_class
from shmvec.engine.outcomes import recovering, settle
from shmvec.engine.reader import Reader
from shmvec.engine.slots import Slots
from shmvec.engine.supervisor import Supervisor
from shmvec.engine.typed_infos import TypedInfos, columns_for
from shmvec.errors import ClosedError, EnvTimeoutError
from shmvec.failures import env_error
from shmvec.layout import Leaf, array_action_leaf, leaves
from shmvec.openmp import PolicyThreads
from shmvec.protocol import Command
from shmvec.restart import Fault
from shmvec.ring import Ring
from shmvec.transports.local import WorkerPool


class Engine:
    """Steps ``len(env_fns)`` envs in ``n_workers`` processes; see :class:`shmvec.ShmVecEnv` for the
    parameters (they mean the same here).

    :param env_fns: callables that each create one env.
    :param start_method: multiprocessing start method (default: forkserver where available).
    :param options: see :class:`~shmvec.engine.options.Options` (default: all defaults).
    :param owner: the face's class name, for messages.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        start_method: str | None = None,
        options: Options | None = None,
        owner: str = "ShmVecEnv",
    ) -> None:
        # A worker re-importing a main script without the __main__ guard stops here with one line.
        exit_if_reimported_main()
        self.closed = True  # until start-up succeeds, close() has nothing of ours to do
        self.closed_by_close = False  # close() was called while open (else a failure closed it)
        self._openmp: PolicyThreads | None = None
        self.waiting = False
        self.owner = owner
        env_fns = list(env_fns)
        n_envs = len(env_fns)
        if n_envs < 1:
            raise ValueError(f"{owner} needs at least one env factory")
        if not all(callable(fn) for fn in env_fns):
            raise TypeError("env_fns must be callables that each create an env (e.g. lambda: gym.make(id))")
        opts = resolve_auto(options or Options(), env_fns, start_method).checked(n_envs)
        assert isinstance(opts.n_workers, int) and opts.n_slots is not None
        env_fns = opts.env_fns(env_fns)
        self.start_method, ctx = context(start_method)
        self.options = opts
        self.num_envs = n_envs
        self.restart = opts.on_crash == "restart"
        self.same_step = opts.autoreset == "same_step"
        self.worker_envs: list[range] = split_envs(n_envs, opts.n_workers)
        self.n_workers = opts.n_workers
        self.supervisor = Supervisor(self, opts.budget(), n_envs)
        self.slots = Slots(opts.n_slots, opts.copy)
        self._stepping: list[int] = list(range(self.n_workers))
        self._posted_faults: list[Fault] = []
        # The local WorkerPool, or the Ray transport with the same interface (backend="ray").
        self.pool: WorkerPool = pool_class(opts.backend, opts.ray_options)(
            ctx,
            self.start_method,
            self.worker_envs,
            env_fns,
            opts.worker_threads,
            opts.timeout,
            opts.isolate_rng,
            opts.worker_cpus,
        )
        self.res = self.pool.res
        self._finalizer = weakref.finalize(self, self.res.release)
        self._openmp = PolicyThreads(usable_cpus(), self.res.processes) if opts.pause_openmp else None
        try:
            self.observation_space, self.action_space = self._launch(range(self.n_workers))
            self.obs_leaves: list[Leaf] = leaves(self.observation_space)
            codecs = opts.leaf_codecs(self.obs_leaves)
            action_leaf = array_action_leaf(self.action_space)
            # Ray actors send their infos pickled in the step's one return value anyway: no columns.
            columns = columns_for(opts.info_keys) if opts.backend == "local" else 0
            ring = self.res.ring = Ring.create(
                self.obs_leaves, n_envs, opts.n_slots, action_leaf, codecs, columns
            )
            self.typed_infos = TypedInfos(opts.info_keys, ring)
            self.closed = False
            self._attach_payload = (ring.spec, codecs, opts.verify_every)
            self._attach(range(self.n_workers))
            self.reader = self.res.reader = Reader(
                self.obs_leaves,
                ring,
                codecs,
                self.slots,
                opts.copy,
                opts.tolerance,
                opts.decode_threads_for(codecs),
            )
        except BaseException:
            self.give_up()
            raise
        self.ring = ring

    # ------------------------------------------------------------------ workers up and down

    def _launch(self, workers: Sequence[int]) -> tuple[spaces.Space, spaces.Space]:
        """Start ``workers`` and wait until their envs exist; the spaces they agree on."""
        for w in workers:
            self.pool.start(w)
        outcome = self.pool.started(workers, stop_on_fault=True)
        settle(self, outcome, Command.MAKE_ENV)
        env_spaces = [s for (_, per_worker) in outcome.results for s in per_worker]
        obs_space, act_space = env_spaces[0]
        for i, (o, a) in enumerate(env_spaces):
            if o != obs_space or a != act_space:
                raise ValueError(
                    f"all envs must have the same spaces: env {i} has observation space {o} and action "
                    f"space {a}, env 0 has {obs_space} and {act_space}"
                )
        return obs_space, act_space

    def _attach(self, workers: Sequence[int]) -> None:
        """Map the ring in ``workers`` and send them their options."""
        self.call_workers(Command.ATTACH, [self._attach_payload] * len(workers), workers)
        options = {**self.options.worker_options(), **self.typed_infos.worker_options()}
        if options:
            self.call_workers(Command.CONFIGURE, [options] * len(workers), workers, "attach")

    def relaunch(self, w: int) -> Fault | None:
        """Restart mode: replace worker ``w`` and attach the new one; the fault if that failed."""
        self.pool.replace(w)
        outcome = self.pool.started([w], stop_on_fault=False)
        failure = outcome.faults or [self.env_fault(w, e) for w, e in outcome.errors.items()]
        if not failure:
            self._attach([w])
            self.reader.restart(self.worker_envs[w])
        return failure[0] if failure else None

    def give_up(self, graceful: bool = True) -> None:
        """The one teardown path: stop the workers, free the ring, mark closed. Idempotent."""
        self.closed = True
        self.waiting = False
        if self._openmp is not None:
            self._openmp.close()
        if graceful:
            self._finalizer()
        elif self._finalizer.detach() is not None:
            self.res.release(graceful=False)

    def close(self) -> None:
        """The user's ``close()``: :meth:`give_up`, remembered so a later :class:`ClosedError` says so."""
        if not self.closed:
            self.closed_by_close = True
        self.give_up()

    def pause_policy_threads(self, overlapped: bool = False) -> None:
        """Call right before sending steps: the calling thread's idle OpenMP pool (the policy's)
        ends its threads at once when the workers need the cores (``pause_openmp``; else nothing).
        ``overlapped``: pool mode, where these steps run while the policy does (no pause)."""
        if self._openmp is not None:
            self._openmp.before_step(overlapped)

    def steps_received(self) -> None:
        """Call when the replies to the steps sent are in (pool mode: a batch's): what the workers
        needed meanwhile decides later pauses (see :class:`~shmvec.openmp.PolicyThreads`)."""
        if self._openmp is not None:
            self._openmp.after_step()

    def check_open(self) -> None:
        if self.closed:
            raise ClosedError.because(self.owner, self.closed_by_close)

    # ------------------------------------------------------------------ commands

    def env_fault(self, w: int, err: Any) -> Fault:
        """The fault that rebuilds worker ``w`` (restart mode) after its env raised ``err``."""
        error = env_error(err, w, self.worker_envs[w])
        return Fault(w, error.args[0], error)

    def call_workers(
        self,
        cmd: Command,
        payloads: Sequence[Any],
        workers: Sequence[int] | None = None,
        label: str | None = None,
    ) -> list[Any]:
        """Send ``cmd`` to each of ``workers`` (default all) and return their results in that order;
        raise (raise mode) or rebuild (restart mode) for what failed. ``label``: the command's name
        in errors (default: its own)."""
        workers = list(range(self.n_workers)) if workers is None else list(workers)
        label = label or cmd.value
        outcome = self.pool.call(cmd, payloads, workers, label, stop_on_fault=not recovering(self, cmd))
        settle(self, outcome, cmd)
        return outcome.results

    def call(self, cmd: Command, indices: Sequence[int], *args: Any) -> list[Any]:
        """Run an env command (``get_attr``, ``env_method``...) on envs ``indices``; one result each.

        :param args: the payload after the local indices, e.g. ``(name,)`` or ``(name, value)``.
        """
        self.check_open()
        if self.waiting:
            raise RuntimeError(f"{cmd.value} called while a step is pending: call step_wait() first")
        plan = by_worker(indices, self.worker_envs)
        label = cmd.label((None, *args))
        replies = self.call_workers(
            cmd, [(local, *args) for _, (local, _) in plan], [w for w, _ in plan], label
        )
        out: list[Any] = [None] * len(indices)
        for (_, (_, positions)), values in zip(plan, replies):
            for pos, value in zip(positions, values or ()):
                out[pos] = value
        return out

    # ------------------------------------------------------------------ reset and step

    def reset(
        self,
        seeds: Sequence[int | None],
        kwargs: Sequence[dict[str, Any]],
        mask: Sequence[bool] | np.ndarray | None = None,
    ) -> tuple[list[np.ndarray], list[dict[str, Any] | None]]:
        """Reset the envs (all, or those where ``mask`` is True) with one seed each and the keyword
        arguments of ``kwargs`` (``{"options": ...}`` or ``{}``: the face's convention); the
        observation leaves of the batch (envs not reset keep their last observation) and the reset
        infos (None for envs not reset)."""
        self.check_open()
        if self.waiting:
            raise RuntimeError("reset() called while a step is pending: call step_wait() first")
        slot = self.slots.advance()
        if self.restart or mask is not None:
            self.reader.keep_previous()
        groups = self.worker_envs
        payloads = [
            (
                slot,
                list(seeds[g.start : g.stop]),
                list(kwargs[g.start : g.stop]),
                None if mask is None else list(mask[g.start : g.stop]),
            )
            for g in groups
        ]
        self.supervisor.note_seeds(seeds)
        replies, faults = self.reset_workers(list(range(self.n_workers)), payloads)
        if faults:
            replies = [*replies]
            for w, infos in self.supervisor.retry_reset(faults, payloads).items():
                replies[w] = infos
        self.supervisor.needs_reset.clear()
        only = None if mask is None else np.flatnonzero(mask)
        arrays, _ = self.reader.read(slot, (), is_step=False, only=only)
        return arrays, [info for infos in replies for info in infos]

    def step_async(self, actions: Any) -> None:
        """Send one action per env. ``actions`` may be reused by the caller afterwards.

        :raises ValueError: if the number of actions is not ``num_envs``.
        """
        self.check_open()
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
        in_ring = self.ring.takes_actions(actions)  # n == num_envs was checked above
        if in_ring:
            np.copyto(self.ring.actions, actions)  # type: ignore[arg-type]
        slot = self.slots.advance()
        if self.restart:
            self.reader.keep_previous()
        # Restart mode: a worker rebuilt since the last step has fresh envs that are not reset yet;
        # step_wait resets them instead of stepping them.
        needs_reset = self.supervisor.needs_reset
        stepping = [w for w in range(self.n_workers) if w not in needs_reset]
        self.pause_policy_threads()
        groups = self.worker_envs
        payloads = [(slot, None if in_ring else actions[groups[w].start : groups[w].stop]) for w in stepping]
        faults = self.pool.post(Command.STEP, payloads, stepping, "step", stop_on_fault=not self.restart)
        if faults and not self.restart:
            self.give_up(graceful=not isinstance(faults[0].error, EnvTimeoutError))
            raise faults[0].error
        # Restart mode: step_wait rebuilds the workers that could not take the step.
        self._posted_faults = faults
        failed = {f.worker for f in faults}
        self._stepping = [w for w in stepping if w not in failed]
        self.waiting = True

    def step_wait(self) -> StepBatch:
        """Wait for the step sent by :meth:`step_async` and read its batch."""
        self.check_open()
        if not self.waiting:
            raise RuntimeError("step_wait() called without step_async()")
        slot = self.slots.current
        outcome = self.pool.gather(self._stepping, "step", stop_on_fault=not self.restart)
        self.steps_received()
        outcome.faults = sorted(outcome.faults + self._posted_faults, key=lambda f: f.worker)
        faults = settle(self, outcome, Command.STEP)
        self.waiting = False
        infos: dict[int, dict[str, Any]] = {}
        reset_infos: dict[int, dict[str, Any]] = {}
        replied: list[range] = []
        for w, reply in zip(self._stepping, outcome.results):
            first = self.worker_envs[w].start
            if reply is not None:
                replied.append(self.worker_envs[w])
            for i, info, reset_info in reply or ():
                if info:
                    infos[first + i] = info
                if reset_info is not None:
                    reset_infos[first + i] = reset_info
        schema = self.typed_infos.read(slot, replied, infos)
        if schema:
            # Learned from this step's infos: once for every worker. A worker that cannot take it
            # keeps sending whole infos, and its death shows at the next step as usual.
            self.pool.call(Command.CONFIGURE, [schema] * self.n_workers, range(self.n_workers), "step", False)
        rewards, terminated, truncated = (
            self.ring.rewards[slot],
            self.ring.terminated[slot],
            self.ring.truncated[slot],
        )
        restarted: dict[int, list[np.ndarray]] = {}
        carried: list[int] = []
        if faults or self.supervisor.needs_reset:
            self.supervisor.rebuild(faults)
            restarted, restart_infos = self.supervisor.end_episodes(slot, self.same_step)
            for i, (info, reset_info) in restart_infos.items():
                infos[i] = info
                if reset_info is not None:
                    reset_infos[i] = reset_info
            if not self.same_step:
                carried = sorted(restart_infos)
        # Only same-step autoreset writes terminal observations (encoded ones must all be decoded, in
        # order, to keep the codec streams in step).
        ended = terminated | truncated
        # Most steps end no episode: ndarray.any() costs a fraction of flatnonzero's Python layers.
        done = ended.nonzero()[0].tolist() if self.same_step and ended.any() else []
        if restarted:
            done = [i for i in done if i not in restarted]
        only = None if not carried else np.setdiff1d(np.arange(self.num_envs), carried)
        arrays, finals = self.reader.read(slot, done, only=only)
        finals.update(restarted)
        return StepBatch(arrays, rewards, terminated, truncated, infos, reset_infos, finals)

    def resync(self) -> None:
        """After a failed step, with codecs: some envs encoded a frame that was never decoded, so
        every env starts over from a key frame (instead of every later step failing as "frame lost")."""
        self.pool.call(
            Command.CONFIGURE, [{"key_frames": True}] * self.n_workers, range(self.n_workers), "step", True
        )
        self.reader.restart(range(self.num_envs))

    def render_all(self) -> list[Any]:
        """``env.render()`` of every env, in env order."""
        self.check_open()
        payloads = [list(range(len(g))) for g in self.worker_envs]
        return [img for images in self.call_workers(Command.RENDER, payloads) for img in images]

    def arm(self, workers: list[int], seeds: list[list[int | None]]) -> list[Fault]:
        """Have the envs of ``workers`` reset (with ``seeds``) in place of their next step; the faults
        of workers that failed to take it."""
        payloads = [{"reset_seeds": s} for s in seeds]
        outcome = self.pool.call(Command.CONFIGURE, payloads, workers, "step", stop_on_fault=False)
        errors = [self.env_fault(w, e) for w, e in outcome.errors.items()]
        return sorted(outcome.faults + errors, key=lambda f: f.worker)

    def reset_workers(self, workers: list[int], payloads: list[Any]) -> tuple[list[Any], list[Fault]]:
        """Send ``reset`` to ``workers``; their reset infos and (restart mode) the faults to rebuild."""
        outcome = self.pool.call(Command.RESET, payloads, workers, "reset", not self.restart)
        return outcome.results, settle(self, outcome, Command.RESET)

    @property
    def n_restarts(self) -> int:
        """Worker restarts so far (restart mode)."""
        return self.supervisor.budget.total


__all__ = ["Engine", "Options", "StepBatch"]
