"""``shmvec.engine.procfs``: workers' ``/proc`` files read cheaply, closed when their process goes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shmvec.engine.procfs import ProcFiles

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_files_stay_open_and_are_closed_when_their_pid_is_not_asked_for_or_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    files = ProcFiles("stat")
    try:
        before = _fds()
        first = files.read([os.getpid(), child.pid])
        assert first is not None and [int(t.split()[0]) for t in first] == [os.getpid(), child.pid]
        assert _fds() == before + 2
        assert files.read([os.getpid(), child.pid]) is not None and _fds() == before + 2, "kept open"
        assert files.read([os.getpid()]) is not None and _fds() == before + 1, "child's closed"
        assert files.read([os.getpid(), child.pid]) is not None and _fds() == before + 2
        child.kill()
        child.wait()
        assert files.read([os.getpid(), child.pid]) is None, "reaped: no such process"
        assert _fds() == before + 1, "the reaped child's file closed"
        assert files.read([child.pid]) is None and _fds() == before, "gone: nothing opened"
    finally:
        child.kill()
        child.wait()
        files.close()
    assert _fds() == before and files.read([]) == []


DROPPED_WITHOUT_CLOSE = """
import gc, os, sys, warnings

warnings.simplefilter("error")  # as a suite run with -W error, or SB3's test asserting no warning
unraisable = []
sys.unraisablehook = lambda u: unraisable.append(f"{u.exc_type.__name__}: {u.exc_value}")

import gymnasium as gym
from stable_baselines3 import PPO  # torch: libgomp loaded, so the OpenMP pause reads the workers' files
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecMonitor

from shmvec import ShmVecEnv


def schedstat_fds():
    fds = os.listdir("/proc/self/fd")
    return [fd for fd in fds if os.path.exists(f"/proc/self/fd/{fd}")
            and os.readlink(f"/proc/self/fd/{fd}").endswith("/schedstat")]


def make():
    return gym.make("CartPole-v1", disable_env_checker=True)


# SB3's tests/test_vec_monitor.py::test_vec_monitor_ppo, with ShmVecEnv for DummyVecEnv
env = ShmVecEnv([make], start_method="fork")
env.seed(0)
monitor_env = VecMonitor(env)
model = PPO("MlpPolicy", monitor_env, n_steps=64, device="cpu")
model.learn(total_timesteps=128)
evaluate_policy(model, monitor_env, n_eval_episodes=2)
opened = len(schedstat_fds())
del model, monitor_env, env  # never closed
gc.collect()
print(opened, len(schedstat_fds()), unraisable)
"""


@pytest.mark.sb3  # its subprocess trains PPO
def test_a_vec_env_dropped_without_close_leaves_no_resource_warning(tmp_path):
    """A VecEnv dropped without close(), under warnings as errors: no "unclosed file" warning from
    the /proc files the OpenMP pause kept open, and those files closed."""
    from tests.helpers import run_script

    proc = run_script(tmp_path / "dropped.py", DROPPED_WITHOUT_CLOSE, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    opened, left, unraisable = proc.stdout.strip().splitlines()[-1].split(" ", 2)
    assert int(opened) > 0, "the pause read no /proc file: the test tests nothing"
    assert unraisable == "[]", unraisable
    assert int(left) == 0, "files left open"
