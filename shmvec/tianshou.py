"""Tianshou: :class:`ShmTianshouVectorEnv`, shmvec's engine behind Tianshou's ``BaseVectorEnv``
(``pip install shmvec[tianshou]``; Tianshou 2.0).

Tianshou's ``Collector`` steps envs by id (``step(action, id)``), resets the envs whose episode
ended by id (``reset(env_id)``: Tianshou has no autoreset) and, with ``wait_num`` or ``timeout``,
takes whichever envs are done first (``AsyncCollector``). This face converts those calls into the
engine's (:mod:`shmvec.engine`) and the engine's batches into what ``DummyVectorEnv`` returns:

- ``step``: ``(obs, rew, terminated, truncated, info)`` in the order of ``id``; ``info`` a 1-d object
  array of each env's info dict with ``env_id`` added; observations of a ``Dict`` space a 1-d object
  array of one dict per env, of array spaces one array ``(len(id), *shape)`` in the space's dtype;
  rewards float64 (``DummyVectorEnv`` stacks what the env returned: int64 for integer rewards, the
  same values);
- ``reset(env_id, **kwargs)``: every env named gets ``env.reset(**kwargs)``, ``seed`` included (one
  value for all of them, as Tianshou passes it); ``(obs, info)`` without ``env_id``;
- ``wait_num`` / ``timeout``: each step returns every env that is done once ``wait_num`` are (or,
  past ``timeout`` seconds, every env done then, at least one); steps of the others stay in flight
  and come back in a later ``step`` (``step(None, id=waiting_id)`` only collects them). Resets of
  envs that are not stepping leave the others' steps in flight;
- ``seed(s)``: env ``i``'s action space (the copy :attr:`action_space` returns, fetched once) is
  seeded with ``s + i`` and the env reset with that seed, as ``DummyVectorEnv`` does for Gymnasium
  envs (which have no ``seed`` method); returns ``[[s + i], ...]``;
- ``get_env_attr`` / ``set_env_attr``: ``env.get_wrapper_attr`` / ``env.set_wrapper_attr`` (the
  outermost wrapper that has the attribute: the spaces ``SubprocVectorEnv`` returns, and the inner
  env's own attributes ``DummyVectorEnv`` returns); ``render(**kwargs)``: every env's ``render``.

Envs may differ in their spaces where the shared memory does not see it (bounds, ``Discrete(n)``),
as Tianshou allows; their shapes and dtypes must agree. Workers: as many as CPUs by default, each
stepping a group of envs, and a ``step`` of some envs steps only those (``collect(n_episode=...)``
steps fewer envs as episodes end). Asynchronous collection (``wait_num``/``timeout``) and
``on_crash="restart"`` take whole groups only, so they get one env per worker by default, as
Tianshou's own subprocess envs have. Only this module imports Tianshou (and, through it, torch);
nothing else in shmvec imports it, and the workers import neither.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from tianshou.env import BaseVectorEnv

from shmvec.engine.batch import Batch
from shmvec.engine.build import build
from shmvec.engine.core import Engine
from shmvec.engine.handle import EngineHandle
from shmvec.engine.options import Options
from shmvec.errors import ClosedError
from shmvec.memory.layout import ARRAY_SPACES, unflatten
from shmvec.wire import messages as m

#: Options that Tianshou's loop cannot use here, and why.
_REFUSED = {
    "device": "Tianshou's Collector takes numpy arrays (its policies move them to the device)",
    "device_fields": "Tianshou's Collector takes numpy arrays",
    "pin_memory": "Tianshou's Collector takes numpy arrays",
}

Ids = int | list[int] | np.ndarray | None


class ShmTianshouVectorEnv(EngineHandle, BaseVectorEnv):
    """A Tianshou vector env (``BaseVectorEnv``) whose envs run in shmvec's workers and hand their
    observations over in shared memory; a drop-in for ``ShmemVectorEnv`` and ``SubprocVectorEnv``.

    :param env_fns: callables that each create one Gymnasium env (lambdas are fine: they are sent with
        cloudpickle).
    :param wait_num: Tianshou's: return from ``step`` once this many envs are done (``1 <= wait_num
        <= env_num``; default None: all of them, a synchronous step).
    :param timeout: Tianshou's: seconds a ``step`` waits for ``wait_num`` envs before it returns the
        envs done by then (at least one); default None: no limit.
    :param start_method: ``"fork"``, ``"forkserver"`` or ``"spawn"``; default (None) as Tianshou's
        ``SubprocVectorEnv``: multiprocessing's default (fork on Linux before Python 3.14).
    :param options: the engine's options (:class:`shmvec.engine.options.Options`: ``n_workers``
        (default here: as many as CPUs, at most one per env; one per env with ``wait_num``,
        ``timeout`` or ``on_crash="restart"``), ``codec``, ``frame_stack``, ``on_crash``...), except
        ``device``, ``device_fields``, ``pin_memory`` and ``copy=False`` (the observations returned
        are the caller's: Tianshou's Collector keeps them across steps). ``timeout`` being
        Tianshou's here, the engine's (seconds a worker may take to answer) is ``worker_timeout``.
    :raises ValueError: for a ``wait_num`` or ``timeout`` out of range, or a refused option.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        wait_num: int | None = None,
        timeout: float | None = None,
        *,
        start_method: str | None = None,
        **options: Any,
    ) -> None:
        self._engine: Engine | None = None
        env_fns = list(env_fns)
        n = len(env_fns)
        self.env_num = n
        self.wait_num = wait_num or n
        if not 1 <= self.wait_num <= max(n, 1):
            raise ValueError(f"wait_num should be in [1, {n}], but got {wait_num}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout is {timeout}, it should be positive if provided!")
        self.timeout = timeout
        self.is_async = self.wait_num != n or timeout is not None
        for name, why in _REFUSED.items():
            if options.get(name) is not None:
                raise ValueError(f"ShmTianshouVectorEnv does not take {name}=: {why}")
        if options.get("copy", True) is False:
            raise ValueError(
                "ShmTianshouVectorEnv does not take copy=False: Tianshou's Collector keeps observations "
                "across steps, and read-only views of the ring would change under it"
            )
        if "worker_timeout" in options:
            options["timeout"] = options.pop("worker_timeout")
        if self.is_async or options.get("on_crash") == "restart":
            # Each of these takes whole worker groups only: one env per worker takes any envs.
            options.setdefault("n_workers", n or None)
        opts = Options.from_kwargs("ShmTianshouVectorEnv", options, autoreset="disabled")
        # SubprocVectorEnv's context=None: multiprocessing's own default (the first method listed).
        start_method = start_method or multiprocessing.get_start_method(allow_none=True)
        start_method = start_method or multiprocessing.get_all_start_methods()[0]
        self._engine = engine = build(
            env_fns, start_method, opts, "ShmTianshouVectorEnv", info_form="dicts", same_spaces=False
        )
        self._space = engine.observation_space  # env 0's: the layout every env shares
        self._every = np.arange(n)
        try:
            # Local copies, as SubprocVectorEnv's workers keep them: seed() seeds these.
            self._action_spaces: list[gym.Space] = engine.call(
                lambda local: m.GetAttr(local, "action_space"), range(n)
            )
        except BaseException:
            engine.close()
            raise

    # ------------------------------------------------------------------ state

    @property
    def _eng(self) -> Engine:
        engine = self._engine
        if engine is None or engine.closed:
            raise ClosedError.because("ShmTianshouVectorEnv", engine is not None and engine.closed_by_close)
        return engine

    @property
    def is_closed(self) -> bool:  # type: ignore[override]
        """True once :meth:`close` was called or a failure closed the env."""
        return self._engine is None or self._engine.closed

    @property
    def waiting_id(self) -> list[int]:  # type: ignore[override]
        """The envs sent a step whose result has not been returned yet (ascending)."""
        flights = self._eng.flights
        workers = sorted({*flights.busy, *flights.ready, *flights.pending})
        return [i for w in workers for i in flights.groups[w]]

    @property
    def ready_id(self) -> list[int]:  # type: ignore[override]
        """The envs that may be stepped or reset now (ascending)."""
        waiting = set(self.waiting_id)
        return [i for i in range(self.env_num) if i not in waiting]

    def _ids(self, id: Ids) -> list[int] | np.ndarray:
        """``id`` as Tianshou's ``_wrap_id`` makes it: None is every env, an int a list of one."""
        if id is None:
            return list(range(self.env_num))
        return [id] if np.isscalar(id) else id  # type: ignore[list-item,return-value]

    # ------------------------------------------------------------------ conversion

    def _obs(self, arrays: list[np.ndarray], positions: np.ndarray | None) -> np.ndarray:
        """The observations at ``positions`` of a batch (None: all, in order), as ``DummyVectorEnv``
        stacks them: one array for array spaces, else one object per env."""
        if isinstance(self._space, ARRAY_SPACES):
            return arrays[0] if positions is None else arrays[0][positions]
        rows = range(len(arrays[0])) if positions is None else positions.tolist()
        out = np.empty(len(rows), dtype=object)
        for k, p in enumerate(rows):
            out[k] = unflatten(self._space, iter([a[p] for a in arrays]))
        return out

    def _step_result(
        self, batch: Batch, ids: Sequence[Any] | np.ndarray, positions: np.ndarray | None
    ) -> tuple:
        """``(obs, rew, terminated, truncated, info)`` of the envs ``ids`` at ``positions`` of
        ``batch`` (None: the batch as it is)."""
        infos = np.empty(len(ids), dtype=object)
        rows = range(len(ids)) if positions is None else positions.tolist()
        for k, (p, j) in enumerate(zip(rows, ids)):
            info = batch.infos.get(p)
            infos[k] = info = {} if info is None else info
            info["env_id"] = j
        fields = [batch.rewards, batch.terminated, batch.truncated]
        picked = [f.copy() for f in fields] if positions is None else [f[positions] for f in fields]
        return (self._obs(batch.obs, positions), *picked, infos)

    @staticmethod
    def _positions(batch: Batch, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Where each of ``ids`` sits in ``batch`` (whose envs are ascending)."""
        if batch.env_ids is None:
            return np.asarray(ids, dtype=np.int64)
        return np.searchsorted(batch.env_ids, np.asarray(ids))

    # ------------------------------------------------------------------ step and reset

    def step(self, action: Any, id: Ids = None) -> tuple:
        """Step envs ``id`` (default: all) with ``action`` (one per env of ``id``, in its order), as
        ``BaseVectorEnv.step``. Asynchronous (``wait_num``/``timeout``): returns the envs done first,
        whichever were sent (``info["env_id"]`` names them); ``action`` None only collects.

        :raises ValueError: for ids out of range or repeated, an action count that is not
            ``len(id)``, an env still stepping, or (``n_workers`` < ``env_num``, asynchronous or
            ``on_crash="restart"``) ids that split a worker's group; nothing is sent then.
        :raises RuntimeError: ``action`` None with nothing in flight (Tianshou would wait forever).
        """
        engine = self._eng
        ids = self._ids(id)
        if action is not None and len(action) != len(ids):
            raise ValueError(f"expected {len(ids)} actions (one per env of id), got {len(action)}")
        if not self.is_async:
            if action is None:
                raise ValueError("action must be not-None for non-async")
            if len(ids) == self.env_num and np.array_equal(ids, self._every):
                engine.send(action)  # every env in order: one slot, lent without a copy
                return self._step_result(engine.recv(), ids, None)
            # Some envs (Tianshou's n_episode collection, the envs whose episodes are not done yet):
            # their workers step only those.
            engine.send(action, ids, split=True)
            batch = engine.recv(at_least=len(ids))
            return self._step_result(batch, ids, self._positions(batch, ids))
        if action is not None:
            engine.send(action, self._whole(engine, ids, "step"), partial=True)
        try:
            batch = engine.recv(self.timeout, at_least=self.wait_num)
        except multiprocessing.TimeoutError:  # past timeout: whatever is done, at least one
            batch = engine.recv(at_least=1)
        done = self._every if batch.env_ids is None else batch.env_ids
        return self._step_result(batch, [int(j) for j in done], None)

    @staticmethod
    def _whole(engine: Engine, ids: Sequence[int] | np.ndarray, call: str) -> np.ndarray:
        """``ids`` checked: in range, distinct, whole groups of idle workers (before anything is sent)."""
        checked = engine.flights.check_ids(ids)
        engine.flights.whole_groups(checked, call)
        return checked

    def reset(self, env_id: Ids = None, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        """Reset envs ``env_id`` (default: all), each with ``env.reset(**kwargs)``; ``(obs, info)`` in
        the order of ``env_id``, ``info`` a 1-d object array of the reset infos. While other envs
        step (asynchronous collection), their steps stay in flight.

        :raises ValueError: for ids out of range or repeated, or an env still stepping.
        """
        engine = self._eng
        ids = self._ids(env_id)
        n = self.env_num
        seeds = [kwargs.pop("seed", None)] * n
        per_env = [kwargs] * n
        if engine.waiting:  # asynchronous collection: reset these while the others step
            batch = engine.reset_idle(self._whole(engine, ids, "reset"), seeds, per_env)
            positions = self._positions(batch, ids)
            infos = [batch.infos.get(p, {}) for p in positions.tolist()]
            return self._obs(batch.obs, positions), _objects(infos)
        checked = engine.flights.check_ids(ids)
        mask = None
        if len(checked) < n:
            mask = np.zeros(n, dtype=bool)
            mask[checked] = True
        arrays, reset_infos = engine.reset(seeds, per_env, mask)
        return self._obs(arrays, checked), _objects([reset_infos[i] for i in checked.tolist()])

    def seed(self, seed: int | list[int] | None = None) -> list[list[int | None]]:  # type: ignore[override]
        """Seed env ``i``'s action space and reset the env with ``seed + i`` (an int), ``seed[i]`` (a
        list) or None; returns ``[[seed_i], ...]`` as ``DummyVectorEnv`` does for Gymnasium envs.

        :raises RuntimeError: while envs are stepping.
        """
        engine = self._refuse_while_stepping("seed")
        n = self.env_num
        seeds: list[int | None] = [None] * n
        if seed is not None:
            seeds = [seed + i for i in range(n)] if isinstance(seed, int) else list(seed)
        if len(seeds) != n:
            raise ValueError(f"seed(): expected {n} seeds (one per env), got {len(seeds)}")
        for space, s in zip(self._action_spaces, seeds):
            space.seed(s)
        engine.reset(seeds, [{}] * n)
        return [[s] for s in seeds]

    # ------------------------------------------------------------------ env calls

    def _refuse_while_stepping(self, call: str) -> Engine:
        engine = self._eng
        if engine.waiting:
            raise RuntimeError(
                f"{call}(): envs {self.waiting_id} are still stepping; shmvec takes env calls only while "
                "none steps: collect them first (step(None, id=venv.waiting_id))"
            )
        return engine

    def get_env_attr(self, key: str, id: Ids = None) -> list[Any]:
        """``env.get_wrapper_attr(key)`` of envs ``id`` (default: all), in that order; the action
        spaces are this env's own copies (see :meth:`seed`).

        :raises RuntimeError: while envs are stepping.
        """
        ids = self._ids(id)
        if key == "action_space":
            self._eng  # noqa: B018  # raises once closed, as every call does
            return [self._action_spaces[j] for j in ids]
        engine = self._refuse_while_stepping("get_env_attr")
        return engine.call(lambda local: m.GetAttr(local, key), list(ids))

    def set_env_attr(self, key: str, value: Any, id: Ids = None) -> None:
        """``env.set_wrapper_attr(key, value)`` on envs ``id`` (default: all).

        :raises RuntimeError: while envs are stepping.
        """
        engine = self._refuse_while_stepping("set_env_attr")
        ids = list(self._ids(id))
        engine.call(lambda local: m.SetWrapperAttr(local, key, [value] * self.env_num), ids)
        if key == "action_space":
            for j in ids:
                self._action_spaces[j] = value

    def render(self, **kwargs: Any) -> list[Any]:
        """``env.render(**kwargs)`` of every env.

        :raises RuntimeError: while envs are stepping (as Tianshou's asynchronous envs raise).
        """
        engine = self._eng
        if engine.waiting:
            raise RuntimeError(f"Environments {self.waiting_id} are still stepping, cannot render them now.")
        return engine.call(lambda local: m.EnvMethod(local, "render", (), kwargs), range(self.env_num))

    def close(self) -> None:
        """Stop the workers and free the shared memory; idempotent (Tianshou's own raise the second
        time). Steps still in flight are dropped."""
        if self._engine is not None:
            self._engine.close()

    def __repr__(self) -> str:
        n, wait, timeout = self.env_num, self.wait_num, self.timeout
        return f"ShmTianshouVectorEnv(env_num={n}, wait_num={wait}, timeout={timeout})"


def _objects(values: list[Any]) -> np.ndarray:
    """A 1-d object array of ``values`` (``np.array`` would try to nest sequences)."""
    out = np.empty(len(values), dtype=object)
    for k, v in enumerate(values):
        out[k] = v
    return out


__all__ = ["ShmTianshouVectorEnv"]
