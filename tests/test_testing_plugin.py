"""The ``shmvec.testing`` pytest plugin as a user runs it: pytester runs the test files the guide
"In your test suite" tells users to paste (taken from ``docs/guides/testing.md`` itself) in a fresh
pytest process, twice: once saving the run, once comparing with it. Each backend is a case, one
group per env and ``n_envs``, env steps/s in ``extra_info``; nothing is left running or in
``/dev/shm``."""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path

import psutil
import pytest

from shmvec.memory.ring import SEGMENT_PREFIX
from tests.helpers import ROOT, require

pytest_plugins = ["pytester"]

GUIDE = ROOT / "docs" / "guides" / "testing.md"
MARK = "SHMVEC_PLUGIN_TEST_RUN"

# A plugin of the test's own (not the user's files): after each test of the inner run, the VecEnvs'
# processes are gone and this process's shared-memory segments with them; the pid for the check after.
LEAK_CHECK = f"""
import os, time, pytest
from tests.conftest import live_children, shm_segments

open(os.environ["{MARK}_PID_FILE"], "w").write(str(os.getpid()))

@pytest.fixture(autouse=True)
def _nothing_left():
    before = shm_segments()
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (live_children() or shm_segments() - before):
        time.sleep(0.05)
    assert live_children() == [], "processes left running"
    assert shm_segments() - before == set(), "shared-memory segments left"
"""


def guide_files() -> dict[str, str]:
    """``path -> code`` of the guide's Python snippets that start with a ``# tests/...`` line."""
    blocks = re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(), re.S | re.M)
    return {m.group(1): code for code in blocks if (m := re.match(r"# (tests/\S+\.py)\n", code))}


def processes_of_run(mark: str) -> list[psutil.Process]:
    """Processes that carry this run's mark in their environment (the inner pytest's descendants)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARK) == mark:
                found.append(proc)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def test_the_guide_has_the_files():
    assert set(guide_files()) == {
        "tests/test_shmvec_equivalence.py",
        "tests/conftest.py",
        "tests/test_vec_env_speed.py",
    }


@pytest.mark.slow
def test_users_files_run_with_the_plugin(pytester: pytest.Pytester, monkeypatch, tmp_path: Path):
    require("pytest_benchmark", "pip install pytest-benchmark")
    files = guide_files()
    for path, code in files.items():
        pytester.path.joinpath(path).parent.mkdir(exist_ok=True)
        pytester.path.joinpath(path).write_text(code)
    pytester.makepyfile(shmvec_leak_check=LEAK_CHECK)
    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK, mark)
    monkeypatch.setenv(f"{MARK}_PID_FILE", str(tmp_path / "pid"))
    # The repository (for the leak check's helpers) and the folder of the leak check on the path.
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(ROOT), str(pytester.path), os.environ.get("PYTHONPATH", "")])
    )
    storage = f"file://{tmp_path / 'runs'}"
    tiny = ["--benchmark-max-time=0.02", "--benchmark-min-rounds=3", f"--benchmark-storage={storage}"]
    common = ["-p", "shmvec_leak_check", "-p", "no:cacheprovider", "-p", "no:randomly", *tiny]

    first = pytester.runpytest_subprocess(
        *common, "--benchmark-save=base", "--benchmark-json=run.json", timeout=600
    )
    assert first.ret == 0, first.stdout.str()[-4000:]
    # 2 equivalence tests, 2 n_envs x 3 backends.
    first.assert_outcomes(passed=8)

    cases = json.loads((pytester.path / "run.json").read_text())["benchmarks"]
    groups: dict[str, set[str]] = {}
    for case in cases:
        info = case["extra_info"]
        groups.setdefault(case["group"], set()).add(info["backend"])
        assert case["group"] == f"my_env n={info['n_envs']}" and info["env"] == "my_env"
        assert case["param"] is not None and info["backend"] in case["name"]
        # Env steps/s at the median batch step: what pytest-benchmark measured, n_envs times.
        assert info["env_steps_per_s"] == pytest.approx(info["n_envs"] / case["stats"]["median"], rel=1e-12)
    assert groups == {"my_env n=4": {"dummy", "subproc", "shm"}, "my_env n=8": {"dummy", "subproc", "shm"}}

    second = pytester.runpytest_subprocess(
        *common, "--benchmark-only", "--benchmark-compare=0001", timeout=600
    )
    assert second.ret == 0, second.stdout.str()[-4000:]
    second.assert_outcomes(passed=6, skipped=2)  # --benchmark-only skips the equivalence tests
    out = second.stdout.str()
    for group in groups:
        assert f"benchmark '{group}': 6 tests" in out  # each backend next to its saved self
    for backend in ("dummy", "subproc", "shm"):
        assert re.search(rf"test_step_speed\[{backend}-4\] \(0001_base\)", out), out[-4000:]
        assert re.search(rf"test_step_speed\[{backend}-4\] \(NOW\)", out), out[-4000:]

    # After the runs: no process of theirs left, no segment of the inner pytest's in /dev/shm.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and processes_of_run(mark):
        time.sleep(0.1)
    assert processes_of_run(mark) == []
    pid = (tmp_path / "pid").read_text()
    assert [n for n in os.listdir("/dev/shm") if n.startswith(f"{SEGMENT_PREFIX}{pid}_")] == []


@pytest.mark.slow
def test_backends_marker_and_errors(pytester: pytest.Pytester, monkeypatch):
    """The ``vec_env_backends`` marker, else the ini option, chooses the backends; a wrong name or a
    missing n_envs says what to do."""
    require("pytest_benchmark", "pip install pytest-benchmark")
    pytester.makeini("[pytest]\nvec_env_backends = dummy shm\n")
    pytester.makepyfile(
        test_gym="""
        import functools
        import pytest
        from shmvec.synthetic import SyntheticImageEnv

        make_env = functools.partial(SyntheticImageEnv, (8, 8, 1))

        @pytest.mark.vec_env_backends("sync", "shm-vector")
        def test_gymnasium_backends(vec_env_benchmark):
            assert vec_env_benchmark(make_env, 2) > 0

        def test_ini_backends(vec_env_benchmark):
            assert vec_env_benchmark([make_env] * 2) > 0

        @pytest.mark.vec_env_backends("bogus")
        def test_unknown_backend(vec_env_benchmark):
            vec_env_benchmark(make_env, 2)

        @pytest.mark.vec_env_backends("dummy")
        def test_single_factory_needs_n_envs(vec_env_benchmark):
            with pytest.raises(ValueError, match="give n_envs"):
                vec_env_benchmark(make_env)
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "shmvec.testing", "-p", "no:cacheprovider", "--benchmark-max-time=0.01", "-v", timeout=300
    )
    result.assert_outcomes(passed=5, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test_gymnasium_backends?sync? PASSED*",
            "*test_gymnasium_backends?shm-vector? PASSED*",
            "*test_ini_backends?dummy? PASSED*",
            "*test_ini_backends?shm? PASSED*",
            "*unknown backend 'bogus'; choose from dummy, subproc, shm*",
        ]
    )
