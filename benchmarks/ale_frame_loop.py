"""What a frame loop in compiled code would save over ale-py's Python calls, and whether threads
could emulate side by side.

    python benchmarks/ale_frame_loop.py                       # Pong, 12 rounds of 0.4 s
    python benchmarks/ale_frame_loop.py --game ms_pacman --rounds 20

The native Atari step (``shmvec/atari/sb3.py``) calls ale-py from Python for every emulator frame.
Whether moving that loop into compiled code is worth a dependency is measured here, per agent step
of 4 frames, as CPU time (``time.process_time``) of three loops on one env, rounds interleaved:

- ``floor``: ``ale.act`` x 4, what any loop must do;
- ``python``: the calls the native step makes per frame (``act``, ``game_truncated``, ``game_over``;
  ``getScreen`` of the last two frames into arrays), as Python calls;
- ``compiled``: the same calls from one numba function through ale-py's own exported C++ methods
  (``ale::ALEInterface::act``, ``game_over``, ``game_truncated``), the screen copied from ALE's
  buffer in place: no Python per frame.

The two loops' costs above ``floor`` are printed (medians over rounds, with quartiles). Before
measuring, the script checks that the compiled loop steps exactly as the Python one (:func:`check`:
rewards, flags, frame numbers and screens of two envs from one seed, step for step). Then
``threads``: two envs stepped by two threads against one after the other, which says whether
ale-py's ``act`` lets another thread run meanwhile (it holds the GIL in ale-py 0.12.1: the two
threads take as long as one).

This reaches into ale-py's binding (nanobind keeps the C++ object inside the Python one, at the
offset stored right after the object header; ALE's screen is a ``std::vector`` after two ints), so
it runs with the ale-py versions in :data:`KNOWN_ALE` only and refuses others. Measurement only:
shmvec itself calls ale-py through its Python API.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import statistics
import threading
import time
from typing import Any

import numpy as np

KNOWN_ALE = ("0.12.1",)
GAMES = {
    "pong": "PongNoFrameskip-v4",
    "ms_pacman": "MsPacmanNoFrameskip-v4",
    "breakout": "BreakoutNoFrameskip-v4",
}
SKIP = 4


def _ale(env_id: str, seed: int) -> Any:
    import ale_py
    import gymnasium as gym

    if ale_py.__version__ not in KNOWN_ALE:
        raise SystemExit(f"ale-py {ale_py.__version__}: this script knows the binding of {KNOWN_ALE} only")
    gym.register_envs(ale_py)
    env = gym.make(env_id)
    env.reset(seed=seed)
    return env


class Compiled:
    """One env's frame loop as a numba function calling ALE's C++ methods through their symbols."""

    def __init__(self, ale: Any) -> None:
        import ale_py
        import numba

        lib = ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(ale_py.__file__), "_ale_py*.so"))[0])
        ptr = ctypes.c_void_p

        def method(symbol: str, restype: Any, *argtypes: Any) -> Any:
            return ctypes.CFUNCTYPE(restype, ptr, *argtypes)(ctypes.cast(getattr(lib, symbol), ptr).value)

        act = method("_ZN3ale12ALEInterface3actENS_6ActionEf", ctypes.c_int, ctypes.c_int, ctypes.c_float)
        over = method("_ZNK3ale12ALEInterface9game_overEb", ctypes.c_bool, ctypes.c_bool)
        truncated = method("_ZNK3ale12ALEInterface14game_truncatedEv", ctypes.c_bool)
        screen = method("_ZNK3ale12ALEInterface9getScreenEv", ptr)
        frame_number = method("_ZNK3ale12ALEInterface14getFrameNumberEv", ctypes.c_int)
        # nanobind: an int32 offset right after PyObject_HEAD; the C++ object lies at that offset.
        self.this = id(ale) + ctypes.c_int32.from_address(id(ale) + 16).value
        if frame_number(self.this) != ale.getFrameNumber():
            raise SystemExit("the C++ object is not where this script expects it in ale-py's binding")
        pixels = ctypes.c_void_p.from_address(screen(self.this) + 8).value  # ALEScreen: int, int, vector
        height, width = ale.getScreenDims()
        self.live = np.ctypeslib.as_array((ctypes.c_uint8 * (height * width)).from_address(pixels))
        self.live = self.live.reshape(height, width)
        self.ale = ale  # keeps the buffers alive

        @numba.njit(nogil=True)
        def frames(this, action, skip, live, screens, out):  # out: reward, terminated, truncated, frames
            total = 0
            for i in range(skip):
                total += act(this, action, 1.0)
                cut = truncated(this)
                ended = over(this, False)
                if i >= skip - 2:
                    e = i - skip + 2
                    for y in range(live.shape[0]):  # (numba's 2-d slice assignment is slower)
                        for x in range(live.shape[1]):
                            screens[e, y, x] = live[y, x]
                out[3] = i + 1
                if ended or cut:
                    out[1], out[2] = ended, cut
                    break
            out[0] = total

        self.frames = frames

    def step(self, action: int, screens: np.ndarray, out: np.ndarray) -> None:
        out[:] = 0
        self.frames(self.this, action, SKIP, self.live, screens, out)


def python_step(ale: Any, action: Any, screens: np.ndarray, out: np.ndarray) -> None:
    """The native step's per-frame calls, from Python."""
    total = 0.0
    out[:] = 0
    for i in range(SKIP):
        total += ale.act(action, 1.0)
        cut = ale.game_truncated()
        ended = ale.game_over(with_truncation=False)
        if i >= SKIP - 2:
            ale.getScreen(screens[i - SKIP + 2])
        out[3] = i + 1
        if ended or cut:
            out[1], out[2] = ended, cut
            break
    out[0] = total


