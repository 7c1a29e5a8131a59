"""Idle OpenMP threads in the main process, and why shmvec ends them while the workers step.

PyTorch's CPU wheels for Linux run intra-op parallelism (convolutions, matrix products, MKL) on GNU
OpenMP (libgomp). When a parallel region ends, libgomp's pool threads do not go to sleep: unless
``OMP_WAIT_POLICY=PASSIVE`` was set before libgomp loaded, each spins for ``GOMP_SPINCOUNT`` (300,000
pause instructions) first. Measured on the 2-core development machine: after every forward pass of
SB3's NatureCNN, torch's second thread burned 8 ms of a core while the main thread slept.

In a synchronous VecEnv the env step follows the forward pass at once. ``DummyVecEnv`` steps the envs
on the main thread, so the spinner only takes a core nobody else wants; shmvec's workers need every
core, and the spinner takes one of them: with PPO's ``CnnPolicy`` in the loop on 2 cores the two
workers ran one after the other instead of side by side (SB3 Atari recipe, 8 envs: the env phase took
11.5 ms per batch while each worker spent only 5.3 ms in ``env.step``).

``omp_pause_resource_all`` (OpenMP 5.0, in libgomp since GCC 9) ends the calling thread's pool; the
next parallel region starts new threads, so nothing is lost but thread start-up. ShmVecEnv calls it
in ``step_async`` before it sends the step: the pool threads are still spinning then, so they leave
at once, and the workers wake up to free cores (paused after sending instead, the second worker
started 1.7-1.9 ms after the first; paused before, both within 0.5 ms). The environment
variable cannot do this: libgomp reads ``OMP_WAIT_POLICY`` once, when ``import torch`` loads it,
usually before shmvec is imported.

Only libgomp is handled: its pause touches the calling thread's pool alone, so it is safe whatever
other threads do. Intel's and LLVM's runtimes (``libiomp5``, ``libomp``) pause process-wide and are
left alone.
"""

from __future__ import annotations

import ctypes
import re
import sys
from collections.abc import Callable

_OMP_PAUSE_SOFT = 1
_LIBGOMP = re.compile(r"/libgomp[^/]*\.so[^/]*$")


def loaded_libgomp(maps: str = "/proc/self/maps") -> list[str]:
    """Paths of the GNU OpenMP runtimes mapped into this process (several when libraries ship their
    own copy, as PyTorch does); empty where ``/proc`` is missing."""
    try:
        with open(maps) as f:
            paths = {line.split()[-1] for line in f if ".so" in line}
    except OSError:
        return []
    return sorted(p for p in paths if _LIBGOMP.search(p))


class OpenMPPauser:
    """Ends the idle OpenMP threads of the calling thread's pools (see the module docstring).

    :meth:`pause` is cheap when there is nothing to do: the runtimes are looked up again only when
    the set of imported modules has changed since the last look (a library that loads libgomp is
    imported as a module first).
    """

    def __init__(self) -> None:
        self._pauses: list[Callable[[int], int]] = []
        self._seen: set[str] = set()
        self._n_modules = -1

    def _refresh(self) -> None:
        self._n_modules = len(sys.modules)
        for path in loaded_libgomp():
            if path in self._seen:
                continue
            self._seen.add(path)
            try:
                # dlopen of an already loaded library returns it; nothing new is loaded.
                fn = ctypes.CDLL(path).omp_pause_resource_all
            except (OSError, AttributeError):  # a libgomp older than GCC 9
                continue
            fn.argtypes = [ctypes.c_int]
            fn.restype = ctypes.c_int
            self._pauses.append(fn)

    def pause(self) -> int:
        """Pause every libgomp pool of the calling thread; return how many runtimes were asked."""
        if len(sys.modules) != self._n_modules:
            self._refresh()
        for fn in self._pauses:
            # -1 inside a parallel region (nothing happens); 0 otherwise.
            fn(_OMP_PAUSE_SOFT)
        return len(self._pauses)
