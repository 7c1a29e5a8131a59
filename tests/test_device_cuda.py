"""``device="cuda"``: pageable copies equal to numpy's (the default path runs test_device.py's
equality tests on the GPU), the ring slot a copy reads not
written before the copy's event completed, the pages unregistered at ``close()``, a refused
registration's fallback. Needs a GPU: every test here is skipped, with the reason, without one.

On a GPU machine: ``python -m pytest -q tests/test_device_cuda.py tests/test_device.py tests/test_pinning.py``.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from shmvec import ShmVecEnv
from shmvec.device import pinning
from shmvec.synthetic import SyntheticImageEnv
from tests.device_checks import Expect, assert_same, sb3_run
from tests.envs import DictImageEnv

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason=f"needs a CUDA GPU (torch {torch.__version__}, no CUDA device visible)",
)

IMAGE = functools.partial(SyntheticImageEnv, (84, 84, 4), episode_len=(3, 9))
ACTIONS = np.zeros(3, np.int64)
CUDA = Expect("cuda")
SLEEP_CYCLES = 2_000_000_000  # ~1 s of GPU clock: far longer than the workers take to write a slot


@pytest.mark.parametrize("copy", [True, False])
def test_pageable_copies_equal_the_numpy_results(no_leaks, copy):
    """pin_memory=False: every copy from pageable memory (the equality tests of test_device.py run
    the default, pinned, path on the GPU)."""
    kwargs = dict(n_workers=2, copy=copy)
    want = sb3_run([DictImageEnv] * 3, 20, Expect(None), **kwargs)
    assert_same(sb3_run([DictImageEnv] * 3, 20, CUDA, device="cuda", pin_memory=False, **kwargs), want)


def _reference(steps: int, **kwargs) -> list[np.ndarray]:
    with ShmVecEnv([IMAGE] * 3, "fork", n_workers=2, **kwargs) as env:
        env.seed(0)
        env.reset()
        return [np.asarray(env.step(ACTIONS)[0]).copy() for _ in range(steps)]


@pytest.mark.parametrize("copy", [True, False])
def test_no_slot_is_written_before_its_copy_completed(no_leaks, copy, monkeypatch):
    """The copy of the first batch is held back on the side stream for ~1 s while the loop steps on:
    every batch must still be the one the workers wrote for that step. Then the control: with the
    fence disabled, the same loop reads a batch the workers wrote later (so this test can fail)."""
    want = _reference(6, copy=copy)

    def run() -> list[np.ndarray]:
        with ShmVecEnv([IMAGE] * 3, "fork", n_workers=2, copy=copy, device="cuda", pin_memory=True) as env:
            env.seed(0)
            env.reset()
            with torch.cuda.stream(env._eng.device.stream):
                torch.cuda._sleep(SLEEP_CYCLES)  # the next copy waits behind this
            snapshots = []
            for _ in range(6):
                # A copy on the consumer's stream, made before the next step (copy=False tensors are
                # valid until the next-but-one batch).
                snapshots.append(env.step(ACTIONS)[0].clone())
            return [s.cpu().numpy() for s in snapshots]

    got = run()
    for t, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"step {t}")
    monkeypatch.setattr("shmvec.engine.slots.Slots.fence", lambda self, slot, event: None)
    unfenced = run()
    assert any(not np.array_equal(g, w) for g, w in zip(unfenced, want)), "the control raced nothing"


def test_close_unregisters_the_pages(no_leaks, monkeypatch):
    calls: list[tuple[int, int]] = []
    real = pinning.CudaRuntime.unregister

    def unregister(self, ptr):
        code = real(self, ptr)
        calls.append((ptr, code))
        return code

    monkeypatch.setattr(pinning.CudaRuntime, "unregister", unregister)
    env = ShmVecEnv([IMAGE] * 3, "fork", n_workers=2, device="cuda", pin_memory=True)
    pinned = env._eng.device.pinned
    assert pinned is not None and pinned.registered
    cudart = torch.cuda.cudart()
    again = int(cudart.cudaHostRegister(pinned.ptr, pinned.size, 0))
    assert again != 0, "the ring's pages were not registered"  # cudaErrorHostMemoryAlreadyRegistered
    pinning.clear_last_error()
    env.reset()
    env.step(ACTIONS)
    env.close()
    assert calls == [(pinned.ptr, 0)] and not pinned.registered
    torch.ones(1, device="cuda").add_(1)  # no CUDA error left armed for torch's next launch


def test_a_refused_registration_falls_back_or_raises(no_leaks, monkeypatch):
    real = pinning.CudaRuntime.register

    def refused(self, ptr, size):
        return real(self, 0, size)  # a real failure of the real runtime: a null pointer

    monkeypatch.setattr(pinning.CudaRuntime, "register", refused)
    with pytest.raises(RuntimeError, match="refused to register"):
        ShmVecEnv([IMAGE] * 3, "fork", n_workers=2, device="cuda", pin_memory=True)
    want = sb3_run([IMAGE] * 3, 10, Expect(None), n_workers=2)
    with pytest.warns(RuntimeWarning, match="pageable memory"):
        got = sb3_run([IMAGE] * 3, 10, CUDA, n_workers=2, device="cuda")
    assert_same(got, want)
    torch.ones(1, device="cuda").add_(1)  # the refusal's error was cleared


def test_a_low_memlock_limit_pins_or_falls_back_as_documented(tmp_path):
    from tests.helpers import run_script

    done = run_script(
        tmp_path / "memlock.py",
        """
        import functools, resource, warnings
        import numpy as np
        from shmvec import ShmVecEnv
        from shmvec.synthetic import SyntheticImageEnv

        if __name__ == "__main__":
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 * 1024, resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]))
            frames = functools.partial(SyntheticImageEnv, (210, 160, 3), episode_len=(3, 9))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with ShmVecEnv([frames] * 4, "fork", n_workers=2, device="cuda") as env:
                    env.reset()
                    pinned = env._eng.device.pinned is not None
            refusals = [str(w.message) for w in caught if "refused to register" in str(w.message)]
            assert pinned != bool(refusals), (pinned, refusals)
            assert all("ulimit -l" in r for r in refusals), refusals
            print("pinned" if pinned else "fallback")
        """,
    )
    assert done.returncode == 0 and done.stdout.strip() in ("pinned", "fallback"), done.stderr[-3000:]
