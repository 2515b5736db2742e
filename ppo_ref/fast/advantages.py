"""The compiled twins of :mod:`ppo_ref.spec.advantages`, bit for bit: the spec's validation
around its recursions compiled (``njit`` of the very functions; the scalar helpers they call
through ``register_jitable``)."""
from numba.extending import register_jitable

from ppo_ref._numba import NJIT_OPTIONS, njit
from ppo_ref.spec import advantages as _spec
from ppo_ref.spec import masks as _spec_masks
from ppo_ref.spec.advantages import VTraceReturns

__all__ = ["gae", "vtrace", "VTraceReturns"]

for _helper in (_spec_masks.transition_flags, _spec.finite_sum, _spec.next_value):
    register_jitable(**NJIT_OPTIONS)(_helper)
del _helper

_gae_recursion = njit(_spec.gae_recursion)
_vtrace_recursion = njit(_spec.vtrace_recursion)
_log_ratios = njit(_spec.log_ratios)


def gae(rewards, values, terminated, truncated, last_values, final_values=None, *,
        gamma, gae_lambda, truncation="bootstrap", bootstrap_terminal_last_row=False):
    """:func:`ppo_ref.spec.advantages.gae` with the recursion compiled; bit for bit."""
    return _spec.run_gae(_gae_recursion, rewards, values, terminated, truncated, last_values,
                         final_values, gamma, gae_lambda, truncation, bootstrap_terminal_last_row)


def vtrace(behaviour_log_probs, target_log_probs, rewards, values, terminated, truncated,
           last_values, final_values=None, *, gamma, rho_bar=1.0, c_bar=1.0, pg_rho_bar=None,
           lambda_=1.0, truncation="bootstrap", bootstrap_terminal_last_row=False):
    """:func:`ppo_ref.spec.advantages.vtrace` with the loops compiled; bit for bit."""
    return _spec.run_vtrace(_vtrace_recursion, _log_ratios, behaviour_log_probs,
                            target_log_probs, rewards, values, terminated, truncated,
                            last_values, final_values, gamma, rho_bar, c_bar, pg_rho_bar,
                            lambda_, truncation, bootstrap_terminal_last_row)
