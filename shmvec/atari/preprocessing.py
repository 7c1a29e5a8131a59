"""Gymnasium's ``AtariPreprocessing`` (and ``FrameStackObservation`` over it) stepped natively.

The wrapper steps the ``AtariEnv`` once per frame, which grabs an RGB screen every frame that the
wrapper throws away, then grabs ALE's gray screen of the last two frames itself, max-pools them in
place and resizes with OpenCV. :class:`PreprocessingStep` acts per frame without any screen
(:class:`~shmvec.atari.emulator.Emulator`), grabs the same two gray screens into the wrapper's own
buffers, max-pools them in place as the wrapper does, and resizes with
:class:`~shmvec.atari.warp.Warp` straight into the ring. ``FrameStackObservation`` on top keeps its
queue of frames as it would (frames from a small ring of arrays, so a step allocates none) and the
stack is written into the ring; its ``stacked_obs`` buffer is brought up to date by :meth:`sync`.

Recognised: ``[FrameStackObservation]`` (any padding), ``AtariPreprocessing`` with gray
observations, not scaled, over an ``AtariEnv`` under Gymnasium's standard wrappers (any
``frame_skip``, ``noop_max``, ``screen_size``, ``terminal_on_life_loss``, ``grayscale_newaxis``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from shmvec.atari.emulator import METHODS, Emulator, emulator
from shmvec.atari.fingerprints import unchecked_status, unknown_code
from shmvec.atari.warp import MAX, Warp, checked
from shmvec.native import NativeStatus, StepInto, class_name, is_exactly, through_wrappers

PREPROCESSING = "gymnasium.wrappers.atari_preprocessing.AtariPreprocessing"
FRAME_STACK = "gymnasium.wrappers.stateful_observation.FrameStackObservation"


def recognise(env: gym.Env) -> tuple[Any, NativeStatus]:
    """The native step of ``env`` if it is ``AtariPreprocessing`` (with ``FrameStackObservation``
    on top, optionally; module docstring) and its status, else None and the status saying why not."""
    stack = None
    if is_exactly(env, FRAME_STACK):
        stack, env = env, env.env  # type: ignore[attr-defined]
    if not is_exactly(env, PREPROCESSING):
        why = f"{class_name(env)} where Gymnasium's AtariPreprocessing was expected"
        return None, NativeStatus(None, why)
    pre: Any = env
    if not pre.grayscale_obs or pre.scale_obs:
        return None, NativeStatus(None, "AtariPreprocessing with RGB or scaled observations")
    emu, reason = emulator(pre.env)
    if emu is None:
        return None, NativeStatus(None, reason)
    names = emu.unchecked() + unknown_code([pre] if stack is None else [stack, pre], METHODS)
    if names:
        return None, unchecked_status(names)
    size = (pre.screen_size[1], pre.screen_size[0])
    warp = checked(tuple(emu.ale.getScreenDims()), size, colour=False)
    if warp is None:
        why = f"this OpenCV's INTER_AREA resize to {size} is not the one shmvec restates"
        return None, NativeStatus(None, why)
    step: Any = PreprocessingStep(pre, emu, warp)
    step = step if stack is None else StackedObservationStep(stack, step)
    return step, NativeStatus(step.path)


class PreprocessingStep:
    """One env of ``AtariPreprocessing``, stepped natively (see the module docstring).

    :param pre: the wrapper.
    :param emu: the ``AtariEnv`` under it, with Gymnasium's wrappers.
    :param warp: the gray resize for its screen and output sizes.
    """

    path = "gymnasium-atari"

    def __init__(self, pre: Any, emu: Emulator, warp: Warp) -> None:
        self.pre, self.emu, self.warp = pre, emu, warp
        self.rows = warp.state()

    def sync(self) -> None:
        """Nothing: the wrapper's own buffers are kept as it keeps them."""

    def step_into(self, action: Any, out: np.ndarray) -> StepInto:
        """One agent step; the resized frame goes into ``out``."""
        pre, emu = self.pre, self.emu
        if not emu.layers.ready():
            return through_wrappers(pre, action, out)
        ale, buffers, skip = emu.ale, pre.obs_buffer, pre.frame_skip
        total = 0.0
        terminated = truncated = False
        for t in range(skip):
            reward, terminated, truncated = emu.frame(action)
            total += reward
            pre.game_over = terminated
            if pre.terminal_on_life_loss:
                lives = ale.lives()
                terminated = terminated or lives < pre.lives
                pre.game_over = terminated
                pre.lives = lives
            if terminated or truncated:
                break
            if t == skip - 2:
                ale.getScreenGrayscale(buffers[1])
            elif t == skip - 1:
                ale.getScreenGrayscale(buffers[0])
        if skip > 1:
            np.maximum(buffers[0], buffers[1], out=buffers[0])
        self.warp(buffers[0], buffers[0], MAX, out.reshape(self.warp.size), self.rows)
        return total, terminated, truncated, emu.info()


class StackedObservationStep:
    """``FrameStackObservation`` over a native step: its queue takes the new frame (from a ring of
    ``stack_size + 1`` arrays: a frame is overwritten only once the queue has dropped it), and the
    stack is written into the ring slot.

    :param stack: the wrapper.
    :param inner: the native step of the env under it.
    """

    def __init__(self, stack: Any, inner: Any) -> None:
        self.stack, self.inner = stack, inner
        self.path = f"{inner.path}+frame-stack-observation"
        shape = stack.env.observation_space.shape
        self.frames = np.zeros((stack.stack_size + 1, *shape), np.uint8)
        self.next = 0
        self.stale = False  # the wrapper's stacked_obs is behind its queue

    def sync(self) -> None:
        """The inner step's :meth:`sync`, then the wrapper's ``stacked_obs`` brought up to its queue,
        as its ``step`` leaves it."""
        self.inner.sync()
        if self.stale:
            np.stack(self.stack.obs_queue, out=self.stack.stacked_obs)
            self.stale = False

    def step_into(self, action: Any, out: np.ndarray) -> StepInto:
        frame = self.frames[self.next]
        self.next = (self.next + 1) % len(self.frames)
        result = self.inner.step_into(action, frame)
        queue = self.stack.obs_queue
        queue.append(frame)
        np.stack(queue, out=out)
        self.stale = True
        return result
