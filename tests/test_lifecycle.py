"""Every way a ShmVecEnv ends releases its shared memory, processes and file descriptors."""

from __future__ import annotations

import functools
import gc
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

from shmvec import ClosedError, EnvError, ShmVecEnv, WorkerCrashedError
from shmvec.synthetic import SyntheticImageEnv
from tests.conftest import shm_segments
from tests.envs import DictImageEnv, SlowStepEnv
from tests.helpers import ROOT

IMAGE = functools.partial(SyntheticImageEnv, (32, 32, 3))
ACTIONS = np.zeros(4, np.int64)


def test_close_is_idempotent_and_final(no_leaks):
    env = ShmVecEnv([IMAGE] * 4, "fork")
    env.reset()
    env.close()
    env.close()
    assert env.closed
    with pytest.raises(ClosedError, match=r"is closed: close\(\) was called on it"):
        env.step(ACTIONS)


def test_context_manager(no_leaks):
    with ShmVecEnv([IMAGE] * 4, "fork") as env:
        env.reset()
        env.step(ACTIONS)
    assert env.closed


@pytest.mark.timeout(60)  # a hang fails; no bound on how long close() takes
def test_close_while_step_pending(no_leaks):
    env = ShmVecEnv([functools.partial(SlowStepEnv, 0.3)] * 2, "fork")
    env.reset()
    env.step_async(np.zeros(2, np.int64))
    env.close()
    assert env.closed


def test_garbage_collected_without_close(no_leaks):
    env = ShmVecEnv([IMAGE] * 4, "fork")
    env.reset()
    env.step(ACTIONS)
    pids = [p.pid for p in env.processes]
    del env
    gc.collect()
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_copy_false_views_outlive_close(no_leaks):
    env = ShmVecEnv([IMAGE] * 4, "fork", copy=False)
    obs = env.reset()
    before = obs.copy()
    assert not obs.flags.writeable
    env.close()
    # The segment is gone from /dev/shm but the mapping stays readable while the view lives.
    np.testing.assert_array_equal(obs, before)
    del obs


def _mappings_of(segment: str) -> list[str]:
    with open("/proc/self/maps") as f:
        return [line for line in f if segment in line]


@pytest.mark.parametrize(
    "face, options",
    [
        ("sb3", {}),
        ("sb3", {"copy": False}),
        ("sb3", {"codec": "delta", "decode_threads": 2}),
        ("gymnasium", {}),
        ("gymnasium", {"frame_stack": 2}),
        ("gymnasium", {"batch_size": 2}),
    ],
)
def test_a_closed_env_kept_alive_holds_no_ring_memory(no_leaks, face, options):
    """close() lets go of everything the engine holds of the ring (lent arrays' books, the reader's
    views, the typed info areas, the decode threads): a closed env object that the caller keeps
    maps no part of the segment and runs no thread of its own. Only arrays the caller still holds
    keep the mapping (test_copy_false_views_outlive_close)."""
    import threading

    from shmvec import ShmVectorEnv

    if face == "sb3":
        env = ShmVecEnv([IMAGE] * 4, "fork", n_workers=2, **options)
        env.reset()
        env.step(ACTIONS)
    elif "batch_size" in options:
        env = ShmVectorEnv([IMAGE] * 4, start_method="fork", n_workers=2, **options)
        env.async_reset(seed=0)
        env.recv()
    else:
        env = ShmVectorEnv([IMAGE] * 4, start_method="fork", n_workers=2, **options)
        env.reset(seed=0)
        env.step(ACTIONS)
    segment = env._engine.ring.spec.shm_name
    assert _mappings_of(segment)
    env.close()
    gc.collect()
    assert _mappings_of(segment) == []
    assert [t.name for t in threading.enumerate() if t.name.startswith("shmvec-")] == []
    assert env.closed  # the object itself is still here


def test_exception_in_worker_keeps_env_usable(no_leaks):
    with ShmVecEnv([DictImageEnv] * 3, "fork", n_workers=2) as env:
        env.reset()
        with pytest.raises(EnvError, match="env 2 raised ValueError during env_method:fail: nope") as info:
            env.env_method("fail", "nope", indices=[2])
        assert info.value.env_index == 2
        assert "tests/envs.py" in info.value.remote_traceback
        assert isinstance(info.value.original, ValueError)
        env.reset()
        assert len(env.get_attr("t")) == 3


