"""Observations to the policy's device: ``device=`` against numpy + ``torch.as_tensor(obs).to(dev)``.

    flock /tmp/shmvec-cpu.lock python benchmarks/device_copy.py                # CPU machine, ~2.5 min
    python benchmarks/device_copy.py --device cuda --json device_copy_cuda.json  # GPU machine

A CleanRL-style loop on ``ShmVectorEnv`` (ALE Pong): each batch goes to ``--device``, through SB3's
NatureCNN layers there (``--policy nature``; ``none``: presampled random actions, the env path
alone), and the greedy actions back to the envs. Contenders, each in its own env, all open at once
and stepped in lockstep, one batch each in turn (the order alternates batch by batch):

- ``numpy``: ``device=None``, then ``torch.as_tensor(obs).to(dev)`` (pageable copy on CUDA);
- ``numpy-only`` (``--policy none`` only): ``device=None`` and no torch in the loop at all;
- ``device``: ``device=dev``; on CUDA with ``pin_memory=False`` (copies from pageable memory);
- ``device-pinned``: ``device=dev`` with the ring registered (``pin_memory=True``) and the copy on a
  side stream overlapping the return of ``step``: CUDA only.

Workloads: ``raw`` (``ALE/Pong-v5``, 210x160x3 frames) and ``stack`` (Pong through
``AtariPreprocessing`` and a 4-frame stack: 4x84x84). Per round and contender: env steps/s over its
own batches' wall time (at least ``--seconds`` and ``--min-batches`` batches), and the main
process's CPU time per batch (``time.process_time``, every thread of the process). Printed: the median over the rounds,
and each contender's ratio to ``numpy`` per round as median [min-max]. On a machine without CUDA,
``--device cuda`` stops with that message; the CPU rows measure what ``device="cpu"`` adds to the
main process (the issue's target: at most 2% of the numpy path's CPU time per batch), against both
numpy contenders: the first torch call after a step finds torch's code cold in the caches (the
workers ran meanwhile) and costs ~13 us on the CPU it was measured on, where the next costs ~1 us;
whichever call comes first pays it (``from_numpy`` in the face, or the loop's ``as_tensor``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

WORKLOADS = ("raw", "stack")
CONTENDERS = ("numpy", "device", "device-pinned", "numpy-only")


def greedy_policy(obs_shape: tuple[int, ...], channels_last: bool, n_actions: int, device: Any) -> Any:
    """Greedy actions of SB3's NatureCNN layers on ``device``; uint8 frames in, scaled by 1/255 on
    the device as SB3's preprocessing does."""
    import torch

    from shmvec.bench.policy import nature_cnn

    net = nature_cnn(obs_shape, n_actions, channels_last).to(device)

    def act(x: Any) -> np.ndarray:
        with torch.no_grad():
            if channels_last:
                x = x.permute(0, 3, 1, 2)
            return net(x.float() / 255.0).argmax(1).cpu().numpy()

    return act


def make_env(workload: str, contender: str, n_envs: int, device: str) -> Any:
    from shmvec import ShmVectorEnv
    from shmvec.bench.envs import env_factory, pong_84x84x4

    fn = env_factory("ALE/Pong-v5") if workload == "raw" else pong_84x84x4
    kwargs: dict[str, Any] = {}
    if not contender.startswith("numpy"):
        kwargs["device"] = device
        if device != "cpu":
            kwargs["pin_memory"] = contender == "device-pinned"
    return ShmVectorEnv([fn] * n_envs, start_method="fork", **kwargs)


def one_round(
    envs: dict[str, Any], obs: dict[str, Any], act: Any, randoms: list, args: argparse.Namespace
) -> dict:
    """One round: the contenders step in lockstep, one batch each in turn (the order alternates),
    for at least ``args.seconds`` per contender and ``args.min_batches`` batches, so that a slow
    phase of the machine hits them alike. Per contender: env steps/s over its own batches' wall
    time, and the main process's CPU ms per batch. ``obs`` carries each env's last batch over."""
    import torch

    dev = torch.device(args.device)
    names = list(envs)
    wall = dict.fromkeys(names, 0.0)
    cpu = dict.fromkeys(names, 0.0)
    batches = 0
    while batches < args.min_batches or min(wall.values()) < args.seconds:
        for c in names if batches % 2 == 0 else names[::-1]:
            t, p = time.perf_counter(), time.process_time()
            x = torch.as_tensor(obs[c]).to(dev) if c == "numpy" else obs[c]
            actions = randoms[batches % len(randoms)] if act is None else act(x)
            obs[c] = envs[c].step(actions)[0]
            cpu[c] += time.process_time() - p
            wall[c] += time.perf_counter() - t
        batches += 1
    n = envs[names[0]].num_envs
    return {
        c: {"steps_per_s": batches * n / wall[c], "main_cpu_ms": cpu[c] / batches * 1e3, "batches": batches}
        for c in names
    }


