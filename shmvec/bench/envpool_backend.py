"""The ``envpool`` bench backend: EnvPool's C++ Atari envs, set up as the ALE id the bench was given.

EnvPool cannot run Python factories: it has its own C++ Atari envs, stepped by a C++ thread pool in
the main process. So this backend reads the ALE id and its keyword arguments back out of the bench's
factory (:func:`shmvec.bench.envs.env_factory`) and asks EnvPool for the same game with the same
settings, so that the work per step compares with the other backends':

- the same game (``ALE/Pong-v5`` and ``PongNoFrameskip-v4`` -> EnvPool ``Pong-v5``);
- ALE's settings from the id's registration plus the bench's ``--env-kwargs``: ``frameskip``
  (-> ``frame_skip``; a random range is refused), ``repeat_action_probability``,
  ``full_action_space``, ``max_num_frames_per_episode`` (-> ``max_episode_steps`` = frames / frame
  skip), ``obs_type`` ``"rgb"`` (210x160 colour) or ``"grayscale"``;
- EnvPool's preprocessing turned off as far as it goes: ``img_height=210, img_width=160`` (no
  resize), ``stack_num=1``, ``noop_max=1`` (EnvPool's smallest: at most one no-op at reset),
  ``episodic_life=False``, ``reward_clip=False``, ``use_fire_reset=False``.

What cannot be made equal: EnvPool's frame skip keeps the maximum of the last two frames (ALE's own
returns the last frame), its observations are channels first (3, 210, 160) where ALE's are
(210, 160, 3), and its emulator is its own build of ALE, so frames are not comparable to ALE's
array for array. EnvPool resets an env whose episode ended in place of its next step (like
``AutoresetMode.NEXT_STEP``).

With ``--recipe sb3-atari`` (a factory of :mod:`shmvec.bench.recipes`) it asks instead for SB3's
Atari settings as far as EnvPool has them (:func:`envpool_recipe_settings`): 84x84 gray, frame skip
4, 4 frames stacked, up to 30 no-ops, episodic life, FIRE on reset, clipped rewards, no sticky
actions; not bit-identical to the recipe (see :mod:`shmvec.bench.recipes`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from shmvec.bench.adapters import SendRecvAdapter
from shmvec.bench.envs import _make_registered
from shmvec.bench.recipes import AtariSettings, atari_settings, recipe_env_id
from shmvec.errors import install_hint

# ALE v5 ids (ALE/Pong-v5) and the classic v4 ones (PongNoFrameskip-v4, Pong-v4).
_ALE_ID = re.compile(r"^(?:ALE/)?(?P<game>[A-Za-z]+?)(?P<noskip>NoFrameskip)?-v(?P<version>[045])$")


def envpool_settings(env_id: str, env_kwargs: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """EnvPool's task id and ``envpool.make`` keyword arguments for an ALE gymnasium id.

    :param env_id: an ALE id, e.g. ``"ALE/Pong-v5"`` or ``"PongNoFrameskip-v4"``.
    :param env_kwargs: keyword arguments given to ``gymnasium.make`` (default none).
    :raises ValueError: for an id that is not ALE's, or settings EnvPool cannot reproduce.
    """
    match = _ALE_ID.match(env_id)
    if match is None:
        raise ValueError(f"the envpool backend runs ALE ids only (e.g. ALE/Pong-v5), got {env_id!r}")
    import ale_py

    gym.register_envs(ale_py)
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as exc:
        raise ValueError(f"the envpool backend cannot find {env_id!r}: {exc}") from None
    ale = {**spec.kwargs, **(env_kwargs or {})}
    frame_skip = ale.get("frameskip", 4)
    if not isinstance(frame_skip, int):
        raise ValueError(f"the envpool backend needs a fixed frameskip, got {frame_skip!r} for {env_id!r}")
    obs_type = ale.get("obs_type", "rgb")
    if obs_type not in ("rgb", "grayscale"):
        raise ValueError(f"the envpool backend takes obs_type 'rgb' or 'grayscale', got {obs_type!r}")
    max_frames = ale.get("max_num_frames_per_episode") or 108_000
    max_steps = spec.max_episode_steps or max_frames // frame_skip
    task = "".join(part.capitalize() for part in str(ale["game"]).split("_")) + "-v5"
    settings = {
        "img_height": 210,
        "img_width": 160,
        "gray_scale": obs_type == "grayscale",
        "stack_num": 1,
        "frame_skip": frame_skip,
        "noop_max": 1,
        "episodic_life": False,
        "reward_clip": False,
        "use_fire_reset": False,
        "repeat_action_probability": float(ale.get("repeat_action_probability", 0.25)),
        "full_action_space": bool(ale.get("full_action_space", False)),
        "max_episode_steps": int(min(max_steps, max_frames // frame_skip)),
    }
    return task, settings


def envpool_recipe_settings(settings: AtariSettings) -> tuple[str, dict[str, Any]]:
    """EnvPool's task id and ``envpool.make`` keyword arguments for SB3's Atari settings."""
    return f"{settings.task}-v5", {
        "img_height": settings.screen_size,
        "img_width": settings.screen_size,
        "gray_scale": True,
        "stack_num": settings.frame_stack,
        "frame_skip": settings.frame_skip,
        "noop_max": settings.noop_max,
        "episodic_life": settings.episodic_life,
        "reward_clip": settings.clip_reward,
        "use_fire_reset": settings.fire_reset,
        "repeat_action_probability": settings.repeat_action_probability,
        "full_action_space": False,
        "max_episode_steps": settings.max_frames // settings.frame_skip,
    }


def _env_id(env_fn: Callable[[], gym.Env]) -> tuple[str, dict[str, Any]]:
    """The gymnasium id and keyword arguments of a bench factory (``env_factory(id, **kwargs)``)."""
    if isinstance(env_fn, functools.partial) and env_fn.func is _make_registered:
        env_id, kwargs = env_fn.args
        return env_id, dict(kwargs)
    raise ValueError(
        "the envpool backend runs registered ALE ids only (e.g. --env ALE/Pong-v5), not a "
        f"module:factory env ({env_fn!r})"
    )


class EnvPoolAdapter(SendRecvAdapter):
    """EnvPool's synchronous batch (``batch_size == num_envs``) with the runner's calling convention;
    ``seed()`` rebuilds the pool with the new seed at the next :meth:`reset` (EnvPool takes its seed
    when it is made)."""

    def __init__(self, task: str, settings: dict[str, Any], num_envs: int) -> None:
        self._task, self._settings = task, settings
        super().__init__(self._make(0, num_envs))
        self._made_with: int | None = 0

    def _make(self, seed: int, num_envs: int) -> Any:
        import envpool

        return envpool.make(
            task_id=self._task, env_type="gymnasium", num_envs=num_envs, seed=seed, **self._settings
        )

    def reset(self) -> Any:
        """Reset every env (rebuilding the pool first if :meth:`seed` asked for another seed)."""
        if self._seed is not None and self._seed != self._made_with:
            self._env.close()
            self._env = self._make(self._seed, self.num_envs)
            self._made_with = self._seed
        self._seed = None
        obs, _ = self._env.reset()
        return obs


def make_envpool(env_fns: list[Callable[[], gym.Env]], frame_stack: int | None = None) -> EnvPoolAdapter:
    """The ``envpool`` backend for the bench's factories (all the same ALE id, or all the same
    recipe's, see the module doc).

    :param frame_stack: frames EnvPool stacks (default None: one).
    :raises ValueError: for a non-ALE env, settings EnvPool cannot reproduce, or EnvPool not installed.
    """
    recipe_id = recipe_env_id(env_fns[0])
    if recipe_id is not None:
        task, settings = envpool_recipe_settings(atari_settings(recipe_id, frame_stack))
    else:
        env_id, kwargs = _env_id(env_fns[0])
        task, settings = envpool_settings(env_id, kwargs)
        settings["stack_num"] = frame_stack or 1
    try:
        import envpool  # noqa: F401
    except ImportError:
        raise ValueError(f"the envpool backend needs EnvPool: {install_hint('envpool')}") from None
    return EnvPoolAdapter(task, settings, len(env_fns))
