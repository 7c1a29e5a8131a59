"""ShmVecEnv: SB3's VecEnv interface on the shmvec engine (:mod:`shmvec.engine`).

The engine steps the envs and hands back batches; this face turns them into SB3's conventions:
``dones``, ``TimeLimit.truncated``, ``terminal_observation``, ``reset_infos``, seeds and options
used once, rewards in ``reward_dtype``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from shmvec.codecs import CodecSpec
from shmvec.engine.core import Engine
from shmvec.engine.options import Options
from shmvec.errors import ShmVecEnvError
from shmvec.frame_stack import ChannelsOrder
from shmvec.layout import assemble
from shmvec.protocol import Command

if TYPE_CHECKING:
    from shmvec.fidelity import Tolerance


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
        split into contiguous groups, one per worker; the split may be uneven. ``"auto"``: chosen
        from a short probe of one env in a throwaway worker (about 0.3 s, before the real workers
        start): envs that mostly wait get more workers, up to one per env; envs that compute get
        one per usable CPU. See :mod:`shmvec.engine.autoworkers`; the chosen count is ``n_workers``.
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
        ``tolerance``. See the docs guide "Codecs and fidelity" for when this pays.
    :param verify_every: with a codec, every this many frames of each env (default 100) the worker
        sends a crc32 of the raw observation (lossy codecs: the raw observation itself) and the
        decoded one is checked against it: :class:`shmvec.CodecMismatchError` names env, step and key.
        1 checks every frame (debug mode); 0 never.
    :param tolerance: a :class:`shmvec.fidelity.Tolerance` (minimum PSNR and/or maximum absolute
        error, raise or warn) that a lossy codec's sampled frames must meet. Without one, a lossy codec
        is refused (ValueError).
    :param decode_threads: threads decoding a batch in parallel (default None: as many as usable CPUs
        when every codec releases the GIL and there are more than 2, else 1).
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
    :param isolate_rng: if True, each env gets its own process-global RNG state (``np.random.*``,
        ``random.*``), swapped in around every call into it, so an env that draws from them gets the
        same numbers whatever ``n_workers`` is (under fork: the numbers SubprocVecEnv gives it). Off
        by default: the swap costs about 0.2 ms of CPU per env and step (measured next to ALE Pong,
        whose step took 0.7 ms: +30%). Envs that use their own ``self.np_random`` need none of this.
    :param pause_openmp: before sending each step, end the idle OpenMP threads of the calling thread
        (PyTorch's intra-op pool on Linux) so that their spin-wait does not take a core the workers
        need; they are started again as soon as the step's replies are in. Only while the workers
        need the cores: the time they ran or waited to run over recent steps is measured, and an env
        that mostly waits (I/O, sleeps) leaves the threads alone, since starting them again after
        idle cores costs several ms. Pool mode (``ShmVectorEnv(batch_size=...)``)
        never pauses before steps that run while the policy does. Default True; see
        :mod:`shmvec.openmp` for the measurements.
    :param frame_stack: stack this many consecutive observations of each env in its worker, giving
        exactly what ``VecFrameStack(venv, frame_stack)`` gives (observations, observation space and
        ``terminal_observation``) without the main process's per-step stacking work. Default None: no
        stacking. Box and Dict-of-Box spaces; see :mod:`shmvec.frame_stack`.
    :param frame_stack_channels_order: as ``VecFrameStack``'s ``channels_order``: ``"first"``,
        ``"last"``, None (default: channels first only for images whose smallest dimension is the
        first), or a mapping from Dict key to one of those.
    :param info_keys: which info values travel as typed columns of the shared-memory ring instead of
        being pickled through the pipe; the info dicts you get are the same either way (keys, order,
        Python or numpy types, values). ``"auto"`` (default): learned from the first step, the leading
        keys whose values are ``int``, ``float``, ``bool`` or numpy scalars in every env's info (ALE's
        ``lives``, ``episode_frame_number``, ``frame_number``). A mapping such as
        ``{"lives": int, "frame_number": np.int32}`` declares them instead (keys in the order the env
        puts them in its info; at most 8). None: every info through the pipe. An info that does not
        match (a key missing or of another type) goes whole through the pipe for that step: never an
        error, never lost. See :mod:`shmvec.infos`.
    :param backend: ``"local"`` (default): worker processes on this machine, observations in shared
        memory. ``"ray"``: each worker is a Ray actor, on any node of a Ray cluster (the running Ray
        connection, else a local Ray started here and shut down on ``close()``); observations
        travel encoded by ``codec`` (default None here means the lossless ``delta`` codec for
        leaves of 1 KiB or more; ``codec="raw"`` sends them as they are). ``pip install
        "shmvec[ray]"``; see the docs guide "Workers on a Ray cluster".
    :param ray_options: ``backend="ray"`` only: options of every actor, as for
        ``ray.remote(...).options(...)``: ``num_cpus``, ``resources``, ``scheduling_strategy``
        (``"SPREAD"``, a placement group strategy...), ``runtime_env``. Default None: Ray's defaults.
    :param worker_cpus: pin each worker process to one CPU, so the OS stops moving it between
        cores. None (default): the OS places the workers. ``"auto"``: worker ``w`` runs on the
        ``w``-th CPU this process may use (dealt out again from the first when there are more
        workers than CPUs). A sequence of CPU ids is dealt out the same way: give runs that share a
        machine disjoint sets, or they pile onto the same cores. Linux only; not with
        ``backend="ray"``. The main process is not pinned. See the docs guide "The policy in the
        loop" for what it measured.
    :param worker_spin_us: how long, in µs, each worker keeps polling its pipe for the next command
        before it sleeps, while its recent waits were shorter than that (with a policy in the loop
        the waits are longer, and the workers sleep at once). On a virtual machine a sleeping
        worker's CPU is handed back to the host, and the next step pays for it: Pong at 8 envs ran
        7% faster with 1000 (median of 4 rounds). None (default): 1000 when every worker has a CPU
        of its own (``n_workers`` <= usable CPUs), else 0. 0: always sleep. Local workers only. See
        :mod:`shmvec.waiting`.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        start_method: str | None = None,
        *,
        n_workers: int | str | None = None,
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
        isolate_rng: bool = False,
        pause_openmp: bool = True,
        frame_stack: int | None = None,
        frame_stack_channels_order: ChannelsOrder = None,
        info_keys: str | Mapping[str, type] | None = "auto",
        backend: str = "local",
        ray_options: Mapping[str, Any] | None = None,
        worker_cpus: str | Sequence[int] | None = None,
        worker_spin_us: int | None = None,
    ) -> None:
        self._engine: Engine | None = None
        options = Options.pick(locals())
        self._engine = Engine(env_fns, start_method, options)
        engine = self._engine
        self.start_method = engine.start_method
        self.n_workers = engine.n_workers
        self.worker_envs = engine.worker_envs
        self.copy, self.timeout, self.on_crash, self.check_finite = copy, timeout, on_crash, check_finite
        self.reward_dtype = np.dtype(reward_dtype)
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
    def processes(self) -> list[Any]:
        """The worker processes (``multiprocessing.Process``), in worker order."""
        return self._eng.res.processes

    @property
    def remotes(self) -> list[Connection]:
        """The main-process ends of the worker pipes, in worker order."""
        return self._eng.res.remotes

    @property
    def actors(self) -> list[Any]:
        """``backend="ray"``: the Ray actor handles, one per worker, in worker order (else empty)."""
        return list(getattr(self._eng.pool, "actors", []))

    @property
    def n_restarts(self) -> int:
        """Worker restarts so far (restart mode)."""
        return self._eng.n_restarts

    @property
    def copy_fallbacks(self) -> int:
        """Batches copied because no slot could be lent (diagnostic)."""
        return self._eng.slots.copy_fallbacks

    @property
    def _eng(self) -> Engine:
        assert self._engine is not None
        return self._engine

    def _obs(self, arrays: list[np.ndarray]) -> VecEnvObs:
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
        self._eng.step_async(actions)

    def step_wait(self) -> VecEnvStepReturn:
        """Wait for the step sent by :meth:`step_async`; return ``(obs, rewards, dones, infos)``."""
        batch = self._eng.step_wait()
        terminated, truncated = batch.terminated, batch.truncated
        dones = terminated | truncated
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for i, info in batch.infos.items():
            infos[i] = info
        for i, reset_info in batch.reset_infos.items():
            self.reset_infos[i] = reset_info
        time_limit = (truncated & ~terminated).tolist()
        for i, info in enumerate(infos):
            info["TimeLimit.truncated"] = time_limit[i]
        for i, final in batch.finals.items():
            infos[i]["terminal_observation"] = self._obs(final)
        return self._obs(batch.obs), batch.rewards.astype(self.reward_dtype), dones, infos

    def close(self) -> None:
        """Stop the workers and free the shared memory. Idempotent; safe while a step is pending."""
        if self._engine is not None:
            self._engine.close()

    def __enter__(self) -> ShmVecEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, cmd: Command, indices: VecEnvIndices, *args: Any) -> list[Any]:
        engine = self._eng
        engine.check_open()
        return engine.call(cmd, list(self._get_indices(indices)), *args)

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Return ``env.get_wrapper_attr(attr_name)`` of the selected envs (default: all)."""
        return self._call(Command.GET_ATTR, indices, attr_name)

    def has_attr(self, attr_name: str) -> bool:
        """True if every env has ``attr_name`` (searched through its wrappers)."""
        return all(self._call(Command.HAS_ATTR, None, attr_name))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """``setattr(env, attr_name, value)`` on the outermost wrapper of the selected envs."""
        self._call(Command.SET_ATTR, indices, attr_name, value)

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        """Call ``env.get_wrapper_attr(method_name)(*method_args, **method_kwargs)`` on the selected envs."""
        return self._call(Command.ENV_METHOD, indices, method_name, method_args, method_kwargs)

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """Whether each selected env is wrapped (at any depth) in ``wrapper_class``."""
        return self._call(Command.IS_WRAPPED, indices, wrapper_class)

    def get_images(self) -> Sequence[np.ndarray | None]:
        """``env.render()`` of every env when ``render_mode == "rgb_array"``, else warns and returns Nones."""
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to "
                "obtain images.",
                stacklevel=2,
            )
            return [None] * self.num_envs
        return self._eng.render_all()


__all__ = ["ShmVecEnv", "ShmVecEnvError"]
