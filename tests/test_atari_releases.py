"""Which releases the native Atari paths serve (shmvec.atari.fingerprints), and what a user sees
when their code is not one of them: the paths off with every mismatching method named, one
:class:`~shmvec.NativeStepWarning` per VecEnv, none when every env steps natively or none is Atari.

A release not checked is stood in for by a monkeypatched :data:`KNOWN` (fork start method: the
workers inherit the patched table)."""

from __future__ import annotations

import functools
import re
import warnings
import zipfile
from contextlib import closing
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.env_util import make_atari_env

import shmvec
from shmvec.atari import fingerprints, releases
from shmvec.atari.fingerprints import KNOWN, OLDEST, STACKS, distribution, served, version_key
from shmvec.native import fingerprint, fingerprint_source
from tests.helpers import assert_steps_equal, not_checked, require

ROOT = Path(__file__).resolve().parent.parent
MAX_SKIP = "stable_baselines3.common.atari_wrappers.MaxAndSkipEnv.step"
CHECKER = "gymnasium.wrappers.common.PassiveEnvChecker.step"
PREPROCESSING = "gymnasium.wrappers.atari_preprocessing.AtariPreprocessing.step"


@pytest.fixture(autouse=True, scope="module")
def _ale():
    gym.register_envs(require("ale_py", 'pip install -e ".[atari]"'))


def _native_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, shmvec.NativeStepWarning)]


# ---------------------------------------------------------------- the tables


def test_every_fingerprint_is_the_code_of_a_stack_ci_tests():
    for name, codes in KNOWN.items():
        dist = distribution(name)
        for code, (first, last) in codes.items():
            held = [s for s in STACKS if version_key(first) <= version_key(s[dist]) <= version_key(last)]
            assert held, f"{name} {code} ({dist} {first}-{last}) is the code of none of STACKS"


def test_the_oldest_releases_are_the_extras_lower_bounds():
    """OLDEST is where the release tool starts: every bound pyproject.toml gives these packages."""
    text = (ROOT / "pyproject.toml").read_text()
    for dist, oldest in OLDEST.items():
        bounds = set(re.findall(rf'"{dist}>=([0-9.]+)', text))
        assert bounds, dist
        for bound in bounds:
            assert version_key(oldest)[: len(bound.split("."))] == version_key(bound), (dist, bound)


def test_served_spans_each_distribution_over_every_method():
    spans = served()
    assert spans == {
        "gymnasium": ("1.0.0", "1.4.0"),
        "stable-baselines3": ("2.4.0", "2.9.2"),
        "ale-py": ("0.9.0", "0.12.1"),
    }
    # One method whose code stops short narrows its distribution's span.
    codes = dict(KNOWN[CHECKER])
    codes.pop(max(codes, key=lambda c: version_key(codes[c][1])))
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(KNOWN, CHECKER, codes)
        assert served()["gymnasium"] == ("1.0.0", "1.3.0")


def test_the_release_tool_reads_a_method_out_of_a_file_as_inspect_does():
    """The survey reads sources out of wheels: its fingerprint of the installed files must be the one
    the workers compute with inspect."""
    import importlib

    for name, codes in KNOWN.items():
        module_name, cls_name, method = name.rsplit(".", 2)
        module = importlib.import_module(module_name)
        func = getattr(getattr(module, cls_name), method)
        source = releases.method_source(Path(module.__file__).read_text(), f"{cls_name}.{method}")
        assert source is not None and fingerprint_source(source) == fingerprint(func), name
        assert fingerprint(func) in codes, f"{name}: the installed code is not one KNOWN lists"


