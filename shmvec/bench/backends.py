"""The VecEnv backends a benchmark can compare, built from the same env factories.

Every backend is driven through the same four calls (``reset``, ``step_async``, ``step_wait``,
``close``) plus a ``processes`` list (the worker processes, for CPU and memory accounting), so the
runner times them all the same way.

Backends: ``dummy`` (SB3 DummyVecEnv), ``subproc`` (SB3 SubprocVecEnv), ``shm`` (ShmVecEnv),
``async`` (gymnasium ``AsyncVectorEnv(shared_memory=True)``), ``sync`` (gymnasium ``SyncVectorEnv``),
``shm-vector`` (:class:`shmvec.ShmVectorEnv`, the Gymnasium face), ``shm-auto`` (ShmVecEnv with
``n_workers="auto"``, to compare with hand-picked ``shm`` counts), ``shm-pin`` (ShmVecEnv with
``worker_cpus="auto"``: each worker pinned to one CPU), ``shm-portable`` (ShmVecEnv on the portable
transport, :mod:`shmvec.transports.portable`), ``envpool`` (EnvPool's C++
Atari envs, for ALE ids only; see :mod:`shmvec.bench.envpool_backend`) and ``shm-pool``
(ShmVectorEnv in pool mode, ``batch_size`` envs per batch step, see :class:`PoolAdapter`). The
Gymnasium ones run behind :class:`GymVectorAdapter`. Another backend (e.g. ``shm`` with an
observation codec) is added with :func:`register_backend`; the CLI, runner and reports pick it up
by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from shmvec.bench.adapters import GymVectorAdapter, PoolAdapter

# A builder gets the factories, the worker count (None: the backend's default) and the start method.
Builder = Callable[[list[Callable[[], gym.Env]], int | None, str], Any]


def _dummy(env_fns: list[Callable[[], gym.Env]], n_workers: int | None, start_method: str) -> Any:
    from stable_baselines3.common.vec_env import DummyVecEnv

    venv = DummyVecEnv(env_fns)
    venv.processes = []  # type: ignore[attr-defined]
    return venv


def _subproc(env_fns: list[Callable[[], gym.Env]], n_workers: int | None, start_method: str) -> Any:
    from stable_baselines3.common.vec_env import SubprocVecEnv

    return SubprocVecEnv(env_fns, start_method=start_method)


def _shm(env_fns: list[Callable[[], gym.Env]], n_workers: int | None, start_method: str) -> Any:
    from shmvec.vec_env import ShmVecEnv

    return ShmVecEnv(env_fns, start_method=start_method, n_workers=n_workers)


def _shm_auto(env_fns: list[Callable[[], gym.Env]], n_workers: int | None, start_method: str) -> Any:
    from shmvec.vec_env import ShmVecEnv

    return ShmVecEnv(env_fns, start_method=start_method, n_workers="auto")


def _shm_pin(env_fns: list[Callable[[], gym.Env]], n_workers: int | None, start_method: str) -> Any:
    from shmvec.vec_env import ShmVecEnv

    return ShmVecEnv(env_fns, start_method=start_method, n_workers=n_workers, worker_cpus="auto")


def _shm_portable(env_fns: list[Callable[[], gym.Env]], n_workers: int | None, start_method: str) -> Any:
    from shmvec.vec_env import ShmVecEnv

    return ShmVecEnv(env_fns, start_method=start_method, n_workers=n_workers, transport="portable")


def _async(env_fns: list[Callable[[], gym.Env]], n_workers: int | None, start_method: str) -> Any:
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode

    env = AsyncVectorEnv(
        env_fns, shared_memory=True, context=start_method, autoreset_mode=AutoresetMode.SAME_STEP
    )
    return GymVectorAdapter(env, list(env.processes))


def _shm_pool(
    env_fns: list[Callable[[], gym.Env]],
    n_workers: int | None,
    start_method: str,
    batch_size: int | None = None,
) -> Any:
    return PoolAdapter(env_fns, start_method, batch_size)


def _sync(env_fns: list[Callable[[], gym.Env]], n_workers: int | None, start_method: str) -> Any:
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    return GymVectorAdapter(SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP))


def _shm_vector(env_fns: list[Callable[[], gym.Env]], n_workers: int | None, start_method: str) -> Any:
    from shmvec.vector_env import ShmVectorEnv

    env = ShmVectorEnv(env_fns, autoreset_mode="same_step", start_method=start_method, n_workers=n_workers)
    return GymVectorAdapter(env, env.processes)


def _envpool(env_fns: list[Callable[[], gym.Env]], n_workers: int | None, start_method: str) -> Any:
    from shmvec.bench.envpool_backend import make_envpool

    return make_envpool(env_fns)


_BUILDERS: dict[str, Builder] = {}
_DESCRIPTIONS: dict[str, str] = {}
# Backends that step a batch of batch_size < n_envs envs per batch step (their builders take it).
_TAKES_BATCH: set[str] = {"shm-pool"}
# Backends whose worker count can be chosen (the others have one worker per env, or none).
_TAKES_WORKERS: set[str] = set()


def register_backend(name: str, builder: Builder, takes_workers: bool = False, description: str = "") -> None:
    """Make ``name`` available to :func:`make_vec_env`, the runner and ``shmvec bench --backends``
    (whose ``--help`` lists it with ``description``).

    This is where ``shm`` with a codec plugs in, e.g.
    ``register_backend("shm-lz4", lambda fns, w, sm: ShmVecEnv(fns, sm, n_workers=w, codec="lz4"),
    takes_workers=True, description="ShmVecEnv(codec='lz4')")``.

    :param builder: ``builder(env_fns, n_workers, start_method)`` returning a VecEnv-like object with a
        ``processes`` list (see :class:`BenchVecEnv`); ``n_workers`` is None for the default.
    :param takes_workers: whether ``--n-workers`` candidates apply to this backend.
    :param description: what it is, in a few words (default: none).
    """
    _BUILDERS[name] = builder
    _DESCRIPTIONS[name] = description
    if takes_workers:
        _TAKES_WORKERS.add(name)


def describe_backends() -> str:
    """One line per registered backend, ``name: description``: what ``shmvec bench --help`` and the
    benchmarks page list (``tests/test_docs.py`` keeps the page equal to it)."""
    width = max(map(len, _BUILDERS))
    return "".join(f"  {name:<{width}}  {_DESCRIPTIONS[name]}\n" for name in _BUILDERS)


def backend_names() -> tuple[str, ...]:
    """The registered backend names, in registration order."""
    return tuple(_BUILDERS)


def takes_workers(backend: str) -> bool:
    """Whether the worker count of ``backend`` can be chosen."""
    return backend in _TAKES_WORKERS


def takes_batch(backend: str) -> bool:
    """Whether ``backend`` is a pool: ``batch_size`` envs per batch step, fewer than its envs."""
    return backend in _TAKES_BATCH


def check_backend(name: str) -> None:
    """:raises ValueError: if ``name`` is not a registered backend."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(_BUILDERS)}")


