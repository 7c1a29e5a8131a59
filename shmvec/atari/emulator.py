"""What ale-py's ``AtariEnv.step`` does per emulator frame, under Gymnasium's standard wrappers, for
the native Atari paths (:mod:`shmvec.atari.sb3`: SB3's and CleanRL's chains,
:mod:`shmvec.atari.preprocessing`).

:class:`Emulator` acts, reads the game-over and truncation flags and counts ``TimeLimit``'s steps as
those classes do, but grabs no RGB screen (the paths grab palette indices or gray screens of only
the frames they keep) and builds the info dict only when asked. :data:`KNOWN` lists the source
fingerprints (:func:`shmvec.native.fingerprint`) of every method a native Atari path restates, as
the exactness tests checked them against the wrappers (stable-baselines3 2.9.2, gymnasium 1.4.0,
ale-py 0.12.1); any other code steps through its wrappers.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from shmvec.atari import palette
from shmvec.native import GymLayers, class_name, fingerprint, is_exactly

ATARI_ENV = "ale_py.env.AtariEnv"

#: ``module.Class.method`` -> fingerprints of the code a native Atari path was checked against.
KNOWN = {
    "gymnasium.core.Wrapper.step": {"61caa1383e31c093"},
    "gymnasium.core.ObservationWrapper.step": {"6e3f8f66e60f1a5b"},
    "gymnasium.core.RewardWrapper.step": {"0fbec0944b8f32d9"},
    # The resets a life-loss reset passes through (shmvec.atari.sb3.AtariStep.reset).
    "gymnasium.core.Wrapper.reset": {"aec944ce8bf57cce"},
    "gymnasium.core.ObservationWrapper.reset": {"3392dc14f648281a"},
    "stable_baselines3.common.atari_wrappers.FireResetEnv.reset": {"d888b1617cae3145"},
    "stable_baselines3.common.atari_wrappers.EpisodicLifeEnv.reset": {"3bd7de33421b4184"},
    "gymnasium.wrappers.common.TimeLimit.step": {"64e8faed8ba6b0fa"},
    "gymnasium.wrappers.common.OrderEnforcing.step": {"76a419da11853263"},
    "gymnasium.wrappers.common.PassiveEnvChecker.step": {"84d7bc73fb254409"},
    "gymnasium.wrappers.atari_preprocessing.AtariPreprocessing.step": {"1def2b8b37410f58"},
    "gymnasium.wrappers.atari_preprocessing.AtariPreprocessing._get_obs": {"4f62c3a10b03a473"},
    "gymnasium.wrappers.stateful_observation.FrameStackObservation.step": {"71fdebab75e79354"},
    "gymnasium.wrappers.common.RecordEpisodeStatistics.step": {"2cfeb154ded19c38"},
    "gymnasium.wrappers.transform_observation.TransformObservation.observation": {"51844ec89d70d289"},
    # Their observation functions are lambdas made in __init__ (sb3.py checks func is that lambda).
    "gymnasium.wrappers.transform_observation.ResizeObservation.__init__": {"acc49506634e89c2"},
    "gymnasium.wrappers.transform_observation.GrayscaleObservation.__init__": {"b11ed496300953a9"},
    "ale_py.env.AtariEnv.step": {"3d2cd747f84acf61"},
    "ale_py.env.AtariEnv._get_info": {"91bdc02a674d478a"},
    "stable_baselines3.common.monitor.Monitor.step": {"af96898c9d2bc24f"},
    "stable_baselines3.common.atari_wrappers.MaxAndSkipEnv.step": {"d4e549050154a395"},
    "stable_baselines3.common.atari_wrappers.EpisodicLifeEnv.step": {"b0b60a039ca36809"},
    "stable_baselines3.common.atari_wrappers.StickyActionEnv.step": {"77a22e6a4d1f351f"},
    "stable_baselines3.common.atari_wrappers.WarpFrame.observation": {"0d6e6017d12461d4"},
    "stable_baselines3.common.atari_wrappers.ClipRewardEnv.reward": {"6c93bbdc6319e4a5"},
}
_METHODS = ("step", "observation", "reward", "_get_info", "_get_obs")


def unknown_code(layers: list[Any], methods: tuple[str, ...] = _METHODS) -> str | None:
    """The first method a native step restates (``methods``: by default ``step``, ``observation``,
    ``reward``, ``_get_info``, ``_get_obs``) among ``layers``' whose code is not one :data:`KNOWN`
    lists."""
    for layer in layers:
        for attr in methods:
            func = getattr(type(layer), attr, None)
            if func is None or (attr == "_get_obs" and is_exactly(layer, ATARI_ENV)):
                continue  # AtariEnv._get_obs is not restated: the paths grab their own screens
            name = f"{func.__module__}.{func.__qualname__}"
            if fingerprint(func) not in KNOWN.get(name, ()):
                return name
    return None


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
        self.own_skip: int = atari._frameskip

    def frame(self, action: Any) -> tuple[float, bool, bool]:
        """``AtariEnv.step(action)`` and ``TimeLimit``'s count, without its observation and info:
        ``(reward, terminated, truncated)``."""
        ale_action = self.action_set[action]
        if self.own_skip == 1:  # NoFrameskip ids: AtariEnv's loop once, 0.0 + the reward as it adds it
            reward = 0.0 + self.ale.act(ale_action, 1.0)
        else:
            reward = 0.0
            for _ in range(self.own_skip):
                reward += self.ale.act(ale_action, 1.0)
        truncated = self.ale.game_truncated()
        if self.layers.limit is not None:
            truncated = self.layers.truncate(truncated)
        return reward, self.ale.game_over(with_truncation=False), truncated

    def renders_rgb(self) -> bool:
        """Whether ``render()`` gives the RGB screen (the env was made with ``render_mode="rgb_array"``)."""
        return bool(self.atari.render_mode == "rgb_array")

    def render_into(self, out: Any) -> None:
        """What ``AtariEnv.render()`` returns (``ale.getScreenRGB()``), written into ``out``
        (height, width, 3) uint8: a recording reads it without leaving the native step."""
        self.ale.getScreenRGB(out)

    def info(self) -> dict[str, Any]:
        """What ``AtariEnv._get_info`` returns."""
        ale = self.ale
        return {
            "lives": ale.lives(),
            "episode_frame_number": ale.getEpisodeFrameNumber(),
            "frame_number": ale.getFrameNumber(),
        }


def emulator(env: gym.Env) -> tuple[Emulator | None, str | None]:
    """The :class:`Emulator` of the ``AtariEnv`` at the bottom of ``env`` (Gymnasium's standard
    wrappers over it at most), or None and why a native path cannot step it."""
    layers = GymLayers(env)
    atari = layers.inner
    if not is_exactly(atari, ATARI_ENV):
        return None, f"{class_name(atari)} where ale-py's AtariEnv was expected"
    if atari._obs_type not in ("rgb", "grayscale") or atari.continuous or atari.sound_obs:
        return None, "AtariEnv with RAM observations, continuous actions or sound observations"
    if atari.render_mode == "human":
        return None, "AtariEnv with render_mode='human'"
    if not isinstance(atari._frameskip, int):
        return None, "AtariEnv with a random frame skip"
    if atari.ale.getScreenDims()[0] == palette.PAL_HEIGHT:
        return None, "a game in ALE's PAL format (another palette)"
    code = unknown_code([*layers.layers(), atari])
    if code is not None:
        return None, f"{code} differs from the versions shmvec's native Atari step was checked against"
    return Emulator(layers), None
