"""ShmVecEnv of this tree against ShmVecEnv of another commit, or on another stack (SB3, Gymnasium,
ale-py releases), side by side, interleaved.

    git worktree add /tmp/old 45780b7
    python benchmarks/against_commit.py --old /tmp/old
    python benchmarks/against_commit.py --python-old OLDSTACK/bin/python --workloads atari-pong
    python benchmarks/against_commit.py --old /tmp/old --workloads pong --peers subproc,dummy

``--python-old`` / ``--python-new``: the interpreter (a venv with shmvec installed, e.g. one of the
stacks of ``python -m shmvec.atari.releases --stacks``) each side's windows run with; by default this
one. Without ``--old`` both sides import this tree's ``shmvec``.

Each window runs in a fresh interpreter: ``PYTHONPATH=<old>`` makes it import the old ``shmvec``
(PYTHONPATH comes before the editable install), no PYTHONPATH the current one. Per workload (ALE
Pong raw frames; synthetic 512x512x3 frames at 0 ms per step), n_envs=8, fork, random actions:
env steps/s of every round, the main process's CPU per batch step and the CPU per env step of the
whole process tree (main process and workers: what the machine pays, which foreign load on a shared
machine barely moves, unlike env steps/s); then the ratios of medians and the median of the
round-by-round ratios. ``--peers``: SB3's ``SubprocVecEnv`` / ``DummyVecEnv`` over the same
factories, in the same rounds (``pong`` and ``synth512`` only), and the new side's ratios to them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# pong-delta: Pong with codec="delta"; atari-policy: SB3's Atari recipe (PongNoFrameskip-v4,
# frame_stack=4 in the workers) with PPO's CnnPolicy.predict in the loop; atari-pong,
# atari-mspacman, atari-breakout: the recipe with random actions; pong-pool: ShmVectorEnv's pool
# mode, 16 Pong envs in batches of 8, random actions.
WORKLOADS = ("pong", "synth512", "pong-delta", "atari-policy", "pong-pool")
WORKLOADS += ("atari-pong", "atari-mspacman", "atari-breakout")
# SB3's VecEnvs a --peers window builds in ShmVecEnv's place (workloads pong and synth512).
PEERS = ("subproc", "dummy")


class _Timed:
    """The measured part of a window: env steps/s, main-process CPU per batch and process-tree CPU
    per env step. Read with psutil, so any commit's ``shmvec`` can be measured the same way."""

    def __init__(self, batch: int) -> None:
        import psutil

        self.batch, self.n = batch, 0
        self.children = psutil.Process().children(recursive=True)  # the workers, started by now
        self.tree, self.cpu, self.start = self._tree_cpu(), time.process_time(), time.perf_counter()

    def _tree_cpu(self) -> float:
        own = time.process_time()
        return own + sum(sum(c.cpu_times()[:2]) for c in self.children)

    def result(self) -> dict[str, float]:
        wall, cpu, tree = (
            time.perf_counter() - self.start,
            time.process_time() - self.cpu,
            self._tree_cpu() - self.tree,
        )
        n = self.n
        return {
            "steps_per_s": n * self.batch / wall,
            "main_cpu_ms": cpu / n * 1e3,
            "tree_cpu_us": tree / (n * self.batch) * 1e6,
        }


