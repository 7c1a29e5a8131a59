"""Checks of ``device``, ``device_fields`` and ``pin_memory``, before any worker starts."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

#: What ``device_fields`` may name besides the observations, which always move.
FIELDS = ("rewards", "flags", "final_obs")


def check_device(device: Any, fields: Any, pin_memory: Any) -> None:
    """Check ``device``, ``device_fields`` and ``pin_memory`` before any worker starts; torch is
    imported only when ``device`` is given.

    :raises ValueError: for a device that is not ``"cpu"``/``"cuda[:N]"``, a CUDA device this
        machine does not have, an unknown field, or ``device_fields``/``pin_memory`` without a
        device that uses them.
    :raises TypeError: for values of the wrong type.
    :raises ImportError: when ``device`` is given and torch is not installed.
    """
    if isinstance(fields, str) or not isinstance(fields, Sequence | frozenset | set):
        raise TypeError(
            f"device_fields must be a list of names from {FIELDS}, e.g. ['rewards'], got {fields!r}"
        )
    for name in fields:
        if name not in FIELDS:
            close = difflib.get_close_matches(str(name), FIELDS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"device_fields: unknown field {name!r} (valid: {', '.join(FIELDS)}){hint}")
    if pin_memory is not None and not isinstance(pin_memory, bool):
        raise TypeError(f"pin_memory must be True, False or None, got {pin_memory!r}")
    if device is None:
        if fields:
            raise ValueError(f"device_fields={list(fields)} needs device= (where they should go)")
        if pin_memory is not None:
            raise ValueError("pin_memory applies to device='cuda'; without device= nothing is copied")
        return
    torch = import_torch()
    if not isinstance(device, str | torch.device):
        raise TypeError(
            f"device must be a string such as 'cpu' or 'cuda:0', or a torch.device, got {device!r}"
        )
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if parsed.type == "cpu":
        if pin_memory is not None:
            raise ValueError("pin_memory applies to device='cuda'; device='cpu' copies nothing")
        return
    if parsed.type != "cuda":
        raise ValueError(f"device={device!r}: shmvec moves observations to 'cpu' or 'cuda' devices only")
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else "built for CUDA, but no GPU is visible"
        raise ValueError(
            f"device={device!r} needs CUDA, but torch.cuda.is_available() is False (torch "
            f"{torch.__version__} is {build}); use device='cpu' or device=None"
        )
    count = torch.cuda.device_count()
    if parsed.index is not None and parsed.index >= count:
        raise ValueError(
            f"device={device!r}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}"
        )


def import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError("device= returns torch tensors: pip install torch") from None
    return torch
