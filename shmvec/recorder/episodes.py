"""The side process of a dataset recording: it reads the steps workers write into a tape
(:class:`~shmvec.worker.taps.StepTap`), puts whole episodes together and writes them into a Minari
dataset with the ``minari`` package, as Minari's ``DataCollector`` writes them.

An episode is written once it has ended (terminated or truncated). The episode an env is in when the
recording finishes is written too, truncated at its last step, as ``DataCollector.create_dataset``
writes it (an offline-RL user gets every step recorded, and the flag says it did not end), and so
is an episode that ``reset()`` cuts short, as DataCollector's ``reset`` writes it. Restart mode
resetting an env whose worker died (its last records may be steps nobody received) and records
dropped because the tape stayed full mean that episode is torn: it is dropped and counted, never
written as if complete.
The dataset is built in a temporary folder under Minari's datasets folder and moved to its place only
when the recording finishes, so no partial dataset is ever found under the dataset's id.

Imported in the side process only (and by the main process for :class:`Settings`).
"""

from __future__ import annotations

import os
import shutil
import warnings
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from shmvec.memory.layout import assemble
from shmvec.memory.tape import EXPLICIT, RESET, RESET_SEEDED, STEP, Tape

_POLL_S = 0.005
#: The descriptive metadata a recording takes, in the order Minari's metadata function takes them
#: (``DataCollector.create_dataset``'s keyword arguments, but ``expert_policy``).
_DESCRIPTIVE = (
    "eval_env", "algorithm_name", "author", "author_email", "code_permalink", "ref_min_score",
    "ref_max_score", "description", "requirements",
)  # fmt: skip
#: Episodes whose observations are kept to check what the dataset gives back (its stated fidelity).
CHECKED_EPISODES = 8


@dataclass
class Settings:
    """What the side process needs besides the tape.

    :param dataset_id: Minari's dataset id.
    :param observation_space: the vector env's single observation space.
    :param action_space: its single action space.
    :param env_spec: the env's ``EnvSpec`` (None: unknown).
    :param jpeg: Minari's JPEG encoding of image observations (lossy), else raw arrays.
    :param data_format: Minari's storage (``"hdf5"`` or ``"arrow"``).
    :param metadata: the dataset's descriptive metadata (``author``, ``algorithm_name``...), passed
        to Minari's metadata as ``DataCollector.create_dataset`` passes them.
    """

    dataset_id: str
    observation_space: Any
    action_space: Any
    env_spec: Any
    jpeg: bool
    data_format: str = "hdf5"
    metadata: dict[str, Any] = field(default_factory=dict)


