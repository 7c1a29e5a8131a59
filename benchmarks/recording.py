"""What recording costs on SB3's Atari recipe (n=8, random actions): env steps/s with no recording,
with shmvec's video recording, with SB3's VecVideoRecorder over ShmVecEnv and over SubprocVecEnv
(same trigger), and with a Minari dataset recorded by shmvec or by Minari's DataCollector over a
SyncVectorEnv loop. Configurations interleaved round by round; ratios to the baseline of the same
round, median and range over rounds.

    python benchmarks/recording.py                              # every random-action configuration, 3 rounds
    python benchmarks/recording.py --configs shm,shm-video,sb3-video-shm --rounds 5
    python benchmarks/recording.py --steps 5000 --every 5000 --length 500   # same duty cycle, shorter
    python benchmarks/recording.py --configs ppo,ppo-video,ppo-dataset --steps 4096 --every 4096 --length 400

PPO in the loop (``ppo*``, not in the default): SB3's PPO (CnnPolicy, rl-zoo3's Atari
hyperparameters, seed 0, torch's default threads) learning for ``--steps`` vector steps on the
recipe with ``frame_stack=4``, without recording, with shmvec's video of env 0 (same trigger) or with
a dataset of all 8 envs (frame stacks, lossless): env steps/s and CPU over ``learn()``, and the mean
return of the last 100 episodes, which must be the same in all three (same seeds).

Video: one clip of ``--length`` steps every ``--every`` steps (default 10,000 and 1,000: the issue's
target), env 0 alone for shmvec (SB3's recorder tiles all 8, as it always does), H.264. Datasets:
every env, raw arrays (lossless), the recipe without frame stacking (84x84x1, the observation
DataCollector can take), written under a temporary MINARI_DATASETS_PATH that is removed after each
run; finishing the dataset counts in the time. Each run in a fresh interpreter. Each round also
measures the host's wake-up cost (shmvec.bench.host: a pipe round trip between two processes on two
CPUs), printed beside.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from shmvec.bench import host

GAME = "PongNoFrameskip-v4"
N = 8
CONFIGS = {
    "shm": "ShmVecEnv(frame_stack=4), no recording",
    "shm-video": "ShmVecEnv(frame_stack=4) + shmvec.recording.VecVideoRecorder(env_ids=[0])",
    "sb3-video-shm": "ShmVecEnv(frame_stack=4) + SB3's VecVideoRecorder",
    "subproc": "VecFrameStack(SubprocVecEnv, 4), no recording",
    "sb3-video-subproc": "VecFrameStack(SubprocVecEnv, 4) + SB3's VecVideoRecorder",
    "shm-raw": "ShmVecEnv (no frame stack), no recording: the dataset baseline",
    "shm-dataset": "ShmVecEnv (no frame stack) + shmvec.recording.record_dataset (all 8, lossless)",
    "minari": "SyncVectorEnv of Minari DataCollectors (no frame stack, jpeg_encoding=False)",
    "ppo": "SB3 PPO CnnPolicy learning on ShmVecEnv(frame_stack=4), no recording",
    "ppo-video": "the same PPO + shmvec.recording.VecVideoRecorder(env_ids=[0])",
    "ppo-dataset": "the same PPO + shmvec.recording.record_dataset (all 8, frame stacks, lossless)",
}
#: The PPO configurations (a separate run: ``--configs ppo,ppo-video,ppo-dataset``).
PPO = ("ppo", "ppo-video", "ppo-dataset")
BASE = {
    "shm-video": "shm",
    "sb3-video-shm": "shm",
    "sb3-video-subproc": "subproc",
    "shm-dataset": "shm-raw",
    "minari": "shm-raw",
    "ppo-video": "ppo",
    "ppo-dataset": "ppo",
}


def tree_cpu() -> float:
    """CPU seconds (user + system) of this process, its live children and the children it has waited
    for (the dataset's side process, once joined), threads included."""
    import resource

    import psutil

    me = psutil.Process()
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = waited.ru_utime + waited.ru_stime
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def learn(config: str, steps: int, every: int, length: int, work: str) -> tuple[float, float, float]:
    """PPO in the loop: SB3's PPO (CnnPolicy, rl-zoo3's Atari hyperparameters, seed 0) learning for
    ``steps`` vector steps on the recipe, without or with a recording: env steps/s and CPU µs per
    env step over ``learn()`` (the dataset's finish included), and the mean return of the last 100
    episodes (the same in every configuration: recording changes nothing the agent sees)."""
    import ale_py
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.env_util import make_atari_env

    from shmvec import ShmVecEnv
    from shmvec.bench.train import ATARI_PPO

    gym.register_envs(ale_py)
    torch.manual_seed(0)
    os.environ["MINARI_DATASETS_PATH"] = work
    venv: Any = make_atari_env(
        GAME, n_envs=N, seed=0, env_kwargs={"render_mode": "rgb_array"}, vec_env_cls=ShmVecEnv,
        vec_env_kwargs={"start_method": "fork", "frame_stack": 4},
    )  # fmt: skip
    recording: Any = None
    if config == "ppo-video":
        from shmvec.recording import VecVideoRecorder

        venv = VecVideoRecorder(venv, work, lambda step: step % every == 0, video_length=length, env_ids=[0])
    elif config == "ppo-dataset":
        from shmvec.recording import record_dataset

        recording = record_dataset(venv, "bench/ppo-v0")
    model = SB3PPO("CnnPolicy", venv, seed=0, device="cpu", **ATARI_PPO)
    cpu, start = tree_cpu(), time.perf_counter()
    model.learn(total_timesteps=steps * N)
    if recording is not None:
        recording.finish()
    elapsed, cpu = time.perf_counter() - start, tree_cpu() - cpu
    returns = [info["r"] for info in model.ep_info_buffer]
    venv.close()
    if config == "ppo-video" and len(venv.recorder.written) < 1:
        sys.exit(f"ppo-video: no clip written whole ({venv.recorder.incomplete})")
    done = model.num_timesteps
    return done / elapsed, cpu / done * 1e6, sum(returns) / max(len(returns), 1)


def run(config: str, steps: int, every: int, length: int, work: str) -> tuple[float, ...]:
    """Env steps/s of one configuration (in this interpreter), and the CPU µs per env step of its
    process tree (less sensitive than throughput to what else runs on the machine); videos and
    datasets go to ``work``."""
    if config in PPO:
        return learn(config, steps, every, length, work)
    import ale_py
    import gymnasium as gym
    import numpy as np
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import SubprocVecEnv, VecFrameStack
    from stable_baselines3.common.vec_env import VecVideoRecorder as SB3Recorder

    from shmvec import ShmVecEnv

    gym.register_envs(ale_py)
    os.environ["MINARI_DATASETS_PATH"] = work
    kwargs: dict[str, Any] = {"n_envs": N, "seed": 0, "env_kwargs": {"render_mode": "rgb_array"}}
    trigger = lambda step: step % every == 0  # noqa: E731
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 6, (steps, N))
    recording: Any = None
    if config == "minari":
        import minari
        from stable_baselines3.common.atari_wrappers import AtariWrapper

        def collector() -> gym.Env:
            return minari.DataCollector(AtariWrapper(gym.make(GAME)), jpeg_encoding=False)

        env = gym.vector.SyncVectorEnv([collector] * N, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        env.reset(seed=0)
        cpu, start = tree_cpu(), time.perf_counter()
        for t in range(steps):
            env.step(actions[t])
        for i, one in enumerate(env.envs):
            one.create_dataset(f"bench/minari-{i}-v0")
        elapsed, cpu = time.perf_counter() - start, tree_cpu() - cpu
        env.close()
        return steps * N / elapsed, cpu / (steps * N) * 1e6
    if config.startswith("shm") or config == "sb3-video-shm":
        options: dict[str, Any] = {"start_method": "fork"}  # the workers have ale-py registered
        if config not in ("shm-raw", "shm-dataset"):
            options["frame_stack"] = 4
        venv = make_atari_env(GAME, vec_env_cls=ShmVecEnv, vec_env_kwargs=options, **kwargs)
    else:
        fork = {"start_method": "fork"}
        venv = VecFrameStack(
            make_atari_env(GAME, vec_env_cls=SubprocVecEnv, vec_env_kwargs=fork, **kwargs), 4
        )
    if config == "shm-video":
        from shmvec.recording import VecVideoRecorder

        venv = VecVideoRecorder(venv, work, trigger, video_length=length, env_ids=[0])
    elif config.startswith("sb3-video"):
        import moviepy  # noqa: F401

        venv = SB3Recorder(venv, work, trigger, video_length=length)
    elif config == "shm-dataset":
        from shmvec.recording import record_dataset

        recording = record_dataset(venv, "bench/shmvec-v0")
    venv.reset()
    cpu, start = tree_cpu(), time.perf_counter()
    for t in range(steps):
        venv.step(actions[t])
    if recording is not None:
        recording.finish()
    elapsed, cpu = time.perf_counter() - start, tree_cpu() - cpu
    venv.close()
    if config == "shm-video" and steps > length and len(venv.recorder.written) != 1:
        sys.exit(f"shm-video: the clip was not written whole ({venv.recorder.incomplete})")
    return steps * N / elapsed, cpu / (steps * N) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default = ",".join(c for c in CONFIGS if c not in PPO)
    parser.add_argument("--configs", default=default, help=f"of {', '.join(CONFIGS)} (default: all but ppo*)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10_000, help="vector steps per run (default 10,000)")
    parser.add_argument("--every", type=int, default=10_000, help="a clip every this many steps")
    parser.add_argument("--length", type=int, default=1_000, help="steps per clip")
    parser.add_argument("--json", help="write the samples here")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        work = tempfile.mkdtemp(prefix="shmvec-rec-")
        try:
            print(json.dumps(run(args.one, args.steps, args.every, args.length, work)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    configs = args.configs.split(",")
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configs {sorted(unknown)}")
    samples: dict[str, list[float]] = {c: [] for c in configs}
    cpus: dict[str, list[float]] = {c: [] for c in configs}
    trips: list[float] = []
    returns: dict[str, list[float]] = {}  # PPO's, per round
    for r in range(args.rounds):
        trips.append(host.wake_up_us())  # the host's, beside the ratios
        print(f"round {r + 1}: {host.describe(trips[-1])}", flush=True)
        for config in configs:
            cmd = [sys.executable, __file__, "--one", config, "--steps", str(args.steps)]
            cmd += ["--every", str(args.every), "--length", str(args.length)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rate, cpu, *ret = json.loads(out.strip().splitlines()[-1])
            samples[config].append(rate)
            cpus[config].append(cpu)
            if ret:
                returns.setdefault(config, []).extend(ret)
            said = f", mean return {ret[0]:.2f}" if ret else ""
            print(
                f"round {r + 1}: {config:18s} {rate:8.0f} env steps/s {cpu:7.1f} µs CPU per env step{said}",
                flush=True,
            )
    print(f"\n{GAME}, n={N}, {args.steps} steps per run, clip of {args.length} every {args.every}")
    print(f"host: pipe round trip {statistics.median(trips):.0f} µs ({min(trips):.0f}-{max(trips):.0f})")
    for config in configs:
        s = samples[config]
        line = f"{config:18s} {statistics.median(s):8.0f} ({min(s):.0f}-{max(s):.0f}) env steps/s"
        base = BASE.get(config)
        if base in samples:
            ratios = [a / b for a, b in zip(s, samples[base])]
            line += f"  = {statistics.median(ratios):.3f}x {base} ({min(ratios):.3f}-{max(ratios):.3f})"
        if config == "shm-dataset" and "minari" in samples:
            ratios = [a / b for a, b in zip(s, samples["minari"])]
            line += f"; {statistics.median(ratios):.2f}x minari ({min(ratios):.2f}-{max(ratios):.2f})"
        c = cpus[config]
        line += f"; CPU {statistics.median(c):.1f} µs/env step ({min(c):.1f}-{max(c):.1f})"
        if base in cpus:
            ratios = [a / b for a, b in zip(c, cpus[base])]
            line += f" = {statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})"
        if config in returns:
            line += f"; mean return {', '.join(f'{x:.2f}' for x in returns[config])}"
        print(line + f"   [{CONFIGS[config]}]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "args": vars(args),
                    "samples": samples,
                    "cpu_us": cpus,
                    "returns": returns,
                    "round_trip_us": trips,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
