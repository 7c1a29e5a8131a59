"""Registering the ring with CUDA (shmvec.device.pinning), with a fake CUDA runtime: what each
``pin_memory`` does when CUDA accepts or refuses, the memlock hint, the order of the teardown, and
the clearing of the runtime's last error. Runs on every machine; test_device_cuda.py checks the same
against the real runtime when a GPU is present."""

from __future__ import annotations

import functools
import warnings

import pytest

from shmvec import ShmVecEnv
from shmvec.device import pinning
from shmvec.device.pinning import clear_last_error, mapped_libraries, pin_ring, ring_extent
from shmvec.synthetic import SyntheticImageEnv

IMAGE = functools.partial(SyntheticImageEnv, (12, 10, 3), episode_len=(2, 5))


class Runtime:
    """A CUDA runtime that accepts (code 0) or refuses registrations, recording every call."""

    def __init__(self, code: int = 0, clears: bool = True) -> None:
        self.code, self.clears = code, clears
        self.calls: list[tuple] = []

    def register(self, ptr, size):
        self.calls.append(("register", ptr, size))
        return self.code, "cudaErrorMemoryAllocation" if self.code else "cudaSuccess"

    def unregister(self, ptr):
        self.calls.append(("unregister", ptr))
        return 0

    def clear_error(self):
        self.calls.append(("clear",))
        return self.clears


class Stream:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def synchronize(self):
        self.calls.append(("synchronize",))


@pytest.fixture
def ring(no_leaks):
    with ShmVecEnv([IMAGE] * 2, "fork", n_workers=1) as env:
        yield env._eng.ring


def test_the_whole_segment_is_registered_once_and_unregistered_after_the_copies(ring):
    runtime = Runtime()
    ptr, size, _ = ring_extent(ring)
    assert size == ring.spec.size and size >= sum(f.nbytes for f in ring.spec.fields)
    pinned = pin_ring(ring, None, Stream(runtime.calls), runtime)
    assert pinned is not None and pinned.registered and (pinned.ptr, pinned.size) == (ptr, size)
    assert runtime.calls == [("register", ptr, size)]
    pinned.release()
    pinned.release()  # idempotent
    assert not pinned.registered
    # The side stream is synchronized before the pages go: no copy may still read them.
    assert runtime.calls == [("register", ptr, size), ("synchronize",), ("unregister", ptr)]


def test_an_unreleased_registration_is_undone_by_the_garbage_collector(ring):
    runtime = Runtime()
    pinned = pin_ring(ring, None, Stream(runtime.calls), runtime)
    del pinned
    assert runtime.calls[-1][0] == "unregister"


def test_pin_memory_false_never_registers(ring):
    runtime = Runtime()
    assert pin_ring(ring, False, Stream(runtime.calls), runtime) is None
    assert runtime.calls == []


def test_a_refusal_falls_back_with_a_warning_by_default(ring, monkeypatch):
    monkeypatch.setattr(pinning, "memlock_limit", lambda: 1024)  # below the ring's size
    runtime = Runtime(code=2)
    with pytest.warns(
        RuntimeWarning, match=r"refused.*cudaErrorMemoryAllocation, code 2.*ulimit -l.*pageable"
    ):
        assert pin_ring(ring, None, Stream(runtime.calls), runtime) is None
    assert runtime.calls[-1] == ("clear",)  # the runtime's last error does not reach torch's next call


def test_the_memlock_hint_only_when_the_limit_is_below_the_ring(ring, monkeypatch):
    monkeypatch.setattr(pinning, "memlock_limit", lambda: None)
    with pytest.warns(RuntimeWarning) as caught:
        pin_ring(ring, None, Stream([]), Runtime(code=2))
    assert "ulimit" not in str(caught[0].message)


def test_a_refusal_raises_with_pin_memory_true(ring):
    runtime = Runtime(code=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match=r"refused.*pin_memory=None falls back"):
            pin_ring(ring, True, Stream(runtime.calls), runtime)
    assert ("clear",) in runtime.calls


def test_a_refusal_whose_error_cannot_be_cleared_raises(ring):
    with pytest.raises(RuntimeError, match=r"could not be cleared.*pin_memory=False"):
        pin_ring(ring, None, Stream([]), Runtime(code=2, clears=False))


MAPS = """\
7f0000000000-7f0000001000 r-xp 00000000 08:01 1 /usr/lib/libc.so.6
7f0000001000-7f0000002000 r-xp 00000000 08:01 2 /venv/torch/lib/libcudart-9335f6a2.so.12
7f0000002000-7f0000003000 r--p 00001000 08:01 2 /venv/torch/lib/libcudart-9335f6a2.so.12
7f0000003000-7f0000004000 r-xp 00000000 08:01 3 /usr/local/cuda/lib64/libcudart.so.12.4 (deleted)
7f0000004000-7f0000005000 rw-p 00000000 00:00 0
"""


def test_the_runtime_libraries_are_found_in_the_process_maps():
    assert mapped_libraries(MAPS, "libcudart") == [
        "/venv/torch/lib/libcudart-9335f6a2.so.12",
        "/usr/local/cuda/lib64/libcudart.so.12.4",
    ]


def test_the_last_error_is_cleared_in_every_mapped_runtime(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(MAPS)
    called: list[str] = []

    class Library:
        def __init__(self, path):
            if "local" in path:
                raise OSError("gone")  # a copy that cannot be opened again is skipped
            self.path = path

        def cudaGetLastError(self):  # noqa: N802 (the runtime's name)
            called.append(self.path)

    assert clear_last_error(maps_path=str(maps), load=Library)
    assert called == ["/venv/torch/lib/libcudart-9335f6a2.so.12"]
    assert not clear_last_error(maps_path=str(tmp_path / "missing"), load=Library)
    (tmp_path / "none").write_text("7f0000000000-7f0000001000 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n")
    assert not clear_last_error(maps_path=str(tmp_path / "none"), load=Library)
