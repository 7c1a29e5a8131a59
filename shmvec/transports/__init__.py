"""Transports: how the engine reaches its workers.

``"local"`` (the default): worker processes on this machine, the ring's doorbell and a pipe each
(:mod:`shmvec.transports.local`). ``"ray"``: each worker is a Ray actor, possibly on another
machine; observations travel encoded by the codecs as Ray return values
(:mod:`shmvec.transports.ray`). Both implement the contract of :mod:`shmvec.transports.base` and
serve the same commands with the same worker code (:mod:`shmvec.worker`), so neither the engine
nor the faces know which one runs.

This module imports no Ray: the local backend never loads it. Nothing here imports the engine
(arrows point down); the engine picks the transport (:func:`shmvec.engine.build.make_transport`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shmvec.memory.layout import Leaf

if TYPE_CHECKING:
    from shmvec.codecs import Codec

BACKENDS = ("local", "ray")

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


__all__ = ["BACKENDS", "check_backend", "default_codecs"]
