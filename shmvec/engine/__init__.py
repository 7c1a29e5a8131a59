"""The engine behind every shmvec face: worker pool, ring slots, observation reader, restart
supervisor, error builders. Imports neither SB3 nor torch.

Arrows point one way: ``core`` uses ``pool``, ``slots``, ``reader``, ``supervisor`` and
``failures``; none of those imports ``core``.
"""
