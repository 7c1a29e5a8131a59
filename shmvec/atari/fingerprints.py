"""Which code the native Atari paths were checked against: the source fingerprint
(:func:`shmvec.native.fingerprint`) of every method a path restates, in every release the
``atari`` extra allows, and the stacks the exactness tests run on.

A native path steps an env only when every method it restates has a fingerprint :data:`KNOWN`
lists; any other code steps through its wrappers, and the faces warn once (:func:`warning`).
Each fingerprint of :data:`KNOWN` was read off PyPI's files of every release in range
(``python -m shmvec.atari.releases``) and is the code of at least one of the :data:`STACKS` that
CI runs the exactness tests on (``tests/test_atari_releases.py`` checks both tables agree).

Adding a release: ``python -m shmvec.atari.releases`` lists, per restated method, the releases whose
fingerprint differs from every one :data:`KNOWN` holds. Read the difference (``--diff``); where the
restatement still holds, add the fingerprint here with its releases, add a stack that has it to
:data:`STACKS` (CI's ``atari stacks`` stage then runs the exactness tests on it), and run those
tests on it: ``python -m shmvec.atari.releases --stack N`` prints the command.

Imported by workers: standard library only.
"""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Any

from shmvec.native import UNCHECKED, NativeStatus, fingerprint

#: The distribution that ships each top-level module a restated method lives in.
DISTRIBUTIONS = {"stable_baselines3": "stable-baselines3", "gymnasium": "gymnasium", "ale_py": "ale-py"}
#: The oldest release of each that the ``atari`` extra allows (pyproject.toml).
OLDEST = {"stable-baselines3": "2.4.0", "gymnasium": "1.0.0", "ale-py": "0.9.0"}

