"""Does the agent reach the same return sooner? PPO learning curves on a small pixel task, per VecEnv.

    python benchmarks/learning_curve.py --json benchmarks/results/learning_curve.json \\
        --markdown benchmarks/results/learning_curve.md --plot docs/img/learning_curve.png
    python benchmarks/learning_curve.py --from-json benchmarks/results/learning_curve.json \\
        --markdown benchmarks/results/learning_curve.md --plot docs/img/learning_curve.png
    python benchmarks/learning_curve.py --smoke --json /tmp/lc.json   # seconds: the tests run this
    python benchmarks/learning_curve.py --task stripes --codec raw,delta,jpeg:quality=50 --json /tmp/c.json

With ``--codec`` the configurations are ShmVecEnv with each codec in the training loop (``raw``: no
codec): ``shm+delta``, ``shm+jpeg:quality=50``, ... (lossy codecs with a tolerance that never
trips, so the agent trains on what the codec gives). ``--task stripes`` trains on
:class:`shmvec.synthetic.StripesEnv` instead, where faint 1-pixel stripes decide the reward: the
fine detail that lossy image codecs drop first (see its docstring). A lossless codec must give the raw run's parameters, bit for bit:
the script exits 1 if it does not.

The task is MiniGrid's ``MiniGrid-Empty-Random-6x6-v0`` seen as pixels (``RGBImgPartialObsWrapper``:
the agent's 7x7-cell view, 56x56x3 RGB): a random policy returns ~0.3, a trained one ~0.95, and PPO
with a CNN gets there in about 20,000 env steps, under a minute on 2 CPU cores, so several seeds of
every VecEnv fit in one sitting. Its step (~0.5 ms of Python rendering) is slow enough for the env
work to matter and fast enough for the VecEnv's overhead to show. (Atari would take hours per seed.)

Configurations, each with 8 envs and the same PPO hyperparameters (:data:`HP`, SB3's names) and
env steps: ``dummy``, ``subproc``, ``shm`` (SB3's PPO ``CnnPolicy`` on DummyVecEnv, SubprocVecEnv,
ShmVecEnv) and ``cleanrl`` (``examples/cleanrl_ppo_atari.py``'s loop, the same network, on
``ShmVectorEnv``). Each run has an interpreter of its own, seeds interleaved; wall-clock time counts
from just before the VecEnv is built. ``dummy`` and ``shm`` must see the same episodes (same seeds,
same parameters): the script exits 1 if they do not.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from codec_axis import codec_options, compact  # benchmarks/ is the script's path
from policy_loop import run_fresh

from shmvec.bench import curves

ROOT = Path(__file__).resolve().parents[1]
TASK = "MiniGrid-Empty-Random-6x6-v0"
CONFIGS = ("dummy", "subproc", "shm", "cleanrl")
TASK_NAMES = {"minigrid": TASK, "stripes": "StripesEnv"}
SHAPES = {TASK: "56x56x3", "StripesEnv": "36x36x3"}
LABELS = {
    "dummy": "SB3 PPO, DummyVecEnv",
    "subproc": "SB3 PPO, SubprocVecEnv",
    "shm": "SB3 PPO, ShmVecEnv",
    "cleanrl": "CleanRL PPO, ShmVectorEnv",
}
N_ENVS = 8
THRESHOLD = 0.9
TASKS = {TASK: THRESHOLD, "StripesEnv": 8.0}  # task -> return threshold
HP: dict[str, Any] = {
    "n_steps": 128,
    "batch_size": 256,
    "n_epochs": 4,
    "learning_rate": 2.5e-4,
    "clip_range": 0.2,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
    "gamma": 0.99,
    "gae_lambda": 0.95,
}


def _channels_first(obs: np.ndarray) -> np.ndarray:
    return np.transpose(obs, (2, 0, 1))


def minigrid_pixels(env_id: str = TASK, channels_first: bool = False) -> gym.Env:
    """A MiniGrid env whose observation is the agent's view as RGB pixels (56, 56, 3) uint8, or
    (3, 56, 56) with ``channels_first`` (CleanRL's network takes channels first; SB3 transposes
    images itself)."""
    import minigrid  # noqa: F401 - registers the MiniGrid ids
    from minigrid.wrappers import ImgObsWrapper, RGBImgPartialObsWrapper

    env = ImgObsWrapper(RGBImgPartialObsWrapper(gym.make(env_id)))
    if channels_first:
        h, w, c = env.observation_space.shape
        space = gym.spaces.Box(0, 255, (c, h, w), np.uint8)
        env = gym.wrappers.TransformObservation(env, _channels_first, space)
    return env


def _cleanrl_args(argv: list[str]) -> Any:
    path = ROOT / "examples" / "cleanrl_ppo_atari.py"
    spec = importlib.util.spec_from_file_location("cleanrl_ppo_atari", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, module.parse_args(argv)


def run_cleanrl(seed: int, steps: int, hp: dict[str, Any]) -> dict[str, Any]:
    """CleanRL's PPO loop (the example's) on ShmVectorEnv with ``hp`` in CleanRL's names. SB3's value
    loss is the plain mean squared error, CleanRL's half of it: ``--vf-coef`` is doubled to weigh
    it the same."""
    import torch
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    from shmvec import ShmVectorEnv

    example, args = _cleanrl_args(
        [
            *("--seed", str(seed), "--total-timesteps", str(steps), "--num-envs", str(N_ENVS)),
            *("--num-steps", str(hp["n_steps"]), "--update-epochs", str(hp["n_epochs"])),
            *("--num-minibatches", str(hp["n_steps"] * N_ENVS // hp["batch_size"])),
            *("--learning-rate", str(hp["learning_rate"]), "--no-anneal-lr"),
            *("--clip-coef", str(hp["clip_range"]), "--ent-coef", str(hp["ent_coef"])),
            *("--vf-coef", str(2 * hp["vf_coef"]), "--max-grad-norm", str(hp["max_grad_norm"])),
            *("--gamma", str(hp["gamma"]), "--gae-lambda", str(hp["gae_lambda"])),
            *("--torch-threads", str(torch.get_num_threads())),  # SB3 keeps torch's default
        ]
    )
    episodes: list[curves.Episode] = []
    start = time.perf_counter()
    fn = functools.partial(minigrid_pixels, TASK, channels_first=True)
    envs = RecordEpisodeStatistics(ShmVectorEnv([fn] * N_ENVS, autoreset_mode="same_step"))
    try:
        example.train(envs, args, lambda step, ret: episodes.append((time.perf_counter() - start, step, ret)))
    finally:
        envs.close()
    return {"wall_s": time.perf_counter() - start, "episodes": episodes}


class _TreeCpu:
    """CPU seconds of this process and its descendants (the VecEnv's workers, a forkserver's
    children too), sampled every 0.2 s while the run lasts: a worker that exits is counted up to its
    last sample. With the machine's busy time it gives what other processes took meanwhile."""

    def __init__(self) -> None:
        import psutil

        self._me = psutil.Process()
        self._seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        import psutil

        for proc in [self._me, *self._me.children(recursive=True)]:
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            self._seen[proc.pid] = times.user + times.system

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def stop(self) -> float:
        """Stop sampling; the CPU seconds of the tree."""
        self._stop.set()
        self._thread.join()
        self._sample()
        return sum(self._seen.values())


