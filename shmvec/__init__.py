"""shmvec: a shared-memory drop-in replacement for Stable-Baselines3's SubprocVecEnv.

Public API: :class:`ShmVecEnv` (SB3's VecEnv), :class:`ShmVectorEnv` and :func:`make_vec`
(Gymnasium's VectorEnv), and the exception types in :mod:`shmvec.errors`; observation codecs in
:mod:`shmvec.codecs`, their measurement in :mod:`shmvec.fidelity`, synthetic envs in
:mod:`shmvec.synthetic` and the benchmark in :mod:`shmvec.bench`.

The faces are imported lazily: worker processes import ``shmvec.worker`` (and so this package)
first thing, and importing the SB3 face would pull in SB3 and torch in every worker.
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
    FrameSkipWarning,
    NativeStepWarning,
    NoPendingCallError,
    ObservationError,
    PendingCallError,
    PlatformWarning,
    SharedMemoryTooSmallError,
    ShmVecEnvError,
    SpaceMismatchError,
    UnsupportedSpaceError,
    WorkerCrashedError,
)

if TYPE_CHECKING:
    from shmvec.vec_env import ShmVecEnv
    from shmvec.vector_env import ShmVectorEnv
    from shmvec.vector_make import make_vec

__all__ = [
    "ClosedError",
    "CodecMismatchError",
    "EnvError",
    "EnvTimeoutError",
    "FidelityError",
    "FidelityWarning",
    "FrameSkipWarning",
    "NativeStepWarning",
    "NoPendingCallError",
    "ObservationError",
    "PendingCallError",
    "PlatformWarning",
    "SharedMemoryTooSmallError",
    "ShmVecEnv",
    "ShmVecEnvError",
    "ShmVectorEnv",
    "SpaceMismatchError",
    "UnsupportedSpaceError",
    "WorkerCrashedError",
    "__version__",
    "make_vec",
]

# Public names imported on first use: name -> module.
_LAZY = {"ShmVecEnv": "shmvec.vec_env", "ShmVectorEnv": "shmvec.vector_env", "make_vec": "shmvec.vector_make"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'shmvec' has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazily imported names are not module globals until first use: list them anyway so that
    # dir(shmvec) and tab completion show the whole public API.
    return sorted(set(globals()) | set(__all__))
