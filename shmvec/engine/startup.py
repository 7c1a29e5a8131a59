"""Bringing workers up: start them, check the spaces their envs report, lay out the ring, attach.

The same steps serve the engine's start and restart mode's relaunch of one worker; they use the
transport and return what they found (spaces, the layout, faults) for the caller to judge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gymnasium import spaces

from shmvec.codecs import Codec
from shmvec.device import HostTensors, import_torch
from shmvec.engine.faults import Phase, judge
from shmvec.engine.obs_reader import Reader
from shmvec.engine.options import Options
from shmvec.engine.slots import Slots
from shmvec.engine.typed_infos import TypedInfos, columns_for
from shmvec.errors import SpaceMismatchError
from shmvec.memory.infos import InfoSchema
from shmvec.memory.layout import Leaf, array_action_leaf, leaves
from shmvec.memory.ring import EncodedSize, Ring
from shmvec.transports.base import Fault, Outcome, Transport
from shmvec.wire import messages as m


@dataclass
class Layout:
    """What the engine's start-up laid out."""

    observation_space: spaces.Space
    action_space: spaces.Space
    obs_leaves: list[Leaf]
    codecs: tuple[Codec | None, ...] | None
    ring: Ring
    reader: Reader
    typed: TypedInfos

    def close(self) -> None:
        """Stop the reader's decode threads; the reader and typed infos let go of the ring's arrays
        (the ring itself is the transport's to free)."""
        self.reader.close()
        self.typed.close()


def start(
    transport: Transport, workers: Sequence[int], worker_envs: list[range], same_spaces: bool = True
) -> list[Any]:
    """Start ``workers``, wait until their envs exist; the ``(observation, action)`` space of every
    env, in env order.

    :param same_spaces: every env must have env 0's spaces (SB3's and Gymnasium's faces: one space
        for the batch); False: spaces may differ where the ring does not see it (bounds, ``n``), as
        long as every env's observation leaves and action leaf are env 0's (Tianshou's face, whose
        envs each keep their own space).
    :raises: the start-up error (the factory raised, the worker died or hung) after closing the
        transport's workers is left to the caller; :class:`SpaceMismatchError` if envs disagree.
    """
    workers = list(workers)
    transport.start(workers)
    outcome = transport.wait(workers, len(workers))
    verdict = judge(outcome, False, Phase.START_UP, worker_envs)
    if verdict.error is not None:
        raise verdict.error
    env_spaces = [s for w in workers for s in outcome.results[w].spaces]  # type: ignore[union-attr]
    obs_space, act_space = env_spaces[0]
    for i, (o, a) in enumerate(env_spaces):
        if same_spaces and (o != obs_space or a != act_space):
            raise SpaceMismatchError(
                f"all envs must have the same spaces: env {i} has observation space {o} and action "
                f"space {a}, env 0 has {obs_space} and {act_space}"
            )
        if not same_spaces and (ring_layout(o, a) != ring_layout(obs_space, act_space)):
            raise SpaceMismatchError(
                f"all envs' spaces must have the same shapes and dtypes: env {i} has observation space "
                f"{o} and action space {a}, env 0 has {obs_space} and {act_space}"
            )
    return env_spaces


def ring_layout(obs_space: spaces.Space, act_space: spaces.Space) -> tuple[list[Leaf], Leaf | None, type]:
    """What the ring lays out for an env of these spaces: its observation leaves, its action leaf
    (None: actions travel pickled) and the action space's type."""
    return leaves(obs_space), array_action_leaf(act_space), type(act_space)


def lay_out(env_spaces: list[Any], options: Options, slots: Slots, n_workers: int) -> Layout:
    """The ring, reader and typed infos for envs of these spaces (main process)."""
    obs_space, act_space = env_spaces[0]
    obs_leaves = leaves(obs_space)
    codecs = options.leaf_codecs(obs_leaves)
    local = options.backend == "local"
    # Ray actors send their infos pickled in the step's one return value anyway: no columns.
    columns = columns_for(options.info_keys) if local else 0
    encoded = None
    if codecs is not None:
        encoded = [
            None if c is None else EncodedSize(c.max_encoded_size(leaf.shape, leaf.dtype), c.lossless)
            for c, leaf in zip(codecs, obs_leaves)
        ]
    ring = Ring.create(
        obs_leaves,
        len(env_spaces),
        slots.n_slots,
        array_action_leaf(act_space),
        encoded,
        columns,
        n_workers if options.transport == "linux" else 0,  # the doorbell's words
    )
    try:
        threads = options.decode_threads_for(codecs)
        reader = Reader(obs_leaves, ring, codecs, slots, options.copy, options.tolerance, threads)
    except BaseException:
        ring.close()
        raise
    return Layout(
        obs_space, act_space, obs_leaves, codecs, ring, reader, TypedInfos(options.info_keys, ring, n_workers)
    )


def configure_message(options: Options, schema: InfoSchema | None) -> m.Configure | None:
    """What every worker is told after attaching (None: nothing); ``schema``: the typed info columns
    in force, if any."""
    autoreset = None if options.autoreset == "same_step" else options.autoreset
    spin = options.worker_spin_us or None
    if not (options.check_finite or autoreset or spin or schema is not None):
        return None
    return m.Configure(
        check_finite=options.check_finite, autoreset=autoreset, spin_us=spin, info_schema=schema
    )


def attach(
    transport: Transport, workers: Sequence[int], attach_msg: m.Attach, configure: m.Configure | None
) -> Outcome:
    """Have ``workers`` map the ring and take their options; what went wrong, if anything, else
    their replies to ``Attach`` (each env's native status) as the outcome's results."""
    workers = list(workers)
    attached: dict[int, Any] = {}
    for msg in (attach_msg, configure):
        if msg is None:
            continue
        faults = transport.post(workers, msg)
        failed = {f.worker for f in faults}
        live = [w for w in workers if w not in failed]
        outcome = transport.wait(live, len(live))
        outcome.faults = sorted(outcome.faults + faults, key=lambda f: f.worker)
        if outcome.faults or outcome.errors:
            return outcome
        attached = attached or outcome.results
    return Outcome(results=attached)


def relaunch(
    transport: Transport,
    w: int,
    attach_msg: m.Attach,
    configure: m.Configure | None,
    worker_envs: list[range],
) -> Fault | None:
    """Restart mode: replace worker ``w`` and bring the new one up; the fault if that failed."""
    transport.replace(w)
    outcome = transport.wait([w], 1)
    if not outcome.faults and not outcome.errors:
        outcome = attach(transport, [w], attach_msg, configure)
    if outcome.faults:
        return outcome.faults[0]
    if outcome.errors:
        from shmvec.engine.faults import env_fault

        return env_fault(w, outcome.errors[w], worker_envs[w])
    return None


def converter(options: Options, layout: Layout, slots: Slots) -> HostTensors | None:
    """What turns each batch's observation leaves into tensors on ``options.device`` (None without a
    device), for a laid-out ring whose workers are attached. The engine closes it before the ring goes."""
    if options.device is None:
        return None
    device = import_torch().device(options.device)
    fields = tuple(options.device_fields)
    if device.type == "cpu":
        return HostTensors(layout.obs_leaves, fields, options.copy)
    from shmvec.device.cuda import CudaCopies

    ring, raw = layout.ring, layout.reader.raw
    return CudaCopies(
        layout.obs_leaves, fields, device, ring, raw, slots.fence, options.copy, options.pin_memory
    )
