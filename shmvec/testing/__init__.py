"""shmvec in your own test suite: is your env the same under shmvec, and how fast is it?

- :func:`assert_equivalent` steps your env factories in shmvec and in the in-process reference
  (SB3's ``DummyVecEnv`` or Gymnasium's ``SyncVectorEnv``) with the same seeds and actions and fails
  at the first difference, naming the step, the env and the field.
- A pytest plugin, opt-in, with the ``vec_env_benchmark`` fixture: each backend (DummyVecEnv,
  SubprocVecEnv, ShmVecEnv by default) timed as its own pytest-benchmark case, one group per env and
  ``n_envs``. Turn it on with ``pytest -p shmvec.testing`` or, in your ``conftest.py``,
  ``pytest_plugins = ["shmvec.testing"]``; it needs ``pytest-benchmark`` (the ``bench`` extra).

Importing this module imports neither pytest nor SB3: pytest loads the plugin
(:mod:`shmvec.testing.plugin`) through :data:`pytest_plugins` only when you turn it on, and SB3 is
imported only for ``face="sb3"``. See the guide "In your test suite".
"""

from shmvec.testing.benchmark import VecEnvBenchmark
from shmvec.testing.compare import Difference
from shmvec.testing.equivalence import EquivalenceReport, assert_equivalent

__all__ = ["Difference", "EquivalenceReport", "VecEnvBenchmark", "assert_equivalent"]

#: Read by pytest when this module is loaded as a plugin (``-p shmvec.testing``): the fixtures.
pytest_plugins = ["shmvec.testing.plugin"]
