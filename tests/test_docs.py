"""The documentation stays true: every public name is documented and referenced, and every Python
snippet in the README and on the docs pages runs."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys

import pytest

import shmvec
from tests.helpers import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _python_snippets() -> dict[str, str]:
    """``page:n`` -> code of every ```python block (```text, ```pycon or ```diff are not run);
    a snippet that appears on several pages runs once."""
    out: dict[str, str] = {}
    for page in PAGES:
        blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)
        for i, code in enumerate(blocks):
            if code not in out.values():
                out[f"{page.relative_to(ROOT)}:{i}"] = code
    return out


SNIPPETS = _python_snippets()


def test_every_public_name_has_a_docstring_and_is_in_the_api_reference():
    api = (ROOT / "docs" / "api.md").read_text()
    for name in shmvec.__all__:
        if name == "__version__":
            assert "__version__" in api
            continue
        obj = getattr(shmvec, name)
        assert (obj.__doc__ or "").strip(), f"shmvec.{name} has no docstring"
        assert f"::: shmvec.{name}\n" in api, f"shmvec.{name} is missing from docs/api.md"


# Modules whose public names the API reference documents (directly or through a package).
DOCUMENTED_MODULES = [
    "shmvec.errors",
    "shmvec.codecs",
    "shmvec.codecs.base",
    "shmvec.codecs.raw",
    "shmvec.codecs.byte",
    "shmvec.codecs.delta",
    "shmvec.codecs.image",
    "shmvec.codecs.clib",
    "shmvec.memory.infos",
    "shmvec.memory.doorbell",
    "shmvec.wire.messages",
    "shmvec.transports.base",
    "shmvec.engine.core",
    "shmvec.engine.calls",
    "shmvec.engine.resets",
    "shmvec.engine.options",
    "shmvec.fidelity",
    "shmvec.fidelity.loop",
    "shmvec.synthetic",
    "shmvec.bench.runner",
    "shmvec.bench.results",
    "shmvec.bench.recommend",
    "shmvec.vec_env",
    "shmvec.vector_env",
    "shmvec.vector.pool",
    "shmvec.vector.calls",
    "shmvec.worker.frame_stack",
    "shmvec.engine.openmp",
    "shmvec.bench.backends",
    "shmvec.bench.envpool_backend",
    "shmvec.bench.recipes",
    "shmvec.bench.ale_vec_backend",
    "shmvec.bench.compare",
    "shmvec.bench.adapters",
    "shmvec.engine.autoworkers",
    "shmvec.bench.report",
    "shmvec.bench.train",
    "shmvec.testing",
    "shmvec.testing.compare",
    "shmvec.testing.equivalence",
    "shmvec.testing.benchmark",
    "shmvec.testing.plugin",
    "shmvec.recording",
    "shmvec.recorder.sb3",
    "shmvec.recorder.gymnasium",
    "shmvec.recorder.dataset",
    "shmvec.recorder.clip",
    "shmvec.recorder.video",
    "shmvec.memory.tape",
]


def _undocumented(owner: str, namespace: dict, module: str) -> list[str]:
    missing = []
    for name, obj in namespace.items():
        if name.startswith("_"):
            continue
        func = obj.fget if isinstance(obj, property) else getattr(obj, "__func__", obj)
        if inspect.isclass(func) and func.__module__ == module:
            if not (func.__doc__ or "").strip():
                missing.append(f"{owner}{name}")
            missing += _undocumented(f"{owner}{name}.", dict(vars(func)), module)
        elif inspect.isfunction(func) and func.__module__ == module and not (func.__doc__ or "").strip():
            missing.append(f"{owner}{name}")
    return missing


def test_every_public_function_class_and_method_has_its_own_docstring():
    # Overrides included: an inherited docstring does not say what a codec or env does differently.
    missing = list(_undocumented("ShmVecEnv.", dict(vars(shmvec.ShmVecEnv)), shmvec.ShmVecEnv.__module__))
    for module in DOCUMENTED_MODULES:
        mod = importlib.import_module(module)
        missing += _undocumented(f"{module}.", dict(vars(mod)), module)
    assert not missing, f"no docstring of their own: {missing}"


def test_dir_lists_the_public_names():
    assert set(shmvec.__all__) <= set(dir(shmvec))


def test_readme_has_a_python_snippet():
    assert any(key.startswith("README.md:") for key in SNIPPETS)


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(SNIPPETS))
def test_snippet_runs(key, tmp_path):
    # A file, not `python -c`: forkserver and spawn workers re-import the main script by path.
    script = tmp_path / "snippet.py"
    script.write_text(SNIPPETS[key])
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert proc.returncode == 0, f"{key} failed:\n{proc.stderr[-3000:]}"
    if key == "README.md:0":  # the quickstart: a newcomer must see that it worked, and how fast
        assert "native step: 8 of 8 envs (sb3-atari+frame-stack)" in proc.stdout, proc.stdout
        assert "env steps/s" in proc.stdout, proc.stdout
    elif key.startswith(FIRST_PAGES):  # a newcomer must see that it worked
        assert proc.stdout.strip(), f"{key} ran and printed nothing"


# The pages a newcomer runs first: every sample on them says what it did (success is not silence).
FIRST_PAGES = ("README.md:", "docs/getting-started.md:")


def test_the_first_samples_print_what_they_did():
    silent = [key for key, code in SNIPPETS.items() if key.startswith(FIRST_PAGES) and "print(" not in code]
    assert not silent, f"samples that print nothing: {silent}"


def _shell_blocks(page):
    """``(text before the block, the block)`` of every ```bash block of ``page``."""
    text = page.read_text()
    return [(text[: m.start()], m.group(1)) for m in re.finditer(r"^```bash\n(.*?)^```", text, re.S | re.M)]


# What a command would overwrite in the repository: the committed figures and the pages.
TRACKED_OUTPUT = re.compile(
    r"(?:--json|--plot|--readme|--markdown|--save-models|>)\s+(benchmarks/results/\S*|docs/\S*|README\.md)"
)


def test_commands_that_write_into_the_repository_say_they_regenerate_its_figures():
    """A reader copies a command block and runs it: one that writes into ``benchmarks/results/`` or
    the docs replaces a committed figure with whatever their machine measured. Such a block is for
    regenerating the committed figures, and the paragraph before it says so ("committed")."""
    unlabelled = []
    for page in PAGES:
        for before, block in _shell_blocks(page):
            paragraph = before.rstrip().rsplit("\n\n", 1)[-1]
            if TRACKED_OUTPUT.search(block) and "committed" not in paragraph:
                unlabelled.append(f"{page.relative_to(ROOT)}: {TRACKED_OUTPUT.search(block).group(0)}")
    assert not unlabelled, f"commands that overwrite committed files unannounced: {unlabelled}"


def test_version_is_semantic_and_in_the_changelog():
    assert re.fullmatch(r"\d+\.\d+\.\d+", shmvec.__version__), shmvec.__version__
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(shmvec.__version__)}\b", changelog, re.M)
    assert "Deprecation policy" in changelog


def test_benchmarks_page_lists_the_registered_backends():
    # One registry: the page's list is what `shmvec bench --help` prints.
    from shmvec.bench.backends import describe_backends

    page = (ROOT / "docs" / "benchmarks.md").read_text()
    block = re.search(r"<!-- backends:start.*?-->\n```text\n(.*?)```\n<!-- backends:end -->", page, re.S)
    assert block is not None and block.group(1) == describe_backends(), (
        "docs/benchmarks.md's backend list differs from shmvec.bench.backends.describe_backends()"
    )
    assert describe_backends() in subprocess.run(
        [sys.executable, "-m", "shmvec", "bench", "--help"], capture_output=True, text=True, timeout=60
    ).stdout.replace("\r", "")


def test_user_pages_talk_to_users_not_about_the_project_s_issues():
    # "the issue's target", "the engine of issue 23": the tracker is ours, not the reader's. The
    # changelog may name issues.
    for page in PAGES:
        if page.name == "changelog.md":
            continue
        found = re.findall(r"[^.\n]*\bissue(?:'s|s)?\b(?:\s+\d+|\s+target)?[^.\n]*", page.read_text(), re.I)
        assert not found, f"{page.relative_to(ROOT)}: {found}"
