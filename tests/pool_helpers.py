"""Driving ShmVectorEnv's pool mode in tests: actions that depend only on (env id, that env's step
count), so that whatever order batches come in, each env's trajectory must equal the same env
stepped alone in this process (:func:`check_trajectories`)."""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shmvec import ShmVectorEnv
from shmvec.vector.pool import _BatchInfos
from tests.envs import FaultyEnv
from tests.helpers import assert_obs_equal


def action_for(space: gym.Space, env_id: int, t: int) -> Any:
    """The action env ``env_id`` gets at its step ``t``: a function of those two only."""
    if isinstance(space, spaces.Discrete):
        return np.int64((3 * env_id + t) % space.n)
    assert isinstance(space, spaces.Box)
    return np.full(space.shape, ((env_id + 2 * t) % 5) / 5 - 0.4, space.dtype)


def env_info(infos: dict, pos: int) -> dict:
    """Env ``pos``'s own info out of Gymnasium's batched infos (recursively)."""
    out = {}
    for k, v in infos.items():
        if k.startswith("_") or k == "env_id":
            continue
        if isinstance(v, dict):
            sub = env_info(v, pos)
            if infos[f"_{k}"][pos]:
                out[k] = sub
        elif infos[f"_{k}"][pos]:
            out[k] = v[pos]
    return out


def alone(fn, env_id: int, seed: int, steps: int) -> list[tuple]:
    """``steps + 1`` results of one env stepped alone (its reset first), NEXT_STEP autoreset; infos
    batched and unbatched the way the vector env does it, so values compare exactly."""
    env = fn()
    obs, info = env.reset(seed=seed + env_id)
    out = [(obs, 0.0, False, False, info)]
    ended = False
    for t in range(steps):
        if ended:
            obs, info = env.reset()
            r, term, trunc = 0.0, False, False
        else:
            obs, r, term, trunc, info = env.step(action_for(env.action_space, env_id, t))
        ended = term or trunc
        out.append((obs, float(r), term, trunc, info))
    env.close()
    return [(o, r, te, tr, env_info(_BatchInfos(1)._add_info({}, i, 0), 0)) for o, r, te, tr, i in out]


def run_pool(
    env: ShmVectorEnv, batches: int, seed: int = 0, each: int = 0, as_list: bool = False
) -> tuple[dict[int, list[tuple]], list[list[int]]]:
    """Drive ``env`` for ``batches`` recv calls, and on until every env has ``each`` results; each
    env's results in order, and each batch's ids. ``as_list``: send actions as a list (pickled)."""
    space = env.single_action_space
    counts: dict[int, int] = defaultdict(int)
    got: dict[int, list[tuple]] = defaultdict(list)
    order: list[list[int]] = []
    env.async_reset(seed=seed)
    k, deadline = 0, time.monotonic() + 60  # a no-hang bound, not a performance figure
    while k < batches or min((len(got[i]) for i in range(env.num_envs)), default=0) < each:
        k += 1
        assert time.monotonic() < deadline, "an env stopped coming back"
        obs, rewards, terms, truncs, infos = env.recv()
        ids = infos["env_id"]
        assert ids.dtype == np.int32 and len(ids) == env.batch_size
        order.append(ids.tolist())
        for pos, i in enumerate(ids.tolist()):
            o = {k: v[pos] for k, v in obs.items()} if isinstance(obs, dict) else obs[pos]
            got[i].append((o, rewards[pos], terms[pos], truncs[pos], env_info(infos, pos)))
        actions = np.array([action_for(space, i, counts[i]) for i in ids.tolist()])
        for i in ids.tolist():
            counts[i] += 1
        env.send(list(actions) if as_list else actions, ids)
    return got, order


def check_trajectories(fn, got: dict[int, list[tuple]], seed: int = 0) -> None:
    for i, results in got.items():
        want = alone(fn, i, seed, len(results) - 1)
        for t, (g, w) in enumerate(zip(results, want)):
            assert_obs_equal(g[0], w[0], f"env {i} step {t} obs", ordered=False)
            assert (g[1], g[2], g[3]) == (w[1], w[2], w[3]), f"env {i} step {t}: {g[1:4]} != {w[1:4]}"
            assert list(g[4]) == list(w[4]), f"env {i} step {t} info keys"
            for k in w[4]:
                assert np.array_equal(np.asarray(g[4][k]), np.asarray(w[4][k])), f"env {i} step {t} {k}"


FAULTY = functools.partial(FaultyEnv)


def make(fns, **kwargs) -> ShmVectorEnv:
    return ShmVectorEnv(fns, start_method="fork", **kwargs)
