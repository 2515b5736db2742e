"""The compiled tier of the advantages and masks: ``njit`` of the readable loops, no copy.

Every loop here is a function of :mod:`ppo_ref.spec.masks` or :mod:`ppo_ref.spec.advantages`
compiled as it is written there (``njit(spec_function)``), so the compiled and the readable tier
are one definition and agree bit for bit (``tests/test_kernels.py`` runs both). The public,
validating wrappers live in ``masks.py``, ``gae.py`` and ``vtrace.py``; their
``backend="spec"`` runs the ``py_func`` of the functions below (the spec function itself).

The scalar helpers the loops call (:func:`ppo_ref.spec.masks.transition_flags`,
:func:`ppo_ref.spec.advantages.finite_sum`) are registered with numba's ``register_jitable``:
compiled code calling them gets a compiled version, plain Python keeps calling the function.

Cache note: numba's on-disk cache (``cache=True``) keys each compiled function on its own
source file. ``gae_recursion``/``vtrace_recursion`` (spec/advantages.py) call
``transition_flags`` (spec/masks.py): after an edit of spec/masks.py alone, a cached compiled
recursion may keep the old rule until spec/advantages.py changes too or its ``__pycache__`` is
cleared. ``tests/test_kernels.py`` compares every compiled loop with its ``py_func`` under
every ``truncation`` mode, so a stale cache fails the tests.
"""
from numba.extending import register_jitable

from ppo_ref._numba import NJIT_OPTIONS, njit
from ppo_ref.spec import advantages as _spec_advantages
from ppo_ref.spec import masks as _spec_masks
from ppo_ref.spec.masks import TRUNCATION_MODES

__all__ = ["TRUNCATION_MODES", "gae_recursion", "vtrace_recursion", "log_ratios",
           "transition_masks_loop", "episode_starts_loop"]

# the helpers, usable from compiled code (the spec functions themselves are returned unchanged)
register_jitable(**NJIT_OPTIONS)(_spec_masks.transition_flags)
register_jitable(**NJIT_OPTIONS)(_spec_advantages.finite_sum)

gae_recursion = njit(_spec_advantages.gae_recursion)
vtrace_recursion = njit(_spec_advantages.vtrace_recursion)
log_ratios = njit(_spec_advantages.log_ratios)
transition_masks_loop = njit(_spec_masks.transition_masks_loop)
episode_starts_loop = njit(_spec_masks.episode_starts_loop)
