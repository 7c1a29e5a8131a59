"""Raw ALE envs (``gym.make("ALE/Pong-v5")``, ``*NoFrameskip-v4``, ``*-v4``) stepped natively
(shmvec.atari.raw) give exactly what their wrappers give.

Every comparison is against the same factories in SB3's DummyVecEnv (or Gymnasium's SyncVectorEnv,
or each env alone for pool mode), array for array: observations, rewards, dones / flags, terminal
observations, infos; after the run, each env's whole state read back through the VecEnv: ALE's
(``clone_state(include_rng=True)``: RAM, registers, frame counters, the sticky-action RNG), the
AtariEnv's generator (a random frame skip draws from it) and the wrappers' counters and flags
(``TimeLimit``, ``OrderEnforcing``, ``PassiveEnvChecker`` with its data-reuse check). The larger
matrix (3 games x frame skips 1/4/5 x sticky on/off x RGB/gray, both faces) is marked slow.
"""

from __future__ import annotations

import functools
import pickle
from contextlib import closing
from importlib.metadata import version

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack

import shmvec
from shmvec import ShmVecEnv
from shmvec.vector_env import AutoresetMode
from tests.helpers import assert_steps_equal, equivalent_with_statuses, not_checked, require
from tests.vector_helpers import DISABLED, NEXT, REFERENCE_MODES, SAME


@pytest.fixture(autouse=True, scope="module")
def _ale():
    gym.register_envs(require("ale_py", 'pip install -e ".[atari]"'))


def raw(env_id: str = "ALE/Breakout-v5", **kwargs) -> gym.Env:
    """``gym.make(env_id, **kwargs)``, ALE's ids registered first (a spawned worker needs that)."""
    gym.register_envs(require("ale_py", 'pip install -e ".[atari]"'))
    return gym.make(env_id, **kwargs)


# The wrappers' state a native step must leave as their own step would.
WRAPPER_STATE = ("_elapsed_steps", "_has_reset", "checked_step", "checked_data_reuse", "_previous_data")


def _state(venv, attrs: list[str]) -> list[tuple]:
    """Each env's state, as comparable values: ALE's (with its RNG), the env's generator, the
    wrappers' attributes ``attrs``."""
    ale = [pickle.dumps(s) for s in venv.env_method("clone_state", include_rng=True)]
    rng = [g.bit_generator.state for g in venv.get_attr("np_random")]
    return list(zip(ale, rng)) + [(attr, [repr(v) for v in venv.get_attr(attr)]) for attr in attrs]


def _wrapper_state(env: gym.Env) -> list[str]:
    """The attributes of :data:`WRAPPER_STATE` that ``env``'s wrappers have (Gymnasium < 1.4's
    checker has no data-reuse check)."""
    out = []
    for attr in WRAPPER_STATE:
        try:
            env.get_wrapper_attr(attr)
        except AttributeError:
            continue
        out.append(attr)
    return out


def run_raw(fn, n_envs: int = 4, steps: int = 300, seed: int = 0, ref_seed: int | None = None,
            path: str = "ale", **options) -> dict[str, int]:  # fmt: skip
    """``n_envs`` of ``fn`` through ShmVecEnv (``options``; 2 workers, fork) and DummyVecEnv
    (``ref_seed``: another seed for the reference, the negative control), stepped in lockstep with
    the same random actions; every env's ``native_steps`` path is ``path``; the envs' whole state
    equal at the end. How episodes ended, by kind."""
    stack = options.get("frame_stack")
    ref = DummyVecEnv([fn] * n_envs)
    ref = VecFrameStack(ref, stack) if stack else ref
    options = {"start_method": "fork", "n_workers": 2, **options}
    ends = {"terminated": 0, "truncated": 0}
    with ShmVecEnv([fn] * n_envs, **options) as got, closing(ref):
        assert [s.path for s in got.native_steps] == [path] * n_envs, got.native_steps
        got.seed(seed), ref.seed(seed if ref_seed is None else ref_seed)
        assert np.array_equal(got.reset(), ref.reset()), "reset obs"
        # VecFrameStack keeps no reset_infos of its own: the DummyVecEnv under it has them.
        assert got.reset_infos == getattr(ref, "venv", ref).reset_infos, "reset infos"
        for info in assert_steps_equal(got, ref, steps, np.random.default_rng(seed)):
            ends["truncated" if info["TimeLimit.truncated"] else "terminated"] += 1
        attrs = _wrapper_state(ref.unwrapped.envs[0])
        assert _state(got, attrs) == _state(ref, attrs), "state after the run"
    return ends


# ---------------------------------------------------------------- the SB3 face against DummyVecEnv


def test_v5_sticky_rgb_game_overs(no_leaks):
    """``ALE/Breakout-v5`` as registered: 4 frames per action, sticky actions (0.25), RGB."""
    ends = run_raw(functools.partial(raw, "ALE/Breakout-v5"), steps=400)
    assert ends["terminated"] >= 2, ends


