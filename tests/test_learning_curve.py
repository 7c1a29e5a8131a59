"""Learning curves: the arithmetic of shmvec.bench.curves, the committed result and its table, the
benchmark's smoke run, and ``shmvec bench --train --plot``."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from shmvec.bench import curves
from tests.helpers import ROOT, require, run_python

# (seconds, env steps, return): a run that learns, 10 episodes.
RUN = [(float(i), 100 * i, r) for i, r in enumerate([0, 0, 0, 0, 0, 1, 1, 1, 1, 1], start=1)]


def test_curve_is_the_mean_of_the_last_window_episodes_and_holds_after_the_run():
    grid = np.array([0.5, 1.0, 5.0, 7.0, 10.0, 11.0])
    got = curves.curve(RUN, 0, grid, window=4)
    # Before 4 episodes: NaN; 7.0: episodes 4..7 -> returns 0, 0, 1, 1; 10.0 and after: the last 4.
    np.testing.assert_array_equal(got, [np.nan, np.nan, 0.0, 0.5, 1.0, 1.0])
    np.testing.assert_array_equal(curves.curve(RUN, 1, np.array([800.0]), window=4), [0.75])


def test_time_to_a_threshold_and_its_spread_over_seeds():
    assert curves.time_to(RUN, 0.5, window=4) == RUN[6]  # episodes 4..7: 0, 0, 1, 1
    assert curves.time_to(RUN, 1.5, window=4) is None
    slower = [(t + 2.0, s + 200, r) for t, s, r in RUN]
    reached = curves.reached([RUN, slower, RUN[:5]], 0.5, window=4)
    assert (reached.seconds, reached.steps, reached.missed) == ([7.0, 9.0], [700, 900], 1)
    assert reached.describe() == "8.0 s (7.0-9.0), 800 env steps (700-900); 1 seeds did not reach it"


def _learning_curve():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import learning_curve
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return learning_curve


def test_committed_table_is_rendered_from_the_committed_json():
    result = json.loads((ROOT / "benchmarks" / "results" / "learning_curve.json").read_text())
    table = (ROOT / "benchmarks" / "results" / "learning_curve.md").read_text()
    assert _learning_curve().markdown(result) == table, (
        "learning_curve.md is stale: python benchmarks/learning_curve.py --from-json "
        "benchmarks/results/learning_curve.json --markdown benchmarks/results/learning_curve.md"
    )
    assert len(result["seeds"]) >= 3 and {r["config"] for r in result["runs"]} == set(
        _learning_curve().CONFIGS
    )
    assert _learning_curve().problems(result) == []


def test_the_docs_show_the_committed_figure_with_its_command():
    page = (ROOT / "docs" / "learning-curve.md").read_text()
    assert "![" in page and "(img/learning_curve.png)" in page
    assert "python benchmarks/learning_curve.py --from-json benchmarks/results/learning_curve.json" in page
    assert (ROOT / "docs" / "img" / "learning_curve.png").stat().st_size > 10_000


def test_compacted_episodes_keep_the_last_window_s_mean_and_the_steps():
    run = [[float(i), 10 * i, float(i % 7)] for i in range(1, 128)]
    small = _learning_curve().compact({"runs": [{"config": "shm", "episodes": run}]}, 10)
    entries = small["runs"][0]["episodes"]
    assert small["episode_chunk"] == 10 and len(entries) == 13 and entries[-1][:2] == run[-1][:2]
    assert np.mean([e[2] for e in entries[-5:]]) == pytest.approx(
        np.mean([e[2] for e in run[-50:]]), abs=1e-3
    )
    assert _learning_curve().window(small) == 5


@pytest.mark.sb3
def test_a_lossless_codec_in_the_training_loop_gives_the_raw_parameters():
    """Same seed, a few updates on StripesEnv: delta must give raw's parameters bit for bit; a
    coarse JPEG (the stripes gone) must not, or the comparison could not fail."""
    lc = _learning_curve()
    hp = dict(lc.HP, n_steps=16, batch_size=64, n_epochs=1)
    runs = {
        c: lc.run_one(c, 0, 256, hp, task="StripesEnv") for c in ("shm", "shm+delta", "shm+jpeg:quality=25")
    }
    assert runs["shm+delta"]["params_sha256"] == runs["shm"]["params_sha256"]
    assert runs["shm+delta"]["episodes"][-1][1:] == runs["shm"]["episodes"][-1][1:]
    assert runs["shm+jpeg:quality=25"]["params_sha256"] != runs["shm"]["params_sha256"]
    result = {"seeds": [0], "runs": [{"config": c, "seed": 0, **r} for c, r in runs.items()]}
    assert lc.problems(result) == []
    result["runs"][1]["params_sha256"] = "0" * 64
    assert lc.problems(result) == ["seed 0: shm+delta's parameters differ from raw shm's (a lossless codec)"]


@pytest.mark.slow
def test_smoke_run_trains_every_configuration(tmp_path):
    require("minigrid", "pip install minigrid")
    out = tmp_path / "lc.json"
    proc = run_python(
        *(str(ROOT / "benchmarks" / "learning_curve.py"), "--smoke", "--json", str(out)),
        *("--markdown", str(tmp_path / "lc.md"), "--plot", str(tmp_path / "lc.png")),
        timeout=900,
    )
    # Exit 1 would say that ShmVecEnv's episodes differ from DummyVecEnv's for the same seed.
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    runs = {r["config"]: r for r in result["runs"]}
    assert set(runs) == {"dummy", "subproc", "shm", "cleanrl"}
    assert all(r["episodes"] and r["wall_s"] > 0 for r in runs.values())
    assert [e[1:] for e in runs["shm"]["episodes"]] == [e[1:] for e in runs["dummy"]["episodes"]]
    assert runs["shm"]["params_sha256"] == runs["dummy"]["params_sha256"]
    assert (tmp_path / "lc.png").stat().st_size > 10_000


@pytest.mark.slow
def test_bench_train_plots_the_learning_curves(tmp_path):
    plot = tmp_path / "curves.png"
    proc = run_python(
        *("-m", "shmvec", "bench", "--train", "--env", "tests.envs:TinyImageEnv", "--backends", "dummy,shm"),
        *(
            "--n-envs",
            "2",
            "--train-steps",
            "256",
            "--seeds",
            "0,1",
            "--threshold",
            "-1",
            "--plot",
            str(plot),
        ),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dummy: mean return >= -1 after " in proc.stdout and "shm: mean return >= -1 after " in proc.stdout
    assert plot.stat().st_size > 10_000


@pytest.mark.slow
def test_codec_study_smoke_run(tmp_path):
    """The study's two scripts, tiny: codecs in the training loop, then the raw-trained model
    through each codec (closed and open loop)."""
    models, out, evaluated = tmp_path / "models", tmp_path / "lc.json", tmp_path / "ce.json"
    proc = run_python(
        *(str(ROOT / "benchmarks" / "learning_curve.py"), "--smoke", "--task", "stripes", "--json", str(out)),
        *("--codec", "raw,delta,jpeg:quality=25", "--save-models", str(models)),
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]  # 1: delta's parameters differ from raw's
    result = json.loads(out.read_text())
    assert [r["config"] for r in result["runs"]] == ["shm", "shm+delta", "shm+jpeg:quality=25"]
    assert "| codec jpeg:quality=25 |" in proc.stdout
    proc = run_python(
        *(
            str(ROOT / "benchmarks" / "codec_eval.py"),
            "--smoke",
            "--task",
            "stripes",
            "--models",
            str(models),
        ),
        *("--json", str(evaluated)),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loop = json.loads(evaluated.read_text())["models"][0]["closed_loop"]
    assert loop["delta"]["return_difference"] == 0 and loop["delta"]["verdict"] == "within"
    assert len(loop["jpeg:quality=25"]["decoded_returns"]) == 3


@pytest.mark.parametrize("task", ["minigrid", "stripes"])
def test_codec_study_tables_are_rendered_from_the_committed_json(task):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import plot_codec_learning
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    results = ROOT / "benchmarks" / "results"
    learned = json.loads((results / f"codec_learning_{task}.json").read_text())
    assert _learning_curve().markdown(learned) == (results / f"codec_learning_{task}.md").read_text(), (
        f"codec_learning_{task}.md is stale: python benchmarks/learning_curve.py --from-json "
        f"benchmarks/results/codec_learning_{task}.json --markdown benchmarks/results/codec_learning_{task}.md"
    )
    assert _learning_curve().problems(learned) == []  # delta's parameters are raw's, seed for seed
    assert plot_codec_learning.eval_markdown(task) == (results / f"codec_eval_{task}.md").read_text(), (
        "stale: python benchmarks/plot_codec_learning.py"
    )
