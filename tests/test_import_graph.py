"""The architecture's arrows, checked on the source: no import circles in ``shmvec/``, neither between
files nor between a wing (a folder) and a root file, each floor imports only the floors below it, and
the root holds the faces and the public leaves only. Every import statement counts, at module level,
inside functions and under ``TYPE_CHECKING`` alike: a lazy import is still an arrow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shmvec
from tests.helpers import ADAPTERS

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
    "shmvec.transports": ("shmvec.engine", "shmvec.vec_env", "shmvec.vector_env", "shmvec.vector.pool"),
    # device= converters: below the engine (which makes and closes them), above memory only.
    "shmvec.device": (
        "shmvec.codecs",
        "shmvec.engine",
        "shmvec.transports",
        "shmvec.worker",
        "shmvec.wire",
        "shmvec.vec_env",
        "shmvec.vector_env",
        "shmvec.vector.pool",
    ),
    "shmvec.engine": ("shmvec.vec_env", "shmvec.vector_env", "shmvec.vector.pool", "shmvec.bench"),
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
        "shmvec.vector.pool",
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


def _starts(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


# The floors, top first. A module imports its own wing (or file) and the floors below its own, never
# a floor above (an arrow pointing up) nor another wing of its own floor (sideways). A wing is a
# folder of shmvec/ (all its modules) or a file at the root. A new wing or root file gets a floor
# here; the package's own __init__ is the top: nothing inside shmvec imports it.
FLOORS: list[tuple[str, ...]] = [
    ("shmvec", "shmvec.__main__"),
    ("shmvec.cli",),
    ("shmvec.testing",),
    ("shmvec.bench", "shmvec.fidelity", "shmvec.recording"),  # tools: they use the faces
    ("shmvec.vector_make",),
    ("shmvec.tianshou", "shmvec.torchrl", "shmvec.rllib"),  # adapters for other RL libraries: faces
    ("shmvec.vec_env", "shmvec.vector_env"),  # the faces
    ("shmvec.recorder",),  # recording's wrappers and readers, over the engine (never the faces)
    ("shmvec.vector",),  # the Gymnasium face's mixins
    ("shmvec.engine",),
    ("shmvec.transports",),
    ("shmvec.worker",),
    ("shmvec.atari",),  # native step paths, run by the worker
    ("shmvec.native", "shmvec.device"),
    ("shmvec.memory", "shmvec.wire", "shmvec.codecs"),
    ("shmvec.errors", "shmvec.synthetic", "shmvec._version"),
]


def wing(module: str) -> str:
    """The folder of shmvec/ a module belongs to, or the root file it is (``shmvec`` for the package)."""
    return ".".join(module.split(".")[:2])


def wing_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between wings: an arrow from one wing to another for any import between them."""
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        out.setdefault(wing(module), set())
        for target in targets:
            out.setdefault(wing(target), set())
            if wing(target) != wing(module):
                out[wing(module)].add(wing(target))
    return out


def arrows_up(graph: dict[str, set[str]], floors: list[tuple[str, ...]]) -> list[str]:
    """The imports between wings that do not point down the floors (up, or sideways on one floor),
    and the wings with no floor."""
    floor_of = {w: i for i, names in enumerate(floors) for w in names}
    bad = [f"{w} has no floor in FLOORS" for w in sorted(wing_graph(graph)) if w not in floor_of]
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = wing(module), wing(target)
            if a != b and a in floor_of and b in floor_of and floor_of[b] <= floor_of[a]:
                bad.append(f"{module} -> {target} ({'sideways' if floor_of[a] == floor_of[b] else 'up'})")
    return bad


def test_no_circles_between_wings():
    # The file graph misses a loop that runs through different files of a wing: worker/step_paths.py
    # -> frame_stack.py (a root file then) -> worker/envapi.py was one.
    found = _cycle(wing_graph(GRAPH))
    assert found is None, f"import circle between wings: {' -> '.join(found or [])}"


def test_arrows_point_down_the_floors():
    bad = arrows_up(GRAPH, FLOORS)
    assert not bad, "imports that do not point down the floors: " + "; ".join(bad)


def test_the_checks_find_a_loop_through_a_root_file():
    # worker.step_paths -> frame_stack (a root file) -> worker.envapi: no circle between files ...
    graph = {
        "shmvec.worker.step_paths": {"shmvec.frame_stack"},
        "shmvec.frame_stack": {"shmvec.worker.envapi"},
        "shmvec.worker.envapi": set(),
    }
    assert _cycle(graph) is None
    # ... but one between the wing and the file, and an arrow up from the file to the worker's floor.
    assert _cycle(wing_graph(graph)) == ["shmvec.frame_stack", "shmvec.worker", "shmvec.frame_stack"]
    floors = [("shmvec.worker",), ("shmvec.frame_stack",)]
    assert arrows_up(graph, floors) == ["shmvec.frame_stack -> shmvec.worker.envapi (up)"]
    assert arrows_up(graph, [("shmvec.worker", "shmvec.frame_stack")]) == [
        "shmvec.frame_stack -> shmvec.worker.envapi (sideways)",
        "shmvec.worker.step_paths -> shmvec.frame_stack (sideways)",
    ]
    assert arrows_up(graph, [("shmvec.worker",)]) == ["shmvec.frame_stack has no floor in FLOORS"]


# What the root holds besides __init__, __main__ and _version: the faces, the public leaves (errors,
# the native-step protocol, synthetic envs) and the adapters for other libraries; a module that
# serves one wing lives in that wing.
ROOT_LIMIT = 13


def test_the_root_holds_few_modules():
    root = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__", "_version"))
    assert len(root) <= ROOT_LIMIT, f"{len(root)} modules at the root (at most {ROOT_LIMIT}): {root}"


# Adapters for other libraries (tests.helpers.ADAPTERS): faces over the engine or ShmVectorEnv that
# nothing else in shmvec imports (their library is an extra, and `import shmvec` stays free of it;
# tests/test_adapters.py checks that only each adapter imports its library).


def test_nothing_imports_an_adapter():
    bad = [f"{m} -> {t}" for m, targets in GRAPH.items() for t in targets if t in ADAPTERS and wing(m) != t]
    assert not bad, f"imports of an adapter: {bad}"
