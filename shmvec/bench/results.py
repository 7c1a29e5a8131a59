"""What a benchmark measures and keeps: configurations, samples, points, the spec and the result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from shmvec.bench.backends import check_backend, exact, takes_batch, takes_workers
from shmvec.bench.compare import side_by_side
from shmvec.bench.policy import parse_policy
from shmvec.bench.recipes import check_recipe
from shmvec.bench.stats import Summary, summarize
from shmvec.engine.start_methods import resolve_start_method

# An env alone on a CPU less than this fraction of its step time waits (I/O, sleep) more than it computes.
WAITING_CPU = 0.5
# A point is flagged as disturbed when any of these is exceeded.
MAX_REL_SPREAD = 0.25  # (max - min) / median of the repeats' steps/s
MAX_OTHER_CORES = 0.3  # CPU (in cores) that processes outside the benchmarked tree took
MAX_STEAL = 0.05  # fraction of CPU time the hypervisor stole


@dataclass(frozen=True)
class Config:
    """One configuration: a backend, a number of envs and (for backends that take it) workers."""

    backend: str
    n_envs: int
    n_workers: int | None = None  # None: the backend's default
    batch_size: int | None = None  # a pool backend's envs per batch step (None: not a pool)

    @property
    def label(self) -> str:
        """E.g. ``shm n=8 w=2``, ``shm-pool n=16 b=8``."""
        workers = f" w={self.n_workers}" if self.n_workers is not None else ""
        batch = f" b={self.batch_size}" if self.batch_size is not None else ""
        return f"{self.backend} n={self.n_envs}{workers}{batch}"

    @property
    def batch(self) -> int:
        """Envs stepped per batch step."""
        return self.n_envs if self.batch_size is None else self.batch_size


@dataclass
class Sample:
    """One measurement window of one configuration. Times are seconds per batch step."""

    steps_per_s: float  # env steps (batch steps x n_envs) per second
    batch_steps: int
    wall_s: float  # length of the measured window
    step_s: float
    policy_s: float
    send_s: float
    wait_s: float
    env_s: float
    copy_s: float
    ipc_s: float
    unattributed_s: float
    cpu_cores: float  # CPU time of the process tree / wall time
    other_cores: float  # CPU time of everything else on the machine / wall time
    steal: float  # fraction of machine CPU time stolen by the hypervisor
    rss_bytes: int  # peak of the tree's summed RSS, sampled after reset and after the window
    pss_bytes: int  # same, PSS (shared pages split between the processes mapping them)
    shm_bytes: int  # named /dev/shm segments the backend created
    startup_s: float  # construction + first reset
    processes: int  # worker processes
    # CPU time of the main process (all its threads) during step_wait, per batch step: near 0 when it
    # only waits; near wait_s or above when its threads spin (e.g. a policy's OpenMP pool).
    wait_cpu_s: float = 0.0


@dataclass
class Point:
    """Every repeat of one configuration, with its summary and disturbance flags."""

    config: Config
    samples: list[Sample] = field(default_factory=list)
    steps_per_s: Summary | None = None
    disturbed: list[str] = field(default_factory=list)
    # Which envs shmvec's workers stepped natively (shmvec.native): one {"path", "reason", "envs"} per
    # distinct status (shmvec.native.grouped); None for a backend that is not shmvec.
    native: list[dict[str, Any]] | None = None

    def median(self, name: str) -> float:
        """Median over the repeats of one :class:`Sample` field."""
        return float(np.median([getattr(s, name) for s in self.samples]))

    def representative(self) -> Sample:
        """The repeat with the median steps/s (the lower one for an even count): its parts add up
        to its step time, which medians taken part by part would not."""
        ranked = sorted(self.samples, key=lambda s: s.steps_per_s)
        return ranked[(len(ranked) - 1) // 2]

    def cpu_us_per_env_step(self) -> list[float]:
        """CPU time of the process tree per env step (µs), one per repeat."""
        return [s.cpu_cores / s.steps_per_s * 1e6 for s in self.samples]

    def breakdown(self) -> dict[str, float]:
        """Seconds per batch step of each part, in a fixed order, from :meth:`representative`."""
        s = self.representative()
        names = ("env_s", "ipc_s", "copy_s", "policy_s", "send_s", "unattributed_s")
        return {n: getattr(s, n) for n in names}


@dataclass
class BenchSpec:
    """What to measure.

    :param env: gymnasium id or ``module:factory``.
    :param env_kwargs: keyword arguments for ``gym.make`` or the factory (default none).
    :param backends: backend names (see :mod:`shmvec.bench.backends`).
    :param n_envs: env counts to try (each >= 1).
    :param n_workers: worker counts to try for backends that take them (None: the backend's default);
        counts above n_envs are skipped.
    :param policy: ``none`` (random actions) or ``algo:Policy`` (e.g. ``ppo:CnnPolicy``).
    :param batch_size: envs per batch step of the pool backends (``shm-pool``); default None: half
        of each n_envs (rounded up); n_envs below it are skipped for them.
    :param repeats: measurement windows per configuration (default 3), interleaved across
        configurations so a disturbance of the machine hits them alike.
    :param seconds: length of one window (default 2 s), after a short warm-up.
    :param start_method: for the process backends (default None: ShmVecEnv's own default,
        forkserver where the platform has it, so start-up figures are those of the default).
    :param seed: seed of the envs and the random actions.
    :param recipe: build every backend's envs by a recipe of :mod:`shmvec.bench.recipes` over
        ``env`` (``"sb3-atari"``: SB3's Atari recipe, 4 frames stacked); default None: ``env`` as it is.
    """

    env: str = "ALE/Pong-v5"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    backends: Sequence[str] = ("dummy", "subproc", "shm")
    n_envs: Sequence[int] = (1, 2, 4, 8)
    n_workers: Sequence[int] | None = None
    policy: str = "none"
    repeats: int = 3
    seconds: float = 2.0
    start_method: str | None = None
    seed: int = 0
    batch_size: int | None = None
    recipe: str | None = None

    def validate(self) -> None:
        """:raises ValueError: with a one-line reason for the first bad field."""
        if self.recipe is not None:
            check_recipe(self.recipe, self.env, self.env_kwargs)
        for b in self.backends:
            check_backend(b, self.recipe)
        if not self.backends:
            raise ValueError("no backends given")
        if not self.n_envs or any(n < 1 for n in self.n_envs):
            raise ValueError(f"n_envs must be >= 1, got {list(self.n_envs)}")
        if self.n_workers is not None and any(w < 1 for w in self.n_workers):
            raise ValueError(f"n_workers must be >= 1, got {list(self.n_workers)}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.seconds > 0:
            raise ValueError(f"seconds must be > 0, got {self.seconds}")
        parse_policy(self.policy)
        resolve_start_method(self.start_method)

    def configs(self) -> list[Config]:
        """Every configuration to measure, backend by backend, n_envs ascending."""
        out = []
        for b in self.backends:
            for n in sorted(set(self.n_envs)):
                if takes_batch(b):
                    batch = self.batch_size or (n + 1) // 2
                    out += [Config(b, n, batch_size=batch)] if batch <= n else []
                elif takes_workers(b) and self.n_workers is not None:
                    out += [Config(b, n, w) for w in sorted(set(self.n_workers)) if w <= n]
                else:
                    out.append(Config(b, n))
        return out


@dataclass
class BenchResult:
    """Everything measured: the spec, the machine, the env alone, and every configuration."""

    spec: BenchSpec
    machine: dict[str, Any]
    obs_bytes: int  # one env's observation
    alone: list[float]  # steps/s of one env stepped alone in this process, one per round
    alone_cpu: list[float]  # CPU time / wall time of those runs (well below 1: the env waits)
    points: list[Point]
    recommendation: dict[str, Any] = field(default_factory=dict)
    batch_copy_s: dict[int, float] = field(default_factory=dict)  # one fresh copy of n_envs observations
    # CPU (in cores) that other processes took during the env-alone runs, one per round (empty in
    # results written before it was recorded).
    alone_other_cores: list[float] = field(default_factory=list)

    @property
    def alone_summary(self) -> Summary:
        """Median and 95% CI of the env-alone steps/s over the rounds."""
        return summarize(self.alone)

    @property
    def cpu_fraction(self) -> float:
        """Fraction of an env step spent on a CPU: 1 for an env that computes, the measured fraction
        (median over rounds) for one that mostly waits (below :data:`WAITING_CPU`). Between the two,
        a low figure means a loaded machine, not a waiting env. When other processes kept the CPUs
        busy during those runs (:attr:`alone_starved`) a low figure is the env waiting for a CPU,
        not for I/O, and the env is taken to compute (1): a loaded machine must not raise the
        ceiling."""
        measured = float(np.median(self.alone_cpu)) if self.alone_cpu else 1.0
        if measured >= WAITING_CPU or self.alone_starved:
            return 1.0
        return max(measured, 1e-3)

    @property
    def alone_starved(self) -> bool:
        """True if other processes took more than :data:`MAX_OTHER_CORES` during the env-alone runs
        (median over rounds): the env alone may have waited for a CPU."""
        if not self.alone_other_cores:
            return False
        return float(np.median(self.alone_other_cores)) > MAX_OTHER_CORES

    def ceiling_rule(self) -> str:
        """How :meth:`ceiling` is computed, in words."""
        cpus = f"{self.machine['usable_cpus']} CPUs"
        if self.cpu_fraction < 1:
            cpus += f" / {self.cpu_fraction:.2g} of a step on a CPU"
        return f"one env alone x min(n_envs, {cpus})"

    def ceiling(self, n_envs: int) -> float:
        """Steps/s this machine could reach with n_envs: the env alone x min(n_envs, usable CPUs /
        :attr:`cpu_fraction`), i.e. alone x min(n_envs, CPUs) for an env that computes."""
        return self.alone_summary.median * min(n_envs, self.machine["usable_cpus"] / self.cpu_fraction)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict with every raw figure."""
        d = asdict(self)
        d["spec"]["backends"] = list(self.spec.backends)
        d["alone_summary"] = asdict(self.alone_summary)
        for p, pd in zip(self.points, d["points"]):
            pd["label"] = p.config.label
            pd["breakdown"] = p.breakdown()
            pd["ceiling"] = self.ceiling(p.config.n_envs)
            pd["cpu_us_per_env_step"] = p.cpu_us_per_env_step()
        if self.spec.recipe is not None:
            d["side_by_side"] = self.side_by_side()
        return d

    def _rounds(self, n_envs: int) -> dict[str, list[dict[str, float]]]:
        """Per configuration of ``n_envs`` with samples, in order: its env steps/s and CPU µs per env
        step round by round (what :func:`shmvec.bench.compare.side_by_side` takes)."""
        return {
            p.config.label: [
                {"steps_per_s": s.steps_per_s, "cpu_us": c}
                for s, c in zip(p.samples, p.cpu_us_per_env_step())
            ]
            for p in self.points
            if p.config.n_envs == n_envs and p.samples
        }

    def side_by_side(self) -> list[dict[str, Any]]:
        """Per n_envs, every configuration's env steps/s and CPU µs per env step against the first
        configuration of that n_envs (the first of ``backends``), round by round (see
        :func:`shmvec.bench.compare.side_by_side`): ``{"n_envs", "base", "rows"}``."""
        out = []
        for n in sorted({p.config.n_envs for p in self.points}):
            runs = self._rounds(n)
            if runs:
                base = next(iter(runs))
                out.append({"n_envs": n, "base": base, "rows": side_by_side(runs, base)})
        return out

    def verdict(self) -> dict[str, Any] | None:
        """The first configuration (shmvec, for ``shmvec bench``'s defaults) at the largest n_envs
        against each other one there, round by round: ``{"label", "exact", "n_envs", "against":
        [{"label", "exact", "steps_per_s_ratio", "cpu_us_ratio"}]}`` (ratios first / other; ``exact``:
        bit-identical to the in-process reference), or None for fewer than two configurations there."""
        n = max((p.config.n_envs for p in self.points), default=0)
        runs = self._rounds(n)
        if len(runs) < 2:
            return None
        backend = {p.config.label: p.config.backend for p in self.points}
        first, *others = runs
        against = []
        for label in others:
            row = side_by_side({first: runs[first], label: runs[label]}, label)[0]
            against.append(
                {
                    "label": label,
                    "exact": exact(backend[label]),
                    "steps_per_s_ratio": row["steps_per_s_ratio"],
                    "cpu_us_ratio": row["cpu_us_ratio"],
                }
            )
        return {"label": first, "exact": exact(backend[first]), "n_envs": n, "against": against}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchResult:
        """Rebuild a result from :meth:`to_dict` output (e.g. a committed JSON)."""
        points = []
        for pd in d["points"]:
            s = pd["steps_per_s"]
            points.append(
                Point(
                    Config(**pd["config"]),
                    [Sample(**x) for x in pd["samples"]],
                    Summary(**s) if s else None,
                    list(pd["disturbed"]),
                    pd.get("native"),
                )
            )
        spec = BenchSpec(**d["spec"])
        copies = {int(n): t for n, t in d.get("batch_copy_s", {}).items()}
        return cls(
            spec,
            d["machine"],
            d["obs_bytes"],
            d["alone"],
            d["alone_cpu"],
            points,
            d.get("recommendation", {}),
            copies,
            list(d.get("alone_other_cores", [])),
        )