def test_the_release_tool_reads_wheels(tmp_path):
    whl = tmp_path / "pkg-1.0.0-py3-none-any.whl"
    code = "import functools\n\nclass Env:\n    @functools.cache\n    def step(self, a):\n        '''Doc.'''\n        return a\n"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("pkg/mod.py", code)
    found = releases.fingerprints_in(whl, ["pkg.mod.Env.step", "pkg.mod.Env.reset", "pkg.other.Env.step"])
    assert found["pkg.mod.Env.step"][1].startswith("    @functools.cache")
    assert found["pkg.mod.Env.reset"] == (None, None) and found["pkg.other.Env.step"] == (None, None)
    # Docstrings and layout do not count; code does.
    same = code.replace("'''Doc.'''", "'''Other.'''").replace("return a", "return  a")
    other = code.replace("return a", "return -a")
    for text, equal in ((same, True), (other, False)):
        with zipfile.ZipFile(whl, "w") as z:
            z.writestr("pkg/mod.py", text)
        again = releases.fingerprints_in(whl, ["pkg.mod.Env.step"])["pkg.mod.Env.step"][0]
        assert (again == found["pkg.mod.Env.step"][0]) is equal


def test_the_release_tool_prints_ci_stacks_and_the_installed_code(capsys):
    assert releases.main(["--stacks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [" ".join(f"{d}=={v}" for d, v in s.items()) for s in STACKS[:-1]]
    assert releases.main(["--installed"]) == 0
    assert capsys.readouterr().out.count("  checked") == len(KNOWN)


# ---------------------------------------------------------------- what a user sees


def _sb3_env(reference: bool = False, **options):
    """SB3's recipe on Breakout, 4 envs: through ShmVecEnv, or (``reference``) DummyVecEnv."""
    options.setdefault("start_method", "fork")
    shm = {} if reference else {"vec_env_cls": shmvec.ShmVecEnv, "vec_env_kwargs": options}
    return make_atari_env("BreakoutNoFrameskip-v4", n_envs=4, seed=1, **shm)


def test_code_not_checked_turns_the_path_off_with_every_method_named_and_one_warning(no_leaks, monkeypatch):
    not_checked(monkeypatch, MAX_SKIP, CHECKER)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = _sb3_env(n_workers=2)
    with closing(got), closing(_sb3_env(reference=True)) as ref:
        (message,) = _native_warnings(record)
        sb3, gym_version = fingerprints.installed("stable-baselines3"), fingerprints.installed("gymnasium")
        for status in got.native_steps:
            assert status.path is None
            assert status.unchecked == (
                (CHECKER, f"gymnasium {gym_version}"),
                (MAX_SKIP, f"stable-baselines3 {sb3}"),
            )
            assert f"{CHECKER} (gymnasium {gym_version})" in status.reason and MAX_SKIP in status.reason
        assert message.startswith("4 of 4 envs step through their Python wrappers")
        assert (
            f"{MAX_SKIP} (stable-baselines3 {sb3})" in message
            and f"{CHECKER} (gymnasium {gym_version})" in message
        )
        newest = STACKS[-1]
        pins = f'pip install "gymnasium=={newest["gymnasium"]}" "stable-baselines3=={newest["stable-baselines3"]}"'
        assert pins in message and "native_step=False" in message
        assert "stable-baselines3 2.4.0-2.9.2" in message
        # Through their wrappers, still exactly what DummyVecEnv gives.
        assert np.array_equal(got.reset(), ref.reset())
        assert_steps_equal(got, ref, 60, np.random.default_rng(0))


def test_the_warning_points_at_the_line_that_built_the_vecenv(no_leaks, monkeypatch):
    not_checked(monkeypatch, MAX_SKIP)
    fns = [functools.partial(_sb3_one, "BreakoutNoFrameskip-v4")] * 2
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        env = shmvec.ShmVecEnv(fns, start_method="fork")
    env.close()
    (w,) = [w for w in record if issubclass(w.category, shmvec.NativeStepWarning)]
    assert w.filename == __file__


def _sb3_one(env_id: str) -> gym.Env:
    from stable_baselines3.common.atari_wrappers import AtariWrapper

    return AtariWrapper(gym.make(env_id))


def _preprocessed() -> gym.Env:
    env = gym.wrappers.AtariPreprocessing(gym.make("ALE/Pong-v5", frameskip=1))
    return gym.wrappers.FrameStackObservation(env, 4)


def test_the_gymnasium_face_warns_once_too_and_pool_mode_alike(no_leaks, monkeypatch):
    not_checked(monkeypatch, PREPROCESSING)
    for kwargs in ({}, {"batch_size": 2, "n_workers": 2}):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            env = shmvec.ShmVectorEnv([_preprocessed] * 4, start_method="fork", **kwargs)
        with closing(env):
            (message,) = _native_warnings(record)
            assert message.startswith("4 of 4 envs") and PREPROCESSING in message
            assert all(s.path is None and PREPROCESSING in s.reason for s in env.native_steps)


@pytest.mark.parametrize(
    "build",
    [
        lambda: _sb3_env(n_workers=2),  # every env native
        lambda: shmvec.ShmVecEnv([lambda: gym.make("CartPole-v1")] * 2, start_method="fork"),  # not Atari
        lambda: _sb3_env(n_workers=2, native_step=False),  # asked to step through the wrappers
    ],
    ids=["native", "not-atari", "native_step=False"],
)
def test_no_warning_when_nothing_is_lost_or_the_user_said_so(no_leaks, monkeypatch, build, request):
    if request.node.callspec.id == "native_step=False":
        not_checked(monkeypatch, MAX_SKIP)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        env = build()
    env.close()
    assert _native_warnings(record) == []
    if request.node.callspec.id == "native":
        assert all(s.path == "sb3-atari" for s in env.native_steps)


def test_shmvec_native_says_which_path_and_why_without_code(no_leaks, monkeypatch, capsys):
    from shmvec.cli.main import main

    assert main(["native", "--start-method", "fork"]) == 0
    out = capsys.readouterr().out
    assert "PongNoFrameskip-v4 through sb3-atari, frame_stack=4:" in out
    assert "native step: 1 of 1 envs (sb3-atari+frame-stack)" in out
    assert f"gymnasium {fingerprints.installed('gymnasium')}" in out
    # A release shmvec was not checked against: the path is off, and the command says which code.
    not_checked(monkeypatch, MAX_SKIP)
    assert main(["native", "--start-method", "fork"]) == 1
    out = capsys.readouterr().out
    assert "native step: 0 of 1 envs" in out
    assert f"{MAX_SKIP} (stable-baselines3 {fingerprints.installed('stable-baselines3')})" in out
    assert "1 of 1 envs step through their Python wrappers" in out and "pip install" in out
    # Raw frames with no native path; a bad name is one line and status 2.
    assert main(["native", "--env", "CartPole-v1", "--start-method", "fork"]) == 1
    assert "native step: none" in capsys.readouterr().out
    assert main(["native", "--env", "Pongg-v5"]) == 2
    assert capsys.readouterr().err.startswith("shmvec native: error: cannot create env 'Pongg-v5'")


@pytest.mark.parametrize(("release", "strength"), [("0.9.0", ()), ("0.10.1", (1.0,)), ("0.12.1", (1.0,))])
def test_ale_act_is_called_as_that_release_s_atari_env_step_calls_it(monkeypatch, release, strength):
    monkeypatch.setattr(fingerprints, "installed", lambda dist: release)
    assert fingerprints.act_strength() == strength


def test_the_emulator_floor_and_the_palette_read_act_on_the_installed_ale_py():
    from shmvec.atari import palette
    from shmvec.bench import host

    assert host.emulator_floor_us("PongNoFrameskip-v4", steps=40) > 0
    assert palette.read_off_ale(["pong"], frames=20, every=10)


def test_a_recording_grabs_the_frame_natively_only_over_checked_render_code(monkeypatch):
    from shmvec.atari.emulator import emulator

    env = gym.make("PongNoFrameskip-v4", render_mode="rgb_array")
    emu, why = emulator(env)
    assert emu is not None and why is None and emu.renders_rgb()
    not_checked(monkeypatch, "ale_py.env.AtariEnv.render")
    assert not emu.renders_rgb()
    env.close()
