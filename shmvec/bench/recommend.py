"""From measurements to a plain-words answer: which configuration wins, by how much, and why."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from shmvec.bench.results import MAX_OTHER_CORES, BenchResult, Point
from shmvec.bench.stats import overlaps

# Share of a batch step above which one component is called the bottleneck.
_BOUND_SHARE = 0.5
# The tree is "saturating the CPUs" above this fraction of the usable cores.
_SATURATED = 0.8
# A main process that uses more than this many cores while it waits for its workers is spinning.
_SPINNING_CORES = 0.5


def shares(point: Point) -> dict[str, float]:
    """Fractions of the median step time: env, ipc (send + IPC/waiting), copy, policy, other."""
    b = point.breakdown()
    step = point.representative().step_s
    if step <= 0:
        return {}
    return {
        "env": b["env_s"] / step,
        "ipc": (b["ipc_s"] + b["send_s"]) / step,
        "copy": b["copy_s"] / step,
        "policy": b["policy_s"] / step,
        "other": b["unattributed_s"] / step,
    }


def _bound(result: BenchResult, point: Point, sh: dict[str, float]) -> tuple[str, str]:
    cpus = result.machine["usable_cpus"]
    busy = point.median("cpu_cores")
    top = max(("env", "ipc", "copy", "policy"), key=lambda k: sh.get(k, 0.0))
    if sh.get(top, 0.0) < _BOUND_SHARE:
        return "mixed", "no single part dominates"
    if top == "policy":
        return "policy", "policy-bound: inference dominates; larger batches (more envs) amortise it"
    if top == "copy":
        return "copy", "copy-bound: copying observations dominates (copy=False or smaller frames help)"
    if top == "ipc" and point.median("processes") == 0:
        return "overhead", (
            "overhead-bound: the VecEnv's own bookkeeping costs more than the env step; a step this "
            "cheap gains nothing from worker processes"
        )
    if top == "ipc":
        other = point.median("other_cores")
        theirs = (
            f"; other processes took {other:.1f} cores, so part of the wait is theirs" if other > 0.3 else ""
        )
        return "ipc", (
            "IPC/wait-bound: the time in step_wait beyond the envs' own compute (pipes, wake-ups, workers "
            f"waiting for a CPU) dominates{theirs}"
        )
    other = point.median("other_cores")
    if busy < _SATURATED * cpus and (other > MAX_OTHER_CORES or result.alone_starved):
        return "shared", (
            f"env-bound with {busy:.1f} of {cpus} CPUs busy for this VecEnv while other processes took "
            f"{other:.1f} cores: the CPUs were shared, so the low use says nothing about the env"
        )
    if result.cpu_fraction < 1:
        return "io", (
            f"env-bound, but the env waits rather than computes ({busy:.1f} of {cpus} CPUs busy): "
            "more envs than cores keeps the CPUs busy"
        )
    if busy >= _SATURATED * cpus:
        return "env", (
            f"env-bound with the CPUs saturated ({busy:.1f} of {cpus} busy): more workers or envs will "
            f"not help on {cpus} cores"
        )
    if point.median("processes") < cpus:
        return "env", (
            f"env-bound on fewer processes than CPUs ({busy:.1f} of {cpus} busy): envs spread over more "
            "worker processes could use the idle CPUs"
        )
    return "env", f"env-bound ({busy:.1f} of {cpus} CPUs busy)"


def spinning(result: BenchResult) -> dict[str, float]:
    """Process backends whose main process burned more than half a core while waiting for its workers,
    with the cores it burned (``wait_cpu_s / wait_s``, median over repeats), by configuration label.

    Waiting should cost nothing; with a policy in the loop, what burns is the policy's OpenMP threads
    spinning after the forward pass (see :mod:`shmvec.engine.openmp`), on the cores the workers need.
    """
    out = {}
    for p in result.points:
        wait = p.median("wait_s")
        if p.median("processes") > 0 and wait > 0:
            cores = p.median("wait_cpu_s") / wait
            if cores > _SPINNING_CORES:
                out[p.config.label] = cores
    return out


def declined(result: BenchResult) -> list[str]:
    """Why the measurements cannot carry a recommendation (empty when they can): the fastest or the
    runner-up configuration was disturbed, half of the configurations or more were, or other
    processes kept the CPUs busy while the env was measured alone (so the ceiling is unknown)."""
    ranked = _ranked(result)
    why = []
    for role, p in zip(("fastest", "runner-up"), ranked[:2]):
        if p.disturbed:
            why.append(f"the {role} configuration ({p.config.label}) was disturbed: {'; '.join(p.disturbed)}")
    n_disturbed = sum(bool(p.disturbed) for p in ranked)
    if ranked and n_disturbed * 2 >= len(ranked):
        why.append(f"{n_disturbed} of {len(ranked)} configurations were disturbed")
    if result.alone_starved:
        other = sorted(result.alone_other_cores)[len(result.alone_other_cores) // 2]
        why.append(f"other processes took {other:.1f} cores while the env was measured alone")
    return why


def _ranked(result: BenchResult) -> list[Point]:
    return sorted(
        (p for p in result.points if p.steps_per_s is not None),
        key=lambda p: p.steps_per_s.median,  # type: ignore[union-attr]
        reverse=True,
    )


def recommend(result: BenchResult) -> dict[str, Any]:
    """The best configuration, how it compares with the runner-up and SubprocVecEnv, and why; or,
    when the measurements were disturbed (:func:`declined`), no recommendation and why not.

    :returns: a dict with ``text`` (plain words), ``declined`` (the reasons; empty when it
        recommends) and the figures the text is built from.
    """
    ranked = _ranked(result)
    if not ranked:
        return {"text": "nothing was measured"}
    best = ranked[0]
    assert best.steps_per_s is not None
    rate = best.steps_per_s
    sh = shares(best)
    bound, why = _bound(result, best, sh)
    ceiling = result.ceiling(best.config.n_envs)
    out: dict[str, Any] = {
        "best": best.config.label,
        "best_config": asdict(best.config),
        "steps_per_s": rate.median,
        "shares": sh,
        "bound": bound,
        "ceiling": ceiling,
        "ceiling_fraction": rate.median / ceiling if ceiling else None,
        "declined": declined(result),
    }
    if out["declined"]:
        text = [
            "No recommendation: the measurement was disturbed ("
            + "; ".join(out["declined"])
            + "). Re-run on a quiet machine. "
            f"Fastest as measured, not a recommendation: {best.config.label} at {rate.median:,.0f} "
            f"steps/s (95% CI {rate.ci_low:,.0f}-{rate.ci_high:,.0f})"
        ]
    else:
        text = [
            f"Best: {best.config.label} at {rate.median:,.0f} steps/s "
            f"(95% CI {rate.ci_low:,.0f}-{rate.ci_high:,.0f})"
        ]
    if len(ranked) > 1:
        second = ranked[1]
        assert second.steps_per_s is not None
        tied = overlaps(rate, second.steps_per_s)
        out.update(
            runner_up=second.config.label,
            vs_runner_up=rate.median / second.steps_per_s.median,
            runner_up_tied=tied,
        )
        text.append(
            f", {out['vs_runner_up']:.2f}x the runner-up {second.config.label}"
            + (" (CIs overlap: not a clear win)" if tied else "")
        )
    subproc = [p for p in ranked if p.config.backend == "subproc"]
    if subproc and best.config.backend != "subproc":
        s = subproc[0]
        assert s.steps_per_s is not None
        out.update(subproc=s.config.label, vs_subproc=rate.median / s.steps_per_s.median)
        text.append(f" and {out['vs_subproc']:.2f}x SubprocVecEnv at its best ({s.config.label})")
    text.append(".")
    if sh:
        parts = ", ".join(f"{k} {v:.0%}" for k, v in sh.items() if k != "other")
        step_ms = best.representative().step_s * 1e3
        text.append(f" Where a step's {step_ms:.2f} ms go: {parts}.")
        if not out["declined"]:
            text.append(f" {why[0].upper()}{why[1:]}.")
    if ceiling and not out["declined"]:
        text.append(
            f" It reaches {out['ceiling_fraction']:.0%} of the ceiling ({ceiling:,.0f} steps/s = "
            f"{result.ceiling_rule()})."
        )
    spin = spinning(result)
    if spin:
        out["spinning"] = spin
        worst = max(spin, key=spin.__getitem__)
        text.append(
            f" While waiting for its workers the main process kept {spin[worst]:.1f} cores busy with "
            f"{worst}{f' and {len(spin) - 1} other configurations' if len(spin) > 1 else ''}: the "
            "policy's OpenMP threads spin after each forward pass on the cores the workers need. "
            "ShmVecEnv pauses them (pause_openmp=True, the default); for other VecEnvs set "
            "OMP_WAIT_POLICY=PASSIVE before torch is imported."
        )
    out["text"] = "".join(text)
    return out
