"""What crosses between the main process and a worker besides the ring: typed messages
(:mod:`shmvec.wire.messages`) and how a pipe frames them (:mod:`shmvec.wire.framing`).

Imported by worker processes: numpy, cloudpickle and the standard library only.
"""
