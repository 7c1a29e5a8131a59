"""SB3's Atari recipe through shmvec and its peers: env steps/s and CPU per env step, side by side.

    python benchmarks/atari.py                                  # Pong and MsPacman, n=8, 3 rounds
    python benchmarks/atari.py --games pong --n 4,8,16,32 --json benchmarks/results/atari.json
    python benchmarks/atari.py --from-json benchmarks/results/atari.json --markdown

Every configuration gives 84x84 gray frames, 4 emulator frames per action, 4 frames stacked, random
actions (the same presampled ones for all), and is measured in an interpreter of its own, rounds
interleaved: ``--seconds`` of steps after ``--warm-up`` batch steps. "CPU" is the CPU time of the
whole process tree (the main process with its threads, and every worker) over the timed steps,
per env step: what the machine pays, which other load on it barely moves.

Configurations (``--configs``), built by ``shmvec.bench`` as ``shmvec bench --recipe sb3-atari``
builds its backends (``shmvec.bench.recipes``: each env is ``make_atari_env``'s, Monitor +
AtariWrapper over ``<Game>NoFrameskip-v4``; ``tests/test_bench_recipe.py`` checks they are equal):

- ``shm-stack``: ``make_atari_env(..., vec_env_cls=ShmVecEnv, vec_env_kwargs={"frame_stack": 4})``
  (``shmvec bench``'s ``shm``);
- ``shm``: ``VecFrameStack(make_atari_env(..., vec_env_cls=ShmVecEnv), 4)``, the README's form;
- ``shm-wrappers``: ``shm-stack`` with ``native_step=False`` (every frame through SB3's wrappers);
- ``shm-sleep``: ``shm-stack`` with ``worker_spin_us=0`` (workers sleep at once between steps; a
  bench backend registered here, as ``register_backend`` adds one);
- ``dummy`` / ``subproc``: ``VecFrameStack`` over SB3's ``DummyVecEnv`` / ``SubprocVecEnv``;
- ``ale-vec``: ``ale_py.AtariVectorEnv`` (C++ threads, in the ``atari`` extra), SB3-like settings
  (84x84 gray, frame skip 4, 4 stacked, up to 30 no-ops, episodic life, fire reset, clipped
  rewards, no sticky actions); ``ale-vec-async``: the same with ``batch_size = n / 2``, stepped with
  ``send``/``recv``;
- ``envpool``: EnvPool's ``<Game>-v5`` with the same settings, where EnvPool installs;
- ``floor``: the emulator alone, ``ale.act`` 4 times per env step in one process (no observation).

Neither ALE's vector env nor EnvPool is SB3's recipe (they max-pool gray frames, and handle resets
and lives their own way): ``shmvec.bench.recipes`` and docs/atari.md say what differs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
from policy_loop import config_list, run_fresh  # benchmarks/ is the script's path

CONFIGS = (
    "ale-vec",
    "ale-vec-async",
    "envpool",
    "shm-stack",
    "shm-sleep",
    "shm",
    "shm-wrappers",
    "dummy",
    "subproc",
    "floor",
)
DEFAULT_CONFIGS = ("ale-vec", "envpool", "shm-stack", "shm", "dummy", "subproc", "floor")


def _title(game: str) -> str:
    return "".join(part.capitalize() for part in game.split("_"))


# The bench backend (shmvec.bench.backends) of each configuration but floor.
_BACKENDS = {"shm-stack": "shm", "shm": "shm"} | {c: c for c in CONFIGS if c not in ("shm-stack", "shm")}


def _shm_sleep(
    env_fns: list, n_workers: int | None, start_method: str, frame_stack: int | None = None
) -> Any:
    from shmvec import ShmVecEnv

    return ShmVecEnv(
        env_fns, start_method=start_method, n_workers=n_workers, frame_stack=frame_stack, worker_spin_us=0
    )


class _Vec:
    """One bench backend over the recipe's factories (``shmvec.bench.recipes``), behind ``step``."""

    def __init__(self, config: str, game: str, n: int) -> None:
        from shmvec.bench.backends import backend_names, make_vec_env, register_backend
        from shmvec.bench.recipes import recipe_env

        if "shm-sleep" not in backend_names():
            register_backend("shm-sleep", _shm_sleep, True, "ShmVecEnv(worker_spin_us=0)", "builder")

        env_fn, stack = recipe_env("sb3-atari", f"{_title(game)}NoFrameskip-v4")
        fns = [env_fn] * n
        if config == "shm":  # the README's form: SB3's VecFrameStack over ShmVecEnv
            from stable_baselines3.common.vec_env import VecFrameStack

            self.venv = VecFrameStack(make_vec_env("shm", fns, start_method="fork"), stack)
        else:  # ale-vec-async: half the envs a batch
            self.venv = make_vec_env(
                _BACKENDS[config], fns, None, "fork", batch_size=n // 2, frame_stack=stack
            )
        self.batch = self.venv.num_envs  # envs stepped per batch step
        self.n_actions = int(self.venv.action_space.n)
        self.processes = list(self.venv.processes)
        self.venv.seed(0)
        self.venv.reset()

    def step(self, actions: np.ndarray) -> None:
        self.venv.step_async(actions)
        self.venv.step_wait()

    def close(self) -> None:
        self.venv.close()


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
        self.batch = n
        self.processes: list = []

    def step(self, actions: np.ndarray) -> None:
        for ale, a in zip(self.ales, actions.tolist()):
            action = self.actions[a]
            for _ in range(4):
                ale.act(action, 1.0)
            if ale.game_over():
                ale.reset_game()

    def close(self) -> None:
        pass


