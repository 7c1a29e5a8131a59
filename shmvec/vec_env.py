"""ShmVecEnv: SB3's VecEnv interface on the shmvec engine (:mod:`shmvec.engine`).

The engine steps the envs and hands back batches; this face turns them into SB3's conventions:
``dones``, ``TimeLimit.truncated``, ``terminal_observation``, ``reset_infos``, seeds and options
used once, rewards in ``reward_dtype``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from shmvec.engine.build import build
from shmvec.engine.core import Engine
from shmvec.engine.handle import EngineHandle
from shmvec.engine.options import Options
from shmvec.errors import ShmVecEnvError
from shmvec.memory.layout import assemble, terminal_obs
from shmvec.wire import messages as m

if TYPE_CHECKING:
    from stable_baselines3.common.vec_env.base_vec_env import (
        VecEnv,
        VecEnvIndices,
        VecEnvObs,
        VecEnvStepReturn,
    )
else:
    try:
        from stable_baselines3.common.vec_env.base_vec_env import VecEnv
    except ImportError as exc:  # SB3 is an extra: `import shmvec` and ShmVectorEnv work without it

        class VecEnv:
            """Stands in for SB3's ``VecEnv`` where SB3 (or the torch it needs) does not import:
            building a :class:`ShmVecEnv` then fails at once, in one line that says what to install."""

            _why = f"{type(exc).__name__}: {exc}"

            def __new__(cls, *args: Any, **kwargs: Any) -> Any:
                raise ModuleNotFoundError(
                    f"ShmVecEnv needs Stable-Baselines3: pip install 'shmvec[sb3]' ({cls._why}); "
                    "ShmVectorEnv, the Gymnasium face, needs neither SB3 nor torch"
                )


class ShmVecEnv(EngineHandle, VecEnv):
    """A drop-in replacement for SB3's ``SubprocVecEnv`` that moves observations through shared memory.

    Workers step a contiguous group of envs each and write observations (every array leaf of
    Box/Discrete/MultiDiscrete/MultiBinary/Dict/Tuple spaces), rewards, terminated/truncated flags
    and terminal observations into a shared-memory ring; only small control messages and non-empty
    info dicts cross the pipes. It returns exactly what ``DummyVecEnv`` returns for the same seeds and
    actions: observations in the space's dtype, float32 rewards, bool dones, fresh info dicts with
    ``TimeLimit.truncated`` and ``terminal_observation``. A leaf without a fixed size (Text, Sequence,
    Graph, OneOf, a custom space; at any Dict key or Tuple index) travels pickled in the worker's
    reply and comes back as a 1-d numpy object array of the envs' values (DummyVecEnv cannot hold
    such spaces; SubprocVecEnv's ``np.stack`` fails on most of them).

    :param env_fns: callables that each create one env (``gymnasium.Env``); lambdas and closures are
        fine (they are sent with cloudpickle).
    :param start_method: ``"fork"``, ``"forkserver"`` or ``"spawn"``; default (None) as SubprocVecEnv:
        forkserver where available, else spawn.
    :param reward_dtype: dtype of the returned rewards (default float32, as DummyVecEnv; float64 gives
        the values SubprocVecEnv returns for float rewards).
    :param options: keyword options shared with :class:`shmvec.ShmVectorEnv`, each documented once
        in :class:`shmvec.engine.options.Options`: workers (``n_workers``, ``worker_threads``,
        ``timeout`` in seconds, ``worker_cpus``, ``worker_spin_us`` in µs, ``pause_openmp``), memory
        (``copy``, ``n_slots``), envs (``check_finite``, ``isolate_rng``, ``frame_stack``,
        ``frame_stack_channels_order``, ``info_keys``), codecs (``codec``, ``verify_every``,
        ``tolerance``, ``decode_threads``), restart mode (``on_crash``, ``max_restarts``,
        ``restart_window`` in seconds) and backend (``backend``, ``ray_options``). With
        ``on_crash="restart"`` a rebuilt env's step gives ``done=True``,
        ``info["TimeLimit.truncated"] = True`` and its last observation as ``terminal_observation``.
        An unknown name raises ``TypeError``.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        start_method: str | None = None,
        *,
        reward_dtype: type | np.dtype = np.float32,
        **options: Any,
    ) -> None:
        self._engine: Engine | None = None
        self._engine = engine = build(env_fns, start_method, Options.from_kwargs("ShmVecEnv", options))
        self.start_method = engine.start_method
        self.worker_envs = engine.worker_envs
        opts = engine.options
        self.copy, self.timeout, self.on_crash, self.check_finite = (
            opts.copy,
            opts.timeout,
            opts.on_crash,
            opts.check_finite,
        )
        self.reward_dtype = np.dtype(reward_dtype)
        self._device = engine.device  # device=: observations as torch tensors (shmvec.device)
        try:
            super().__init__(engine.num_envs, engine.observation_space, engine.action_space)
            # Like DummyVecEnv: VecVideoRecorder and others read render_fps from the env's metadata.
            self.metadata = self.get_attr("metadata", indices=[0])[0]
        except BaseException:
            engine.close()
            raise

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called or a failure closed the VecEnv."""
        return self._engine is None or self._engine.closed

    @property
    def waiting(self) -> bool:
        """True between :meth:`step_async` and :meth:`step_wait`."""
        return self._engine is not None and self._engine.waiting

    @property
    def remotes(self) -> list[Connection]:
        """The main-process ends of the worker pipes, in worker order (empty with Ray)."""
        return list(getattr(getattr(self._eng.transport, "res", None), "remotes", []))

    @property
    def copy_fallbacks(self) -> int:
        """Batches copied because no slot could be lent (diagnostic)."""
        return self._eng.slots.copy_fallbacks

    @property
    def _eng(self) -> Engine:
        assert self._engine is not None
        return self._engine

    def _obs(self, arrays: list[np.ndarray]) -> VecEnvObs:
        if self._device is not None:
            arrays = self._device.obs(arrays)
        return assemble(self.observation_space, arrays)

    def reset(self) -> VecEnvObs:
        """Reset every env with the seeds/options set by ``seed()``/``set_options()`` (used once)."""
        # DummyVecEnv's rule: an env's reset gets options only when they were set (and not empty).
        kwargs = [{"options": options} if options else {} for options in self._options]
        arrays, infos = self._eng.reset(self._seeds, kwargs)
        self.reset_infos = infos  # type: ignore[assignment]  # every env was reset: no None
        self._reset_seeds()
        self._reset_options()
        return self._obs(arrays)

    def step_async(self, actions: np.ndarray) -> None:
        """Send one action per env to the workers. ``actions`` may be reused by the caller afterwards.

        :raises ValueError: if the number of actions is not ``num_envs``.
        """
        self._eng.send(actions)

    def step_wait(self) -> VecEnvStepReturn:
        """Wait for the step sent by :meth:`step_async`; return ``(obs, rewards, dones, infos)``."""
        engine = self._eng
        engine.check_open()
        if not engine.waiting:
            raise RuntimeError("step_wait() called without step_async()")
        batch = engine.recv()
        terminated, truncated = batch.terminated, batch.truncated
        dones = terminated | truncated
        time_limit = (truncated & ~terminated).tolist()
        infos: list[dict[str, Any]] = [{"TimeLimit.truncated": t} for t in time_limit]
        for i, info in batch.infos.items():  # the env's own keys first, as DummyVecEnv has them
            info["TimeLimit.truncated"] = time_limit[i]
            infos[i] = info
        convert = None if self._device is None else self._device.final
        for i, final in batch.finals.items():
            reset_info = batch.reset_infos.get(i)
            infos[i]["terminal_observation"] = terminal_obs(
                self.observation_space, final, reset_info, convert
            )
        for i, reset_info in batch.reset_infos.items():
            self.reset_infos[i] = reset_info
        rewards = batch.rewards.astype(self.reward_dtype)
        if self._device is not None:
            rewards, dones = self._device.fields(rewards, dones)
        return self._obs(batch.obs), rewards, dones, infos

    def close(self) -> None:
        """Stop the workers and free the shared memory. Idempotent; safe while a step is pending."""
        if self._engine is not None:
            self._engine.close()

    def __enter__(self) -> ShmVecEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, command: Callable[[list[int]], m.Command], indices: VecEnvIndices) -> list[Any]:
        return self._eng.call(command, list(self._get_indices(indices)))

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Return ``env.get_wrapper_attr(attr_name)`` of the selected envs (default: all)."""
        return self._call(lambda local: m.GetAttr(local, attr_name), indices)

    def has_attr(self, attr_name: str) -> bool:
        """True if every env has ``attr_name`` (searched through its wrappers)."""
        return all(self._call(lambda local: m.HasAttr(local, attr_name), None))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """``setattr(env, attr_name, value)`` on the outermost wrapper of the selected envs."""
        self._call(lambda local: m.SetAttr(local, attr_name, value), indices)

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        """Call ``env.get_wrapper_attr(method_name)(*method_args, **method_kwargs)`` on the selected envs."""
        return self._call(lambda local: m.EnvMethod(local, method_name, method_args, method_kwargs), indices)

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """Whether each selected env is wrapped (at any depth) in ``wrapper_class``."""
        return self._call(lambda local: m.IsWrapped(local, wrapper_class), indices)

    def get_images(self) -> Sequence[np.ndarray | None]:
        """``env.render()`` of every env when ``render_mode == "rgb_array"``, else warns and returns Nones."""
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to "
                "obtain images.",
                stacklevel=2,
            )
            return [None] * self.num_envs
        return self._eng.call(m.Render, range(self.num_envs))


__all__ = ["ShmVecEnv", "ShmVecEnvError"]
