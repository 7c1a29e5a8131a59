"""The engine behind every shmvec face: worker pool, ring slots, observation reader, restart
supervisor. Imports neither SB3 nor torch.

Arrows point one way: ``core`` uses ``pool``, ``slots``, ``reader``, ``outcomes`` (what a command's
outcome means: raise or rebuild) and ``supervisor``; none of those imports ``core``. The engine
imports the transports (:mod:`shmvec.transports`) and the shared modules below both
(:mod:`shmvec.protocol`, :mod:`shmvec.failures`, ...), never the reverse.
"""