class Episodes:
    """Episodes being put together from a tape, one open episode per row."""

    def __init__(self, tape: Tape, settings: Settings) -> None:
        self.tape, self.settings = tape, settings
        records = tape.spec.record_fields()
        self.n_obs = sum(1 for name in records if name.startswith("obs"))
        self.open: dict[int, dict[str, Any] | None] = dict.fromkeys(range(len(tape.spec.env_ids)))
        self.done: list[tuple[int, int, dict[str, Any]]] = []  # (end step, env, episode)
        self.latest = [-1] * len(tape.spec.env_ids)
        self.dropped = 0

    def drain(self) -> bool:
        """Read every record the tape holds; whether there were any. Each row's records are copied
        out in blocks (one array copy per field, not one per record) before the reader frees them."""
        tape, moved = self.tape, False
        for row in range(len(tape.spec.env_ids)):
            tail, head = tape.tail[row], tape.head[row]
            while tail < head:
                start = tail % tape.depth
                stop = min(start + head - tail, tape.depth)
                self._read(row, start, stop)
                tail += stop - start
                tape.tail[row] = tail
                moved = True
        return moved

    def _read(self, row: int, start: int, stop: int) -> None:
        """Records ``start:stop`` (slots) of row ``row`` join their episodes."""
        tape = self.tape
        where = (row, slice(start, stop))
        block = _Block(
            [np.array(tape.views[f"obs{j}"][where]) for j in range(self.n_obs)],
            np.array(tape.views["action"][where]),
            tape.views["reward"][where].tolist(),
            tape.views["terminated"][where].tolist(),
            tape.views["truncated"][where].tolist(),
            tape.mark[where].tolist(),
        )
        steps, seeds = tape.step[where].tolist(), tape.views["seed"][where].tolist()
        self.latest[row] = steps[-1]
        env = tape.spec.env_ids[row]
        episode, first = self.open[row], 0  # the open episode holds records first:k of the block
        for k, mark in enumerate(block.marks):
            if mark == STEP:
                if episode is None:
                    first = k + 1  # the recording started during this episode: it begins at the next reset
                elif block.terms[k] or block.truncs[k]:
                    block.join(episode, first, k + 1)
                    self.done.append((steps[k], env, episode))
                    episode, first = None, k + 1
                continue
            kind = mark & ~EXPLICIT
            assert kind in (RESET, RESET_SEEDED)
            if episode is not None and (episode["rewards"] or STEP in block.marks[first:k]):
                if mark & EXPLICIT:  # reset() before it ended: it ends here, as DataCollector ends it
                    block.join(episode, first, k)
                    self._cut_short(steps[k], env, episode)
                else:
                    # torn: restart mode reset it after its worker died (records of steps nobody
                    # received may end it)
                    self.dropped += 1
            seed = seeds[k] if kind == RESET_SEEDED else None
            episode, first = _new_episode(self.n_obs, seed), k
        if episode is not None:
            block.join(episode, first, len(block.marks))
        self.open[row] = episode

    def truncate_open(self) -> None:
        """The recording finishes: each env's open episode that has steps ends here, truncated (an
        env whose writer stopped, :meth:`cut_off`, keeps its last episode dropped: records of it are
        missing)."""
        cut = set(self.cut_off())
        for row, episode in self.open.items():
            env = self.tape.spec.env_ids[row]
            if episode is None or not episode["rewards"] or env in cut:
                continue
            self._cut_short(self.latest[row], env, episode)
            self.open[row] = None

    def _cut_short(self, stamp: int, env: int, episode: dict[str, Any]) -> None:
        """``episode`` of ``env`` ends at step ``stamp`` without having ended: truncated at its last
        step, as DataCollector marks one it writes before its end."""
        episode["trunc"][-1] = True
        self.done.append((stamp, env, episode))

    def cut_off(self) -> list[int]:
        """The envs whose writer stopped (the tape stayed full): their last episode was dropped."""
        return [self.tape.spec.env_ids[r] for r in range(len(self.open)) if self.tape.want[r] == -1]

    def ready(self, everything: bool) -> list[tuple[int, dict[str, Any]]]:
        """The ended episodes to write now, in the order they ended (step, then env): those no row
        can still precede (all, when ``everything``)."""
        mark = float("inf") if everything else min(self.latest)
        now = sorted((e for e in self.done if e[0] <= mark), key=lambda e: (e[0], e[1]))
        self.done = [e for e in self.done if e[0] > mark]
        return [(env, episode) for _, env, episode in now]

    def leaves(self, episode: dict[str, Any]) -> list[np.ndarray]:
        """An episode's observation leaves, one array each (its steps along the first axis)."""
        return [np.concatenate(pieces) for pieces in episode["obs"]]

    def buffer(self, episode: dict[str, Any], episode_id: int, leaves: list[np.ndarray]) -> Any:
        """Minari's ``EpisodeBuffer`` of an episode whose observation leaves are ``leaves``."""
        from minari.data_collector.episode_buffer import EpisodeBuffer

        return EpisodeBuffer(
            id=episode_id,
            seed=episode["seed"],
            observations=assemble(self.settings.observation_space, leaves),
            actions=np.concatenate(episode["actions"]),
            rewards=episode["rewards"],
            terminations=episode["term"],
            truncations=episode["trunc"],
        )


def _new_episode(n_obs: int, seed: int | None) -> dict[str, Any]:
    """An open episode: per observation leaf its pieces (array blocks), action pieces, and lists."""
    return {
        "obs": [[] for _ in range(n_obs)],
        "actions": [],
        "rewards": [],
        "term": [],
        "trunc": [],
        "seed": seed,
    }


@dataclass
class _Block:
    """Records copied out of a tape row: the observation leaves and actions as arrays, the rest as
    lists."""

    obs: list[np.ndarray]
    actions: np.ndarray
    rewards: list[float]
    terms: list[bool]
    truncs: list[bool]
    marks: list[int]

    def join(self, episode: dict[str, Any], first: int, stop: int) -> None:
        """Records ``first:stop`` join ``episode`` (record ``first`` may be its reset: an
        observation without a step)."""
        if first >= stop:
            return
        for pieces, leaf in zip(episode["obs"], self.obs):
            pieces.append(leaf[first:stop])
        first += self.marks[first] != STEP
        episode["actions"].append(self.actions[first:stop])
        episode["rewards"] += self.rewards[first:stop]
        episode["term"] += self.terms[first:stop]
        episode["trunc"] += self.truncs[first:stop]


