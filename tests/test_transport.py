"""What crosses the pipes and what each worker runs with."""

from __future__ import annotations

import functools
import os
import threading
from multiprocessing import connection

import numpy as np
import pytest

from shmvec import ShmVecEnv
from shmvec.synthetic import SyntheticImageEnv
from shmvec.wire import framing
from shmvec.wire.framing import read_message, write_message
from tests.envs import DictImageEnv
from tests.helpers import run_script


@pytest.fixture
def pipe_bytes(monkeypatch):
    """Count the bytes the main process sends and receives through the worker pipes."""
    counts = {"sent": 0, "received": 0}
    write, read = framing.write_message, framing.read_message

    def counting_write(fd, data):
        counts["sent"] += len(data)
        return write(fd, data)

    def counting_read(fd):
        out = read(fd)
        counts["received"] += len(out)
        return out

    monkeypatch.setattr(framing, "write_message", counting_write)
    monkeypatch.setattr(framing, "read_message", counting_read)
    return counts


def test_no_observation_crosses_a_pipe(no_leaks, pipe_bytes):
    """256x256x3 frames with an episode end every few steps: a frame (196 KiB) or a terminal
    observation in any message would show. Steps whose actions are in the ring cross no pipe at all
    (the doorbell carries them); what does cross is the leftover infos of envs reset in a step."""
    fns = [functools.partial(SyntheticImageEnv, (256, 256, 3), episode_len=(2, 4))] * 4
    with ShmVecEnv(fns, "fork", n_workers=2) as env:
        env.reset()
        before = dict(pipe_bytes)
        steps, ends = 50, 0
        for _ in range(steps):
            _, _, dones, infos = env.step(np.zeros(4, np.int64))
            ends += int(dones.sum())
            assert all(i["terminal_observation"].shape == (256, 256, 3) for i, d in zip(infos, dones) if d)
        sent = pipe_bytes["sent"] - before["sent"]
        received = pipe_bytes["received"] - before["received"]
    assert ends > 20
    assert sent == 0  # every step went by the doorbell
    assert received > 0  # the replies with reset infos were counted
    per_step = (sent + received) / steps
    assert per_step < 1024, f"{per_step:.0f} bytes per step through the pipes"


@pytest.mark.parametrize("size", [0, 1, 4096, 1 << 16, (1 << 16) + 1, 3 << 20])
def test_framing_round_trip_and_matches_connection(size):
    """Messages of every size arrive whole, one per read, in multiprocessing.Connection's framing
    (which close() still uses to send ``close`` and drain): larger than the pipe's buffer too."""
    data = os.urandom(size)
    ours, theirs = connection.Pipe(duplex=False)  # (read end, write end)
    try:
        writer = threading.Thread(
            target=lambda: (write_message(theirs.fileno(), data), theirs.send_bytes(data))
        )
        writer.start()
        assert read_message(ours.fileno()) == data
        assert read_message(ours.fileno()) == data
        writer.join()
        writer = threading.Thread(target=lambda: write_message(theirs.fileno(), data))
        writer.start()
        assert ours.recv_bytes() == data
        writer.join()
    finally:
        ours.close()
        theirs.close()


def test_framing_refuses_a_cut_message():
    """A writer gone at a message boundary, or in the middle of one, is EOFError, never a short read."""
    for cut in (0, 2, 4 + 10):
        r, w = os.pipe()
        try:
            os.write(w, (b"\x00\x00\x00\x40" + b"x" * 64)[:cut])
            os.close(w)
            with pytest.raises(EOFError):
                read_message(r)
        finally:
            os.close(r)


def test_workers_run_one_blas_thread_even_with_fork(no_leaks):
    with ShmVecEnv([DictImageEnv] * 2, "fork") as env:
        assert env.env_method("blas_threads") == [1, 1]
    if os.cpu_count() and os.cpu_count() > 1 and "OMP_NUM_THREADS" not in os.environ:
        # The control: left alone, the inherited BLAS pool has one thread per core.
        with ShmVecEnv([DictImageEnv] * 2, "fork", worker_threads=None) as env:
            assert env.env_method("blas_threads")[0] > 1


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_fork_workers_do_not_restart_the_blas_pool(no_leaks):
    """Capping OpenBLAS in a forked worker used to restart its thread pool at the parent's size
    (OpenBLAS stops it at fork and restarts it on the next set_num_threads): one extra thread per
    worker that busy-waited ~0.1 s of CPU after every start. A worker of one BLAS thread has no pool
    thread, before and after a matrix product."""
    from threadpoolctl import threadpool_info

    if max((p["num_threads"] for p in threadpool_info() if p["internal_api"] == "openblas"), default=1) < 2:
        pytest.skip("this process's OpenBLAS runs one thread: a fork inherits no pool to restart")
    np.ones((300, 300)) @ np.ones((300, 300))  # this process's pool is running, as after a policy step
    with ShmVecEnv([DictImageEnv] * 2, "fork") as env:
        assert env.env_method("thread_count") == [1, 1]
        assert env.env_method("blas_threads") == [1, 1]
        assert env.env_method("matmul_then_threads") == [(True, 1), (True, 1)]


def test_clean_exit_prints_nothing(tmp_path):
    """No resource_tracker warning or other noise from a normal run, closed or not."""
    proc = run_script(
        tmp_path / "run.py",
        """
        import numpy as np
        from shmvec import ShmVecEnv
        from shmvec.synthetic import SyntheticImageEnv

        if __name__ == "__main__":
            closed = ShmVecEnv([SyntheticImageEnv] * 2, "forkserver")
            closed.reset(); closed.step(np.zeros(2, np.int64)); closed.close()
            forgotten = ShmVecEnv([SyntheticImageEnv] * 2, "fork")
            forgotten.reset()
        """,
    )
    assert proc.returncode == 0
    assert proc.stderr == ""
