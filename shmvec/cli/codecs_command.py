"""``shmvec codecs``: measure observation codecs on real frames, and with ``--model`` what they do to
a trained policy, open loop (action changes, value shift, KL on the same frames) and closed loop (the
policy acts on decoded observations; return difference over paired episodes, with a verdict)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from shmvec.cli.usage import UsageError
from shmvec.cli.usage import checked as _checked

DEFAULT_EPISODES = 20


def add_parser(sub: Any) -> None:
    """Add the ``codecs`` subcommand to ``sub`` (argparse's subparsers)."""
    codecs = sub.add_parser(
        "codecs",
        help="measure observation codecs on real frames: ratio, speed, exactness, error, policy effect",
        description="Measure codecs on frames of an env (random actions): ratio, speed, exactness, "
        "error. With --model: the policy's greedy action, value and KL on raw vs decoded frames (open "
        "loop), and --episodes paired episodes with the policy acting on decoded observations (closed "
        "loop): the return difference with its 95%% CI, and which codecs stay within the raw policy's "
        "own episode-to-episode spread.",
    )
    codecs.add_argument(
        "--env", default="ALE/Breakout-v5", help="gymnasium id or module:factory (default ALE/Breakout-v5)"
    )
    codecs.add_argument(
        "--steps", type=int, default=2000, help="frames to collect, random actions (default 2000)"
    )
    codecs.add_argument(
        "--seed", type=int, default=0, help="env and action seed; first episode's seed (default 0)"
    )
    codecs.add_argument(
        "--codec",
        action="append",
        help="codec to measure, repeatable: name or name:param=value[:...], e.g. jpeg:quality=30 "
        "(default: every available codec that takes the frames, JPEG at several qualities)",
    )
    codecs.add_argument("--model", help="saved SB3 model (zip): also report the policy-level effect")
    codecs.add_argument("--algo", default="ppo", help="algorithm of --model: ppo, a2c or dqn (default ppo)")
    codecs.add_argument(
        "--episodes",
        type=int,
        default=None,
        help=f"with --model: paired episodes per codec in the closed loop, >= 2 (default {DEFAULT_EPISODES})",
    )
    codecs.add_argument("--json", help="also write the reports to this JSON file")


def _check(args: argparse.Namespace) -> None:
    if args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    if args.algo not in ("ppo", "a2c", "dqn"):
        raise UsageError(f"--algo must be one of ppo, a2c, dqn, got {args.algo!r}")
    if args.episodes is not None and args.model is None:
        raise UsageError("--episodes needs --model: the closed loop runs a trained policy")
    if args.model is not None:
        if not os.path.isfile(args.model):
            raise UsageError(f"--model: no such file {args.model!r} (a zip saved by SB3's model.save)")
        args.episodes = DEFAULT_EPISODES if args.episodes is None else args.episodes
        if args.episodes < 2:
            raise UsageError(f"--episodes must be >= 2 (a spread needs two episodes), got {args.episodes}")


def _label(codec: str, params: dict[str, Any]) -> str:
    return codec + "".join(f" {k}={v}" for k, v in params.items())


def run(args: argparse.Namespace) -> int:
    """Run ``shmvec codecs``; bad input is a :class:`shmvec.cli.usage.UsageError`."""
    _check(args)
    from shmvec import codecs as codec_registry
    from shmvec import fidelity
    from shmvec.bench.envs import check_env_name, env_factory
    from shmvec.errors import install_hint

    _checked(check_env_name, args.env)
    env_fn = env_factory(args.env)
    frames = fidelity.collect_frames(env_fn, args.steps, args.seed)
    if args.codec:
        chosen = [_checked(codec_registry.parse, c) for c in args.codec]
    else:
        chosen = fidelity.candidate_codecs(frames.shape[1:], frames.dtype)
    model = None if args.model is None else _checked(fidelity.load_model, args.model, args.algo)
    loop = None
    if model is not None:  # first: a model for another env fails here, before the slow part
        loop = _checked(fidelity.closed_loop, model, env_fn, chosen, args.episodes, args.seed)
    print(
        f"{args.env}: {len(frames)} frames {frames.shape[1:]} {frames.dtype}, random actions, "
        f"seed {args.seed}"
    )
    missing = codec_registry.missing()
    if missing and not args.codec:
        print(
            f"not installed here: {', '.join(missing)}. {install_hint('codecs')} adds them "
            f"({', '.join(codec_registry.EXTRA_PACKAGES)})."
        )
    reports = fidelity.compare(chosen, frames, model)
    print(_frames_table(reports), end="")
    if loop is not None:
        print(_loop_table(loop), end="")
    if args.json:
        out: dict[str, Any] = {"env": args.env, "steps": len(frames), "seed": args.seed}
        out |= {"frame_shape": list(frames.shape[1:]), "reports": [r.to_dict() for r in reports]}
        if loop is not None:
            out |= {
                "model": args.model,
                "episodes": args.episodes,
                "closed_loop": [r.to_dict() for r in loop],
            }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {args.json}")
    return 0


def _frames_table(reports: list) -> str:
    policy = any(r.policy is not None for r in reports)
    head = f"{'codec':<42}{'ratio':>9}{'enc MB/s':>10}{'dec MB/s':>10}{'us/frame':>10}{'exact':>7}"
    head += f"{'max err':>9}{'PSNR dB':>9}" + (
        f"{'act chg':>9}{'max dV':>9}{'mean KL':>10}" if policy else ""
    )
    lines = [head]
    for r in reports:
        psnr = "inf" if r.psnr_db == float("inf") else f"{r.psnr_db:.1f}"
        line = f"{_label(r.codec, r.params):<42}{r.compression_ratio:>8,.1f}x{r.encode_mb_s:>10,.0f}"
        line += f"{r.decode_mb_s:>10,.0f}{r.us_per_frame:>10,.1f}{'yes' if r.bit_exact else 'no':>7}"
        line += f"{r.max_abs_error:>9g}{psnr:>9}"
        if r.policy is not None:
            dv = "-" if r.policy.max_value_change is None else f"{r.policy.max_value_change:.3g}"
            kl = "-" if r.policy.mean_kl is None else f"{r.policy.mean_kl:.3g}"
            line += f"{r.policy.action_change_rate:>8.1%}{dv:>9}{kl:>10}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _loop_table(loop: list) -> str:
    """The closed loop per codec, then the recommendation: which codecs stay within the spread."""
    import statistics

    raw = loop[0].raw_returns
    spread = loop[0].raw_spread
    lines = [
        "",
        f"closed loop: the model acts (greedy) on decoded observations, {len(raw)} episodes, seeds "
        f"{loop[0].seeds[0]}-{loop[0].seeds[-1]}, paired with the same episodes on raw ones; raw return "
        f"{statistics.fmean(raw):.3g}, episode-to-episode SD {spread:.3g}",
        f"{'codec':<42}{'return diff':>12}{'95% CI':>20}{'act chg':>9}{'open-loop chg':>15}  verdict",
    ]
    groups: dict[str, list[str]] = {"within": [], "outside": [], "unclear": []}
    for r in loop:
        mean, low, high = r.difference
        label = _label(r.codec, r.params)
        verdict = r.verdict()
        groups[verdict].append(f"{label} ({mean:+.3g}, CI {low:+.3g} to {high:+.3g})")
        open_chg = "-" if r.open_loop is None else f"{r.open_loop.action_change_rate:.1%}"
        ci = f"{low:+.3g} to {high:+.3g}"
        lines.append(
            f"{label:<42}{mean:>+12.3g}{ci:>20}{r.action_change_rate:>8.1%}{open_chg:>15}  {verdict}"
        )
    lines.append(
        f"recommendation (decided by the 95% CI of the mean return difference against +-{spread:.3g}, "
        "the raw policy's own SD):"
    )
    lines.append(
        "  within the spread, safe for this model and env: " + (", ".join(groups["within"]) or "none")
    )
    lines.append("  outside it, they change the return: " + (", ".join(groups["outside"]) or "none"))
    if groups["unclear"]:
        lines.append(
            "  unclear (the CI crosses the spread; more --episodes would tell): "
            + ", ".join(groups["unclear"])
        )
    return "\n".join(lines) + "\n"
