"""The host's state, printed beside every ratio a benchmark reports, so a reader can tell the host
from the code.

A multi-process VecEnv pays at least one process wake-up per batch and worker; what one costs is a
property of the host (kernel, hypervisor, CPU power states), not of shmvec, and it moves every ratio
against an in-process or a C++-threads VecEnv: the same code gave 1.13-1.20x ALE's vector env on a
host whose pipe round trip took ~50 µs, and 0.92-0.96x on one where it took ~98 µs.

- :func:`wake_up_us`: a pipe ping-pong between this process and a child, microseconds per round trip
  (two wake-ups, one per side, and four system calls);
- :func:`emulator_floor_us`: for Atari, the emulator alone (``ale.act`` per frame, one process),
  microseconds of CPU per env step: what no VecEnv can go below;
- :func:`describe`: the line the benchmarks print.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

# The child (on the CPU given as its argument, where it can be pinned) answers each byte with one
# byte until its stdin closes.
_ECHO = (
    "import os, sys\n"
    "if sys.argv[1] != '-': os.sched_setaffinity(0, {int(sys.argv[1])})\n"
    "while os.read(0, 1):\n    os.write(1, b'x')\n"
)


def _two_cpus() -> tuple[int, int] | None:
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # no affinity calls (macOS, Windows): the scheduler places both
        return None
    return (cpus[0], cpus[1]) if len(cpus) > 1 else None


def wake_up_us(round_trips: int = 2000, rounds: int = 5) -> float:
    """Microseconds per round trip of one byte through a pipe to a child process and back (the
    median over ``rounds`` of ``round_trips`` each; about 0.1-1 s in all). Both sides block in
    ``read``, so each round trip wakes each process once, as a sleeping worker and a waiting main
    process are woken. The two run on two different CPUs (pinned for the measurement, where the
    platform can pin), as a worker and the main process do: woken on its own CPU, a process costs a
    context switch (~2 µs), woken on another it costs the host's cross-CPU wake-up."""
    cpus = _two_cpus()
    child = subprocess.Popen(
        [sys.executable, "-c", _ECHO, "-" if cpus is None else str(cpus[1])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdin is not None and child.stdout is not None
    out, back = child.stdin.fileno(), child.stdout.fileno()
    mine = os.sched_getaffinity(0) if cpus is not None else None
    try:
        if cpus is not None:
            os.sched_setaffinity(0, {cpus[0]})
        for _ in range(100):  # warm-up: the child's interpreter start and first reads
            os.write(out, b"x")
            os.read(back, 1)
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(round_trips):
                os.write(out, b"x")
                os.read(back, 1)
            times.append((time.perf_counter() - start) / round_trips * 1e6)
    finally:
        if mine is not None:
            os.sched_setaffinity(0, mine)
        child.stdin.close()
        child.wait(timeout=10)
        child.stdout.close()
    return statistics.median(times)


def emulator_floor_us(env_id: str, frames_per_step: int = 4, steps: int = 2000) -> float:
    """CPU microseconds per env step of the Atari game of ``env_id`` (a Gymnasium ALE id, e.g.
    ``PongNoFrameskip-v4``): ``ale.act`` ``frames_per_step`` times with random actions in this
    process, no observation read, a game over reset; after a warm-up of ``steps // 4`` steps."""
    import ale_py
    import gymnasium as gym
    import numpy as np
    from ale_py import roms

    gym.register_envs(ale_py)
    game = str(gym.spec(env_id).kwargs["game"])
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    ale = ale_py.ALEInterface()
    ale.setInt("random_seed", 0)
    rom = roms.get_rom_path(game)
    if rom is None:
        raise ValueError(f"ale-py has no ROM for {game!r} ({env_id})")
    ale.loadROM(rom)
    actions = ale.getMinimalActionSet()
    picks = np.random.default_rng(0).integers(0, len(actions), steps + steps // 4).tolist()

    def run(chosen: list[int]) -> None:
        for a in chosen:
            for _ in range(frames_per_step):
                ale.act(actions[a], 1.0)
            if ale.game_over():
                ale.reset_game()

    run(picks[steps:])
    start = time.process_time()
    run(picks[:steps])
    return (time.process_time() - start) / steps * 1e6


def describe(wake_us: float | None, floor_us: float | None = None) -> str:
    """The host line: ``Host: wake-up 98 µs (pipe round trip between two processes)`` and, given,
    the emulator floor. ``wake_us`` None: not recorded (a result from before shmvec recorded it)."""
    if wake_us is None:
        text = "Host: wake-up cost not recorded"
    else:
        text = f"Host: wake-up {wake_us:.0f} µs (pipe round trip between two processes)"
    if floor_us is not None:
        text += f"; emulator floor {floor_us:.0f} µs CPU per env step (ale.act x 4, one process)"
    return text
