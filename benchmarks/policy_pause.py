"""When pausing the policy's OpenMP threads (``pause_openmp``, see ``shmvec.openmp``) pays, and when not.

    flock /tmp/bench.lock python benchmarks/policy_pause.py --rounds 3 --markdown benchmarks/results/policy_pause.md

PPO ``CnnPolicy.predict`` on CPU then ``step``, 8 envs in 2 workers, for three ways of treating the
policy's idle OpenMP threads, interleaved over ``--rounds`` rounds:

- ``measured`` (the default): pause only while the workers need the cores;
- ``always``: pause before every step (the default before the measured rule);
- ``never``: ``pause_openmp=False``.

Two envs: ``waits``, the synthetic 84x84x4 env sleeping 2 ms per step (the workers leave the cores
idle), and ``busy``, the same env doing 1 ms of CPU work per step instead (they need both cores).
Prints the milliseconds per batch step (median over batches, then over rounds) and the policy's
forward pass alone.
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path
from typing import Any

import numpy as np

from shmvec import ShmVecEnv
from shmvec.openmp import PolicyThreads
from shmvec.synthetic import SyntheticImageEnv

ENVS = {
    "waits": functools.partial(SyntheticImageEnv, shape=(84, 84, 4), io_s=(0.002, 0.002)),
    "busy": functools.partial(SyntheticImageEnv, shape=(84, 84, 4), work_s=0.001),
}
MODES = ("measured", "always", "never")


def measure(env: str, mode: str, model: Any, batches: int) -> tuple[float, float]:
    """Median ms per batch step and per forward pass, over ``batches`` after a warm-up."""
    spare = PolicyThreads.SPARE
    if mode == "always":
        PolicyThreads.SPARE = float("inf")  # no number of busy cores is low enough to skip the pause
    venv = ShmVecEnv([ENVS[env]] * 8, n_workers=2, start_method="fork", pause_openmp=mode != "never")
    try:
        obs = venv.reset()
        steps, forwards = [], []
        for k in range(batches + 20):
            a = time.perf_counter()
            actions, _ = model.policy.predict(obs, deterministic=False)
            b = time.perf_counter()
            obs = venv.step(actions)[0]
            if k >= 20:
                steps.append(time.perf_counter() - a)
                forwards.append(b - a)
    finally:
        PolicyThreads.SPARE = spare
        venv.close()
    return float(np.median(steps)) * 1e3, float(np.median(forwards)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    args = parser.parse_args()
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    model = PPO("CnnPolicy", DummyVecEnv([ENVS["waits"]]), seed=0, device="cpu")
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for env in ENVS:
            for mode in MODES[r % 3 :] + MODES[: r % 3]:
                ms = measure(env, mode, model, args.batches)
                results.setdefault((env, mode), []).append(ms)
                print(f"round {r + 1} {env} {mode}: {ms[0]:.2f} ms per batch step, forward {ms[1]:.2f} ms")
    lines = [
        "| env | pause | ms per batch step | per round | forward ms | vs never |",
        "|---|---|---|---|---|---|",
    ]
    for env in ENVS:
        never = float(np.median([s for s, _ in results[(env, "never")]]))
        for mode in MODES:
            rounds = results[(env, mode)]
            step = float(np.median([s for s, _ in rounds]))
            forward = float(np.median([f for _, f in rounds]))
            each = ", ".join(f"{s:.1f}" for s, _ in rounds)
            lines.append(f"| {env} | {mode} | {step:.2f} | {each} | {forward:.2f} | {never / step:.2f}x |")
    lines.append("")
    lines.append(
        f"{args.rounds} interleaved rounds of {args.batches} batch steps, 8 envs in 2 workers, fork."
    )
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")


if __name__ == "__main__":
    main()
