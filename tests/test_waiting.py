"""``worker_spin_us``: a worker polls for its next command while commands come quickly, sleeps at
once when they do not, never polls past its budget, and notices a closed pipe while polling.

Counts of polled waits and CPU time, not speed: what polling gains is measured by
``benchmarks/worker_spin.py``.
"""

from __future__ import annotations

import os
import select
import time

import numpy as np
import psutil
import pytest

import shmvec.worker.loop
from shmvec import ShmVecEnv, ShmVectorEnv
from shmvec.engine.groups import usable_cpus
from shmvec.engine.options import DEFAULT_SPIN_US, Options, resolve_spin
from shmvec.engine.startup import configure_message
from shmvec.memory.doorbell import CHECK_PARENT_S, WorkerBell
from shmvec.memory.ring import bell_words
from shmvec.worker.waiting import CommandWait
from tests.envs import TinyImageEnv
from tests.helpers import run_beside_dummy


@pytest.fixture
def pipe():
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def _readable(fd: int):
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return lambda: bool(poller.poll(0))


def _round(waiting: CommandWait, r: int, w: int, delay: float) -> None:
    """One command, ``delay`` seconds after the last answer."""
    waiting.done()
    if delay:
        time.sleep(delay)
    os.write(w, b"x")
    waiting(_readable(r))
    assert os.read(r, 1) == b"x"
    waiting.received()


@pytest.mark.parametrize("spin_s,polled", [(0.5, 5), (0.0, 0)])
def test_polls_while_commands_come_quickly_unless_the_budget_is_zero(pipe, spin_s, polled):
    r, w = pipe
    waiting = CommandWait(spin_s=spin_s)
    for _ in range(5):
        _round(waiting, r, w, 0.0)
    assert waiting.polled == polled
    assert waiting.typical < 0.5


def test_stops_polling_when_commands_come_slowly_and_starts_again(pipe):
    r, w = pipe
    waiting = CommandWait(spin_s=0.002)
    _round(waiting, r, w, 0.0)
    for _ in range(3):
        _round(waiting, r, w, 0.03)  # a policy's forward pass between two steps
    assert waiting.typical > 0.002
    polled = waiting.polled
    _round(waiting, r, w, 0.03)
    assert waiting.polled == polled  # slept at once
    for _ in range(40):
        _round(waiting, r, w, 0.0)
    assert waiting.polled > polled  # quick commands again: polling again


def test_waits_just_under_the_budget_do_not_restart_polling(pipe):
    """Once stopped, polling starts again only below half the budget: waits hovering around the
    budget (a forward pass of about that length) never make the worker poll."""
    r, w = pipe
    waiting = CommandWait(spin_s=0.004)
    while waiting.typical < 0.004:
        _round(waiting, r, w, 0.01)
    _round(waiting, r, w, 0.01)  # this one saw the average past the budget: slept at once
    polled = waiting.polled
    for _ in range(12):
        _round(waiting, r, w, 0.003)  # under the budget, above half of it
    assert waiting.polled == polled
    assert waiting.typical < 0.004


def test_polling_is_bounded_and_a_closed_pipe_ends_the_wait(pipe):
    """A worker whose main process is gone (its pipe hung up) stops waiting for commands: after its
    polling budget, within the doorbell's parent check (CHECK_PARENT_S)."""
    r, w = pipe
    words = (np.zeros(bell_words(1), np.uint32), np.zeros((1, 4), np.uint32), np.zeros((1, 4), np.uint32))
    wake = os.eventfd(0, os.EFD_NONBLOCK)
    try:
        bell = WorkerBell(words, 0, wake, r, CommandWait(spin_s=0.2))
        os.close(w)
        start = time.monotonic()
        assert bell.wait() is None
        assert time.monotonic() - start < 0.2 + CHECK_PARENT_S + 5
    finally:
        os.close(wake)


def test_the_budget_is_checked_and_resolved():
    cpus = usable_cpus()
    assert resolve_spin(None, cpus, "local") == DEFAULT_SPIN_US
    assert resolve_spin(None, cpus + 1, "local") == 0  # more workers than CPUs: they would take turns
    assert resolve_spin(None, 1, "ray") == 0
    assert resolve_spin(250, cpus + 1, "local") == 250
    assert resolve_spin(np.int64(7), 1, "local") == 7
    for bad in (-1, 1.5, "1000", True):
        with pytest.raises(ValueError, match="worker_spin_us must be a whole number"):
            resolve_spin(bad, 1, "local")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="worker_spin_us applies to local worker processes"):
        resolve_spin(100, 1, "ray")
    assert configure_message(Options().checked(1), None).spin_us == DEFAULT_SPIN_US  # type: ignore[union-attr]
    assert configure_message(Options(worker_spin_us=0).checked(1), None) is None


def test_bad_budget_is_refused_before_workers_start(no_leaks):
    with pytest.raises(ValueError, match="worker_spin_us"):
        ShmVecEnv([TinyImageEnv], worker_spin_us=-5)
    with pytest.raises(ValueError, match="worker_spin_us"):
        ShmVectorEnv([TinyImageEnv], worker_spin_us=2.5)  # type: ignore[arg-type]


def _count_polls(monkeypatch, folder):
    """Have forked workers write how many of their waits polled, after every command."""

    class Counting(CommandWait):
        def received(self) -> None:
            super().received()
            (folder / f"{os.getpid()}").write_text(str(self.polled))

    monkeypatch.setattr(shmvec.worker.loop, "CommandWait", Counting)


@pytest.mark.parametrize("spin_us,polls", [(None, True), (0, False)])
def test_workers_poll_by_default_and_not_when_told(no_leaks, monkeypatch, tmp_path, spin_us, polls):
    _count_polls(monkeypatch, tmp_path)
    # One worker: the default polls on any machine (n_workers <= usable CPUs). The slow start-up
    # commands lift the running average; quick steps bring it under the budget within ~20 waits.
    with ShmVecEnv([TinyImageEnv] * 2, "fork", n_workers=1, worker_spin_us=spin_us) as venv:
        venv.reset()
        for _ in range(100):
            venv.step(np.zeros(2, np.int64))
    counts = [int(f.read_text()) for f in tmp_path.iterdir()]
    assert len(counts) == 1
    assert counts[0] > 50 if polls else counts[0] == 0


def test_an_idle_worker_stops_polling(no_leaks):
    # Polling is bounded by the budget: a worker left alone for a second must use (next to) no CPU.
    with ShmVecEnv([TinyImageEnv] * 2, "fork", n_workers=1, worker_spin_us=20_000) as venv:
        venv.reset()
        for _ in range(20):
            venv.step(np.zeros(2, np.int64))
        worker = psutil.Process(venv.processes[0].pid)
        before = sum(worker.cpu_times()[:2])
        time.sleep(1.0)
        used = sum(worker.cpu_times()[:2]) - before
    assert used < 0.25, f"an idle worker used {used:.2f} s of CPU in 1 s: it kept polling"


def test_polling_workers_return_what_dummy_returns(no_leaks):
    run_beside_dummy(TinyImageEnv, 3, steps=80, start_method="fork", n_workers=2, worker_spin_us=5_000)
