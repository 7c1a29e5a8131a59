"""``ShmVectorEnv(frame_stack=K)`` equals a stacking written out in this file over ``SyncVectorEnv``'s
raw outputs (SB3's ``VecFrameStack`` rules, not :mod:`shmvec.worker.frame_stack`, which the workers run),
array for array, in all three autoreset modes: zeros and the first observation at the start of
every episode, the terminal stack in ``final_obs`` (``SAME_STEP``) and as the last observation
(``DISABLED``, ``NEXT_STEP``)."""

from __future__ import annotations

import functools
from contextlib import closing
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector.utils import batch_space
from gymnasium.wrappers import FilterObservation

import shmvec
from shmvec.synthetic import SyntheticImageEnv
from tests import vector_helpers as vector
from tests.envs import make_dict_env

NEXT, SAME, DISABLED = vector.NEXT, vector.SAME, vector.DISABLED


def dict_of_boxes() -> gym.Env:
    # FrameStack stacks Box leaves only, as VecFrameStack: drop the Discrete key of the test Dict env.
    return FilterObservation(make_dict_env(12, 8), ["image", "vec"])


# name -> (factory, the axis each leaf stacks on by SB3's rule: channels first for a uint8 [0, 255]
# image whose smallest dimension comes first, else last)
ENVS = {
    "channels_last": (functools.partial(SyntheticImageEnv, (10, 12, 3), episode_len=(3, 9)), -1),
    "channels_first": (functools.partial(SyntheticImageEnv, (2, 10, 12), episode_len=(3, 9)), 0),
    "dict": (dict_of_boxes, {"image": -1, "vec": -1}),
}
AXIS = {"first": 0, "last": -1}


class StackedByHand(gym.vector.VectorWrapper):
    """A SyncVectorEnv's observations stacked here, from each env's episode so far: the last
    ``n_stack`` observations along ``axis`` (per key for a Dict), zeros before the episode's first.
    The stack at an episode's end holds its terminal observation: in ``final_obs`` (SAME_STEP), or
    as the observation of that step (NEXT_STEP, DISABLED)."""

    def __init__(self, env: gym.vector.VectorEnv, n_stack: int, axis: int | dict[str, int]) -> None:
        super().__init__(env)
        self.n_stack, self.axis = n_stack, axis
        self.mode = env.metadata["autoreset_mode"]
        raw = env.single_observation_space
        if isinstance(raw, spaces.Dict):
            stacked: spaces.Space = spaces.Dict({k: self._space(raw[k], axis[k]) for k in raw.spaces})
        else:
            stacked = self._space(raw, axis)
        self.single_observation_space = stacked
        self.observation_space = batch_space(stacked, env.num_envs)
        self.episodes: list[list[Any]] = [[] for _ in range(env.num_envs)]
        self.autoreset = np.zeros(env.num_envs, bool)

    def _space(self, box: spaces.Box, axis: int) -> spaces.Box:
        low, high = (np.concatenate([bound] * self.n_stack, axis) for bound in (box.low, box.high))
        return spaces.Box(low, high, dtype=box.dtype)

    def _leaf(self, frames: list[np.ndarray], box: spaces.Box, axis: int) -> np.ndarray:
        recent = frames[-self.n_stack :]
        zeros = [np.zeros(box.shape, box.dtype)] * (self.n_stack - len(recent))
        return np.concatenate(zeros + recent, axis)

    def stack(self, episode: list[Any]) -> Any:
        raw = self.env.single_observation_space
        if isinstance(raw, spaces.Dict):
            return {k: self._leaf([o[k] for o in episode], raw[k], self.axis[k]) for k in raw.spaces}
        return self._leaf(episode, raw, self.axis)

    def _batch(self) -> Any:
        stacks = [self.stack(episode) for episode in self.episodes]
        if isinstance(stacks[0], dict):
            return {k: np.stack([s[k] for s in stacks]) for k in stacks[0]}
        return np.stack(stacks)

    @staticmethod
    def _one(obs: Any, i: int) -> Any:
        return {k: v[i].copy() for k, v in obs.items()} if isinstance(obs, dict) else obs[i].copy()

    def reset(self, *, seed=None, options=None):
        mask = (options or {}).get("reset_mask")  # read before SyncVectorEnv pops it
        mask = np.ones(self.num_envs, bool) if mask is None else np.array(mask)
        obs, infos = self.env.reset(seed=seed, options=options)
        for i in np.flatnonzero(mask):
            self.episodes[i] = [self._one(obs, i)]
        self.autoreset[mask] = False
        return self._batch(), infos

    def step(self, actions):
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        ended = terminations | truncations
        for i in range(self.num_envs):
            if self.mode == NEXT and self.autoreset[i]:  # this step was the reset
                self.episodes[i] = [self._one(obs, i)]
            elif self.mode == SAME and ended[i]:
                infos["final_obs"][i] = self.stack(self.episodes[i] + [infos["final_obs"][i]])
                self.episodes[i] = [self._one(obs, i)]
            else:
                self.episodes[i].append(self._one(obs, i))
        self.autoreset = ended
        return self._batch(), rewards, terminations, truncations, infos


