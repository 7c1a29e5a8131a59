"""Video recording from the workers' tape (shmvec.recording): the clips hold, frame for frame, what
``render()`` gives under DummyVecEnv / Gymnasium's own RecordVideo with the same seeds and actions,
start and end where SB3's VecVideoRecorder and Gymnasium's RecordVideo start and end them, keep the
native Atari path on, and bad input gives one clear error or warning with no partial file under a
complete clip's name."""

from __future__ import annotations

import os
import signal
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest

from shmvec import ShmVecEnv, ShmVectorEnv
from shmvec.errors import ClosedError, WorkerCrashedError
from tests.envs import PaintEnv
from tests.helpers import not_checked, require

av = require("av", "pip install 'shmvec[record]'")
require("stable_baselines3", "pip install 'shmvec[sb3]'")

from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402
from stable_baselines3.common.vec_env import VecVideoRecorder as SB3Recorder  # noqa: E402

from shmvec.recording import Encoding, RecordingWarning, RecordVideo, VecVideoRecorder  # noqa: E402


def paint() -> gym.Env:
    return PaintEnv()


def decode(path: str) -> list[np.ndarray]:
    with av.open(path) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def clips(folder: str) -> dict[str, int]:
    """File name -> frames, of the .mp4 files in ``folder``."""
    return {name: len(decode(os.path.join(folder, name))) for name in sorted(os.listdir(folder))}


class KeptFrames(SB3Recorder):
    """SB3's own VecVideoRecorder, keeping each clip's frames as it captured them (before moviepy's
    lossy encoding)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kept: dict[str, list[np.ndarray]] = {}

    def _stop_recording(self) -> None:
        self.kept[self.video_name] = list(self.recorded_frames)
        super()._stop_recording()


def drive(venv, steps: int, resets: tuple[int, ...], seed: int = 3) -> None:
    """Step ``venv`` with seeded random actions, resetting it instead at the loop counts ``resets``."""
    rng = np.random.default_rng(seed)
    venv.seed(seed)
    venv.reset()
    for t in range(1, steps + 1):
        if t in resets:
            venv.reset()
        else:
            venv.step(rng.integers(0, 3, venv.num_envs))


@pytest.mark.slow
def test_sb3_clips_equal_sb3s_own_frame_for_frame_at_its_boundaries(tmp_path, no_leaks):
    trigger = lambda step: step % 7 == 0  # noqa: E731
    ours = str(tmp_path / "ours")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # moviepy's and our incomplete-clip messages
        reference = KeptFrames(DummyVecEnv([paint] * 3), str(tmp_path / "sb3"), trigger, video_length=4)
        drive(reference, 40, resets=(9, 15, 16))
        reference.close()
        venv = VecVideoRecorder(
            ShmVecEnv([paint] * 3, n_workers=2), ours, trigger, video_length=4, encoding=Encoding.lossless()
        )
        drive(venv, 40, resets=(9, 15, 16))
        venv.close()
    assert len(reference.kept) >= 6
    names = sorted(os.listdir(ours))
    assert [n.replace(".incomplete", "") for n in names] == sorted(reference.kept)
    for name in names:
        decoded = decode(os.path.join(ours, name))
        kept = reference.kept[name.replace(".incomplete", "")]
        assert len(decoded) == len(kept), name
        for got, want in zip(decoded, kept):
            np.testing.assert_array_equal(got, want)
    # Only the clip the close cut short says so (SB3 saves it under the full clip's name).
    assert [n for n in names if "incomplete" in n] == ["rl-video-step-35-to-step-39.incomplete.mp4"]


def test_one_env_clip_is_that_envs_render_exactly(tmp_path, no_leaks):
    venv = VecVideoRecorder(
        ShmVecEnv([paint] * 3, n_workers=3), str(tmp_path), lambda s: s == 2, video_length=5,
        env_ids=[1], encoding=Encoding.lossless(),
    )  # fmt: skip
    reference = DummyVecEnv([paint] * 3)
    rng = np.random.default_rng(0)
    venv.seed(5), reference.seed(5)
    venv.reset(), reference.reset()
    rendered = [reference.envs[1].render()]
    for _ in range(12):
        actions = rng.integers(0, 3, 3)
        venv.step(actions)
        reference.step(actions)
        rendered.append(reference.envs[1].render())
    venv.close()
    assert os.listdir(tmp_path) == ["rl-video-step-2-to-step-7.mp4"]
    decoded = decode(str(tmp_path / "rl-video-step-2-to-step-7.mp4"))
    assert len(decoded) == 6
    for got, want in zip(decoded, rendered[2:8]):
        np.testing.assert_array_equal(got, want)


class KeptEpisodes(gym.wrappers.RecordVideo):
    """Gymnasium's own RecordVideo, keeping each clip's frames as it captured them (moviepy's file
    may hold one frame fewer)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kept: dict[str, list[np.ndarray]] = {}

    def stop_recording(self) -> None:
        self.kept[f"{self._video_name}.mp4"] = list(self.recorded_frames)
        super().stop_recording()


