"""PPO with rl-zoo3's Atari hyperparameters, timed in its two phases: rollout collection and training.

    python benchmarks/ppo_zoo.py --steps 20480 --json benchmarks/results/ppo_zoo.json

SB3's Atari recipe (``make_atari_env("PongNoFrameskip-v4", n_envs=8)``, 4 stacked frames) and PPO
``CnnPolicy`` with rl-zoo3's ``atari`` hyperparameters (n_steps 128, batch 256, 4 epochs, clip 0.1,
ent_coef 0.01, vf_coef 0.5, learning rate 2.5e-4; zoo's linear schedules are constant here) on CPU,
for each VecEnv below, interleaved over ``--rounds`` rounds with the same seed. Per run: seconds in
``collect_rollouts`` (the VecEnv's share: policy forward passes and env steps), seconds in ``train``,
the whole ``learn`` call, the seconds in the VecEnv's ``step`` (all env work, with IPC), and a hash
of the learned parameters; ``dummy`` and the ``shm`` ones
must learn identical parameters (SubprocVecEnv's float64 rewards may change the last bits).

Configurations: ``dummy`` (``VecFrameStack(DummyVecEnv)``), ``subproc`` (``VecFrameStack(SubprocVecEnv)``),
``shm`` (``VecFrameStack(ShmVecEnv)``), ``shm-stack`` (``ShmVecEnv(frame_stack=4)``) and ``shm-pin``
(``shm-stack`` with ``worker_cpus="auto"``).
Process backends use fork, so start-up stays out of the comparison. Each run has an interpreter
of its own (``--one``), so no run inherits what an earlier one left in the process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Any

# the same recipe; benchmarks/ is the script's path
from policy_loop import config_list, interleaved, make_venv

from shmvec.bench.train import ATARI_PPO, Stopwatch, best_case
from shmvec.engine.groups import usable_cpus

CONFIGS = ("dummy", "subproc", "shm", "shm-stack", "shm-pin")


def run_one(config: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from stable_baselines3 import PPO

    venv = make_venv(config, args.n_envs, 4, args.seed)
    try:
        model = PPO("CnnPolicy", venv, seed=args.seed, device="cpu", **ATARI_PPO)
        rollout, train = Stopwatch(model, "collect_rollouts"), Stopwatch(model, "train")
        steps = Stopwatch(model.get_env(), "step")
        start = time.perf_counter()
        model.learn(total_timesteps=args.steps)
        learn_s = time.perf_counter() - start
        digest = hashlib.sha256()
        for value in model.policy.state_dict().values():
            digest.update(value.detach().cpu().numpy().tobytes())
    finally:
        venv.close()
    return {
        "rollout_s": rollout.seconds,
        "train_s": train.seconds,
        "env_s": steps.seconds,
        "learn_s": learn_s,
        "params_sha256": digest.hexdigest(),
        "torch_threads": torch.get_num_threads(),
    }


def markdown(result: dict[str, Any]) -> str:
    import numpy as np

    from shmvec.bench import host

    rounds = result["rounds"]
    keys = ("rollout_s", "env_s", "train_s", "learn_s")
    med = {
        c: {
            k: float(np.median([r[k] for r in rs])) if all(k in r for r in rs) else float("nan") for k in keys
        }
        for c, rs in rounds.items()
    }
    ref = rounds.get("dummy", [{}])[0].get("params_sha256")
    lines = [
        "| VecEnv | rollout s | in step s | train s | learn s | rollout vs dummy | learn vs dummy | learn vs subproc | params = dummy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def seconds(value: float) -> str:
        return "-" if value != value else f"{value:.1f}"  # NaN: measured before the figure existed

    for c, m in med.items():

        def vs(key: str, other: str, m: dict[str, float] = m) -> str:
            return f"{m[key] / med[other][key]:.2f}x" if other in med else "-"

        same = all(r["params_sha256"] == ref for r in rounds[c]) if ref else None
        lines.append(
            f"| {c} | {m['rollout_s']:.1f} | {seconds(m['env_s'])} | {m['train_s']:.1f} | {m['learn_s']:.1f} | "
            f"{vs('rollout_s', 'dummy')} | {vs('learn_s', 'dummy')} | {vs('learn_s', 'subproc')} | "
            f"{'-' if same is None else 'yes' if same else 'no'} |"
        )
    spec = result["spec"]
    lines.append(
        f"\n{spec['steps']:,} env steps, {spec['n_envs']} envs, seed {spec['seed']}, {spec['rounds']} round(s) "
        f"(medians), torch threads {result['torch_threads']}; lower is better. "
        + host.describe(result.get("host", {}).get("wake_up_us"))
        + "."
    )
    bound = bounds(med.get("dummy", {}), result.get("cpus"))
    if bound is not None:
        lines.append(
            f"An ideal multi-process VecEnv on {result['cpus']} CPUs (DummyVecEnv's run with its time in step "
            f"spread over the CPUs at no cost; `shmvec.bench.train.best_case`) would take {bound[0]:.2f}x its "
            f"rollout time and {bound[1]:.2f}x its learn time."
        )
    return "\n".join(lines)


def bounds(dummy: dict[str, float], cpus: int | None) -> tuple[float, float] | None:
    """:func:`shmvec.bench.train.best_case` of DummyVecEnv's (rollout, learn) medians; None where the
    JSON predates the figures."""
    if not cpus or any(k not in dummy or dummy[k] != dummy[k] for k in ("rollout_s", "env_s", "learn_s")):
        return None
    rollout, learn = (best_case(dummy[k], dummy["env_s"], cpus) for k in ("rollout_s", "learn_s"))
    return rollout, learn


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--configs", type=config_list(CONFIGS), default=list(CONFIGS), help=f"comma-separated, from {CONFIGS}"
    )
    parser.add_argument("--steps", type=int, default=20_480, help="env steps per run")
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    parser.add_argument("--from-json", type=Path, default=None, help="measure nothing; report this JSON")
    parser.add_argument("--one", choices=CONFIGS, help=argparse.SUPPRESS)  # one run, in the child
    args = parser.parse_args()
    configs = args.configs
    if args.one:
        import ale_py
        import gymnasium as gym

        gym.register_envs(ale_py)
        print(json.dumps(run_one(args.one, args)))
        return
    if args.from_json:
        result = json.loads(args.from_json.read_text())
    else:
        from shmvec.bench import host

        wake_up_us = host.wake_up_us()  # the host's, beside the ratios
        argv = [f"--steps={args.steps}", f"--n-envs={args.n_envs}", f"--seed={args.seed}"]
        rounds = interleaved(__file__, configs, args.rounds, argv)
        spec = {k: v for k, v in vars(args).items() if k not in ("json", "from_json")}
        result = {
            "spec": spec,
            "torch_threads": rounds[configs[0]][0]["torch_threads"],
            "cpus": usable_cpus(),
            "rounds": rounds,
            "host": {"wake_up_us": wake_up_us},
        }
        if args.json:
            args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