def fidelity(storage: Any, kept: dict[int, list[np.ndarray]], jpeg: bool, n_obs: int) -> dict[str, Any]:
    """What the dataset gives back of the observations of the episodes in ``kept`` (id -> leaf
    arrays), against what the envs returned: JSON-ready, for the dataset's metadata."""
    from minari.serialization import serialize_space  # noqa: F401  (the storage's own import chain)

    from shmvec.memory.layout import flatten

    worst, total, count, squared = 0.0, 0.0, 0, 0.0
    # Nothing written, nothing to read back (the storage has no episode file yet to open).
    for episode in storage.get_episodes(sorted(kept)) if kept else ():
        got = flatten(storage.observation_space, episode["observations"], [])
        for a, b in zip(got, kept[int(episode["id"])]):
            if np.shape(a) == np.shape(b) and np.array_equal(a, b):
                count += np.size(b)  # equal: no error to add (and no float64 copies of the frames)
                continue
            diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
            worst = max(worst, float(diff.max(initial=0.0)))
            total += float(diff.sum())
            squared += float((diff**2).sum())
            count += diff.size
    mse = squared / count if count else 0.0
    return {
        "codec": "minari-jpeg" if jpeg else "none",
        "exact": worst == 0.0,
        "episodes_checked": len(kept),
        "values_checked": count,
        "max_abs_error": worst,
        "mean_abs_error": total / count if count else 0.0,
        "psnr_db": None if mse == 0 else float(10 * np.log10(255.0**2 / mse)),
    }


def write(conn: Connection, spec: Any, settings: Settings, tmp: str) -> None:
    """The side process: create the storage in the folder ``tmp`` and reply ``("ready",)``, write
    the tape's episodes there until told to finish, then finish the dataset. Replies ``("done",
    path, stats)`` or ``("failed", message)`` (also in place of ``"ready"``); on
    failure the main process removes ``tmp`` (this process may die writing: HDF5 on a full disk)."""
    from minari.data_collector.callbacks import EpisodeMetadataCallback
    from minari.dataset.minari_storage import MinariStorage
    from minari.utils import _generate_dataset_metadata, _generate_dataset_path

    tape = Tape.attach(spec)
    finishing = started = False
    final: str | None = None
    try:
        storage = MinariStorage.new(
            tmp, settings.observation_space, settings.action_space, settings.env_spec,
            settings.data_format, jpeg_encoding=settings.jpeg,
        )  # fmt: skip
        episodes = Episodes(tape, settings)
        conn.send(("ready",))  # the storage exists: the main process may have the workers record
        started = True
        kept: dict[int, list[np.ndarray]] = {}
        callback = EpisodeMetadataCallback()
        # Each episode's metadata, written once at the end: DataCollector's callback applied to the
        # rewards as written (float64, as the storage gives them back), without reading every
        # episode back from disk as ``storage.apply`` does.
        episode_metadata: list[dict[str, Any]] = []
        while True:
            moved = episodes.drain()
            if finishing:
                episodes.truncate_open()
            buffers = []
            for env, episode in episodes.ready(finishing):
                written = len(episode_metadata)
                leaves = episodes.leaves(episode)
                buffers.append(episodes.buffer(episode, written, leaves))
                if len(kept) < CHECKED_EPISODES:
                    kept[written] = leaves
                rewards = np.asarray(episode["rewards"], np.float64)
                episode_metadata.append({"shmvec_env": env, **callback({"rewards": rewards})})
            if buffers:
                storage.update_episodes(buffers)
            if finishing:
                break
            if conn.poll(0 if moved else _POLL_S):
                conn.recv()  # "finish": every worker has stopped writing this tape
                finishing = True
        given = settings.metadata
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Minari's advice on what a dataset should also say
            metadata = _generate_dataset_metadata(
                settings.dataset_id, settings.env_spec, *(given.get(k) for k in _DESCRIPTIVE[:7]), None,
                100, *(given.get(k) for k in _DESCRIPTIVE[7:]),
            )  # fmt: skip
        metadata["shmvec_fidelity"] = fidelity(storage, kept, settings.jpeg, episodes.n_obs)
        metadata["shmvec_dropped_episodes"] = episodes.dropped
        metadata["shmvec_envs_cut_off"] = episodes.cut_off()
        metadata["shmvec_envs"] = list(spec.env_ids)
        storage.update_metadata(metadata)
        storage.update_episode_metadata(episode_metadata, range(len(episode_metadata)))
        final = str(_generate_dataset_path(settings.dataset_id))
        for name in os.listdir(tmp):
            shutil.move(os.path.join(tmp, name), os.path.join(final, name))
        stats = {
            "episodes": len(episode_metadata),
            "dropped": episodes.dropped,
            "envs_cut_off": episodes.cut_off(),
        }
        conn.send(("done", os.path.dirname(final), stats))
    except BaseException as exc:  # noqa: BLE001 - a full disk, Minari refusing: said once, training goes on
        if final is not None:
            shutil.rmtree(os.path.dirname(final), ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
        if started and not finishing:
            _discard_until_finish(tape, conn)  # the workers must not wait on a full tape meanwhile
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        tape.close()
        conn.close()


def _discard_until_finish(tape: Tape, conn: Connection) -> None:
    rows = range(len(tape.spec.env_ids))
    while not conn.poll(_POLL_S):
        for row in rows:
            tape.tail[row] = tape.head[row]
    conn.recv()
