"""The maps of the source stay true to the tree: CONTRIBUTING.md's source layout has a line for
every module and none for a module that is gone; docs/design.md's picture names only files that
exist, each in its wing, and shows every wing; tests/README.md names the tests of every module, and
every test file; no test file imports another."""

from __future__ import annotations

import re
from pathlib import Path

import shmvec
from tests.helpers import ROOT

# The package that is imported, not a path next to the tests: CI runs these tests against the wheel.
PACKAGE = Path(shmvec.__file__).resolve().parent
# Not mapped: package markers (their folder's line stands for them) and the generated version.
UNMAPPED = ("__init__.py", "_version.py")


def tree_files(package: Path = PACKAGE) -> set[str]:
    """Every module of the package, as a path relative to it (``engine/core.py``)."""
    return {
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if p.name not in UNMAPPED and "__pycache__" not in p.parts
    }


def source_layout(markdown: str) -> str:
    """The ```text block of the "Source layout" section that starts with ``shmvec/``."""
    section = markdown.split("## Source layout", 1)[1]
    found = re.search(r"^```text\nshmvec/\n(.*?)^```", section, re.S | re.M)
    assert found, "CONTRIBUTING.md's Source layout has no ```text block starting with shmvec/"
    return found.group(1)


def mapped_files(block: str) -> set[str]:
    """The module paths a layout block names: each line ``<2 spaces per level><name> <what>``, a
    folder named ``name/`` holding the more indented lines below it."""
    folders: list[str] = []
    out: set[str] = set()
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        assert indent % 2 == 0 and indent >= 2, f"odd indentation: {line!r}"
        name = line.split()[0]
        folders = folders[: indent // 2 - 1]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        else:
            out.add("/".join([*folders, name]))
    return out


def map_problems(mapped: set[str], files: set[str]) -> list[str]:
    """What a map gets wrong against the tree: files without a line, lines without a file."""
    return [f"no line for {f}" for f in sorted(files - mapped)] + [
        f"a line for {f}, which does not exist" for f in sorted(mapped - files)
    ]


def test_contributing_has_a_line_for_every_module():
    block = source_layout((ROOT / "CONTRIBUTING.md").read_text())
    problems = map_problems(mapped_files(block), tree_files())
    assert not problems, "CONTRIBUTING.md's source layout is stale: " + "; ".join(problems)


def test_the_map_check_fails_for_a_file_added_without_its_line():
    block = source_layout((ROOT / "CONTRIBUTING.md").read_text())
    files = tree_files() | {"engine/new_room.py", "transports/ray/new_wire.py"}
    assert map_problems(mapped_files(block), files) == [
        "no line for engine/new_room.py",
        "no line for transports/ray/new_wire.py",
    ]
    assert map_problems(mapped_files(block) | {"atari.py"}, tree_files()) == [
        "a line for atari.py, which does not exist"
    ]


def design_picture() -> list[tuple[str, str]]:
    """``(row label, text)`` per line of docs/design.md's first ```text block: the label (``engine/``,
    ``faces``, ``tools``...) is the word a line starts with in column 0, carried down its rows."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = re.search(r"^```text\n(.*?)^```", text, re.S | re.M)
    assert block, "docs/design.md has no ```text picture"
    rows, label = [], ""
    for line in block.group(1).splitlines():
        if line[:1].strip():
            label = line.split()[0]
        rows.append((label, line))
    return rows


def picture_problems(rows: list[tuple[str, str]], files: set[str]) -> list[str]:
    """Names in the picture that are not in the tree (a file is looked up in its row's wing, then at
    the root), and wings of the tree (folders and root modules) the picture never names."""
    folders = {f.split("/")[0] for f in files if "/" in f}
    problems, named = [], set()
    for label, line in rows:
        wing = label.rstrip("/") if label.endswith("/") else None
        for token in re.findall(r"(?<![\w./])([\w]+(?:/[\w]+)*\.py|[\w]+/)(?![\w])", line):
            if token.endswith("/"):
                named.add(token.rstrip("/"))
                if token.rstrip("/") not in folders and not any(
                    f.startswith(f"{wing}/{token}") for f in files
                ):
                    problems.append(f"{label}: {token} is not a folder")
                continue
            inside = {f for f in files if wing and f.startswith(wing + "/") and f.endswith("/" + token)}
            if inside:
                named.add(wing)
            elif token in files:
                named.add(token.split("/")[0] if "/" in token else token)
            else:
                problems.append(f"{label}: {token} is not in {wing + '/' if wing else 'the root'}")
    wings = folders | {f for f in files if "/" not in f and f != "__main__.py"}
    problems += [f"the picture never names {w}" for w in sorted(wings - named)]
    return problems


def test_the_design_picture_names_only_what_exists_and_every_wing():
    problems = picture_problems(design_picture(), tree_files())
    assert not problems, "docs/design.md's picture is stale: " + "; ".join(problems)


def test_the_picture_check_fails_for_a_stale_name_and_a_missing_wing():
    rows = [("engine/", "engine/      core.py  gone.py"), ("tools", "tools        frame_stack.py")]
    files = {"engine/core.py", "worker/frame_stack.py", "vec_env.py"}
    assert picture_problems(rows, files) == [
        "engine/: gone.py is not in engine/",
        "tools: frame_stack.py is not in the root",
        "the picture never names vec_env.py",
        "the picture never names worker",
    ]


TESTS = ROOT / "tests"


def read_test_map(markdown: str) -> dict[str, list[str]]:
    """tests/README.md's map: module path -> the test files named on its line."""
    block = re.search(r"^```text\n(.*?)^```", markdown, re.S | re.M)
    assert block, "tests/README.md has no ```text map"
    out: dict[str, list[str]] = {}
    for line in block.group(1).splitlines():
        if line.strip():
            module, *tests = line.split()
            assert module not in out, f"two lines for {module}"
            out[module] = tests
    return out


def problems_of_test_map(
    found: dict[str, list[str]], files: set[str], test_files: set[str], prose: str
) -> list[str]:
    """What tests/README.md's map gets wrong: modules without a line (or with no test), lines for
    modules that do not exist, test files named that do not exist, test files named nowhere."""
    problems = map_problems(set(found), files)
    problems += [f"{m} names no test file" for m, tests in sorted(found.items()) if not tests]
    named = {t for tests in found.values() for t in tests} | set(re.findall(r"`(test_\w+)`", prose))
    problems += [f"{t} does not exist" for t in sorted(named - test_files)]
    problems += [f"{t} is named nowhere" for t in sorted(test_files - named)]
    return problems


def test_every_module_has_its_tests_named_and_every_test_file_its_module():
    markdown = (TESTS / "README.md").read_text()
    test_files = {p.stem for p in TESTS.glob("test_*.py")}
    problems = problems_of_test_map(read_test_map(markdown), tree_files(), test_files, markdown)
    assert not problems, "tests/README.md's map is stale: " + "; ".join(problems)


def test_the_test_map_check_fails_for_a_module_or_a_test_file_without_its_line():
    markdown = (TESTS / "README.md").read_text()
    found = read_test_map(markdown)
    test_files = {p.stem for p in TESTS.glob("test_*.py")}
    problems = problems_of_test_map(
        found, tree_files() | {"engine/new_room.py"}, test_files | {"test_new"}, markdown
    )
    assert problems == ["no line for engine/new_room.py", "test_new is named nowhere"]


def test_no_test_file_imports_another():
    """Helpers shared by several test files live in helper modules (tests/README.md), so a newcomer
    reading a test file reads tests, and moving a test never breaks another file."""
    found = [
        f"{p.name}: {line.strip()}"
        for p in sorted(TESTS.glob("*.py"))
        for line in p.read_text().splitlines()
        if re.match(
            r"\s*(from tests(\.test_\w+)? import .*\btest_|from tests\.test_\w+ import|import tests\.test_)",
            line,
        )
    ]
    assert not found, f"test files imported as helpers: {found}"