@pytest.mark.timeout(60)  # a hang fails; no bound on how long noticing the death takes
@pytest.mark.parametrize("when", ["idle", "step"])
def test_killed_worker_is_reported_and_cleaned(no_leaks, when):
    env = ShmVecEnv([functools.partial(SlowStepEnv, 0.2)] * 4, "fork", n_workers=2)
    env.reset()
    victim = env.processes[1]
    if when == "step":
        env.step_async(np.zeros(4, np.int64))
    os.kill(victim.pid, signal.SIGKILL)
    if when == "idle":
        victim.join(30)  # dead before the step is sent
    with pytest.raises(
        WorkerCrashedError, match=r"worker 1 \(pid \d+, envs 2\.\.3\) was killed by signal SIGKILL"
    ):
        if when == "step":
            env.step_wait()
        else:
            env.step(np.zeros(4, np.int64))
    assert env.closed
    env.close()


SCRIPT = textwrap.dedent(
    """
    import faulthandler, functools, gc, os, signal, sys, time
    from multiprocessing import resource_tracker
    import numpy as np
    from shmvec import ShmVecEnv
    from tests.envs import SlowStepEnv

    def fds():
        return len(os.listdir(f"/proc/{os.getpid()}/fd"))

    if __name__ == "__main__":
        # A shell that starts the test run in the background (`cmd &`) hands it SIGINT ignored, and
        # Python then installs no KeyboardInterrupt handler: put the default back.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        resource_tracker.ensure_running()  # its pipe lives for the whole process, not a leak
        before = fds()
        env = ShmVecEnv([functools.partial(SlowStepEnv, 0.05)] * 2, "{method}")
        env.reset()
        print(" ".join(str(p.pid) for p in env.processes), flush=True)
        faulthandler.dump_traceback_later(15)  # a hang shows its stacks (the test waits 20 s)
        interrupted = False
        try:
            while True:
                env.step(np.zeros(2, np.int64))
        except KeyboardInterrupt:
            interrupted = True  # the traceback keeps env alive until the except block ends
        # Not closed on purpose: the finalizer must release everything when the env is dropped.
        del env
        gc.collect()
        print(f"fds {before} {fds()}", file=sys.stderr, flush=True)
        if interrupted:
            raise KeyboardInterrupt
    """
)


def _start_script(tmp_path, method: str = "fork") -> tuple[subprocess.Popen, list[int]]:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.replace("{method}", method))
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2
    return proc, pids


def _wait_gone(pids: list[int], seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [
            p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return True
        time.sleep(0.05)
    return False


def _reap(proc: subprocess.Popen, pids: list[int]) -> None:
    """Kill what a failed check left running, so one failure does not fail every later test's
    leak check (they count this process's children)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


def test_keyboard_interrupt_cleans_up(tmp_path):
    proc, pids = _start_script(tmp_path)
    try:
        assert len(shm_segments(proc.pid)) == 1  # the leak check below looks at the right names
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        try:
            _, stderr = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"the script hung after SIGINT; its stacks:\n{proc.communicate()[1]}")
        assert "KeyboardInterrupt" in stderr
        assert "resource_tracker" not in stderr, stderr
        fds = re.search(r"fds (\d+) (\d+)", stderr)
        assert fds is not None, stderr
        assert int(fds.group(2)) <= int(fds.group(1)), f"file descriptors leaked: {fds.group(0)}"
        assert _wait_gone(pids)
        assert shm_segments(proc.pid) == set()
    finally:
        _reap(proc, pids)


def test_workers_exit_when_parent_is_killed(tmp_path):
    proc, pids = _start_script(tmp_path)
    try:
        assert len(shm_segments(proc.pid)) == 1
        proc.kill()
        proc.wait(timeout=10)
        assert _wait_gone(pids), "workers outlived their killed parent"
        # The resource tracker unlinks what a killed parent could not.
        deadline = time.monotonic() + 10
        while shm_segments(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert shm_segments(proc.pid) == set()
    finally:
        _reap(proc, pids)
