"""The faulty envs the fault tests build: 4 envs on 2 workers, one of which misbehaves (both faces)."""

from __future__ import annotations

import functools

import numpy as np

from tests.envs import FaultyEnv

N_ENVS = 4


ACTIONS = np.ones(N_ENVS, np.int64)


def faulty_fns(fault: str | None, at: int = 3, where: str = "step", victim: int = 3, **kwargs):
    """4 envs on 2 workers; env ``victim`` misbehaves. The default victim is the second env of worker 1,
    so the first one of its group has already stepped (written its row of the slot) when it fails."""
    fns = [functools.partial(FaultyEnv, **kwargs)] * N_ENVS
    fns[victim] = functools.partial(FaultyEnv, fault, at, where, **kwargs)
    return fns
