"""The main process's idle OpenMP threads are ended while workers step (shmvec.openmp).

Thread counts, not timings: the spin itself is measured by the benchmarks. Each case runs in a fresh
interpreter so the torch thread pool it looks at is its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import types

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
from shmvec.openmp import OpenMPPauser, loaded_libgomp
before = n_threads()
first = work()
with_pool = n_threads()
pauser = OpenMPPauser()
runtimes = pauser.pause()
paused = n_threads_once_down_to(before)
again = work()
restarted = n_threads()
pauser.pause()
pauser.start()
started = n_threads()
pauser.pause()
n_threads_once_down_to(before)  # so that the next pause sees the pool gone, as an env phase later
pauser.pause()  # ends nothing: no pool
pauser.start()
print(json.dumps(dict(libs=loaded_libgomp(), before=before, with_pool=with_pool, runtimes=runtimes,
                      paused=paused, restarted=restarted, started=started, not_started=n_threads_once_down_to(before),
                      same=first == again)))
""",
    )
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
    from shmvec.openmp import loaded_libgomp

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


class _Pauses:
    """Stands in for the libgomp runtimes: counts pauses and starts instead of ending and starting
    threads."""

    def __init__(self, runtimes: int = 1) -> None:
        self.n_runtimes, self.count, self.starts = runtimes, 0, 0

    def runtimes(self) -> int:
        return self.n_runtimes

    def idle(self) -> bool:
        return False

    def pause(self) -> int:
        self.count += 1
        return self.n_runtimes

    def start(self) -> None:
        assert self.starts < self.count, "started without a pause"
        self.starts += 1


class _Phases:
    """A wall clock and workers' run and queued seconds that each phase advances by what the test
    says."""

    def __init__(self) -> None:
        self.now = self.cpu = self.queued = 0.0
        self.reads: list[list[int]] = []
        self.gone = False

    def clock(self) -> float:
        return self.now

    def times(self, pids) -> tuple[float, float] | None:
        self.reads.append(list(pids))
        return None if self.gone else (self.cpu, self.queued)

    def advance(self, busy_cores: float, wall: float = 0.01, queued_cores: float = 0.0) -> None:
        self.now += wall
        self.cpu += busy_cores * wall
        self.queued += queued_cores * wall

    def phase(self, threads, busy_cores: float, wall: float = 0.01) -> bool:
        paused = threads.before_step()
        self.advance(busy_cores, wall)
        threads.after_step()
        return paused

    def pool_cycle(self, threads, busy_cores: float, overlapped: bool) -> bool:
        """send (``overlapped``: the next batch can come without it), the workers step until recv."""
        paused = threads.before_step(overlapped)
        self.advance(busy_cores)
        threads.after_step()
        return paused


def _threads(cpus: int, runtimes: int = 1, pids=(11, 12), every: int = 1):
    from shmvec.openmp import PolicyThreads

    phases = _Phases()
    processes = [types.SimpleNamespace(pid=pid) for pid in pids]
    threads = PolicyThreads(cpus, processes, times=phases.times, clock=phases.clock)
    threads.pauser = _Pauses(runtimes)
    threads.SAMPLE_EVERY = every
    return threads, phases


def test_pauses_while_the_workers_keep_the_cores_busy_and_not_while_they_wait():
    threads, phases = _threads(cpus=2)
    assert phases.phase(threads, 0.9), "nothing measured yet: the first step pauses"
    assert threads.busy is None and phases.reads == [], "the first step's one-time costs are not measured"
    assert phases.phase(threads, 1.8)
    assert threads.busy == pytest.approx(1.8)
    assert all(phases.phase(threads, 1.6) for _ in range(4))
    # The env starts waiting on I/O: the average falls below 1.25 cores within a few steps.
    waits = [phases.phase(threads, 0.05) for _ in range(6)]
    assert waits[0] and not waits[-1], waits
    assert threads.busy < 1
    first_free = waits.index(False)
    assert all(not w for w in waits[first_free:]), "once the average is low it stays low"
    # CPU-bound again: pausing resumes.
    busy_again = [phases.phase(threads, 2.0) for _ in range(8)]
    assert busy_again[-1] and not busy_again[0], busy_again
    assert threads.pauser.count == sum([True] * 6 + waits + busy_again)
    assert threads.pauser.starts == threads.pauser.count, "every paused step starts the pool after it"
    assert phases.reads == [[11, 12]] * (2 * 19), "each phase after the first reads at both ends"


