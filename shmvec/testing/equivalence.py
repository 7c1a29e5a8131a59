"""``assert_equivalent``: a user's envs step the same in shmvec as in the in-process reference.

Both are built from the same factories, seeded alike, reset with the same options and stepped with
the same actions (sampled from a seeded copy of the action space); after every reset and step each
result is compared (:mod:`shmvec.testing.compare`) and the first difference raises an
``AssertionError`` naming the step, the env and the field, with the usual causes.
"""

from __future__ import annotations

import copy
import functools
import re
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shmvec.testing.compare import (
    Difference,
    InfoKeys,
    batch_difference,
    gymnasium_difference,
    info_dicts_difference,
    obs_of_env,
    sb3_step_difference,
)

FACES = ("sb3", "gymnasium")
SEEDS_GUIDE = 'docs/guides/seeds.md, "When shmvec and the reference differ"'
WIDTH = 88
# Info keys the VecEnvs add themselves (SB3's and Gymnasium's), never the user's to leave out.
_VEC_ENV_KEYS = ("TimeLimit.truncated", "terminal_observation", "final_obs", "final_info")
# Spaces whose samples stack into one array: SB3 sends a batch of those as an ndarray, of the others
# (Dict, Tuple) as a list of per-env actions.
_ARRAY_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


@dataclass(frozen=True)
class EquivalenceReport:
    """What :func:`assert_equivalent` compared, all of it equal.

    :param face: ``"sb3"`` or ``"gymnasium"``.
    :param n_envs: envs stepped side by side.
    :param steps: batch steps compared (resets not counted).
    :param terminated: episode ends by termination seen in those steps, over all envs.
    :param truncated: episode ends by truncation (SB3: ``TimeLimit.truncated``), over all envs.
    """

    face: str
    n_envs: int
    steps: int
    terminated: int
    truncated: int


class CopyOutputs(gym.Wrapper):
    """Deep-copies what the env returns. The reference's envs are wrapped in it: an env that reuses
    its arrays or info dict and changes them in place is then compared with the values it returned,
    not with what DummyVecEnv or SyncVectorEnv read after its next reset (Gymnasium issue #1132)."""

    def reset(self, **kwargs: Any) -> Any:
        """The env's reset result, deep-copied."""
        return copy.deepcopy(self.env.reset(**kwargs))

    def step(self, action: Any) -> Any:
        """The env's step result, deep-copied."""
        return copy.deepcopy(self.env.step(action))


def _copied(fn: Callable[[], gym.Env]) -> gym.Env:
    return CopyOutputs(fn())


def assert_equivalent(
    env_fns: Sequence[Callable[[], gym.Env]],
    steps: int = 100,
    seed: int = 0,
    face: str = "sb3",
    ignore_info_keys: Iterable[str | Sequence[str]] = (),
    options: dict[str, Any] | None = None,
    wrap_reference: Callable[[Any], Any] | None = None,
    **shmvec_options: Any,
) -> EquivalenceReport:
    """Step ``env_fns`` in shmvec and in the in-process reference and fail at the first difference.

    ``face="sb3"`` compares :class:`shmvec.ShmVecEnv` with SB3's ``DummyVecEnv`` (observations,
    rewards, dones, every info and ``terminal_observation``, ``reset_infos``); ``face="gymnasium"``
    compares :class:`shmvec.ShmVectorEnv` with ``gymnasium.vector.SyncVectorEnv`` (observations,
    rewards, terminations, truncations, the infos and their masks, ``final_obs``), in the
    ``autoreset_mode`` given in ``shmvec_options`` (default ``NEXT_STEP``; ``DISABLED`` resets the
    envs that ended with ``reset_mask``). Both get ``seed`` (env ``i``: ``seed + i``) and ``options``
    at the first reset, then ``steps`` batch steps of the same random actions, with one explicit
    reset without a seed half-way. Compare in a test::

        from shmvec.testing import assert_equivalent

        def test_my_env_is_the_same_in_shmvec():
            assert_equivalent([make_my_env] * 4, steps=200, start_method="fork")

    :param env_fns: the env factories, one per env, as you give them to the VecEnv.
    :param steps: batch steps to compare (default 100). Make episodes end in them: the returned
        report counts the episode ends.
    :param seed: the seed of the first reset and of the actions (default 0).
    :param face: ``"sb3"`` (default) or ``"gymnasium"``. SB3 is imported only for ``"sb3"``.
    :param ignore_info_keys: info keys not to compare: names (``"time"``, anywhere in the infos)
        or tuples naming a trailing key path (``("episode", "t")``). Monitor's and
        RecordEpisodeStatistics' wall-clock ``episode["t"]`` is never compared.
    :param options: reset options of the first reset (default None: none).
    :param wrap_reference: a function that wraps the reference VecEnv before the comparison (default
        None: the reference as it is), for shmvec options that stand for a wrapper: e.g.
        ``frame_stack=4`` with ``wrap_reference=lambda v: VecFrameStack(v, 4)``.
    :param shmvec_options: given to ``ShmVecEnv`` / ``ShmVectorEnv`` as they are (``start_method``,
        ``n_workers``, ``codec``, ...). Their defaults are shmvec's: ``forkserver``, so the factories
        must pickle, as in training; ``start_method="fork"`` takes any factory.
    :returns: what was compared, as an :class:`EquivalenceReport`.
    :raises AssertionError: naming the first step, env and field that differ, and the usual causes.
    :raises ValueError: for an unknown ``face``, no factories or pool mode (``batch_size``).
    """
    fns = list(env_fns)
    if face not in FACES:
        raise ValueError(f"face must be one of {FACES}, got {face!r}")
    if not fns:
        raise ValueError("env_fns is empty: give one factory per env")
    batch_size = shmvec_options.get("batch_size")
    if batch_size is not None and batch_size != len(fns):
        raise ValueError("pool mode (batch_size < len(env_fns)) has no in-process reference to compare with")
    run = _run_sb3 if face == "sb3" else _run_gymnasium
    wrap = wrap_reference or (lambda reference: reference)
    report, found = run(fns, steps, seed, InfoKeys(ignore_info_keys), options, wrap, shmvec_options)
    if found is not None:
        when, difference = found
        raise AssertionError(_message(face, when, difference, seed))
    return report


