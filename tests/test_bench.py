"""``shmvec bench`` end to end on a tiny env, its breakdown, its errors, and the README results block.

Nothing here asserts on speed: the machines are shared and noisy. Budgets are fractions of a second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from shmvec.bench import report
from shmvec.bench.runner import BenchSpec, Sample
from tests.envs import TINY
from tests.helpers import require

ROOT = Path(__file__).resolve().parent.parent


def _bench(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "shmvec", "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def test_cli_end_to_end(tmp_path):
    readme = tmp_path / "README.md"
    start, end = report.README_START.format(name="r"), report.README_END.format(name="r")
    readme.write_text(f"# x\n\n{start}\nold\n{end}\n\nafter\n")
    out = _bench(
        "--env", TINY, "--backends", "dummy,shm,async", "--n-envs", "1,2", "--n-workers", "1,2",
        "--repeats", "2", "--seconds", "0.3", "--json", str(tmp_path / "r.json"),
        "--plot", str(tmp_path / "r.png"), "--readme", str(readme),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr

    data = json.loads((tmp_path / "r.json").read_text())
    assert set(data) >= {
        "spec",
        "machine",
        "obs_bytes",
        "alone",
        "alone_cpu",
        "points",
        "recommendation",
        "batch_copy_s",
    }
    assert set(data["batch_copy_s"]) == {"1", "2"}
    assert data["obs_bytes"] == 16 * 16 * 3
    assert len(data["alone"]) == 2
    labels = [p["label"] for p in data["points"]]
    # shm with 2 workers is only measured where there are 2 envs.
    assert labels == [
        "dummy n=1",
        "dummy n=2",
        "shm n=1 w=1",
        "shm n=2 w=1",
        "shm n=2 w=2",
        "async n=1",
        "async n=2",
    ]
    sample_fields = {f.name for f in fields(Sample)}
    for p in data["points"]:
        assert len(p["samples"]) == 2
        for s in p["samples"]:
            assert set(s) == sample_fields
            assert s["steps_per_s"] > 0 and s["batch_steps"] > 0 and s["startup_s"] > 0
            assert s["pss_bytes"] > 0 and s["rss_bytes"] >= s["pss_bytes"] * 0.5
        summary = p["steps_per_s"]
        assert summary["ci_low"] <= summary["median"] <= summary["ci_high"]
        assert p["ceiling"] > 0
        assert set(p["breakdown"]) == {"env_s", "ipc_s", "copy_s", "policy_s", "send_s", "unattributed_s"}
    shm = next(p for p in data["points"] if p["label"] == "shm n=2 w=2")
    assert all(s["processes"] == 2 and s["shm_bytes"] > 0 for s in shm["samples"])

    rec = data["recommendation"]
    assert rec["best"] in labels
    best = max(data["points"], key=lambda p: p["steps_per_s"]["median"])
    assert rec["best"] == best["label"]
    assert rec["best"] in rec["text"] and rec["runner_up"] in rec["text"]
    assert rec["best"] in out.stdout  # the table and the recommendation are printed

    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = readme.read_text()
    assert "old" not in text and "after" in text and "| dummy n=1 |" in text and "r.png" in text

    # Reporting again from the JSON gives the same README block, without measuring.
    readme2 = tmp_path / "README2.md"
    readme2.write_text(f"{start}\n{end}\n")
    again = _bench(
        "--from-json", str(tmp_path / "r.json"), "--readme", str(readme2), "--plot", str(tmp_path / "r.png")
    )
    assert again.returncode == 0, again.stderr
    assert report.readme_block(readme2, "r") == report.readme_block(readme, "r")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "NoSuchEnv-v0"], "cannot create env 'NoSuchEnv-v0'"),
        (["--env", TINY, "--backends", "dummy,nope"], "unknown backend 'nope'"),
        (["--env", TINY, "--n-envs", "0,2"], "--n-envs must be integers >= 1"),
        (["--env", TINY, "--start-method", "forkk"], "not one of 'fork'"),
        (["--env", TINY, "--n-envs", "two"], "--n-envs must be comma-separated integers"),
        (["--env", "tests.envs:make_broken_env"], "RuntimeError: this factory is broken"),
        (["--env", "tests.envs:no_such_factory"], "AttributeError"),
        (["--env", TINY, "--policy", "sac"], "policy must be 'none' or ALGO:POLICY"),
        (["--env", TINY, "--train", "--backends", "async"], "cannot be trained on"),
        (["--from-json", "/nonexistent.json"], "cannot read results"),
        (["--env", TINY, "--env-kwargs", "[1]"], "--env-kwargs must be a JSON object"),
        (["--env", TINY, "--readme", "README.md"], "--readme needs --json or --from-json"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(args, message):
    out = _bench(*args, "--repeats", "1", "--seconds", "0.1", timeout=120)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("shmvec bench: error: ") and message in lines[0], lines[0]


def test_train_dummy_and_shm_learn_identical_parameters():
    from shmvec.bench.train import TrainResult, train
    from shmvec.bench.train_report import table

    result = train(
        "tests.envs:TinyImageEnv", ("dummy", "shm"), "ppo:CnnPolicy", n_envs=2, total_steps=64, seeds=(0,)
    )
    assert result.identical_to() == {"shm": [True]}
    assert result.problems() == []
    assert [r.backend for r in result.runs] == ["dummy", "shm"]
    assert all(0 < r.step_s < r.wall_s for r in result.runs)
    # The two phases apart: the env steps happen inside the rollouts, both inside the run.
    assert all(
        r.step_s < r.rollout_s and r.update_s > 0 and r.rollout_s + r.update_s < r.wall_s for r in result.runs
    )
    assert result.wake_up_us is not None and result.wake_up_us > 0
    assert all(r.other_cores is not None and r.other_cores >= 0 for r in result.runs)
    stored = json.loads(json.dumps(result.to_dict()))
    assert TrainResult.from_dict(stored).to_dict() == stored
    assert "1/1 seeds" in table(result)
    result.cpus = 2
    dummy = result.runs[0]
    expected = (dummy.wall_s - dummy.step_s / 2) / dummy.wall_s
    assert f"on 2 CPUs would take {expected:.2f}x dummy's wall time" in table(result)


@pytest.mark.parametrize("name", ["pong", "synth512_1ms"])
def test_readme_results_are_rendered_from_the_committed_json(name):
    results = ROOT / "benchmarks" / "results" / f"{name}.json"
    block = report.markdown(report.read_json(results), f"img/{name}.png")
    assert report.readme_block(ROOT / "docs" / "benchmarks.md", name) == block, (
        "docs/benchmarks.md results block is stale: run the commands in its Results section"
    )
    assert (ROOT / "docs" / "img" / f"{name}.png").exists()


def test_a_main_process_that_spins_while_waiting_is_named():
    from shmvec.bench.recommend import recommend, spinning

    result = report.read_json(ROOT / "benchmarks" / "results" / "pong.json")
    assert spinning(result) == {}
    assert "OMP_WAIT_POLICY" not in recommend(result)["text"]
    spun = [p for p in result.points if p.config.backend == "subproc"]
    for point in spun:
        for sample in point.samples:
            sample.wait_cpu_s = 0.9 * sample.wait_s  # what a policy's spinning OpenMP pool looks like
    for point in result.points:
        if point.config.backend == "dummy":  # an in-process backend computes while it "waits"
            for sample in point.samples:
                sample.wait_cpu_s = sample.wait_s
    found = spinning(result)
    assert sorted(found) == sorted(p.config.label for p in spun)
    assert all(abs(cores - 0.9) < 1e-9 for cores in found.values())
    assert "OMP_WAIT_POLICY=PASSIVE" in recommend(result)["text"]


def _load_benchmark_script(name: str):
    import importlib.util

    # As when run as a script: benchmarks/ is on the path (ppo_zoo imports policy_loop's recipe).
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.append(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("script", "name"),
    [
        ("policy_loop", "policy_loop"),
        ("policy_loop", "policy_loop_random"),
        ("tianshou_loop", "tianshou_loop_random"),
        ("ppo_zoo", "ppo_zoo"),
        ("matrix_summary", "matrix"),
    ],
)
def test_result_tables_are_rendered_from_the_committed_json(script, name):
    results = ROOT / "benchmarks" / "results"
    rendered = _load_benchmark_script(script).markdown(json.loads((results / f"{name}.json").read_text()))
    assert (results / f"{name}.md").read_text() == rendered + "\n", (
        f"benchmarks/results/{name}.md is stale: regenerate it with benchmarks/{script}.py --from-json"
    )


def test_tianshou_page_shows_the_committed_table():
    table = (ROOT / "benchmarks" / "results" / "tianshou_loop_random.md").read_text()
    assert table in (ROOT / "docs" / "guides" / "tianshou.md").read_text() + "\n", (
        "docs/guides/tianshou.md's table differs from benchmarks/results/tianshou_loop_random.md"
    )


def test_best_case_spreads_only_the_env_work_over_the_cores():
    from shmvec.bench.train import best_case

    # 6 s of a 10 s run in step: on 2 cores that work takes 3 s at best, the other 4 s stay.
    assert best_case(10.0, 6.0, 2) == pytest.approx(0.7)
    assert best_case(10.0, 6.0, 1) == pytest.approx(1.0)
    bounds = _load_benchmark_script("ppo_zoo").bounds
    dummy = {"rollout_s": 10.0, "env_s": 6.0, "train_s": 20.0, "learn_s": 30.0}
    assert bounds(dummy, 2) == pytest.approx((0.7, 0.9))
    assert bounds({"rollout_s": 10.0, "env_s": float("nan"), "learn_s": 30.0}, 2) is None  # older JSON
    assert bounds(dummy, None) is None


def test_policy_loop_table_gives_the_ideal_from_dummys_forward_passes_and_env_work():
    figures = {"steps_per_s": 1000.0, "policy_ms": 2.0, "policy_p90_ms": 2.5, "env_ms": 4.0}
    figures |= {"main_cpu_ms": 6.0, "steal": 0.0}
    spec = {"rounds": 1, "batches": 10, "n_envs": 8, "actions": "policy"}
    result = {"spec": spec, "torch_threads": 2, "rounds": {"dummy": [figures]}}
    markdown = _load_benchmark_script("policy_loop").markdown
    assert "ideal" not in markdown(result), "a JSON from before cpus was recorded"
    # 2 ms of forward pass and 4 ms of env work, spread over 2 CPUs: 6 ms become 4 ms.
    assert "would reach 1.50x DummyVecEnv" in markdown({**result, "cpus": 2})


def test_matrix_verdicts_name_the_fastest_multi_process_backend():
    summary = {
        "cases": [
            {"workload": "w", "backend": b, "n_envs": 8, "steps_per_s": r, "low": r * 0.9, "high": r * 1.1}
            for b, r in (("dummy", 900.0), ("subproc", 100.0), ("shm", 300.0), ("async", 280.0))
        ]
    }
    (row,) = _load_benchmark_script("matrix_summary").verdicts(summary)
    assert row["winner"] == "shm" and row["rival"] == "async"  # dummy is not multi-process
    assert row["ratio"] == pytest.approx(300 / 280) and not row["clear"]


def test_bad_arguments_fail_before_heavy_imports():
    # A typo must not cost the seconds that importing SB3 and torch takes.
    code = (
        "import sys; from shmvec.cli.main import main; "
        "rc = main(['bench', '--n-envs', '0']); print(rc, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.stdout.split() == ["2", "False"], out.stdout + out.stderr
    assert "--n-envs must be integers >= 1" in out.stderr


def test_default_start_method_is_the_librarys():
    from shmvec.engine.start_methods import default_start_method

    assert BenchSpec().start_method is None  # resolved when measuring: the library's default
    assert default_start_method() == "forkserver"
    with pytest.raises(ValueError, match="'forkk' is not one of 'fork', 'spawn', 'forkserver'"):
        BenchSpec(start_method="forkk").validate()


def _disturbed_copy(name: str) -> report.BenchResult:
    result = report.read_json(ROOT / "benchmarks" / "results" / f"{name}.json")
    for p in result.points:
        p.disturbed = ["other processes used 1.6 cores"]
        for s in p.samples:
            s.other_cores = 1.6
    result.alone_other_cores = [1.6] * len(result.alone)
    return result


def test_disturbed_measurements_get_no_recommendation():
    from shmvec.bench.recommend import recommend

    result = _disturbed_copy("pong")
    rec = recommend(result)
    assert rec["declined"]
    assert rec["text"].startswith("No recommendation: the measurement was disturbed")
    assert "Best:" not in rec["text"] and "waits" not in rec["text"]
    # A loaded machine must not be read as an env that waits, nor raise the ceiling.
    result.alone_cpu = [0.4] * len(result.alone)
    assert result.cpu_fraction == 1.0
    assert "waits" not in recommend(result)["text"]


def test_quiet_committed_results_are_recommended():
    from shmvec.bench.recommend import recommend

    rec = recommend(report.read_json(ROOT / "benchmarks" / "results" / "pong.json"))
    assert rec["declined"] == [] and rec["text"].startswith("Best: shm n=8")


def test_terminal_report_fits_100_columns():
    for name in ("pong", "synth512_1ms"):
        for result in (
            report.read_json(ROOT / "benchmarks" / "results" / f"{name}.json"),
            _disturbed_copy(name),
        ):
            lines = report.table(result).splitlines()
            assert max(len(line) for line in lines) <= report.WIDTH, name


@pytest.mark.parametrize("name", ["policy_loop", "policy_loop_random"])
def test_policy_loop_tables_are_rendered_from_the_committed_json(name, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import policy_loop

    results = ROOT / "benchmarks" / "results"
    table = policy_loop.markdown(json.loads((results / f"{name}.json").read_text()))
    assert (results / f"{name}.md").read_text().strip() == table.strip(), (
        f"{name}.md is stale: python benchmarks/policy_loop.py --from-json benchmarks/results/{name}.json "
        f"--markdown > benchmarks/results/{name}.md"
    )


def test_wake_cost_splits_a_workers_cpu_from_its_envs():
    wake_cost = _load_benchmark_script("wake_cost")
    alone = wake_cost.measure("alone", False, 0.3)
    worker = wake_cost.measure("worker", False, 0.3)
    assert alone["cpu_us_per_env_step"] > 0
    # /proc counts a process's CPU in 10 ms ticks: a worker starved by a busy machine can read 0.
    assert worker["workers_cpu_us_per_env_step"] >= 0 and worker["main_cpu_us_per_batch"] > 0
    assert worker["env_steps_per_s"] > 0
    shares = ("user_pct", "system_pct", "idle_pct", "steal_pct")
    assert abs(sum(worker[k] for k in shares) - 100) < 1e-6


def test_ale_frame_loop_compiled_steps_as_python_and_a_changed_loop_is_caught(monkeypatch):
    """benchmarks/ale_frame_loop.py compares a compiled frame loop with the Python one only after
    checking that both step alike; a Python loop that skips a frame's screen must be caught."""
    pytest.importorskip("ale_py", reason="needs the atari extra")
    frame_loop = _load_benchmark_script("ale_frame_loop")
    assert frame_loop.check("BreakoutNoFrameskip-v4", 300) is None
    real = frame_loop.python_step

    def skips_a_screen(ale, action, screens, out):
        real(ale, action, screens, out)
        screens[0] = 0

    monkeypatch.setattr(frame_loop, "python_step", skips_a_screen)
    assert "screens" in frame_loop.check("BreakoutNoFrameskip-v4", 300)
    monkeypatch.setattr(frame_loop, "python_step", real)
    result = frame_loop.measure("BreakoutNoFrameskip-v4", rounds=1, seconds=0.05)
    assert result["floor_us"] > 0 and set(result) == {"floor_us", "python", "compiled"}
    timing = frame_loop.threads("BreakoutNoFrameskip-v4", 200)
    assert timing["serial_s"] > 0 and timing["threads_s"] > 0


