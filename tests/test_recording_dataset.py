"""Minari datasets recorded from the workers' tape by a side process (shmvec.recording.record_dataset):
the same episodes, array for array, as Minari's own DataCollector over the same env, seeds and
actions (Box and Dict observations, frame stacks); a codec's stated fidelity holds; a worker killed
mid-recording leaves only whole episodes; bad input gives one clear error or warning, with nothing
under the dataset's id."""

from __future__ import annotations

import os
import signal
import subprocess
import warnings

import gymnasium as gym
import numpy as np
import pytest

from shmvec import ShmVecEnv, ShmVectorEnv
from shmvec.errors import ClosedError, UnsupportedSpaceError
from tests.envs import DictImageEnv, PaintEnv
from tests.helpers import require

minari = require("minari", "pip install 'shmvec[record]'")
require("jax", "pip install 'minari[create]' (Minari's DataCollector needs it)")

from shmvec.recording import RecordingWarning, record_dataset  # noqa: E402


@pytest.fixture(autouse=True)
def datasets(tmp_path, monkeypatch):
    """Minari's datasets folder, for this test alone (the side process inherits it)."""
    folder = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(folder))
    return folder


def paint() -> gym.Env:
    return PaintEnv()


def dict_image() -> gym.Env:
    return DictImageEnv(size=8)


def stacked_paint() -> gym.Env:
    from shmvec.worker.frame_stack import FrameStack

    return FrameStack(PaintEnv(), 4)


