"""SB3's face of video recording: :class:`VecVideoRecorder`, a drop-in for SB3's own over a
:class:`~shmvec.ShmVecEnv` (at any depth of VecEnv wrappers), whose frames come from the workers'
tape instead of ``env.render()`` at every step of the main process (:mod:`shmvec.recorder.video`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvObs, VecEnvStepReturn, VecEnvWrapper

from shmvec.recorder.clip import Encoding
from shmvec.recorder.video import VideoRecording, engine_of


def sb3_step_name(prefix: str, step_id: int, video_length: int) -> str:
    """SB3's ``VecVideoRecorder`` file name of a clip starting at ``step_id`` (without ``.mp4``)."""
    return f"{prefix}-step-{step_id}-to-step-{step_id + video_length}"


class VecVideoRecorder(VecEnvWrapper):
    """Records videos of some envs of a :class:`~shmvec.ShmVecEnv` as SB3's ``VecVideoRecorder``
    does (same arguments, same trigger calls, same clips: the first frame and ``video_length``
    more, files ``<video_folder>/<name_prefix>-step-<a>-to-step-<b>.mp4``), from frames the workers
    write while a clip records; encoded by a thread (PyAV), off the step path.

    :param venv: a ShmVecEnv, or VecEnv wrappers over one; its envs made with
        ``render_mode="rgb_array"``.
    :param video_folder: where the clips go.
    :param record_video_trigger: ``trigger(step_id) -> bool``: start a clip at this step (steps of
        this wrapper, from 0), as SB3's.
    :param video_length: frames after a clip's first (default 200, as SB3's).
    :param name_prefix: start of the file names (default ``"rl-video"``).
    :param episode_trigger: instead of a step trigger: ``trigger(episode_id) -> bool`` per env, a
        clip of each chosen episode (Gymnasium's ``RecordVideo``; files
        ``<name_prefix>[-env-<i>]-episode-<id>.mp4``; ``video_length`` 0: whole episodes).
    :param env_ids: the envs recorded (default: every env, tiled into one frame as SB3's
        ``VecEnv.render()`` tiles them; ``[0]`` records env 0 alone, at a fraction of the cost).
    :param fps: frames per second (default: the env's ``metadata["render_fps"]``, else 30).
    :param encoding: encoder settings (default H.264, yuv420p; ``Encoding.lossless()`` decodes to
        the frames exactly).
    """

    def __init__(
        self,
        venv: VecEnv,
        video_folder: str,
        record_video_trigger: Callable[[int], bool] | None = None,
        video_length: int = 200,
        name_prefix: str = "rl-video",
        *,
        episode_trigger: Callable[[int], bool] | None = None,
        env_ids: Sequence[int] | None = None,
        fps: float | None = None,
        encoding: Encoding | None = None,
    ) -> None:
        engine = engine_of(venv, "ShmVecEnv")
        VecEnvWrapper.__init__(self, venv)
        self.video_folder, self.video_length, self.name_prefix = video_folder, video_length, name_prefix
        ids = range(venv.num_envs) if env_ids is None else env_ids
        self.recorder = VideoRecording(
            engine, video_folder, ids, video_length, record_video_trigger, episode_trigger,
            sb3_step_name, name_prefix, fps, encoding,
        )  # fmt: skip

    @property
    def step_id(self) -> int:
        """Steps taken through this wrapper (SB3's ``VecVideoRecorder.step_id``)."""
        return self.recorder.step_id

    def reset(self) -> VecEnvObs:
        """Reset the envs; a clip starts here when the trigger says so (with the reset's frame)."""
        self.recorder.before_reset()
        obs = self.venv.reset()
        self.recorder.after_reset()
        return obs

    def step_async(self, actions: Any) -> None:
        """Send the actions; this step's frame is captured when a clip is recording or starts."""
        self.recorder.before_step()
        self.venv.step_async(actions)

    def step_wait(self) -> VecEnvStepReturn:
        """Wait for the step; a failure that closed the VecEnv ends the clip as incomplete."""
        try:
            result = self.venv.step_wait()
        except BaseException:
            if self.recorder.engine.closed:
                self.recorder.close()  # the clip so far becomes a valid, incomplete video
            raise
        self.recorder.after_step()
        return result

    def close(self) -> None:
        """Close the VecEnv, then finish the clips (one still recording: ``*.incomplete.mp4``)."""
        try:
            VecEnvWrapper.close(self)
        finally:
            self.recorder.close()
