"""How a worker waits for its next command: it polls for a short while, then sleeps.

A worker that sleeps between two batch steps leaves its CPU idle for the main process's share of
the step (~0.4-0.9 ms on Pong at 8 envs). On a virtual machine an idle vCPU is halted and handed back
to the host; the next step then starts with a wake-up through the hypervisor and runs on cold caches.
Measured on the 2-core development VM (``benchmarks/worker_spin.py``): 4 ALE Pong envs stepped with a
1 ms sleep between batches cost 1-14% more CPU per step than without, 2-46% with two such processes
at once; ShmVecEnv on Pong raw at 8 envs ran 7% faster (median of 4 interleaved rounds, 1.00-1.08)
when each worker polled for up to 1 ms before sleeping.

Polling only pays while the commands come quickly. With a policy in the loop the next step comes
after the forward pass, and a polling worker would take CPU from the policy's threads; so the worker
keeps a running average of how long it waited, stops polling once that reaches the budget, and
starts again only once it is below half the budget. Without that margin a forward pass of about the
budget (~1 ms: PPO's CnnPolicy on 8 envs, where the native Atari step leaves little env time) made
the workers poll every few steps and slow the forward pass that follows down: with SB3's Atari
recipe in the loop, 1.05-1.22x DummyVecEnv in rounds that swung from 1,700 to 3,300 env steps/s,
against 1.64x for workers that never poll (``benchmarks/policy_loop.py``, 5 rounds).
While it polls it yields the CPU on every turn (``sched_yield``), so any other runnable
process on that CPU, the main process included, goes first. What it polls is the worker's command
words in the ring (:class:`shmvec.memory.doorbell.WorkerBell`): a read of shared memory, no system
call; sleeping is the doorbell's futex wait.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

# Weight of the newest wait in the running average: 7 ms waits stop the polling after one step.
_NEWEST = 0.25


class CommandWait:
    """Decides how long a worker polls for its next command before it sleeps.

    :param spin_s: how long to poll before sleeping, in seconds (0: sleep at once).
    """

    def __init__(self, spin_s: float = 0.0) -> None:
        self.spin_s = spin_s
        self.typical = 0.0  # running average of the waits, in seconds
        self.since = time.perf_counter()  # when the worker last finished a command
        self.polled = 0  # waits that polled (for tests and diagnostics)
        self.polling = True  # commands come quickly (see the module docstring's margin)

    def __call__(self, arrived: Callable[[], bool]) -> None:
        """Return once ``arrived()`` is true, or after polling for :attr:`spin_s` (the caller then
        sleeps until a command arrives), or at once while commands come slowly."""
        if self.polling:
            self.polling = self.typical < self.spin_s
        else:
            self.polling = self.typical < self.spin_s / 2
        if not self.spin_s or not self.polling:
            return
        self.polled += 1
        clock, pause = time.perf_counter, os.sched_yield
        end = self.since + self.spin_s
        while not arrived() and clock() < end:
            pause()

    def received(self) -> None:
        """A command arrived: count how long the worker waited for it."""
        self.typical += _NEWEST * (time.perf_counter() - self.since - self.typical)

    def done(self) -> None:
        """The worker has answered; the next wait starts now."""
        self.since = time.perf_counter()