def collect(
    make, seed: int, actions: list, dataset_id: str, jpeg: bool = False, reset_at: tuple[int, ...] = ()
):
    """Minari's DataCollector over one env: reset with ``seed``, then ``actions``, resetting (without
    a seed, as a vector env's autoreset) when an episode ends, and before each action of
    ``reset_at``; the dataset."""
    env = minari.DataCollector(make(), jpeg_encoding=jpeg)
    env.reset(seed=seed)
    for t, action in enumerate(actions):
        if t in reset_at:
            env.reset(options={"minari_autoseed": False})
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset(options={"minari_autoseed": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = env.create_dataset(dataset_id)
    env.close()
    return dataset


def by_env(dataset) -> dict[int, list]:
    """The dataset's episodes of each env, in order."""
    out: dict[int, list] = {}
    metadata = dataset.storage.get_episode_metadata(range(dataset.total_episodes))
    for episode, meta in zip(dataset.iterate_episodes(), metadata):
        out.setdefault(int(meta["shmvec_env"]), []).append((episode, meta))
    return out


def assert_same_episode(got, want) -> None:
    for name in ("actions", "rewards", "terminations", "truncations"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    obs_got, obs_want = got.observations, want.observations
    if isinstance(obs_want, dict):
        assert list(obs_got) == list(obs_want)
        for key in obs_want:
            np.testing.assert_array_equal(obs_got[key], obs_want[key], err_msg=key)
    else:
        np.testing.assert_array_equal(obs_got, obs_want)


@pytest.mark.parametrize(
    "make, options",
    [
        pytest.param(paint, {}, id="box"),
        pytest.param(paint, {"depth": 5}, id="box-shallow-tape"),  # blocks that wrap around the tape
        # reset() cuts the episodes short: DataCollector writes them truncated, and so must we
        pytest.param(paint, {"reset_at": (23,)}, id="box-reset-midway"),
        # another recording starting (before the reset at 17) or stopping (before 31) rebuilds the
        # workers' taps: the episodes those resets cut short are still written, not dropped as torn
        pytest.param(paint, {"reset_at": (17, 31), "other": True}, id="box-reset-after-another-recording"),
        pytest.param(dict_image, {}, id="dict", marks=pytest.mark.slow),
        pytest.param(paint, {"frame_stack": 4}, id="frame-stack", marks=pytest.mark.slow),
    ],
)
def test_dataset_equals_minari_data_collectors(make, options, no_leaks):
    n, steps = 3, 50
    depth = options.pop("depth", 256)
    reset_at = options.pop("reset_at", ())
    other = options.pop("other", False)
    venv = ShmVecEnv([make] * n, n_workers=2, **options)
    space = venv.action_space
    space.seed(0)
    actions = [np.array([space.sample() for _ in range(n)]) for _ in range(steps)]
    second = None  # the other recording, started at the first reset of reset_at, finished at the next
    with record_dataset(venv, "test/shmvec-v0", author="shmvec", depth=depth) as recording:
        venv.seed(20)
        venv.reset()
        for t, batch in enumerate(actions):
            if t in reset_at and other:
                if second is None:
                    second = record_dataset(venv, "test/other-v0")
                else:
                    second.finish()
            if t in reset_at:
                venv.reset()
            venv.step(batch)
    venv.close()
    assert recording.path is not None and recording.stats["dropped"] == 0
    if second is not None:
        # its episodes begin at the reset it started before; finish() writes the open ones truncated
        assert second.stats["dropped"] == 0 and second.stats["episodes"] >= n
    ours = minari.load_dataset("test/shmvec-v0")
    assert ours.storage.metadata["shmvec_fidelity"]["exact"]
    assert ours.storage.metadata["author"] == {"shmvec"}
    mine = by_env(ours)
    reference = stacked_paint if options else make
    cut_at_the_end = 0
    for i in range(n):
        dataset = collect(reference, 20 + i, [a[i] for a in actions], f"test/ref{i}-v0", reset_at=reset_at)
        theirs = list(dataset.iterate_episodes())
        their_meta = dataset.storage.get_episode_metadata(range(dataset.total_episodes))
        # The episode still running at the end: DataCollector writes it truncated, and so must we.
        assert len(mine[i]) == len(theirs) >= 3
        cut_at_the_end += bool(theirs[-1].truncations[-1] and not theirs[-1].terminations[-1])
        for (got, meta), want, want_meta in zip(mine[i], theirs, their_meta):
            assert_same_episode(got, want)
            for key in (
                "total_steps",
                "rewards_sum",
                "rewards_mean",
                "rewards_std",
                "rewards_max",
                "rewards_min",
            ):
                assert meta[key] == want_meta[key], key
        assert mine[i][0][1]["seed"] == 20 + i and "seed" not in mine[i][1][1]
    assert cut_at_the_end >= 1  # the seeds give the case this test is for
    assert recording.stats["episodes"] == ours.total_episodes == sum(len(e) for e in mine.values())


@pytest.mark.slow
def test_gymnasium_face_and_a_codecs_stated_fidelity_holds(no_leaks):
    make = lambda: DictImageEnv(size=32)  # noqa: E731 - 32 px: an image to Minari's JPEG
    env = ShmVectorEnv([make] * 2, n_workers=2)
    rng = np.random.default_rng(0)
    raw = record_dataset(env, "test/raw-v0")
    jpeg = record_dataset(env, "test/jpeg-v0", codec="jpeg")
    env.reset(seed=3)
    for _ in range(60):
        env.step(rng.uniform(-1, 1, (2, 2)).astype(np.float32))
    raw.finish(), jpeg.finish()
    env.close()
    exact = minari.load_dataset("test/raw-v0")
    lossy = minari.load_dataset("test/jpeg-v0")
    stated = lossy.storage.metadata["shmvec_fidelity"]
    assert exact.storage.metadata["shmvec_fidelity"]["max_abs_error"] == 0
    assert stated["codec"] == "minari-jpeg" and not stated["exact"]
    worst, total, count = 0.0, 0.0, 0
    checked = stated["episodes_checked"]
    for a, b in list(zip(exact.iterate_episodes(), lossy.iterate_episodes()))[:checked]:
        np.testing.assert_array_equal(a.observations["vec"], b.observations["vec"])  # not an image
        diff = np.abs(a.observations["image"].astype(np.float64) - b.observations["image"])
        worst, total, count = max(worst, diff.max()), total + diff.sum(), count + diff.size
    assert worst == stated["max_abs_error"] > 0
    assert stated["mean_abs_error"] * stated["values_checked"] == pytest.approx(total)


@pytest.mark.slow
def test_worker_killed_mid_recording_leaves_only_whole_episodes(no_leaks):
    venv = ShmVecEnv([paint] * 4, n_workers=2, on_crash="restart", start_method="fork")
    recording = record_dataset(venv, "test/crash-v0")
    venv.seed(0)
    venv.reset()
    for t in range(80):
        if t == 23:
            os.kill(venv.processes[0].pid, signal.SIGKILL)
        venv.step(np.ones(4, np.int64))
    assert venv.n_restarts == 1
    recording.finish()
    venv.close()
    dataset = minari.load_dataset("test/crash-v0")
    assert recording.stats["dropped"] >= 1  # the episodes the crash cut
    for episode in dataset.iterate_episodes():
        ends = episode.terminations | episode.truncations
        assert ends[-1] and not ends[:-1].any()
        assert len(episode.observations) == len(episode.rewards) + 1


def test_unsupported_spaces_closed_env_and_existing_ids_are_refused_in_one_line(datasets, no_leaks):
    venv = ShmVecEnv([TextEnv])
    with pytest.raises(UnsupportedSpaceError, match="no fixed size"):
        record_dataset(venv, "test/text-v0")
    venv.close()
    stacked = ShmVecEnv([GrayEnv], frame_stack=4)  # (32, 32, 4): an image to Minari, of 4 channels
    with pytest.raises(UnsupportedSpaceError, match="1 or 3 channels"):
        record_dataset(stacked, "test/stack-v0", codec="jpeg")
    (datasets / "test" / "stack-v0").mkdir(parents=True)
    with pytest.raises(ValueError, match="exists already"):
        record_dataset(stacked, "test/stack-v0")
    stacked.close()
    with pytest.raises(ClosedError):
        record_dataset(stacked, "test/other-v0")


def test_storage_minari_refuses_is_said_at_the_start_and_training_goes_on(datasets, no_leaks):
    venv = ShmVecEnv([paint] * 2)
    with pytest.raises(RuntimeError, match="could not start.*bogus"):
        record_dataset(venv, "test/refused-v0", data_format="bogus")
    venv.reset()
    venv.step(np.ones(2, np.int64))  # the workers record nothing: no tape to wait on
    venv.close()
    assert not datasets.exists() or not any(datasets.iterdir())  # no storage left behind


def test_a_recording_without_steps_is_an_empty_dataset_as_data_collectors(no_leaks):
    venv = ShmVecEnv([paint] * 2)
    with record_dataset(venv, "test/empty-v0") as recording:
        venv.reset()  # resets, no step: no episode
    venv.close()
    assert recording.path is not None and recording.stats["episodes"] == 0
    assert minari.load_dataset("test/empty-v0").total_episodes == 0


class GrayEnv(gym.Env):
    observation_space = gym.spaces.Box(0, 255, (32, 32, 1), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros((32, 32, 1), np.uint8), {}

    def step(self, action):
        return np.zeros((32, 32, 1), np.uint8), 0.0, False, False, {}


class TextEnv(gym.Env):
    observation_space = gym.spaces.Text(8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return "a", {}

    def step(self, action):
        return "b", 0.0, False, False, {}


@pytest.mark.slow
def test_full_disk_warns_training_goes_on_and_leaves_nothing(tmp_path, monkeypatch, no_leaks):
    if os.geteuid() != 0:
        message = "a small tmpfs stands for the full disk: mounting one needs root"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)], check=True)
    try:
        monkeypatch.setenv("MINARI_DATASETS_PATH", str(disk))
        venv = ShmVecEnv([lambda: DictImageEnv(size=32)] * 2)
        recording = record_dataset(venv, "test/full-v0")
        venv.reset()
        for _ in range(400):  # ~3 KB a step: past 512 KB (HDF5 may kill the side process then)
            venv.step(np.zeros((2, 2), np.float32))
        with pytest.warns(RecordingWarning, match="not written"):
            assert recording.finish() is None
        venv.step(np.zeros((2, 2), np.float32))  # training goes on
        venv.close()
        assert os.listdir(disk) == []
    finally:
        subprocess.run(["umount", str(disk)], check=True)
