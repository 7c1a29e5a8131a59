"""The portable transport: chosen where the Linux transport cannot run, selectable on Linux, the same
results; Linux-only features off with a one-line note where they cannot work.

The whole conformance and fault suites run on it too, in CI's portable stage
(``SHMVEC_TRANSPORT=portable``, see ``.ci/run``).
"""

from __future__ import annotations

import functools
import warnings
from contextlib import closing
from multiprocessing.connection import Connection

import gymnasium as gym
import numpy as np
import pytest

import shmvec
from shmvec import PlatformWarning, ShmVectorEnv
from shmvec.memory import doorbell
from shmvec.synthetic import SyntheticImageEnv
from shmvec.transports import TRANSPORT_VAR
from shmvec.transports.local import LocalTransport
from shmvec.transports.portable import PortableTransport
from tests.conftest import CORE

PIXELS = functools.partial(SyntheticImageEnv, (48, 40, 3), episode_len=(3, 9))


@pytest.fixture
def no_linux_pieces(monkeypatch):
    """This platform, as far as shmvec can tell, has no futexes or eventfd (as on macOS or Windows)."""
    monkeypatch.delenv(TRANSPORT_VAR, raising=False)
    monkeypatch.setattr(doorbell, "available", lambda: False)


def _transport(env):
    return env._engine.transport


def test_portable_runs_where_the_linux_pieces_are_missing(no_leaks, no_linux_pieces):
    """With the doorbell reported unavailable, the default is the portable transport, and it gives what
    SyncVectorEnv gives, episode ends included; asking for the Linux one says what is missing."""
    n = 4
    ref = gym.vector.SyncVectorEnv([PIXELS] * n)
    with closing(ShmVectorEnv([PIXELS] * n, n_workers=2, start_method="fork")) as env, closing(ref):
        assert type(_transport(env)) is PortableTransport
        assert env._engine.options.transport == "portable"
        for got, want in zip(env.reset(seed=3), ref.reset(seed=3)):
            np.testing.assert_equal(got, want)
        ends = 0
        for t in range(40):
            actions = np.arange(t, t + n) % 4
            got, want = env.step(actions), ref.step(actions)
            for g, w in zip(got, want):
                np.testing.assert_equal(g, w, err_msg=f"step {t}")
            ends += int(np.sum(got[2] | got[3]))
        assert ends >= 10
    with pytest.raises(ValueError, match=r"transport='linux' needs Linux futexes and os\.eventfd"):
        ShmVectorEnv([PIXELS] * 2, start_method="fork", transport="linux")


def test_transport_option_and_environment_variable(no_leaks, monkeypatch):
    """``transport=``; ``SHMVEC_TRANSPORT`` decides only where the option is "auto"."""
    monkeypatch.setenv(TRANSPORT_VAR, "portable")
    with closing(ShmVectorEnv([PIXELS] * 2, start_method="fork")) as env:
        assert type(_transport(env)) is PortableTransport
    with closing(ShmVectorEnv([PIXELS] * 2, start_method="fork", transport="linux")) as env:
        assert type(_transport(env)) is LocalTransport
    monkeypatch.delenv(TRANSPORT_VAR)
    with closing(ShmVectorEnv([PIXELS] * 2, start_method="fork")) as env:
        assert type(_transport(env)) is LocalTransport  # Linux: the default where it runs
    with pytest.raises(ValueError, match=r"transport must be one of \('auto', 'linux', 'portable'\)"):
        ShmVectorEnv([PIXELS] * 2, start_method="fork", transport="pipes")
    with pytest.raises(ValueError, match="backend='ray' has its own"):
        ShmVectorEnv([PIXELS] * 2, start_method="fork", transport="portable", backend="ray")
    monkeypatch.setenv(TRANSPORT_VAR, "fast")
    with pytest.raises(ValueError, match="SHMVEC_TRANSPORT=fast: the environment variable must be one of"):
        ShmVectorEnv([PIXELS] * 2, start_method="fork")


@pytest.mark.skipif(CORE, reason="the SB3 face: the core venv has no SB3 (this runs in the full suite)")
def test_sb3_face_takes_the_option(no_leaks):
    with shmvec.ShmVecEnv([PIXELS] * 2, "fork", transport="portable") as venv:
        assert type(venv._engine.transport) is PortableTransport
        venv.reset()
        venv.step(np.zeros(2, np.int64))
    with shmvec.ShmVecEnv([PIXELS] * 2, "fork", transport="linux") as venv:
        assert type(venv._engine.transport) is LocalTransport


def test_linux_only_features_are_off_with_one_line_each(no_leaks, no_linux_pieces, monkeypatch):
    """No /proc and no sched_setaffinity (as on macOS or Windows): the OpenMP pause, worker_cpus and
    worker_spin_us are off, each with one line saying so, and the env runs."""
    import shmvec.engine.options as options

    monkeypatch.setattr(options, "has_procfs", lambda: False)
    monkeypatch.setattr(options, "can_pin", lambda: False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = ShmVectorEnv([PIXELS] * 2, start_method="fork", worker_cpus="auto", worker_spin_us=200)
    with closing(env):
        opts = env._engine.options
        assert (opts.pause_openmp, opts.worker_cpus, opts.worker_spin_us) == (False, None, 0)
        assert env._engine._openmp is None
        env.reset(seed=0)
        env.step(np.zeros(2, np.int64))
    notes = sorted(str(w.message) for w in caught if w.category is PlatformWarning)
    assert len(notes) == 3, notes
    assert all("\n" not in note and " is off on " in note for note in notes)
    assert [note.split()[1] for note in notes] == ["pause_openmp", "worker_cpus", "worker_spin_us"]


def test_portable_steps_carry_no_observation(no_leaks, monkeypatch):
    """256x256x3 frames, episode ends every few steps: each step is one small message each way per
    worker; frames (196 KiB) stay in shared memory."""
    counted = {"sent": 0, "received": 0, "messages": 0}
    send, recv = Connection.send_bytes, Connection.recv_bytes

    def counting_send(self, data, *args):
        counted["sent"] += len(data)
        counted["messages"] += 1
        return send(self, data, *args)

    def counting_recv(self, *args):
        data = recv(self, *args)
        counted["received"] += len(data)
        return data

    fns = [functools.partial(SyntheticImageEnv, (256, 256, 3), episode_len=(2, 4))] * 4
    with closing(ShmVectorEnv(fns, n_workers=2, start_method="fork", transport="portable")) as env:
        env.reset(seed=0)
        monkeypatch.setattr(Connection, "send_bytes", counting_send)
        monkeypatch.setattr(Connection, "recv_bytes", counting_recv)
        steps, ends = 50, 0
        for _ in range(steps):
            _, _, terminated, truncated, infos = env.step(np.zeros(4, np.int64))
            ends += int(np.sum(terminated | truncated))
        monkeypatch.undo()
    assert ends > 20
    # One step command per worker and step, and once the typed info columns it learned from the first
    # step (shmvec.memory.infos)
    assert 2 * steps <= counted["messages"] <= 2 * steps + 2
    per_step = (counted["sent"] + counted["received"]) / steps
    assert per_step < 2048, f"{per_step:.0f} bytes per step through the pipes"
