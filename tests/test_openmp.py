"""The main process's idle OpenMP threads are ended while workers step (shmvec.engine.openmp).

Thread counts, not timings: the spin itself is measured by the benchmarks. Each case runs in a fresh
interpreter so the torch thread pool it looks at is its own. When to pause (the decision, from the
workers' clocks) is tests/test_openmp_decision.py's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from tests.helpers import run_script

torch = pytest.importorskip("torch")

_PRELUDE = """
import json, os, sys
import torch
torch.set_num_threads(2)  # a pool with one extra thread even where the machine has fewer cores

def n_threads():
    return len(os.listdir("/proc/self/task"))

def n_threads_once_down_to(target):
    # pthread_join returns before the kernel drops the thread: a count that should fall is given
    # a moment to; one that never falls is returned as it is, and the test fails on it.
    import time
    deadline = time.monotonic() + 5.0
    while n_threads() > target and time.monotonic() < deadline:
        time.sleep(0.001)
    return n_threads()

def counting_pauses(pauser):
    # The pauses a step asked for, counted where they are made: which steps paused is then known,
    # and the thread count says only whether the pause ended the pool.
    paused = []
    real = pauser.pause
    pauser.pause = lambda: paused.append(1) or real()
    return paused

def threads_after_send(paused, with_pool):
    # A pause's threads leave a moment after it returns: waited for. Without one none leave, and
    # the count is read at once (waiting for a fall that must not come would cost the deadline).
    return n_threads_once_down_to(with_pool - 1) if paused else n_threads()

def work():
    # A convolution large enough that ATen runs it in an OpenMP parallel region.
    x = torch.ones(8, 4, 84, 84)
    w = torch.ones(32, 4, 8, 8)
    return float(torch.nn.functional.conv2d(x, w, stride=4).sum())
"""


def _run(tmp_path, body: str) -> dict:
    result = run_script(tmp_path / "omp_case.py", _PRELUDE + body)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_pause_ends_the_pool_and_the_next_region_restarts_it(tmp_path):
    out = _run(
        tmp_path,
        """
from shmvec.engine.openmp import OpenMPPauser, loaded_libgomp
before = n_threads()
first = work()
with_pool = n_threads()
pauser = OpenMPPauser()
runtimes = pauser.pause()
paused = n_threads_once_down_to(before)
pauser.start()  # the first pool a pause ended is left to the policy
left = n_threads()
again = work()  # which makes it again
restarted = n_threads()
remade = not pauser.idle()  # seen at the next step
pauser.pause()
n_threads_once_down_to(before)
pauser.start()
started = n_threads()
pauser.pause()
n_threads_once_down_to(before)  # so that the next pause sees the pool gone, as an env phase later
pauser.pause()  # ends nothing: no pool
pauser.start()
print(json.dumps(dict(libs=loaded_libgomp(), before=before, with_pool=with_pool, runtimes=runtimes,
                      paused=paused, restarted=restarted, started=started, not_started=n_threads_once_down_to(before),
                      same=first == again, left=left, remade=remade)))
""",
    )
    assert out["left"] == out["before"], "the first ended pool is left for the policy to make"
    assert out["remade"], "the policy's region made it again: the next step pauses it"
    assert out["started"] == out["with_pool"], "start() makes the pool the pause ended"
    assert out["not_started"] == out["before"], "start() after a pause that ended nothing makes none"
    assert any("libgomp" in lib for lib in out["libs"]), out
    assert out["runtimes"] >= 1
    assert out["with_pool"] > out["before"], "the convolution did not start an OpenMP pool"
    assert out["paused"] == out["before"], out
    assert out["restarted"] == out["with_pool"], out
    assert out["same"]


@pytest.mark.parametrize("pause_openmp", [True, False])
def test_step_async_pauses_the_pool_unless_told_not_to(tmp_path, pause_openmp):
    out = _run(
        tmp_path,
        f"""
import gymnasium as gym
import numpy as np
from shmvec import ShmVecEnv

