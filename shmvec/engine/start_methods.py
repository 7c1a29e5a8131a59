"""Start methods: the default, checking a user's choice, and the missing ``__main__`` guard.

A module of its own that imports nothing of shmvec, so that the command line can check
``--start-method`` without loading the rest of the engine, and so that the engine and the benchmark
share one definition.
"""

from __future__ import annotations

import multiprocessing as mp
import sys

#: The order the default is chosen in: forkserver where the platform has it (as SB3's
#: SubprocVecEnv), else spawn. ``fork`` is never the default: it is unsafe with threads.
DEFAULT_ORDER = ("forkserver", "spawn")

MAIN_GUARD_LINE = (
    "shmvec: a worker process re-imported your main script, and that script creates a VecEnv at import "
    "time. Put the code that creates it under `if __name__ == \"__main__\":`, or pass start_method='fork'."
)


def available() -> list[str]:
    """The start methods this platform offers, e.g. ``['fork', 'spawn', 'forkserver']`` on Linux."""
    return list(mp.get_all_start_methods())


def default_start_method() -> str:
    """The start method used when none is given: ``"forkserver"`` where available, else ``"spawn"``."""
    offered = available()
    return next(m for m in DEFAULT_ORDER if m in offered)


def resolve_start_method(start_method: str | None) -> str:
    """Check a start method and fill in the default.

    :param start_method: ``"fork"``, ``"forkserver"``, ``"spawn"`` or None (the default,
        :func:`default_start_method`).
    :returns: the start method to use.
    :raises ValueError: naming the valid choices, for a method this platform does not offer
        (``multiprocessing`` itself only says "cannot find context for 'forkk'").
    """
    if start_method is None:
        return default_start_method()
    offered = available()
    if start_method not in offered:
        raise ValueError(
            f"start_method {start_method!r} is not one of {', '.join(repr(m) for m in offered)} "
            f"(default: {default_start_method()!r})"
        )
    return start_method


def exit_if_reimported_main() -> None:
    """In a worker that is re-importing the user's main script, stop it with one clear line.

    With ``spawn`` and ``forkserver`` a new worker runs the main script again before it starts; a
    script without the ``__main__`` guard then creates a VecEnv inside the worker, and Python's own
    refusal prints a 40-line traceback per worker before the main process can say what happened.
    Called first thing when a VecEnv is created, this prints :data:`MAIN_GUARD_LINE` instead and
    exits the worker with status 1; the main process then raises its own error with the same advice.
    Elsewhere it does nothing.
    """
    if getattr(mp.current_process(), "_inheriting", False):
        print(MAIN_GUARD_LINE, file=sys.stderr, flush=True)
        # SystemExit, not an exception: multiprocessing prints no traceback for it.
        raise SystemExit(1)
