"""Every example runs end to end for a few hundred steps, as a user would start it."""

from __future__ import annotations

import ast
import importlib.util

import pytest

from tests.helpers import ROOT, run_python

EXAMPLES = {
    "ppo_atari.py": ["--n-envs", "2", "--steps", "256"],
    "dqn_atari.py": ["--n-envs", "2", "--steps", "300"],
    "camera_env_ppo.py": ["--n-envs", "2", "--size", "64", "--steps", "256"],
    "cleanrl_ppo_atari.py": [
        "--vec",
        "shm",
        "--num-envs",
        "2",
        "--num-steps",
        "64",
        "--total-timesteps",
        "256",
    ],
    "cleanrl_ppo_atari_pool.py": [
        "--num-envs",
        "4",
        "--batch-size",
        "2",
        "--num-steps",
        "32",
        "--total-timesteps",
        "256",
    ],
    "codec_fidelity.py": ["--frames", "40", "--n-envs", "2", "--steps", "256"],
    "native_env.py": ["--n-envs", "2", "--steps", "200"],
    "ray_cluster_ppo.py": ["--n-envs", "2", "--n-workers", "2", "--steps", "256"],
    "start_method.py": [],
    "start_method.py --no-guard": ["--no-guard"],
}


# Examples that need an extra beyond the README's set-up (atari, bench): (extra, its modules). Where
# they are missing the example must stop with the line that installs them, not a bare import error.
NEEDS_EXTRA = {
    "codec_fidelity.py": ("codecs", ("lz4", "zstandard", "numba", "cv2")),
    "ray_cluster_ppo.py": ("ray", ("ray",)),
}


def _missing(modules: tuple[str, ...]) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs(name):
    script = ROOT / "examples" / name.split()[0]
    extra, modules = NEEDS_EXTRA.get(script.name, ("", ()))
    proc = run_python(str(script), *EXAMPLES[name], timeout=300)
    if _missing(modules):
        assert proc.returncode != 0 and f'pip install -e ".[{extra}]"' in proc.stderr, proc.stderr[-3000:]
        assert "ModuleNotFoundError" not in proc.stderr, proc.stderr[-3000:]
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]


def test_every_example_is_tested():
    on_disk = {p.name for p in (ROOT / "examples").glob("*.py")}
    assert on_disk == {name.split()[0] for name in EXAMPLES}


def test_every_example_says_what_it_does_in_whole_sentences():
    # `--help` shows the docstring's first paragraph: a sentence cut at its first line reads as a bug.
    for path in sorted((ROOT / "examples").glob("*.py")):
        text = path.read_text()
        first_paragraph = ast.get_docstring(ast.parse(text)).split("\n\n")[0]
        assert first_paragraph.rstrip().endswith("."), f"{path.name}: {first_paragraph!r}"
        assert 'description=__doc__.split("\\n\\n")[0]' in text, f"{path.name}: --help shows less"


def test_no_example_help_says_its_default_twice():
    # argparse's ArgumentDefaultsHelpFormatter appends "(default: X)" to every help text: one that
    # says its own default read "(default 1) (default: None)".
    for path in sorted((ROOT / "examples").glob("*.py")):
        text = path.read_text()
        if "ArgumentDefaultsHelpFormatter" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                help_text = next((k.value for k in node.keywords if k.arg == "help"), None)
                if isinstance(help_text, ast.Constant) and isinstance(help_text.value, str):
                    assert "default" not in help_text.value.lower(), f"{path.name}: {help_text.value!r}"
