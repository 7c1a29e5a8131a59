"""``shmvec bench``: measure which VecEnv configuration is fastest on an env, and say why.

Python API (the same data the CLI prints)::

    from shmvec.bench import BenchSpec, run
    result = run(BenchSpec(env="ALE/Pong-v5", backends=("subproc", "shm"), n_envs=(4, 8)))
    print(result.recommendation["text"]); result.to_dict()  # every raw figure

Modules: ``backends`` (what is compared), ``runner`` (measuring), ``system`` (CPU and memory of the
process tree), ``stats`` (median and CI), ``recommend``, ``report`` (table, JSON, plot, README),
``train`` (``--train``), ``policy`` (random or SB3 actions), ``envs`` (names to factories).

Imports are lazy: workers unpickle factories from :mod:`shmvec.bench.envs`, and this package must not
pull SB3 and torch into them.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shmvec.bench.runner import BenchResult, BenchSpec, run

__all__ = ["BenchResult", "BenchSpec", "run"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from shmvec.bench import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'shmvec.bench' has no attribute {name!r}")
