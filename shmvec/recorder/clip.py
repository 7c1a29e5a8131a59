"""One video file, encoded with PyAV (FFmpeg's libraries) frame by frame as frames arrive.

A clip is written to ``<name>.mp4.part`` and renamed to ``<name>.mp4`` only once it is complete, so
a file under the name SB3's ``VecVideoRecorder`` (or Gymnasium's ``RecordVideo``) would give is
always a whole clip. A clip cut short (a worker crashed, the VecEnv closed mid-clip, a frame could
not be captured) is closed as a valid video named ``<name>.incomplete.mp4``; one whose writing failed
(a full disk) is removed.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Encoding:
    """How clips are encoded (PyAV's names).

    :param codec: FFmpeg encoder (default ``"libx264"``, H.264 as moviepy writes it for SB3).
    :param pix_fmt: pixel format (default ``"yuv420p"``, what browsers and W&B play; it needs even
        sizes: an odd frame is padded by one black row or column).
    :param options: encoder options (default ``{"preset": "ultrafast", "crf": "23"}``: ~0.2 ms of
        CPU per 210x160 frame, about half of ``"veryfast"``'s, for files ~25% larger).
    """

    codec: str = "libx264"
    pix_fmt: str = "yuv420p"
    options: dict[str, str] = field(default_factory=lambda: {"preset": "ultrafast", "crf": "23"})

    @classmethod
    def lossless(cls) -> Encoding:
        """H.264 in RGB at constant quality 0: decodes to the frames exactly (larger files, fewer
        players)."""
        return cls("libx264rgb", "rgb24", {"preset": "ultrafast", "crf": "0"})


class ClipFile:
    """One clip being written.

    :param stem: the path without ``.mp4``.
    :param fps: frames per second.
    :param encoding: the encoder settings.
    """

    def __init__(self, stem: str, fps: float, encoding: Encoding) -> None:
        import av  # the record extra; imported only when a clip starts

        self.stem, self.fps, self.encoding = stem, fps, encoding
        self.part = stem + ".mp4.part"
        # A file of ours under the container: it is closed even when FFmpeg's close fails (ENOSPC).
        self.file = open(self.part, "wb")  # noqa: SIM115
        try:
            self.container: Any = av.open(self.file, mode="w", format="mp4")
        except BaseException:
            self.file.close()
            raise
        self.stream: Any = None
        self.frames = 0
        self._av = av

    def add(self, frame: np.ndarray) -> None:
        """Encode one (height, width, 3) uint8 RGB frame (copied: the caller may reuse it)."""
        if self.stream is None:
            self._open(frame.shape)
        if self.pad is not None:
            self.pad[: frame.shape[0], : frame.shape[1]] = frame
            frame = self.pad
        video = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
        for packet in self.stream.encode(video):
            self.container.mux(packet)
        self.frames += 1

    def _open(self, shape: tuple[int, ...]) -> None:
        height, width = shape[0], shape[1]
        even = self.encoding.pix_fmt in _EVEN_SIZES
        h, w = (height + height % 2, width + width % 2) if even else (height, width)
        self.pad = np.zeros((h, w, 3), np.uint8) if (h, w) != (height, width) else None
        stream = self.container.add_stream(self.encoding.codec, rate=_rate(self.fps))
        stream.width, stream.height, stream.pix_fmt = w, h, self.encoding.pix_fmt
        stream.options = dict(self.encoding.options)
        self.stream = stream

    def finish(self, complete: bool) -> str | None:
        """Flush and close; rename to ``<stem>.mp4`` (complete) or ``<stem>.incomplete.mp4``. The
        path written, or None for a clip without frames (removed)."""
        if self.stream is not None:
            for packet in self.stream.encode():
                self.container.mux(packet)
        self.container.close()
        self.file.close()
        if not self.frames:
            os.remove(self.part)
            return None
        path = self.stem + (".mp4" if complete else ".incomplete.mp4")
        os.replace(self.part, path)
        return path

    def abandon(self) -> None:
        """Writing failed: close what can be closed and remove the part file."""
        with contextlib.suppress(Exception):
            self.container.close()
        with contextlib.suppress(OSError):
            self.file.close()
        with contextlib.suppress(OSError):
            os.remove(self.part)


_EVEN_SIZES = ("yuv420p", "yuvj420p", "yuv422p", "yuvj422p", "nv12")


def _rate(fps: float) -> Any:
    from fractions import Fraction

    return Fraction(fps).limit_denominator(1001)


def tile(frames: list[np.ndarray]) -> np.ndarray:
    """Frames side by side as SB3's ``tile_images`` lays them out (a near-square grid, rows first,
    black where the grid has no frame): what ``VecEnv.render()`` shows of several envs."""
    if len(frames) == 1:
        return frames[0]
    n = len(frames)
    height, width, channels = frames[0].shape
    rows = int(np.ceil(np.sqrt(n)))
    cols = int(np.ceil(n / rows))
    grid = np.zeros((rows * cols, height, width, channels), frames[0].dtype)
    grid[:n] = frames
    return (
        grid.reshape(rows, cols, height, width, channels)
        .transpose(0, 2, 1, 3, 4)
        .reshape(rows * height, cols * width, channels)
    )
