"""SB3's Atari recipe with the policy in the loop: what training's rollout collection does.

    python benchmarks/policy_loop.py --json benchmarks/results/policy_loop.json

``make_atari_env("PongNoFrameskip-v4", n_envs=8)`` + 4 stacked frames, PPO ``CnnPolicy.predict`` on
CPU then ``step``, for each VecEnv below, interleaved over ``--rounds`` rounds of ``--batches``
batch steps after a warm-up. Prints env steps/s (median, 95% CI, each round), the policy's and the
env's milliseconds per batch step (the policy's also as the 90th percentile of its forward passes),
the main process's CPU per batch step, then the ratios.

Configurations (``--configs``, comma-separated):

- ``dummy``: ``VecFrameStack(DummyVecEnv)``, SB3's in-process reference;
- ``subproc``: ``VecFrameStack(SubprocVecEnv)`` (fork);
- ``shm``: ``VecFrameStack(ShmVecEnv)`` (fork), defaults;
- ``shm-stack``: ``ShmVecEnv(frame_stack=4)``, stacking in the workers;
- ``shm-pin``: ``shm-stack`` with ``worker_cpus="auto"``: each worker pinned to one CPU;
- ``shm-spin``: ``shm`` with ``pause_openmp=False``: what the policy's spinning OpenMP threads cost;
- ``shm-sleep``: ``shm-stack`` with ``worker_spin_us=0``: workers sleep as soon as they have replied
  (what the default's polling, see ``shmvec.waiting``, does here);
- ``shm-late``: ``shm`` with the paused OpenMP pool left for the policy's next forward pass to
  start, as before shmvec started it at the end of each step (what that is worth here).

``--actions random`` replaces ``predict`` with presampled random actions. The README's "With the
policy in the loop" table is rendered from the JSON by ``--from-json ... --markdown``.

Each run has an interpreter of its own (``--one``), as in ``ppo_zoo.py``: no run inherits what an
earlier one left in the process. Each run also records the share of the machine's CPU time the
hypervisor stole meanwhile (``steal``), which marks runs the machine slowed down.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

CONFIGS = ("dummy", "subproc", "shm", "shm-stack", "shm-pin", "shm-spin", "shm-sleep", "shm-late")


def make_venv(config: str, n_envs: int, n_stack: int, seed: int = 0) -> Any:
    """SB3's Atari recipe (``make_atari_env`` on Pong, ``n_stack`` frames) through ``config``'s VecEnv."""
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack

    from shmvec import ShmVecEnv

    cls: Any = {"dummy": DummyVecEnv, "subproc": SubprocVecEnv}.get(config, ShmVecEnv)
    kwargs: dict[str, Any] = {} if config == "dummy" else {"start_method": "fork"}
    if config in ("shm-stack", "shm-pin", "shm-sleep"):
        kwargs["frame_stack"] = n_stack
    if config == "shm-sleep":
        kwargs["worker_spin_us"] = 0
    if config == "shm-pin":
        kwargs["worker_cpus"] = "auto"
    if config == "shm-spin":
        kwargs["pause_openmp"] = False
    venv = make_atari_env(
        "PongNoFrameskip-v4", n_envs=n_envs, seed=seed, vec_env_cls=cls, vec_env_kwargs=kwargs
    )
    return venv if "frame_stack" in kwargs else VecFrameStack(venv, n_stack)


def run_fresh(script: str, argv: Sequence[str]) -> dict[str, Any]:
    """Run ``script`` with ``argv`` in a new interpreter; the JSON object its last line prints. In
    one process later runs slowed down (PPO's updates: 82.4 s run first, 87.6 s run second)."""
    done = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def config_list(known: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse ``type=`` for ``--configs``: comma-separated names from ``known``, in the order given."""

    def parse(value: str) -> list[str]:
        configs = [c for c in value.split(",") if c]
        unknown = sorted(set(configs) - set(known))
        if unknown or not configs:
            raise argparse.ArgumentTypeError(f"unknown {unknown or value!r}; choose from {', '.join(known)}")
        return configs

    return parse


def interleaved(
    script: str,
    configs: Sequence[str],
    rounds: int,
    argv: Sequence[str],
    before_round: Callable[[int], None] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Every one of ``configs`` run ``rounds`` times, each run by :func:`run_fresh` as ``script --one
    CONFIG *argv``; each round's order rotated by one, so that a slow phase of the machine does not
    always hit the same configuration. ``before_round(r)`` runs first in round ``r`` (the host's
    wake-up cost, say). Each run's figures go to stderr as they come."""
    rows: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    for r in range(rounds):
        if before_round is not None:
            before_round(r)
        for config in [*configs[r % len(configs) :], *configs[: r % len(configs)]]:
            figures = run_fresh(script, ["--one", config, *argv])
            rows[config].append(figures)
            shown = ", ".join(f"{k} {v:,.4g}" for k, v in figures.items() if isinstance(v, (int, float)))
            print(f"round {r + 1}/{rounds} {config}: {shown}", file=sys.stderr, flush=True)
    return rows


def measure(config: str, args: argparse.Namespace) -> dict[str, float]:
    """One round of one configuration (in the child interpreter): figures per batch step."""
    import ale_py
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    from shmvec.bench.system import cpu_snapshot

    gym.register_envs(ale_py)
    if config == "shm-late":  # this interpreter is the run's own (--one): the patch ends with it
        from shmvec.engine.openmp import OpenMPPauser

        OpenMPPauser.start = lambda self: None  # type: ignore[method-assign]
    probe = VecFrameStack(make_atari_env("PongNoFrameskip-v4", n_envs=1, seed=0), args.n_stack)
    model = PPO("CnnPolicy", probe, seed=0, device="cpu")
    probe.close()
    venv = make_venv(config, args.n_envs, args.n_stack)
    try:
        venv.action_space.seed(0)
        randoms = [np.array([venv.action_space.sample() for _ in range(args.n_envs)]) for _ in range(64)]
        obs = venv.reset()
        policy = env = 0.0
        forwards: list[float] = []
        for k in range(args.warmup + args.batches):
            if k == args.warmup:
                policy = env = 0.0
                forwards.clear()
                start, cpu0, machine0 = time.perf_counter(), time.process_time(), cpu_snapshot([])
            a = time.perf_counter()
            if args.actions == "random":
                actions = randoms[k % 64]
            else:
                actions, _ = model.policy.predict(obs, deterministic=False)
            b = time.perf_counter()
            obs = venv.step(actions)[0]
            env += time.perf_counter() - b
            policy += b - a
            forwards.append(b - a)
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu0
        machine = cpu_snapshot([])
    finally:
        venv.close()
    n = args.batches
    total = machine.machine_total_s - machine0.machine_total_s
    return {
        "steps_per_s": n * args.n_envs / wall,
        "policy_ms": policy / n * 1e3,
        # The mean hides a tail: with unpinned workers some forward passes take 2-6x the median.
        "policy_p90_ms": float(np.percentile(forwards, 90)) * 1e3,
        "env_ms": env / n * 1e3,
        "main_cpu_ms": cpu / n * 1e3,
        "steal": (machine.machine_steal_s - machine0.machine_steal_s) / total if total > 0 else 0.0,
        "torch_threads": torch.get_num_threads(),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from shmvec.bench import host

    wake_up_us = host.wake_up_us()  # the host's, beside the ratios
    argv = [
        f"--{k}={getattr(args, k.replace('-', '_'))}"
        for k in ("n-envs", "n-stack", "batches", "warmup", "actions")
    ]
    rounds = interleaved(__file__, args.configs, args.rounds, argv)
    from shmvec.engine.groups import usable_cpus

    return {
        "spec": {k: v for k, v in vars(args).items() if k not in ("json", "from_json", "markdown", "one")},
        "torch_threads": rounds[args.configs[0]][0]["torch_threads"],
        "cpus": usable_cpus(),
        "rounds": rounds,
        "host": {"wake_up_us": wake_up_us},
    }


def markdown(result: dict[str, Any]) -> str:
    """The docs' tables: median and 95% CI of env steps/s with ratios to dummy, then ms per batch step."""
    from shmvec.bench import host
    from shmvec.bench.stats import summarize

    rounds = result["rounds"]
    med = {c: summarize([x["steps_per_s"] for x in rs]) for c, rs in rounds.items()}
    # Two tables, so that each fits the docs' column: throughput, then where a batch step's time goes.
    lines = ["| VecEnv | env steps/s | 95% CI | vs dummy | vs subproc |", "|---|---|---|---|---|"]
    times = [
        "| VecEnv | policy ms | policy p90 ms | env ms | main CPU ms | steal |",
        "|---|---|---|---|---|---|",
    ]
    for c, rs in rounds.items():
        s = med[c]

        def ms(key: str, rs: list[dict[str, float]] = rs, fmt: str = ".2f") -> str:
            if any(key not in x for x in rs):  # measured before the figure existed
                return "-"
            return f"{float(np.median([x[key] for x in rs])):{fmt}}"

        vs = [f"{s.median / med[ref].median:.2f}x" if ref in med else "-" for ref in ("dummy", "subproc")]
        lines.append(f"| {c} | {s.median:,.0f} | {s.ci_low:,.0f}-{s.ci_high:,.0f} | {vs[0]} | {vs[1]} |")
        times.append(
            f"| {c} | {ms('policy_ms')} | {ms('policy_p90_ms')} | {ms('env_ms')} | {ms('main_cpu_ms')} | "
            f"{ms('steal', fmt='.1%')} |"
        )
    lines += ["", *times]
    spec = result["spec"]
    lines.append(
        f"\n{spec['rounds']} interleaved rounds of {spec['batches']} batch steps, n_envs={spec['n_envs']}, "
        f"actions: {spec['actions']}, torch threads {result['torch_threads']}. "
        + host.describe(result.get("host", {}).get("wake_up_us"))
        + "."
    )
    if "dummy" in rounds and result.get("cpus", 1) > 1:
        from shmvec.bench.train import best_case

        policy, env = (float(np.median([x[k] for x in rounds["dummy"]])) for k in ("policy_ms", "env_ms"))
        lines.append(
            f"An ideal multi-process VecEnv on {result['cpus']} CPUs (DummyVecEnv's forward passes, its env "
            f"work spread over the CPUs at no cost) would reach "
            f"{1 / best_case(policy + env, env, result['cpus']):.2f}x DummyVecEnv."
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--configs", type=config_list(CONFIGS), default=list(CONFIGS), help=f"comma-separated, from {CONFIGS}"
    )
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--n-stack", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=300, help="measured batch steps per round")
    parser.add_argument("--warmup", type=int, default=30, help="batch steps before measuring")
    parser.add_argument("--actions", choices=("policy", "random"), default="policy")
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    parser.add_argument("--from-json", type=Path, default=None, help="measure nothing; report this JSON")
    parser.add_argument("--markdown", action="store_true", help="print the README table only")
    parser.add_argument("--one", choices=CONFIGS, help=argparse.SUPPRESS)  # one run, in the child
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args)))
        return
    if args.from_json:
        result = json.loads(args.from_json.read_text())
    else:
        result = run(args)
        if args.json:
            args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
