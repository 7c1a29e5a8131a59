"""Timing batch steps of a VecEnv with pytest-benchmark: what the ``vec_env_benchmark`` fixture
(:mod:`shmvec.testing.plugin`) and this repository's benchmark matrix (``benchmarks/``) run.

Nothing here imports pytest or pytest-benchmark: ``benchmark`` is the fixture's object, passed in.
Backends are named as in :mod:`shmvec.bench.backends` (``dummy``, ``subproc``, ``shm``, ``sync``,
``async``, ``shm-vector``, ... or one you registered).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from shmvec.bench.backends import check_backend, make_vec_env
from shmvec.testing.equivalence import sample_actions

#: The backends each test of the fixture is timed with, unless it says otherwise.
DEFAULT_BACKENDS = ("dummy", "subproc", "shm")

# Distinct batches of random actions cycled through while timing: sampled before the clock starts.
_ACTION_BATCHES = 64


def default_start_method() -> str | None:
    """The start method the fixture uses unless told otherwise: ``"fork"`` on Linux, else None
    (shmvec's default, forkserver or spawn).

    From pytest, fork works with any factory (a lambda or a class in the test file, under any
    ``--import-mode``), needs no ``__main__`` guard, and starts SubprocVecEnv's workers without
    importing SB3 and torch again in each (seconds per worker with forkserver or spawn).
    """
    return "fork" if sys.platform.startswith("linux") else None


def as_policy(policy: Any) -> Callable[[Any], Any] | None:
    """``policy`` as a function from a batch of observations to a batch of actions: a function as it
    is, an object with SB3's ``predict`` (a model or a policy) through ``predict(obs)[0]``."""
    if policy is None or not hasattr(policy, "predict"):
        return policy
    return lambda obs: policy.predict(obs, deterministic=False)[0]


def time_batch_steps(
    benchmark: Any, venv: Any, policy: Any = None, seed: int = 0, warmup_steps: int = 3
) -> float | None:
    """Time one batch step (``step_async`` + ``step_wait``) of ``venv`` with ``benchmark``, the
    pytest-benchmark fixture, which chooses the rounds (``--benchmark-max-time``,
    ``--benchmark-min-rounds``, ...). Resets ``venv`` with ``seed`` first and steps it
    ``warmup_steps`` times untimed (first steps touch fresh memory).

    :param venv: an SB3 VecEnv, or a backend built by :func:`shmvec.bench.backends.make_vec_env`.
    :param policy: None (default) for random actions, sampled before the clock starts; or a function
        from a batch of observations to a batch of actions, or an SB3 model (``predict``), called
        in each timed step as in training.
    :returns: env steps per second at the median batch step time, also stored as
        ``benchmark.extra_info["env_steps_per_s"]``; None when pytest-benchmark is disabled
        (``--benchmark-disable``: the step then runs once, untimed).
    """
    act = as_policy(policy)
    n = venv.num_envs
    venv.seed(seed)
    obs = venv.reset()
    venv.action_space.seed(seed)
    batches = [sample_actions(venv.action_space, n) for _ in range(_ACTION_BATCHES)]
    count = itertools.count()

    def step() -> None:
        nonlocal obs
        venv.step_async(batches[next(count) % _ACTION_BATCHES] if act is None else act(obs))
        obs = venv.step_wait()[0]

    for _ in range(warmup_steps):
        step()
    benchmark(step)
    if benchmark.stats is None:  # disabled
        return None
    rate = n / benchmark.stats.stats.median
    benchmark.extra_info["env_steps_per_s"] = rate
    return rate


class VecEnvBenchmark:
    """What the ``vec_env_benchmark`` fixture gives a test: call it once with your env factories.

    It builds the case's backend (the test is parametrized with each), times its batch steps
    (:func:`time_batch_steps`) in the pytest-benchmark group ``"{name} n={n_envs}"`` and closes it.
    ``extra_info`` holds ``env``, ``backend``, ``n_envs`` and ``env_steps_per_s``.

    :param benchmark: pytest-benchmark's fixture.
    :param backend: the backend of this case (see :mod:`shmvec.bench.backends`).
    :param name: the default name of the env in the group (the test function's name).
    """

    def __init__(self, benchmark: Any, backend: str, name: str) -> None:
        check_backend(backend)
        self.benchmark = benchmark
        self.backend = backend
        self.name = name

    def __call__(
        self,
        env_fns: Callable[[], gym.Env] | Sequence[Callable[[], gym.Env]],
        n_envs: int | None = None,
        *,
        policy: Any = None,
        name: str | None = None,
        seed: int = 0,
        start_method: str | None = None,
        extra_info: dict[str, Any] | None = None,
        **shmvec_options: Any,
    ) -> float | None:
        """Time this case's backend on ``env_fns``.

        :param env_fns: one factory (built ``n_envs`` times) or a list of them, one per env.
        :param n_envs: envs stepped per batch step (default None: ``len(env_fns)``).
        :param policy: None (default: random actions), a function from observations to actions, or
            an SB3 model: see :func:`time_batch_steps`.
        :param name: the env's name in the group (default: the test function's name). Give it when
            one test function times several envs, so that each env gets groups of its own.
        :param seed: seed of the reset and of the random actions (default 0).
        :param start_method: for the process backends (default None: :func:`default_start_method`).
        :param extra_info: more entries for pytest-benchmark's ``extra_info`` (they win over the
            fixture's own).
        :param shmvec_options: options of the backends shmvec builds (``n_workers``, ``codec``,
            ...); the others ignore them.
        :returns: env steps per second (None when pytest-benchmark is disabled).
        :raises ValueError: for a mismatch between ``env_fns`` and ``n_envs``.
        """
        if callable(env_fns):
            if n_envs is None:
                raise ValueError("give n_envs with a single factory (or a list of factories)")
            fns = [env_fns] * n_envs
        else:
            fns = list(env_fns)
            if n_envs is not None and n_envs != len(fns):
                raise ValueError(f"n_envs={n_envs} but {len(fns)} factories")
        n_workers = shmvec_options.pop("n_workers", None)
        method = start_method or default_start_method()
        venv = make_vec_env(self.backend, fns, n_workers, method, options=shmvec_options)
        try:
            self.benchmark.group = f"{name or self.name} n={len(fns)}"
            self.benchmark.extra_info.update(env=name or self.name, backend=self.backend, n_envs=len(fns))
            self.benchmark.extra_info.update(extra_info or {})
            return time_batch_steps(self.benchmark, venv, policy, seed)
        finally:
            venv.close()
