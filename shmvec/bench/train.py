"""``shmvec bench --train``: train the same algorithm with each backend over a fixed set of seeds, so a
faster configuration is never judged on steps/s alone.

Per backend and seed: wall-clock time, the seconds of it in the rollouts (``collect_rollouts``: the
policy's forward passes and the env steps) and in the updates (``train``), the seconds spent in the
VecEnv's ``step`` (all env work, IPC included), the mean return of the last (up to 100) finished
episodes, every finished episode with when it finished (for learning curves:
:mod:`shmvec.bench.curves`), and a hash of the learned parameters. From DummyVecEnv's runs the table
also gives the best wall time any multi-process VecEnv could reach on this machine
(:func:`best_case`), the yardstick for how much of the remaining time a faster VecEnv could still
take away. Backends that must be equivalent (DummyVecEnv and ShmVecEnv, both float32 rewards) must
give identical parameters for the same seed; SubprocVecEnv returns float64
rewards, which may change the last bits of training.

With ``recipe="sb3-atari"`` every backend trains on SB3's Atari recipe (:mod:`shmvec.bench.recipes`:
``make_atari_env`` and 4 frames stacked, by ``VecFrameStack`` or in ShmVecEnv's workers), PPO with
rl-zoo3's Atari hyperparameters (:data:`ATARI_PPO`). The table gives seconds per 1,000 env steps
and the host's wake-up cost (:mod:`shmvec.bench.host`) beside the ratios.
"""

from __future__ import annotations

import functools
import hashlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from shmvec.bench import curves, host, system
from shmvec.bench.backends import check_backend, make_vec_env
from shmvec.bench.envs import check_env_name
from shmvec.bench.policy import algo_class, parse_policy
from shmvec.bench.recipes import check_recipe, recipe_env
from shmvec.engine.groups import usable_cpus

# Backends that must train identically to DummyVecEnv for the same seed.
EQUIVALENT = ("dummy", "shm", "shm-pin", "shm-portable")
# The gymnasium adapters are not SB3 VecEnvs: SB3 cannot train on them.
_NOT_TRAINABLE = ("async", "sync", "shm-vector", "envpool", "shm-pool", "ale-vec", "ale-vec-async")
#: PPO's hyperparameters for the ``sb3-atari`` recipe: rl-zoo3's ``atari`` ones (its linear schedules
#: of the learning rate and clip range kept constant), for 8 envs.
ATARI_PPO = {
    "n_steps": 128,
    "batch_size": 256,
    "n_epochs": 4,
    "learning_rate": 2.5e-4,
    "clip_range": 0.1,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
}


@dataclass
class TrainRun:
    """One training run."""

    backend: str
    seed: int
    wall_s: float
    step_s: float  # of wall_s, in the VecEnv's step
    mean_return: float | None  # None: no episode finished
    episodes: int
    params_sha256: str
    # (seconds since the VecEnv was built, env steps, return) per finished episode
    curve: list[curves.Episode] = field(default_factory=list)
    rollout_s: float = 0.0  # of wall_s, in collect_rollouts (forward passes and env steps)
    update_s: float = 0.0  # of wall_s, in train (the gradient updates)
    other_cores: float | None = None  # CPU other processes took during learn, in cores: a loaded host


@dataclass
class TrainResult:
    """All runs, and for each backend whether its parameters equal DummyVecEnv's per seed."""

    env: str
    policy: str
    n_envs: int
    total_steps: int
    seeds: list[int]
    runs: list[TrainRun] = field(default_factory=list)
    cpus: int = field(default_factory=usable_cpus)
    threshold: float | None = None  # a return: the table says when each backend's seeds reached it
    recipe: str | None = None
    wake_up_us: float | None = None  # the host's (shmvec.bench.host), measured before the runs
    floor_us: float | None = None  # the recipe's emulator floor, CPU per env step
    command: str | None = None  # what measured it, e.g. "shmvec bench --train ..."

    def by_backend(self) -> dict[str, list[TrainRun]]:
        """The runs grouped by backend, in the order they ran."""
        out: dict[str, list[TrainRun]] = {}
        for r in self.runs:
            out.setdefault(r.backend, []).append(r)
        return out

    def identical_to(self, reference: str = "dummy") -> dict[str, list[bool]]:
        """Per backend, per seed: parameters identical to ``reference``'s (empty if not run)."""
        runs = self.by_backend()
        if reference not in runs:
            return {}
        ref = {r.seed: r.params_sha256 for r in runs[reference]}
        return {b: [ref[r.seed] == r.params_sha256 for r in rs] for b, rs in runs.items() if b != reference}

    def problems(self) -> list[str]:
        """Equivalent backends whose parameters differ from DummyVecEnv's."""
        return [
            f"{b} parameters differ from dummy for {same.count(False)} of {len(same)} seeds"
            for b, same in self.identical_to().items()
            if b in EQUIVALENT and not all(same)
        ]

    def plot(self, path: Path) -> None:
        """Write the learning curves (mean return over the seeds, with their range, against
        wall-clock seconds and against env steps) to the PNG ``path``."""
        runs = {b: [r.curve for r in rs] for b, rs in self.by_backend().items()}
        title = f"{self.policy} on {self.env}, {self.n_envs} envs, {self.cpus} CPUs"
        curves.plot(runs, path, title, self.threshold)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable: every run, which backends learned DummyVecEnv's parameters, problems."""
        d = asdict(self)
        d["identical_to_dummy"] = self.identical_to()
        d["problems"] = self.problems()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainResult:
        """The result :meth:`to_dict` wrote (the derived keys recomputed, not read)."""
        names = {f for f in cls.__dataclass_fields__}
        result = cls(**{k: v for k, v in d.items() if k in names and k != "runs"})
        result.runs = [TrainRun(**r) for r in d["runs"]]
        return result


