"""Command-line interface: ``shmvec bench`` (and ``python -m shmvec``). Parsing and printing only."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shmvec", description="Shared-memory VecEnv for Stable-Baselines3: tools."
    )
    sub = parser.add_subparsers(dest="command")
    bench = sub.add_parser(
        "bench",
        help="compare ShmVecEnv with SubprocVecEnv and DummyVecEnv on an env (default: ALE Pong raw frames)",
    )
    bench.add_argument(
        "--env", default="ALE/Pong-v5", help="gymnasium id or module:factory (default ALE/Pong-v5)"
    )
    bench.add_argument("--n-envs", type=int, default=8, help="number of envs (default 8)")
    bench.add_argument(
        "--repeats", type=int, default=3, help="measurements per backend, interleaved (default 3)"
    )
    bench.add_argument("--seconds", type=float, default=5.0, help="seconds per measurement (default 5)")
    bench.add_argument(
        "--backends", default="dummy,subproc,shm", help="comma-separated: dummy, subproc, shm (default all)"
    )
    return parser


def _bench(args: argparse.Namespace) -> int:
    from shmvec.bench.envs import check_env_name, env_factory
    from shmvec.bench.runner import BACKENDS, compare, ratio_spread

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise ValueError(f"unknown backend {unknown[0]!r}; choose from {', '.join(BACKENDS)}")
    if args.n_envs < 1:
        raise ValueError(f"--n-envs must be >= 1, got {args.n_envs}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    check_env_name(args.env)
    fns = [env_factory(args.env)] * args.n_envs
    print(f"{args.env}, n_envs={args.n_envs}, {args.repeats} x {args.seconds:g} s per backend, interleaved")
    results = compare(
        fns, backends, args.repeats, args.seconds, progress=lambda m: print("  " + m, flush=True)
    )
    print(f"\n{'backend':<10}{'median steps/s':>16}{'min':>10}{'max':>10}")
    for r in results.values():
        print(f"{r.backend:<10}{r.median:>16,.0f}{min(r.samples):>10,.0f}{max(r.samples):>10,.0f}")
    if "shm" in results:
        for other in results:
            if other != "shm":
                med, lo, hi = ratio_spread(results["shm"], results[other])
                print(f"shm / {other}: {med:.2f}x (per-repeat ratios {lo:.2f}-{hi:.2f})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status. Bad input is one line on stderr and status 2."""
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 0
    try:
        return _bench(args)
    except (ValueError, TypeError) as exc:
        print(f"shmvec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"shmvec {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
