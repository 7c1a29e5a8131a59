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
    codecs = sub.add_parser(
        "codecs",
        help="measure observation codecs on real frames: ratio, speed, exactness, error, policy effect",
    )
    codecs.add_argument(
        "--env", default="ALE/Breakout-v5", help="gymnasium id or module:factory (default ALE/Breakout-v5)"
    )
    codecs.add_argument(
        "--steps", type=int, default=2000, help="frames to collect, random actions (default 2000)"
    )
    codecs.add_argument("--seed", type=int, default=0, help="env and action seed (default 0)")
    codecs.add_argument(
        "--codec",
        action="append",
        help="codec to measure, repeatable: name or name:param=value[:...], e.g. jpeg:quality=30 "
        "(default: every available codec that takes the frames, JPEG at several qualities)",
    )
    codecs.add_argument("--model", help="saved SB3 model (zip): also report the policy-level effect")
    codecs.add_argument("--algo", default="ppo", help="algorithm of --model: ppo, a2c or dqn (default ppo)")
    codecs.add_argument("--json", help="also write the reports to this JSON file")
    return parser


def _codecs(args: argparse.Namespace) -> int:
    import json

    from shmvec import codecs as codec_registry
    from shmvec import fidelity
    from shmvec.bench.envs import check_env_name, env_factory

    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    check_env_name(args.env)
    frames = fidelity.collect_frames(env_factory(args.env), args.steps, args.seed)
    if args.codec:
        chosen = [codec_registry.parse(c) for c in args.codec]
    else:
        chosen = fidelity.default_codecs(frames.shape[1:], frames.dtype)
    model = None if args.model is None else fidelity.load_model(args.model, args.algo)
    shape = f"{frames.shape[1:]} {frames.dtype}"
    print(f"{args.env}: {len(frames)} frames {shape}, random actions, seed {args.seed}")
    reports = fidelity.compare(chosen, frames, model)
    header = f"{'codec':<42}{'ratio':>9}{'enc MB/s':>10}{'dec MB/s':>10}{'us/frame':>10}{'exact':>7}"
    header += f"{'max err':>9}{'PSNR dB':>9}"
    if model is not None:
        header += f"{'act chg':>9}{'max dV':>9}{'mean KL':>10}"
    print(header)
    for r in reports:
        label = r.codec + "".join(f" {k}={v}" for k, v in r.params.items())
        psnr = "inf" if r.psnr_db == float("inf") else f"{r.psnr_db:.1f}"
        line = f"{label:<42}{r.compression_ratio:>8,.1f}x{r.encode_mb_s:>10,.0f}{r.decode_mb_s:>10,.0f}"
        line += f"{r.us_per_frame:>10,.1f}{'yes' if r.bit_exact else 'no':>7}{r.max_abs_error:>9g}{psnr:>9}"
        if r.policy is not None:
            dv = "-" if r.policy.max_value_change is None else f"{r.policy.max_value_change:.3g}"
            kl = "-" if r.policy.mean_kl is None else f"{r.policy.mean_kl:.3g}"
            line += f"{r.policy.action_change_rate:>8.1%}{dv:>9}{kl:>10}"
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "env": args.env,
                    "steps": len(frames),
                    "seed": args.seed,
                    "frame_shape": list(frames.shape[1:]),
                    "reports": [r.to_dict() for r in reports],
                },
                f,
                indent=2,
            )
        print(f"wrote {args.json}")
    return 0


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
        return {"bench": _bench, "codecs": _codecs}[args.command](args)
    except (ValueError, TypeError) as exc:
        print(f"shmvec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"shmvec {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
