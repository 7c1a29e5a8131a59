"""The Ray connection of the Ray backend: the one already made, a cluster the user configured, or a
local Ray that shmvec starts for this process alone and that listens on loopback only.

A local Ray started by a plain ``ray.init()`` advertises the machine's network address and opens its
ports (GCS, raylets, workers, agents) on every interface: measured with Ray 2.60, 12 of the 13 TCP
listening sockets of a ``ShmVecEnv(..., backend="ray")`` were on ``0.0.0.0`` / ``::``. Ray's ports are
not meant to face a network, and a Ray that only this process uses has no reason to. Ray binds them
to loopback when the node's address is a loopback one, but ``ray.init`` rewrites a loopback
``_node_ip_address`` to the network address unless multi-node clusters are disabled
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read when Ray is imported, usually before shmvec is):
:func:`start_local` switches that off for the duration of the start, then checks the result.

What is the user's stays theirs: a connection made before (``ray.init(address=...)``), and the
cluster a plain ``ray.init()`` would join (``RAY_ADDRESS``, or one started on this machine with
``ray start``).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import ray

_owned_users = 0  # engines using a Ray connection that shmvec made


def connect() -> bool:
    """Use the running Ray connection, or make one (:func:`start_local`); True when shmvec made it."""
    global _owned_users
    if ray.is_initialized():
        if _owned_users:
            _owned_users += 1
            return True
        return False
    start_local()
    _owned_users = 1
    return True


def disconnect() -> None:
    """One engine on a connection shmvec made is done: shut Ray down after the last one."""
    global _owned_users
    _owned_users -= 1
    if _owned_users <= 0:
        _owned_users = 0
        if ray.is_initialized():
            ray.shutdown()


def start_local() -> None:
    """``ray.init`` for shmvec: join the cluster a plain ``ray.init()`` would join (the user's), else
    start a local Ray whose every process listens on loopback only (127.0.0.1, or ::1).

    :raises RuntimeError: if the Ray started is not on loopback (a Ray whose internals changed): it is
        shut down first. Start Ray yourself then (``ray.init(...)`` before the VecEnv).
    """
    if user_cluster() is not None:
        ray.init(include_dashboard=False, logging_level=logging.WARNING)
        return
    with loopback_node():
        ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING)
    addresses = {node["NodeManagerAddress"] for node in ray.nodes()}
    if not all(is_loopback(a) for a in addresses):
        ray.shutdown()
        raise RuntimeError(
            f"the local Ray that shmvec started listens on {sorted(addresses)}, not on loopback only, "
            "and was shut down: start Ray yourself (ray.init(...)) before the VecEnv"
        )


def user_cluster() -> str | None:
    """The address a plain ``ray.init()`` would connect to (``RAY_ADDRESS``, or the cluster of the
    last ``ray start`` on this machine), None when it would start a Ray of its own."""
    from ray._private import services

    try:
        # None: "find one". Without Ray installed mypy sees Any here, hence unused-ignore.
        return services.canonicalize_bootstrap_address(None)  # type: ignore[arg-type,unused-ignore]
    except Exception:  # a bad RAY_ADDRESS: ray.init reports it
        return "RAY_ADDRESS"


@contextmanager
def loopback_node() -> Iterator[None]:
    """While Ray starts: a node address of loopback, which Ray's servers then bind to (see the
    module docstring). Ray reads the flag at each lookup of the node address, from this module."""
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP, IPv4-mapped IPv6 included) is a loopback one."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return address == "localhost"
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


__all__ = ["connect", "disconnect", "is_loopback", "start_local"]
