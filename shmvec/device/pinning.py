"""The ring's pages registered with CUDA (``cudaHostRegister``), once per engine, for ``device="cuda"``.

Why register instead of copying into pinned buffers: the ring is one shared-memory mapping laid out
once per run, so pinning it in place lets each batch go from the slot the workers wrote straight to
the GPU by DMA, asynchronously, with no host copy on the way.

How: through torch, ``torch.cuda.cudart().cudaHostRegister(ptr, size, flags)`` (no compiler, no
other package), over the whole segment at start-up; ``cudaHostUnregister`` in the engine's teardown
(``close()``, a failure that closes the engine) or, if the engine is garbage collected unclosed,
from a finalizer. Either way the side stream is synchronized first (no copy may read unregistered
pages) and the mapping is kept alive until then: the finalizer holds an array over it.

The memlock limit (``ulimit -l``): NVIDIA's Linux driver pins registered pages with
``get_user_pages`` and does not charge them to ``RLIMIT_MEMLOCK`` (``os_lock_user_pages`` in
``kernel-open/nvidia/os-mlock.c``), so a container's default limit (64 KiB or 8 MiB) does not stop
it, and refusing up front would disable pinning where it works. What decides is the registration's
own result; the limit is named in the message when it is below the ring's size. When CUDA refuses:

- ``pin_memory=None`` (default): warn once and copy from pageable memory (same tensors; each copy
  waits for the host to stage it);
- ``pin_memory=True``: raise (the engine closes);
- ``pin_memory=False``: never try.

A failed runtime call leaves the CUDA runtime's per-thread "last error" set, and torch's next
kernel launch would raise it as its own (pytorch/pytorch#167414). The runtime's
``cudaGetLastError`` clears it; torch does not expose it, so it is called in the libcudart this
process mapped (:func:`clear_last_error`). Where none is mapped (a static runtime) the fallback
would leave the error armed, so that case raises too, asking for ``pin_memory=False``.
"""

from __future__ import annotations

import ctypes
import os
import resource
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from shmvec.memory.ring import Ring


class CudaRuntime:
    """The runtime calls pinning needs, through ``torch.cuda.cudart()`` (HIP's on ROCm builds)."""

    def __init__(self) -> None:
        import torch

        self.cudart = torch.cuda.cudart()
        hip = torch.version.hip is not None
        self.library, self.clear_call = (
            ("libamdhip64", "hipGetLastError") if hip else ("libcudart", "cudaGetLastError")
        )

    def register(self, ptr: int, size: int) -> tuple[int, str]:
        """``cudaHostRegister(ptr, size, cudaHostRegisterDefault)``: the error code (0: success) and
        its name."""
        err = self.cudart.cudaHostRegister(ptr, size, 0)
        return int(err), str(self.cudart.cudaGetErrorString(err))

    def unregister(self, ptr: int) -> int:
        """``cudaHostUnregister(ptr)``: the error code (0: success)."""
        return int(self.cudart.cudaHostUnregister(ptr))

    def clear_error(self) -> bool:
        """Reset the runtime's last error (see :func:`clear_last_error`)."""
        return clear_last_error(self.library, self.clear_call)


def mapped_libraries(maps: str, marker: str) -> list[str]:
    """The files in ``/proc/self/maps`` text whose name contains ``marker`` (``libcudart`` also matches
    the ``libcudart-<hash>.so.12`` that some wheels bundle), each once, without ``" (deleted)"``."""
    paths: list[str] = []
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip().removesuffix(" (deleted)")
        if marker in os.path.basename(path) and path not in paths:
            paths.append(path)
    return paths


def clear_last_error(
    marker: str = "libcudart",
    function: str = "cudaGetLastError",
    maps_path: str = "/proc/self/maps",
    load: Callable[[str], Any] = ctypes.CDLL,
) -> bool:
    """Call ``function`` (the runtime's get-and-reset of its last error) in every copy of the runtime
    library mapped into this process (each keeps its own error state; opening a mapped file again
    returns the loaded copy). Whether at least one was reached."""
    try:
        with open(maps_path) as f:
            maps = f.read()
    except OSError:
        return False
    cleared = False
    for path in mapped_libraries(maps, marker):
        try:
            getattr(load(path), function)()
        except (OSError, AttributeError):
            continue
        cleared = True
    return cleared


def memlock_limit() -> int | None:
    """This process's soft ``RLIMIT_MEMLOCK`` in bytes (None: unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def ring_extent(ring: Ring) -> tuple[int, int, np.ndarray]:
    """The ring's first byte, its size, and an array over it that keeps the mapping alive."""
    first = ring.spec.fields[0]
    keep = ring.views[first.name]
    return int(keep.__array_interface__["data"][0]) - first.offset, ring.spec.size, keep


class Pinned:
    """The ring's pages, registered; :meth:`release` (or garbage collection) unregisters them once."""

    def __init__(self, runtime: CudaRuntime, ptr: int, size: int, keep: np.ndarray, stream: Any) -> None:
        self.ptr, self.size = ptr, size
        self._finalizer = weakref.finalize(self, _unpin, runtime, ptr, keep, stream)

    @property
    def registered(self) -> bool:
        """Whether the pages are still registered."""
        return self._finalizer.alive

    def release(self) -> None:
        """Wait for the copies in flight on the side stream, then unregister. Idempotent."""
        self._finalizer()


def _unpin(runtime: CudaRuntime, ptr: int, keep: np.ndarray, stream: Any) -> None:
    # keep (an array over the mapping) is an argument so that the mapping outlives the registration.
    try:
        stream.synchronize()
    finally:
        if runtime.unregister(ptr) != 0:
            runtime.clear_error()


def pin_ring(
    ring: Ring, pin_memory: bool | None, stream: Any, runtime: CudaRuntime | None = None
) -> Pinned | None:
    """Register the ring's pages (see the module docstring for what happens when CUDA refuses).

    :param pin_memory: None: pin, else warn and return None; True: pin or raise; False: None.
    :param stream: the side stream the copies run on (synchronized before unregistering).
    :param runtime: the CUDA runtime (default: torch's).
    :raises RuntimeError: when CUDA refuses and ``pin_memory`` is True, or the refusal's error
        cannot be cleared.
    """
    if pin_memory is False:
        return None
    ptr, size, keep = ring_extent(ring)
    runtime = CudaRuntime() if runtime is None else runtime
    code, name = runtime.register(ptr, size)
    if code == 0:
        return Pinned(runtime, ptr, size, keep, stream)
    cleared = runtime.clear_error()
    message = (
        f"CUDA refused to register the ring's {size / 2**20:.1f} MiB (cudaHostRegister: {name}, code {code})"
    )
    limit = memlock_limit()
    if limit is not None and limit < size:
        message += (
            f"; this process may lock {limit / 2**20:.2f} MiB (ulimit -l): NVIDIA's driver does not count "
            "registered pages against that limit, other drivers may: `ulimit -l unlimited` (docker run "
            "--ulimit memlock=-1) lifts it"
        )
    if not cleared:
        raise RuntimeError(
            message + ". The CUDA runtime's error could not be cleared (no runtime library mapped in this "
            "process), and it would resurface in a later CUDA call: pass pin_memory=False"
        )
    if pin_memory:
        raise RuntimeError(message + ". pin_memory=None falls back to pageable copies; False skips pinning")
    warnings.warn(
        message + ". Copying observations from pageable memory instead: the same tensors, each copy "
        "waiting for the host. pin_memory=False skips the attempt; pin_memory=True makes this an error.",
        RuntimeWarning,
        stacklevel=2,
    )
    return None
