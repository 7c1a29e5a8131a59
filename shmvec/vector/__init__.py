"""The Gymnasium face's methods beyond step and reset, as mixins of :class:`shmvec.ShmVectorEnv`.

- :mod:`~shmvec.vector.pool`: pool mode (``async_reset`` / ``send`` / ``recv``) and Gymnasium's info
  batching over a batch of the engine;
- :mod:`~shmvec.vector.calls`: env calls (``call``, ``get_attr``, ``set_attr``, ``render``).

They sit below :mod:`shmvec.vector_env` (which alone imports them) and above the engine; they never
import a face.
"""
