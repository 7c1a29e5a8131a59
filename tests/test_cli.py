"""What a newcomer types first: ``--version``, ``--help`` of the examples, ``shmvec codecs`` without
the ``codecs`` extra, and start-method mistakes."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import shmvec
from shmvec import codecs
from shmvec.cli.main import main
from shmvec.engine.start_methods import default_start_method, resolve_start_method
from tests.helpers import ROOT


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"shmvec {shmvec.__version__}"


def test_example_help_runs_nothing():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "start_method.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:") and "--no-guard" in proc.stdout, proc.stdout[:500]
    assert "ok (" not in proc.stdout  # the demo did not run


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "examples").glob("*.py")))
def test_example_help_shows_defaults(name):
    # Read from the source: running each example's --help costs an SB3 + torch import apiece.
    source = (ROOT / "examples" / name).read_text()
    assert "formatter_class=argparse.ArgumentDefaultsHelpFormatter" in source
    calls = re.findall(r"add_argument\((.*?)\)\n", source, re.S)
    assert calls and all("help=" in call for call in calls), name  # no help: no default shown


def test_codecs_says_what_the_extra_adds(capsys, monkeypatch):
    monkeypatch.setattr(codecs, "missing", lambda: ["lz4", "zstd", "delta"])
    assert main(["codecs", "--env", "tests.envs:make_small_synthetic", "--steps", "4", "--codec", "raw"]) == 0
    assert "not installed" not in capsys.readouterr().out  # the user chose: no note
    assert main(["codecs", "--env", "tests.envs:make_small_synthetic", "--steps", "4"]) == 0
    out = capsys.readouterr().out
    expected = 'not installed here: lz4, zstd, delta. pip install -e ".[codecs]" (in a clone of shmvec; once '
    assert expected + 'released: pip install "shmvec[codecs]") adds them' in out


def test_start_method_choices():
    assert resolve_start_method(None) == default_start_method() == "forkserver"
    assert resolve_start_method("spawn") == "spawn"
    with pytest.raises(ValueError, match=r"'forkk' is not one of 'fork', 'spawn', 'forkserver' \(default"):
        resolve_start_method("forkk")


UNGUARDED = """
import multiprocessing as mp

from shmvec.engine.start_methods import exit_if_reimported_main


def start():
    exit_if_reimported_main()  # what creating a VecEnv does first
    p = mp.get_context("spawn").Process(target=print)
    p.start()
    p.join()
    return p.exitcode


code = start()  # no __main__ guard: the child re-imports this file and gets here again
print("child exit code", code)
"""


def test_missing_main_guard_is_one_line_in_the_worker(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "child exit code 1" in proc.stdout
    # The worker says what to do in one line, with no traceback of its own.
    assert proc.stderr.strip().splitlines() == [
        line for line in proc.stderr.strip().splitlines() if line.startswith("shmvec: a worker process")
    ]
    assert "__main__" in proc.stderr and "Traceback" not in proc.stderr
