"""The README's set-up stays true: two commands, each in a fresh venv of its own, one runs
``shmvec bench`` and one the tests; CI runs the test command verbatim."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.helpers import ROOT


def _setup_commands() -> list[str]:
    """The README's bash blocks that make a venv, as written (continuation lines included)."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [b.strip() for b in blocks if "python3 -m venv" in b]


def _joined(command: str) -> str:
    return re.sub(r"\s*\\\n\s*", " ", command)


def test_two_setup_commands_in_two_venvs():
    commands = _setup_commands()
    assert len(commands) == 2, commands
    venvs = [re.search(r"python3 -m venv (\S+)", c).group(1) for c in commands]
    assert len(set(venvs)) == 2, f"both commands make {venvs[0]}: the second would not start fresh"


def test_ci_runs_the_readme_test_command():
    test_command = next(c for c in _setup_commands() if _joined(c).endswith("python -m pytest"))
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_main_job_command_is_the_bench():
    assert any(_joined(c).endswith("shmvec bench") for c in _setup_commands())


def test_python_m_shmvec_help():
    out = subprocess.run(
        [sys.executable, "-m", "shmvec", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "bench" in out.stdout


def test_readme_says_how_long_each_command_takes():
    """Each set-up command is introduced by how long it runs (minutes), so that a newcomer knows
    whether to wait."""
    text = (ROOT / "README.md").read_text()
    for command in _setup_commands():
        before = text[: text.index(command)].removesuffix("```bash\n").rstrip().rsplit("\n\n", 1)[-1]
        assert re.search(r"\d+ minutes", before), f"nothing says how long this takes:\n{before}\n{command}"


def test_install_prose_says_where_the_cpu_build_of_pytorch_comes_from():
    """``torch==2.13.0`` from PyPI is PyTorch's CUDA build (several GB of NVIDIA libraries): the pages
    that install it say how to get the CPU build instead, and do not claim the pin avoids CUDA."""
    for page in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        text = " ".join(page.read_text().split())
        assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in text, page.name
        assert "does not pull a CUDA build" not in text, page.name
        assert "NVIDIA GPU" in text, page.name


def test_the_main_job_is_described_as_what_the_bench_measures_by_default():
    """The README's sentence before ``shmvec bench`` speaks of the workload the bench's defaults
    measure (SB3's Atari recipe on Pong, against ale-py's vector env, SubprocVecEnv, DummyVecEnv)."""
    from shmvec.cli.main import RECIPE_BACKENDS, _parser, resolve_defaults

    args = _parser().parse_args(["bench"])
    resolve_defaults(args)
    assert (args.recipe, args.env, args.n_envs) == ("sb3-atari", "PongNoFrameskip-v4", "8")
    assert args.backends.split(",")[: len(RECIPE_BACKENDS)] == list(RECIPE_BACKENDS)
    text = (ROOT / "README.md").read_text()
    command = next(c for c in _setup_commands() if _joined(c).endswith("shmvec bench"))
    intro = " ".join(text[: text.index(command)].rsplit("\n\n", 2)[-2].split())
    for words in ("SB3's Atari recipe", "Pong", "8 envs", "AtariVectorEnv", "SubprocVecEnv", "DummyVecEnv"):
        assert words in intro, f"{words!r} not in the bench command's introduction: {intro}"
