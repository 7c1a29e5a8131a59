"""The shared-memory block: one batched array per field, laid out once, reused every step.

One ``SharedMemory`` segment holds every field of the ring:

==============  ===================================  =========================================
field           shape                                written by
==============  ===================================  =========================================
``obs<j>``      ``(n_slots, n_envs, *leaf_j.shape)``  workers: observation leaf j of each step
``final<j>``    ``(n_envs, *leaf_j.shape)``           workers: terminal observation before reset
``rewards``     ``(n_slots, n_envs)`` float64         workers (float64 keeps the env's value exact)
``terminated``  ``(n_slots, n_envs)`` bool            workers
``truncated``   ``(n_slots, n_envs)`` bool            workers
``actions``     ``(n_envs, *action_shape)``           main, when the action space is array-shaped
``infowords``   ``(n_slots, n_envs, 8)`` uint64       workers: typed info values (see memory.infos)
``infomask``    ``(n_slots, n_envs)`` uint8           workers: 1 where the info's values are typed
``bellctl``     ``(16 + 16k,)`` uint32                the doorbell's shared words (memory.doorbell)
``bellcmd``     ``(n_workers, 4)`` uint32             main: each worker's command words
``bellack``     ``(n_workers, 4)`` uint32             workers: what each one last finished
==============  ===================================  =========================================

An object leaf (``Leaf.fixed`` False: Text, Sequence, Graph, ...) has no field at all: its values
travel pickled in the workers' replies.

A leaf with a codec (``ShmVecEnv(codec=...)``; the ring knows only each encoded leaf's
:class:`EncodedSize`, never the codec) has no ``obs<j>``/``final<j>``; instead, for the
step's observation (prefix ``""``) and the terminal one (prefix ``"f"``), see
:mod:`shmvec.worker.encoder`: ``<p>enc<j>`` ``(n_envs, bound)`` uint8 encoded bytes (each env's row
sized by the codec's worst case), ``<p>len<j>`` ``(n_envs,)`` byte counts, ``<p>crc<j>`` ``(n_envs,)``
checksums of sampled raw observations (-1: not sampled) and, for a lossy codec, ``<p>sample<j>``
``(n_envs, *shape)`` the sampled raw observations. These have no slot dimension: the main process
decodes them in the ``step_wait``/``reset`` that reports them.

The slot index advances on every ``reset``/``step``. With ``copy=False`` the arrays returned
``n_slots - 1`` calls ago are not overwritten yet; with ``copy=True`` a slot is lent to the caller
and skipped until nothing references its arrays any more (see ``ShmVecEnv``). Terminal
observations have a single area: the main process copies them out in the same ``step_wait`` that
reports them.

The owner (main process) creates and unlinks the segment; workers only attach. Each field starts on
a 64-byte boundary so leaves never share a cache line across envs written by different workers.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from shmvec.errors import SharedMemoryTooSmallError
from shmvec.memory.layout import Leaf

_ALIGN = 64
_SHM_DIR = "/dev/shm"

# Field names live here only: everyone else asks the Ring for its arrays by meaning.
_REWARDS, _TERMINATED, _TRUNCATED, _ACTIONS = "rewards", "terminated", "truncated", "actions"
_ENCODED_PARTS = ("enc", "len", "crc", "sample")
_INFO_WORDS, _INFO_MASK = "infowords", "infomask"
_BELL_CTL, _BELL_CMD, _BELL_ACK = "bellctl", "bellcmd", "bellack"


def bell_words(n_workers: int) -> int:
    """Size of the doorbell's shared words: one cache line for the bell, then one pending bit per
    worker in whole cache lines, so the words the main process writes and the ones the workers
    clear never share one (see memory.doorbell for their meaning)."""
    bit_words = -(-n_workers // 32)
    return 16 + 16 * -(-bit_words // 16)


def _obs_field(j: int) -> str:
    return f"obs{j}"


def _final_field(j: int) -> str:
    return f"final{j}"


def _encoded_field(part: str, j: int, terminal: bool) -> str:
    return f"{'f' if terminal else ''}{part}{j}"


@dataclass(frozen=True)
class EncodedSize:
    """What the ring needs to know of an encoded leaf: its worst-case bytes per env (the codec's
    bound) and whether the codec is lossless (a lossy one also keeps raw samples for checks)."""

    max_bytes: int
    lossless: bool


@dataclass(frozen=True)
class Field:
    """One array in the segment: its name, shape, dtype string and byte offset."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class RingSpec:
    """Everything a worker needs to attach: segment name, size and field table (small, picklable)."""

    shm_name: str
    size: int
    fields: tuple[Field, ...]
    n_slots: int
    n_obs_leaves: int


