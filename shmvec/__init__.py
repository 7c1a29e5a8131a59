"""shmvec: a shared-memory drop-in replacement for Stable-Baselines3's SubprocVecEnv.

Public API: :class:`ShmVecEnv` and the exception types in :mod:`shmvec.errors`; observation codecs
in :mod:`shmvec.codecs`, their measurement in :mod:`shmvec.fidelity`, synthetic envs in
:mod:`shmvec.synthetic` and the benchmark in :mod:`shmvec.bench`.

``ShmVecEnv`` is imported lazily: worker processes import ``shmvec.worker`` (and so this package)
first thing, and importing the VecEnv facade would pull in SB3 and torch in every worker.
"""

from typing import TYPE_CHECKING, Any

from shmvec._version import __version__
from shmvec.errors import (
    ClosedError,
    CodecMismatchError,
    EnvError,
    EnvTimeoutError,
    FidelityError,
    FidelityWarning,
    ObservationError,
    SharedMemoryTooSmallError,
    ShmVecEnvError,
    UnsupportedSpaceError,
    WorkerCrashedError,
)

if TYPE_CHECKING:
    from shmvec.vec_env import ShmVecEnv

__all__ = [
    "ClosedError",
    "CodecMismatchError",
    "EnvError",
    "EnvTimeoutError",
    "FidelityError",
    "FidelityWarning",
    "ObservationError",
    "SharedMemoryTooSmallError",
    "ShmVecEnv",
    "ShmVecEnvError",
    "UnsupportedSpaceError",
    "WorkerCrashedError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name == "ShmVecEnv":
        from shmvec.vec_env import ShmVecEnv

        return ShmVecEnv
    raise AttributeError(f"module 'shmvec' has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazily imported names are not module globals until first use: list them anyway so that
    # dir(shmvec) and tab completion show the whole public API.
    return sorted(set(globals()) | set(__all__))
