"""``shmvec native``: which step path shmvec's workers take for an env, and why, without writing code.

It builds one env as a one-worker :class:`~shmvec.ShmVecEnv` would (the path is found in the worker,
where training finds it) and prints its :class:`~shmvec.native.NativeStatus`, every mismatching
method with the installed version (:class:`~shmvec.errors.NativeStepWarning`'s text), and the
versions of the packages the native paths restate."""

from __future__ import annotations

import argparse
import warnings
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from shmvec.cli.usage import UsageError
from shmvec.cli.usage import checked as _checked

_PACKAGES = ("stable-baselines3", "gymnasium", "ale-py")


def add_parser(sub: Any) -> None:
    """Add the ``native`` subcommand to ``sub`` (argparse's subparsers)."""
    native = sub.add_parser(
        "native",
        help="say which step path shmvec's workers take for an env (native or through its wrappers), and why",
        description="Build one env in a worker, as ShmVecEnv does, and print its native step path or "
        "the reason it steps through its Python wrappers (every method whose code differs from the "
        "releases the native step was checked against, with the installed version, and the pip "
        "command that gets the fast path). With no options: SB3's Atari recipe on PongNoFrameskip-v4 "
        "with 4 frames stacked, the workload of `shmvec bench`. Exit status 0 when the env steps "
        "natively, 1 when it does not.",
    )
    native.add_argument(
        "--env",
        default=None,
        help="gymnasium id or module:factory (default: PongNoFrameskip-v4 through --recipe sb3-atari; "
        "an --env of your own is built as it is, without a recipe)",
    )
    native.add_argument(
        "--recipe",
        default=None,
        help="sb3-atari (the default without --env): SB3's make_atari_env over the NoFrameskip-v4 "
        "--env, frame_stack=4 in the worker; none: --env as it is",
    )
    native.add_argument(
        "--frame-stack",
        type=int,
        default=None,
        help="frames ShmVecEnv stacks in the worker (default: 4 with a recipe, else none)",
    )
    native.add_argument(
        "--start-method",
        default=None,
        help="fork, spawn or forkserver (default: ShmVecEnv's, forkserver where the platform has it)",
    )


def run(args: argparse.Namespace) -> int:
    """Print the env's step path; 0 if it steps natively, 1 if not (bad input: :class:`UsageError`)."""
    from shmvec.bench.envs import check_env_name
    from shmvec.bench.recipes import DEFAULT_ENV, recipe_env

    recipe = args.recipe
    if recipe == "none":
        recipe = None
    elif recipe is None and args.env is None:
        recipe = "sb3-atari"
    env = args.env or DEFAULT_ENV
    if args.frame_stack is not None and args.frame_stack < 1:
        raise UsageError(f"--frame-stack must be >= 1, got {args.frame_stack}")
    factory, stacked = _checked(recipe_env, recipe, env)
    if recipe is None:
        _checked(check_env_name, env)
    frame_stack = args.frame_stack if args.frame_stack is not None else stacked

    from shmvec.errors import NativeStepWarning
    from shmvec.native import summary
    from shmvec.vec_env import ShmVecEnv

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NativeStepWarning)
        with ShmVecEnv([factory], args.start_method, n_workers=1, frame_stack=frame_stack) as vec_env:
            statuses = vec_env.native_steps
    built = f"{env} through {recipe}" if recipe else env
    print(f"{built}{f', frame_stack={frame_stack}' if frame_stack else ''}:")
    print(f"  {summary(statuses)}")
    for warning in caught:
        if issubclass(warning.category, NativeStepWarning):
            print(f"  {warning.message}")
    print("  installed: " + ", ".join(f"{name} {_version(name)}" for name in _PACKAGES))
    return 0 if all(status.path is not None for status in statuses) else 1


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"
