"""Running another project's own tests against shmvec (``gymnasium_suite.py``, ``sb3_suite.py``).

The checkout's test directory (``tests/``, Tianshou's ``test/``) is linked into a temporary directory
that becomes the working directory and goes on ``PYTHONPATH``: worker processes unpickle env
factories defined in the test modules, so they import ``tests.*`` (forkserver and spawn workers read
``PYTHONPATH``, not our ``sys.path``), and a directory holding only that link keeps the checkout's
own package from shadowing the installed one, which is what shmvec runs on.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest


class Outcomes:
    """Pytest plugin: the outcome of every test (its call phase, or the phase that failed first)."""

    def __init__(self) -> None:
        self.by_test: dict[str, str] = {}
        self.why: dict[str, str] = {}  # a failed or errored test's report, for known failures' checks

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            outcome = "failed" if report.when == "call" else "error"
            self.by_test.setdefault(report.nodeid, outcome)
            self.why.setdefault(report.nodeid, report.longreprtext)
        elif report.skipped or report.when == "call":
            self.by_test.setdefault(report.nodeid, report.outcome)


def run(
    src: Path,
    paths: Sequence[str],
    label: str,
    pytest_args: Sequence[str],
    out: Path | None,
    verdict: Callable[[Outcomes], int] | None = None,
) -> int:
    """Run ``paths`` (under the checkout ``src``'s test directories) with pytest and the checkout's
    configuration; print the failed and errored test ids and the counts under ``label``; write
    ``{test id: outcome}`` to ``out`` if given. Returns pytest's exit code, or with ``verdict``
    (:func:`check_known` or :func:`caught` bound to the known failures) what it makes of the
    outcomes."""
    root = Path(tempfile.mkdtemp(prefix="suite-tests-"))
    for top in sorted({Path(p).parts[0] for p in paths}):
        (root / top).symlink_to(src / top)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    outcomes = Outcomes()
    here = Path.cwd()
    os.chdir(root)
    try:
        code = pytest.main(
            [*paths, "--rootdir", str(root), "-c", str(src / "pyproject.toml"), "-p", "no:cacheprovider", "-q",
             "--timeout", "120", *pytest_args],
            plugins=[outcomes],
        )  # fmt: skip
    finally:
        os.chdir(here)
        shutil.rmtree(root)
    not_passed = {t: o for t, o in outcomes.by_test.items() if o in ("failed", "error")}
    for test, outcome in sorted(not_passed.items()):
        print(f"  {outcome}: {test}")
    counts = {o: list(outcomes.by_test.values()).count(o) for o in ("passed", "failed", "error", "skipped")}
    print(f"{label}: {counts}")
    if out:
        out.write_text(json.dumps(outcomes.by_test, indent=1, sort_keys=True))
    return int(code) if verdict is None else verdict(outcomes)


#: What :func:`mismatches` finds that a broken adapter causes (a test passing, or not running, does
#: not show that the suite caught anything).
FAILURES = ("failed, not known", "known failure failed otherwise")


def mismatches(outcomes: Outcomes, known: Mapping[str, str]) -> list[tuple[str, str]]:
    """How the outcomes differ from ``known`` (``{test id: text its failure report holds}``): one
    ``(kind, line)`` per test that failed without being known, known failure that passed, failed
    otherwise or did not run."""
    found = []
    for test, outcome in sorted(outcomes.by_test.items()):
        if outcome in ("failed", "error") and test not in known:
            found.append((FAILURES[0], f"  {outcome} and not a known failure: {test}"))
        elif test in known and outcome not in ("failed", "error"):
            found.append(("known failure passed", f"  known failure {outcome} (update the list): {test}"))
        elif test in known and known[test] not in outcomes.why[test]:
            found.append(
                (FAILURES[1], f"  known failure failed otherwise (its report lacks {known[test]!r}): {test}")
            )
    found += [
        ("did not run", f"  known failure did not run: {t}")
        for t in sorted(set(known) - set(outcomes.by_test))
    ]
    return found


def check_known(outcomes: Outcomes, known: Mapping[str, str]) -> int:
    """0 when exactly the ``known`` tests failed, each with its expected text in its report; else 1,
    after saying which test failed that should not have, failed otherwise, or passed."""
    found = mismatches(outcomes, known)
    print(
        "\n".join(line for _, line in found)
        or f"every failure is one of the {len(known)} known ones, for its known reason"
    )
    return int(bool(found))


def caught(outcomes: Outcomes, known: Mapping[str, str]) -> int:
    """The verdict of a run with a sabotaged adapter: 0 when the suite caught it (a test failed that
    is not a known failure, or a known one failed otherwise); else 1, also when tests only passed
    or did not run (a ``-k`` that left the catching tests out)."""
    found = mismatches(outcomes, known)
    print("\n".join(line for _, line in found))
    failures = [line for kind, line in found if kind in FAILURES]
    print(f"the sabotage was caught by {len(failures)} tests" if failures else "the sabotage was NOT caught")
    return int(not failures)


def main(
    argv: list[str] | None,
    doc: str,
    source: str,
    paths: Sequence[str],
    substitute: Callable[[], None],
    labels: tuple[str, str],
    known: Mapping[str, str] | None = None,
    sabotage: Callable[[], None] | None = None,
) -> int:
    """A suite script's command line: ``SRC [--unmodified | --sabotaged] [--json FILE] [pytest args]``.

    :param doc: the script's docstring (its help).
    :param source: what SRC is, for the help and the error when ``paths`` are missing there.
    :param paths: the tests to run, relative to SRC.
    :param substitute: puts shmvec in the peer's place (skipped with ``--unmodified``).
    :param labels: the summary's label unmodified, and with shmvec.
    :param known: with shmvec, the tests that fail and a text each one's report holds
        (:func:`check_known`); ``None``: pytest's exit code decides.
    :param sabotage: puts a broken shmvec adapter (rewards changed) in the peer's place, for
        ``--sabotaged``: the negative control, which exits 0 only when a test fails beyond
        ``known`` or a known one fails otherwise (:func:`caught`). None: no such option.
    """
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path, help=source)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--unmodified", action="store_true", help=f"run with {labels[0]} itself")
    if sabotage is not None:
        which.add_argument(
            "--sabotaged",
            action="store_true",
            help="run with an adapter whose rewards are changed: it must fail",
        )
    parser.add_argument("--json", type=Path, help="write {test id: outcome} here")
    args, pytest_args = parser.parse_known_args(argv)
    src = args.src.resolve()
    missing = [p for p in paths if not (src / p).exists()]
    if missing:
        parser.error(f"{src} lacks {', '.join(missing)}: pass the root of {source}")
    sabotaged = getattr(args, "sabotaged", False)
    if sabotaged:
        assert sabotage is not None
        sabotage()
    elif not args.unmodified:
        substitute()
    label = labels[0] if args.unmodified else labels[1] + (", sabotaged" if sabotaged else "")
    out = args.json.resolve() if args.json else None
    verdict = None
    if sabotaged:
        verdict = functools.partial(caught, known=known or {})
    elif known is not None and not args.unmodified:
        verdict = functools.partial(check_known, known=known)
    return run(src, paths, label, pytest_args, out, verdict)