def measure(workload: str, n_envs: int, policy: str, args: argparse.Namespace) -> dict[str, list[dict]]:
    import torch

    skip = {"device-pinned"} if args.device == "cpu" else set()
    contenders = [c for c in CONTENDERS if c not in skip and (c != "numpy-only" or policy == "none")]
    envs = {c: make_env(workload, c, n_envs, args.device) for c in contenders}
    try:
        first = envs["numpy"]
        shape = first.single_observation_space.shape
        channels_last = workload == "raw"
        n_actions = int(first.single_action_space.n)
        torch.manual_seed(0)
        act = None if policy == "none" else greedy_policy(shape, channels_last, n_actions, args.device)
        rng = np.random.default_rng(0)
        randoms = [rng.integers(0, n_actions, n_envs) for _ in range(64)]
        obs = {c: env.reset(seed=0)[0] for c, env in envs.items()}
        # Warm-up: first touches of the ring and the allocator, oneDNN's and cuDNN's first choices.
        one_round(
            envs, obs, act, randoms, argparse.Namespace(**{**vars(args), "seconds": 0.0, "min_batches": 4})
        )
        rounds: dict[str, list[dict]] = {c: [] for c in contenders}
        for _ in range(args.rounds):
            for c, figures in one_round(envs, obs, act, randoms, args).items():
                rounds[c].append(figures)
        return rounds
    finally:
        for env in envs.values():
            env.close()


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def report(key: str, rounds: dict[str, list[dict]]) -> list[str]:
    """Table rows of one workload: medians, and ratios per round (median [min-max]) to ``numpy``
    and, for the CPU time, to ``numpy-only`` where it ran."""
    lines = []
    base, bare = rounds["numpy"], rounds.get("numpy-only")
    for c, rs in rounds.items():
        sps = statistics.median(x["steps_per_s"] for x in rs)
        cpu = statistics.median(x["main_cpu_ms"] for x in rs)
        ratio = spread([x["steps_per_s"] / b["steps_per_s"] for x, b in zip(rs, base)])
        cpu_ratio = spread([x["main_cpu_ms"] / b["main_cpu_ms"] for x, b in zip(rs, base)])
        vs_bare = (
            "-" if bare is None else spread([x["main_cpu_ms"] / b["main_cpu_ms"] for x, b in zip(rs, bare)])
        )
        lines.append(f"| {key} | {c} | {sps:,.0f} | {ratio} | {cpu:.3f} | {cpu_ratio} | {vs_bare} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    parser.add_argument("--workloads", default="raw,stack", help="comma-separated, of raw, stack")
    parser.add_argument("--n-envs", default="8,64", help="comma-separated env counts (default 8,64)")
    parser.add_argument("--policy", default="nature,none", help="nature and/or none (default both)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument(
        "--seconds", type=float, default=0.6, help="seconds per contender and round, at least (default 0.6)"
    )
    parser.add_argument("--min-batches", type=int, default=4, help="batches per round at least (default 4)")
    parser.add_argument("--json", type=Path, default=None, help="write every round's figures here")
    args = parser.parse_args()
    from shmvec.bench import host

    wake_up_us = host.wake_up_us()  # the host's, printed beside the ratios
    print(host.describe(wake_up_us) + ".", flush=True)
    import torch

    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"--device {args.device}: torch {torch.__version__} sees no CUDA device; the CUDA rows "
            "(device and device-pinned) need a GPU machine. Run with --device cpu here."
        )
    workloads = args.workloads.split(",")
    for w in workloads:
        if w not in WORKLOADS:
            raise SystemExit(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    results: dict[str, Any] = {"spec": {k: str(v) for k, v in vars(args).items()}, "torch": torch.__version__}
    results["host"] = {"wake_up_us": wake_up_us}
    table = [
        "| workload, n_envs, policy | contender | env steps/s | vs numpy | main CPU ms/batch | vs numpy "
        "| vs numpy-only |",
        "|---|---|---|---|---|---|---|",
    ]
    began = time.perf_counter()
    for policy in args.policy.split(","):
        for w in workloads:
            for n in (int(x) for x in args.n_envs.split(",")):
                key = f"{w}, {n}, {policy}"
                rounds = measure(w, n, policy, args)
                results[key] = rounds
                table += report(key, rounds)
                print("\n".join(table[-len(rounds) :]), flush=True)
    print(
        f"\ndevice={args.device}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"{args.rounds} rounds in lockstep, {time.perf_counter() - began:.0f} s; ratios per round, median "
        "[min-max]\n"
    )
    print("\n".join(table))
    if args.device == "cpu":
        print(
            "\nThe CUDA rows (device from pageable memory, device-pinned) need a GPU machine: --device cuda."
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
