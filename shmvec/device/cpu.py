"""``device="cpu"``: observation leaves as tensors over the arrays the engine hands out (no copy)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from shmvec.memory.layout import Leaf


class HostTensors:
    """``device="cpu"``: every fixed-size observation leaf as a tensor over the same memory
    (``torch.from_numpy``); leaves without a fixed size (Text, Graph...) stay as the face gives them.

    :param leaves: the observation leaves.
    :param fields: the ``device_fields``.
    :param copy: the engine's ``copy`` (False: the arrays are read-only views of the ring).
    """

    def __init__(self, leaves: list[Leaf], fields: Sequence[str], copy: bool) -> None:
        import torch

        self.torch = torch
        self.moved = frozenset(fields)  # the device_fields
        self.fixed = [j for j, leaf in enumerate(leaves) if leaf.fixed]
        self.every_leaf = len(self.fixed) == len(leaves)
        for j in self.fixed:
            try:
                torch.from_numpy(np.zeros(0, leaves[j].dtype))
            except TypeError:
                raise ValueError(
                    f"observation key {leaves[j].name or '(the observation)'!r} has dtype {leaves[j].dtype}, "
                    "which torch tensors cannot hold; use device=None"
                ) from None
        if copy:
            return
        # torch warns once per process that a read-only array makes a writable tensor, at the first
        # batch; the Options docstring and the guide say not to write them instead. Spend it here.
        readonly = np.zeros(1)
        readonly.flags.writeable = False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            torch.from_numpy(readonly)

    def obs(self, arrays: list[Any]) -> list[Any]:
        """The observation leaves of a batch as tensors (no copy)."""
        from_numpy = self.torch.from_numpy
        if self.every_leaf:
            return [from_numpy(a) for a in arrays]
        out = list(arrays)
        for j in self.fixed:
            out[j] = from_numpy(arrays[j])
        return out

    def final(self, arrays: list[Any]) -> list[Any]:
        """Terminal observation leaves (copies already): tensors with ``"final_obs"``, else as given."""
        return self.small_leaves(arrays) if "final_obs" in self.moved else arrays

    def small_leaves(self, arrays: list[Any]) -> list[Any]:
        """Leaves of a few envs (terminal observations) on the device, copied in the caller's stream."""
        out = list(arrays)
        for j in self.fixed:
            out[j] = self.tensor(arrays[j])
        return out

    def tensor(self, array: np.ndarray) -> Any:
        """A fresh array (rewards, flags, a terminal observation; a 0-d leaf of one env may be a numpy
        scalar) as a tensor on the device."""
        return self.torch.from_numpy(np.asarray(array))

    def fields(self, rewards: np.ndarray, *flags: np.ndarray) -> tuple[Any, ...]:
        """A step's rewards and flags (fresh arrays) as given, or as tensors on the device where
        ``device_fields`` names ``"rewards"`` / ``"flags"``."""
        move_flags = "flags" in self.moved
        return (
            self.tensor(rewards) if "rewards" in self.moved else rewards,
            *(self.tensor(f) if move_flags else f for f in flags),
        )

    def close(self) -> None:
        """Release what the converter holds (nothing on the CPU)."""
