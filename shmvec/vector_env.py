"""ShmVectorEnv: Gymnasium's ``VectorEnv`` interface on the shmvec engine (:mod:`shmvec.engine`).

Returns what ``gymnasium.vector.SyncVectorEnv`` returns for the same seeds and actions: batched
observations in the space's dtype, float64 rewards, bool terminations and truncations, infos as a
dict of arrays with ``_key`` masks, and (same-step autoreset) ``final_obs`` / ``final_info`` laid out
as ``AsyncVectorEnv`` lays them out, with the true terminal values even for envs that reuse and
mutate their observation and info objects (the worker copies them before it resets the env).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import batch_space

from shmvec.engine.build import build
from shmvec.engine.core import Engine
from shmvec.engine.flights import FIRST_READY, POOL_ORDERS, pool_workers
from shmvec.engine.groups import usable_cpus
from shmvec.engine.handle import EngineHandle
from shmvec.engine.options import Options
from shmvec.errors import NoPendingCallError
from shmvec.memory.layout import assemble, terminal_obs

try:
    from gymnasium.vector import AutoresetMode
except ImportError:  # Gymnasium 1.0 names no modes (its vector envs reset on the next step)
    from enum import Enum

    class AutoresetMode(Enum):  # type: ignore[no-redef]
        """Gymnasium 1.1's ``gymnasium.vector.AutoresetMode``, for Gymnasium 1.0."""

        NEXT_STEP = "NextStep"
        SAME_STEP = "SameStep"
        DISABLED = "Disabled"


from shmvec.vector.calls import CallMethods
from shmvec.vector.pool import PoolMethods, batch_infos
from shmvec.wire import messages as m

_MODES = {
    "next_step": AutoresetMode.NEXT_STEP,
    "same_step": AutoresetMode.SAME_STEP,
    "disabled": AutoresetMode.DISABLED,
}
_ENGINE_MODES = {mode: name for name, mode in _MODES.items()}


def to_autoreset_mode(mode: str | AutoresetMode) -> AutoresetMode:
    """The :class:`gymnasium.vector.AutoresetMode` for an enum member, its value (``"NextStep"``) or
    one of ``"next_step"``, ``"same_step"``, ``"disabled"``.

    :raises ValueError: for anything else.
    """
    if isinstance(mode, AutoresetMode):
        return mode
    if isinstance(mode, str) and mode.lower() in _MODES:
        return _MODES[mode.lower()]
    try:
        return AutoresetMode(mode)
    except ValueError:
        raise ValueError(
            f"autoreset_mode must be an AutoresetMode or one of {sorted(_MODES)}, got {mode!r}"
        ) from None