def test_gray_frameskip_5_no_sticky_truncations_and_frame_stack(no_leaks):
    fn = functools.partial(
        raw, "ALE/Pong-v5", obs_type="grayscale", frameskip=5, repeat_action_probability=0.0,
        max_episode_steps=90,
    )  # fmt: skip
    ends = run_raw(fn, steps=200, frame_stack=3, path="ale+frame-stack")
    assert ends["truncated"] >= 8, ends


def test_no_frameskip_v4_and_ale_truncation(no_leaks):
    """``*NoFrameskip-v4`` (one frame per action) with ALE's own episode limit (``game_truncated``)."""
    fn = functools.partial(raw, "MsPacmanNoFrameskip-v4", max_num_frames_per_episode=250)
    ends = run_raw(fn, steps=600)
    assert ends["truncated"] >= 8, ends


def test_v4_random_frame_skip_draws_from_the_envs_generator(no_leaks):
    """``Pong-v4``: 2-4 frames per action, drawn by ``AtariEnv.step`` from its ``np_random``."""
    ends = run_raw(functools.partial(raw, "Pong-v4", max_episode_steps=70), steps=150)
    assert ends["truncated"] >= 4, ends


def test_a_codec_reads_the_native_frame(no_leaks):
    """With a codec the native step writes into a scratch row the encoder reads (not the ring)."""
    run_raw(functools.partial(raw, "ALE/Breakout-v5", max_episode_steps=30), steps=60, codec="delta")


def test_a_changed_seed_is_caught(no_leaks):
    with pytest.raises(AssertionError, match="reset obs|obs|reward|done|info"):
        run_raw(functools.partial(raw, "ALE/Breakout-v5"), steps=100, ref_seed=1)


def test_the_checkers_first_steps_go_through_the_wrappers(no_leaks):
    """``PassiveEnvChecker`` checks the first two steps after the first reset itself: the native
    step leaves them to it, and its flags and ``_previous_data`` end as its own steps leave them."""
    fn = functools.partial(raw, "ALE/Pong-v5")
    ref = fn()
    with ShmVecEnv([fn], start_method="fork") as got, closing(ref):
        got.seed(3)
        obs, _ = ref.reset(seed=3)
        assert np.array_equal(got.reset()[0], obs)
        for t in range(3):
            want = ref.step(t % 6)
            step = got.step(np.array([t % 6]))
            assert np.array_equal(step[0][0], want[0]), t
            for attr in _wrapper_state(ref):
                value = got.get_attr(attr)[0]
                assert repr(value) == repr(ref.get_wrapper_attr(attr)), (t, attr, value)


class _Recorded:
    """An ``ALEInterface`` whose calls are recorded (name and arguments) on their way to it."""

    def __init__(self, ale) -> None:
        self.ale, self.calls = ale, []

    def __getattr__(self, name: str):
        method = getattr(self.ale, name)

        def call(*args, **kwargs):
            self.calls.append((name, args))
            return method(*args, **kwargs)

        return call


@pytest.mark.parametrize("obs_type,grab", [("rgb", "getScreenRGB"), ("grayscale", "getScreenGrayscale")])
def test_one_step_acts_per_frame_and_grabs_the_screen_once_into_its_row(obs_type, grab):
    """In one process, beside a twin through its wrappers: each native step is ``frameskip`` acts
    and one screen grab, into the array it is given (no screen of its own), with the twin's results."""
    from shmvec.atari.raw import recognise

    env, twin = raw("ALE/Pong-v5", obs_type=obs_type), raw("ALE/Pong-v5", obs_type=obs_type)
    atari = env.unwrapped
    atari.ale = recorded = _Recorded(atari.ale)
    native, status = recognise(env)
    assert native is not None and status.path == "ale", status
    env.reset(seed=7), twin.reset(seed=7)
    out = np.zeros(env.observation_space.shape, np.uint8)
    for t in range(40):
        recorded.calls.clear()
        reward, terminated, truncated, info = native.step_into(t % 6, out)
        obs, *want = twin.step(t % 6)
        assert np.array_equal(out, obs) and [reward, terminated, truncated, info] == want, t
        names = [name for name, _ in recorded.calls]
        if t >= 2:  # the checker's two steps went through the wrappers
            assert names.count("act") == 4, names
            grabs = [args for name, args in recorded.calls if name == grab]
            assert len(grabs) == 1 and len(grabs[0]) == 1 and grabs[0][0] is out, grabs
            assert names.index(grab) > max(i for i, name in enumerate(names) if name == "act"), names
    env.close(), twin.close()


# ---------------------------------------------------------------- when the path is (not) taken


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        ({"obs_type": "ram"}, "RAM observations"),
        ({"render_mode": None, "full_action_space": True, "frameskip": 4}, None),  # native, full actions
    ],
    ids=["ram", "full-action-space"],
)
def test_which_raw_envs_are_native(no_leaks, kwargs, reason):
    fn = functools.partial(raw, "ALE/Breakout-v5", max_episode_steps=40, **kwargs)
    statuses = equivalent_with_statuses([fn, fn], 60)
    if reason is None:
        assert all(s.path == "ale" for s in statuses), statuses
    else:
        assert all(s.path is None and reason in s.reason for s in statuses), statuses