def test_workers_slowed_by_the_spinning_threads_still_count_as_needing_the_cores():
    threads, phases = _threads(cpus=2)
    threads.busy = 1.8
    # Not paused, a spinner holds one core: the workers run on ~1 and queue for the other.
    for _ in range(12):
        threads.before_step()
        phases.advance(0.95, queued_cores=0.5)
        threads.after_step()
    assert threads.busy == pytest.approx(1.45, abs=0.02) and threads.pausing


def test_one_core_pauses_for_a_busy_worker_and_an_unreadable_clock_adds_no_sample():
    threads, phases = _threads(cpus=1)
    assert all(phases.phase(threads, 0.5) for _ in range(4)), "half of the only core is busy"
    assert not all(phases.phase(threads, 0.02) for _ in range(8)), "a worker that waits leaves it spare"
    busy = threads.busy
    phases.gone = True  # a worker ended: its clock cannot be read
    phases.phase(threads, 0.5)
    assert threads.busy == busy


def test_one_phase_in_sample_every_is_measured():
    threads, phases = _threads(cpus=2, every=4)
    assert phases.phase(threads, 1.9) and phases.reads == [], "the first step is not measured"
    assert phases.phase(threads, 0.05)
    assert threads.busy == pytest.approx(0.05) and len(phases.reads) == 2
    assert not any(phases.phase(threads, 1.9) for _ in range(3)), "phases 2-4 are not measured"
    assert threads.busy == pytest.approx(0.05) and len(phases.reads) == 2
    phases.phase(threads, 1.9)
    assert threads.busy > 0.05 and len(phases.reads) == 4


def test_of_many_workers_a_spread_sample_is_read_and_scaled_to_all():
    """Reading 32 workers' clocks at both ends of a phase cost the main process ~65 µs per step: a
    few are read, the same ones each time, and stand for the rest."""
    pids = list(range(100, 132))
    threads, phases = _threads(cpus=16, pids=pids)
    share = {}  # the cores each worker ran on per second of the phase

    def times(asked):
        phases.reads.append(list(asked))
        return sum(share[p] for p in asked) * phases.now, 0.0

    threads._times = times
    share.update(dict.fromkeys(pids, 0.5))  # 16 busy cores in all
    for _ in range(3):
        phases.phase(threads, 0.0)
    assert phases.reads == [[100, 108, 116, 124]] * 4
    assert threads.busy == pytest.approx(16.0) and threads.pausing
    share.update(dict.fromkeys(pids, 0.1))
    for _ in range(30):
        phases.phase(threads, 0.0)
    assert threads.busy == pytest.approx(3.2, abs=0.01) and not threads.pausing
    few, few_phases = _threads(cpus=2, pids=(1, 2, 3, 4))
    few_phases.phase(few, 1.0)
    few_phases.phase(few, 1.0)
    assert few_phases.reads == [[1, 2, 3, 4]] * 2 and few.busy == pytest.approx(1.0), "4 are read in full"


def test_pool_mode_does_not_pause_steps_that_run_while_the_policy_does():
    threads, phases = _threads(cpus=2)
    # batch_size == num_envs: the next batch needs these envs, so pausing pays as in step().
    assert all(phases.pool_cycle(threads, 1.9, overlapped=False) for _ in range(4))
    # Smaller batches: the next batch comes from the other envs while these step.
    assert not any(phases.pool_cycle(threads, 1.9, overlapped=True) for _ in range(4))
    assert threads.busy == pytest.approx(1.9) and len(phases.reads) == 2 * 7, "still measured"
    assert phases.pool_cycle(threads, 1.9, overlapped=False), "decided at every send"


