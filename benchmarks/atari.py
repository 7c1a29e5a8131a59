"""SB3's Atari recipe through shmvec and its peers: env steps/s and CPU per env step, side by side.

    python benchmarks/atari.py                                  # Pong and MsPacman, n=8, 3 rounds
    python benchmarks/atari.py --games pong --n 4,8,16,32 --json benchmarks/results/atari.json
    python benchmarks/atari.py --from-json benchmarks/results/atari.json --markdown

Every configuration gives 84x84 gray frames, 4 emulator frames per action, 4 frames stacked, random
actions (the same presampled ones for all), and is measured in an interpreter of its own, rounds
interleaved: ``--seconds`` of steps after ``--warm-up`` batch steps. "CPU" is the CPU time of the
whole process tree (the main process with its threads, and every worker) over the timed steps,
per env step: what the machine pays, which other load on it barely moves.

Configurations (``--configs``):

- ``shm-stack``: ``make_atari_env(..., vec_env_cls=ShmVecEnv, vec_env_kwargs={"frame_stack": 4})``;
- ``shm``: ``VecFrameStack(make_atari_env(..., vec_env_cls=ShmVecEnv), 4)``, the README's form;
- ``shm-wrappers``: ``shm-stack`` with ``native_step=False`` (every frame through SB3's wrappers);
- ``dummy`` / ``subproc``: ``VecFrameStack`` over SB3's ``DummyVecEnv`` / ``SubprocVecEnv``;
- ``ale-vec``: ``ale_py.AtariVectorEnv`` (C++ threads, in the ``atari`` extra), SB3-like settings
  (no-op starts, episodic life, fire reset, clipped rewards); ``ale-vec-async``: the same with
  ``batch_size = n / 2``, stepped with ``send``/``recv``;
- ``envpool``: EnvPool's ``<Game>-v5`` with the same settings, where EnvPool installs;
- ``floor``: the emulator alone, ``ale.act`` 4 times per env step in one process (no observation).

Neither ALE's vector env nor EnvPool is SB3's recipe (they max-pool gray frames, and handle resets
and lives their own way): docs/atari.md says what differs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

CONFIGS = (
    "ale-vec",
    "ale-vec-async",
    "envpool",
    "shm-stack",
    "shm",
    "shm-wrappers",
    "dummy",
    "subproc",
    "floor",
)
DEFAULT_CONFIGS = ("ale-vec", "envpool", "shm-stack", "shm", "dummy", "subproc", "floor")


def _title(game: str) -> str:
    return "".join(part.capitalize() for part in game.split("_"))


class _Sb3:
    """An SB3 VecEnv behind ``step(actions)``."""

    def __init__(self, config: str, game: str, n: int) -> None:
        import ale_py
        import gymnasium as gym
        from stable_baselines3.common.env_util import make_atari_env
        from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack

        from shmvec import ShmVecEnv

        gym.register_envs(ale_py)
        cls: Any = {"dummy": DummyVecEnv, "subproc": SubprocVecEnv}.get(config, ShmVecEnv)
        kwargs: dict[str, Any] = {} if config == "dummy" else {"start_method": "fork"}
        if config in ("shm-stack", "shm-wrappers"):
            kwargs["frame_stack"] = 4
        if config == "shm-wrappers":
            kwargs["native_step"] = False
        venv = make_atari_env(
            f"{_title(game)}NoFrameskip-v4", n, seed=0, vec_env_cls=cls, vec_env_kwargs=kwargs
        )
        self.venv = venv if "frame_stack" in kwargs else VecFrameStack(venv, 4)
        self.n_actions = int(self.venv.action_space.n)
        self.venv.reset()

    def step(self, actions: np.ndarray) -> None:
        self.venv.step(actions)

    def close(self) -> None:
        self.venv.close()


class _AleVec:
    """``ale_py.AtariVectorEnv`` (or EnvPool) behind ``step(actions)``; async: half the envs per batch."""

    SETTINGS = dict(noop_max=30, episodic_life=True, use_fire_reset=True, reward_clipping=True)

    def __init__(self, config: str, game: str, n: int) -> None:
        if config == "envpool":
            import envpool

            self.env = envpool.make_gymnasium(
                f"{_title(game)}-v5", num_envs=n, batch_size=n, episodic_life=True, reward_clip=True,
                repeat_action_probability=0.0, noop_max=30, use_fire_reset=True, seed=0,
            )  # fmt: skip
        else:
            from ale_py.vector_env import AtariVectorEnv

            batch = n // 2 if config == "ale-vec-async" else 0
            self.env = AtariVectorEnv(game, n, batch_size=batch, **self.SETTINGS)  # type: ignore[arg-type]
        self.batch = getattr(self.env, "batch_size", n) if config == "ale-vec-async" else n
        self.n_actions = int(self.env.single_action_space.n)
        self.env.reset(seed=0)
        if config == "ale-vec-async":
            self.env.send(np.zeros(n, np.int64))
        self.async_ = config == "ale-vec-async"

    def step(self, actions: np.ndarray) -> None:
        if self.async_:
            _, _, _, _, info = self.env.recv()
            self.env.send(actions[: self.batch], info["env_id"])
        else:
            self.env.step(actions)

    def close(self) -> None:
        self.env.close()


class _Floor:
    """The emulator alone: 4 ``ale.act`` per env step, ``n`` envs in turn in this process."""

    def __init__(self, config: str, game: str, n: int) -> None:
        import ale_py
        from ale_py import roms

        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
        self.ales = []
        for i in range(n):
            ale = ale_py.ALEInterface()
            ale.setInt("random_seed", i)
            ale.loadROM(roms.get_rom_path(game))
            self.ales.append(ale)
        self.actions = self.ales[0].getMinimalActionSet()
        self.n_actions = len(self.actions)

    def step(self, actions: np.ndarray) -> None:
        for ale, a in zip(self.ales, actions.tolist()):
            action = self.actions[a]
            for _ in range(4):
                ale.act(action, 1.0)
            if ale.game_over():
                ale.reset_game()

    def close(self) -> None:
        pass


def _tree_cpu() -> float:
    """CPU seconds (user + system) of this process and its live descendants so far."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def measure(config: str, game: str, n: int, seconds: float, warm_up: int) -> dict[str, float]:
    """One configuration in this interpreter: env steps/s and CPU µs per env step."""
    kind = (
        _Floor
        if config == "floor"
        else _AleVec
        if config in ("ale-vec", "ale-vec-async", "envpool")
        else _Sb3
    )
    env = kind(config, game, n)  # type: ignore[operator]
    try:
        rng = np.random.default_rng(0)
        actions = rng.integers(0, env.n_actions, (4096, n))
        batch = getattr(env, "batch", n)
        for t in range(warm_up):
            env.step(actions[t % 4096])
        steps, cpu, start = 0, _tree_cpu(), time.perf_counter()
        while time.perf_counter() - start < seconds:
            env.step(actions[steps % 4096])
            steps += 1
        wall, cpu = time.perf_counter() - start, _tree_cpu() - cpu
    finally:
        env.close()
    return {"steps_per_s": steps * batch / wall, "cpu_us": cpu / (steps * batch) * 1e6}


