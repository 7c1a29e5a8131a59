"""Driving ShmVectorEnv's pool mode in tests: actions that depend only on (env id, that env's step
count), so that whatever order batches come in, each env's trajectory must equal the same env
stepped alone in this process (:func:`check_trajectories`); and the engine's steps of some envs of
a group (``send(..., split=True)``, Tianshou's face) against the same envs stepped in this process
(:func:`check_split_steps`)."""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from contextlib import closing
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shmvec import ShmVectorEnv
from shmvec.engine.build import build
from shmvec.engine.options import Options
from shmvec.memory.layout import flatten
from shmvec.vector.pool import _BatchInfos
from tests.envs import DictImageEnv, FaultyEnv
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


def check_split_steps(autoreset: str, **options) -> None:
    """The engine (no face) through 80 steps of random subsets of 5 DictImageEnvs in 2 workers (groups 0..2 and 3..4) sent with
    ``split=True``: each batch equals what the same envs stepped in this process give, and the envs
    not named are not stepped (their next observations, step counts and episode ends show it)."""
    n = 5
    fns = [functools.partial(DictImageEnv, 8, 6)] * n
    opts = Options.from_kwargs("test", {"n_workers": 2, **options}, autoreset=autoreset)
    refs = [DictImageEnv(8, 6) for _ in range(n)]
    space = refs[0].observation_space
    rng = np.random.default_rng(1)
    with closing(build(fns, "fork", opts, "test", info_form="dicts")) as engine:
        arrays, _ = engine.reset(list(range(n)), [{}] * n)
        for i, env in enumerate(refs):
            env.reset(seed=i)
        ended = [False] * n
        ends = 0
        last = {i: [a[i].copy() for a in arrays] for i in range(n)}  # each env's leaves as last seen
        for t in range(80):
            ids = rng.permutation(n)[: rng.integers(1, n + 1)]
            actions = rng.uniform(-1, 1, (len(ids), 2)).astype(np.float32)
            engine.send(actions, ids, split=True)
            batch = engine.recv(at_least=len(ids))
            got_ids = list(range(n)) if batch.env_ids is None else batch.env_ids.tolist()  # None: all
            assert got_ids == sorted(ids.tolist()), t
            done = []
            for k, i in enumerate(got_ids):
                if ended[i]:  # next_step: this step is the reset
                    obs, info = refs[i].reset()
                    reward, term, trunc, ended[i] = 0.0, False, False, False
                else:
                    obs, reward, term, trunc, info = refs[i].step(actions[ids.tolist().index(i)])
                for leaf, got in zip(flatten(space, obs, []), batch.obs):
                    np.testing.assert_array_equal(got[k], leaf, err_msg=f"step {t}, env {i}")
                last[i] = [np.array(got[k]) for got in batch.obs]
                assert (batch.rewards[k], batch.terminated[k], batch.truncated[k]) == (reward, term, trunc)
                if autoreset == "next_step" and not info:
                    info = None
                assert batch.infos.get(k) == (info or None), f"step {t}, env {i}"
                if term or trunc:
                    ends += 1
                    ended[i] = autoreset == "next_step"
                    done.append(i)
            if done and autoreset == "disabled":  # after the batch: a whole one is lent until then
                arrays, _ = engine.reset([None] * n, [{}] * n, np.isin(np.arange(n), done))
                for i in done:
                    obs, _ = refs[i].reset()
                    last[i] = flatten(space, obs, [])
                for i in range(n):  # the envs not reset: as last seen, whichever slot that was in
                    for want, got in zip(last[i], arrays):
                        np.testing.assert_array_equal(got[i], want, err_msg=f"reset after step {t}, env {i}")
        assert ends >= 10