if __name__ == "__main__":
    venv = ShmVecEnv([lambda: gym.make("CartPole-v1")] * 2, start_method="fork",
                     pause_openmp={pause_openmp})
    venv.reset()
    work()  # the policy's forward pass
    with_pool = n_threads()
    venv.step_async(np.zeros(2, dtype=np.int64))
    # Paused, the pool's threads leave a moment after the pause returns; not paused, none leave.
    during = n_threads_once_down_to(with_pool - 1) if {pause_openmp} else n_threads()
    venv.step_wait()
    venv.close()
    print(json.dumps(dict(with_pool=with_pool, during=during)))
""",
    )
    if pause_openmp:
        assert out["during"] < out["with_pool"], out
    else:
        assert out["during"] == out["with_pool"], out


def test_no_libgomp_listed_without_proc(tmp_path):
    from shmvec.engine.openmp import loaded_libgomp

    assert loaded_libgomp(str(tmp_path / "no-such-maps")) == []
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 0 08:01 1 /usr/lib/libgomp.so.1\n"
        "7f01-7f02 r-xp 0 08:01 2 /site-packages/torch/lib/libgomp-a34b3233.so.1\n"
        "7f02-7f03 r-xp 0 08:01 3 /usr/lib/libgomp_not_a_lib.txt\n"
        "7f03-7f04 r-xp 0 08:01 4 /usr/lib/libiomp5.so\n"
    )
    assert loaded_libgomp(str(maps)) == [
        "/site-packages/torch/lib/libgomp-a34b3233.so.1",
        "/usr/lib/libgomp.so.1",
    ]


def test_no_pool_stops_the_pauses_and_a_forward_pass_brings_them_back(tmp_path):
    """With torch loaded but no forward pass on the CPU (random actions, a GPU policy) there is no
    pool: once a pause has shown that, steps neither pause nor measure (that cost the main process
    ~12 µs per step at 2 workers). A pool made later is paused again at the next step."""
    out = _run(
        tmp_path,
        """
import gymnasium as gym
import numpy as np
from shmvec import ShmVecEnv

if __name__ == "__main__":
    venv = ShmVecEnv([lambda: gym.make("CartPole-v1")] * 2, start_method="fork")
    threads = venv._engine._openmp
    pauses = []
    real_pause = threads.pauser.pause
    threads.pauser.pause = lambda: pauses.append(1) or real_pause()
    venv.reset()
    per_step = []
    for _ in range(8):
        before = len(pauses)
        venv.step(np.zeros(2, dtype=np.int64))
        per_step.append(len(pauses) - before)
    work()  # the policy's forward pass starts a pool
    with_pool = n_threads()
    venv.step_async(np.zeros(2, dtype=np.int64))
    during = n_threads_once_down_to(with_pool - 1)
    venv.step_wait()
    venv.close()
    print(json.dumps(dict(per_step=per_step, with_pool=with_pool, during=during)))
""",
    )
    assert out["per_step"] == [1] + [0] * 7, "the first pause ends nothing; confirmed at the next step"
    assert out["during"] < out["with_pool"], "the pool made after the quiet steps was paused"


def test_a_pool_wrongly_judged_gone_is_paused_again_within_recheck_steps(tmp_path):
    """A pause's threads that had not left yet when start() looked (a very short env phase) make a
    pool look like none: the same thread count then reads as idle. Every RECHECK-th idle step pauses
    all the same, finds the pool and forgets the wrong judgement."""
    out = _run(
        tmp_path,
        """
from shmvec.engine.openmp import OpenMPPauser
before = n_threads()
pauser = OpenMPPauser()
work()
with_pool = n_threads()
pauser._floor = with_pool  # the wrong judgement
idles = []
for _ in range(pauser.RECHECK):
    idle = pauser.idle()
    idles.append(idle)
    if not idle:
        pauser.pause()
        n_threads_once_down_to(before)
        pauser.start()
    work()
print(json.dumps(dict(idles=idles, floor=pauser._floor, idle_after=pauser.idle(), before=before,
                      with_pool=with_pool)))