def run_both(kind: str, mode, n_stack: int, order: str | None = None, **kwargs) -> set[str]:
    fn, axis = ENVS[kind]
    if order is not None:
        axis = AXIS[order]
    reference = functools.partial(StackedByHand, n_stack=n_stack, axis=axis)
    return vector.run_both(
        (fn, fn),
        mode,
        wrap_reference=reference,
        frame_stack=n_stack,
        frame_stack_channels_order=order,
        **kwargs,
    )


@pytest.mark.parametrize("kind", sorted(ENVS))
@pytest.mark.parametrize("mode", [NEXT, SAME, DISABLED], ids=lambda m: m.name)
def test_frame_stack_matches_stacking_by_hand(no_leaks, kind, mode):
    ends = run_both(kind, mode, 4, n_envs=5, steps=40)
    assert ends == {"terminated", "truncated"}, "the run must end episodes both ways to mean anything"


@pytest.mark.parametrize("order", ["first", "last"])
def test_frame_stack_channels_order(no_leaks, order):
    run_both("channels_last", SAME, 3, order, n_envs=3, steps=25)


def test_frame_stack_with_codec_and_without_copy(no_leaks):
    run_both("channels_last", SAME, 2, n_envs=2, steps=15, codec="delta")
    run_both("dict", NEXT, 2, n_envs=2, steps=15, copy=False)


def test_the_reference_stacks_zeros_then_frames_and_ends_with_the_terminal_frame():
    """The reference itself, on one env whose frames are numbered: what it stacks is what SB3 would."""

    class Counting(gym.Env):
        observation_space = spaces.Box(0, 255, (1,), np.uint8)
        action_space = spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            self.t = 0
            return np.array([100], np.uint8), {}

        def step(self, action):
            self.t += 1
            return np.array([100 + self.t], np.uint8), 0.0, self.t == 3, False, {}

    ref = StackedByHand(gym.vector.SyncVectorEnv([Counting], autoreset_mode=SAME), 3, -1)
    obs, _ = ref.reset()
    assert obs.tolist() == [[0, 0, 100]]
    assert ref.step([0])[0].tolist() == [[0, 100, 101]]
    assert ref.step([0])[0].tolist() == [[100, 101, 102]]
    obs, *_, infos = ref.step([0])
    assert infos["final_obs"][0].tolist() == [101, 102, 103] and obs.tolist() == [[0, 0, 100]]


def test_frame_stack_space_and_bad_value(no_leaks):
    image = ENVS["channels_last"][0]
    with closing(shmvec.ShmVectorEnv([image] * 2, start_method="fork", frame_stack=4)) as env:
        assert env.single_observation_space.shape == (10, 12, 12)
        assert env.observation_space.shape == (2, 10, 12, 12)
    with pytest.raises(ValueError, match="frame_stack must be a whole number >= 1 or None, got 0"):
        shmvec.ShmVectorEnv([image], start_method="fork", frame_stack=0)
