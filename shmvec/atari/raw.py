"""Raw ALE envs (``gymnasium.make("ALE/Pong-v5")``, ``PongNoFrameskip-v4``, ...) stepped natively.

``gymnasium.make`` puts ``OrderEnforcing`` and ``PassiveEnvChecker`` (and ``TimeLimit`` with
``max_episode_steps``) over ale-py's ``AtariEnv``, whose ``step`` acts ``frameskip`` times and then
grabs the screen into a new array (``getScreenRGB()``: 100 KB per step), which the worker copies
into the ring. :class:`RawStep` acts as ``AtariEnv.step`` does (:class:`~shmvec.atari.emulator.Emulator`:
the same ``ale.act`` calls with the same strength, a random frame skip drawn from the env's own
generator, sticky actions inside ALE as always, the two flags, ``TimeLimit``'s count), grabs the
screen once straight into the ring row (``getScreenRGB(out)`` / ``getScreenGrayscale(out)``, ALE's
own conversion: any game, any palette) and builds the info as ``_get_info`` does. It keeps nothing
beside the env's state, so it has nothing to sync; resets go through the wrappers.

What the wrappers would do is done or proven unchanged: ``OrderEnforcing`` and
``PassiveEnvChecker`` see the steps they check (the first two after the first reset, and any step
before a reset) through their own code (:meth:`~shmvec.native.GymLayers.ready`). After those checks
``PassiveEnvChecker.step`` only passes the step on: Gymnasium 1.4's data-reuse check has set its
``_previous_data`` back to None and its flag, and nothing after reads or writes either again (a reset
passes through once ``checked_reset`` is set), so a native step leaves the checker as its step would.

Recognised: ``AtariEnv`` exactly (not a subclass) with RGB or grayscale observations, any integer
or random frame skip, any ``repeat_action_probability`` and ``max_num_frames_per_episode``, no
continuous actions, sound or ``render_mode="human"``, under Gymnasium's ``[TimeLimit]``,
``[OrderEnforcing]``, ``[PassiveEnvChecker]``; the code of each method restated with a fingerprint
in :data:`~shmvec.atari.fingerprints.KNOWN` (``AtariEnv.step``, ``_get_obs``, ``_get_info`` and the
wrappers' ``step``), in every release the ``atari`` extra allows; other code steps through the
wrappers, and the faces warn once. shmvec's ``frame_stack`` on top stacks natively too
(``"ale+frame-stack"``).

Imported by workers: numpy and gymnasium (no numba, no OpenCV: the path needs neither).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from shmvec.atari.emulator import Emulator, emulator
from shmvec.atari.fingerprints import unchecked_status
from shmvec.native import NativeStatus, StepInto, through_wrappers


def recognise(env: gym.Env) -> tuple[RawStep | None, NativeStatus]:
    """The native step of ``env`` if it is ale-py's ``AtariEnv`` under Gymnasium's standard wrappers
    (module docstring) and its status, else None and the status saying why not."""
    emu, reason = emulator(env, raw=True)
    if emu is None:
        return None, NativeStatus(None, reason)
    names = emu.unchecked(raw=True)
    if names:
        return None, unchecked_status(names)
    return RawStep(env, emu), NativeStatus(RawStep.path)


class RawStep:
    """One raw ALE env, stepped natively (see the module docstring).

    :param env: the outermost wrapper (or the ``AtariEnv`` itself).
    :param emu: the ``AtariEnv`` under it, with Gymnasium's wrappers.
    """

    path = "ale"

    def __init__(self, env: gym.Env, emu: Emulator) -> None:
        self.env, self.emu = env, emu
        ale = emu.ale
        self.grab = ale.getScreenRGB if emu.atari._obs_type == "rgb" else ale.getScreenGrayscale

    def sync(self) -> None:
        """Nothing: the env's own state is all there is."""

    def step_into(self, action: Any, out: np.ndarray) -> StepInto:
        """``env.step(action)``; the screen goes into ``out`` (C-contiguous, the space's shape)."""
        emu = self.emu
        if not emu.layers.ready():
            return through_wrappers(self.env, action, out)
        reward, terminated, truncated = emu.frame(action)
        self.grab(out)
        return reward, terminated, truncated, emu.info()
