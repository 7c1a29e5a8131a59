"""The main process's idle OpenMP threads are ended while workers step (shmvec.openmp).

Thread counts, not timings: the spin itself is measured by the benchmarks. Each case runs in a fresh
interpreter so the torch thread pool it looks at is its own.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_script

torch = pytest.importorskip("torch")

_PRELUDE = """
import json, os, sys
import torch
torch.set_num_threads(2)  # a pool with one extra thread even where the machine has fewer cores

def n_threads():
    return len(os.listdir("/proc/self/task"))

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
runtimes = OpenMPPauser().pause()
paused = n_threads()
again = work()
print(json.dumps(dict(libs=loaded_libgomp(), before=before, with_pool=with_pool, runtimes=runtimes,
                      paused=paused, restarted=n_threads(), same=first == again)))
""",
    )
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
    during = n_threads()
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
