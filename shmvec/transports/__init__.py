"""Transports: how the engine reaches its workers.

``"local"`` (the default): worker processes on this machine, observations in the shared-memory
ring, reached by one of two transports (``transport=``, :func:`choose_transport`): ``"linux"``, the
ring's doorbell and a pipe each (:mod:`shmvec.transports.local`), or ``"portable"``, a pipe each and
nothing else (:mod:`shmvec.transports.portable`; macOS, Windows, or any platform without the
doorbell's futexes and ``eventfd``); both share :mod:`shmvec.transports.pipes`. ``"ray"``: each
worker is a Ray actor, possibly on another machine; observations travel encoded by the codecs as
Ray return values (:mod:`shmvec.transports.ray`). All implement the contract of
:mod:`shmvec.transports.base` and serve the same commands with the same worker code
(:mod:`shmvec.worker`), so neither the engine nor the faces know which one runs.

This module imports no Ray: the local backend never loads it. Nothing here imports the engine
(arrows point down); the engine picks the transport (:func:`shmvec.engine.build.make_transport`).
"""

from __future__ import annotations

import os
import platform
import select
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shmvec.errors import PlatformWarning
from shmvec.memory.layout import Leaf

if TYPE_CHECKING:
    from shmvec.codecs import Codec

BACKENDS = ("local", "ray")
#: The local backend's transports; "auto": the Linux one where it can run, else the portable one.
TRANSPORTS = ("auto", "linux", "portable")
#: Environment variable that picks the transport where ``transport="auto"`` (e.g. ``portable``, so a
#: whole test suite runs on the portable transport).
TRANSPORT_VAR = "SHMVEC_TRANSPORT"

# Leaves smaller than this (bytes) travel raw on the Ray wire: a codec call costs more than it saves.
SMALL_LEAF_BYTES = 1024
# The default codec of the Ray backend, best first (lossless; the first whose libraries import).
RAY_CODEC_ORDER = ("delta", "zstd", "lz4")


def check_backend(backend: str, ray_options: Mapping[str, Any] | None) -> None:
    """:raises ValueError: for an unknown backend, or ``ray_options`` without ``backend="ray"``;
    :raises TypeError: for ``ray_options`` that is not a mapping."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if ray_options is None:
        return
    if not isinstance(ray_options, Mapping):
        raise TypeError(
            f"ray_options must be a dict of Ray actor options (num_cpus, resources, "
            f"scheduling_strategy...), got {type(ray_options).__name__}"
        )
    if backend != "ray":
        raise ValueError(f"ray_options needs backend='ray', got backend={backend!r}")


def linux_transport_missing() -> str | None:
    """What the Linux transport needs that this platform lacks (None: it can run here)."""
    from shmvec.memory import doorbell

    if not doorbell.available():
        return "Linux futexes and os.eventfd (x86-64, arm64, riscv64, ppc64 or s390x)"
    if not hasattr(select, "epoll"):
        return "select.epoll"
    return None


def has_procfs() -> bool:
    """Whether ``/proc`` describes this process's threads and libraries (Linux)."""
    return os.path.isdir("/proc/self/task")


def can_pin() -> bool:
    """Whether worker processes can be pinned to CPUs here (Linux's ``sched_setaffinity``)."""
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def supported(feature: str, works: bool, needs: str) -> bool:
    """``works``, with a one-line :class:`~shmvec.errors.PlatformWarning` when it does not: the
    Linux-only ``feature`` is off here (it needs ``needs``)."""
    if not works:
        warnings.warn(
            f"shmvec: {feature} is off on {platform.system()}: it needs {needs}",
            PlatformWarning,
            stacklevel=5,
        )
    return works


def choose_transport(transport: str, backend: str) -> str:
    """The transport that runs: ``"linux"`` or ``"portable"`` for the local backend (``"auto"``:
    :data:`TRANSPORT_VAR` if set, else the Linux one where :func:`linux_transport_missing` finds
    nothing missing), ``"auto"`` for Ray (its own).

    :raises ValueError: for an unknown name, a transport given with ``backend="ray"``, or
        ``"linux"`` where it cannot run.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    if backend != "local":
        if transport != "auto":
            raise ValueError(
                f"transport={transport!r} picks how local workers are reached; "
                f"backend={backend!r} has its own"
            )
        return transport
    wanted, source = transport, f"transport={transport!r}"
    if transport == "auto" and os.environ.get(TRANSPORT_VAR):
        wanted, source = os.environ[TRANSPORT_VAR], f"{TRANSPORT_VAR}={os.environ[TRANSPORT_VAR]}"
        if wanted not in TRANSPORTS:
            raise ValueError(f"{source}: the environment variable must be one of {TRANSPORTS}")
    missing = linux_transport_missing()
    if wanted == "linux" and missing is not None:
        raise ValueError(
            f"{source} needs {missing}, which {platform.system()} on {platform.machine()} lacks: "
            "leave transport='auto' (the portable transport here) or pass transport='portable'"
        )
    if wanted == "auto":
        return "portable" if missing is not None else "linux"
    return wanted


def default_codecs(obs_leaves: list[Leaf]) -> tuple[Codec | None, ...] | None:
    """The Ray backend's codec per observation leaf when the user chose none: ``delta`` with zstd
    (lossless; 868-1,188x on Atari frames) for leaves of at least :data:`SMALL_LEAF_BYTES`, else
    the next of :data:`RAY_CODEC_ORDER` that is installed; small leaves raw (object leaves travel
    pickled in the reply). None when every leaf stays raw."""
    from shmvec.codecs import available, get

    installed = available()
    name = next((n for n in RAY_CODEC_ORDER if n in installed), None)
    if name is None:
        return None
    # On a network link bytes, not CPU, are the limit: delta with zstd (~10% smaller than delta's
    # default lz4 on Atari frames).
    params = {"backend": "zstd"} if name == "delta" else {}
    codecs = tuple(
        get(name, **params) if leaf.fixed and leaf.nbytes >= SMALL_LEAF_BYTES else None for leaf in obs_leaves
    )
    return None if all(c is None for c in codecs) else codecs


__all__ = [
    "BACKENDS",
    "TRANSPORTS",
    "TRANSPORT_VAR",
    "can_pin",
    "check_backend",
    "choose_transport",
    "default_codecs",
    "has_procfs",
    "linux_transport_missing",
    "supported",
]
