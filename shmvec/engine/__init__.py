"""The engine behind every shmvec face: one core with three primitives (send, recv, reset) over a
transport. Imports neither SB3 nor torch, and never a face.

- :mod:`~shmvec.engine.build`: options resolved, transport picked, engine started;
- :mod:`~shmvec.engine.core`: the :class:`~shmvec.engine.core.Engine` (start-up, send / recv); its
  resets in :mod:`~shmvec.engine.resets`, its env calls in :mod:`~shmvec.engine.calls`;
- :mod:`~shmvec.engine.flights`: which workers are busy or ready, which make the next batch;
- :mod:`~shmvec.engine.reading`, :mod:`~shmvec.engine.reader`, :mod:`~shmvec.engine.gather`: batches
  out of the ring (lent from one slot, or gathered from several), decoded and checked;
- :mod:`~shmvec.engine.faults`: the one fault policy (raise or restart) over what a wait returned;
- :mod:`~shmvec.engine.supervisor`, :mod:`~shmvec.engine.recovery`: restart mode's budget and its
  carrying out; :mod:`~shmvec.engine.startup`: bringing workers up;
- :mod:`~shmvec.engine.options`: every option, declared once; :mod:`~shmvec.engine.autoworkers`:
  ``n_workers="auto"``.

Arrows point down: the engine imports the transports (:mod:`shmvec.transports`) and the floors
below them (:mod:`shmvec.wire`, :mod:`shmvec.memory`), never the reverse.
"""
