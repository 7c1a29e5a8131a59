"""Slot rotation and lending: which ring slot the workers write next, and which batch may be lent.

With ``copy=True`` a batch is handed out as arrays over the ring slot itself (no copy) while another
slot stays free for the next write; a lent slot is skipped until nothing references its arrays any
more. With ``copy=False`` the caller gets read-only views and slots simply rotate.
"""

from __future__ import annotations

from sys import getrefcount

import numpy as np


class Slots:
    """The rotation state of one ring.

    :param n_slots: ring slots (>= 1; >= 2 with ``copy=False``).
    :param copy: True: lend slots and track them; False: plain rotation.
    """

    def __init__(self, n_slots: int, copy: bool) -> None:
        self.n_slots, self.copy = n_slots, copy
        self.current = 0
        self.previous = 0
        # Arrays lent to the caller from each slot (copy=True).
        self.lent: list[list[np.ndarray]] = [[] for _ in range(n_slots)]
        self.copy_fallbacks = 0  # batches copied because no slot could be lent (diagnostic)

    def free(self, slot: int) -> bool:
        # References to a lent array: our list, the loop variable, getrefcount's argument. Anything
        # above that is the caller (or a view, tensor or memoryview derived from it) still using it.
        return all(getrefcount(a) <= 3 for a in self.lent[slot])

    def advance(self) -> int:
        """Move to the slot the workers write next: the next one in rotation that nobody still reads.

        ``previous`` keeps the slot of the batch handed out last; it equals the new slot only when
        every other slot is still lent (then the workers overwrite it).
        """
        for k in range(1, self.n_slots + 1):
            slot = (self.current + k) % self.n_slots
            if not self.copy or self.free(slot):
                self.lent[slot] = []
                self.previous, self.current = self.current, slot
                return slot
        # can_lend never lends the last free slot, so this cannot happen.
        raise AssertionError("no free ring slot")

    def can_lend(self, slot: int) -> bool:
        """Whether ``slot`` may be lent: another slot stays free for the next write. Counts a
        fallback to copying when it may not."""
        for s in range(self.n_slots):
            if s != slot and self.free(s):
                return True
        self.copy_fallbacks += 1
        return False
