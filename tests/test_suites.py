"""benchmarks/suites.py's verdicts on another project's tests run against shmvec: ``check_known``
passes only the known failures, each for its known reason; ``caught`` (the sabotaged adapter's
negative control) passes only when a test failed that would not have without the sabotage, never
because the tests that catch it were left out or passed."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import suites  # noqa: E402

KNOWN = {"t::a": "no space", "t::b": "bad shape"}


def _outcomes(by_test: dict[str, str], why: dict[str, str]) -> suites.Outcomes:
    outcomes = suites.Outcomes()
    outcomes.by_test.update(by_test)
    outcomes.why.update(why)
    return outcomes


AS_KNOWN = (
    {"t::a": "failed", "t::b": "failed", "t::c": "passed"},
    {"t::a": "no space!", "t::b": "bad shape"},
)


@pytest.mark.parametrize(
    ("by_test", "why", "known_ok", "caught"),
    [
        (*AS_KNOWN, True, False),
        # a test beyond the known ones failed
        ({**AS_KNOWN[0], "t::c": "failed"}, {**AS_KNOWN[1], "t::c": "assert rew"}, False, True),
        # a known one failed otherwise (on rewards, before its known reason)
        (AS_KNOWN[0], {**AS_KNOWN[1], "t::a": "assert rew"}, False, True),
        # a known one passed
        ({**AS_KNOWN[0], "t::a": "passed"}, AS_KNOWN[1], False, False),
        # the known ones did not run (pytest -k left them out)
        ({"t::c": "passed"}, {}, False, False),
    ],
    ids=["as-known", "new-failure", "failed-otherwise", "known-passed", "not-run"],
)
def test_verdicts(by_test, why, known_ok, caught):
    outcomes = _outcomes(by_test, why)
    assert suites.check_known(outcomes, KNOWN) == (0 if known_ok else 1)
    assert suites.caught(outcomes, KNOWN) == (0 if caught else 1)
