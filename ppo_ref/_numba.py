"""Numba options, in one place.

Every compiled kernel in ``ppo_ref`` is decorated with :data:`njit` from this module, so the
options below apply uniformly:

* ``cache=True``: compiled machine code is written next to the source (``__pycache__``) and
  reused by later processes, so the compile cost is paid once per machine, not per run.
* ``nogil=True``: kernels release the GIL, so the thread backend of the actor-learner loop can
  overlap kernel work with Python work.
* ``fastmath=False`` (numba's default, stated here on purpose): a reference implementation must
  not let the compiler reassociate floating-point sums; results must match the oracles and the
  uncompiled ``.py_func`` to the last bit where the operation order is the same.

Setting the environment variable ``NUMBA_DISABLE_JIT=1`` runs every kernel as plain Python
(the tests use this to check that the compiled and interpreted versions agree).
"""
from __future__ import annotations

import numba

NJIT_OPTIONS = {"cache": True, "nogil": True, "fastmath": False}

njit = numba.njit(**NJIT_OPTIONS)
"""Decorator: ``@njit`` compiles a function with :data:`NJIT_OPTIONS`."""
