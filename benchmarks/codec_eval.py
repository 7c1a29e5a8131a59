"""Trained policies through every codec: open loop and closed loop (``shmvec.fidelity.closed_loop``).

    python benchmarks/learning_curve.py --task stripes --codec raw --seeds 0,1,2 --save-models /tmp/models
    python benchmarks/codec_eval.py --task stripes --models /tmp/models --seeds 0,1,2 --episodes 30 \\
        --json benchmarks/results/codec_eval_stripes.json
    python benchmarks/codec_eval.py --smoke --task stripes --models /tmp/models --json /tmp/ce.json

Each raw-trained model (``TASK_shm_SEED.zip``, saved by ``learning_curve.py --save-models``) plays
``--episodes`` episodes on raw observations and the same episodes (same reset seeds) through each
codec; per model and codec the JSON keeps the closed-loop report (return difference with its 95%
CI, the verdict against the raw policy's episode-to-episode spread, the on-trajectory action
change rate) and the open-loop figures on the raw run's frames, plus each codec's compression
ratio and PSNR on ``--frames`` random-action frames of the task.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from learning_curve import TASK_NAMES, task_env  # benchmarks/ is the script's path

from shmvec import fidelity
from shmvec.codecs import parse

CODECS = "delta,jpeg:quality=95,jpeg:quality=75,jpeg:quality=50,jpeg:quality=25,webp:quality=75"


def evaluate(
    task: str, models: Path, seeds: list[int], codecs: list[str], episodes: int, frames: int
) -> dict:
    """The study's figures for one task (see the module docstring)."""
    env_fn = task_env(TASK_NAMES[task])
    sample = fidelity.collect_frames(env_fn, frames, seed=0)
    out: dict[str, Any] = {"task": TASK_NAMES[task], "episodes": episodes, "seeds": seeds, "frames": frames}
    out["codecs"] = {c: fidelity.check(parse(c), sample).to_dict() for c in codecs}
    out["models"] = []
    for seed in seeds:
        model = fidelity.load_model(str(models / f"{task}_shm_{seed}.zip"))
        # Evaluation episodes start at seed 10,000: none of them is a training episode's reset.
        reports = fidelity.closed_loop(model, env_fn, [parse(c) for c in codecs], episodes, 10_000)
        out["models"].append({"seed": seed, "closed_loop": dict(zip(codecs, (r.to_dict() for r in reports)))})
        print(
            f"seed {seed}: " + ", ".join(f"{c} {r.verdict()}" for c, r in zip(codecs, reports)),
            file=sys.stderr,
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--task", default="minigrid", choices=sorted(TASK_NAMES), help="which task's models")
    parser.add_argument(
        "--models", type=Path, required=True, help="folder of learning_curve.py --save-models"
    )
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds of the models")
    parser.add_argument("--codec", default=CODECS, help="comma-separated codecs")
    parser.add_argument("--episodes", type=int, default=30, help="paired episodes per model and codec")
    parser.add_argument("--frames", type=int, default=300, help="random-action frames for ratio and PSNR")
    parser.add_argument("--smoke", action="store_true", help="seed 0, 3 episodes, 20 frames, two codecs")
    parser.add_argument("--json", type=Path, required=True, help="write the figures here")
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.episodes, args.frames, args.codec = "0", 3, 20, "delta,jpeg:quality=25"
    seeds = [int(s) for s in args.seeds.split(",")]
    result = evaluate(args.task, args.models, seeds, args.codec.split(","), args.episodes, args.frames)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