def recipe_window(seconds: float, game: str, policy: bool) -> dict[str, float | str]:
    """SB3's Atari recipe on ``game`` (e.g. ``"Pong"``), with PPO's policy in the loop (what
    training's rollouts do) or random actions."""
    import ale_py
    import gymnasium as gym
    import numpy as np
    from stable_baselines3.common.env_util import make_atari_env

    import shmvec
    from shmvec import ShmVecEnv

    gym.register_envs(ale_py)
    venv = make_atari_env(
        f"{game}NoFrameskip-v4",
        n_envs=8,
        seed=0,
        vec_env_cls=ShmVecEnv,
        vec_env_kwargs={"start_method": "fork", "frame_stack": 4},
    )
    try:
        if policy:
            import torch
            from stable_baselines3 import PPO

            torch.set_num_threads(2)
            act = PPO("CnnPolicy", venv, seed=0, device="cpu").predict
        else:
            rng = np.random.default_rng(0)
            actions = [rng.integers(0, venv.action_space.n, 8) for _ in range(64)]
            act = lambda obs: (actions[timed.n % 64],)  # noqa: E731
        timed = _Timed(8)
        obs = venv.reset()
        for _ in range(30):  # warm-up
            obs = venv.step(act(obs)[0])[0]
        timed = _Timed(8)
        while time.perf_counter() - timed.start < seconds:
            obs = venv.step(act(obs)[0])[0]
            timed.n += 1
        result = timed.result()
        paths = [s.path or "wrappers" for s in venv.native_steps]
    finally:
        venv.close()
    from importlib.metadata import version

    stack = " ".join(f"{d} {version(d)}" for d in ("stable-baselines3", "gymnasium", "ale-py"))
    native = ", ".join(f"{paths.count(p)} {p}" for p in dict.fromkeys(paths))
    return {"shmvec": shmvec.__file__, "stack": stack, "native": native, **result}


def pool_window(seconds: float) -> dict[str, float | str]:
    """Pool mode (``send``/``recv``) on Pong raw frames: 16 envs, batches of 8."""
    import functools

    import ale_py
    import gymnasium as gym
    import numpy as np

    import shmvec
    from shmvec import ShmVectorEnv

    gym.register_envs(ale_py)
    envs = ShmVectorEnv([functools.partial(gym.make, "ALE/Pong-v5")] * 16, start_method="fork", batch_size=8)
    try:
        rng = np.random.default_rng(0)
        actions = [rng.integers(0, 6, 8) for _ in range(64)]
        envs.async_reset(seed=0)
        for k in range(50):  # warm-up
            envs.send(actions[k % 64], envs.recv()[4]["env_id"])
        timed = _Timed(8)
        while time.perf_counter() - timed.start < seconds:
            envs.send(actions[timed.n % 64], envs.recv()[4]["env_id"])
            timed.n += 1
        result = timed.result()
    finally:
        envs.close()
    return {"shmvec": shmvec.__file__, **result}


