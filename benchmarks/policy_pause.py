"""When pausing the policy's OpenMP threads (``pause_openmp``, see ``shmvec.engine.openmp``) pays, and when not.

    flock /tmp/bench.lock python benchmarks/policy_pause.py --rounds 5 --loops step,pool,pool-full \
        --markdown benchmarks/results/policy_pause.md

PPO ``CnnPolicy.predict`` on CPU then a step of the envs in 2 workers, for three ways of treating
the policy's idle OpenMP threads, interleaved over ``--rounds`` rounds:

- ``measured`` (the default): pause only while the workers need the cores;
- ``always``: pause before every step or send (the default before the measured rule; pool mode's
  until it learnt which sends overlap the policy);
- ``never``: ``pause_openmp=False``.

Two envs: ``waits``, the synthetic 84x84x4 env sleeping 2 ms per step (the workers leave the cores
idle), and ``busy``, the same env doing 1 ms of CPU work per step instead (they need both cores).
Three loops (``--loops``): ``step``, ``ShmVecEnv`` with 8 envs and ``step``; ``pool``,
``ShmVectorEnv(batch_size=8)`` with 16 envs and ``send``/``recv`` (the workers step one batch while
the policy acts on the other); ``pool-full``, the same with 8 envs (a batch is every env, so the
workers wait while the policy runs). Prints the milliseconds per batch step (median over batches,
then over rounds) and the policy's forward pass alone.
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path
from typing import Any

import numpy as np

from shmvec import ShmVecEnv, ShmVectorEnv
from shmvec.engine.openmp import PolicyThreads
from shmvec.synthetic import SyntheticImageEnv

ENVS = {
    "waits": functools.partial(SyntheticImageEnv, shape=(84, 84, 4), io_s=(0.002, 0.002)),
    "busy": functools.partial(SyntheticImageEnv, shape=(84, 84, 4), work_s=0.001),
}
MODES = ("measured", "always", "never")
LOOPS = ("step", "pool", "pool-full")


def measure(loop: str, env: str, mode: str, model: Any, batches: int) -> tuple[float, float]:
    """Median ms per batch step and per forward pass, over ``batches`` after a warm-up."""
    pausing = PolicyThreads.pausing
    if mode == "always":
        PolicyThreads.pausing = property(lambda self: True)  # type: ignore[method-assign,assignment]
    pause = mode != "never"
    venv: Any
    if loop == "step":
        venv = ShmVecEnv([ENVS[env]] * 8, n_workers=2, start_method="fork", pause_openmp=pause)
        obs = venv.reset()
    else:
        n = 16 if loop == "pool" else 8
        venv = ShmVectorEnv(
            [ENVS[env]] * n, n_workers=2, batch_size=8, start_method="fork", pause_openmp=pause
        )
        venv.async_reset(seed=0)
        obs = venv.recv()[0]
    try:
        steps, forwards = [], []
        for k in range(batches + 20):
            a = time.perf_counter()
            actions, _ = model.policy.predict(obs, deterministic=False)
            b = time.perf_counter()
            if loop == "step":
                obs = venv.step(actions)[0]
            else:
                venv.send(actions)
                obs = venv.recv()[0]
            if k >= 20:
                steps.append(time.perf_counter() - a)
                forwards.append(b - a)
    finally:
        PolicyThreads.pausing = pausing  # type: ignore[method-assign]
        venv.close()
    return float(np.median(steps)) * 1e3, float(np.median(forwards)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument(
        "--loops", default="step", help=f"comma-separated, of {','.join(LOOPS)} (default step)"
    )
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    args = parser.parse_args()
    from shmvec.bench import host

    wake_up_us = host.wake_up_us()  # the host's, printed beside the ratios
    print(host.describe(wake_up_us) + ".", flush=True)
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    model = PPO("CnnPolicy", DummyVecEnv([ENVS["waits"]]), seed=0, device="cpu")
    loops = args.loops.split(",")
    if not set(loops) <= set(LOOPS):
        parser.error(f"--loops: each of {', '.join(LOOPS)}, got {args.loops!r}")
    results: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for loop in loops:
            for env in ENVS:
                for mode in MODES[r % 3 :] + MODES[: r % 3]:
                    ms = measure(loop, env, mode, model, args.batches)
                    results.setdefault((loop, env, mode), []).append(ms)
                    print(
                        f"round {r + 1} {loop} {env} {mode}: {ms[0]:.2f} ms per batch step, forward {ms[1]:.2f} ms"
                    )
    lines = [
        "| loop | env | pause | ms per batch step | per round | forward ms | vs never |",
        "|---|---|---|---|---|---|---|",
    ]
    for loop in loops:
        for env in ENVS:
            never = float(np.median([s for s, _ in results[(loop, env, "never")]]))
            for mode in MODES:
                rounds = results[(loop, env, mode)]
                step = float(np.median([s for s, _ in rounds]))
                forward = float(np.median([f for _, f in rounds]))
                each = ", ".join(f"{s:.1f}" for s, _ in rounds)
                lines.append(
                    f"| {loop} | {env} | {mode} | {step:.2f} | {each} | {forward:.2f} | {never / step:.2f}x |"
                )
    lines.append("")
    lines.append(
        f"{args.rounds} interleaved rounds of {args.batches} batch steps in 2 workers, fork; loops "
        f"{', '.join(loops)} (step: 8 envs; pool: 16 envs, batches of 8; pool-full: 8 envs, batches of 8). "
        f"{host.describe(wake_up_us)}."
    )
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")


if __name__ == "__main__":
    main()
