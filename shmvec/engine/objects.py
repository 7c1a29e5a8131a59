"""Object leaves, main side: the observation leaves without a fixed size (Text, Sequence, Graph,
OneOf, custom spaces), whose values travel pickled in the workers' replies instead of the ring.

:class:`ObjectLeaves` keeps, per object leaf, the value each env returned last: the ring slot of
these leaves. A batch's values are taken from the replies it is made of (:meth:`~ObjectLeaves.take`,
only for batches handed to the caller, so replies of dropped steps never count), and envs without a
new value in a batch keep theirs, exactly as their ring rows are kept: envs a masked reset left
alone, and envs rebuilt by restart mode whose last observation is carried over (or becomes their
terminal observation). Batches hand out each object leaf as a fresh 1-d numpy object array over
their envs: SB3's face returns it as it is, Gymnasium's face turns it into the tuple
``SyncVectorEnv`` returns (:func:`gymnasium.vector.utils.concatenate` of such a space).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from shmvec.memory.layout import Leaf
from shmvec.wire import messages as m


class ObjectLeaves:
    """The last value of every env for each object leaf of the observation space.

    :param leaves: every leaf of the observation space (:func:`shmvec.memory.layout.leaves`).
    :param n_envs: the number of envs.
    """

    def __init__(self, leaves: list[Leaf], n_envs: int) -> None:
        self.index = [j for j, leaf in enumerate(leaves) if not leaf.fixed]  # positions among the leaves
        self.last = [np.empty(n_envs, dtype=object) for _ in self.index]
        self.finals: dict[int, list[Any]] = {}  # env -> terminal values taken and not read yet

    def take(self, reply: m.Reply | None, first: int) -> None:
        """Record the object values of one worker's reply (a step or a reset; anything else holds
        none), whose first env is ``first``."""
        if not isinstance(reply, m.Stepped | m.ResetDone) or reply.objects is None:
            return
        for i, values in reply.objects.items():
            for last, value in zip(self.last, values):
                last[first + i] = value
        if isinstance(reply, m.Stepped) and reply.final_objects:
            self.finals.update({first + i: values for i, values in reply.final_objects.items()})

    def rows(self, rows: Sequence[int] | np.ndarray | slice) -> list[np.ndarray]:
        """Per object leaf, a new array of the values of envs ``rows``."""
        return [last[rows].copy() for last in self.last]

    def complete(
        self, arrays: list[Any], finals: dict[int, list[Any]], rows: Sequence[int] | np.ndarray | slice
    ) -> None:
        """Put the object leaves into a batch read out of the ring: into ``arrays`` (one entry per
        leaf) the values of envs ``rows``, and into each env's terminal leaves of ``finals`` (the
        fixed-size ones, in leaf order) its terminal values, each at its leaf's position."""
        for j, values in zip(self.index, self.rows(rows)):
            arrays[j] = values
        taken, self.finals = self.finals, {}
        for i, final in finals.items():
            for j, value in zip(self.index, taken[i]):
                final.insert(j, value)
