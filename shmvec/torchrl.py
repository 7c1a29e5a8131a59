"""TorchRL: :class:`ShmTorchRLEnv`, shmvec's envs as one batched TorchRL env (extra ``shmvec[torchrl]``).

TorchRL's ``GymWrapper`` already takes a batched Gymnasium ``VectorEnv``; this is a ``GymWrapper``
over a :class:`~shmvec.ShmVectorEnv` that fixes what a bare ``GymWrapper(ShmVectorEnv(...))`` gets
wrong or different from TorchRL's own batched envs (``SerialEnv``, ``ParallelEnv``) of the same
factories (TorchRL 0.14):

- autoreset: ``GymWrapper`` refuses Gymnasium's default ``NEXT_STEP`` mode and prefers
  ``DISABLED``, where TorchRL resets the envs that are done itself (``options["reset_mask"]``,
  which :class:`~shmvec.ShmVectorEnv` takes as ``SyncVectorEnv`` does): the env is built in that mode;
- seeds: ``set_seed(s)`` on a Gymnasium vector env seeds env ``i`` with ``s + i``; ``SerialEnv`` and
  ``ParallelEnv`` chain TorchRL's seed generator from env to env. Here ``set_seed`` chains as they
  do, so a ``Collector`` seeded alike collects the same data, array for array;
- keys: TorchRL names a single env's RGB frames (a 0-255 ``Box`` of shape ``(H, W, 3)``)
  ``"pixels"``, and a batch of them ``"observation"``; here they keep the single env's name.

Only this module imports TorchRL; nothing else in shmvec imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from torchrl._utils import seed_generator
from torchrl.envs import GymWrapper

from shmvec.vector_env import ShmVectorEnv

#: Options of :class:`~shmvec.ShmVectorEnv` that this env sets itself or that TorchRL's loop cannot use.
_REFUSED = {
    "autoreset_mode": "TorchRL resets done envs itself: the env runs with autoreset_mode='disabled'",
    "batch_size": "TorchRL steps every env at once: pool mode (batch_size < num_envs) has no place here",
    "pool_order": "TorchRL steps every env at once: pool mode (batch_size < num_envs) has no place here",
}


def _is_frames(space: gym.Space) -> bool:
    """Whether TorchRL's ``GymWrapper`` would name this single env's observation ``"pixels"``: an
    ``(H, W, 3)`` ``Box`` from 0 to 255 (``torchrl.envs.libs.gym._is_from_pixels``)."""
    return (
        isinstance(space, spaces.Box)
        and space.shape is not None
        and len(space.shape) == 3
        and space.shape[-1] == 3
        and bool(np.all(space.low == 0))
        and bool(np.all(space.high == 255))
    )


class ShmTorchRLEnv(GymWrapper):
    """A batched TorchRL env (``batch_size=[num_envs]``) whose envs run in shmvec's workers.

    :param env_fns: callables that each create one Gymnasium env, as for :class:`~shmvec.ShmVectorEnv`
        (not TorchRL envs: TorchRL transforms go on top, ``TransformedEnv(ShmTorchRLEnv(...), ...)``,
        and run on the batch in the main process).
    :param device: TorchRL's env device (default None: CPU): specs and output tensordicts are there;
        the copy from the observations is TorchRL's own, as for any ``GymWrapper``.
    :param categorical_action_encoding: as for ``GymWrapper`` (default False: one-hot discrete actions).
    :param options: keyword options of :class:`~shmvec.ShmVectorEnv` (``n_workers``, ``start_method``,
        ``codec``, ``frame_stack``...), except ``autoreset_mode`` (set to ``"disabled"``) and pool
        mode's ``batch_size`` / ``pool_order``.

    ``close()`` (TorchRL's) stops the workers and frees the shared memory. The wrapped
    :class:`~shmvec.ShmVectorEnv` is :attr:`vector_env`.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        device: Any = None,
        categorical_action_encoding: bool = False,
        _torchrl_native_autoreset_requested: bool = False,  # set by GymWrapper's metaclass
        **options: Any,
    ) -> None:
        for name in options.keys() & _REFUSED.keys():
            raise ValueError(f"ShmTorchRLEnv: {name}= is not taken ({_REFUSED[name]})")
        venv = ShmVectorEnv(env_fns, autoreset_mode="disabled", **options)
        try:
            self._frames = _is_frames(venv.single_observation_space)
            super().__init__(
                venv,
                device=device,
                categorical_action_encoding=categorical_action_encoding,
                _torchrl_native_autoreset_requested=_torchrl_native_autoreset_requested,
            )
        except BaseException:
            venv.close()
            raise

    @property
    def vector_env(self) -> ShmVectorEnv:
        """The :class:`~shmvec.ShmVectorEnv` this env steps."""
        return self._env

    def _build_env(self, env: Any, from_pixels: bool = False, pixels_only: bool = False) -> Any:
        env = super()._build_env(env, from_pixels, pixels_only)
        # The batched space is (N, H, W, 3): GymWrapper would name it "observation", unlike the
        # single env it wraps in SerialEnv. from_pixels=True only picks the key here (the env
        # already returns its frames: no render wrapper is added, _build_env above saw False).
        if self._frames:
            self.from_pixels = True
        return env

    def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        """Seed and reset every env as ``SerialEnv`` / ``ParallelEnv`` seed theirs: env 0 with
        ``seed``, each next one with TorchRL's next seed in the chain (all with ``seed`` if
        ``static_seed``).

        :returns: the seed after the last env's, as ``SerialEnv.set_seed`` returns it.
        """
        if seed is None:
            self.reset()
            return None
        seeds = []
        for _ in range(self.vector_env.num_envs):
            seeds.append(seed)
            if not static_seed:
                seed = seed_generator(seed)
        self.reset(seed=seeds)
        return seed


__all__ = ["ShmTorchRLEnv"]
