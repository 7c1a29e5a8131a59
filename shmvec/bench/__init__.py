"""Measuring VecEnv backends side by side (see :func:`shmvec.bench.runner.compare`)."""
