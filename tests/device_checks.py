"""Runs of both faces with and without ``device=``, turned into numpy for exact comparison. Shared by
the CPU tests (``device="cpu"``) and the GPU tests (``device="cuda"``), so both check the same things.
Imports torch: never import it from a module the workers import (tests/envs.py)."""

from __future__ import annotations

import re
from contextlib import closing
from typing import Any

import numpy as np
import torch

from shmvec import ShmVecEnv, ShmVectorEnv
from tests.helpers import sample_actions


class Expect:
    """Where each output must be: ``device`` (None: numpy) for observations, and which of ``fields``
    (``device_fields``) are tensors too."""

    def __init__(self, device: str | None, fields: tuple[str, ...] = ()) -> None:
        self.type = None if device is None else torch.device(device).type
        self.fields = fields

    def where(self, field: str) -> str | None:
        return self.type if field == "obs" or field in self.fields else None


def as_numpy(x: Any, device_type: str | None, where: str = "") -> Any:
    """``x`` (an observation, an array, an info value) with tensors turned into numpy copies; every
    array leaf must be a tensor on ``device_type`` (numpy when None). Values of leaves without a fixed
    size (strings, object arrays) are left as they are."""
    if isinstance(x, dict):
        return {k: as_numpy(v, device_type, f"{where}[{k!r}]") for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(as_numpy(v, device_type, f"{where}[{i}]") for i, v in enumerate(x))
    if isinstance(x, torch.Tensor):
        assert device_type is not None, f"{where}: a tensor, expected numpy"
        assert x.device.type == device_type, f"{where}: on {x.device}, expected {device_type}"
        return x.cpu().numpy().copy()
    if isinstance(x, np.ndarray | np.generic) and x.dtype != object:
        assert device_type is None, f"{where}: {type(x).__name__}, expected a tensor on {device_type}"
        return x.copy()
    return x  # a value of a leaf without a fixed size (a string...), or an object array of them


def _sb3_infos(infos: list[dict], expect: Expect) -> list[dict]:
    out = []
    for info in infos:
        info = dict(info)
        if "shmvec.restart_reason" in info:  # names the killed worker's pid, different in each run
            info["shmvec.restart_reason"] = re.sub(r"pid \d+", "pid N", info["shmvec.restart_reason"])
        if "terminal_observation" in info:
            info["terminal_observation"] = as_numpy(
                info["terminal_observation"], expect.where("final_obs"), "terminal_observation"
            )
        out.append(info)
    return out


def sb3_run(fns: list, steps: int, expect: Expect, seed: int = 0, **kwargs: Any) -> list[tuple]:
    """``ShmVecEnv(fns, "fork", **kwargs)``: the reset and ``steps`` steps of seeded random actions,
    as ``(obs, rewards, dones, infos)`` in numpy (the reset as ``(obs,)``)."""
    out: list[tuple] = []
    with ShmVecEnv(fns, "fork", **kwargs) as env:
        env.seed(seed)
        rng = np.random.default_rng(seed)
        out.append((as_numpy(env.reset(), expect.where("obs"), "reset obs"),))
        for t in range(steps):
            obs, rewards, dones, infos = env.step(sample_actions(env.action_space, env.num_envs, rng))
            out.append(
                (
                    as_numpy(obs, expect.where("obs"), f"step {t} obs"),
                    as_numpy(rewards, expect.where("rewards"), f"step {t} rewards"),
                    as_numpy(dones, expect.where("flags"), f"step {t} dones"),
                    _sb3_infos(infos, expect),
                )
            )
    return out


def _gym_infos(infos: dict, expect: Expect) -> dict:
    infos = dict(infos)
    if "final_obs" in infos:
        finals = infos["final_obs"].copy()
        for i in np.flatnonzero(infos["_final_obs"]):
            finals[i] = as_numpy(finals[i], expect.where("final_obs"), "final_obs")
        infos["final_obs"] = finals
    return infos


def gym_run(fns: list, steps: int, expect: Expect, seed: int = 0, **kwargs: Any) -> list[tuple]:
    """``ShmVectorEnv(fns, **kwargs)``: the reset and ``steps`` steps of seeded random actions, in numpy.
    With ``batch_size`` below the env count: pool mode's ``async_reset`` and ``recv``/``send``."""
    out: list[tuple] = []
    with closing(ShmVectorEnv(fns, start_method="fork", **kwargs)) as env:
        rng = np.random.default_rng(seed)
        pool = env.batch_size < env.num_envs
        if pool:
            env.async_reset(seed=seed)
        else:
            obs, infos = env.reset(seed=seed)
            out.append((as_numpy(obs, expect.where("obs"), "reset obs"), _gym_infos(infos, expect)))
        for t in range(steps):
            if pool:
                obs, rewards, terminated, truncated, infos = env.recv()
                env.send(sample_actions(env.single_action_space, env.batch_size, rng))
            else:
                actions = sample_actions(env.single_action_space, env.num_envs, rng)
                obs, rewards, terminated, truncated, infos = env.step(actions)
            out.append(
                (
                    as_numpy(obs, expect.where("obs"), f"step {t} obs"),
                    as_numpy(rewards, expect.where("rewards"), f"step {t} rewards"),
                    as_numpy(terminated, expect.where("flags"), f"step {t} terminations"),
                    as_numpy(truncated, expect.where("flags"), f"step {t} truncations"),
                    _gym_infos(infos, expect),
                )
            )
    return out


def assert_same(got: Any, want: Any, where: str = "run") -> None:
    """Exact equality of two runs (nested tuples, lists, dicts in key order, numpy arrays with their
    dtype, object arrays element by element, plain values)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for key in want:
            assert_same(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, tuple | list) or (isinstance(want, np.ndarray) and want.dtype == object):
        assert type(got) is type(want) and len(got) == len(want), f"{where}: {got!r} != {want!r}"
        for i, (x, y) in enumerate(zip(got, want)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(want, np.ndarray | np.generic):
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape, f"{where}: {got.dtype}{got.shape}"
        np.testing.assert_array_equal(got, want, err_msg=where)
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"