""",
    )
    assert out["with_pool"] > out["before"], out
    assert out["idles"] == [True] * (len(out["idles"]) - 1) + [False], out["idles"]
    assert out["floor"] == 0 and not out["idle_after"], out


@pytest.mark.parametrize("policy_works", [True, False])
def test_start_makes_only_a_pool_the_policy_makes_again(tmp_path, policy_works):
    """A pool made once by something else than the policy (a network's initialisation, random
    actions after) is not started after every step, where its threads would spin on
    the workers' cores: once the policy has not made it again, steps are idle. A policy whose forward
    pass makes it again gets it started after each step but one in RECHECK, left to the policy to
    look again."""
    out = _run(
        tmp_path,
        f"""
from shmvec.engine.openmp import OpenMPPauser
before = n_threads()
pauser = OpenMPPauser()
work()  # the model's initialisation
with_pool = n_threads()
after_start, idles = [], []
for step in range(pauser.RECHECK + 2):
    if {policy_works}:
        work()  # the forward pass
    idle = pauser.idle()
    idles.append(idle)
    if not idle:
        pauser.pause()
        n_threads_once_down_to(before)  # the env phase
        pauser.start()
    after_start.append(n_threads())
print(json.dumps(dict(before=before, with_pool=with_pool, after_start=after_start, idles=idles)))
""",
    )
    from shmvec.engine.openmp import OpenMPPauser

    before, with_pool, after_start = out["before"], out["with_pool"], out["after_start"]
    assert with_pool > before, out
    if policy_works:
        started = [n == with_pool for n in after_start]
        left = [i for i, s in enumerate(started) if not s]
        # the first ended pool, and the RECHECK-th, are left to the policy
        assert left == [0, OpenMPPauser.RECHECK - 1], (left, after_start)
        assert not any(out["idles"]), out["idles"]
    else:
        assert after_start == [before] * len(after_start), "no pool started that nobody uses"
        # idle from the next step on, but for the RECHECK-th idle step, which looks again
        idles = out["idles"]
        assert [i for i, idle in enumerate(idles) if not idle] == [0, OpenMPPauser.RECHECK], idles


@pytest.mark.parametrize("waits", [True, False])
def test_a_waiting_env_keeps_the_pool_and_a_busy_one_pauses_it(tmp_path, waits):
    """Thread counts in a real ShmVecEnv: the main process is held to one CPU, so a CPU-bound worker
    leaves no spare core, whatever the machine's size."""
    env = "io_s=(0.004, 0.004)" if waits else "work_s=0.004"
    out = _run(
        tmp_path,
        f"""
import numpy as np
from shmvec import ShmVecEnv
from shmvec.synthetic import SyntheticImageEnv

def make():
    return SyntheticImageEnv(shape=(8, 8, 1), {env})

if __name__ == "__main__":
    os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}})
    venv = ShmVecEnv([make] * 2, n_workers=1, start_method="fork")
    paused = counting_pauses(venv._engine._openmp.pauser)
    venv.reset()
    kept, back = [], []
    for _ in range(12):
        work()
        with_pool = n_threads()
        before = len(paused)
        venv.step_async(np.zeros((2,) + venv.action_space.shape, dtype=venv.action_space.dtype))
        kept.append(threads_after_send(len(paused) > before, with_pool) == with_pool)
        venv.step_wait()
        back.append(n_threads() == with_pool)  # started again, before the next forward pass
    venv.close()
    print(json.dumps(dict(kept=kept, back=back)))
""",
    )
    kept = out["kept"]
    # Started again before the next forward pass, once the policy has made it again itself (the
    # first pool the pause ended is left to it: OpenMPPauser.start)
    assert all(out["back"][1:]), out["back"]
    assert not kept[0], "the first step pauses: nothing is measured yet"
    if waits:
        assert all(kept[4:]), kept
    else:
        assert not any(kept), kept


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs: one worker steps while the policy runs"
)
@pytest.mark.parametrize(
    ("batch", "env", "expect"),
    [(2, "work_s=0.01", "kept"), (4, "work_s=0.01", "paused"), (4, "io_s=(0.01, 0.01)", "kept")],
)
def test_pool_mode_pauses_only_for_workers_that_wait_for_the_policy_and_need_the_cores(
    tmp_path, batch, env, expect
):
    """Thread counts in a real pool-mode ShmVectorEnv of 4 envs, held to 2 CPUs. Batches of half the
    envs: the other half steps while the policy runs, so no send pauses. Batches of every env: the
    workers wait for the policy, and the sends pause while the envs burn CPU, not while they sleep."""
    out = _run(
        tmp_path,
        f"""
import numpy as np
from shmvec import ShmVectorEnv
from shmvec.synthetic import SyntheticImageEnv

def make():
    return SyntheticImageEnv(shape=(8, 8, 1), {env})  # a group's step outlasts the policy's

if __name__ == "__main__":
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
    env = ShmVectorEnv([make] * 4, n_workers=2, batch_size={batch}, start_method="fork")
    paused = counting_pauses(env._eng._openmp.pauser)
    env.async_reset(seed=0)
    env.recv()
    kept, back = [], []
    for _ in range(16):
        work()
        with_pool = n_threads()
        before = len(paused)
        env.send(np.zeros({batch}, dtype=env.single_action_space.dtype))
        kept.append(threads_after_send(len(paused) > before, with_pool) == with_pool)
        env.recv()
        back.append(n_threads() == with_pool)
    env.close()
    print(json.dumps(dict(kept=kept, back=back)))
""",
    )
    kept = out["kept"]
    # paused or not, the pool is there for the policy (after the first pause, left to the policy)
    assert all(out["back"][1:]), out["back"]
    if expect == "paused":
        assert not any(kept), kept
    elif batch == 2:
        assert all(kept[1:]), kept
    else:
        assert not kept[0] and all(kept[6:]), kept


