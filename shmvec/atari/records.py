"""The episode records a native Atari step keeps per emulator frame, as their wrappers keep them.

Both wrappers sit right over ``gym.make``'s wrappers, under the frame skip, so they see every
emulator frame: SB3's ``Monitor`` (``make_atari_env``) and Gymnasium's ``RecordEpisodeStatistics``
(CleanRL's ``ppo_atari.py``). :meth:`frame` is what their ``step`` does with one frame's reward
(and, at an episode's end, with its info dict); their lists, queues, counts and Monitor's CSV rows
end up as the wrapper leaves them. The wall-clock times (Monitor's ``t``, RecordEpisodeStatistics'
``t`` and ``time_queue``) are read off the same clocks at about the same moment, not to the
microsecond.
"""

from __future__ import annotations

import time
from typing import Any

MONITOR = "stable_baselines3.common.monitor.Monitor"
EPISODE_STATISTICS = "gymnasium.wrappers.common.RecordEpisodeStatistics"


class MonitorRecord:
    """SB3's ``Monitor.step``, per frame.

    :param monitor: the wrapper.
    """

    def __init__(self, monitor: Any) -> None:
        self.wrapper = monitor

    def blocked(self) -> bool:
        """Whether the next step must go through the wrapper (``Monitor.step`` raises its error)."""
        return bool(self.wrapper.needs_reset)

    def frame(self, reward: float, ended: dict[str, Any] | None) -> None:
        """One frame's ``reward`` (a float already: Monitor's ``float(reward)`` is the same value);
        ``ended``: the info dict, when the episode ended on this frame."""
        m = self.wrapper
        m.rewards.append(reward)  # read each time: Monitor.reset binds a new list
        if ended is None:
            return
        m.needs_reset = True
        ep_rew = sum(m.rewards)
        ep_len = len(m.rewards)
        ep_info = {"r": round(ep_rew, 6), "l": ep_len, "t": round(time.time() - m.t_start, 6)}
        for key in m.info_keywords:
            ep_info[key] = ended[key]
        m.episode_returns.append(ep_rew)
        m.episode_lengths.append(ep_len)
        m.episode_times.append(time.time() - m.t_start)
        ep_info.update(m.current_reset_info)
        if m.results_writer:
            m.results_writer.write_row(ep_info)
        ended["episode"] = ep_info

    def frames(self, count: int) -> None:
        """``Monitor.total_steps`` after ``count`` frames (once per agent step: nothing reads it
        meanwhile)."""
        self.wrapper.total_steps += count


class EpisodeStatisticsRecord:
    """Gymnasium's ``RecordEpisodeStatistics.step``, per frame.

    :param wrapper: the wrapper.
    """

    def __init__(self, wrapper: Any) -> None:
        self.wrapper = wrapper

    def blocked(self) -> bool:
        """Never: the wrapper steps on after an episode's end."""
        return False

    def frame(self, reward: float, ended: dict[str, Any] | None) -> None:
        """As :meth:`MonitorRecord.frame`."""
        w = self.wrapper
        w.episode_returns += reward
        w.episode_lengths += 1
        if ended is None:
            return
        episode_time_length = round(time.perf_counter() - w.episode_start_time, 6)
        ended[w._stats_key] = {"r": w.episode_returns, "l": w.episode_lengths, "t": episode_time_length}
        w.time_queue.append(episode_time_length)
        w.return_queue.append(w.episode_returns)
        w.length_queue.append(w.episode_lengths)
        w.episode_count += 1
        w.episode_start_time = time.perf_counter()

    def frames(self, count: int) -> None:
        """Nothing: the wrapper counts per episode only."""


def record(layer: Any) -> MonitorRecord | EpisodeStatisticsRecord | None:
    """The record for ``layer`` if it is one of the two wrappers (exactly), else None."""
    kind = type(layer)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if name == MONITOR:
        return MonitorRecord(layer)
    if name == EPISODE_STATISTICS:
        return EpisodeStatisticsRecord(layer)
    return None
