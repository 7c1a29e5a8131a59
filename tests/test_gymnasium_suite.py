"""benchmarks/gymnasium_suite.py's shim refuses what it cannot translate with an exception that no
Gymnasium test expects, so that such a test fails instead of passing by accident."""

from __future__ import annotations

import sys

import gymnasium as gym
import pytest

from tests.envs import FaultyEnv
from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from gymnasium_suite import AsyncVectorEnvOnShm, NotTranslated  # noqa: E402

SPACE = FaultyEnv.observation_space


@pytest.mark.parametrize(
    "kwargs",
    [
        {"worker": lambda *args: None},
        {"observation_mode": "different"},
        {"observation_mode": "not a mode"},  # AsyncVectorEnv: ValueError, which a test expects
        {"observation_mode": (SPACE, SPACE)},
    ],
    ids=["worker", "different", "unknown-mode", "space-pair"],
)
def test_untranslatable_arguments_raise_what_no_test_expects(no_leaks, kwargs):
    with pytest.raises(NotTranslated) as e:
        AsyncVectorEnvOnShm([FaultyEnv] * 2, **kwargs)
    # Only Exception above it: pytest.raises(TypeError / ValueError / RuntimeError / gym.error.Error,
    # AssertionError...) in a test does not catch it.
    assert type(e.value).__mro__[1:] == (Exception, BaseException, object)
    assert not isinstance(e.value, (TypeError, ValueError, RuntimeError, AssertionError, gym.error.Error))