def make_vec_env(
    backend: str,
    env_fns: list[Callable[[], gym.Env]],
    n_workers: int | None = None,
    start_method: str | None = None,
    batch_size: int | None = None,
) -> Any:
    """Build one backend over ``env_fns``.

    :param n_workers: worker processes for backends that take it (default None: the backend's own
        default); ignored by the others.
    :param start_method: multiprocessing start method for the process backends (default None:
        ShmVecEnv's own default, forkserver where the platform has it, else spawn).
    :param batch_size: envs per batch step of a pool backend (default None: half the envs); ignored
        by the others.
    :raises ValueError: for an unknown backend or start method.
    """
    from shmvec._start_methods import resolve_start_method

    check_backend(backend)
    method = resolve_start_method(start_method)
    if takes_batch(backend):
        return _BUILDERS[backend](list(env_fns), n_workers, method, batch_size)  # type: ignore[call-arg]
    return _BUILDERS[backend](list(env_fns), n_workers, method)


for _name, _builder, _workers, _text in (
    ("dummy", _dummy, False, "SB3 DummyVecEnv: every env in this process, one after another"),
    ("subproc", _subproc, False, "SB3 SubprocVecEnv: one process per env, observations pickled"),
    ("shm", _shm, True, "ShmVecEnv: a few worker processes, observations in shared memory"),
    ("async", _async, False, "gymnasium AsyncVectorEnv(shared_memory=True): one process per env"),
    ("sync", _sync, False, "gymnasium SyncVectorEnv: every env in this process"),
    ("shm-vector", _shm_vector, True, "ShmVectorEnv: shmvec's Gymnasium face"),
    ("envpool", _envpool, False, "EnvPool's C++ Atari envs (ALE ids only; the envpool extra)"),
    ("shm-auto", _shm_auto, False, "ShmVecEnv(n_workers='auto'): workers for envs that wait"),
    ("shm-pin", _shm_pin, True, "ShmVecEnv(worker_cpus='auto'): each worker pinned to one CPU"),
    ("shm-portable", _shm_portable, True, "ShmVecEnv(transport='portable'): pipes only, any platform"),
    ("shm-pool", _shm_pool, False, "ShmVectorEnv pool mode: send/recv, --batch-size envs a batch"),
):
    register_backend(_name, _builder, _workers, _text)


# Ray (imported only when chosen): shmvec's Ray backend, and the naive one-actor-per-env VecEnv it is
# compared with (shmvec.bench.naive_ray). Both use the running Ray connection, else start one.
def _ray(env_fns: list[Callable[[], gym.Env]], n_workers: int | None, start_method: str) -> Any:
    from shmvec.vec_env import ShmVecEnv

    return ShmVecEnv(env_fns, n_workers=n_workers, backend="ray")


def _ray_naive(env_fns: list[Callable[[], gym.Env]], n_workers: int | None, start_method: str) -> Any:
    from shmvec.bench.naive_ray import NaiveRayVecEnv

    return NaiveRayVecEnv(env_fns)


register_backend("ray", _ray, True, "ShmVecEnv(backend='ray'): workers as Ray actors (the ray extra)")
register_backend("ray-naive", _ray_naive, False, "one Ray actor per env, observations through Ray")
