"""The time attribution of ``shmvec bench`` (:mod:`shmvec.bench.runner`), on hand-worked numbers: a
measurement window on a clock the test moves, and the split of the wait into env, copy and IPC."""

from __future__ import annotations

from dataclasses import fields

import pytest

from shmvec.bench.runner import BenchSpec, Sample
from tests.envs import TINY


class _Clock:
    """A wall clock and a CPU clock that only the test moves; reading the CPU clock takes 0.125 ms
    of wall time (the loop's own overhead)."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def perf_counter(self) -> float:
        return self.wall

    def process_time(self) -> float:
        self.wall += 0.000125
        return self.cpu


class _TimedVecEnv:
    """A VecEnv whose calls take the test's times: 0.25 s to reset, 0.5 ms per step_async, 4 ms per
    step_wait (1 ms of it on this process's CPU)."""

    processes = [object(), object()]

    def __init__(self, clock: _Clock) -> None:
        from gymnasium import spaces

        self.clock, self.action_space = clock, spaces.Discrete(2)

    def seed(self, seed):
        pass

    def reset(self):
        self.clock.wall += 0.25
        return 0

    def step_async(self, actions):
        self.clock.wall += 0.0005

    def step_wait(self):
        self.clock.wall += 0.004
        self.clock.cpu += 0.001
        return 0, None, None, None

    def close(self):
        pass


def test_a_window_is_split_into_policy_send_wait_and_overhead_as_timed(monkeypatch):
    """runner._measure on a clock the test moves: a policy of 1 ms, step_async 0.5 ms, step_wait 4 ms
    plus the 0.125 ms CPU-clock read inside it, 0.125 ms of loop overhead between steps. The window
    is 0.057 s: the 10th step ends it at 10 x 5.75 - 0.125 = 57.375 ms (its trailing overhead is
    after the window), so 9 overheads of 0.125 ms are unattributed, 0.1125 ms per step."""
    from types import SimpleNamespace

    from shmvec.bench import runner, system
    from shmvec.bench.results import Config

    clock = _Clock()

    def build(*args, **kwargs):  # 1 s to start the workers
        clock.wall += 1.0
        return _TimedVecEnv(clock)

    def policy(obs):
        clock.wall += 0.001
        return [0, 0]

    monkeypatch.setattr(
        runner, "time", SimpleNamespace(perf_counter=clock.perf_counter, process_time=clock.process_time)
    )
    monkeypatch.setattr(runner, "make_vec_env", build)
    monkeypatch.setattr(system, "shm_segments", lambda: {})
    monkeypatch.setattr(system, "memory", lambda procs: system.Memory(0, 0))
    monkeypatch.setattr(system, "cpu_snapshot", lambda procs: system.CpuSnapshot(0.0, 0.0, 0.0, 0.0))
    spec = BenchSpec(env=TINY, seconds=0.057)
    s, native = runner._measure(Config("fake", 2), lambda: None, None, policy, spec, seed=0)
    assert native is None  # not a shmvec backend
    ms = pytest.approx  # seconds (per batch step but for the window and the start-up)
    assert s.batch_steps == 10 and s.processes == 2
    assert s.startup_s == ms(1.25)
    assert s.wall_s == ms(0.057375) and s.step_s == ms(0.0057375)
    assert (s.policy_s, s.send_s, s.wait_s) == (ms(0.001), ms(0.0005), ms(0.004125))
    assert s.unattributed_s == ms(0.0001125)
    assert s.wait_cpu_s == ms(0.001)
    assert s.steps_per_s == ms(2 * 10 / 0.057375)
    assert (s.env_s, s.copy_s, s.ipc_s) == (0.0, 0.0, 0.0), "left for _attribute"


@pytest.mark.parametrize(
    ("n_envs", "processes", "cpu_fraction", "wait_s", "env_s", "copy_s", "ipc_s"),
    [
        # A computing env, 8 envs on 4 workers but 2 CPUs: each CPU steps ceil(8 / 2) = 4 in turn.
        (8, 4, 1.0, 0.006, 0.004, 0.0005, 0.0015),
        # A quarter of its step on a CPU: 0.25 x 4 steps (2 CPUs) + 0.75 x 2 (waits overlap on 4 workers).
        (8, 4, 0.25, 0.006, 0.0025, 0.0005, 0.003),
        # In-process (no worker: one lane), 3 envs: 3 steps; the copy is capped at what is left.
        (3, 0, 1.0, 0.0032, 0.003, 0.0002, 0.0),
        # An estimate above the measured wait is capped at it: nothing left for copy or IPC.
        (8, 1, 1.0, 0.006, 0.006, 0.0, 0.0),
    ],
)
def test_wait_is_attributed_to_env_copy_and_ipc_as_worked_out_by_hand(
    monkeypatch, n_envs, processes, cpu_fraction, wait_s, env_s, copy_s, ipc_s
):
    """runner._attribute with an env step of 1 ms alone, a batch copy of 0.5 ms and 2 usable CPUs."""
    from shmvec.bench import runner, system

    monkeypatch.setattr(system, "usable_cpus", lambda: 2)
    sample = Sample(**{f.name: 0 for f in fields(Sample)})
    sample.processes, sample.wait_s = processes, wait_s
    runner._attribute(sample, n_envs, env_step_s=0.001, cpu_fraction=cpu_fraction, copy_s=0.0005)
    got = (sample.env_s, sample.copy_s, sample.ipc_s)
    assert got == pytest.approx((env_s, copy_s, ipc_s), abs=1e-15), got