@pytest.mark.parametrize(
    "name",
    [
        "ale_py.env.AtariEnv._get_obs",
        "ale_py.env.AtariEnv.step",
        "gymnasium.wrappers.common.OrderEnforcing.step",
    ],
)
def test_code_it_was_not_checked_against_steps_through_the_wrappers(no_leaks, monkeypatch, name):
    """A release whose code of a method the raw path restates is not in ``KNOWN`` (``_get_obs``: the
    raw path's alone): through the wrappers, the method and its package's version in the reason,
    one warning per VecEnv."""
    not_checked(monkeypatch, name)
    fn = functools.partial(raw, "ALE/Breakout-v5", max_episode_steps=40)
    with pytest.warns(shmvec.NativeStepWarning, match=name) as record:
        statuses = equivalent_with_statuses([fn, fn], 60)
    native = [w for w in record if issubclass(w.category, shmvec.NativeStepWarning)]
    # equivalent_with_statuses builds two VecEnvs (one compared, one read): one warning each.
    assert len(native) == 2, [str(w.message) for w in native]
    assert all(s.path is None and name in s.reason for s in statuses), statuses
    dist = name.split(".")[0].replace("_", "-")
    assert all(s.unchecked == ((name, f"{dist} {version(dist)}"),) for s in statuses), statuses


def test_other_wrappers_step_through_their_wrappers(no_leaks):
    fn = functools.partial(lambda: gym.wrappers.RecordEpisodeStatistics(raw("ALE/Breakout-v5")))
    statuses = equivalent_with_statuses([fn, fn], 60)
    assert statuses[0].path is None and "RecordEpisodeStatistics" in statuses[0].reason, statuses


# ---------------------------------------------------------------- the Gymnasium face, pool mode


def _gymnasium(fn, mode: AutoresetMode, steps: int = 200, **options) -> set[str]:
    from tests.vector_helpers import run_both

    with closing(shmvec.ShmVectorEnv([fn], start_method="fork", **options)) as probe:
        assert probe.native_steps[0].path is not None and "ale" in probe.native_steps[0].path
    return run_both(fn, mode, n_envs=3, steps=steps, **options)


@pytest.mark.parametrize("mode", [m for m in REFERENCE_MODES if m is not DISABLED])
def test_gymnasium_face_matches_sync(no_leaks, mode):
    fn = functools.partial(raw, "ALE/Breakout-v5", max_episode_steps=180)
    ends = _gymnasium(fn, mode, steps=400)
    assert ends == {"terminated", "truncated"}, ends


def test_pool_mode_each_env_matches_itself_alone(no_leaks):
    from tests.pool_helpers import check_trajectories, run_pool

    fn = functools.partial(raw, "ALE/Breakout-v5", obs_type="grayscale", max_episode_steps=50)
    with closing(shmvec.ShmVectorEnv([fn] * 4, start_method="fork", batch_size=2)) as env:
        assert all(s.path == "ale" for s in env.native_steps), env.native_steps
        got, _ = run_pool(env, 200)
    check_trajectories(fn, got)


# ---------------------------------------------------------------- the matrix (slow)

GAMES = ["Pong", "Breakout", "MsPacman"]
# (sticky, obs_type) pairs, so that each game and frame skip meets both values of each.
SETTINGS = [(0.25, "rgb"), (0.0, "grayscale"), (0.25, "grayscale"), (0.0, "rgb")]


@pytest.mark.slow
@pytest.mark.parametrize("game", GAMES)
@pytest.mark.parametrize("frameskip", [1, 4, 5])
@pytest.mark.parametrize("sticky,obs_type", SETTINGS)
def test_matrix(no_leaks, game, frameskip, sticky, obs_type):
    """Every case with truncations (TimeLimit at 300 frames); half of them on SB3's face (every
    other one of those with frame_stack=4), half on Gymnasium's (next-step and same-step autoreset
    in turn)."""
    fn = functools.partial(
        raw, f"ALE/{game}-v5", frameskip=frameskip, repeat_action_probability=sticky,
        obs_type=obs_type, max_episode_steps=300 // frameskip,
    )  # fmt: skip
    case = GAMES.index(game) + [1, 4, 5].index(frameskip) + SETTINGS.index((sticky, obs_type))
    steps = 2 * 300 // frameskip + 10
    if case % 2:
        assert "truncated" in _gymnasium(
            fn, SAME if case % 4 == 3 and SAME in REFERENCE_MODES else NEXT, steps
        )
        return
    stack = {"frame_stack": 4, "path": "ale+frame-stack"} if case % 4 == 0 else {}
    ends = run_raw(fn, steps=steps, **stack)
    assert ends["truncated"] >= 4, ends