def window(workload: str, seconds: float, peer: str | None = None) -> dict[str, float | str]:
    """One measuring window in this interpreter (whichever ``shmvec`` it imports); ``peer``: one of
    :data:`PEERS` in ShmVecEnv's place."""
    import functools

    import numpy as np

    import shmvec
    from shmvec import ShmVecEnv

    if workload.startswith("atari-"):
        game = {"atari-mspacman": "MsPacman", "atari-breakout": "Breakout"}.get(workload, "Pong")
        return recipe_window(seconds, game, policy=workload == "atari-policy")
    if workload == "pong-pool":
        return pool_window(seconds)
    if workload.startswith("pong"):
        import ale_py
        import gymnasium as gym

        gym.register_envs(ale_py)
        fn = functools.partial(gym.make, "ALE/Pong-v5")
    else:
        from shmvec.synthetic import SyntheticImageEnv

        fn = functools.partial(SyntheticImageEnv, (512, 512, 3), work_s=0.0)
    codec = "delta" if workload == "pong-delta" else None
    if peer is not None:
        from stable_baselines3.common import vec_env

        if peer == "subproc":
            venv = vec_env.SubprocVecEnv([fn] * 8, start_method="fork")
        else:
            venv = vec_env.DummyVecEnv([fn] * 8)
    else:
        venv = ShmVecEnv([fn] * 8, start_method="fork", codec=codec)
    try:
        venv.seed(0)
        venv.reset()
        venv.action_space.seed(0)
        actions = [np.array([venv.action_space.sample() for _ in range(8)]) for _ in range(64)]
        for k in range(50):  # warm-up: fresh pages, caches
            venv.step(actions[k % 64])
        timed = _Timed(8)
        while time.perf_counter() - timed.start < seconds:
            venv.step(actions[timed.n % 64])
            timed.n += 1
        result = timed.result()
        # 4de4e74's ShmVecEnv has native_steps too; SB3's VecEnvs have none.
        paths = [s.path or "wrappers" for s in getattr(venv, "native_steps", ())]
    finally:
        venv.close()
    native = ", ".join(f"{paths.count(p)} {p}" for p in dict.fromkeys(paths)) or "wrappers (SB3)"
    return {"shmvec": shmvec.__file__, "native": native, **result}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--old", default=None, help="a checkout of the other commit (default: this tree)")
    parser.add_argument("--new", default=None, help="a checkout to measure as new (default: this install)")
    parser.add_argument("--python-old", default=sys.executable, help="the old side's interpreter")
    parser.add_argument("--python-new", default=sys.executable, help="the new side's interpreter")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per window")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=["pong", "synth512"])
    parser.add_argument("--window", choices=WORKLOADS, help=argparse.SUPPRESS)  # internal: one window
    parser.add_argument(
        "--peers", default="", help=f"comma-separated, of {', '.join(PEERS)}: SB3's VecEnvs beside them"
    )
    parser.add_argument("--peer", choices=PEERS, help=argparse.SUPPRESS)  # internal: the window's VecEnv
    args = parser.parse_args()
    if args.window:
        print(json.dumps(window(args.window, args.seconds, args.peer)))
        return
    from shmvec.bench import host

    wake_up_us = host.wake_up_us()  # the host's, printed beside the ratios
    print(host.describe(wake_up_us) + ".", flush=True)
    peers = [p for p in args.peers.split(",") if p]
    if set(peers) - set(PEERS) or (peers and set(args.workloads) - {"pong", "synth512"}):
        parser.error(f"--peers takes {', '.join(PEERS)}, with workloads pong and synth512 only")
    sides = [("old", args.old, args.python_old, None), ("new", args.new, args.python_new, None)]
    sides += [(p, args.new, args.python_new, p) for p in peers]
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.rounds):
        for workload in args.workloads:
            for side, path, python, peer in sides:
                env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                if path is not None:
                    env["PYTHONPATH"] = os.path.abspath(path)
                cmd = [python, __file__, "--window", workload, "--seconds", str(args.seconds)]
                out = subprocess.run(
                    cmd + (["--peer", peer] if peer else []), env=env, capture_output=True, text=True
                )
                if out.returncode != 0:
                    raise SystemExit(f"{side} {workload} failed:\n{out.stderr}")
                runs.setdefault((workload, side), []).append(json.loads(out.stdout.strip().splitlines()[-1]))
    for workload in args.workloads:
        for side, *_ in sides:
            first = runs[(workload, side)][0]
            if "native" in first:
                stack = f"{first['stack']}; " if "stack" in first else ""
                print(f"{workload} {side}: {stack}envs stepped: {first['native']}")
        steps = {side: [round(r["steps_per_s"]) for r in runs[(workload, side)]] for side, *_ in sides}
        print(f"{workload}: " + " ".join(f"{side} {per_round}" for side, per_round in steps.items()))
        new = runs[(workload, "new")]
        for base in [side for side, *_ in sides if side != "new"]:
            other = runs[(workload, base)]
            print(f"  new against {base}:")
            for key, label, unit in (
                ("steps_per_s", "env steps/s", ""),
                ("main_cpu_ms", "main CPU per batch step", " ms"),
                ("tree_cpu_us", "tree CPU per env step", " us"),
            ):
                med_old = statistics.median(r[key] for r in other)
                med_new = statistics.median(r[key] for r in new)
                ratios = [b[key] / a[key] for a, b in zip(other, new)]
                print(
                    f"    {label}: {med_old:.4g} -> {med_new:.4g}{unit}, new/{base} {med_new / med_old:.3f}; "
                    f"per round median {statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})"
                )


if __name__ == "__main__":
    main()