def test_the_host_line_carries_the_wake_up_cost_and_the_emulator_floor():
    from shmvec.bench import host

    wake = host.wake_up_us(round_trips=200, rounds=3)
    assert 0 < wake < float("inf")
    assert host.describe(None) == "Host: wake-up cost not recorded"
    assert host.describe(41.6, 179.4) == (
        "Host: wake-up 42 µs (pipe round trip between two processes); emulator floor 179 µs CPU per env "
        "step (ale.act x 4, one process)"
    )
    require("ale_py", 'pip install -e ".[atari]"')
    assert host.emulator_floor_us("PongNoFrameskip-v4", steps=200) > 0


@pytest.mark.parametrize("page", ["benchmarks.md", "guides/choosing.md"])
def test_the_whole_training_table_is_rendered_from_the_committed_json(page):
    from shmvec.bench.train import TrainResult
    from shmvec.bench.train_report import markdown

    result = TrainResult.from_dict(
        json.loads((ROOT / "benchmarks" / "results" / "train_atari.json").read_text())
    )
    assert report.readme_block(ROOT / "docs" / page, "train_atari") == markdown(result), (
        f"docs/{page}'s whole-training block is stale: shmvec bench --train --from-json "
        "benchmarks/results/train_atari.json --readme docs/" + page
    )
    # What the table is for: the VecEnvs trained to the same parameters, the split measured.
    assert set(result.by_backend()) == {"dummy", "subproc", "shm"}
    assert result.problems() == []  # dummy and shm: the same parameters for every seed
    assert all(r.rollout_s > 0 and r.update_s > 0 for r in result.runs)
    assert result.wake_up_us is not None and result.floor_us is not None
    # The ratio a reader of the README's "x SubprocVecEnv" compares with, taken here by hand.
    runs = {(r.backend, r.seed): r for r in result.runs}
    learn = sorted(
        (runs["subproc", s].rollout_s + runs["subproc", s].update_s)
        / (runs["shm", s].rollout_s + runs["shm", s].update_s)
        for s in result.seeds
    )
    mid = learn[len(learn) // 2]  # three seeds: the median is the middle one
    expected = f"SubprocVecEnv, seed by seed: learn {mid:.2f} ({learn[0]:.2f}-{learn[-1]:.2f})x"
    assert expected in markdown(result)


def test_interleaved_rounds_rotate_the_order_and_configs_are_checked(tmp_path):
    """Each round starts one configuration later, so a slow phase of the machine does not always hit
    the same one; an unknown ``--configs`` name is refused with the known ones."""
    import argparse

    policy_loop = _load_benchmark_script("policy_loop")
    log = tmp_path / "order.txt"
    script = tmp_path / "one.py"
    script.write_text(
        "import json, sys\n"
        f"open({str(log)!r}, 'a').write(sys.argv[2] + '\\n')\n"
        "print(json.dumps({'config': sys.argv[2], 'argv': sys.argv[3:], 'steps_per_s': 1.0}))\n"
    )
    seen: list[int] = []
    rows = policy_loop.interleaved(str(script), ["a", "b", "c"], 3, ["--x=1"], seen.append)
    assert log.read_text().split() == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert seen == [0, 1, 2]
    assert {k: [r["config"] for r in v] for k, v in rows.items()} == {k: [k] * 3 for k in "abc"}
    assert rows["a"][0]["argv"] == ["--x=1"]
    parse = policy_loop.config_list(("a", "b"))
    assert parse("b,a") == ["b", "a"]
    with pytest.raises(argparse.ArgumentTypeError, match="choose from a, b"):
        parse("a,zz")
    with pytest.raises(argparse.ArgumentTypeError):
        parse("")
