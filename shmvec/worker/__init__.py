"""The worker side: what runs in a worker process (or a Ray actor) next to the user's envs.

- :mod:`~shmvec.worker.loop`: the process's entry point and its command loop;
- :mod:`~shmvec.worker.envs`: the worker's envs and the handler of each command;
- :mod:`~shmvec.worker.encoder`: encoding observation leaves into the ring (codecs);
- :mod:`~shmvec.worker.waiting`: how long to poll for the next command before sleeping;
- :mod:`~shmvec.worker.process`: what a worker process sets up about itself;
- :mod:`~shmvec.worker.envapi`: calling a user's env and checking what it returns;
- :mod:`~shmvec.worker.frame_stack` (with :mod:`~shmvec.worker.frame_stack_kernel`): ``frame_stack=K``,
  SB3's ``VecFrameStack`` inside the worker;
- :mod:`~shmvec.worker.step_paths`: which native step path (:mod:`shmvec.native`) each env takes.

Everything here must stay light to import: a worker started with spawn or forkserver imports it
before anything else, and importing SB3 here would load torch in every worker (~300 MB each). It
never imports the engine, a transport or a face.
"""
