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
Atari envs, for ALE ids only; see :mod:`shmvec.bench.envpool_backend`), ``shm-pool``
(ShmVectorEnv in pool mode, ``batch_size`` envs per batch step, see :class:`PoolAdapter`),
``shm-wrappers`` (ShmVecEnv with ``native_step=False``) and, for ``--recipe sb3-atari`` only,
``ale-vec`` and ``ale-vec-async`` (``ale_py.AtariVectorEnv``, see
:mod:`shmvec.bench.ale_vec_backend`). The Gymnasium ones run behind :class:`GymVectorAdapter`.
Another backend (e.g. ``shm`` with an observation codec) is added with :func:`register_backend`;
the CLI, runner and reports pick it up by name.

A recipe (:mod:`shmvec.bench.recipes`) stacks frames; each backend's ``stacking`` says how: ``"vec"``
(SB3's ``VecFrameStack`` over the VecEnv its builder returns), ``"builder"`` (its builder takes
``frame_stack=`` and stacks itself: ShmVecEnv's workers, the C++ envs) or None (it cannot: SB3's
``VecFrameStack`` reads SB3's per-env infos, which Gymnasium's vector envs do not give).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from shmvec.bench.adapters import GymVectorAdapter, PoolAdapter

# A builder gets the factories, the worker count (None: the backend's default) and the start method;
# shmvec's own builders also take its options as keywords (see make_vec_env).
EnvFns = list[Callable[[], gym.Env]]
Builder = Callable[..., Any]


def _dummy(env_fns: EnvFns, n_workers: int | None, start_method: str) -> Any:
    from stable_baselines3.common.vec_env import DummyVecEnv

    venv = DummyVecEnv(env_fns)
    venv.processes = []  # type: ignore[attr-defined]
    return venv


def _subproc(env_fns: EnvFns, n_workers: int | None, start_method: str) -> Any:
    from stable_baselines3.common.vec_env import SubprocVecEnv

    return SubprocVecEnv(env_fns, start_method=start_method)


def _shm(env_fns: EnvFns, n_workers: int | None, start_method: str, **options: Any) -> Any:
    from shmvec.vec_env import ShmVecEnv

    return ShmVecEnv(env_fns, start_method=start_method, n_workers=n_workers, **options)


def _shm_auto(env_fns: EnvFns, n_workers: int | None, start_method: str, **options: Any) -> Any:
    return _shm(env_fns, "auto", start_method, **options)  # type: ignore[arg-type]


def _shm_pin(env_fns: EnvFns, n_workers: int | None, start_method: str, **options: Any) -> Any:
    return _shm(env_fns, n_workers, start_method, worker_cpus="auto", **options)


def _shm_wrappers(env_fns: EnvFns, n_workers: int | None, start_method: str, **options: Any) -> Any:
    return _shm(env_fns, n_workers, start_method, native_step=False, **options)


def _shm_portable(env_fns: EnvFns, n_workers: int | None, start_method: str, **options: Any) -> Any:
    return _shm(env_fns, n_workers, start_method, transport="portable", **options)


def _async(env_fns: EnvFns, n_workers: int | None, start_method: str) -> Any:
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode

    env = AsyncVectorEnv(
        env_fns, shared_memory=True, context=start_method, autoreset_mode=AutoresetMode.SAME_STEP
    )
    return GymVectorAdapter(env, list(env.processes))


def _shm_pool(
    env_fns: EnvFns,
    n_workers: int | None,
    start_method: str,
    batch_size: int | None = None,
    **options: Any,
) -> Any:
    return PoolAdapter(env_fns, start_method, batch_size, **options)


def _sync(env_fns: EnvFns, n_workers: int | None, start_method: str) -> Any:
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    return GymVectorAdapter(SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP))


def _shm_vector(env_fns: EnvFns, n_workers: int | None, start_method: str, **options: Any) -> Any:
    from shmvec.vector_env import ShmVectorEnv

    env = ShmVectorEnv(
        env_fns, autoreset_mode="same_step", start_method=start_method, n_workers=n_workers, **options
    )
    return GymVectorAdapter(env, env.processes)


def _envpool(
    env_fns: EnvFns, n_workers: int | None, start_method: str, frame_stack: int | None = None
) -> Any:
    from shmvec.bench.envpool_backend import make_envpool

    return make_envpool(env_fns, frame_stack)


def _ale_vec(
    env_fns: EnvFns,
    n_workers: int | None,
    start_method: str,
    batch_size: int | None = None,
    frame_stack: int | None = None,
) -> Any:
    from shmvec.bench.ale_vec_backend import make_ale_vec

    return make_ale_vec(env_fns, batch_size, frame_stack)


