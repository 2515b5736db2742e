"""Cross-check rlax 0.1.9 (``truncated_generalized_advantage_estimation``,
``vtrace_td_error_and_advantage``, ``clipped_surrogate_pg_loss``) against ppo_ref with
``ppo_ref.testing``, in float64 (``jax_enable_x64``).

rlax takes one env's ``[T]`` arrays with ``discount_t = gamma * (1 - done)`` and values
``[T+1]`` (the ``discounts`` layout); its V-trace has no ``c_bar`` (c = lambda * min(1, rho))
and ``clip_pg_rho_threshold`` defaults to 1, so those are pinned with ``fixed``. Its policy
loss returns the loss alone (the gradient is taken with ``jax.grad``; no clip fraction).

Run: ``python validation/crosscheck_rlax.py`` (SKIP when rlax is not installed).
"""
import numpy as np

from crosscheck_common import require, run_table


def main():
    rlax = require("rlax", "rlax")
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from ppo_ref.testing import check_gae, check_policy_loss, check_vtrace, identify

    def rlax_gae(rewards, discounts, values, *, gae_lambda):
        return np.stack([np.asarray(rlax.truncated_generalized_advantage_estimation(
            jnp.asarray(rewards[:, n]), jnp.asarray(discounts[:, n]), gae_lambda,
            jnp.asarray(values[:, n]))) for n in range(rewards.shape[1])], axis=1)

    def rlax_vtrace(behaviour_log_probs, target_log_probs, rewards, discounts, values, *,
                    lambda_, rho_bar, c_bar, pg_rho_bar):
        vs, pg = [], []
        for n in range(rewards.shape[1]):
            rho = jnp.exp(jnp.asarray(target_log_probs[:, n] - behaviour_log_probs[:, n]))
            out = rlax.vtrace_td_error_and_advantage(
                jnp.asarray(values[:-1, n]), jnp.asarray(values[1:, n]),
                jnp.asarray(rewards[:, n]), jnp.asarray(discounts[:, n]), rho,
                lambda_=lambda_, clip_rho_threshold=rho_bar,
                clip_pg_rho_threshold=1.0 if pg_rho_bar is None else pg_rho_bar)
            vs.append(np.asarray(out.errors) + values[:-1, n])
            pg.append(np.asarray(out.pg_advantage))
        return np.stack(vs, 1), np.stack(pg, 1)

    def rlax_policy_loss(new_log_probs, old_log_probs, advantages, clip_range):
        def loss(new):
            return rlax.clipped_surrogate_pg_loss(jnp.exp(new - jnp.asarray(old_log_probs)),
                                                  jnp.asarray(advantages), clip_range)
        new = jnp.asarray(new_log_probs)
        return float(loss(new)), np.asarray(jax.grad(loss)(new))

    run_table("rlax 0.1.9", [
        ("check_gae(layout=discounts, convention=rlax)",
         lambda: check_gae(rlax_gae, layout="discounts", convention="rlax", max_examples=200)),
        ("identify(gae)", lambda: identify(rlax_gae, "gae", layout="discounts")),
        ("check_vtrace(c_bar=1, pg_rho_bar=1, convention=rlax)",
         lambda: check_vtrace(rlax_vtrace, layout="discounts", convention="rlax",
                              fixed={"c_bar": 1.0, "pg_rho_bar": 1.0}, max_examples=100)),
        ("check_policy_loss (loss and gradient)",
         lambda: check_policy_loss(rlax_policy_loss, skip=("clip_fraction", "approx_kl"),
                                   max_examples=200)),
    ])


if __name__ == "__main__":
    main()
