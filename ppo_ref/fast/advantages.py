"""The compiled tier of the advantages and masks: ``njit`` of the readable loops, no copy.

Every loop here is a function of :mod:`ppo_ref.spec.masks` or :mod:`ppo_ref.spec.advantages`
compiled as it is written there (``njit(spec_function)``), so the compiled and the readable tier
are one definition and agree bit for bit (``tests/test_kernels.py`` runs both):

* :data:`gae_recursion` equals :func:`ppo_ref.spec.advantages.gae_recursion` bit for bit;
* :data:`vtrace_recursion` equals :func:`ppo_ref.spec.advantages.vtrace_recursion` bit for bit;
* :data:`log_ratios` equals :func:`ppo_ref.spec.advantages.log_ratios` bit for bit;
* :data:`transition_masks_loop` equals :func:`ppo_ref.spec.masks.transition_masks_loop` bit
  for bit;
* :data:`episode_starts_loop` equals :func:`ppo_ref.spec.masks.episode_starts_loop` bit for bit.

The public, validating wrappers are :mod:`ppo_ref.kernels` (``masks.py``, ``gae.py``,
``vtrace.py``); their ``backend="spec"`` runs the ``py_func`` of the functions below (the spec
function itself).

The scalar helpers the loops call (:func:`ppo_ref.spec.masks.transition_flags`,
:func:`ppo_ref.spec.advantages.finite_sum`, :func:`ppo_ref.spec.advantages.next_value`) are
registered with numba's ``register_jitable``:
compiled code calling them gets a compiled version, plain Python keeps calling the function.
Compiled code is cached by :func:`ppo_ref._numba.njit`, whose cache entries are invalidated by
any edit of any package source (so an edit of spec/masks.py recompiles these loops too).
"""
from numba.extending import register_jitable

from ppo_ref._numba import NJIT_OPTIONS, njit
from ppo_ref.spec import advantages as _spec_advantages
from ppo_ref.spec import masks as _spec_masks

__all__ = ["gae_recursion", "vtrace_recursion", "log_ratios",
           "transition_masks_loop", "episode_starts_loop"]

# the helpers, usable from compiled code (the spec functions themselves are returned unchanged)
register_jitable(**NJIT_OPTIONS)(_spec_masks.transition_flags)
register_jitable(**NJIT_OPTIONS)(_spec_advantages.finite_sum)
register_jitable(**NJIT_OPTIONS)(_spec_advantages.next_value)

gae_recursion = njit(_spec_advantages.gae_recursion)
vtrace_recursion = njit(_spec_advantages.vtrace_recursion)
log_ratios = njit(_spec_advantages.log_ratios)
transition_masks_loop = njit(_spec_masks.transition_masks_loop)
episode_starts_loop = njit(_spec_masks.episode_starts_loop)
