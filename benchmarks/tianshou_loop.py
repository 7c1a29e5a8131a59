"""Tianshou's own loop on Atari frames: ``ShmTianshouVectorEnv`` beside Tianshou's ``ShmemVectorEnv``,
``SubprocVectorEnv`` and ``DummyVectorEnv``.

    /work/coord/bench-lock python benchmarks/tianshou_loop.py --rounds 5 --seconds 8

The preprocessed Breakout recipe (``ALE/Breakout-v5`` with ``frameskip=1``, ``AtariPreprocessing``,
``FrameStackObservation(4)``: observations (4, 84, 84) uint8; ``shmvec.bench.envs.atari_preprocessed``)
in ``--n`` envs, collected by Tianshou's ``Collector`` into a ``VectorReplayBuffer``, ``collect(n_step=
16 x n)`` after ``collect`` of the same size to warm up. ``--policy random`` (default): the Collector's
own random actions (``random=True``), the env side alone; ``--policy dqn``: Tianshou's Atari ``DQNet``
(untrained, eps-greedy 0.1) picks the actions in the main process, as in training. Configurations
(``--configs``):

- ``shmem``: ``ShmemVectorEnv``, one process per env, observations through ``ctx.Array`` buffers;
- ``subproc``: ``SubprocVectorEnv``, one process per env, everything pickled;
- ``dummy``: ``DummyVectorEnv``, the envs in this process;
- ``shm``: ``ShmTianshouVectorEnv`` with its defaults (``n_workers`` = the usable CPUs, each worker
  stepping a group of envs);
- ``shm-per-env``: the same with one worker per env (``n_workers=n``, as Tianshou's own; the default
  before workers could step some envs of their group);
- ``shm-pin``: ``shm`` with ``worker_cpus="auto"``, each worker pinned to one CPU.

Every run is a fresh interpreter (fork start method for all, Tianshou's default); rounds are
interleaved, the order rotating each round. Per run: env steps/s, the process tree's CPU µs per env
step, and the share of the machine's busy CPU that other processes took meanwhile. Ratios are taken to
``shmem``'s (and ``dummy``'s) figure of the same round, reported as median (range). Beside them, the
host's wake-up cost: a pipe round trip between two processes on two CPUs
(:func:`shmvec.bench.host.wake_up_us`), measured before each round.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from typing import Any

from policy_loop import config_list, interleaved

from shmvec.bench import host

CONFIGS = ("shmem", "subproc", "dummy", "shm", "shm-per-env", "shm-pin")
WAKE_HOW = "shmvec.bench.host: pipe round trip between two processes on two CPUs, before each round"
#: What results without ``wake_how`` measured: the two processes unpinned, often on one CPU, where a
#: round trip costs a context switch, not the cross-CPU wake-up a worker pays (it reads lower).
WAKE_UNPINNED = (
    "pipe round trip between two unpinned processes, before each round; lower than shmvec.bench.host's"
)


def make(config: str, game: str, n: int) -> Any:
    from tianshou.env import DummyVectorEnv, ShmemVectorEnv, SubprocVectorEnv

    from shmvec.bench.envs import atari_preprocessed
    from shmvec.tianshou import ShmTianshouVectorEnv

    fns = [functools.partial(atari_preprocessed, game)] * n
    if config == "shm":
        return ShmTianshouVectorEnv(fns)
    if config == "shm-per-env":
        return ShmTianshouVectorEnv(fns, n_workers=n)
    if config == "shm-pin":
        return ShmTianshouVectorEnv(fns, worker_cpus="auto")
    return {"shmem": ShmemVectorEnv, "subproc": SubprocVectorEnv, "dummy": DummyVectorEnv}[config](fns)


def measure(config: str, game: str, n: int, seconds: float, policy: str) -> dict[str, float]:
    """One run: env steps/s, the tree's CPU µs per env step, others' share of the busy CPU."""
    import numpy as np
    import psutil
    import torch
    from gymnasium import spaces
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env.atari.atari_network import DQNet

    from shmvec.bench.system import cpu_snapshot

    torch.manual_seed(0)
    np.random.seed(0)
    agent = DiscreteQLearningPolicy(
        model=DQNet(4, 84, 84, 4), action_space=spaces.Discrete(4), eps_inference=0.1
    ).eval()
    venv = make(config, game, n)
    try:
        venv.seed(0)
        collector = Collector(agent, venv, VectorReplayBuffer(1000 * n, n), exploration_noise=True)
        collector.reset()
        per_call = {"n_step": 16 * n, "random": policy == "random"}
        with torch.no_grad():
            collector.collect(**per_call)  # warm-up: the buffer's arrays exist, the workers are warm
            procs = psutil.Process().children(recursive=True)
            before, steps, start = cpu_snapshot(procs), 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                steps += collector.collect(**per_call).n_collected_steps
            wall, after = time.perf_counter() - start, cpu_snapshot(procs)
    finally:
        venv.close()
    tree = after.tree_s - before.tree_s
    busy = after.machine_busy_s - before.machine_busy_s
    return {
        "steps_per_s": steps / wall,
        "cpu_us": tree / steps * 1e6,
        "others_pct": 100 * max(0.0, busy - tree) / busy if busy > 0 else 0.0,
    }


def markdown(result: dict[str, Any]) -> str:
    """The table: each figure's median (range) over rounds and its ratios to ``shmem``'s and
    ``dummy``'s of the same rounds; the host's pipe round trip under it."""
    from shmvec.bench.compare import cells, side_by_side, spread

    rows = result["rows"]
    rounds = len(next(iter(rows.values())))
    out = [
        f"**{result['game']} (AtariPreprocessing + FrameStackObservation(4)), n={result['n']}, "
        f"{result['policy']} actions, Tianshou {result['tianshou']}** ({rounds} interleaved rounds of "
        f"{result['seconds']:g} s, {result['started']})\n",
        "| Tianshou vector env | env steps/s | x ShmemVectorEnv | CPU µs per env step | x ShmemVectorEnv "
        "| x DummyVectorEnv (steps/s) | others' CPU |",
        "|---|---|---|---|---|---|---|",
    ]
    by_dummy = {r["label"]: r for r in side_by_side(rows, "dummy")}
    for row in side_by_side(rows, "shmem"):
        label = row["label"]
        others = spread([r["others_pct"] for r in rows[label]]).replace(" (", "% (")
        vs_dummy = spread(by_dummy[label]["steps_per_s_ratio"], ratio=True)
        out.append("| " + " | ".join([*cells(row), vs_dummy, others]) + " |")
    wake, how = result["wake_us"], result.get("wake_how", WAKE_UNPINNED)
    out.append(
        f"\nHost wake-up cost ({how}): {statistics.median(wake):.1f} µs ({min(wake):.1f}-{max(wake):.1f})"
    )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", default="ALE/Breakout-v5")
    parser.add_argument("--n", type=int, default=8, help="envs (default 8)")
    parser.add_argument(
        "--configs", type=config_list(CONFIGS), default=list(CONFIGS), help=", ".join(CONFIGS)
    )
    parser.add_argument("--policy", choices=("random", "dqn"), default="random")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0, help="seconds per run (default 6)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--from-json", help="read results from here instead of measuring")
    parser.add_argument("--one", choices=CONFIGS, help=argparse.SUPPRESS)  # one run, in the child
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.game, args.n, args.seconds, args.policy)))
        return
    if args.from_json:
        with open(args.from_json) as f:
            print(markdown(json.load(f)))
        return
    configs = args.configs
    import tianshou

    wake: list[float] = []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    argv = [f"--game={args.game}", f"--n={args.n}", f"--seconds={args.seconds}", f"--policy={args.policy}"]
    rows = interleaved(__file__, configs, args.rounds, argv, lambda r: wake.append(host.wake_up_us()))
    result = {
        "started": started,
        "game": args.game,
        "n": args.n,
        "policy": args.policy,
        "seconds": args.seconds,
        "tianshou": tianshou.__version__,
        "wake_us": wake,
        "wake_how": WAKE_HOW,
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(markdown(result))
    for base, target in (("shmem", 1.5), ("dummy", 1.6)):
        if "shm" in rows and base in rows:
            ratios = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(rows["shm"], rows[base])]
            print(f"shm / {base} env steps/s: {statistics.median(ratios):.2f}x (target >= {target}x)")


if __name__ == "__main__":
    main()