_SB3 = ("2.4.0", "2.9.2")
_GYM = ("1.0.0", "1.4.0")
_GYM_13 = ("1.0.0", "1.3.0")
#: ``module.Class.method`` -> {fingerprint: (first release, last release) that has that code}.
KNOWN: dict[str, dict[str, tuple[str, str]]] = {
    "gymnasium.core.Wrapper.step": {"61caa1383e31c093": _GYM},
    "gymnasium.core.ObservationWrapper.step": {"6e3f8f66e60f1a5b": _GYM},
    "gymnasium.core.RewardWrapper.step": {"0fbec0944b8f32d9": _GYM},
    # The resets a life-loss reset passes through (shmvec.atari.sb3.AtariStep.reset).
    "gymnasium.core.Wrapper.reset": {"aec944ce8bf57cce": _GYM},
    "gymnasium.core.ObservationWrapper.reset": {"3392dc14f648281a": _GYM},
    "stable_baselines3.common.atari_wrappers.FireResetEnv.reset": {"d888b1617cae3145": _SB3},
    "stable_baselines3.common.atari_wrappers.EpisodicLifeEnv.reset": {"3bd7de33421b4184": _SB3},
    "gymnasium.wrappers.common.TimeLimit.step": {"64e8faed8ba6b0fa": _GYM},
    "gymnasium.wrappers.common.OrderEnforcing.step": {"76a419da11853263": _GYM},
    # 1.4 adds a data-reuse check of the first two steps (shmvec.native.GymLayers.ready waits for it).
    "gymnasium.wrappers.common.PassiveEnvChecker.step": {
        "7e47f4fe3122e343": _GYM_13,
        "84d7bc73fb254409": ("1.4.0", "1.4.0"),
    },
    "gymnasium.wrappers.atari_preprocessing.AtariPreprocessing.step": {"1def2b8b37410f58": _GYM},
    "gymnasium.wrappers.atari_preprocessing.AtariPreprocessing._get_obs": {"4f62c3a10b03a473": _GYM},
    "gymnasium.wrappers.stateful_observation.FrameStackObservation.step": {"71fdebab75e79354": _GYM},
    "gymnasium.wrappers.common.RecordEpisodeStatistics.step": {"2cfeb154ded19c38": _GYM},
    "gymnasium.wrappers.transform_observation.TransformObservation.observation": {"51844ec89d70d289": _GYM},
    # Their observation functions are lambdas made in __init__ (sb3.py checks func is that lambda);
    # 1.4 turned the asserts into exceptions and reshapes a resize's result to its space.
    "gymnasium.wrappers.transform_observation.ResizeObservation.__init__": {
        "9fa856ad53e7401a": _GYM_13,
        "acc49506634e89c2": ("1.4.0", "1.4.0"),
    },
    "gymnasium.wrappers.transform_observation.GrayscaleObservation.__init__": {
        "dfc940909600235e": _GYM_13,
        "b11ed496300953a9": ("1.4.0", "1.4.0"),
    },
    # 0.10 passes act a paddle strength (1.0 for discrete actions) and adds continuous actions;
    # 0.11.1 checks their dtype; 0.12 fixes the sign of their threshold. The native paths refuse
    # continuous actions and make AtariEnv's own call (Emulator.strength): act(action) differs from
    # act(action, 1.0) on 0.10.0-0.10.1, whose binding gives act(action) another strength.
    "ale_py.env.AtariEnv.step": {
        "b7f2e37a6f8696d9": ("0.9.0", "0.9.1"),
        "2ef437596c631658": ("0.10.0", "0.11.0"),
        "d2135cf288ab67f4": ("0.11.1", "0.11.2"),
        "3d2cd747f84acf61": ("0.12.0", "0.12.1"),
    },
    "ale_py.env.AtariEnv._get_info": {"91bdc02a674d478a": ("0.9.0", "0.12.1")},
    # Restated by the raw path alone (shmvec.atari.raw); the others grab their own screens.
    # 0.10 words its error; 0.10.2 adds sound observations (which the raw path refuses). The screen
    # grab of "rgb" and "grayscale" is the same call in every release.
    "ale_py.env.AtariEnv._get_obs": {
        "5e0bddaafeb0b107": ("0.9.0", "0.9.1"),
        "2bd4748429b4fd6f": ("0.10.0", "0.10.1"),
        "9ba5af51ece75289": ("0.10.2", "0.12.1"),
    },
    # Restated by a recording's frame grab (Emulator.render_into) only.
    "ale_py.env.AtariEnv.render": {"5223d07532890cd3": ("0.9.0", "0.12.1")},
    # 2.5 changed its type hints only (typing.Tuple -> tuple).
    "stable_baselines3.common.monitor.Monitor.step": {
        "bedad267b2bd9c3f": ("2.4.0", "2.4.1"),
        "af96898c9d2bc24f": ("2.5.0", "2.9.2"),
    },
    "stable_baselines3.common.atari_wrappers.MaxAndSkipEnv.step": {"d4e549050154a395": _SB3},
    "stable_baselines3.common.atari_wrappers.EpisodicLifeEnv.step": {"b0b60a039ca36809": _SB3},
    "stable_baselines3.common.atari_wrappers.StickyActionEnv.step": {"77a22e6a4d1f351f": _SB3},
    "stable_baselines3.common.atari_wrappers.WarpFrame.observation": {"0d6e6017d12461d4": _SB3},
    "stable_baselines3.common.atari_wrappers.ClipRewardEnv.reward": {"6c93bbdc6319e4a5": _SB3},
}

#: The stacks CI runs the native exactness tests on (``.ci/run``'s ``atari stacks`` stage; the last
#: is the newest, which the README's test command installs). Together they hold every fingerprint
#: of :data:`KNOWN`.
STACKS: tuple[dict[str, str], ...] = (
    {"stable-baselines3": "2.4.0", "gymnasium": "1.0.0", "ale-py": "0.9.0"},
    {"stable-baselines3": "2.6.0", "gymnasium": "1.1.1", "ale-py": "0.11.2"},
    {"stable-baselines3": "2.8.0", "gymnasium": "1.2.3", "ale-py": "0.10.1"},
    {"stable-baselines3": "2.9.2", "gymnasium": "1.4.0", "ale-py": "0.12.1"},
)


