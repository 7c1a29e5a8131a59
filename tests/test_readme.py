"""The README's commands stay true: CI runs the README's test command verbatim."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.helpers import ROOT


def _readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if "venv" in line]


def test_ci_runs_the_readme_test_command():
    commands = _readme_commands()
    test_command = next(c for c in commands if c.endswith("python -m pytest"))
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_main_job_command_is_the_bench():
    assert any(c.endswith("shmvec bench") for c in _readme_commands())


def test_python_m_shmvec_help():
    out = subprocess.run(
        [sys.executable, "-m", "shmvec", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "bench" in out.stdout
