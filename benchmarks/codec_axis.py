"""The codec axis of ``learning_curve.py``: ShmVecEnv's options for a configuration ``shm+CODEC``,
and the compaction of a result's episodes for a committed file."""

from __future__ import annotations

import statistics
from typing import Any


def codec_options(config: str) -> dict[str, Any]:
    """ShmVecEnv's options for a configuration ``shm+CODEC`` (none for the others). A lossy codec
    needs a tolerance: max error 255 never trips on uint8, so training sees what the codec gives."""
    if not config.startswith("shm+"):
        return {}
    from shmvec.codecs import Tolerance, parse

    codec = parse(config[len("shm+") :])
    return {"codec": codec} | ({} if codec.lossless else {"tolerance": Tolerance(max_abs_error=255)})


def compact(result: dict[str, Any], chunk: int) -> dict[str, Any]:
    """``result`` with every ``chunk`` consecutive episodes of a run merged into one entry (their mean
    return, the last one's seconds and env steps), for a committed file a tenth the size. Chunks are
    counted from the run's end: the mean of its last 5 entries of 10 is that of its last 50 episodes."""
    runs = []
    for r in result["runs"]:
        eps = r["episodes"]
        first = len(eps) % chunk  # counted from the end, so the last entries are whole chunks
        merged = ([eps[:first]] if first else []) + [
            eps[k : k + chunk] for k in range(first, len(eps), chunk)
        ]
        episodes = [
            [round(c[-1][0], 2), c[-1][1], round(statistics.fmean(e[2] for e in c), 4)] for c in merged
        ]
        runs.append(dict(r, episodes=episodes))
    return dict(result, runs=runs, episode_chunk=chunk * result.get("episode_chunk", 1))
