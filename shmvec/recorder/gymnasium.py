"""Gymnasium's face of video recording: :class:`RecordVideo` over a :class:`~shmvec.ShmVectorEnv`,
Gymnasium's ``RecordVideo`` for the envs of a vector env, from frames the workers write while a clip
records (:mod:`shmvec.recorder.video`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gymnasium.vector import VectorEnv, VectorWrapper

from shmvec.recorder.clip import Encoding
from shmvec.recorder.video import VideoRecording, engine_of


def gymnasium_step_name(prefix: str, step_id: int, video_length: int) -> str:
    """Gymnasium's ``RecordVideo`` file name of a clip starting at ``step_id`` (without ``.mp4``)."""
    return f"{prefix}-step-{step_id}"


class RecordVideo(VectorWrapper):
    """Records videos of some envs of a :class:`~shmvec.ShmVectorEnv`, as Gymnasium's
    ``RecordVideo`` records one env: an episode trigger (default Gymnasium's
    ``capped_cubic_video_schedule``: episodes 0, 1, 8, 27, ... 1000, 2000, ...) decided in the workers
    at each reset, files ``<name_prefix>[-env-<i>]-episode-<id>.mp4``; or a step trigger on the
    vector env's steps (files ``<name_prefix>-step-<id>.mp4``, clips of the first frame and
    ``video_length`` more, SB3's count). Encoded by a thread (PyAV), off the step path.

    :param env: a ShmVectorEnv (or wrappers over one); its envs made with ``render_mode="rgb_array"``.
    :param video_folder: where the clips go.
    :param episode_trigger: ``trigger(episode_id) -> bool``, per env.
    :param step_trigger: ``trigger(step_id) -> bool`` on this wrapper's steps (from 0; needs
        ``video_length`` > 0, and a synchronous ``step``: not pool mode's ``send``/``recv``).
    :param video_length: frames after a clip's first at most (default 0: whole episodes).
    :param name_prefix: start of the file names (default ``"rl-video"``).
    :param fps: frames per second (default: the env's ``metadata["render_fps"]``, else 30).
    :param env_ids: the envs recorded (default env 0).
    :param encoding: encoder settings (default H.264, yuv420p).
    """

    def __init__(
        self,
        env: VectorEnv,
        video_folder: str,
        episode_trigger: Callable[[int], bool] | None = None,
        step_trigger: Callable[[int], bool] | None = None,
        video_length: int = 0,
        name_prefix: str = "rl-video",
        fps: float | None = None,
        env_ids: Sequence[int] = (0,),
        encoding: Encoding | None = None,
    ) -> None:
        engine = engine_of(env, "ShmVectorEnv")
        if step_trigger is not None and not video_length:
            raise ValueError("a step trigger needs video_length > 0 (the frames of each clip)")
        if episode_trigger is None and step_trigger is None:
            from gymnasium.utils.save_video import capped_cubic_video_schedule

            episode_trigger = capped_cubic_video_schedule
        super().__init__(env)
        self.recorder = VideoRecording(
            engine, video_folder, env_ids, video_length, step_trigger, episode_trigger,
            gymnasium_step_name, name_prefix, fps, encoding,
        )  # fmt: skip

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset the envs (a step trigger may start a clip with the reset's frame)."""
        self.recorder.before_reset()
        result = self.env.reset(seed=seed, options=options)
        self.recorder.after_reset()
        return result

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Step the envs; the workers capture the frames of the clips recording."""
        self.recorder.before_step()
        try:
            result = self.env.step(actions)
        except BaseException:
            if self.recorder.engine.closed:
                self.recorder.close()
            raise
        self.recorder.after_step()
        return result

    def close(self, **kwargs: Any) -> None:
        """Close the vector env, then finish the clips (one still recording: ``*.incomplete.mp4``)."""
        try:
            self.env.close(**kwargs)
        finally:
            self.recorder.close()
