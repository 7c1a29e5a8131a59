"""What ``shmvec bench --train`` prints (:func:`table`) and the docs' table of it (:func:`markdown`):
per backend, the whole training run and its two phases, rollouts and updates, per 1,000 env steps,
against DummyVecEnv seed by seed, with the host's wake-up cost beside the ratios."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from shmvec.bench import curves, host
from shmvec.bench.train import TrainResult, TrainRun, best_case


def _spread(values: Sequence[float], fmt: str = ".1f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def per_k(run: TrainRun, total_steps: int, key: str) -> float:
    """Seconds of ``run``'s ``key`` (``learn``: rollouts and updates; ``rollout_s``; ``update_s``;
    ``step_s``) per 1,000 env steps."""
    seconds = run.rollout_s + run.update_s if key == "learn" else getattr(run, key)
    return seconds / total_steps * 1000


def speedups(result: TrainResult, backend: str, key: str = "learn", ref: str = "dummy") -> list[float]:
    """``ref``'s seconds over ``backend``'s, seed by seed (>1: ``backend`` is faster); empty where
    ``ref`` did not run that seed."""
    runs = result.by_backend()
    base = {r.seed: per_k(r, result.total_steps, key) for r in runs.get(ref, [])}
    return [base[r.seed] / per_k(r, result.total_steps, key) for r in runs[backend] if r.seed in base]


_KEYS = ("learn", "rollout_s", "update_s", "step_s")


def _host(result: TrainResult) -> str:
    return host.describe(result.wake_up_us, result.floor_us)


def _load(result: TrainResult) -> str | None:
    loads = [r.other_cores for r in result.runs if r.other_cores is not None]
    if not loads:
        return None
    median, most = statistics.median(loads), max(loads)
    return f"other processes took {median:.2f} cores meanwhile (median; up to {most:.2f})"


def _against_subproc(result: TrainResult) -> str | None:
    """ShmVecEnv against SubprocVecEnv, the VecEnv it replaces: the ratio a user of the README's
    env-steps figure compares with."""
    runs = result.by_backend()
    if "shm" not in runs or "subproc" not in runs:
        return None
    learn, rollout = (_spread(speedups(result, "shm", key, "subproc"), ".2f") for key in _KEYS[:2])
    return f"learn {learn}x, rollouts {rollout}x"


def _identical(result: TrainResult, backend: str) -> str:
    same = result.identical_to()
    if backend == "dummy":
        return "reference"
    return f"{sum(same[backend])}/{len(same[backend])} seeds" if backend in same else "-"


def _return(runs: list[TrainRun]) -> str:
    rets = [r.mean_return for r in runs if r.mean_return is not None]
    return _spread(rets, ".2f") if rets else "no episode ended"


def table(result: TrainResult) -> str:
    """Plain-text summary, one row per backend: medians over the seeds, the ratio with its range."""
    recipe = f", recipe {result.recipe}" if result.recipe else ""
    lines = [
        f"{result.env}{recipe}, {result.policy}, {result.n_envs} envs, {result.total_steps:,} env steps, "
        f"seeds {result.seeds}",
        f"{'':<10}{'wall':>8}{'seconds per 1,000 env steps':^36}{'learn vs dummy':>20}{'mean return':>22}",
        f"{'backend':<10}{'s':>8}{'learn':>9}{'rollout':>9}{'update':>9}{'in step':>9}"
        f"{'(median, range)':>20}{'(median, range)':>22}  params = dummy",
    ]
    k = result.total_steps
    for b, runs in result.by_backend().items():
        ratios = speedups(result, b) if b != "dummy" else []
        vs = _spread(ratios, ".2f") + "x" if ratios else "-"
        per = "".join(f"{statistics.median(per_k(r, k, key) for r in runs):>9.2f}" for key in _KEYS)
        lines.append(
            f"{b:<10}{statistics.median(r.wall_s for r in runs):>8.1f}{per}{vs:>20}{_return(runs):>22}"
            f"  {_identical(result, b)}"
        )
    lines.append(
        "learn = rollout + update (start-up left out); vs dummy: dummy's learn time over the backend's, "
        "seed by seed (>1: faster)"
    )
    lines.append(_host(result))
    load = _load(result)
    if load:
        lines.append(f"{load}: above ~0.1 the host was busy and the ratios are a loaded host's")
    against = _against_subproc(result)
    if against:
        lines.append(f"shm against subproc, seed by seed: {against}")
    dummy = result.by_backend().get("dummy")
    if dummy and result.cpus > 1:
        wall, step = (statistics.median(getattr(r, key) for r in dummy) for key in ("wall_s", "step_s"))
        lines.append(
            f"an ideal multi-process VecEnv on {result.cpus} CPUs would take "
            f"{best_case(wall, step, result.cpus):.2f}x dummy's wall time (dummy's time in step spread "
            "over the CPUs at no cost, the rest unchanged)"
        )
    if result.threshold is not None:
        for b, runs in result.by_backend().items():
            reached = curves.reached([r.curve for r in runs], result.threshold)
            lines.append(f"{b}: mean return >= {result.threshold:g} after {reached.describe()}")
    lines += [f"PROBLEM: {p}" for p in result.problems()]
    return "\n".join(lines) + "\n"


def markdown(result: TrainResult) -> str:
    """The docs' table of a result (medians with the range over the seeds), and the command that
    measured it."""
    k = result.total_steps
    lines = [
        "| VecEnv | learn s per 1,000 env steps | of it rollout | of it update | vs DummyVecEnv "
        "| rollout vs DummyVecEnv | params = DummyVecEnv |",
        "|---|---|---|---|---|---|---|",
    ]
    fmt: Callable[[list[float]], str] = lambda v: _spread(v, ".2f")  # noqa: E731
    for b, runs in result.by_backend().items():
        vs, rollout_vs = (
            ("1 (reference)", "1 (reference)")
            if b == "dummy"
            else (fmt(speedups(result, b)) + "x", fmt(speedups(result, b, "rollout_s")) + "x")
        )
        same = "-" if b == "dummy" else _identical(result, b)
        learn, rollout, update = (fmt([per_k(r, k, key) for r in runs]) for key in _KEYS[:3])
        lines.append(f"| {b} | {learn} | {rollout} | {update} | {vs} | {rollout_vs} | {same} |")
    recipe = f" on the `{result.recipe}` recipe" if result.recipe else ""
    load, against = _load(result), _against_subproc(result)
    load = f" {load.capitalize()}." if load else ""
    against = f" ShmVecEnv against SubprocVecEnv, seed by seed: {against}." if against else ""
    dummy = result.by_backend().get("dummy", [])
    share = (
        f" The updates are {statistics.median(r.update_s / (r.rollout_s + r.update_s) for r in dummy):.0%} "
        "of DummyVecEnv's learn time, the same work whatever the VecEnv: only the rollouts can go faster."
        if dummy
        else ""
    )
    lines += [
        "",
        f"{result.policy}{recipe}, {result.env}, {result.n_envs} envs, `model.learn({k})` per run, seeds "
        f"{', '.join(map(str, result.seeds))} (medians, range over the seeds), {result.cpus} CPUs; learn = "
        "rollouts + updates, start-up left out; \"vs\": DummyVecEnv's time over the VecEnv's, seed by "
        f"seed (>1: faster).{against} {_host(result)}.{load} Measured by "
        f"`{result.command or 'shmvec bench --train'}`." + share,
    ]
    return "\n".join(lines) + "\n"
