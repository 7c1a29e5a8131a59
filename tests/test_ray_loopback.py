"""The Ray that shmvec starts itself (``backend="ray"`` without ``ray.init`` before) listens on loopback
only: every TCP listening socket of every one of its processes, read with psutil.

In a fresh interpreter, without this suite's loopback environment (``tests.ray_helpers`` sets
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` for its clusters, which would hide what shmvec itself does),
with a private ``RAY_TMPDIR`` so that no cluster of another run on this machine is joined.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytest.importorskip("ray", reason='Ray is not installed (pip install -e ".[ray]")')

pytestmark = pytest.mark.slow

SCRIPT = """
import functools, json
import numpy as np, psutil, ray
from shmvec import ShmVecEnv
from tests.envs import make_dict_env

venv = ShmVecEnv([functools.partial(make_dict_env, 8, 12)] * 2, n_workers=2, backend="ray")
venv.reset()
venv.step(np.zeros(2, np.int64))
sockets = []
for p in [psutil.Process(), *psutil.Process().children(recursive=True)]:
    try:
        name = p.name()
        sockets += [
            (name, c.laddr.ip, c.laddr.port) for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN
        ]
    except psutil.Error:  # a process that ended meanwhile
        pass
nodes = [n["NodeManagerAddress"] for n in ray.nodes()]
venv.close()
print(json.dumps({"sockets": sockets, "nodes": nodes, "after_close": ray.is_initialized()}))
"""


def test_a_ray_started_by_shmvec_listens_on_loopback_only(tmp_path):
    from shmvec.transports.ray.connection import is_loopback

    ray_tmp = f"/tmp/shmvec-lo-{os.getpid()}"  # short: Ray's unix sockets live under it
    env = {
        k: v for k, v in os.environ.items() if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")
    }
    env.update(PYTHONPATH=str(ROOT), RAY_TMPDIR=ray_tmp)
    os.makedirs(ray_tmp, exist_ok=True)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240, cwd=ROOT, env=env
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    names = {name for name, _, _ in got["sockets"]}
    # What must have been read: the GCS, the raylet, the two workers' actors.
    assert {"gcs_server", "raylet", "ray::RayWorker"} <= names, got["sockets"]
    exposed = [s for s in got["sockets"] if not is_loopback(s[1])]
    assert exposed == [], f"listening beyond loopback: {exposed} (all: {got['sockets']})"
    assert all(is_loopback(a) for a in got["nodes"]), got["nodes"]
    assert got["after_close"] is False, "the Ray shmvec started was not shut down by close()"


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.2", False),
        ("localhost", True),
    ],
)
def test_is_loopback(address, loopback):
    from shmvec.transports.ray.connection import is_loopback

    assert is_loopback(address) is loopback