def plan_fields(
    obs_leaves: list[Leaf],
    n_envs: int,
    n_slots: int,
    action_leaf: Leaf | None,
    encoded: Sequence[EncodedSize | None] | None = None,
    info_columns: int = 0,
    n_workers: int = 0,
) -> tuple[list[tuple[str, tuple[int, ...], np.dtype]], int]:
    """The ring's fields and the segment size in bytes, before anything is allocated.

    :param encoded: per observation leaf, its :class:`EncodedSize` (None: raw arrays); None for no
        encoded leaf at all.
    :param info_columns: 8-byte typed info values per env and slot (0: no info fields).
    :param n_workers: local worker processes woken through the ring's doorbell (0: none, e.g. a Ray
        actor's private ring).
    """
    wanted: list[tuple[str, tuple[int, ...], np.dtype]] = []
    for j, leaf in enumerate(obs_leaves):
        if not leaf.fixed:
            continue
        size = encoded[j] if encoded else None
        if size is None:
            wanted.append((_obs_field(j), (n_slots, n_envs, *leaf.shape), leaf.dtype))
            wanted.append((_final_field(j), (n_envs, *leaf.shape), leaf.dtype))
            continue
        # Rows rounded up to the alignment so envs of different workers never share a cache line.
        bound = aligned(size.max_bytes)
        for terminal in (False, True):
            wanted.append((_encoded_field("enc", j, terminal), (n_envs, bound), np.dtype(np.uint8)))
            wanted.append((_encoded_field("len", j, terminal), (n_envs,), np.dtype(np.int64)))
            wanted.append((_encoded_field("crc", j, terminal), (n_envs,), np.dtype(np.int64)))
            if not size.lossless:
                wanted.append((_encoded_field("sample", j, terminal), (n_envs, *leaf.shape), leaf.dtype))
    wanted.append((_REWARDS, (n_slots, n_envs), np.dtype(np.float64)))
    wanted.append((_TERMINATED, (n_slots, n_envs), np.dtype(bool)))
    wanted.append((_TRUNCATED, (n_slots, n_envs), np.dtype(bool)))
    if action_leaf is not None:
        wanted.append((_ACTIONS, (n_envs, *action_leaf.shape), action_leaf.dtype))
    if info_columns:
        wanted.append((_INFO_WORDS, (n_slots, n_envs, info_columns), np.dtype(np.uint64)))
        wanted.append((_INFO_MASK, (n_slots, n_envs), np.dtype(np.uint8)))
    if n_workers:
        wanted.append((_BELL_CTL, (bell_words(n_workers),), np.dtype(np.uint32)))
        wanted.append((_BELL_CMD, (n_workers, 4), np.dtype(np.uint32)))
        wanted.append((_BELL_ACK, (n_workers, 4), np.dtype(np.uint32)))
    total = 0
    for _, shape, dtype in wanted:
        total = aligned(total) + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return wanted, max(total, 1)


def aligned(offset: int) -> int:
    return (offset + _ALIGN - 1) // _ALIGN * _ALIGN


def check_free_space(size: int, directory: str = _SHM_DIR) -> None:
    """Refuse a ring that does not fit in ``/dev/shm``.

    tmpfs pages are only allocated when first written, so an oversized segment is created without
    complaint and the worker that later touches the missing page dies of SIGBUS. Checking up front
    turns that into a message that says what to change.

    :raises SharedMemoryTooSmallError: when ``size`` bytes exceed the free space of ``directory``.
    """
    if not os.path.isdir(directory):
        return
    stat = os.statvfs(directory)
    free = stat.f_bavail * stat.f_frsize
    if size > free:
        raise SharedMemoryTooSmallError(
            f"the shared-memory ring needs {size / 2**20:.1f} MiB but {directory} has only "
            f"{free / 2**20:.1f} MiB free (of {stat.f_blocks * stat.f_frsize / 2**20:.1f} MiB). "
            "Use fewer envs, smaller observations or n_slots=1 with copy=True, or give the container "
            "more shared memory (docker run --shm-size=2g, or a Kubernetes emptyDir with medium: Memory)."
        )


