"""Condense a run of the pytest-benchmark matrix into the small JSON and table the docs show.

    python -m pytest benchmarks/ --benchmark-only --benchmark-json /tmp/matrix_raw.json
    python benchmarks/matrix_summary.py /tmp/matrix_raw.json --json benchmarks/results/matrix.json \\
        --markdown benchmarks/results/matrix.md

pytest-benchmark's JSON holds every statistic of every case (about 1 MB); the committed
``matrix.json`` keeps env steps/s at the median, first and third quartile of each case's batch-step
time. ``--from-json benchmarks/results/matrix.json`` re-renders the table without the raw file.

For each workload and ``n_envs`` the table names the fastest multi-process backend (``subproc``,
``shm``, ``shm_wn``, ``async``; ``dummy`` steps in the main process and is shown for reference) and
says whether ShmVecEnv is it. "clear" means the interquartile ranges of ShmVecEnv and the best other
multi-process backend do not overlap.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

MULTI_PROCESS = ("subproc", "shm", "shm_wn", "async")
SHM = ("shm", "shm_wn")


def condense(raw: dict[str, Any]) -> dict[str, Any]:
    """Env steps/s per case (median and IQR bounds) from pytest-benchmark's JSON."""
    cases = []
    for b in raw["benchmarks"]:
        info, stats = b["extra_info"], b["stats"]
        if not {"workload", "backend", "n_envs"} <= info.keys():
            continue  # bench_codecs.py's cases: not part of the backend matrix
        n = info["n_envs"]
        cases.append(
            {
                "workload": info["workload"],
                "backend": info["backend"],
                "n_envs": n,
                # A longer step time is a lower rate: q3 of the time gives the low end of the rate.
                "steps_per_s": n / stats["median"],
                "low": n / stats["q3"],
                "high": n / stats["q1"],
                "rounds": stats["rounds"],
            }
        )
    machine = raw.get("machine_info", {})
    return {
        "datetime": raw.get("datetime"),
        "machine": {k: machine.get(k) for k in ("node", "processor", "python_version", "cpu")},
        # Written by benchmarks/conftest.py (shmvec.bench.host), beside the ratios.
        "host": {"wake_up_us": machine.get("shmvec_wake_up_us")},
        "cases": cases,
    }


def verdicts(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (workload, n_envs): rates by backend, the fastest multi-process backend, ShmVecEnv's
    ratio to the best other one and whether the IQRs separate them."""
    groups: dict[tuple[str, int], dict[str, dict[str, float]]] = {}
    for c in summary["cases"]:
        groups.setdefault((c["workload"], c["n_envs"]), {})[c["backend"]] = c
    rows = []
    for (workload, n), by in groups.items():
        mp = {b: c for b, c in by.items() if b in MULTI_PROCESS}
        if not mp:
            continue
        winner = max(mp, key=lambda b: mp[b]["steps_per_s"])
        shm = max((b for b in mp if b in SHM), key=lambda b: mp[b]["steps_per_s"], default=None)
        others = [b for b in mp if b not in SHM]
        rival = max(others, key=lambda b: mp[b]["steps_per_s"], default=None)
        row: dict[str, Any] = {
            "workload": workload,
            "n_envs": n,
            "rates": {b: c["steps_per_s"] for b, c in by.items()},
            "winner": winner,
            "shm": shm,
            "rival": rival,
        }
        if shm is not None and rival is not None:
            s, r = mp[shm], mp[rival]
            row["ratio"] = s["steps_per_s"] / r["steps_per_s"]
            row["clear"] = s["low"] > r["high"] or s["high"] < r["low"]
        rows.append(row)
    return rows


def markdown(summary: dict[str, Any]) -> str:
    rows = verdicts(summary)
    backends = ("dummy", "subproc", "shm", "shm_wn", "async")
    lines = [
        "| workload | n_envs | " + " | ".join(backends) + " | fastest | shm vs next |",
        "|---|---|" + "---|" * len(backends) + "---|---|",
    ]
    for r in rows:
        rates = " | ".join(f"{r['rates'][b]:,.0f}" if b in r["rates"] else "-" for b in backends)
        vs = "-"
        if "ratio" in r:
            vs = f"{r['ratio']:.2f}x vs {r['rival']}" + ("" if r["clear"] else ", IQRs overlap")
        lines.append(f"| {r['workload']} | {r['n_envs']} | {rates} | {r['winner']} | {vs} |")
    big = [r for r in rows if r["n_envs"] >= 4 and "ratio" in r]
    won = [r for r in big if r["winner"] in SHM]
    lost = [f"{r['workload']} n={r['n_envs']} ({r['winner']})" for r in big if r["winner"] not in SHM]
    lines.append(
        f"\nEnv steps/s (median of each case's batch-step time). At n_envs >= 4 ShmVecEnv is the fastest "
        f"multi-process backend in {len(won)} of {len(big)} groups"
        + (f"; not in: {', '.join(lost)}." if lost else ".")
    )
    from shmvec.bench import host

    lines.append(f"{host.describe(summary.get('host', {}).get('wake_up_us'))}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("raw", nargs="?", type=Path, help="pytest-benchmark's --benchmark-json file")
    parser.add_argument("--from-json", type=Path, help="a condensed JSON written by --json")
    parser.add_argument("--json", type=Path, help="write the condensed JSON here")
    parser.add_argument("--markdown", type=Path, help="write the table here (else print it)")
    args = parser.parse_args()
    if (args.raw is None) == (args.from_json is None):
        parser.error("give either the raw pytest-benchmark JSON or --from-json")
    if args.from_json:
        summary = json.loads(args.from_json.read_text())
    else:
        summary = condense(json.loads(args.raw.read_text()))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    table = markdown(summary)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    else:
        print(table)


if __name__ == "__main__":
    main()