_BUILDERS: dict[str, Builder] = {}
_DESCRIPTIONS: dict[str, str] = {}
# Backends that step a batch of batch_size < n_envs envs per batch step (their builders take it).
_TAKES_BATCH: set[str] = {"shm-pool", "ale-vec-async"}
# Backends whose worker count can be chosen (the others have one worker per env, or none).
_TAKES_WORKERS: set[str] = set()
# Backends built by shmvec, which take its options (codec=, copy=, ...).
_TAKES_OPTIONS: set[str] = set()
# How each backend stacks a recipe's frames: "vec", "builder" or None (see the module docstring).
_STACKING: dict[str, str | None] = {}
STACKINGS = ("vec", "builder", None)
# Backends that run a recipe's env only (they cannot run Python factories).
_RECIPE_ONLY: set[str] = {"ale-vec", "ale-vec-async"}
# Backends whose own C++ envs give other observations than the recipe's wrappers (recipes.py says how).
_NOT_EXACT: set[str] = {"ale-vec", "ale-vec-async", "envpool"}


def exact(backend: str) -> bool:
    """Whether ``backend`` returns what the in-process reference returns for the same seeds and
    actions (DummyVecEnv, under VecFrameStack for a recipe): bit-identical, not only alike."""
    return backend not in _NOT_EXACT


def register_backend(
    name: str,
    builder: Builder,
    takes_workers: bool = False,
    description: str = "",
    stacking: str | None = "vec",
    takes_options: bool = False,
) -> None:
    """Make ``name`` available to :func:`make_vec_env`, the runner and ``shmvec bench --backends``
    (whose ``--help`` lists it with ``description``).

    This is where ``shm`` with a codec plugs in, e.g.
    ``register_backend("shm-lz4", lambda fns, w, sm: ShmVecEnv(fns, sm, n_workers=w, codec="lz4"),
    takes_workers=True, description="ShmVecEnv(codec='lz4')")``.

    :param builder: ``builder(env_fns, n_workers, start_method)`` returning a VecEnv-like object with a
        ``processes`` list (see :class:`BenchVecEnv`); ``n_workers`` is None for the default.
    :param takes_workers: whether ``--n-workers`` candidates apply to this backend.
    :param description: what it is, in a few words (default: none).
    :param stacking: how it stacks a recipe's frames (``--recipe``): ``"vec"`` (default: SB3's
        ``VecFrameStack`` over what the builder returns, which must then be an SB3 VecEnv),
        ``"builder"`` (the builder takes a ``frame_stack=`` keyword, None for no stacking) or None
        (the backend cannot run a recipe).
    :param takes_options: whether ``builder`` takes shmvec's options as keywords (default False:
        :func:`make_vec_env` gives it none).
    :raises ValueError: for another ``stacking``.
    """
    if stacking not in STACKINGS:
        raise ValueError(f"stacking must be one of {STACKINGS}, got {stacking!r}")
    _BUILDERS[name] = builder
    _DESCRIPTIONS[name] = description
    _STACKING[name] = stacking
    if takes_workers:
        _TAKES_WORKERS.add(name)
    if takes_options:
        _TAKES_OPTIONS.add(name)


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


def _check_known(name: str) -> None:
    if name not in _BUILDERS:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(_BUILDERS)}")


def check_backend(name: str, recipe: str | None = None) -> None:
    """:raises ValueError: if ``name`` is not a registered backend, or cannot run with ``recipe``
    (a backend that cannot stack frames), or runs a recipe only and ``recipe`` is None."""
    _check_known(name)
    if recipe is not None and _STACKING[name] is None:
        able = ", ".join(b for b in _BUILDERS if _STACKING[b] is not None)
        raise ValueError(f"backend {name!r} cannot stack frames for --recipe {recipe}; choose from {able}")
    if recipe is None and name in _RECIPE_ONLY:
        raise ValueError(f"backend {name!r} runs with --recipe sb3-atari only (it runs no Python env)")
    if name in ("sync", "async") and not hasattr(gym.vector, "AutoresetMode"):
        # They are measured resetting in the step that ends an episode, as SB3's VecEnvs do.
        raise ValueError(
            f"backend {name!r} needs Gymnasium >= 1.1 (its vector envs reset in the same step); "
            f"Gymnasium {gym.__version__} resets on the next step only"
        )


