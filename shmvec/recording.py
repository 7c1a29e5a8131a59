"""Videos and datasets recorded from shmvec's workers, off the step path.

- Video, SB3: ``VecVideoRecorder(ShmVecEnv(...), folder, record_video_trigger, video_length)``, SB3's
  ``VecVideoRecorder`` arguments and file names (:class:`shmvec.recorder.sb3.VecVideoRecorder`).
- Video, Gymnasium: ``RecordVideo(ShmVectorEnv(...), folder, episode_trigger=...)``
  (:class:`shmvec.recorder.gymnasium.RecordVideo`).
- Datasets: ``record_dataset(env, dataset_id, ...)`` writes Minari datasets from a side process
  (:func:`shmvec.recorder.dataset.record_dataset`), either face.

Workers write render frames (a native Atari path: ALE's screen, without leaving the native step) or
steps into a shared-memory tape apart from the ring, only while a recording is on; a thread (video,
PyAV) or a side process (dataset, minari) reads it. See the docs' Recording page for what each
costs. Needs the ``record`` extra (``pip install 'shmvec[record]'``); SB3's wrapper needs SB3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shmvec.recorder.clip import Encoding
from shmvec.recorder.video import RecordingWarning

if TYPE_CHECKING:
    from shmvec.recorder.dataset import DatasetRecording, record_dataset
    from shmvec.recorder.gymnasium import RecordVideo
    from shmvec.recorder.sb3 import VecVideoRecorder

__all__ = [
    "DatasetRecording",
    "Encoding",
    "RecordVideo",
    "RecordingWarning",
    "VecVideoRecorder",
    "record_dataset",
]

# Imported on first use: SB3's wrapper imports SB3, the others import only what they need.
_LAZY = {
    "VecVideoRecorder": "shmvec.recorder.sb3",
    "RecordVideo": "shmvec.recorder.gymnasium",
    "record_dataset": "shmvec.recorder.dataset",
    "DatasetRecording": "shmvec.recorder.dataset",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'shmvec.recording' has no attribute {name!r}")
