"""Slot rotation and lending: which ring slot each worker writes next, and which batch may be lent.

A synchronous step moves every worker to the same next slot (:meth:`Slots.advance_all`); in pool
mode each worker moves on its own (:meth:`Slots.advance`), never onto the slot holding the last
observation the caller saw of its envs (restart mode carries it over) nor onto one still lent.

With ``copy=True`` a batch is handed out as arrays over the ring slot itself (no copy) while another
slot stays free for the next write; a lent slot is skipped until nothing references its arrays any
more. With ``copy=False`` the caller gets read-only views and slots simply rotate.

A slot that a copy to a GPU is still reading (``device="cuda"``, see :mod:`shmvec.device`) carries a
fence, the copy's CUDA event: it counts as lent until the event has completed, and a rotation that
must write it (``copy=False``, or no other slot free) waits for the event first.
"""

from __future__ import annotations

from sys import getrefcount
from typing import Any

import numpy as np


class Slots:
    """The rotation state of one ring.

    :param n_slots: ring slots (>= 1; >= 2 with ``copy=False``).
    :param copy: True: lend slots and track them; False: plain rotation.
    :param n_workers: workers writing into the ring.
    """

    def __init__(self, n_slots: int, copy: bool, n_workers: int = 1) -> None:
        self.n_slots, self.copy = n_slots, copy
        self.current = 0
        self.slot = [0] * n_workers  # the slot each worker writes (or wrote) its current step into
        self.uniform = True  # every worker is in the same slot
        # Arrays lent to the caller from each slot (copy=True).
        self.lent: list[list[np.ndarray]] = [[] for _ in range(n_slots)]
        self.copy_fallbacks = 0  # batches copied because no slot could be lent (diagnostic)
        # Per slot: the event of a copy still reading it (anything with query() and synchronize()).
        self.fences: list[Any] = [None] * n_slots

    def forget_lent(self) -> None:
        """The ring is closed: drop this book's references to the arrays lent from it, so that only
        arrays the caller still holds keep its (unlinked) segment mapped."""
        self.lent = [[] for _ in range(self.n_slots)]

    def fence(self, slot: int, event: Any) -> None:
        """A copy out of ``slot`` runs until ``event`` completes: the workers must not write it before."""
        self.fences[slot] = event

    def _settle(self, slot: int) -> int:
        """``slot``, once no copy reads it any more (waits for its fence, if any)."""
        fence = self.fences[slot]
        if fence is not None:
            fence.synchronize()
            self.fences[slot] = None
        return slot

    def free(self, slot: int) -> bool:
        """Whether nothing reads ``slot``: no copy in flight, no lent array still referenced."""
        fence = self.fences[slot]
        if fence is not None:
            if not fence.query():
                return False
            self.fences[slot] = None
        # References to a lent array: our list, the loop variable, getrefcount's argument. Anything
        # above that is the caller (or a view, tensor or memoryview derived from it) still using it.
        return all(getrefcount(a) <= 3 for a in self.lent[slot])

    def advance_all(self) -> int:
        """Move every worker to the slot they write next: the next one in rotation that nobody still
        reads: the slot of the batch handed out last only when every other slot is still lent (then
        the workers overwrite it; see :meth:`~shmvec.engine.obs_reader.Reader.keep_previous`).
        """
        for k in range(1, self.n_slots + 1):
            slot = (self.current + k) % self.n_slots
            if not self.copy or self.free(slot):
                self.lent[slot] = []
                self.current = slot
                self.slot = [slot] * len(self.slot)
                self.uniform = True
                return self._settle(slot)
        # can_lend never lends the last free slot, so this cannot happen.
        raise AssertionError("no free ring slot")

    def advance(self, w: int) -> int:
        """Move worker ``w`` on its own to the next slot that is not the one the caller saw last of
        its envs, preferring one nobody still reads."""
        after = [(self.slot[w] + k) % self.n_slots for k in range(1, self.n_slots)] or [self.slot[w]]
        self.slot[w] = self._settle(next((s for s in after if self.free(s)), after[0]))
        self.uniform = self.slot.count(self.slot[w]) == len(self.slot)
        if self.uniform:
            # Every worker has moved to one slot: a whole batch again (as after advance_all).
            self.current = self.slot[w]
        return self.slot[w]

    def can_lend(self, slot: int) -> bool:
        """Whether ``slot`` may be lent: another slot stays free for the next write. Counts a
        fallback to copying when it may not."""
        for s in range(self.n_slots):
            if s != slot and self.free(s):
                return True
        self.copy_fallbacks += 1
        return False
