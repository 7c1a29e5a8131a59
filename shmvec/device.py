"""``device=``: observations as torch tensors, straight from the ring.

Both faces take ``device`` (and ``device_fields``, ``pin_memory``: see
:class:`~shmvec.engine.options.Options`). The engine makes one converter when it starts
(:func:`device_for`) and closes it in its one teardown path; the faces pass each batch's
observation leaves through it just before assembling the observation. With ``device=None`` nothing
here runs and torch is never imported.

- ``"cpu"``: :class:`HostTensors`. ``torch.from_numpy`` over the very arrays the engine hands out:
  no copy, and the lending rules stay those of the arrays (a tensor references its array, so a lent
  ring slot stays lent while the tensor, or anything made from its memory, lives).
- ``"cuda[:N]"``: :class:`CudaCopies`. The ring's pages are registered with CUDA once
  (:mod:`shmvec.pinning`); each batch is copied on a side stream with ``non_blocking=True`` and the
  stream that was current at ``step``/``recv`` waits on the copy's event, so the call returns before
  the copy ends. The slot read is fenced (:meth:`shmvec.engine.slots.Slots.fence`): the workers do
  not write it before the event completed.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from shmvec.engine.options import Options
    from shmvec.engine.slots import Slots
    from shmvec.engine.startup import Layout
    from shmvec.memory.layout import Leaf
    from shmvec.memory.ring import Ring
    from shmvec.pinning import Pinned

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
        raise TypeError(f"device_fields must be a list of names from {FIELDS}, e.g. ['rewards'], got {fields!r}")
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
    torch = _import_torch()
    if not isinstance(device, str | torch.device):
        raise TypeError(f"device must be a string such as 'cpu' or 'cuda:0', or a torch.device, got {device!r}")
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
        raise ValueError(f"device={device!r}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}")


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError("device= returns torch tensors: pip install torch") from None
    return torch


def device_for(options: Options, layout: Layout, slots: Slots) -> HostTensors | None:
    """The converter of an engine whose ring is laid out (None without ``device``)."""
    if options.device is None:
        return None
    torch = _import_torch()
    device = torch.device(options.device)
    fields = tuple(options.device_fields)
    if device.type == "cpu":
        return HostTensors(layout.obs_leaves, fields)
    ring, raw = layout.ring, layout.reader.raw
    return CudaCopies(layout.obs_leaves, fields, device, ring, raw, slots, options.copy, options.pin_memory)


class HostTensors:
    """``device="cpu"``: every fixed-size observation leaf as a tensor over the same memory
    (``torch.from_numpy``); leaves without a fixed size (Text, Graph...) stay as the face gives them.

    :param leaves: the observation leaves.
    :param fields: the ``device_fields``.
    """

    def __init__(self, leaves: list[Leaf], fields: Sequence[str]) -> None:
        import torch

        self.torch = torch
        self.fields = frozenset(fields)
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
        # torch warns once per process that a read-only array (copy=False) makes a writable tensor;
        # the guide says what not to do with them instead. Spend that one warning here.
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
        return self.small_leaves(arrays) if "final_obs" in self.fields else arrays

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

    def field(self, name: str, array: np.ndarray) -> Any:
        """``array`` (fresh: rewards or flags) as a tensor when ``device_fields`` names ``name``."""
        return self.tensor(array) if name in self.fields else array

    def close(self) -> None:
        """Release what the converter holds (nothing on the CPU)."""


class CudaCopies(HostTensors):
    """A CUDA ``device``: each batch copied on a side stream, overlapping what the caller does next.

    :param leaves: the observation leaves.
    :param fields: the ``device_fields``.
    :param device: the CUDA device.
    :param ring: the engine's ring (registered with CUDA unless ``pin_memory=False``).
    :param raw: the leaves kept raw in the ring's slots (the others are decoded or gathered into
        memory of the main process: copied from pageable memory).
    :param slots: the ring's slots (a slot being copied from is fenced with the copy's event).
    :param copy: True: each batch in fresh device memory the caller owns; False: two device buffers
        used in turn, valid until the next-but-one batch (as ``copy=False`` views).
    :param pin_memory: see :class:`~shmvec.engine.options.Options`.
    """

    def __init__(
        self,
        leaves: list[Leaf],
        fields: Sequence[str],
        device: Any,
        ring: Ring,
        raw: list[int],
        slots: Slots,
        copy: bool,
        pin_memory: bool | None,
    ) -> None:
        super().__init__(leaves, fields)
        from shmvec.pinning import pin_ring

        torch = self.torch
        index = torch.cuda.current_device() if device.index is None else device.index
        self.device = torch.device("cuda", index)
        self.stream = torch.cuda.Stream(self.device)
        self.slots, self.copy = slots, copy
        self.turn = 0
        self.buffers: list[dict[int, Any]] = [{}, {}]  # copy=False: the two device buffers per leaf
        self.pinned: Pinned | None = pin_ring(ring, pin_memory, self.stream)
        # Per leaf read straight from the ring: where its slots lie (to fence the slot a copy reads).
        self.extents: dict[int, tuple[int, int, int]] = {}
        if self.pinned is not None:
            for j in raw:
                whole = ring.obs(j)
                start = int(whole.__array_interface__["data"][0])
                self.extents[j] = (start, start + whole.nbytes, whole.nbytes // whole.shape[0])

    def obs(self, arrays: list[Any]) -> list[Any]:
        """The leaves of a batch on the GPU; the current stream waits for their copy."""
        torch = self.torch
        consumer = torch.cuda.current_stream(self.device)
        side = self.stream
        kept = None
        if not self.copy:
            kept, self.turn = self.buffers[self.turn], 1 - self.turn
            # The buffers' last readers were queued on the caller's stream before this call.
            side.wait_stream(consumer)
        out = list(arrays)
        slot = None
        with torch.cuda.stream(side):
            for j in self.fixed:
                src = torch.from_numpy(arrays[j])
                extent = self.extents.get(j)
                if extent is not None and extent[0] <= src.data_ptr() < extent[1]:
                    slot = (src.data_ptr() - extent[0]) // extent[2]
                if kept is None:
                    dst = torch.empty(src.shape, dtype=src.dtype, device=self.device)
                    dst.record_stream(consumer)  # freed only once the caller's stream is done with it
                else:
                    dst = kept.get(j)
                    if dst is None or dst.shape != src.shape:
                        dst = kept[j] = torch.empty(src.shape, dtype=src.dtype, device=self.device)
                dst.copy_(src, non_blocking=True)
                out[j] = dst
        done = torch.cuda.Event()
        done.record(side)
        consumer.wait_event(done)
        if slot is not None:
            self.slots.fence(slot, done)
        return out

    def tensor(self, array: np.ndarray) -> Any:
        """A fresh host array on the GPU, copied in the caller's stream."""
        return self.torch.from_numpy(np.asarray(array)).to(self.device, non_blocking=True)

    def close(self) -> None:
        """Wait for the copies in flight, then unregister the ring's pages."""
        if self.pinned is not None:
            self.pinned.release()
            self.pinned = None
