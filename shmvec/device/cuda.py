"""``device="cuda[:N]"``: each batch copied to the GPU on a side stream, from the ring registered once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from shmvec.device.cpu import HostTensors

if TYPE_CHECKING:
    from shmvec.device.pinning import Pinned
    from shmvec.memory.layout import Leaf
    from shmvec.memory.ring import Ring


class CudaCopies(HostTensors):
    """A CUDA ``device``: each batch copied on a side stream, overlapping what the caller does next.

    :param leaves: the observation leaves.
    :param fields: the ``device_fields``.
    :param device: the CUDA device.
    :param ring: the engine's ring (registered with CUDA unless ``pin_memory=False``).
    :param raw: the leaves kept raw in the ring's slots (the others are decoded or gathered into
        memory of the main process: copied from pageable memory).
    :param fence: ``fence(slot, event)``: the ring slot a copy reads must not be written before
        ``event`` completed (:meth:`shmvec.engine.slots.Slots.fence`).
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
        fence: Callable[[int, Any], None],
        copy: bool,
        pin_memory: bool | None,
    ) -> None:
        super().__init__(leaves, fields, copy)
        from shmvec.device.pinning import pin_ring

        torch = self.torch
        index = torch.cuda.current_device() if device.index is None else device.index
        self.device = torch.device("cuda", index)
        self.stream = torch.cuda.Stream(self.device)
        self.fence, self.copy = fence, copy
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
            self.fence(slot, done)
        return out

    def tensor(self, array: np.ndarray) -> Any:
        """A fresh host array on the GPU, copied in the caller's stream."""
        return self.torch.from_numpy(np.asarray(array)).to(self.device, non_blocking=True)

    def close(self) -> None:
        """Wait for the copies in flight, then unregister the ring's pages."""
        if self.pinned is not None:
            self.pinned.release()
            self.pinned = None