def best_case(total_s: float, step_s: float, cpus: int) -> float:
    """The least time a multi-process VecEnv could take, as a fraction of DummyVecEnv's ``total_s``
    seconds of which ``step_s`` were spent in its ``step``: that env work spread over ``cpus`` cores
    at no cost, and everything else (forward passes, rollout buffer, training) left as it was, since
    SB3's loop runs it in the main process between the steps. An ideal, not a prediction: it ignores
    IPC and start-up, and assumes the env work divides evenly."""
    return (total_s - step_s * (1 - 1 / cpus)) / total_s


class Stopwatch:
    """Counts the seconds spent in calls of one method of one object, by wrapping it on the object.

    ``Stopwatch(model.get_env(), "step")`` times all env work of an SB3 model, IPC included: the
    ``step`` of the outermost VecEnv it holds (SB3 may have wrapped the given one, e.g. in
    ``VecTransposeImage``), where its rollout loops call it.

    :param owner: the object, e.g. an SB3 algorithm before ``learn``.
    :param name: the method's name.
    """

    def __init__(self, owner: Any, name: str) -> None:
        self.seconds = 0.0
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        setattr(owner, name, timed)
        self._owner, self._name = owner, name

    def remove(self) -> None:
        """Unwrap the method: an SB3 model saved afterwards must not pickle the wrapper (it holds the
        bound method, and with it the VecEnv)."""
        self._owner.__dict__.pop(self._name, None)