def test_thread_count_follows_threads_as_they_start_and_end():
    import threading

    from shmvec.engine.openmp import _thread_count

    before = _thread_count()
    assert before == len(os.listdir("/proc/self/task"))
    release = threading.Event()
    threads = [threading.Thread(target=release.wait) for _ in range(3)]
    for t in threads:
        t.start()
    assert _thread_count() == before + 3
    release.set()
    for t in threads:
        t.join()
    # join() returns before the kernel drops the thread (the race start() is written around), so
    # the count is given a moment to fall; a count that never falls still fails.
    deadline = time.monotonic() + 5.0
    while _thread_count() != before and time.monotonic() < deadline:
        time.sleep(0.001)
    assert _thread_count() == before


def _system_libgomp() -> str | None:
    """The path of the system's libgomp, wherever the platform keeps it (the loader's cache): loaded
    by its name it would be torch's copy, already loaded under that name."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        cache = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return None
    paths = [line.split("=>")[-1].strip() for line in cache.splitlines() if "libgomp.so.1 " in line]
    return next((p for p in paths if os.path.exists(p)), None)


def test_start_makes_no_pool_in_a_runtime_the_policy_does_not_use(tmp_path):
    """A second libgomp (scikit-learn and others bundle their own): pausing asks both, but only the
    runtime whose pool the pause ended is started again; an empty region in the other would leave a
    pool of spinning threads nobody uses."""
    system = _system_libgomp()
    if system is None:
        pytest.skip("no system libgomp to load beside torch's (apt-get install libgomp1)")
    out = _run(
        tmp_path,
        f"""
import ctypes
ctypes.CDLL({system!r})  # by path: a second copy beside torch's, as a bundled one would be
import shmvec.engine.openmp
from shmvec.engine.openmp import OpenMPPauser, loaded_libgomp
pauser = OpenMPPauser()
runtimes = pauser.runtimes()
before = n_threads()
work()
with_pool = n_threads()
pauser.pause()
paused = n_threads_once_down_to(before)
pauser.start()
print(json.dumps(dict(runtimes=runtimes, before=before, with_pool=with_pool, paused=paused,
                      started=n_threads())))
""",
    )
    assert out["runtimes"] == 2, out
    assert out["with_pool"] > out["before"] and out["paused"] == out["before"], out
    # torch's pool is started again unless its threads were still leaving when the pause returned
    # (then the policy's next region starts it); never one in the other runtime.
    assert out["paused"] <= out["started"] <= out["with_pool"], out
