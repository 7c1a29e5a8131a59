"""What every ``shmvec`` subcommand shares: bad input as :class:`UsageError`, one line on stderr."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class UsageError(ValueError):
    """Bad input (an option, an env name, an env that cannot be built): :func:`shmvec.cli.main.main` prints
    it as one line. Anything else is a bug, in shmvec or in an env, and keeps its traceback."""


def checked(check: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a check of the user's input; its ValueError or TypeError becomes a :class:`UsageError`
    (first line of the message only)."""
    try:
        return check(*args, **kwargs)
    except (ValueError, TypeError) as exc:
        text = str(exc).strip()
        raise UsageError(text.splitlines()[0] if text else type(exc).__name__) from exc