def assert_per_env_clips_equal(env, references: list[KeptEpisodes], folder: str, at_least: int) -> None:
    """Close ``env`` and the references; env ``i``'s clips (``rl-video-env-<i>-...``) are reference
    ``i``'s, name for name and frame for frame (at least ``at_least`` clips each, of 2+ frames)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env.close()
        for ref in references:
            ref.close()
    ours = sorted(os.listdir(folder))
    for i, ref in enumerate(references):
        mine = [n for n in ours if n.startswith(f"rl-video-env-{i}-")]
        assert [n.replace(f"-env-{i}", "").replace(".incomplete", "") for n in mine] == sorted(ref.kept)
        assert len(mine) >= at_least
        for name in mine:
            decoded = decode(os.path.join(folder, name))
            kept = ref.kept[name.replace(f"-env-{i}", "").replace(".incomplete", "")]
            assert len(decoded) == len(kept) > 1, name
            for got, want in zip(decoded, kept):
                np.testing.assert_array_equal(got, want)


@pytest.mark.slow
@pytest.mark.parametrize("length", [0, 3], ids=["whole-episodes", "3-steps"])
def test_gymnasium_episode_clips_equal_gymnasiums_record_video(length, tmp_path, no_leaks):
    trigger = lambda episode: episode % 2 == 0  # noqa: E731
    references = [
        KeptEpisodes(PaintEnv(), str(tmp_path / "ref"), episode_trigger=trigger, video_length=length)
        for _ in range(2)
    ]
    env = RecordVideo(
        ShmVectorEnv([paint] * 2, n_workers=2), str(tmp_path / "ours"), episode_trigger=trigger,
        video_length=length, env_ids=(0, 1), encoding=Encoding.lossless(),
    )  # fmt: skip
    rng = np.random.default_rng(1)
    env.reset(seed=[10, 11])
    for i, ref in enumerate(references):
        ref.reset(seed=10 + i)
    done = [False, False]
    for _ in range(40):
        actions = rng.integers(0, 3, 2)
        env.step(actions)
        for i, ref in enumerate(references):
            if done[i]:  # next-step autoreset: this step is the reset
                ref.reset()
                done[i] = False
            else:
                _, _, term, trunc, _ = ref.step(actions[i])
                done[i] = term or trunc
    assert_per_env_clips_equal(env, references, str(tmp_path / "ours"), at_least=3)


def test_sb3_face_episode_trigger_equals_record_video_per_env(tmp_path, no_leaks):
    # Same-step autoreset: the terminal frame is taken in the worker before the reset.
    trigger = lambda episode: episode in (0, 2, 3)  # noqa: E731
    references = [KeptEpisodes(PaintEnv(), str(tmp_path / "ref"), episode_trigger=trigger) for _ in range(2)]
    venv = VecVideoRecorder(
        ShmVecEnv([paint] * 2, n_workers=1), str(tmp_path / "ours"), episode_trigger=trigger, video_length=0,
        encoding=Encoding.lossless(),
    )  # fmt: skip
    venv.seed(10)
    venv.reset()
    for i, ref in enumerate(references):
        ref.reset(seed=10 + i)
    rng = np.random.default_rng(2)
    for _ in range(30):
        actions = rng.integers(0, 3, 2)
        venv.step(actions)
        for i, ref in enumerate(references):
            _, _, term, trunc, _ = ref.step(actions[i])
            if term or trunc:
                ref.reset()
    assert_per_env_clips_equal(venv, references, str(tmp_path / "ours"), at_least=1)


def test_gymnasium_step_trigger_clips_are_the_vector_steps_frames(tmp_path, no_leaks):
    env = RecordVideo(
        ShmVectorEnv([paint] * 2, n_workers=2), str(tmp_path), step_trigger=lambda s: s in (3, 9),
        video_length=2, env_ids=(1,), encoding=Encoding.lossless(),
    )  # fmt: skip
    reference = [PaintEnv(), PaintEnv()]
    env.reset(seed=[4, 5])
    for i, ref in enumerate(reference):
        ref.reset(seed=4 + i)
    shown = [reference[1].render()]
    done = False
    rng = np.random.default_rng(3)
    for _ in range(12):
        actions = rng.integers(0, 3, 2)
        env.step(actions)
        if done:
            reference[1].reset()
            done = False
        else:
            _, _, term, trunc, _ = reference[1].step(actions[1])
            done = term or trunc
        shown.append(reference[1].render())
    env.close()
    assert sorted(os.listdir(tmp_path)) == ["rl-video-step-3.mp4", "rl-video-step-9.mp4"]
    for start in (3, 9):
        decoded = decode(str(tmp_path / f"rl-video-step-{start}.mp4"))
        assert len(decoded) == 3
        for got, want in zip(decoded, shown[start : start + 3]):
            np.testing.assert_array_equal(got, want)


@pytest.mark.slow
# start 0: the clip opens before the envs' first frame exists; "unchecked": AtariEnv.render's code
# is not one the frame grab was checked against, so the worker calls render() through the wrappers.
@pytest.mark.parametrize(("start", "render_code"), [(0, "checked"), (3, "checked"), (3, "unchecked")])
def test_native_atari_path_stays_on_and_clip_is_alestate_render(
    start, render_code, tmp_path, no_leaks, monkeypatch
):
    ale_py = require("ale_py", "pip install 'shmvec[atari]'")
    from stable_baselines3.common.env_util import make_atari_env

    gym.register_envs(ale_py)
    if render_code == "unchecked":
        not_checked(monkeypatch, "ale_py.env.AtariEnv.render")

    kwargs = {"env_kwargs": {"render_mode": "rgb_array"}, "seed": 0}
    fork = {"start_method": "fork"}  # the workers have ale-py's games registered, as this process
    venv = VecVideoRecorder(
        make_atari_env("PongNoFrameskip-v4", n_envs=2, vec_env_cls=ShmVecEnv, vec_env_kwargs=fork, **kwargs),
        str(tmp_path),
        lambda s: s == start, video_length=20, env_ids=[1], encoding=Encoding.lossless(),
    )  # fmt: skip
    reference = make_atari_env("PongNoFrameskip-v4", n_envs=2, **kwargs)
    venv.reset(), reference.reset()
    rendered = [reference.envs[1].render()]
    rng = np.random.default_rng(0)
    for _ in range(30):
        actions = rng.integers(0, 6, 2)
        venv.step(actions)
        reference.step(actions)
        rendered.append(reference.envs[1].render())
    assert [s.path for s in venv.unwrapped.native_steps] == ["sb3-atari"] * 2
    name = f"rl-video-step-{start}-to-step-{start + 20}.mp4"
    # The encoder works during training, not only at close (a long clip would fill the tape).
    deadline = time.monotonic() + 30  # a bound on a hang
    while not venv.recorder.written and time.monotonic() < deadline:
        time.sleep(0.05)
    assert venv.recorder.written == [str(tmp_path / name)]
    venv.close()
    decoded = decode(str(tmp_path / name))
    assert len(decoded) == 21
    for got, want in zip(decoded, rendered[start : start + 21]):
        np.testing.assert_array_equal(got, want)


def test_env_without_rgb_array_render_mode_is_refused_in_one_line(no_leaks, tmp_path):
    venv = ShmVecEnv([lambda: PaintEnv(render_mode=None)] * 2)
    with pytest.raises(ValueError, match="render_mode='rgb_array'"):
        VecVideoRecorder(venv, str(tmp_path), lambda s: True)
    venv.close()
    with pytest.raises(ClosedError):
        VecVideoRecorder(venv, str(tmp_path), lambda s: True)
    with pytest.raises(TypeError, match="not a DummyVecEnv"):
        VecVideoRecorder(DummyVecEnv([paint]), str(tmp_path), lambda s: True)


def test_full_disk_warns_training_goes_on_and_no_file_is_left(tmp_path, no_leaks):
    # The clip's file is /dev/full: every write fails with ENOSPC, as on a full disk.
    os.symlink("/dev/full", tmp_path / "rl-video-step-0-to-step-30.mp4.part")
    venv = VecVideoRecorder(ShmVecEnv([paint] * 2), str(tmp_path), lambda s: s == 0, video_length=30)
    venv.reset()
    deadline = time.monotonic() + 60  # a bound on a hang: the encoder thread finds the error when it writes
    with pytest.warns(RecordingWarning, match="writing a clip failed"):
        while not venv.recorder.stopped and time.monotonic() < deadline:
            venv.step(np.zeros(2, np.int64))
    assert venv.recorder.stopped
    venv.step(np.zeros(2, np.int64))  # training goes on
    venv.close()
    assert os.listdir(tmp_path) == []


def test_worker_killed_mid_clip_leaves_a_valid_incomplete_video(tmp_path, no_leaks):
    venv = VecVideoRecorder(
        ShmVecEnv([paint] * 2, n_workers=2), str(tmp_path), lambda s: s == 1, video_length=50,
        encoding=Encoding.lossless(),
    )  # fmt: skip
    venv.reset()
    for _ in range(10):
        venv.step(np.zeros(2, np.int64))
    os.kill(venv.unwrapped.processes[1].pid, signal.SIGKILL)
    with pytest.raises(WorkerCrashedError), warnings.catch_warnings():
        warnings.simplefilter("ignore", RecordingWarning)
        for _ in range(5):
            venv.step(np.zeros(2, np.int64))
    venv.close()
    (name,) = os.listdir(tmp_path)
    assert name == "rl-video-step-1-to-step-51.incomplete.mp4"
    assert 10 <= len(decode(str(tmp_path / name))) <= 11