Found = tuple[str, Difference] | None


def _message(face: str, when: str, d: Difference, seed: int) -> str:
    """The error: the difference, then the usual causes (the likeliest first), in lines of at most
    :data:`WIDTH` characters (but for long values) so that a terminal or a docs page shows it whole."""
    shm, ref = ("ShmVecEnv", "DummyVecEnv") if face == "sb3" else ("ShmVectorEnv", "SyncVectorEnv")
    env = "the whole batch" if d.env is None else f"env {d.env}"
    keys = [k for k in re.findall(r"\['([^']*)'\]", d.field) if k not in _VEC_ENV_KEYS]
    # A value from the env's info dict (not one the VecEnv adds): its cause is likely the value itself.
    info_value = d.field.startswith("info") and bool(keys)
    causes = [
        "the env draws from numpy's or Python's global RNG (np.random.*, random.*) instead of "
        f"self.np_random: in {ref} the envs draw in turn from this process's one stream, under "
        "shmvec each worker process has a copy of its own",
        "the env's construction is not seeded (a Generator made without a seed, the time) or the "
        "factory shares state between the envs it builds (a counter, a module-level object)",
        "an info value that is no function of the seed and the actions (wall-clock time, a "
        f"process id): leave it out with ignore_info_keys=[{repr(keys[-1]) if info_value else '...'}]",
    ]
    if info_value:
        causes.insert(0, causes.pop())
    lines = [
        f"{shm} and {ref} differ at {when}, {env}, in {d.field}:",
        f"  {d.detail}",
        f"  (shmvec's value first; seed={seed}, the same actions in both)",
        f"Usual causes ({SEEDS_GUIDE}):",
        *(textwrap.fill(c, WIDTH, initial_indent="  - ", subsequent_indent="    ") for c in causes),
    ]
    return "\n".join(lines)


def sample_actions(space: spaces.Space, n_envs: int) -> Any:
    """One batch of actions from a seeded ``space`` (one env's), as SB3 sends them: an array for
    Box, Discrete, MultiDiscrete and MultiBinary, a list of per-env actions otherwise."""
    actions = [space.sample() for _ in range(n_envs)]
    return np.array(actions) if isinstance(space, _ARRAY_SPACES) else actions


def _spaces_difference(env: Any, ref: Any, names: tuple[str, ...]) -> Found:
    for name in names:
        got, want = getattr(env, name), getattr(ref, name)
        if got != want:
            return "construction", Difference(name, f"{got} != {want}")
    return None


def _run_sb3(
    fns: list,
    steps: int,
    seed: int,
    ignore: InfoKeys,
    options: dict | None,
    wrap: Callable,
    shm_options: dict,
) -> tuple[EquivalenceReport, Found]:
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec.vec_env import ShmVecEnv

    ref = wrap(DummyVecEnv([functools.partial(_copied, fn) for fn in fns]))
    try:
        with ShmVecEnv(fns, **shm_options) as env:
            return _compare_sb3(env, ref, steps, seed, ignore, options)
    finally:
        ref.close()


def _drive(
    face: str,
    n_envs: int,
    steps: int,
    first_reset: Callable[[], Difference | None],
    reset: Callable[[], Difference | None],
    step: Callable[[int], tuple[Found, int, int]],
) -> tuple[EquivalenceReport, Found]:
    """The sequence both faces compare: the first reset, ``steps`` steps (``step(t)`` returns what it
    found and the episodes that ended by termination and by truncation), one explicit reset
    half-way; stopped at the first difference."""
    ended = [0, 0]

    def report(done: int) -> EquivalenceReport:
        return EquivalenceReport(face, n_envs, done, *ended)

    if d := first_reset():
        return report(0), ("reset", d)
    for t in range(steps):
        if t and t == steps // 2 and (d := reset()):
            return report(t), (f"the explicit reset before step {t}", d)
        found, terminated, truncated = step(t)
        if found:
            return report(t), found
        ended[0] += terminated
        ended[1] += truncated
    return report(steps), None


