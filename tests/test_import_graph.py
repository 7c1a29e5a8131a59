"""The architecture's arrows, checked on the source: no import circles in ``shmvec/``, and each floor
imports only the floors below it. Every import statement counts, at module level, inside functions
and under ``TYPE_CHECKING`` alike: a lazy import is still an arrow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shmvec

# The package that is imported, not a path next to the tests: CI runs these tests against the wheel.
PACKAGE = Path(shmvec.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                # "from pkg import mod" imports pkg.mod when that is a module.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target.startswith("shmvec") and target != name:
                    graph[name].add(target)
    return graph


GRAPH = _graph()


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_was_read():
    assert "shmvec.engine.core" in GRAPH and "shmvec.transports.base" in GRAPH["shmvec.engine.core"]


def test_no_import_circles():
    assert _cycle(GRAPH) is None, f"import circle: {' -> '.join(_cycle(GRAPH) or [])}"


def test_the_check_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


# floor -> what it may not import
FORBIDDEN = {
    "shmvec.codecs": ("shmvec.",),  # but shmvec.codecs itself
    "shmvec.memory": ("shmvec.codecs", "shmvec.engine", "shmvec.transports", "shmvec.worker", "shmvec.wire"),
    "shmvec.wire": ("shmvec.engine", "shmvec.transports", "shmvec.worker", "shmvec.memory", "shmvec.codecs"),
    "shmvec.worker": ("shmvec.engine", "shmvec.transports", "shmvec.vec_env", "shmvec.vector_env"),
    "shmvec.transports": ("shmvec.engine", "shmvec.vec_env", "shmvec.vector_env", "shmvec.vector_pool"),
    # device= converters: below the engine (which makes and closes them), above memory only.
    "shmvec.device": (
        "shmvec.codecs",
        "shmvec.engine",
        "shmvec.transports",
        "shmvec.worker",
        "shmvec.wire",
        "shmvec.vec_env",
        "shmvec.vector_env",
        "shmvec.vector_pool",
    ),
    "shmvec.engine": ("shmvec.vec_env", "shmvec.vector_env", "shmvec.vector_pool", "shmvec.bench"),
    # Native step paths run in workers, beside the env calls: nothing of the engine or the faces.
    "shmvec.native": ("shmvec.",),
    "shmvec.atari": (
        "shmvec.engine",
        "shmvec.transports",
        "shmvec.worker",
        "shmvec.wire",
        "shmvec.memory",
        "shmvec.codecs",
        "shmvec.vec_env",
        "shmvec.vector_env",
        "shmvec.vector_pool",
        "shmvec.bench",
    ),
}


@pytest.mark.parametrize("floor", sorted(FORBIDDEN))
def test_arrows_point_down(floor):
    bad = []
    for module, targets in GRAPH.items():
        if module != floor and not module.startswith(floor + "."):
            continue
        for target in targets:
            allowed_inside = target == floor or target.startswith(floor + ".")
            if not allowed_inside and any(target.startswith(f) for f in FORBIDDEN[floor]):
                bad.append(f"{module} -> {target}")
    assert not bad, f"arrows pointing up or sideways: {bad}"
