"""The CLI prints expected input errors as one line and lets bugs keep their traceback."""

from __future__ import annotations

import pytest

from shmvec.cli.main import main

TINY = "tests.envs:TinyImageEnv"


def test_a_bug_keeps_its_traceback(monkeypatch):
    """An AttributeError raised by shmvec's own code is a bug, not bad input: it propagates."""
    import shmvec.bench.runner

    def broken_run(*args, **kwargs):
        raise AttributeError("'NoneType' object has no attribute 'step'")

    monkeypatch.setattr(shmvec.bench.runner, "run", broken_run)
    with pytest.raises(AttributeError, match="has no attribute 'step'"):
        main(["bench", "--env", TINY, "--backends", "dummy", "--repeats", "1", "--seconds", "0.1"])


def test_bad_input_is_one_line(capsys):
    assert main(["bench", "--env", TINY, "--n-envs", "two"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["shmvec bench: error: --n-envs must be comma-separated integers, got 'two'"]


def test_codecs_bad_codec_is_one_line(capsys):
    assert main(["codecs", "--env", TINY, "--steps", "3", "--codec", "nope"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
