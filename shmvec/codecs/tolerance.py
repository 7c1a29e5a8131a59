"""What a user accepts from a lossy codec inside a VecEnv (:class:`Tolerance`), and the comparison of
a decoded observation with its raw one (:func:`errors`) that both the engine's sampled checks and
the offline measurement (:mod:`shmvec.fidelity`) make. Only numpy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    """How far a lossy codec may change an observation before ``ShmVecEnv`` reports it.

    :param min_psnr_db: smallest accepted PSNR in dB of a decoded observation (None: no bound).
        Typical: 40 dB is hard to see, 30 dB shows block artifacts on flat Atari backgrounds.
    :param max_abs_error: largest accepted absolute difference of one element (None: no bound).
    :param on_breach: ``"raise"`` (default: :class:`shmvec.errors.FidelityError`) or ``"warn"``
        (:class:`shmvec.errors.FidelityWarning`, once per env and key).
    """

    min_psnr_db: float | None = None
    max_abs_error: float | None = None
    on_breach: Literal["raise", "warn"] = "raise"

    def __post_init__(self) -> None:
        if self.min_psnr_db is None and self.max_abs_error is None:
            raise ValueError("a Tolerance needs min_psnr_db or max_abs_error (or both)")
        if self.on_breach not in ("raise", "warn"):
            raise ValueError(f"on_breach must be 'raise' or 'warn', got {self.on_breach!r}")

    def breach(self, max_abs: float, psnr_db: float) -> str | None:
        """A sentence saying which bound was broken, or None if both hold."""
        if self.max_abs_error is not None and max_abs > self.max_abs_error:
            return f"max abs error {max_abs:g} > {self.max_abs_error:g}"
        if self.min_psnr_db is not None and psnr_db < self.min_psnr_db:
            return f"PSNR {psnr_db:.1f} dB < {self.min_psnr_db:g} dB"
        return None


def peak(dtype: np.dtype, raw: np.ndarray) -> float:
    """The signal peak used for PSNR: the integer dtype's maximum, else the raw data's range (>= 1e-12)."""
    if np.issubdtype(dtype, np.integer):
        return float(np.iinfo(dtype).max)
    return max(float(np.max(raw)) - float(np.min(raw)), 1e-12) if raw.size else 1.0


def errors(raw: np.ndarray, decoded: np.ndarray) -> tuple[float, float, float, float]:
    """``(max_abs_error, mean_abs_error, mse, psnr_db)`` of ``decoded`` vs ``raw`` (psnr inf if equal)."""
    diff = np.abs(decoded.astype(np.float64) - raw.astype(np.float64))
    if diff.size == 0:
        return 0.0, 0.0, 0.0, math.inf
    mse = float(np.mean(diff * diff))
    psnr = math.inf if mse == 0 else 10 * math.log10(peak(raw.dtype, raw) ** 2 / mse)
    return float(diff.max()), float(diff.mean()), mse, psnr
