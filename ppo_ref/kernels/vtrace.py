"""Old home of :func:`vtrace` (now :func:`ppo_ref.spec.advantages.vtrace` and its compiled twin
:func:`ppo_ref.fast.advantages.vtrace`): a thin layer choosing the tier by ``backend``, kept
until the switch."""
from ppo_ref.kernels._inputs import tier_module
from ppo_ref.spec.advantages import VTraceReturns

__all__ = ["vtrace", "VTraceReturns"]


def vtrace(behaviour_log_probs, target_log_probs, rewards, values, terminated, truncated,
           last_values, final_values=None, *, gamma, rho_bar=1.0, c_bar=1.0, pg_rho_bar=None,
           lambda_=1.0, truncation="bootstrap", bootstrap_terminal_last_row=False,
           backend="fast") -> VTraceReturns:
    """:func:`ppo_ref.spec.advantages.vtrace` (``backend="spec"``) or its compiled twin
    (``"fast"``, the default); the same bits."""
    return tier_module(backend, "advantages").vtrace(
        behaviour_log_probs, target_log_probs, rewards, values, terminated, truncated,
        last_values, final_values, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar,
        pg_rho_bar=pg_rho_bar, lambda_=lambda_, truncation=truncation,
        bootstrap_terminal_last_row=bootstrap_terminal_last_row)
