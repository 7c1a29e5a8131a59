"""The engine behind every shmvec face: one core with three primitives (send, recv, reset) over a
transport. Imports neither SB3 nor torch, and never a face.

- :mod:`~shmvec.engine.build`: options resolved, transport picked, engine started;
- :mod:`~shmvec.engine.core`: the :class:`~shmvec.engine.core.Engine` (start-up, send / recv); its
  resets in :mod:`~shmvec.engine.resets`, its env calls in :mod:`~shmvec.engine.calls`;
- :mod:`~shmvec.engine.flights`: which workers are busy or ready, which make the next batch;
- :mod:`~shmvec.engine.batch_reader`: batches out of the ring (lent from one slot, or gathered from
  several: :mod:`~shmvec.engine.gather`), their observations decoded and checked by
  :mod:`~shmvec.engine.obs_reader`;
- :mod:`~shmvec.engine.faults`: the one fault policy (raise or restart) over what a wait returned;
- :mod:`~shmvec.engine.supervisor`, :mod:`~shmvec.engine.recovery`, :mod:`~shmvec.engine.restart`:
  restart mode's plan, its carrying out, and its budget, seeds and info keys;
  :mod:`~shmvec.engine.startup`: bringing workers up;
- :mod:`~shmvec.engine.options`: every option, declared once; :mod:`~shmvec.engine.autoworkers`:
  ``n_workers="auto"``; :mod:`~shmvec.engine.start_methods`: the default start method and the
  missing ``__main__`` guard;
- :mod:`~shmvec.engine.openmp` (with :mod:`~shmvec.engine.procfs`): the main process's idle OpenMP
  threads ended while the workers step.

Arrows point down: the engine imports the transports (:mod:`shmvec.transports`) and the floors
below them (:mod:`shmvec.wire`, :mod:`shmvec.memory`), never the reverse.
"""