def _algo_kwargs(algo: str, n_envs: int, total_steps: int, recipe: str | None = None) -> dict[str, Any]:
    if algo == "ppo" and recipe == "sb3-atari":
        return dict(ATARI_PPO)
    # Short runs: rollouts small enough that several updates happen within total_steps.
    if algo == "ppo":
        n_steps = max(8, min(128, total_steps // (4 * n_envs)))
        return {"n_steps": n_steps, "batch_size": max(8, n_steps * n_envs // 4), "n_epochs": 2}
    if algo == "dqn":
        return {"buffer_size": max(100, total_steps), "learning_starts": min(100, total_steps // 4)}
    return {}


def _monitored(env_fn: Callable[[], gym.Env]) -> gym.Env:
    from stable_baselines3.common.monitor import Monitor

    return Monitor(env_fn())


def _params_hash(model: Any) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.policy.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def check_train_args(
    env: str,
    backends: Sequence[str],
    policy: str,
    n_envs: int,
    total_steps: int,
    seeds: Sequence[int],
    env_kwargs: dict[str, Any] | None,
    recipe: str | None = None,
) -> tuple[str, str]:
    """Check :func:`train`'s arguments (building the env once); the algorithm and policy names.

    :raises ValueError: for a bad env, backend, policy, count or recipe.
    """
    parsed = parse_policy(policy)
    if parsed is None:
        raise ValueError("--train needs a policy such as ppo:CnnPolicy, not 'none'")
    for b in backends:
        check_backend(b, recipe)
        if b in _NOT_TRAINABLE:
            raise ValueError(f"backend {b!r} is not an SB3 VecEnv and cannot be trained on")
    if n_envs < 1 or total_steps < 1 or not seeds:
        raise ValueError("--train needs n_envs >= 1, total steps >= 1 and at least one seed")
    if recipe is not None:
        check_recipe(recipe, env, env_kwargs)
    else:
        check_env_name(env, **(env_kwargs or {}))
    return parsed


def train_one(
    env_fn: Callable[[], gym.Env],
    backend: str,
    algo: str,
    policy: str,
    n_envs: int,
    total_steps: int,
    seed: int,
    algo_kwargs: dict[str, Any],
    start_method: str | None = None,
    options: dict[str, Any] | None = None,
    frame_stack: int | None = None,
) -> tuple[TrainRun, Any]:
    """Train once: ``n_envs`` Monitor-wrapped envs from ``env_fn`` in ``backend``; the run and the
    model. Wall-clock time and the episodes' times count from just before the VecEnv is built.

    :param options: shmvec's options for the backends shmvec builds, e.g. ``{"codec": "delta"}``
        (default None: none; see :func:`shmvec.bench.backends.make_vec_env`).
    :param frame_stack: frames to stack, the backend's way (a recipe's; its envs hold their own
        Monitor, so ``env_fn`` is not wrapped again); default None: none."""
    fn = env_fn if frame_stack else functools.partial(_monitored, env_fn)
    start = time.perf_counter()
    episodes: list[curves.Episode] = []
    venv = make_vec_env(backend, [fn] * n_envs, None, start_method, frame_stack=frame_stack, options=options)
    try:
        venv.seed(seed)
        model = algo_class(algo)(policy, venv, seed=seed, device="cpu", **algo_kwargs)
        steps = Stopwatch(model.get_env(), "step")
        rollouts, updates = Stopwatch(model, "collect_rollouts"), Stopwatch(model, "train")
        procs = list(getattr(venv, "processes", []))
        cpu0, learn0 = system.cpu_snapshot(procs), time.perf_counter()
        model.learn(total_steps, callback=curves.sb3_recorder(episodes, start))
        cpu1, wall = system.cpu_snapshot(procs), time.perf_counter() - start
        busy = cpu1.machine_busy_s - cpu0.machine_busy_s - (cpu1.tree_s - cpu0.tree_s)
        others = max(0.0, busy / (time.perf_counter() - learn0))
        for watch in (steps, rollouts, updates):
            watch.remove()
    finally:
        venv.close()
    rets = [ep["r"] for ep in model.ep_info_buffer or []]
    mean = statistics.fmean(rets) if rets else None
    run = TrainRun(
        backend, seed, wall, steps.seconds, mean, len(rets), _params_hash(model), episodes,
        rollouts.seconds, updates.seconds, others,
    )  # fmt: skip
    return run, model


def train(
    env: str,
    backends: Sequence[str] = ("dummy", "subproc", "shm"),
    policy: str = "ppo:CnnPolicy",
    n_envs: int = 4,
    total_steps: int = 2048,
    seeds: Sequence[int] = (0, 1, 2),
    start_method: str | None = None,
    progress: Callable[[str], None] | None = None,
    env_kwargs: dict[str, Any] | None = None,
    threshold: float | None = None,
    recipe: str | None = None,
) -> TrainResult:
    """Train ``policy`` for ``total_steps`` env steps with each backend and seed (interleaved).

    :param threshold: a return; the table then says when each backend's seeds reached it (default
        None: not asked).
    :param recipe: ``"sb3-atari"``: every backend builds SB3's Atari recipe over ``env`` (a
        NoFrameskip-v4 id), PPO takes :data:`ATARI_PPO`, and the result holds the emulator floor;
        default None: ``env`` as it is.
    :raises ValueError: for a bad env, backend, policy, count or recipe.
    """
    algo, policy_name = check_train_args(
        env, backends, policy, n_envs, total_steps, seeds, env_kwargs, recipe
    )
    fn, frame_stack = recipe_env(recipe, env, env_kwargs)
    result = TrainResult(env, policy, n_envs, total_steps, list(seeds), threshold=threshold, recipe=recipe)
    # The host's state before the runs, so the ratios carry it (shmvec.bench.host).
    result.wake_up_us = host.wake_up_us()
    if recipe is not None:
        result.floor_us = host.emulator_floor_us(env)
    kwargs = _algo_kwargs(algo, n_envs, total_steps, recipe)
    for seed in seeds:
        for b in backends:
            run, _ = train_one(
                fn, b, algo, policy_name, n_envs, total_steps, seed, kwargs, start_method, None, frame_stack
            )
            result.runs.append(run)
            if progress:
                progress(f"seed {seed} {b}: {run.wall_s:.1f} s, mean return {run.mean_return}")
    return result
