"""The Ray transport: each worker a Ray actor, possibly on another machine.

- :mod:`~shmvec.transports.ray.transport`: :class:`~shmvec.transports.ray.transport.RayTransport`, the main
  process's side (imports Ray);
- :mod:`~shmvec.transports.ray.connection`: the Ray connection, a local Ray on loopback only when
  shmvec starts one;
- :mod:`~shmvec.transports.ray.actor`: the actor's body, the local worker's own code;
- :mod:`~shmvec.transports.ray.wire`: what a step's batch looks like on the wire, and where it lands.

This package's ``__init__`` imports nothing: ``import shmvec.transports.ray.actor`` in an actor must
not import the main process's side.
"""
