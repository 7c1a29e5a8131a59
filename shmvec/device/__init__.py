"""``device=``: observations as torch tensors, straight from the ring.

Both faces take ``device`` (and ``device_fields``, ``pin_memory``: see
:class:`~shmvec.engine.options.Options`). The engine makes one converter when it starts
(:func:`shmvec.engine.startup.converter`) and closes it in its one teardown path; the faces pass
each batch's observation leaves through it just before assembling the observation. With
``device=None`` nothing here runs and torch is never imported. This package imports only
``shmvec.memory``: the engine imports it, never the other way.

- ``"cpu"``: :class:`~shmvec.device.cpu.HostTensors`. ``torch.from_numpy`` over the very arrays the
  engine hands out: no copy, and the lending rules stay those of the arrays (a tensor references
  its array, so a lent ring slot stays lent while the tensor, or anything made from its memory,
  lives).
- ``"cuda[:N]"``: :class:`~shmvec.device.cuda.CudaCopies`. The ring's pages are registered with
  CUDA once (:mod:`shmvec.device.pinning`); each batch is copied on a side stream with
  ``non_blocking=True`` and the stream that was current at ``step``/``recv`` waits on the copy's
  event, so the call returns before the copy ends. The slot read is fenced
  (:meth:`shmvec.engine.slots.Slots.fence`): the workers do not write it before the event completed.
"""

from __future__ import annotations

from shmvec.device.checks import FIELDS, check_device, import_torch
from shmvec.device.cpu import HostTensors

__all__ = ["FIELDS", "HostTensors", "check_device", "import_torch"]