class ShmVectorEnv(EngineHandle, CallMethods, PoolMethods, VectorEnv):
    """A ``gymnasium.vector.VectorEnv`` whose envs run in a few worker processes and hand their
    observations over in shared memory.

    :param env_fns: callables that each create one env (``gymnasium.Env``); lambdas and closures are
        fine (they are sent with cloudpickle).
    :param autoreset_mode: how an env whose episode ended is reset (default ``NEXT_STEP``): an
        ``AutoresetMode`` or ``"next_step"``, ``"same_step"``, ``"disabled"``; see
        https://farama.org/Vector-Autoreset-Mode. Stored in ``metadata["autoreset_mode"]``.
    :param batch_size: envs per :meth:`recv` (pool mode, ``1 <= batch_size <= num_envs``); default
        None: ``num_envs``. Below ``num_envs``, :meth:`step` is refused: use :meth:`async_reset`,
        :meth:`send` and :meth:`recv`; autoreset must be ``NEXT_STEP``; each worker steps a group of
        ``num_envs / n_workers`` envs and a batch is made of whole groups, so ``n_workers`` must
        split ``num_envs`` into equal groups whose size divides ``batch_size`` (None: the smallest
        such count >= the usable CPUs).
    :param pool_order: which groups :meth:`recv` returns: ``"first_ready"`` (default: the first
        done, as EnvPool; a slow env holds back only its own group) or ``"deterministic"`` (a fixed
        round-robin of groups: the same batches in every run).

    :param start_method: as for :class:`shmvec.ShmVecEnv`.
    :param options: keyword options shared with :class:`shmvec.ShmVecEnv`, each documented once in
        :class:`shmvec.engine.options.Options` (``n_workers``, ``copy``, ``codec``, ``on_crash``,
        ``backend``...), with the same defaults. ``n_workers="auto"`` chooses the count from a short
        probe of one env (see :mod:`shmvec.engine.autoworkers`); the chosen count is
        :attr:`n_workers`.

    ``frame_stack=K`` stacks each env's last K observations in its worker, by SB3's ``VecFrameStack``
    rules (stack axis, zeros at the start of every episode): the results equal ``SyncVectorEnv`` over
    the same envs each wrapped in :class:`shmvec.worker.frame_stack.FrameStack`, in every autoreset mode;
    ``final_obs`` (``SAME_STEP``) is the stack that ends with the terminal observation.

    Pool mode's ``async_reset`` / ``send`` / ``recv`` come from :class:`~shmvec.vector.pool.PoolMethods`,
    the env calls (``call``, ``get_attr``, ``set_attr``, ``render``...) from
    :class:`~shmvec.vector.calls.CallMethods`.

    In restart mode a rebuilt env ends its episode with ``truncations[i] = True`` and the
    info keys ``shmvec.restarted`` / ``shmvec.restart_reason``; its observation in that step is the last one
    the agent saw (``NEXT_STEP``, ``DISABLED``) or its new episode's first (``SAME_STEP``, the last
    one in ``final_obs``).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        batch_size: int | None = None,
        pool_order: str = FIRST_READY,
        start_method: str | None = None,
        **options: Any,
    ) -> None:
        mode = to_autoreset_mode(autoreset_mode)
        self._engine: Engine | None = None
        env_fns = list(env_fns)
        n_envs = len(env_fns)
        if pool_order not in POOL_ORDERS:
            raise ValueError(f"pool_order must be one of {POOL_ORDERS}, got {pool_order!r}")
        self.pool_order = pool_order
        self.batch_size = n_envs if batch_size is None else batch_size
        opts = Options.from_kwargs("ShmVectorEnv", options, autoreset=_ENGINE_MODES[mode])
        if batch_size is not None:
            pool_workers(n_envs, batch_size, opts.n_workers, usable_cpus())  # checks the sizes
            if batch_size < n_envs and mode is not AutoresetMode.NEXT_STEP:
                raise ValueError(
                    f"pool mode (batch_size < num_envs) needs autoreset_mode NEXT_STEP, got {mode}"
                )
        self._engine = engine = build(
            env_fns, start_method, opts, "ShmVectorEnv", self.batch_size, pool_order, info_form="arrays"
        )
        self.autoreset_mode = mode
        self.copy = opts.copy
        self.num_envs = engine.num_envs
        self.single_observation_space = engine.observation_space
        self.single_action_space = engine.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._device = engine.device  # device=: observations as torch tensors (shmvec.device)
        objects = engine.reader.objects
        self._object_leaves = frozenset(() if objects is None else objects.index)
        self._batched_action_spaces = {self.num_envs: self.action_space}
        try:
            metadata, self.render_mode = (self._call_first(name) for name in ("metadata", "render_mode"))
        except BaseException:
            engine.close()
            raise
        # A copy: the env's (class-level) metadata is not ours to change.
        self.metadata = {**metadata, "autoreset_mode": mode}

    def _call_first(self, name: str) -> Any:
        return self._eng.call(lambda local: m.EnvMethod(local, name, value_if_attribute=True), [0])[0]

    @property
    def closed(self) -> bool:  # type: ignore[override]
        """True once :meth:`close` was called or a failure closed the env."""
        return self._engine is None or self._engine.closed

    @property
    def np_random_seed(self) -> tuple[int, ...]:  # type: ignore[override]
        """Each env's ``np_random_seed``, in env order: a tuple, as SyncVectorEnv and AsyncVectorEnv
        return it (``get_attr("np_random_seed")``)."""
        return self.get_attr("np_random_seed")

    @property  # type: ignore[misc]  # read-only, as SyncVectorEnv's
    def np_random(self) -> tuple[np.random.Generator, ...]:  # type: ignore[override]
        """Copies of each env's ``np_random`` generator, in env order, as AsyncVectorEnv returns them
        (drawing from a copy leaves the env's own generator as it was)."""
        return self.get_attr("np_random")

    @property
    def _eng(self) -> Engine:
        assert self._engine is not None
        return self._engine

    def _obs(self, arrays: list[Any]) -> Any:
        if self._device is not None:
            arrays = self._device.obs(arrays)
        if self._object_leaves:
            # As gymnasium.vector.utils.concatenate batches a space without a fixed size: a tuple.
            arrays = [tuple(a) if j in self._object_leaves else a for j, a in enumerate(arrays)]
        return assemble(self.single_observation_space, arrays)

    def _final_obs(self, leaves: list[Any], reset_info: dict[str, Any] | None) -> Any:
        convert = None if self._device is None else self._device.final
        return terminal_obs(self.single_observation_space, leaves, reset_info, convert)

    def _fields(self, *arrays: np.ndarray) -> tuple[Any, ...]:
        """Rewards, terminations, truncations (fresh arrays), as tensors where ``device_fields`` says."""
        return arrays if self._device is None else self._device.fields(*arrays)

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every env (or those of ``options["reset_mask"]``, a bool array of ``num_envs``).

        :param seed: None (unseeded), an int ``s`` (env ``i`` gets ``s + i``) or one seed per env.
        :param options: passed to every env's ``reset`` (without ``reset_mask``), None included, as
            ``SyncVectorEnv`` passes them.
        :returns: the batched observations (envs not reset keep theirs) and the infos.
        """
        n = self.num_envs
        seeds = self._seeds(seed)
        mask: np.ndarray | None = None
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = _check_mask(options.pop("reset_mask"), n)
        # Steps in flight (send/recv) are waited for and dropped.
        engine = self._eng
        arrays, reset_infos = engine.reset(seeds, [{"options": options}] * n, mask)
        if self.batch_size < n:
            # Every env is now idle; send() with env_ids=None answers all of them. Copies: pool
            # mode moves workers through the ring slots one by one and would overwrite a lent batch.
            engine.flights.last_ids = np.arange(n, dtype=np.int32)
            arrays = [a.copy() for a in arrays] if self.copy else arrays
        infos: dict[str, Any] = {}
        for i, info in enumerate(reset_infos):
            if info:
                infos = self._add_info(infos, info, i)
        return self._obs(arrays), infos

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        """One seed per env: None, ``seed + i`` for an int, or the list given."""
        n = self.num_envs
        if seed is None:
            seeds: list[int | None] = [None] * n
        elif isinstance(seed, int):
            seeds = [seed + i for i in range(n)]
        else:
            seeds = list(seed)
        if len(seeds) != n:
            raise ValueError(
                f"If seeds are passed as a list the length must match num_envs={n} but got "
                f"length={len(seeds)}."
            )
        return seeds

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with its action; SyncVectorEnv's ``(obs, rewards, terminations, truncations,
        infos)``.

        :param actions: a batch of :attr:`action_space`, split per env as SyncVectorEnv splits it:
            ``actions[i]`` for an array space, the ``i``-th element of every leaf for a Tuple or
            Dict space (see :func:`shmvec.vector.pool.per_env_actions`).
        :raises ValueError: if there are not ``num_envs`` actions (before any env steps).
        :raises RuntimeError: in pool mode (``batch_size < num_envs``).
        """
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Send every env its action and return at once (``AsyncVectorEnv``'s first half of
        :meth:`step`); :meth:`step_wait` collects the results.

        :raises RuntimeError: in pool mode (``batch_size < num_envs``), or while a step is pending.
        """
        if self.batch_size < self.num_envs:
            raise RuntimeError(
                f"step() needs every env; with batch_size={self.batch_size} < num_envs={self.num_envs} "
                "use send()/recv() (pool mode)"
            )
        self._refuse_if_pending("step_async")
        self._eng.send(self._engine_actions(actions, self.num_envs))

    def step_wait(
        self, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """The results of the step sent by :meth:`step_async`, as :meth:`step` returns them.

        :param timeout: seconds to wait at most (None: as long as it takes); past it,
            ``multiprocessing.TimeoutError`` is raised, as ``AsyncVectorEnv.step_wait`` raises it,
            but the step stays pending: call ``step_wait`` again to collect it. AsyncVectorEnv
            forgets a step that timed out while its workers still answer it, so that its next
            call can read that step's late replies as its own; here nothing is lost or mixed up.
        :raises NoPendingCallError: if no step is pending (Gymnasium's ``NoAsyncCallError``).
        """
        engine = self._eng
        engine.check_open()
        if engine.pending_call() != "step":
            raise NoPendingCallError.of("step_wait")
        batch = engine.recv(timeout)
        same_step = self.autoreset_mode is AutoresetMode.SAME_STEP
        infos = batch_infos(self, batch, self._final_obs if same_step else None)
        fields = self._fields(batch.rewards.copy(), batch.terminated.copy(), batch.truncated.copy())
        return (self._obs(batch.obs), *fields, infos)

    def reset_async(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Reset every env and return at once (``AsyncVectorEnv``'s first half of :meth:`reset`);
        :meth:`reset_wait` collects the observations. Same arguments as :meth:`reset`, except
        ``options["reset_mask"]`` (use :meth:`reset`)."""
        if options is not None and "reset_mask" in options:
            raise ValueError("reset_async() resets every env: pass options['reset_mask'] to reset() instead")
        self._refuse_if_pending("reset_async")
        self._eng.async_reset(self._seeds(seed), [{"options": options}] * self.num_envs)

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """The observations and infos of the reset sent by :meth:`reset_async`.

        :param timeout: as for :meth:`step_wait`.
        """
        engine = self._eng
        engine.check_open()
        if engine.pending_call() != "reset":
            raise NoPendingCallError.of("reset_wait")
        batch = engine.recv(timeout)
        arrays = batch.obs if self.batch_size == self.num_envs else [a.copy() for a in batch.obs]
        return self._obs(arrays), batch_infos(self, batch)

    def close(self, **kwargs: Any) -> None:
        """Stop the workers and free the shared memory. Idempotent; a step, reset or call still
        pending (``step_async`` without ``step_wait``...) is dropped with a ``UserWarning``, as
        AsyncVectorEnv warns (not for pool mode's steps, where steps in flight are the rule)."""
        if self._engine is not None:
            pending = self._engine.pending_call()
            if pending is not None and (pending == "call" or self.batch_size == self.num_envs):
                warnings.warn(
                    f"Calling `close` while waiting for a pending call to `{pending}` to complete.",
                    stacklevel=2,
                )
            self._engine.close()

    def __repr__(self) -> str:
        return f"ShmVectorEnv(num_envs={self.num_envs}, autoreset_mode={self.autoreset_mode.name})"


def _check_mask(mask: Any, n: int) -> np.ndarray:
    """``options["reset_mask"]`` checked as SyncVectorEnv checks it (same errors)."""
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
    if mask.shape != (n,):
        raise ValueError(f"`options['reset_mask']` must have shape `({n},)`, got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
    if not mask.any():
        raise ValueError(
            "`options['reset_mask']` must contain a boolean array with at least one True value, "
            f"got reset_mask={mask}"
        )
    return mask


__all__ = ["ShmVectorEnv", "to_autoreset_mode"]
