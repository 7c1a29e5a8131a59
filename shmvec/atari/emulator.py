"""What ale-py's ``AtariEnv.step`` does per emulator frame, under Gymnasium's standard wrappers, for
the native Atari paths (:mod:`shmvec.atari.sb3`: SB3's and CleanRL's chains,
:mod:`shmvec.atari.preprocessing`).

:class:`Emulator` acts, reads the game-over and truncation flags and counts ``TimeLimit``'s steps as
those classes do, but grabs no RGB screen (the paths grab palette indices or gray screens of only
the frames they keep; the raw path, :mod:`shmvec.atari.raw`, grabs ALE's own screen into the ring)
and builds the info dict only when asked. Which versions of the code it
restates it was checked against: :mod:`shmvec.atari.fingerprints`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from shmvec.atari import palette
from shmvec.atari.fingerprints import act_strength, unknown_code
from shmvec.native import GymLayers, class_name, is_exactly

ATARI_ENV = "ale_py.env.AtariEnv"
#: The methods a native step restates, of each wrapper it steps over.
METHODS = ("step", "observation", "reward", "_get_info", "_get_obs")


class Emulator:
    """One ``AtariEnv`` under Gymnasium's standard wrappers, stepped a frame at a time.

    :param layers: the Gymnasium wrappers over the ``AtariEnv`` (see :func:`emulator`).
    """

    def __init__(self, layers: GymLayers) -> None:
        self.layers = layers
        atari = layers.inner
        self.atari = atari
        self.ale = atari.ale
        self.action_set = atari._action_set
        self.own_skip: int | tuple[int, int] = atari._frameskip
        self.strength = act_strength()

    def frame(self, action: Any) -> tuple[float, bool, bool]:
        """``AtariEnv.step(action)`` and ``TimeLimit``'s count, without its observation and info:
        ``(reward, terminated, truncated)``."""
        skip: Any = self.own_skip
        if skip.__class__ is tuple:  # the raw path's random skip, drawn before the action's lookup
            skip = self.atari.np_random.integers(*skip)
        ale_action, act, strength = self.action_set[action], self.ale.act, self.strength
        if skip == 1:  # NoFrameskip ids: AtariEnv's loop once, 0.0 + the reward as it adds it
            reward = 0.0 + act(ale_action, *strength)
        else:
            reward = 0.0
            for _ in range(skip):
                reward += act(ale_action, *strength)
        truncated = self.ale.game_truncated()
        if self.layers.limit is not None:
            truncated = self.layers.truncate(truncated)
        return reward, self.ale.game_over(with_truncation=False), truncated

    def renders_rgb(self) -> bool:
        """Whether ``render()`` gives the RGB screen (the env was made with ``render_mode="rgb_array"``)
        by code :meth:`render_into` was checked against (else a recording calls ``render()``)."""
        return self.atari.render_mode == "rgb_array" and not unknown_code([self.atari], ("render",))

    def render_into(self, out: Any) -> None:
        """What ``AtariEnv.render()`` returns (``ale.getScreenRGB()``), written into ``out``
        (height, width, 3) uint8: a recording reads it without leaving the native step."""
        self.ale.getScreenRGB(out)

    def unchecked(self, raw: bool = False) -> list[str]:
        """The methods of Gymnasium's wrappers and of ``AtariEnv`` it restates whose code
        :data:`~shmvec.atari.fingerprints.KNOWN` does not list.

        :param raw: for the raw path, which restates ``AtariEnv._get_obs`` too (the other paths grab
            their own screens).
        """
        names = unknown_code(self.layers.layers(), METHODS)
        own = unknown_code([self.atari], METHODS)
        return names + [n for n in own if raw or not n.endswith("._get_obs")]

    def info(self) -> dict[str, Any]:
        """What ``AtariEnv._get_info`` returns."""
        ale = self.ale
        return {
            "lives": ale.lives(),
            "episode_frame_number": ale.getEpisodeFrameNumber(),
            "frame_number": ale.getFrameNumber(),
        }


def emulator(env: gym.Env, raw: bool = False) -> tuple[Emulator | None, str | None]:
    """The :class:`Emulator` of the ``AtariEnv`` at the bottom of ``env`` (Gymnasium's standard
    wrappers over it at most), or None and why a native path cannot step it (the code it restates is
    checked apart: :meth:`Emulator.unchecked`).

    :param raw: for the path that gives ``AtariEnv``'s own observations (:mod:`shmvec.atari.raw`):
        it grabs ALE's screen as ``AtariEnv._get_obs`` does, so any palette and a random frame skip
        are served too.
    """
    layers = GymLayers(env)
    atari = layers.inner
    if not is_exactly(atari, ATARI_ENV):
        return None, f"{class_name(atari)} where ale-py's AtariEnv was expected"
    # continuous: ale-py >= 0.10; sound_obs: >= 0.11.
    if atari._obs_type not in ("rgb", "grayscale") or getattr(atari, "continuous", False):
        return None, "AtariEnv with RAM observations or continuous actions"
    if getattr(atari, "sound_obs", False):
        return None, "AtariEnv with sound observations"
    if atari.render_mode == "human":
        return None, "AtariEnv with render_mode='human'"
    if not isinstance(atari._frameskip, int) and not raw:
        return None, "AtariEnv with a random frame skip"
    if atari.ale.getScreenDims()[0] == palette.PAL_HEIGHT and not raw:
        return None, "a game in ALE's PAL format (another palette)"
    return Emulator(layers), None
