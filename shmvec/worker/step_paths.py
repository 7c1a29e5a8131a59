"""Finding a native step path for each env a worker builds (see :mod:`shmvec.native`).

In this order: shmvec's ``frame_stack`` wrapper over an env that has a native path (the stack is
assembled straight into the ring slot); SB3's Atari recipe and CleanRL's ``ppo_atari.py`` chain
(:mod:`shmvec.atari.sb3`); Gymnasium's ``AtariPreprocessing`` (:mod:`shmvec.atari.preprocessing`);
ale-py's ``AtariEnv`` alone (:mod:`shmvec.atari.raw`) or an env that implements ``step_into`` itself,
under Gymnasium's standard wrappers. Anything else steps through its wrappers, with the reason kept
for :class:`~shmvec.native.NativeStatus`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from shmvec.atari import raw
from shmvec.atari.emulator import ATARI_ENV
from shmvec.native import GymLayers, NativeStatus, StepInto, class_name, is_exactly, through_wrappers
from shmvec.worker.frame_stack import FrameStack

_SB3_ATARI = "stable_baselines3.common.atari_wrappers."
_GYM_ATARI = ("gymnasium.wrappers.atari_preprocessing", "gymnasium.wrappers.stateful_observation")


class GenericStep:
    """An env's own ``step_into`` under Gymnasium's ``TimeLimit`` / ``OrderEnforcing`` /
    ``PassiveEnvChecker`` (each optional).

    :param env: the outermost wrapper.
    :param layers: those wrappers, over the env that implements ``step_into``.
    """

    path = "step_into"

    def __init__(self, env: gym.Env, layers: GymLayers) -> None:
        self.env, self.layers, self.inner = env, layers, layers.inner
        self.sync = getattr(self.inner, "sync", _nothing)

    def step_into(self, action: Any, out: np.ndarray) -> StepInto:
        if not self.layers.ready():
            self.sync()
            return through_wrappers(self.env, action, out)
        reward, terminated, truncated, info = self.inner.step_into(action, out)
        return reward, terminated, self.layers.truncate(truncated), info


def _nothing() -> None:
    pass


def adapt(env: gym.Env) -> tuple[Any, NativeStatus]:
    """The native step of ``env`` (an object with ``step_into`` and ``sync``) and its status, or None
    and the status saying why not."""
    if type(env) is FrameStack:
        inner, status = adapt(env.env)
        if inner is None:
            return None, status
        stacked = env.native(inner)
        if stacked is None:
            return None, NativeStatus(None, "frame_stack with a Dict observation space")
        return stacked, NativeStatus(stacked.path)
    if _has_sb3_atari(env) or type(env).__module__ in _GYM_ATARI:
        try:
            from shmvec.atari import preprocessing, sb3
        except ImportError as exc:  # numba or OpenCV: the atari extra has both
            return None, NativeStatus(None, f"{exc.name} is not installed (pip install 'shmvec[atari]')")
        if _has_sb3_atari(env):
            return sb3.recognise(env)
        native, status = preprocessing.recognise(env)
        if native is not None or status.unchecked or type(env).__module__ == _GYM_ATARI[0]:
            return native, status
    layers = GymLayers(env)
    if is_exactly(layers.inner, ATARI_ENV):
        return raw.recognise(env)
    if callable(getattr(type(layers.inner), "step_into", None)):
        return GenericStep(env, layers), NativeStatus(GenericStep.path)
    return None, NativeStatus(None, f"no native step for {class_name(env)}")


def _has_sb3_atari(env: gym.Env) -> bool:
    while isinstance(env, gym.Wrapper):
        if type(env).__module__ + "." == _SB3_ATARI:
            return True
        env = env.env
    return False