def run_measured(config: str, seed: int, steps: int, hp: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """:func:`run_one`, and the cores that processes other than this run kept busy meanwhile (a run
    on a shared machine is slower for them; the table shows it)."""
    from shmvec.bench.system import cpu_snapshot

    start, busy = time.perf_counter(), cpu_snapshot([]).machine_busy_s
    tree = _TreeCpu()
    out = run_one(config, seed, steps, hp, **kwargs)
    ours = tree.stop()
    wall = time.perf_counter() - start
    out["others_cores"] = max(0.0, (cpu_snapshot([]).machine_busy_s - busy - ours) / wall)
    return out


def task_env(task: str) -> Any:
    """The env factory of a task (its name in :data:`TASKS`)."""
    if task == TASK:
        return functools.partial(minigrid_pixels, TASK)
    from shmvec.synthetic import StripesEnv

    return StripesEnv


def run_one(
    config: str, seed: int, steps: int, hp: dict[str, Any], task: str = TASK, save: str | None = None
) -> dict[str, Any]:
    """One training run (in this interpreter): its wall time and episodes; the model saved to
    ``save`` (a .zip path) when given."""
    if config == "cleanrl":
        return run_cleanrl(seed, steps, hp)
    from shmvec.bench.train import train_one

    backend = "shm" if config.startswith("shm+") else config
    run, model = train_one(
        task_env(task), backend, "ppo", "CnnPolicy", N_ENVS, steps, seed, hp, options=codec_options(config)
    )
    if save:
        model.save(save)
    return {"wall_s": run.wall_s, "episodes": run.curve, "params_sha256": run.params_sha256}


def _runs(result: dict[str, Any]) -> dict[str, list[list[curves.Episode]]]:
    out: dict[str, list[list[curves.Episode]]] = {}
    for r in result["runs"]:
        out.setdefault(r["config"], []).append([tuple(e) for e in r["episodes"]])  # type: ignore[misc]
    return out


def window(result: dict[str, Any]) -> int:
    """Entries per point of a curve: :data:`curves.WINDOW` episodes, in chunks after :func:`compact`."""
    return max(1, curves.WINDOW // result.get("episode_chunk", 1))


def problems(result: dict[str, Any]) -> list[str]:
    """``dummy`` and ``shm`` runs of a seed whose episodes (env steps, return) differ, and lossless
    codec runs whose parameters differ from the raw ``shm`` run's of the same seed."""
    from shmvec.codecs import parse

    seen: dict[tuple[str, int], list] = {
        (r["config"], r["seed"]): [(e[1], e[2]) for e in r["episodes"]] for r in result["runs"]
    }
    found = [
        f"seed {seed}: shm's episodes differ from dummy's"
        for seed in result["seeds"]
        if ("shm", seed) in seen and ("dummy", seed) in seen and seen["shm", seed] != seen["dummy", seed]
    ]
    params = {(r["config"], r["seed"]): r.get("params_sha256") for r in result["runs"]}
    for (config, seed), digest in params.items():
        lossless = config.startswith("shm+") and parse(config[len("shm+") :]).lossless
        if lossless and ("shm", seed) in params and digest != params["shm", seed]:
            found.append(f"seed {seed}: {config}'s parameters differ from raw shm's (a lossless codec)")
    return found


def codec_axis(result: dict[str, Any]) -> bool:
    """Whether the runs compare codecs (``--codec``) rather than VecEnvs."""
    return "codecs" in result or any(r["config"].startswith("shm+") for r in result["runs"])


def label(config: str, codecs: bool = False) -> str:
    """The legend's and the table's name of a configuration (``codecs``: on the codec axis)."""
    if config.startswith("shm+"):
        return f"codec {config[len('shm+') :]}"
    return "codec raw (none)" if config == "shm" and codecs else LABELS.get(config, config)


def markdown(result: dict[str, Any]) -> str:
    """The table under the plot: per configuration, the time to the threshold and the whole run."""
    threshold, codecs = result["threshold"], codec_axis(result)
    chunk = result.get("episode_chunk", 1)
    n = window(result)
    chunks = f" (as {n} mean{'s' if n > 1 else ''} of {chunk})" if chunk > 1 else ""
    lines = [
        f"| configuration | return >= {threshold:g} after: seconds | env steps | whole run, s | "
        "final return | others' CPU, cores |",
        "|---|---|---|---|---|---|",
    ]
    for config, runs in _runs(result).items():
        reached = curves.reached(runs, threshold, window(result))
        walls = [r["wall_s"] for r in result["runs"] if r["config"] == config]
        finals = [statistics.fmean(e[2] for e in run[-window(result) :]) for run in runs if run]
        others = [r["others_cores"] for r in result["runs"] if r["config"] == config and "others_cores" in r]

        def spread(xs: list[float], fmt: str) -> str:
            return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})" if xs else "-"

        missed = f", {reached.missed} seeds missed" if reached.missed else ""
        lines.append(
            f"| {label(config, codecs)} | {spread(reached.seconds, '.1f')}{missed} | "
            f"{spread([float(s) for s in reached.steps], ',.0f')} | {spread(walls, '.1f')} | "
            f"{spread(finals, '.2f')} | {spread(others, '.1f')} |"
        )
    lines.append("")
    lines.append(
        f"{result['task']} as {SHAPES[result['task']]} pixels, {N_ENVS} envs, {result['steps']:,} env steps per run, seeds "
        f"{', '.join(map(str, sorted({r['seed'] for r in result['runs']})))}, {result['cpus']} CPUs; medians over seeds "
        f"(min-max). Return: the mean of the last {curves.WINDOW} episodes{chunks}. Others' CPU: cores that "
        "processes other than the run kept busy meanwhile (- where not measured)."
    )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30_000, help="env steps per run")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {CONFIGS}")
    parser.add_argument("--smoke", action="store_true", help="2,048 steps, seed 0, small rollouts")
    parser.add_argument("--json", type=Path, help="write every run's episodes here")
    parser.add_argument("--from-json", type=Path, help="measure nothing: report from this JSON")
    parser.add_argument("--markdown", type=Path, help="write the results table here")
    parser.add_argument("--plot", type=Path, help="write the learning curves here (PNG)")
    parser.add_argument("--task", default="minigrid", choices=sorted(TASK_NAMES), help="what to learn")
    parser.add_argument(
        "--codec",
        help="comma-separated codecs in ShmVecEnv's training loop (raw, delta, jpeg:quality=75, ...): "
        "the configurations, instead of --configs",
    )
    parser.add_argument(
        "--save-models", type=Path, help="save each trained model here (TASK_CONFIG_SEED.zip)"
    )
    parser.add_argument(
        "--chunk",
        type=int,
        default=1,
        help="with --from-json and --json: write episodes merged N by N (compact)",
    )
    parser.add_argument("--one", nargs=2, metavar=("CONFIG", "SEED"), help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    args = parser.parse_args()
    hp = dict(HP)
    if args.smoke:
        args.steps, args.seeds = 2048, "0"
        hp.update(n_steps=32, batch_size=64, n_epochs=1)
    task = TASK_NAMES[args.task]
    if args.one:
        out = run_measured(args.one[0], int(args.one[1]), args.steps, hp, task=task, save=args.save)
        print(json.dumps(out))
        return 0
    if args.from_json:
        result = json.loads(args.from_json.read_text())
        if args.json:
            result = compact(result, args.chunk) if args.chunk > 1 else result
            args.json.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    else:
        from shmvec.engine.groups import usable_cpus

        seeds = [int(s) for s in args.seeds.split(",")]
        configs = [c for c in args.configs.split(",") if c]
        if args.codec:
            configs = ["shm" if c == "raw" else f"shm+{c}" for c in args.codec.split(",") if c]
        if task != TASK and "cleanrl" in configs:
            parser.error("cleanrl runs MiniGrid only: leave it out of --configs with --task stripes")
        result = {"task": task, "steps": args.steps, "seeds": seeds, "hp": hp, "n_envs": N_ENVS}
        result |= {"threshold": TASKS[task], "cpus": usable_cpus(), "runs": []}
        if args.codec:
            result["codecs"] = args.codec.split(",")
        for k, seed in enumerate(seeds):
            # The order turns with each seed, so no configuration always runs first.
            for config in configs[k % len(configs) :] + configs[: k % len(configs)]:
                argv = ["--one", config, str(seed), "--steps", str(args.steps), "--task", args.task]
                if args.save_models:
                    args.save_models.mkdir(parents=True, exist_ok=True)
                    argv += ["--save", str(args.save_models / f"{args.task}_{config}_{seed}.zip")]
                run = run_fresh(__file__, argv + (["--smoke"] if args.smoke else []))
                result["runs"].append({"config": config, "seed": seed, **run})
                print(f"seed {seed} {config}: {run['wall_s']:.1f} s", file=sys.stderr, flush=True)
                if args.json:  # after every run: an interrupted session keeps what it measured
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    args.json.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    table = markdown(result)
    print(table, end="")
    if args.markdown:
        args.markdown.write_text(table)
    if args.plot:
        title = f"PPO on {result['task']} (pixels), {N_ENVS} envs, {result['cpus']} CPUs"
        curves.plot(
            _runs(result),
            args.plot,
            title,
            result["threshold"],
            window(result),
            labels=lambda c: label(c, codec_axis(result)),
        )
    found = problems(result)
    for p in found:
        print(f"PROBLEM: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":  # workers started by forkserver re-import this file
    sys.exit(main())