def test_workers_that_wait_for_a_core_count_as_needing_it():
    """Two CPU-bound processes on one CPU: each runs half the time and waits the other half, and
    both halves are demand (the case of workers next to a spinning OpenMP thread)."""
    import os
    import subprocess
    import sys
    import time

    from shmvec.openmp import WorkerClocks

    cpu = min(os.sched_getaffinity(0))
    spin = f"import os, time; os.sched_setaffinity(0, {{{cpu}}}); print(flush=True)\nwhile True: pass"
    children = [subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE) for _ in range(2)]
    try:
        for child in children:
            child.stdout.readline()  # pinned and spinning
        pids = [c.pid for c in children]
        clocks = WorkerClocks()
        (run0, queued0), start = clocks(pids), time.perf_counter()
        time.sleep(0.4)
        (run, queued), wall = clocks(pids), time.perf_counter() - start
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert (run - run0) / wall < 1.2, "the two shared one CPU"
    assert (run - run0 + queued - queued0) / wall > 1.6, "both were runnable all along"
    fds = len(os.listdir("/proc/self/fd"))
    assert clocks(pids) is None, "reaped: the files kept open read as no such process"
    assert len(os.listdir("/proc/self/fd")) == fds - 2, "the reaped pids' files closed"
    assert clocks([os.getpid()]) is not None
    assert len(os.listdir("/proc/self/fd")) == fds - 1, "one opened"
    clocks.close()
    assert len(os.listdir("/proc/self/fd")) == fds - 2


def test_nothing_to_measure_always_pauses_and_no_runtime_reads_nothing():
    threads, phases = _threads(cpus=4, pids=())
    assert all(threads.before_step() for _ in range(3)), "no local workers (Ray): every step pauses"
    threads.after_step()
    assert threads.busy is None and phases.reads == []
    quiet, quiet_phases = _threads(cpus=4, runtimes=0)
    assert not quiet_phases.phase(quiet, 3.0)
    assert quiet.pauser.count == 0 and quiet_phases.reads == [] and quiet.busy is None


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
from shmvec.openmp import OpenMPPauser
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


def test_live_pids_skips_unstarted_processes_and_gives_up_on_a_closed_one():
    import multiprocessing as mp

    from shmvec.openmp import live_pids

    started, unstarted = types.SimpleNamespace(pid=7), mp.get_context("fork").Process(target=print)
    assert live_pids([started, unstarted]) == [7]
    unstarted.close()
    assert live_pids([started, unstarted]) == []


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
    assert all(out["back"]), out["back"]
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
    assert all(out["back"]), out["back"]  # paused or not, the pool is there for the policy
    if expect == "paused":
        assert not any(kept), kept
    elif batch == 2:
        assert all(kept[1:]), kept
    else:
        assert not kept[0] and all(kept[6:]), kept


def test_thread_count_follows_threads_as_they_start_and_end():
    import threading

    from shmvec.openmp import _thread_count

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


def test_close_releases_the_worker_clock_files_while_the_env_is_still_referenced():
    import gymnasium as gym
    import numpy as np

    from shmvec import ShmVecEnv

    venv = ShmVecEnv([lambda: gym.make("CartPole-v1")] * 2, start_method="fork", n_workers=2)
    venv._engine._openmp.pauser = _Pauses()  # a pool to pause: the steps are measured
    venv.reset()
    for _ in range(6):  # phases 1 and 5 are measured: each worker's schedstat is opened
        venv.step(np.zeros(2, dtype=np.int64))
    fds = list(venv._engine._openmp._clocks._files._fds.values())
    assert len(fds) == 2, "the steps were measured"
    venv.close()
    for fd in fds:  # closed: gone, or (reused meanwhile) no longer a worker's schedstat
        with contextlib.suppress(OSError):
            assert not os.readlink(f"/proc/self/fd/{fd}").endswith("/schedstat")


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
import shmvec.openmp
from shmvec.openmp import OpenMPPauser, loaded_libgomp
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
