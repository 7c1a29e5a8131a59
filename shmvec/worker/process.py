"""What a worker process sets up about itself: thread pools, exit with its parent, a fault log,
ALE's banner kept quiet, and (optionally) one process-global RNG state per env.

Imported by every worker first thing: it must stay light (numpy and the standard library).
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib.abc
import importlib.machinery
import os
import random
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

_THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)


def thread_env(n_threads: int | None) -> dict[str, str]:
    """Environment variables that cap BLAS/OpenMP pools at ``n_threads`` (empty dict for None)."""
    return {} if n_threads is None else {var: str(n_threads) for var in _THREAD_VARS}


def limit_threads(n_threads: int | None) -> None:
    """Cap the thread pools of libraries already loaded in this process at ``n_threads``.

    With fork the child inherits numpy (and maybe torch, OpenCV) with pools sized for all cores;
    environment variables come too late for them, so their runtime knobs are set as well. Several
    workers each spinning a full-size pool on 2 cores run ~10x slower than with one thread each.
    Libraries loaded after this (spawn, forkserver, Ray actors: the main process sets the variables
    before the start) read the variables. A library already at ``n_threads`` or fewer is left alone:
    setting OpenBLAS's count, even to the same value, rebuilds the pool that a fork stopped.
    """
    if n_threads is None:
        return
    os.environ.update(thread_env(n_threads))
    try:
        from threadpoolctl import ThreadpoolController

        for lib in ThreadpoolController().lib_controllers:
            if lib.num_threads > n_threads:
                lib.set_num_threads(n_threads)
                _stop_openblas_pool(lib)
    except Exception:  # threadpoolctl missing or a library it cannot drive
        pass
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() > n_threads:
        torch.set_num_threads(n_threads)
    cv2 = sys.modules.get("cv2")
    if cv2 is not None and cv2.getNumThreads() > n_threads:
        cv2.setNumThreads(n_threads)


def _stop_openblas_pool(lib: Any) -> None:
    """Stop the threads OpenBLAS (pthreads build) just started again to change its count.

    OpenBLAS stops its pool before a fork and restarts it in the child on the next
    ``openblas_set_num_threads``, at the parent's size; each new thread then busy-waits for work
    (~0.1 s of CPU per worker start, measured). Stopped here, as OpenBLAS's own fork handler stops
    it; a BLAS call that needs more than one thread starts it again when it runs.
    """
    if (lib.internal_api, getattr(lib, "threading_layer", None)) != ("openblas", "pthreads"):
        return
    shutdown = getattr(lib.dynlib, "blas_thread_shutdown_", None)
    if shutdown is not None:
        shutdown()


def pin_to_cpu(cpu: int | None) -> None:
    """Run this process on ``cpu`` only (None: leave the OS to place it). Called before any thread
    pool exists, so the pools' threads inherit the mask."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def exit_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when its parent dies, even if an env hangs in C code.

    A worker blocked on its pipe notices the parent's death by EOF anyway; this covers a worker stuck
    inside ``env.step``. No-op where prctl is unavailable.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except Exception:
        pass


class GlobalRngs:
    """One process-global RNG state (``np.random.*``, ``random.*``) per env, swapped in around each
    call into it, so envs packed into one worker draw what they would draw alone in a process
    forked from the same parent (SubprocVecEnv under fork), whatever ``n_workers`` is.

    :param n_envs: envs of this worker. Each starts from the process's numpy state (under fork: the
        parent's, as a forked process keeps it) and a freshly seeded ``random`` state (a forked
        process reseeds ``random`` from the OS).
    """

    def __init__(self, n_envs: int) -> None:
        np_state = np.random.get_state()
        self.states = [(np_state, random.Random().getstate()) for _ in range(n_envs)]

    def enter(self, i: int) -> None:
        np_state, py_state = self.states[i]
        np.random.set_state(np_state)
        random.setstate(py_state)

    def leave(self, i: int) -> None:
        self.states[i] = (np.random.get_state(), random.getstate())


_fault_file: Any = None  # kept open for faulthandler for the life of the worker


def enable_faulthandler(path: str | None) -> None:
    """On a segfault, abort, SIGBUS or SIGFPE in an env (or its native library), write the Python
    traceback to ``path`` (the main process reads it into the error) or, without one, to stderr."""
    global _fault_file
    try:
        if path is not None:
            _fault_file = open(path, "w")  # noqa: SIM115 - must outlive this function
            faulthandler.enable(file=_fault_file)
        else:
            faulthandler.enable()
    except Exception:
        pass


# Set to 1 to let every worker print ALE's start-up banner, as a process of its own would.
ALE_BANNER_VAR = "SHMVEC_ALE_BANNER"


def quiet_ale_banner() -> None:
    """Keep ale-py from printing its two-line banner (``A.L.E: Arcade Learning Environment`` /
    ``[Powered by Stella]``) in this worker: one pair per worker buried ``shmvec bench``'s output.
    Errors from ALE still print. ``SHMVEC_ALE_BANNER=1`` in the environment keeps the banner.

    ale-py is not imported for it: if it is loaded already (fork) its logger is set now, else when
    an env first imports it, so a worker whose envs are not ALE games pays nothing.
    """
    if os.environ.get(ALE_BANNER_VAR) == "1":
        return
    if "ale_py" in sys.modules:
        _quiet(sys.modules["ale_py"])
    elif not any(isinstance(f, _QuietAleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietAleFinder())


def _quiet(ale_py: Any) -> None:
    try:
        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    except Exception:  # an ale-py without the switch: the banner stays
        pass


class _QuietAleFinder(importlib.abc.MetaPathFinder):
    """Finds ``ale_py`` as the other finders would, and quiets it right after it is imported."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "ale_py":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            load(module)
            _quiet(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


@contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of a worker start (spawn children read them)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