def _compare_sb3(
    env: Any, ref: Any, steps: int, seed: int, ignore: InfoKeys, options: dict | None
) -> tuple[EquivalenceReport, Found]:
    n = ref.num_envs
    if found := _spaces_difference(env, ref, ("observation_space", "action_space")):
        return EquivalenceReport("sb3", n, 0, 0, 0), found
    space = ref.observation_space
    actions_space = copy.deepcopy(ref.action_space)
    actions_space.seed(seed)

    def reset_infos_difference() -> Difference | None:
        return info_dicts_difference(env.reset_infos, ref.reset_infos, "reset_info", ignore)

    def reset() -> Difference | None:
        got, want = env.reset(), ref.reset()
        return batch_difference(got, want, "obs", obs_of_env(space), n) or reset_infos_difference()

    def first_reset() -> Difference | None:
        for vec in (env, ref):
            vec.seed(seed)
            if options:
                vec.set_options(options)
        return reset()

    def step(t: int) -> tuple[Found, int, int]:
        actions = sample_actions(actions_space, n)
        got, want = env.step(actions), ref.step(actions)
        if d := sb3_step_difference(got, want, ignore, space) or reset_infos_difference():
            return (f"step {t}", d), 0, 0
        truncated = sum(bool(want[3][i].get("TimeLimit.truncated")) for i in np.flatnonzero(want[2]))
        return None, int(np.sum(want[2])) - truncated, truncated

    return _drive("sb3", n, steps, first_reset, reset, step)


def sync_vector_env(fns: list, mode: Any) -> gym.vector.SyncVectorEnv:
    """Gymnasium's ``SyncVectorEnv(fns, autoreset_mode=mode)``, the reference of the Gymnasium face.

    :raises ValueError: for a mode other than ``NEXT_STEP`` under Gymnasium 1.0, whose vector envs
        reset on the next step only (and take no ``autoreset_mode``).
    """
    from gymnasium.vector import SyncVectorEnv

    if hasattr(gym.vector, "AutoresetMode"):
        return SyncVectorEnv(fns, autoreset_mode=mode)
    if mode.name != "NEXT_STEP":
        version = gym.__version__
        raise ValueError(f"Gymnasium {version}'s SyncVectorEnv resets on the next step only, not {mode}")
    return SyncVectorEnv(fns)


def _run_gymnasium(
    fns: list,
    steps: int,
    seed: int,
    ignore: InfoKeys,
    options: dict | None,
    wrap: Callable,
    shm_options: dict,
) -> tuple[EquivalenceReport, Found]:
    from shmvec.vector_env import AutoresetMode, ShmVectorEnv, to_autoreset_mode

    mode = to_autoreset_mode(shm_options.pop("autoreset_mode", AutoresetMode.NEXT_STEP))
    ref = wrap(sync_vector_env([functools.partial(_copied, fn) for fn in fns], mode))
    try:
        env = ShmVectorEnv(fns, autoreset_mode=mode, **shm_options)
        try:
            return _compare_gymnasium(env, ref, mode, steps, seed, ignore, options)
        finally:
            env.close()
    finally:
        ref.close()


def _compare_gymnasium(
    env: Any, ref: Any, mode: Any, steps: int, seed: int, ignore: InfoKeys, options: dict | None
) -> tuple[EquivalenceReport, Found]:
    n = ref.num_envs
    if found := _spaces_difference(env, ref, ("single_observation_space", "single_action_space")):
        return EquivalenceReport("gymnasium", n, 0, 0, 0), found
    actions_space = gym.vector.utils.batch_space(copy.deepcopy(ref.single_action_space), n)
    actions_space.seed(seed)

    def difference(got: tuple, want: tuple) -> Difference | None:
        return gymnasium_difference(got, want, ignore, ref.single_observation_space, n)

    def first_reset() -> Difference | None:
        return difference(env.reset(seed=seed, options=options), ref.reset(seed=seed, options=options))

    def step(t: int) -> tuple[Found, int, int]:
        actions = actions_space.sample()
        got, want = env.step(actions), ref.step(actions)
        if d := difference(got, want):
            return (f"step {t}", d), 0, 0
        done, ended = want[2] | want[3], (int(np.sum(want[2])), int(np.sum(want[3])))
        if mode.name == "DISABLED" and done.any():
            # DISABLED: the caller resets the envs that ended, with seeds of its own.
            seeds = [seed * 1000 + 10 * t + i if d else None for i, d in enumerate(done)]
            masks = [{**(options or {}), "reset_mask": done.copy()} for _ in range(2)]  # Sync pops it
            got, want = env.reset(seed=seeds, options=masks[0]), ref.reset(seed=seeds, options=masks[1])
            if d := difference(got, want):
                return (f"the masked reset after step {t}", d), 0, 0
        return None, *ended

    return _drive("gymnasium", n, steps, first_reset, lambda: difference(env.reset(), ref.reset()), step)
