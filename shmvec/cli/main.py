"""The ``shmvec`` command's parser and entry point, and ``shmvec bench``; ``shmvec codecs`` is
:mod:`shmvec.cli.codecs_command`. Parsing and printing only."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from shmvec.cli.usage import UsageError
from shmvec.cli.usage import checked as _checked


def _parser() -> argparse.ArgumentParser:
    from shmvec._version import __version__
    from shmvec.bench.backends import describe_backends
    from shmvec.engine.start_methods import available, default_start_method

    parser = argparse.ArgumentParser(
        prog="shmvec", description="Shared-memory VecEnv for Stable-Baselines3: tools."
    )
    parser.add_argument("--version", action="version", version=f"shmvec {__version__}")
    sub = parser.add_subparsers(dest="command")
    bench = sub.add_parser(
        "bench",
        help="measure which VecEnv configuration is fastest on an env (default: SB3's Atari recipe on Pong)",
        description="Measure VecEnv backends on an env: steps/s with 95% CIs, where a step's time goes, "
        "CPU, memory, start-up; then recommend a configuration. With no options: SB3's Atari recipe on "
        "Pong (make_atari_env, 4 frames stacked), 8 envs, ShmVecEnv (frame_stack=4) against ale-py's "
        "C++ AtariVectorEnv, SubprocVecEnv and DummyVecEnv (and EnvPool where installed), 3 interleaved "
        "rounds of 2 s (about 1 minute on 2 quiet cores). --env ALE/Pong-v5: raw frames, dummy vs "
        "subproc vs shm, n_envs 1,2,4,8. With --train: train the same policy on each backend and "
        "compare wall-clock time, returns and learning curves.",
        epilog="backends (--backends):\n" + describe_backends() + "\nexamples:\n"
        "  shmvec bench --env ALE/Pong-v5                    # raw frames, no recipe\n"
        "  shmvec bench --backends shm,shm-pin --policy ppo:CnnPolicy\n"
        "  shmvec bench --env PongNoFrameskip-v4 --recipe sb3-atari --n-envs 8 \\\n"
        "               --backends ale-vec,envpool,shm,dummy,subproc\n"
        "  shmvec bench --env mypkg.envs:make_env --n-envs 8 --json out.json --plot out.png\n"
        "  shmvec bench --train --env mypkg.envs:make_env --train-steps 50000 --threshold 0.9 "
        "--plot curves.png\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument(
        "--env",
        default=None,
        help="gymnasium id or module:factory (default: PongNoFrameskip-v4 through --recipe sb3-atari; "
        "an --env of your own is measured as it is, without a recipe)",
    )
    bench.add_argument(
        "--recipe",
        default=None,
        help="sb3-atari (the default without --env): every backend builds SB3's Atari recipe over the "
        "NoFrameskip-v4 --env (make_atari_env, 4 frames stacked: VecFrameStack, or ShmVecEnv's "
        "frame_stack=4); ale-vec and envpool with SB3-like settings (not bit-identical); adds steps/s "
        "and CPU per env step side by side, against the first of --backends; with --train, PPO takes "
        "rl-zoo3's Atari hyperparameters. none: --env as it is",
    )
    bench.add_argument(
        "--env-kwargs",
        default="{}",
        help="JSON object of keyword arguments for the env or factory, e.g. "
        '\'{"shape": [512, 512, 3], "work_s": 0.001}\'',
    )
    bench.add_argument(
        "--backends",
        default=None,
        help="comma-separated backend names, listed below (default: with a recipe "
        f"{','.join(RECIPE_BACKENDS)} and envpool where installed; else {','.join(PLAIN_BACKENDS)})",
    )
    bench.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="for shm-pool: envs per batch step (default: half of each n_envs, rounded up); use it with "
        "--policy to measure the overlap of the policy and the envs",
    )
    bench.add_argument(
        "--n-envs", default=None, help="comma-separated env counts (default: 8 with a recipe, else 1,2,4,8)"
    )
    bench.add_argument(
        "--n-workers",
        default=None,
        help="comma-separated worker counts for shm (default: min(n_envs, CPUs)); counts > n_envs skipped",
    )
    bench.add_argument(
        "--policy",
        default="none",
        help="none (random actions) or ALGO:POLICY, e.g. ppo:CnnPolicy, so inference is in the loop",
    )
    bench.add_argument(
        "--repeats", type=int, default=3, help="windows per configuration, interleaved (default 3)"
    )
    bench.add_argument("--seconds", type=float, default=2.0, help="seconds per window (default 2)")
    bench.add_argument(
        "--budget",
        type=float,
        default=None,
        help="total seconds of measuring windows; overrides --seconds (start-up and warm-up come on top)",
    )
    bench.add_argument(
        "--start-method",
        default=None,
        help=f"for the process backends, one of {', '.join(available())} (default {default_start_method()}, "
        "as ShmVecEnv's and SubprocVecEnv's own default, so start-up figures are those of the default; "
        "fork starts fastest)",
    )
    bench.add_argument("--json", type=Path, default=None, help="write every raw figure to this JSON file")
    bench.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="write a PNG: steps/s against n_envs; with --train, mean return against wall-clock time and "
        "against env steps (the learning curves, over the seeds)",
    )
    bench.add_argument(
        "--from-json", type=Path, default=None, help="measure nothing: report from a JSON written by --json"
    )
    bench.add_argument(
        "--readme",
        type=Path,
        default=None,
        help="replace the results block of this Markdown file (e.g. docs/benchmarks.md) with the report",
    )
    bench.add_argument(
        "--train",
        action="store_true",
        help="train --policy (default ppo:CnnPolicy) with each backend instead; compare time (rollouts "
        "and updates apart, per 1,000 env steps), return and learned parameters",
    )
    bench.add_argument(
        "--train-steps", type=int, default=2048, help="env steps per training run (default 2048)"
    )
    bench.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds (default 0,1,2)")
    bench.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="with --train: a return; say when each backend's seeds reached it (mean of the last 50 "
        "episodes)",
    )
    from shmvec.cli.codecs_command import add_parser as add_codecs_parser

    add_codecs_parser(sub)
    from shmvec.cli.native_command import add_parser as add_native_parser

    add_native_parser(sub)
    return parser


def _json_object(text: str, what: str) -> dict:
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{what} must be a JSON object, got {text!r}")
    return value


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{what} must be comma-separated integers, got {text!r}") from None


def _progress_bar(done: int, total: int, message: str) -> None:
    width = 24
    filled = width * done // total
    line = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {message}"
    if sys.stderr.isatty():
        end = "\n" if done == total else ""
        print(f"\r\033[K{line}", end=end, file=sys.stderr, flush=True)
    else:
        print(line, file=sys.stderr, flush=True)


#: What ``shmvec bench`` compares on a recipe, and on an env as it is, unless ``--backends`` says.
RECIPE_BACKENDS = ("shm", "ale-vec", "subproc", "dummy")
PLAIN_BACKENDS = ("dummy", "subproc", "shm")


def resolve_defaults(args: argparse.Namespace) -> None:
    """The defaults that depend on each other: no ``--env`` means SB3's Atari recipe on
    :data:`~shmvec.bench.recipes.DEFAULT_ENV` (the README's headline); an ``--env`` of the user's is
    measured as it is unless ``--recipe`` says (``--recipe none``: as it is in any case)."""
    from shmvec.bench.recipes import DEFAULT_ENV

    if args.recipe == "none":
        args.recipe = None
    elif args.recipe is None and args.env is None and not args.train:
        args.recipe = "sb3-atari"
    args.env = args.env or (DEFAULT_ENV if args.recipe else "ALE/Pong-v5")
    if args.backends is None:
        backends: tuple[str, ...] = PLAIN_BACKENDS
        if args.recipe is not None and not args.train:  # --train: SB3 cannot train on ale-vec, envpool
            backends = RECIPE_BACKENDS + (("envpool",) if importlib.util.find_spec("envpool") else ())
        args.backends = ",".join(backends)
    if args.n_envs is None:
        args.n_envs = "8" if args.recipe is not None else "1,2,4,8"


def _check_bench_args(args: argparse.Namespace) -> None:
    """Every check that needs no measuring library, so that a typo fails in well under a second
    instead of after importing SB3 and torch (seconds).

    :raises UsageError: naming the option and what it accepts.
    """
    from shmvec.bench.backends import backend_names, check_backend
    from shmvec.bench.policy import parse_policy
    from shmvec.bench.recipes import check_recipe
    from shmvec.engine.start_methods import resolve_start_method

    resolve_defaults(args)
    if args.recipe is not None:
        _checked(check_recipe, args.recipe, args.env, _json_object(args.env_kwargs, "--env-kwargs"))
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends:
        raise UsageError(f"--backends is empty; choose from {', '.join(backend_names())}")
    for b in backends:
        _checked(check_backend, b, args.recipe)
    n_envs = _ints(args.n_envs, "--n-envs")
    if not n_envs or min(n_envs) < 1:
        raise UsageError(f"--n-envs must be integers >= 1, got {args.n_envs!r}")
    if args.n_workers is not None:
        workers = _ints(args.n_workers, "--n-workers")
        if not workers or min(workers) < 1:
            raise UsageError(f"--n-workers must be integers >= 1, got {args.n_workers!r}")
    if args.repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {args.repeats}")
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    if not args.seconds > 0:
        raise UsageError(f"--seconds must be > 0, got {args.seconds}")
    if args.budget is not None and not args.budget > 0:
        raise UsageError(f"--budget must be > 0 seconds, got {args.budget}")
    if args.train_steps < 1:
        raise UsageError(f"--train-steps must be >= 1, got {args.train_steps}")
    _ints(args.seeds, "--seeds")
    _json_object(args.env_kwargs, "--env-kwargs")
    if args.policy != "none":
        _checked(parse_policy, args.policy)
    try:
        args.start_method = resolve_start_method(args.start_method)
    except ValueError as exc:
        raise UsageError(f"--start-method: {exc}") from None
    if args.readme is not None and (args.from_json or args.json) is None:
        raise UsageError("--readme needs --json or --from-json: the file's name names the README block")


def _bench(args: argparse.Namespace) -> int:
    """Run ``shmvec bench``: bad input is a :class:`UsageError` (one line); anything else is a bug in
    shmvec or in the env and keeps its traceback."""
    _check_bench_args(args)
    return _bench_unchecked(args)


def _bench_unchecked(args: argparse.Namespace) -> int:
    from shmvec.bench import report
    from shmvec.bench.envs import check_env_name
    from shmvec.bench.runner import BenchSpec, run

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    n_envs = _ints(args.n_envs, "--n-envs")
    args.env_kwargs = _json_object(args.env_kwargs, "--env-kwargs")
    if args.train:
        return _train(args, backends, n_envs)
    source = args.from_json or args.json
    if args.from_json is not None:
        result = _checked(report.read_json, args.from_json)
    else:
        spec = BenchSpec(
            env=args.env,
            env_kwargs=args.env_kwargs,
            backends=backends,
            n_envs=n_envs,
            n_workers=None if args.n_workers is None else _ints(args.n_workers, "--n-workers"),
            policy=args.policy,
            repeats=args.repeats,
            seconds=args.seconds,
            start_method=args.start_method,
            batch_size=args.batch_size,
            recipe=args.recipe,
        )
        _checked(spec.validate)
        _checked(check_env_name, spec.env, **spec.env_kwargs)
        if args.budget is not None:
            # One window per configuration per round, plus the env alone once per round.
            spec.seconds = args.budget / ((len(spec.configs()) + 1) * spec.repeats)
        result = run(spec, progress=_progress_bar)
    print(report.table(result), end="")
    if args.json is not None and args.from_json is None:
        report.write_json(result, args.json)
        print(f"raw figures: {args.json}")
    if args.plot is not None:
        report.plot(result, args.plot)
        print(f"plot: {args.plot}")
    if args.readme is not None:
        plot = None if args.plot is None else os.path.relpath(args.plot, args.readme.resolve().parent)
        assert source is not None  # checked by _check_bench_args
        report.update_readme(args.readme, source.stem, report.markdown(result, plot))
        print(f"results block updated: {args.readme}")
    return 0


def _train(args: argparse.Namespace, backends: list[str], n_envs: list[int]) -> int:
    import json
    import shlex

    from shmvec.bench import report, train_report
    from shmvec.bench.train import TrainResult, check_train_args, train

    if args.from_json is not None:
        try:
            result = TrainResult.from_dict(json.loads(args.from_json.read_text()))
        except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise UsageError(f"cannot read training results from {args.from_json}: {exc}") from None
    else:
        if not n_envs or min(n_envs) < 1:
            raise UsageError(f"--n-envs must be >= 1, got {args.n_envs}")
        seeds = _ints(args.seeds, "--seeds")
        policy = "ppo:CnnPolicy" if args.policy == "none" else args.policy
        _checked(
            check_train_args,
            args.env,
            backends,
            policy,
            max(n_envs),
            args.train_steps,
            seeds,
            args.env_kwargs,
            args.recipe,
        )
        result = train(
            args.env,
            backends,
            policy=policy,
            n_envs=max(n_envs),
            total_steps=args.train_steps,
            seeds=seeds,
            start_method=args.start_method,
            env_kwargs=args.env_kwargs,
            progress=lambda m: print("  " + m, file=sys.stderr, flush=True),
            threshold=args.threshold,
            recipe=args.recipe,
        )
        result.command = shlex.join(["shmvec", *args.argv])
    print(train_report.table(result), end="")
    if args.json is not None and args.from_json is None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.to_dict(), indent=1) + "\n")
        print(f"raw figures: {args.json}")
    if args.readme is not None:
        source = args.from_json or args.json
        report.update_readme(args.readme, source.stem, train_report.markdown(result))
        print(f"results block updated: {args.readme}")
    if args.plot is not None:
        result.plot(args.plot)
        print(f"learning curves: {args.plot}")
    return 1 if result.problems() else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status. Bad input (:class:`UsageError`) is one line on stderr
    and status 2; any other exception is a bug and propagates with its traceback."""
    args = _parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command, for the results it writes
    if args.command is None:
        _parser().print_help()
        return 0
    try:
        if args.command == "codecs":
            from shmvec.cli.codecs_command import run as codecs

            return codecs(args)
        if args.command == "native":
            from shmvec.cli.native_command import run as native

            return native(args)
        return _bench(args)
    except UsageError as exc:
        print(f"shmvec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"shmvec {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
