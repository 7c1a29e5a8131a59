"""Atari: the frame-skip check every worker runs, and the native step path for ALE games.

- :mod:`shmvec.atari.frame_skip`: a warning when an action would last 16 frames instead of 4.
- :mod:`shmvec.atari.palette`: ALE's palette, read off ALE, and the per-pixel tables built from it.

Imported by every worker: only the frame-skip check loads here (standard library and gymnasium).
"""

from shmvec.atari.frame_skip import check_frame_skip, frames_per_action

__all__ = ["check_frame_skip", "frames_per_action"]
