"""The Ray backend on a local two-node Ray cluster (every process on 127.0.0.1), against the local
backend and a naive Ray VecEnv (one actor per env, raw observations through ``ray.get``).

1. Bytes per env step on the Ray wire, by codec (raw, lz4, zstd, delta = the default), on raw Atari
   frames (210x160x3, random actions): what :func:`shmvec.transports.ray_wire.unpack` counted.
2. Steps/s, Pong raw, n envs in 2 actors (SPREAD: one per node) vs the local backend (2 worker
   processes) vs the naive VecEnv, interleaved rounds, and start-up time after ``ray.init``.

    flock /tmp/bench.lock python benchmarks/ray_backend.py --rounds 3 --steps 200

Prints a Markdown table and writes JSON to ``--out`` (default: benchmarks/results/ray_backend.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.ray_helpers import loopback_environ, start_cluster  # noqa: E402

loopback_environ()  # before Ray is imported

from shmvec.bench.envs import env_factory  # noqa: E402


def wire_bytes(game: str, codec: str | None, n_envs: int, steps: int) -> float:
    """Mean bytes per env step landed from the actors (after reset), with ``codec``."""
    from shmvec import ShmVecEnv

    venv = ShmVecEnv([env_factory(game)] * n_envs, n_workers=2, backend="ray", codec=codec)
    try:
        venv.seed(0)
        venv.reset()
        pool = venv._eng.transport
        before = pool.bytes_received
        rng = np.random.default_rng(0)
        for _ in range(steps):
            venv.step(rng.integers(venv.action_space.n, size=n_envs))
        return (pool.bytes_received - before) / (steps * n_envs)
    finally:
        venv.close()


def throughput(kind: str, n_envs: int, steps: int) -> tuple[float, float]:
    """(start-up seconds, env steps/s over ``steps`` batch steps after 20 warm-up steps)."""
    from shmvec import ShmVecEnv
    from shmvec.bench.naive_ray import NaiveRayVecEnv

    fns = [env_factory("ALE/Pong-v5")] * n_envs
    t0 = time.perf_counter()
    if kind == "local":
        venv = ShmVecEnv(fns, n_workers=2)
    elif kind == "naive":
        venv = NaiveRayVecEnv(fns)
    else:
        codec = None if kind == "ray" else kind.split("-", 1)[1]
        venv = ShmVecEnv(
            fns, n_workers=2, backend="ray", codec=codec, ray_options={"scheduling_strategy": "SPREAD"}
        )
    start = time.perf_counter() - t0
    try:
        venv.seed(0)
        venv.reset()
        rng = np.random.default_rng(0)
        actions = [rng.integers(6, size=n_envs) for _ in range(steps + 20)]
        for a in actions[:20]:
            venv.step_async(a)
            venv.step_wait()
        t0 = time.perf_counter()
        for a in actions[20:]:
            venv.step_async(a)
            venv.step_wait()
        return start, steps * n_envs / (time.perf_counter() - t0)
    finally:
        venv.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="batch steps timed per round")
    parser.add_argument("--wire-steps", type=int, default=100, help="batch steps per codec for bytes")
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ray_backend.json"))
    parser.add_argument("--skip-wire", action="store_true")
    args = parser.parse_args()
    from shmvec.bench import host

    wake_up_us = host.wake_up_us()  # the host's, printed beside the ratios
    print(host.describe(wake_up_us) + ".", flush=True)
    import ray

    t0 = time.perf_counter()
    cluster = start_cluster(2)
    print(
        f"cluster of 2 nodes up in {time.perf_counter() - t0:.1f} s: {[n['NodeManagerAddress'] for n in ray.nodes()]}"
    )
    out: dict = {"n_envs": args.n_envs, "steps": args.steps, "rounds": args.rounds, "wire": {}, "runs": {}}
    out["host"] = {"wake_up_us": wake_up_us}
    try:
        if not args.skip_wire:
            for game in ("ALE/Pong-v5", "ALE/Breakout-v5"):
                for codec in ("raw", "lz4", "zstd", "delta"):
                    # "delta" is the default (codec=None): delta with zstd on the Ray wire.
                    b = wire_bytes(game, None if codec == "delta" else codec, args.n_envs, args.wire_steps)
                    out["wire"].setdefault(game, {})[codec] = b
                    print(f"{game} {codec}: {b:,.0f} bytes per env step")
        kinds = ["local", "ray", "ray-raw", "naive"]
        runs: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
        for r in range(args.rounds):
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                runs[kind].append(throughput(kind, args.n_envs, args.steps))
                print(
                    f"round {r + 1} {kind}: start {runs[kind][-1][0]:.2f} s, {runs[kind][-1][1]:,.0f} steps/s"
                )
        out["runs"] = runs
    finally:
        ray.shutdown()
        cluster.shutdown()
    if out["wire"]:
        print("\n| game | " + " | ".join(out["wire"]["ALE/Pong-v5"]) + " |")
        print("|---|" + "---|" * len(out["wire"]["ALE/Pong-v5"]))
        for game, by_codec in out["wire"].items():
            raw = by_codec["raw"]
            cells = [f"{b:,.0f} B ({raw / b:,.0f}x)" for b in by_codec.values()]
            print(f"| {game} | " + " | ".join(cells) + " |")
    local = [s for _, s in runs["local"]]
    print("\n| backend | steps/s median (min-max) | vs local per round | start-up s median (min-max) |")
    print("|---|---|---|---|")
    for kind, values in runs.items():
        rates = [s for _, s in values]
        starts = [t for t, _ in values]
        ratios = [a / b for a, b in zip(rates, local)]
        print(
            f"| {kind} | {statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) | "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
            f"{statistics.median(starts):.2f} ({min(starts):.2f}-{max(starts):.2f}) |"
        )
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
