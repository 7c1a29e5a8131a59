"""The policy's view of a codec: open loop (:func:`policy_effect`: the same frames, raw and decoded,
fed to the policy) and closed loop (:func:`closed_loop`: does a policy that acts on decoded
observations still earn its return?).

:func:`closed_loop` plays the same episodes (the same reset seeds) once with the policy acting on
raw observations and once per codec with it acting on decoded ones, while the env runs as usual.
Each observation is encoded and decoded as a ``ShmVecEnv`` env's would be (one codec stream per
episode, restarted at reset). A :class:`ClosedLoopReport` gives the paired return difference with
a 95% confidence interval over episodes, how often the action taken on the decoded observation
differs from the action the policy would take on the raw one of the same state, the open-loop
figures of :func:`shmvec.fidelity.policy_effect` on the raw run's frames, and a verdict against the
raw policy's own episode-to-episode spread (:meth:`ClosedLoopReport.verdict`).

Actions are greedy (``model.predict(obs, deterministic=True)`` for SB3 models), so with a lossless
codec both runs take the same actions and the difference is exactly 0.
Only numpy is imported at module level.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from shmvec.codecs import Codec, get


@dataclass
class PolicyEffect:
    """How a policy's outputs change when it sees decoded instead of raw frames.

    :param action_change_rate: fraction of frames whose greedy action differs (0-1).
    :param max_value_change: largest absolute change of the value estimate (None if the policy has none).
    :param mean_kl: mean KL(raw || decoded) of the action distributions, nats (None if unavailable).
    :param n_frames: frames compared.
    """

    action_change_rate: float
    max_value_change: float | None
    mean_kl: float | None
    n_frames: int


PolicyFn = Callable[[np.ndarray], dict[str, np.ndarray]]


def _sb3_outputs(model: Any, obs: np.ndarray) -> dict[str, np.ndarray]:
    """Greedy actions, values and action probabilities/means of an SB3 model for a batch."""
    import torch

    policy = model.policy if hasattr(model, "policy") else model
    with torch.no_grad():
        obs_t, _ = policy.obs_to_tensor(obs)
        if hasattr(policy, "get_distribution"):  # actor-critic (PPO, A2C)
            dist = policy.get_distribution(obs_t)
            out = {"action": dist.get_actions(deterministic=True).cpu().numpy(), "dist": dist.distribution}
            if hasattr(policy, "predict_values"):
                out["value"] = policy.predict_values(obs_t).cpu().numpy().reshape(-1)
            return out
        if hasattr(policy, "q_net"):  # DQN: value = max Q
            q = policy.q_net(obs_t)
            return {"action": q.argmax(dim=1).cpu().numpy(), "value": q.max(dim=1).values.cpu().numpy()}
    raise TypeError(f"cannot probe {type(model).__name__}: pass an SB3 PPO/A2C/DQN model or a callable")


def _kl(raw: Any, dec: Any) -> float | None:
    """Mean KL(raw || decoded): from torch distributions or from probability arrays."""
    if raw is None or dec is None:
        return None
    if isinstance(raw, np.ndarray):
        p, q = np.clip(raw, 1e-12, 1), np.clip(dec, 1e-12, 1)
        return float(np.mean(np.sum(p * (np.log(p) - np.log(q)), axis=-1)))
    import torch

    kl = torch.distributions.kl_divergence(raw, dec)
    if kl.ndim > 1:  # independent action dimensions (diagonal Gaussian): sum over them
        kl = kl.sum(dim=-1)
    return float(kl.mean())


def policy_effect(policy: Any, raw: np.ndarray, decoded: np.ndarray, batch_size: int = 64) -> PolicyEffect:
    """Compare a policy's outputs on raw and on decoded frames.

    :param policy: an SB3 model (PPO, A2C: actions, values, KL; DQN: actions, max Q as value) or a
        callable taking a batch of observations and returning a dict with ``"action"`` and optionally
        ``"value"`` and ``"probs"`` (action probabilities, for KL).
    :param raw: ``(n, *obs_shape)`` observations as the policy expects them.
    :param decoded: the same after the codec.
    :param batch_size: frames per forward pass (default 64).
    """
    if raw.shape != decoded.shape:
        raise ValueError(f"raw {raw.shape} and decoded {decoded.shape} frames differ in shape")
    run: Callable[[np.ndarray], dict[str, Any]] = (
        policy if callable(policy) and not hasattr(policy, "predict") else (lambda x: _sb3_outputs(policy, x))
    )
    changed, max_dv, kls, have_value = 0, 0.0, [], False
    for lo in range(0, len(raw), batch_size):
        a, b = run(raw[lo : lo + batch_size]), run(decoded[lo : lo + batch_size])
        changed += int(np.sum(np.asarray(a["action"]) != np.asarray(b["action"])))
        if "value" in a:
            have_value = True
            max_dv = max(max_dv, float(np.max(np.abs(np.asarray(a["value"]) - np.asarray(b["value"])))))
        kl = _kl(a.get("dist", a.get("probs")), b.get("dist", b.get("probs")))
        if kl is not None:
            kls.append((kl, len(a["action"])))
    n = len(raw)
    mean_kl = sum(k * m for k, m in kls) / n if kls else None
    return PolicyEffect(changed / max(n, 1), max_dv if have_value else None, mean_kl, n)


# Student's t, two-sided 95% (0.975 quantile), for 1-30 degrees of freedom; above 30 the
# Cornish-Fisher expansion in _t95 is within 0.001 of the exact value.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042)  # fmt: skip


def _t95(df: int) -> float:
    if df <= len(_T95):
        return _T95[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def paired_ci95(raw: Sequence[float], decoded: Sequence[float]) -> tuple[float, float, float]:
    """``(mean, low, high)`` of ``decoded[i] - raw[i]`` with Student's t 95% interval (needs 2+ pairs)."""
    if len(raw) != len(decoded) or len(raw) < 2:
        raise ValueError(
            f"a paired interval needs 2+ pairs of equal length, got {len(raw)} and {len(decoded)}"
        )
    diffs = [d - r for r, d in zip(raw, decoded)]
    mean = statistics.fmean(diffs)
    half = _t95(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return mean, mean - half, mean + half


Verdict = Literal["within", "outside", "unclear"]


@dataclass
class ClosedLoopReport:
    """One codec in the loop, against raw observations, over the same episodes.

    :param raw_returns: each episode's return (sum of rewards) acting on raw observations.
    :param decoded_returns: the same episodes (same seeds) acting on decoded observations.
    :param action_change_rate: fraction (0-1) of the decoded run's steps whose action differs from
        the policy's action on the raw observation of the same state.
    :param steps: steps of the decoded run.
    :param open_loop: :func:`shmvec.fidelity.policy_effect` on the raw run's observations.
    """

    codec: str
    params: dict[str, Any]
    lossless: bool
    seeds: list[int]
    raw_returns: list[float]
    decoded_returns: list[float]
    action_change_rate: float
    steps: int
    open_loop: PolicyEffect | None = field(default=None)

    @property
    def difference(self) -> tuple[float, float, float]:
        """Mean return difference (decoded - raw) per episode and its 95% CI: ``(mean, low, high)``."""
        return paired_ci95(self.raw_returns, self.decoded_returns)

    @property
    def raw_spread(self) -> float:
        """The raw policy's episode-to-episode spread: the standard deviation of its returns."""
        return statistics.stdev(self.raw_returns)

    def verdict(self) -> Verdict:
        """``"within"`` when the 95% CI of the mean return difference lies inside +- the raw returns'
        standard deviation (the codec costs less than the episode-to-episode noise a user sees
        anyway), ``"outside"`` when it lies wholly beyond it, ``"unclear"`` otherwise (more episodes
        would tell)."""
        _, low, high = self.difference
        spread = self.raw_spread
        if -spread <= low and high <= spread:
            return "within"
        return "outside" if low > spread or high < -spread else "unclear"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values, with the difference, its CI, the spread and the verdict."""
        out = asdict(self)
        mean, low, high = self.difference
        out |= {"return_difference": mean, "ci95": [low, high], "raw_spread": self.raw_spread}
        out["verdict"] = self.verdict()
        return out


Act = Callable[[np.ndarray], Any]


def _actor(policy: Any) -> Act:
    """One greedy action for one observation: SB3 ``predict`` or the callable's ``"action"``."""
    if hasattr(policy, "predict"):
        return lambda obs: policy.predict(obs[None], deterministic=True)[0][0]
    return lambda obs: np.asarray(policy(obs[None])["action"])[0]


def check_spaces(model: Any, env: Any) -> None:
    """:raises ValueError: if an SB3 ``model``'s observation or action space is not the env's (an
    image model's channels-first space matches the env's channels-last one, as SB3 transposes it)."""
    m_obs, e_obs = model.observation_space, env.observation_space
    shapes = {tuple(e_obs.shape)} if e_obs.shape is not None else set()
    if len(e_obs.shape or ()) == 3:
        h, w, c = e_obs.shape
        shapes.add((c, h, w))
    if tuple(m_obs.shape or ()) not in shapes or m_obs.dtype != e_obs.dtype:
        raise ValueError(
            f"the model takes observations {m_obs.shape} {m_obs.dtype}, the env gives {e_obs.shape} "
            f"{e_obs.dtype}: was the model trained on this env?"
        )
    if model.action_space != env.action_space:
        raise ValueError(f"the model's actions are {model.action_space}, the env's {env.action_space}")


class _Channel:
    """Encode then decode one env's observations, one stream per episode (as a ShmVecEnv env)."""

    def __init__(self, codec: Codec, shape: tuple[int, ...], dtype: np.dtype) -> None:
        codec.check(shape, dtype)
        self.codec, self.shape, self.dtype = codec, shape, dtype
        self.buf = np.empty(codec.max_encoded_size(shape, dtype), np.uint8)

    def restart(self) -> None:
        self.enc = self.codec.new_stream(self.shape, self.dtype)
        self.dec = self.codec.new_stream(self.shape, self.dtype)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        n = self.codec.encode(obs, self.buf, self.enc)
        return self.codec.decode(self.buf[:n], np.empty(self.shape, self.dtype), self.dec)


def _decoded(channel: _Channel, episodes: list[list[np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The raw run's frames stacked, and the same through ``channel`` (a stream per episode)."""
    decoded = []
    for frames in episodes:
        channel.restart()
        decoded += [channel(f) for f in frames]
    return np.stack([f for frames in episodes for f in frames]), np.stack(decoded)


def _episode(env: Any, act: Act, seed: int, channel: _Channel | None, frames: list | None) -> tuple:
    """Play one episode from ``reset(seed=seed)``; ``(return, steps, steps whose action changed)``."""
    obs, _ = env.reset(seed=seed)
    if channel is not None:
        channel.restart()
    total, steps, changed = 0.0, 0, 0
    while True:
        obs = np.asarray(obs)
        if frames is not None:
            frames.append(obs.copy())
        if channel is None:
            action = act(obs)
        else:
            action = act(channel(obs))
            changed += int(not np.array_equal(action, act(obs)))
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        steps += 1
        if terminated or truncated:
            return total, steps, changed


def closed_loop(
    policy: Any,
    env_fn: Callable[[], Any],
    codecs: Sequence[str | Codec],
    episodes: int = 20,
    seed: int = 0,
    open_loop: bool = True,
) -> list[ClosedLoopReport]:
    """Play ``episodes`` episodes on raw observations, then the same episodes through each codec.

    :param policy: an SB3 model (greedy ``predict``; its spaces are checked against the env's) or a
        callable taking a batch of observations and returning a dict with ``"action"`` (one per row).
    :param env_fn: zero-argument env factory; its observation space must be a Box the codecs take.
        Episodes must end (terminate or truncate) by themselves.
    :param codecs: registry names or :class:`Codec` objects.
    :param episodes: episodes per run, 2 or more (default 20); episode ``i`` resets with seed ``seed + i``.
    :param seed: the first episode's reset seed (default 0).
    :param open_loop: also run :func:`shmvec.fidelity.policy_effect` on the raw run's frames (default True).
    :raises ValueError: for fewer than 2 episodes, a model whose spaces are not the env's, or a codec
        that cannot take the observations.
    """
    if episodes < 2:
        raise ValueError(f"episodes must be >= 2 for a confidence interval, got {episodes}")
    chosen = [get(c) if isinstance(c, str) else c for c in codecs]
    seeds = list(range(seed, seed + episodes))
    env = env_fn()
    try:
        if hasattr(policy, "predict"):
            check_spaces(policy, env)
        space = env.observation_space
        channels = [_Channel(c, tuple(space.shape), np.dtype(space.dtype)) for c in chosen]
        act = _actor(policy)
        frames: list[list[np.ndarray]] = [[] for _ in seeds]
        raw = [_episode(env, act, s, None, f)[0] for s, f in zip(seeds, frames)]
        reports = []
        for codec, channel in zip(chosen, channels):
            runs = [_episode(env, act, s, channel, None) for s in seeds]
            steps = sum(r[1] for r in runs)
            effect = None
            if open_loop:
                effect = policy_effect(policy, *_decoded(channel, frames))
            reports.append(
                ClosedLoopReport(
                    codec=codec.name,
                    params=codec.params(),
                    lossless=codec.lossless,
                    seeds=seeds,
                    raw_returns=raw,
                    decoded_returns=[r[0] for r in runs],
                    action_change_rate=sum(r[2] for r in runs) / max(steps, 1),
                    steps=steps,
                    open_loop=effect,
                )
            )
    finally:
        env.close()
    return reports