def measure(config: str, game: str, n: int, seconds: float, warm_up: int) -> dict[str, float]:
    """One configuration in this interpreter: env steps/s and CPU µs per env step."""
    from shmvec.bench.system import cpu_snapshot

    env = _Floor(config, game, n) if config == "floor" else _Vec(config, game, n)
    try:
        rng = np.random.default_rng(0)
        actions = rng.integers(0, env.n_actions, (4096, env.batch))
        for t in range(warm_up):
            env.step(actions[t % 4096])
        steps, cpu, start = 0, cpu_snapshot(env.processes).tree_s, time.perf_counter()
        while time.perf_counter() - start < seconds:
            env.step(actions[steps % 4096])
            steps += 1
        wall, cpu = time.perf_counter() - start, cpu_snapshot(env.processes).tree_s - cpu
    finally:
        env.close()
    return {"steps_per_s": steps * env.batch / wall, "cpu_us": cpu / (steps * env.batch) * 1e6}


def markdown(result: dict[str, Any]) -> str:
    """The tables of a run (one per game and n), with each figure's median and range over rounds,
    and its ratio to ale-vec's round by round (:mod:`shmvec.bench.compare`)."""
    from shmvec.bench import host
    from shmvec.bench.compare import cells, side_by_side

    out = []
    for table in result["tables"]:
        rows = table["rows"]
        out.append(f"\n**{table['game']}, n={table['n']}** ({len(next(iter(rows.values())))} rounds)\n")
        out.append("| VecEnv | env steps/s | x ale-vec | CPU µs per env step | x ale-vec |")
        out.append("|---|---|---|---|---|")
        out += ["| " + " | ".join(cells(row)) + " |" for row in side_by_side(rows, "ale-vec")]
        # The ratios carry the host they were taken on: its wake-up cost and this run's emulator floor.
        floor = float(np.median([r["cpu_us"] for r in rows["floor"]])) if rows.get("floor") else None
        out.append(f"\n{host.describe(result.get('host', {}).get('wake_up_us'), floor)}.")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", default="pong,ms_pacman", help="ALE ROM ids, comma-separated")
    parser.add_argument("--n", default="8", help="numbers of envs, comma-separated")
    parser.add_argument("--configs", type=config_list(CONFIGS), default=list(DEFAULT_CONFIGS))
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
    configs = args.configs
    tables = [
        {"game": g, "n": int(n), "rows": {c: [] for c in configs}}
        for g in args.games.split(",")
        for n in args.n.split(",")
    ]
    from shmvec.bench import host

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    wake_up_us = host.wake_up_us()
    for r in range(args.rounds):
        for table in tables:
            # each round in another order, as policy_loop.interleaved runs them
            for config in [*configs[r % len(configs) :], *configs[: r % len(configs)]]:
                one = json.dumps([config, table["game"], table["n"]])
                argv = ["--one", one, "--seconds", str(args.seconds), "--warm-up", str(args.warm_up)]
                table["rows"][config].append(run_fresh(__file__, argv))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    result = {
        "started": started,
        "seconds": args.seconds,
        "tables": tables,
        "host": {"wake_up_us": wake_up_us},
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(markdown(result))


if __name__ == "__main__":
    main()
