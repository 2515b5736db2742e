"""Old home of :func:`gae` (now :func:`ppo_ref.spec.advantages.gae` and its compiled twin
:func:`ppo_ref.fast.advantages.gae`): a thin layer choosing the tier by ``backend``, kept until
the switch."""
from ppo_ref.kernels._inputs import tier_module

__all__ = ["gae"]


def gae(rewards, values, terminated, truncated, last_values, final_values=None, *,
        gamma, gae_lambda, truncation="bootstrap", bootstrap_terminal_last_row=False,
        backend="fast"):
    """:func:`ppo_ref.spec.advantages.gae` (``backend="spec"``) or its compiled twin
    (``"fast"``, the default); the same bits."""
    return tier_module(backend, "advantages").gae(
        rewards, values, terminated, truncated, last_values, final_values, gamma=gamma,
        gae_lambda=gae_lambda, truncation=truncation,
        bootstrap_terminal_last_row=bootstrap_terminal_last_row)