def _ratios(rows: dict[str, list[dict[str, float]]], base: str, key: str) -> dict[str, list[float]]:
    """Per configuration: its figure over ``base``'s in each round (runs of a round are side by side)."""
    if base not in rows:
        return {}
    return {c: [a[key] / b[key] for a, b in zip(runs, rows[base])] for c, runs in rows.items()}


def markdown(result: dict[str, Any]) -> str:
    """The tables of a run (one per game and n), with each figure's median and range over rounds."""
    out = []
    for table in result["tables"]:
        rows = table["rows"]
        speed = _ratios(rows, "ale-vec", "steps_per_s")
        cpu = _ratios(rows, "ale-vec", "cpu_us")
        out.append(f"\n**{table['game']}, n={table['n']}** ({len(next(iter(rows.values())))} rounds)\n")
        out.append("| VecEnv | env steps/s | x ale-vec | CPU µs per env step | x ale-vec |")
        out.append("|---|---|---|---|---|")
        for config, runs in rows.items():
            cells = []
            for key, ratio in (("steps_per_s", speed), ("cpu_us", cpu)):
                values = [r[key] for r in runs]
                cells.append(f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})")
                if config in ratio:
                    rs = ratio[config]
                    cells.append(f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})")
                else:
                    cells.append("")
            out.append(f"| {config} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", default="pong,ms_pacman", help="ALE ROM ids, comma-separated")
    parser.add_argument("--n", default="8", help="numbers of envs, comma-separated")
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--warm-up", type=int, default=100, help="batch steps before the timed ones")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--from-json", help="read results from here instead of measuring")
    parser.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        config, game, n = json.loads(args.one)
        print(json.dumps(measure(config, game, n, args.seconds, args.warm_up)))
        return
    if args.from_json:
        with open(args.from_json) as f:
            print(markdown(json.load(f)))
        return
    configs = args.configs.split(",")
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configurations {sorted(unknown)}; choose from {', '.join(CONFIGS)}")
    tables = [
        {"game": g, "n": int(n), "rows": {c: [] for c in configs}}
        for g in args.games.split(",")
        for n in args.n.split(",")
    ]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for r in range(args.rounds):
        for table in tables:
            for config in configs:
                one = json.dumps([config, table["game"], table["n"]])
                argv = ["--one", one, "--seconds", str(args.seconds), "--warm-up", str(args.warm_up)]
                done = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{one} failed:\n{done.stderr[-3000:]}")
                table["rows"][config].append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    result = {"started": started, "seconds": args.seconds, "tables": tables}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(markdown(result))


if __name__ == "__main__":
    main()