def make_vec_env(
    backend: str,
    env_fns: list[Callable[[], gym.Env]],
    n_workers: int | None = None,
    start_method: str | None = None,
    batch_size: int | None = None,
    frame_stack: int | None = None,
    options: dict[str, Any] | None = None,
) -> Any:
    """Build one backend over ``env_fns``.

    :param n_workers: worker processes for backends that take it (default None: the backend's own
        default); ignored by the others.
    :param start_method: multiprocessing start method for the process backends (default None:
        ShmVecEnv's own default, forkserver where the platform has it, else spawn).
    :param batch_size: envs per batch step of a pool backend (default None: half the envs); ignored
        by the others.
    :param frame_stack: frames to stack, as ``VecFrameStack(venv, frame_stack)`` does, the backend's
        own way (its ``stacking``, see :func:`register_backend`); default None: none.
    :param options: shmvec's options (``ShmVecEnv(**options)``) for the backends shmvec builds
        (default None: none); ignored by the others, so that one call builds every backend.
    :raises ValueError: for an unknown backend or start method, or stacking a backend that cannot.
    """
    from shmvec.engine.start_methods import resolve_start_method

    _check_known(backend)  # a recipe-only backend refuses other factories itself
    method = resolve_start_method(start_method)
    stacking = _STACKING[backend] if frame_stack else None
    if frame_stack and stacking is None:
        raise ValueError(f"backend {backend!r} cannot stack frames")
    kwargs: dict[str, Any] = dict(options or {}) if backend in _TAKES_OPTIONS else {}
    if stacking == "builder":
        kwargs["frame_stack"] = frame_stack
    if takes_batch(backend):
        kwargs["batch_size"] = batch_size
    venv = _BUILDERS[backend](list(env_fns), n_workers, method, **kwargs)
    if stacking == "vec" and frame_stack:
        from stable_baselines3.common.vec_env import VecFrameStack

        venv = VecFrameStack(venv, frame_stack)
    return venv


_VEC, _OWN = "vec", "builder"  # stackings: VecFrameStack, or the backend's own (its workers, C++)
for _name, _builder, _workers, _stacking, _text in (
    ("dummy", _dummy, False, _VEC, "SB3 DummyVecEnv: every env in this process, one after another"),
    ("subproc", _subproc, False, _VEC, "SB3 SubprocVecEnv: one process per env, observations pickled"),
    ("shm", _shm, True, _OWN, "ShmVecEnv: a few worker processes, observations in shared memory"),
    ("async", _async, False, None, "gymnasium AsyncVectorEnv(shared_memory=True): one process per env"),
    ("sync", _sync, False, None, "gymnasium SyncVectorEnv: every env in this process"),
    ("shm-vector", _shm_vector, True, _OWN, "ShmVectorEnv: shmvec's Gymnasium face"),
    ("envpool", _envpool, False, _OWN, "EnvPool's C++ Atari envs (ALE ids only; the envpool extra)"),
    ("shm-auto", _shm_auto, False, _OWN, "ShmVecEnv(n_workers='auto'): workers for envs that wait"),
    ("shm-pin", _shm_pin, True, _OWN, "ShmVecEnv(worker_cpus='auto'): each worker pinned to one CPU"),
    ("shm-portable", _shm_portable, True, _OWN, "ShmVecEnv(transport='portable'): pipes only, any platform"),
    ("shm-pool", _shm_pool, False, _OWN, "ShmVectorEnv pool mode: send/recv, --batch-size envs a batch"),
    ("shm-wrappers", _shm_wrappers, True, _OWN, "ShmVecEnv(native_step=False): every step via wrappers"),
    ("ale-vec", _ale_vec, False, _OWN, "ale_py.AtariVectorEnv, C++ threads (--recipe sb3-atari only)"),
    ("ale-vec-async", _ale_vec, False, _OWN, "ale-vec in pool mode, --batch-size envs a batch (ditto)"),
):
    register_backend(_name, _builder, _workers, _text, _stacking, takes_options=_name.startswith("shm"))


# Ray (imported only when chosen): shmvec's Ray backend, and the naive one-actor-per-env VecEnv it is
# compared with (shmvec.bench.naive_ray). Both use the running Ray connection, else start one.
def _ray(env_fns: EnvFns, n_workers: int | None, start_method: str, **options: Any) -> Any:
    from shmvec.vec_env import ShmVecEnv

    return ShmVecEnv(env_fns, n_workers=n_workers, backend="ray", **options)


def _ray_naive(env_fns: EnvFns, n_workers: int | None, start_method: str) -> Any:
    from shmvec.bench.naive_ray import NaiveRayVecEnv

    return NaiveRayVecEnv(env_fns)


_RAY_TEXT = "ShmVecEnv(backend='ray'): workers as Ray actors (the ray extra)"
register_backend("ray", _ray, True, _RAY_TEXT, _OWN, takes_options=True)
register_backend("ray-naive", _ray_naive, False, "one Ray actor per env, observations through Ray")
