"""The recording tape: a shared-memory side buffer that workers write records into while a recording
is on (render frames for videos, steps for datasets), and that one reader in the main process (a
thread) or a side process consumes (:mod:`shmvec.recorder`).

One segment, apart from the ring, holds for each recorded env (a row of the tape) ``depth`` records
in a circle and three counters:

============  ==========================  ===============================================
field         shape                       written by
============  ==========================  ===============================================
``head``      ``(n,)`` int64              the worker: records written (committed)
``tail``      ``(n,)`` int64              the reader: records consumed
``want``      ``(n,)`` int64              the main process: what the next capture is for
                                          (a video clip's tag; 0: no capture)
``mark``      ``(n, depth)`` int64        the worker: what each record is (the tap's meaning)
``step``      ``(n, depth)`` int64        the worker: its step count when it wrote the record
``<name>``    ``(n, depth, *shape)``      the worker: the record's arrays (a frame, a step)
============  ==========================  ===============================================

A writer fills record ``head % depth`` and then advances ``head``; the reader reads records below
``head`` and then advances ``tail``. Each counter has one writer, and each is stored after the data
it guards (x86's store order; a record is never read before its ``head``). A full row (``head -
tail == depth``) is the writer's to handle (:meth:`Tape.room`). The counters are read and written
through memoryviews: Python ints, no array allocated per step.

The main process creates and unlinks the segment (named as the ring's, so leak checks see it);
workers and the side process only attach.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

from shmvec.memory.ring import Field, aligned, attach_untracked, check_free_space, map_segment, segment_name

_COUNTERS = ("head", "tail", "want")
_MARK, _STEP = "mark", "step"


@dataclass(frozen=True)
class TapeSpec:
    """What a worker or side process needs to attach (small, picklable).

    :param shm_name: the segment's name.
    :param size: its size in bytes.
    :param fields: the field table.
    :param env_ids: the global env index of each row.
    :param depth: records per row.
    """

    shm_name: str
    size: int
    fields: tuple[Field, ...]
    env_ids: tuple[int, ...]
    depth: int

    def record_fields(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """The record arrays, by name: one record's shape and dtype."""
        return {
            f.name: (f.shape[2:], np.dtype(f.dtype))
            for f in self.fields
            if f.name not in _COUNTERS and f.name not in (_MARK, _STEP)
        }


class Tape:
    """Numpy views (and counter memoryviews) over one tape segment. :meth:`create` in the main
    process, :meth:`attach` elsewhere."""

    def __init__(self, spec: TapeSpec, shm: shared_memory.SharedMemory, owner: bool) -> None:
        self.spec, self._owner = spec, owner
        self._shm: shared_memory.SharedMemory | None = shm
        self._mm = map_segment(shm, spec.size)
        base = np.frombuffer(self._mm, dtype=np.uint8)
        self.views: dict[str, np.ndarray] = {
            f.name: base[f.offset : f.offset + f.nbytes].view(np.dtype(f.dtype)).reshape(f.shape)
            for f in spec.fields
        }
        self.head, self.tail, self.want = (memoryview(self.views[name]) for name in _COUNTERS)  # type: ignore[arg-type]
        self.mark, self.step = self.views[_MARK], self.views[_STEP]
        self.rows = {env: r for r, env in enumerate(spec.env_ids)}
        self.depth = spec.depth

    @classmethod
    def create(
        cls,
        records: Sequence[tuple[str, tuple[int, ...], np.dtype]],
        env_ids: Sequence[int],
        depth: int,
    ) -> Tape:
        """A zeroed tape of ``depth`` records per env of ``env_ids``, each record holding the arrays
        ``records`` names (``(name, shape, dtype)``).

        :raises SharedMemoryTooSmallError: when it does not fit in ``/dev/shm``.
        """
        n = len(env_ids)
        wanted: list[tuple[str, tuple[int, ...], np.dtype]] = [
            (name, (n,), np.dtype(np.int64)) for name in _COUNTERS
        ]
        wanted += [(_MARK, (n, depth), np.dtype(np.int64)), (_STEP, (n, depth), np.dtype(np.int64))]
        wanted += [(name, (n, depth, *shape), np.dtype(dtype)) for name, shape, dtype in records]
        fields, offset = [], 0
        for name, shape, dtype in wanted:
            offset = aligned(offset)
            fields.append(Field(name, tuple(int(s) for s in shape), dtype.str, offset))
            offset += fields[-1].nbytes
        size = max(offset, 1)
        check_free_space(size)
        shm = shared_memory.SharedMemory(create=True, size=size, name=segment_name())
        spec = TapeSpec(shm.name, size, tuple(fields), tuple(int(e) for e in env_ids), depth)
        return cls(spec, shm, owner=True)

    @classmethod
    def attach(cls, spec: TapeSpec) -> Tape:
        """Map an existing tape (a worker or the side process); it never unlinks it."""
        return cls(spec, attach_untracked(spec.shm_name), owner=False)

    def room(self, row: int) -> bool:
        """Whether row ``row`` has a free record for the writer."""
        return self.head[row] - self.tail[row] < self.depth

    def record(self, name: str, row: int, index: int) -> np.ndarray:
        """Array ``name`` of record ``index`` (a count, taken modulo the depth) of row ``row``."""
        return self.views[name][row, index % self.depth, ...]  # a view even for a scalar record

    def commit(self, row: int, mark: int, step: int) -> None:
        """The writer's record at ``head`` is complete: give it its mark and step, then publish it."""
        index = self.head[row]
        slot = index % self.depth
        self.mark[row, slot] = mark
        self.step[row, slot] = step
        self.head[row] = index + 1

    def close(self) -> None:
        """Drop the views and unmap; the owner also unlinks the segment. Safe to call twice."""
        shm, self._shm = self._shm, None
        if shm is None:
            return
        for view in (self.head, self.tail, self.want):
            view.release()
        self.views = {}
        self.mark = self.step = np.zeros(0)
        self._mm = None  # type: ignore[assignment]  # unmapped once no array references it
        if self._owner:
            with contextlib.suppress(FileNotFoundError):
                shm.unlink()
        shm.close()


# What a record's mark means. A video tape: a frame of clip ``tag`` (> 0); ``-tag``: clip ``tag``
# ends here (no frame); ``cut(tag)``: clip ``tag`` ends here, cut short (a frame could not be
# captured, or the tape stayed full). A step tape: a step, or the reset that starts an episode;
# ``| EXPLICIT`` on a reset: the env's ``reset()`` was asked for (not an autoreset) by a worker that
# had written records of that env already, so an episode it cuts short ends there, truncated.
STEP, RESET, RESET_SEEDED = 0, 1, 2
EXPLICIT = 4
_CUT = 1 << 40


def cut(tag: int) -> int:
    """The mark that ends clip ``tag`` cut short."""
    return -tag - _CUT


def clip_of(mark: int) -> tuple[int, bool, bool]:
    """A video record's ``(tag, ends the clip, cut short)``."""
    if mark > 0:
        return mark, False, False
    if mark <= -_CUT:
        return -mark - _CUT, True, True
    return -mark, True, False
