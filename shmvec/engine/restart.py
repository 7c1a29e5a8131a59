"""Restart mode: the bookkeeping behind ``ShmVecEnv(..., on_crash="restart")``.

When a worker dies, hangs past ``timeout`` or one of its envs raises during ``step``/``reset``, the
VecEnv kills that worker, starts a new one from the same env factories (kept in the main process)
and attaches it to the same ring. This module holds what that needs apart from the processes
themselves: the restart budget, the seeds of rebuilt envs and the info keys that report a restart.

Seeds of rebuilt envs: env ``i`` rebuilt for the ``k``-th time (``k = 1, 2, ...``) is reset with
``restart_seed(s, k)``, where ``s`` is the last seed given to env ``i`` by ``seed()`` (the seed
``reset()`` used, e.g. ``base + i`` after ``make_vec_env(seed=base)``). The same run gives the same
seeds; different envs and different restarts get different seeds. An env that was never seeded is
rebuilt unseeded (random).
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

ON_CRASH_MODES = ("raise", "restart")

# Info keys of an env that ended its episode because its worker was restarted.
RESTARTED_KEY = "shmvec.restarted"
REASON_KEY = "shmvec.restart_reason"


def restart_seed(seed: int | None, restart_count: int) -> int | None:
    """Seed for an env rebuilt for the ``restart_count``-th time whose last seed was ``seed``."""
    if seed is None:
        return None
    state = np.random.SeedSequence([int(seed) % 2**64, restart_count]).generate_state(1, np.uint32)
    return int(state[0])


class RestartBudget:
    """At most ``max_restarts`` worker restarts within any ``window`` seconds (None: ever).

    :param max_restarts: restarts allowed in the window (>= 0).
    :param window: length of the sliding window in seconds, or None for the VecEnv's lifetime.
    """

    def __init__(self, max_restarts: int, window: float | None) -> None:
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        if window is not None and window <= 0:
            raise ValueError(f"restart_window must be > 0 seconds or None, got {window}")
        self.max_restarts = max_restarts
        self.window = window
        self.times: deque[float] = deque()
        self.total = 0

    def take(self) -> bool:
        """Record one restart if the budget allows it; False when it is spent."""
        now = time.monotonic()
        if self.window is not None:
            while self.times and now - self.times[0] > self.window:
                self.times.popleft()
        if len(self.times) >= self.max_restarts:
            return False
        self.times.append(now)
        self.total += 1
        return True

    def describe(self) -> str:
        span = "in this VecEnv's lifetime" if self.window is None else f"within {self.window:g} s"
        return f"restart limit reached: max_restarts={self.max_restarts} {span}"
