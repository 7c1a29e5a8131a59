"""TorchRL's own loop on Atari frames: ``ShmTorchRLEnv`` beside TorchRL's ``ParallelEnv`` and ``SerialEnv``.

    /work/coord/bench-lock python benchmarks/torchrl_loop.py --rounds 5 --seconds 6

The preprocessed Breakout recipe (``ALE/Breakout-v5`` with ``frameskip=1``, ``AtariPreprocessing``,
``FrameStackObservation(4)``: observations (4, 84, 84) uint8; ``shmvec.bench.envs.atari_preprocessed``)
in ``--n`` envs, collected by TorchRL's ``Collector`` with its random policy (``policy=None``),
``frames_per_batch = 16 x n``. Configurations (``--configs``):

- ``parallel``: ``ParallelEnv(n, lambda: GymWrapper(recipe()))``, one process per env (TorchRL's
  shared-memory tensordicts), TorchRL's defaults otherwise;
- ``serial``: ``SerialEnv`` of the same, in this process (TorchRL's reference);
- ``shm``: ``ShmTorchRLEnv([recipe] * n)``, shmvec's defaults (``n_workers``: one per usable CPU);
- ``parallel-passive``, ``shm-passive``: the same with ``OMP_WAIT_POLICY=PASSIVE`` set before torch
  is imported: torch's idle OpenMP threads sleep instead of spinning (GNU OpenMP's default) on the
  cores the env processes need.

``--torch-threads N`` sets ``torch.set_num_threads(N)`` in the main process for every configuration
(default: torch's own, one per CPU). On the 2-vCPU machine it matters for ``shm`` (docs/guides/torchrl.md
has both runs' figures): with two intra-op threads the Collector's ``torch.stack`` of each batch into
its buffer took 0.3-0.5 s beside shmvec's workers, against ~5 ms with one thread.

Per run (each in a fresh interpreter, after ``--warm-up`` batches): env steps/s and the process
tree's CPU µs per env step. Rounds are interleaved, the order rotating each round; ratios are taken
to ``parallel``'s figure of the same round, reported as median (range).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from typing import Any

from policy_loop import config_list, interleaved

CONFIGS = ("parallel", "serial", "shm", "parallel-passive", "shm-passive")


def recipe(game: str) -> Any:
    """One env of the preprocessed recipe (module level: ParallelEnv's workers unpickle it)."""
    from shmvec.bench.envs import atari_preprocessed

    return atari_preprocessed(game)


def torchrl_env(game: str) -> Any:
    """TorchRL's own wrapper of one env, as ``SerialEnv`` / ``ParallelEnv`` build each of theirs."""
    from torchrl.envs import GymWrapper

    return GymWrapper(recipe(game))


def make(config: str, game: str, n: int) -> Any:
    from torchrl.envs import ParallelEnv, SerialEnv

    if config == "shm":
        from shmvec.torchrl import ShmTorchRLEnv

        return ShmTorchRLEnv([functools.partial(recipe, game)] * n)
    cls = ParallelEnv if config == "parallel" else SerialEnv
    return cls(n, functools.partial(torchrl_env, game))


def tree_cpu_s() -> float:
    """User + system CPU seconds of this process and all its children (ParallelEnv's workers,
    shmvec's, and whatever they started)."""
    import psutil

    from shmvec.bench.system import cpu_snapshot

    return cpu_snapshot(psutil.Process().children()).tree_s


def measure(
    config: str, game: str, n: int, seconds: float, warm_up: int, threads: int | None
) -> dict[str, float]:
    """One run: env steps/s and CPU µs per env step of this process and all its children."""
    config, _, wait_policy = config.partition("-")
    if wait_policy:  # libgomp reads it once, when torch loads it: nothing has imported torch yet
        assert "torch" not in sys.modules
        os.environ["OMP_WAIT_POLICY"] = wait_policy.upper()
    import torch
    from torchrl.collectors import Collector

    if threads is not None:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    env = make(config, game, n)
    env.set_seed(0)
    collector = Collector(env, None, frames_per_batch=16 * n, total_frames=-1)
    try:
        batches = iter(collector)
        for _ in range(warm_up):
            next(batches)
        frames, cpu, start = 0, tree_cpu_s(), time.perf_counter()
        while time.perf_counter() - start < seconds:
            frames += next(batches).numel()
        wall, cpu = time.perf_counter() - start, tree_cpu_s() - cpu
    finally:
        collector.shutdown()  # closes the env too
    return {"steps_per_s": frames / wall, "cpu_us": cpu / frames * 1e6}


def markdown(result: dict[str, Any]) -> str:
    """The table: each figure's median (range) over rounds and its ratio to ``parallel``'s round by round."""
    from shmvec.bench import host
    from shmvec.bench.compare import cells, side_by_side

    rows = result["rows"]
    rounds = len(next(iter(rows.values())))
    out = [
        f"**{result['game']} (AtariPreprocessing + FrameStackObservation(4)), n={result['n']}** "
        f"({rounds} interleaved rounds of {result['seconds']:g} s, torch threads "
        f"{result.get('torch_threads') or 'default'}, {result['started']})\n",
        "| TorchRL env | env steps/s | x ParallelEnv | CPU µs per env step | x ParallelEnv |",
        "|---|---|---|---|---|",
    ]
    out += ["| " + " | ".join(cells(row)) + " |" for row in side_by_side(rows, "parallel")]
    out += ["", host.describe(result.get("wake_up_us")) + "."]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", default="ALE/Breakout-v5")
    parser.add_argument("--n", type=int, default=8, help="envs")
    parser.add_argument("--configs", type=config_list(CONFIGS), default=["parallel", "serial", "shm"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warm-up", type=int, default=5, help="batches before the timed ones")
    parser.add_argument("--torch-threads", type=int, help="torch.set_num_threads in the main process")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--from-json", help="read results from here instead of measuring")
    parser.add_argument("--one", choices=CONFIGS, help=argparse.SUPPRESS)  # one run, in the child
    args = parser.parse_args()
    if args.one:
        print(
            json.dumps(measure(args.one, args.game, args.n, args.seconds, args.warm_up, args.torch_threads))
        )
        return
    if args.from_json:
        with open(args.from_json) as f:
            print(markdown(json.load(f)))
        return
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    argv = [f"--game={args.game}", f"--n={args.n}", f"--seconds={args.seconds}", f"--warm-up={args.warm_up}"]
    if args.torch_threads is not None:
        argv.append(f"--torch-threads={args.torch_threads}")
    from shmvec.bench import host

    wake_up_us = host.wake_up_us()  # the host's, beside the ratios
    rows = interleaved(__file__, args.configs, args.rounds, argv)
    result = {
        "started": started,
        "game": args.game,
        "n": args.n,
        "seconds": args.seconds,
        "torch_threads": args.torch_threads,
        "rows": rows,
        "wake_up_us": wake_up_us,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(markdown(result))
    shm = rows.get("shm")
    if shm and "parallel" in rows:
        ratios = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(shm, rows["parallel"])]
        print(f"\nshm / parallel env steps/s: {statistics.median(ratios):.2f}x (target >= 1.3x)")
        print(host.describe(wake_up_us) + ".")


if __name__ == "__main__":
    main()