class Ring:
    """Numpy views over one shared-memory segment, in the owner or in a worker.

    Use :meth:`create` in the main process and :meth:`attach` in workers. ``views[name]`` is the
    array of a field (see the module docstring for names).
    """

    def __init__(self, spec: RingSpec, shm: shared_memory.SharedMemory, owner: bool) -> None:
        self.spec = spec
        self._shm: shared_memory.SharedMemory | None = shm
        self._owner = owner
        # Views go through a mapping of our own rather than shm.buf: numpy keeps a reference to its
        # buffer object but not a buffer export, so SharedMemory.close() would unmap memory under
        # live arrays (a segfault for copy=False users). This mapping is unmapped only when the last
        # array referencing it is garbage collected.
        self._mm: mmap.mmap | None = map_segment(shm, spec.size)
        fields = {f.name: f for f in spec.fields}
        # Per observation leaf: one slot's shape, dtype, first byte and size (lend_obs is per step).
        self._lend_plan = [
            None if f is None else (f.shape[1:], np.dtype(f.dtype), f.offset, f.nbytes // spec.n_slots)
            for f in (fields.get(_obs_field(j)) for j in range(spec.n_obs_leaves))
        ]
        base = np.frombuffer(self._mm, dtype=np.uint8)
        self.views: dict[str, np.ndarray] = {
            f.name: base[f.offset : f.offset + f.nbytes].view(np.dtype(f.dtype)).reshape(f.shape)
            for f in spec.fields
        }

    @classmethod
    def create(
        cls,
        obs_leaves: list[Leaf],
        n_envs: int,
        n_slots: int,
        action_leaf: Leaf | None,
        encoded: Sequence[EncodedSize | None] | None = None,
        info_columns: int = 0,
        n_workers: int = 0,
    ) -> Ring:
        """Allocate a zeroed segment for ``n_envs`` envs and ``n_slots`` slots (main process); see
        :func:`plan_fields` for the rest."""
        wanted, size = plan_fields(obs_leaves, n_envs, n_slots, action_leaf, encoded, info_columns, n_workers)
        check_free_space(size)
        shm = shared_memory.SharedMemory(create=True, size=size, name=segment_name())
        fields, offset = [], 0
        for name, shape, dtype in wanted:
            offset = aligned(offset)
            fields.append(Field(name, tuple(int(s) for s in shape), dtype.str, offset))
            offset += fields[-1].nbytes
        spec = RingSpec(shm.name, size, tuple(fields), n_slots, len(obs_leaves))
        return cls(spec, shm, owner=True)

    @classmethod
    def attach(cls, spec: RingSpec) -> Ring:
        """Map an existing segment (worker process). The worker never unlinks it."""
        return cls(spec, attach_untracked(spec.shm_name), owner=False)

    def obs(self, leaf_index: int) -> np.ndarray:
        """``(n_slots, n_envs, *shape)`` array of observation leaf ``leaf_index``."""
        return self.views[_obs_field(leaf_index)]

    def final(self, leaf_index: int) -> np.ndarray:
        """``(n_envs, *shape)`` terminal-observation array of leaf ``leaf_index``."""
        return self.views[_final_field(leaf_index)]

    def encoded(
        self, leaf_index: int, terminal: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """An encoded leaf's ``(bytes, byte counts, checksums, raw samples or None)`` arrays, of the
        step observation or (``terminal``) of the terminal one; see the module docstring."""
        enc, length, crc, sample = (
            self.views.get(_encoded_field(p, leaf_index, terminal)) for p in _ENCODED_PARTS
        )
        assert enc is not None and length is not None and crc is not None, "not an encoded leaf"
        return enc, length, crc, sample

    @property
    def rewards(self) -> np.ndarray:
        """``(n_slots, n_envs)`` float64 rewards."""
        return self.views[_REWARDS]

    @property
    def terminated(self) -> np.ndarray:
        """``(n_slots, n_envs)`` bool terminated flags."""
        return self.views[_TERMINATED]

    @property
    def truncated(self) -> np.ndarray:
        """``(n_slots, n_envs)`` bool truncated flags."""
        return self.views[_TRUNCATED]

    @property
    def actions(self) -> np.ndarray | None:
        """``(n_envs, *action_shape)`` typed action buffer, or None for actions sent by pipe."""
        return self.views.get(_ACTIONS)

    def takes_actions(self, actions: object) -> bool:
        """Whether ``actions`` (a batch, one row per env) can travel in the typed action buffer: only
        an array whose dtype and per-env shape already match, so every env sees exactly the object
        SubprocVecEnv would give it; anything else goes through the pipe."""
        buf = self.actions
        return (
            buf is not None
            and isinstance(actions, np.ndarray)
            and actions.dtype == buf.dtype
            and actions.shape[1:] == buf.shape[1:]
        )

    @property
    def info_words(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The typed info areas: ``(n_slots, n_envs, columns)`` uint64 values and ``(n_slots, n_envs)``
        uint8 flags (see :mod:`shmvec.memory.infos`), or None when the ring has none."""
        words, mask = self.views.get(_INFO_WORDS), self.views.get(_INFO_MASK)
        return None if words is None or mask is None else (words, mask)

    @property
    def bell(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The doorbell's shared words, each worker's command words and what each worker last
        finished (see :mod:`shmvec.memory.doorbell`), or None when the ring has no doorbell."""
        ctl = self.views.get(_BELL_CTL)
        if ctl is None:
            return None
        return ctl, self.views[_BELL_CMD], self.views[_BELL_ACK]

    def lend_obs(self, leaf_index: int, slot: int) -> np.ndarray:
        """A new array object over observation leaf ``leaf_index`` of ``slot``, for handing out.

        Its base is the mapping itself (not an ndarray), so numpy makes every view derived from it
        reference *it*: while its reference count is above what the lender holds, someone can still
        read the slot, and the slot must not be written.
        """
        plan = self._lend_plan[leaf_index]
        assert plan is not None, "an encoded leaf has no raw slots to lend"
        shape, dtype, offset, slot_bytes = plan
        return np.ndarray(shape, dtype, buffer=self._mm, offset=offset + slot * slot_bytes)

    @property
    def nbytes(self) -> int:
        return self.spec.size

    def close(self) -> None:
        """Drop the views, unmap, and (owner only) unlink the segment. Safe to call twice.

        Arrays handed out with ``copy=False`` may still reference the mapping: the segment is
        unlinked at once (nothing remains in ``/dev/shm``) and the memory is unmapped when the last of
        them is garbage collected.
        """
        if self._shm is None:
            return
        shm, self._shm = self._shm, None
        self.views = {}
        self._mm = None  # unmapped by the garbage collector once no array references it
        if self._owner:
            with contextlib.suppress(FileNotFoundError):
                shm.unlink()
        shm.close()


def map_segment(shm: shared_memory.SharedMemory, size: int) -> mmap.mmap:
    """A mapping of the segment apart from ``shm``'s own: of its file descriptor (POSIX), or of the
    named section (Windows, where it has none; the section lives while any handle to it does)."""
    if sys.platform == "win32":
        return mmap.mmap(-1, size, tagname=shm.name)
    return mmap.mmap(shm._fd, size)  # type: ignore[attr-defined]


SEGMENT_PREFIX = "psm_sv"


def segment_name(pid: int | None = None) -> str:
    """A new segment name that says which process created it: ``psm_sv<pid>_<random>``, so leak
    checks (and people) can tell a ShmVecEnv's segment in ``/dev/shm`` from anyone else's."""
    return f"{SEGMENT_PREFIX}{os.getpid() if pid is None else pid}_{secrets.token_hex(4)}"


def attach_untracked(name: str) -> shared_memory.SharedMemory:
    """Attach without registering the segment with the resource tracker.

    Only the creator may own a segment's lifetime. Before Python 3.13 attaching registers it too,
    and a worker that exits would make the tracker unlink it (or warn about a "leak") while the main
    process still uses it.
    """
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg,unused-ignore]
    register = resource_tracker.register
    resource_tracker.register = lambda *args, **kwargs: None
    try:
        return shared_memory.SharedMemory(name=name)
    finally:
        resource_tracker.register = register
