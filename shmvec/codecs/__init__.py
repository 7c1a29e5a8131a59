"""Observation codecs: a registry of named codecs and how to pick one per observation leaf.

``available()`` lists the codecs whose libraries are installed; ``get(name, **params)`` builds one.
Built-ins: ``raw``, ``lz4``, ``zstd`` (``level``), ``delta`` (``backend``, ``level``, ``key_every``),
``png`` (``level``), ``jpeg`` (``quality``), ``webp`` (``quality``, when OpenCV has it). Codec modules
are imported on first use, so importing this package (which workers do) loads no compression library.
:class:`Tolerance` is what a user accepts from a lossy one (``ShmVecEnv(..., tolerance=...)``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from shmvec.codecs.base import Codec, CodecError
from shmvec.codecs.tolerance import Tolerance

# name -> ("module:Class", modules that must import for it to work)
_BUILTIN: dict[str, tuple[str, tuple[str, ...]]] = {
    "raw": ("shmvec.codecs.raw:RawCodec", ()),
    "lz4": ("shmvec.codecs.byte:LZ4Codec", ("lz4.block",)),
    "zstd": ("shmvec.codecs.byte:ZstdCodec", ("zstandard",)),
    "delta": ("shmvec.codecs.delta:DeltaCodec", ("zstandard", "lz4.block", "numba")),
    "png": ("shmvec.codecs.image:PNGCodec", ("cv2",)),
    "jpeg": ("shmvec.codecs.image:JPEGCodec", ("cv2",)),
    "webp": ("shmvec.codecs.image:WebPCodec", ("cv2",)),
}
_USER: dict[str, Callable[..., Codec]] = {}

CodecSpec = str | Codec | Mapping[str, "str | Codec | None"] | None


def register(name: str, factory: Callable[..., Codec]) -> None:
    """Make ``get(name, **params)`` call ``factory(**params)`` (your own codec class, for example)."""
    _USER[name] = factory


def _load(name: str) -> Callable[..., Codec]:
    if name in _USER:
        return _USER[name]
    module, _, attr = _BUILTIN[name][0].partition(":")
    return getattr(importlib.import_module(module), attr)


def _installed(name: str) -> bool:
    if name in _USER:
        return True
    try:
        for module in _BUILTIN[name][1]:
            importlib.import_module(module)
    except ImportError:
        return False
    if name == "webp":
        from shmvec.codecs.image import webp_available

        return webp_available()
    return True


def available() -> list[str]:
    """Names of the codecs that can be built here (their libraries import)."""
    return [name for name in [*_BUILTIN, *_USER] if _installed(name)]


#: What ``pip install "shmvec[codecs]"`` installs, and so which codecs it makes available.
EXTRA_PACKAGES = ("lz4", "zstandard", "numba", "opencv-python-headless")


def missing() -> list[str]:
    """Names of the built-in codecs that cannot be built here because a library is not installed
    (``pip install "shmvec[codecs]"`` installs them all: :data:`EXTRA_PACKAGES`)."""
    return [name for name in _BUILTIN if not _installed(name)]


def get(name: str, **params: Any) -> Codec:
    """Build the codec ``name`` with ``params`` (see each codec's class for its parameters).

    :raises ValueError: for an unknown name or a codec whose library is missing.
    """
    if name not in _BUILTIN and name not in _USER:
        raise ValueError(f"unknown codec {name!r}; available: {', '.join(available())}")
    if not _installed(name):
        # shmvec.errors.install_hint's words: the codecs import nothing else of shmvec.
        raise ValueError(
            f'codec {name!r} needs a library that is not installed: pip install -e ".[codecs]" '
            '(in a clone of shmvec; once released: pip install "shmvec[codecs]")'
        )
    return _load(name)(**params)


def parse(text: str) -> Codec:
    """Build a codec from ``"name"`` or ``"name:param=value:param=value"`` (numbers become int/float),
    e.g. ``"jpeg:quality=30"``, ``"delta:backend=lz4"``."""
    name, *items = text.split(":")
    params: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"codec parameter {item!r} in {text!r} should be key=value")
        for convert in (int, float, str):
            try:
                params[key] = convert(value)
                break
            except ValueError:
                continue
    return get(name, **params)


def per_leaf(
    spec: CodecSpec, leaf_names: list[str], leaf_specs: list[tuple[tuple[int, ...], np.dtype]]
) -> list[Codec | None]:
    """The codec of each observation leaf for a ``ShmVecEnv(codec=...)`` argument.

    A name or a :class:`Codec` applies to every leaf; a mapping names leaves by Dict key (nested
    keys joined by ``.``, as in error messages) and leaves the others raw. Every chosen codec is
    checked against its leaf's shape and dtype here, before any worker encodes.

    :raises ValueError: for a key that is not a leaf, or a codec that cannot take its leaf.
    """
    if spec is None:
        return [None] * len(leaf_names)
    if isinstance(spec, Mapping):
        unknown = [k for k in spec if k not in leaf_names]
        if unknown:
            raise ValueError(
                f"codec mapping names {unknown[0]!r}, not an observation key; keys: {leaf_names}"
            )
        chosen = [spec.get(name) for name in leaf_names]
    else:
        chosen = [spec] * len(leaf_names)
    out: list[Codec | None] = []
    for name, item, (shape, dtype) in zip(leaf_names, chosen, leaf_specs):
        codec = get(item) if isinstance(item, str) else item
        if codec is not None and not isinstance(codec, Codec):
            raise TypeError(f"codec for {name!r} must be a name or a Codec, got {type(codec).__name__}")
        if codec is not None:
            try:
                codec.check(shape, dtype)
            except CodecError as exc:
                raise ValueError(f"observation key {name!r}: {exc}") from None
        out.append(codec)
    return out


__all__ = [
    "EXTRA_PACKAGES",
    "Codec",
    "CodecError",
    "CodecSpec",
    "Tolerance",
    "available",
    "get",
    "missing",
    "parse",
    "per_leaf",
    "register",
]
