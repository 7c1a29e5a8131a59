"""What a codec does to observations, measured offline: pixel errors, ratio, speed, and the policy's
view. The toolkit behind ``shmvec codecs``; the engine never imports it (the check a running VecEnv
makes is :class:`shmvec.codecs.Tolerance`'s).

- :func:`check` runs a codec over a sequence of frames and returns a :class:`FidelityReport`;
  :func:`~shmvec.codecs.tolerance.errors` is the comparison it makes, the same one ``ShmVecEnv``
  makes against the user's :class:`~shmvec.codecs.Tolerance`.
- :func:`policy_effect` feeds raw and decoded frames to a policy (an SB3 model or any callable) and
  reports how often its action changes, the largest change of its value estimate and the mean KL
  divergence between its action distributions.
- :func:`closed_loop` lets the policy act on decoded observations in the env, paired with the same
  episodes on raw ones: the return difference with a 95% CI and a verdict against the raw policy's
  episode-to-episode spread.
- :func:`collect_frames` gathers real frames from an env with random actions (for the command line
  and the tests).

Modules: :mod:`~shmvec.fidelity.frames` (codecs on frames) and :mod:`~shmvec.fidelity.loop` (the
policy's view, open and closed loop). Only numpy is imported at module level; torch and SB3 are
imported by :func:`policy_effect` and :func:`load_model` alone.
"""

from shmvec.fidelity.frames import (
    FidelityReport,
    candidate_codecs,
    check,
    collect_frames,
    compare,
    load_model,
    roundtrip,
)
from shmvec.fidelity.loop import ClosedLoopReport, PolicyEffect, closed_loop, policy_effect

__all__ = [
    "ClosedLoopReport",
    "FidelityReport",
    "PolicyEffect",
    "candidate_codecs",
    "check",
    "closed_loop",
    "collect_frames",
    "compare",
    "load_model",
    "policy_effect",
    "roundtrip",
]