def check(env_id: str, steps: int, seed: int = 0) -> str | None:
    """Step two envs of one seed, one by each loop, with the same random actions: None if every
    step gave the same reward, flags, frame count, frame number and screens, else the first
    difference."""
    envs = [_ale(env_id, seed) for _ in range(2)]
    try:
        a, b = (env.unwrapped.ale for env in envs)
        compiled = Compiled(b)
        action_set = envs[0].unwrapped._action_set
        screens = np.zeros((2, 2, *a.getScreenDims()), np.uint8)
        outs = np.zeros((2, 4), np.float64)
        for t, k in enumerate(np.random.default_rng(seed).integers(0, len(action_set), steps)):
            python_step(a, action_set[k], screens[0], outs[0])
            compiled.step(int(action_set[k].value), screens[1], outs[1])
            if not np.array_equal(outs[0], outs[1]):
                return f"step {t}: reward, terminated, truncated, frames {outs[0]} != {outs[1]}"
            if not np.array_equal(screens[0], screens[1]) or a.getFrameNumber() != b.getFrameNumber():
                return f"step {t}: screens or frame numbers differ"
            if outs[0, 1] or outs[0, 2]:
                a.reset_game()
                b.reset_game()
        return None
    finally:
        for env in envs:
            env.close()


def measure(env_id: str, rounds: int, seconds: float) -> dict[str, Any]:
    """CPU µs per agent step above ``floor`` of the Python and the compiled loop (median, quartiles)."""
    env = _ale(env_id, 0)
    ale = env.unwrapped.ale
    compiled = Compiled(ale)
    action_set = env.unwrapped._action_set
    picks = np.random.default_rng(1).integers(0, len(action_set), 4096)
    actions = [action_set[k] for k in picks]
    codes = [int(a.value) for a in actions]
    screens = np.zeros((2, *ale.getScreenDims()), np.uint8)
    out = np.zeros(4, np.float64)

    def floor(action: Any) -> None:
        for _ in range(SKIP):
            ale.act(action, 1.0)

    loops = {
        "floor": (floor, actions),
        "python": (lambda a: python_step(ale, a, screens, out), actions),
        "compiled": (lambda a: compiled.step(a, screens, out), codes),
    }

    def run(name: str) -> float:
        step, acts = loops[name]
        n = 0
        cpu, start = time.process_time(), time.perf_counter()
        while time.perf_counter() - start < seconds:
            step(acts[n % len(acts)])
            n += 1
            if ale.game_over():
                ale.reset_game()
        return (time.process_time() - cpu) / n * 1e6

    above: dict[str, list[float]] = {"python": [], "compiled": []}
    floors = []
    for _ in range(rounds):
        base = run("floor")
        floors.append(base)
        for name in above:
            above[name].append(run(name) - base)
    env.close()
    result: dict[str, Any] = {"floor_us": statistics.median(floors)}
    for name, values in above.items():
        q1, median, q3 = np.percentile(values, [25, 50, 75])
        result[name] = {"median_us": float(median), "quartiles_us": [float(q1), float(q3)]}
    return result


def threads(env_id: str, frames: int) -> dict[str, float]:
    """Seconds for two envs to step ``frames`` frames each: one after the other, and by two threads."""
    envs = [_ale(env_id, 0) for _ in range(2)]
    ales = [env.unwrapped.ale for env in envs]
    noop = envs[0].unwrapped._action_set[0]

    def run(ale: Any) -> None:
        for _ in range(frames):
            ale.act(noop, 1.0)
            if ale.game_over():
                ale.reset_game()

    start = time.perf_counter()
    for ale in ales:
        run(ale)
    serial = time.perf_counter() - start
    workers = [threading.Thread(target=run, args=(ale,)) for ale in ales]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    both = time.perf_counter() - start
    for env in envs:
        env.close()
    return {"serial_s": serial, "threads_s": both}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", default="pong", choices=sorted(GAMES))
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=0.4, help="measured seconds per loop and round")
    parser.add_argument("--check", type=int, default=2000, help="agent steps compared before measuring")
    args = parser.parse_args()
    env_id = GAMES[args.game]
    difference = check(env_id, args.check)
    if difference is not None:
        raise SystemExit(f"the compiled loop does not step as the Python one: {difference}")
    print(f"{env_id}: the compiled loop stepped as the Python one for {args.check} agent steps")
    result = measure(env_id, args.rounds, args.seconds)
    print(f"ale.act x {SKIP}: {result['floor_us']:.1f} µs per agent step (median of {args.rounds} rounds)")
    for name in ("python", "compiled"):
        q1, q3 = result[name]["quartiles_us"]
        print(f"  {name:8s} loop above it: {result[name]['median_us']:5.2f} µs (quartiles {q1:.2f}-{q3:.2f})")
    timing = threads(env_id, 20_000)
    print(
        f"two envs x 20,000 frames: one after the other {timing['serial_s']:.2f} s, "
        f"two threads {timing['threads_s']:.2f} s"
    )


if __name__ == "__main__":
    main()