def version_key(version: str) -> tuple[int, ...]:
    """``"0.11.2"`` -> ``(0, 11, 2)``: release order (the releases in range are plain X.Y.Z)."""
    return tuple(int(part) for part in version.split("."))


def distribution(name: str) -> str:
    """The distribution that ships the restated method ``module.Class.method``."""
    return DISTRIBUTIONS[name.split(".", 1)[0]]


@functools.cache
def installed(dist: str) -> str:
    """The installed version of ``dist`` ("not installed" when it is not)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def act_strength() -> tuple[float, ...]:
    """What ``AtariEnv.step`` passes to ``ale.act`` after the action, for a discrete action on the
    installed ale-py: ``(1.0,)`` since 0.10, nothing before (0.9's ``act`` takes the action only).
    Every caller of ``act`` passes it: 0.10.0 and 0.10.1 bind ``act(action)`` to another paddle
    strength than 1.0 (Pong's paddle then moves otherwise); 0.10.2 made 1.0 ``act``'s default."""
    major_minor = tuple(int(part) for part in installed("ale-py").split(".")[:2])
    return () if major_minor < (0, 10) else (1.0,)


def served() -> dict[str, tuple[str, str]]:
    """Per distribution, the first and last release whose code every restated method of it was
    checked against."""
    spans: dict[str, tuple[str, str]] = {}
    for name, codes in KNOWN.items():
        dist = distribution(name)
        first = min((span[0] for span in codes.values()), key=version_key)
        last = max((span[1] for span in codes.values()), key=version_key)
        if dist in spans:
            first = max(first, spans[dist][0], key=version_key)
            last = min(last, spans[dist][1], key=version_key)
        spans[dist] = (first, last)
    return spans


def unknown_code(layers: list[Any], methods: tuple[str, ...]) -> list[str]:
    """Every method among ``methods`` of ``layers``' classes whose code :data:`KNOWN` does not list
    (``module.Class.method`` of the class that defines it), in order, once each."""
    names: list[str] = []
    for layer in layers:
        for attr in methods:
            func = getattr(type(layer), attr, None)
            if func is None:
                continue
            name = f"{func.__module__}.{func.__qualname__}"
            if fingerprint(func) not in KNOWN.get(name, ()) and name not in names:
                names.append(name)
    return names


def unchecked_status(names: list[str]) -> NativeStatus:
    """The status of an env whose wrapper chain a native path steps, but whose code ``names`` (the
    restated methods :data:`KNOWN` does not list) was not checked."""
    found = tuple((name, f"{distribution(name)} {installed(distribution(name))}") for name in names)
    listed = ", ".join(f"{name} ({version})" for name, version in found)
    return NativeStatus(None, f"{UNCHECKED}: {listed}", found)


def warning(statuses: list[NativeStatus]) -> str | None:
    """The one warning a face gives for ``statuses`` (its envs' :class:`NativeStatus`), or None when
    no env's chain is one a native path steps over code it was not checked against."""
    unchecked = [s for s in statuses if s.unchecked]
    if not unchecked:
        return None
    found = dict.fromkeys(pair for s in unchecked for pair in s.unchecked)
    dists = dict.fromkeys(distribution(name) for name, _ in found)
    newest = STACKS[-1]
    pins = " ".join(f'"{d}=={newest[d]}"' for d in dists)
    checked = ", ".join(f"{d} {a}-{b}" for d, (a, b) in served().items())
    return (
        f"{len(unchecked)} of {len(statuses)} envs step through their Python wrappers: their chain is "
        "one shmvec steps natively, but this code was not checked against it: "
        + "; ".join(f"{name} ({version})" for name, version in found)
        + f". Checked: {checked}. For the native step: pip install {pins} (tested together: "
        + ", ".join(f"{d} {v}" for d, v in newest.items())
        + "); native_step=False steps through the wrappers without this warning."
    )
