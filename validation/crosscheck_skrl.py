"""Cross-check skrl 2.1.1's GAE (``skrl.agents.torch.ppo.ppo.compute_gae``) against ppo_ref with
``ppo_ref.testing``.

``compute_gae(*, rewards, terminated, truncated, values, last_values, discount_factor,
lambda_coefficient, time_limit_bootstrap)`` takes ``[T, N]`` tensors and returns ``(returns,
advantages)`` with the advantages normalized over the whole memory (the
``normalized_outputs`` layout). By default it reads ``terminated`` only. With
``time_limit_bootstrap=True`` it cuts at ``terminated or truncated`` and the agent first adds
``discount_factor * V(next_observations) * truncated`` to the stored rewards
(``PPO.record_transition``; at a truncated step the next observation is the final one, so this
is ``gamma * final_values``), also on a step that terminated as well; the adapter does both.

Run: ``python validation/crosscheck_skrl.py`` (SKIP when skrl is not installed).
"""
import numpy as np

from crosscheck_common import require, run_table


def main():
    ppo = require("skrl.agents.torch.ppo.ppo", "skrl")
    import torch
    from ppo_ref.testing import check_gae, identify

    def skrl_gae(rewards, values, terminated, truncated, last_values, final_values, *, gamma,
                 gae_lambda, time_limit_bootstrap=False):
        r = np.asarray(rewards, np.float64)
        if time_limit_bootstrap:  # as PPO.record_transition does before storing the rewards
            r = r + gamma * np.asarray(final_values, np.float64) * truncated
        t = lambda x, d=torch.float64: torch.as_tensor(np.asarray(x), dtype=d)
        returns, advantages = ppo.compute_gae(
            rewards=t(r), terminated=t(terminated, torch.bool),
            truncated=t(truncated, torch.bool), values=t(values), last_values=t(last_values),
            discount_factor=gamma, lambda_coefficient=gae_lambda,
            time_limit_bootstrap=time_limit_bootstrap)
        return advantages.numpy(), returns.numpy()

    def skrl_gae_n2(rewards, values, terminated, truncated, last_values, final_values, *,
                    gamma, gae_lambda, time_limit_bootstrap=False):
        # skrl's torch std of a one-element memory is nan; ppo_ref leaves one element as it is.
        # Past that first finding: run skrl on the input doubled along the envs (every statistic
        # of the normalization is unchanged by the copy) and keep one copy.
        twice = [np.concatenate([a, a], axis=1) for a in (rewards, values, terminated,
                                                          truncated, final_values)]
        adv, ret = skrl_gae(twice[0], twice[1], twice[2], twice[3],
                            np.concatenate([last_values, last_values]), twice[4], gamma=gamma,
                            gae_lambda=gae_lambda, time_limit_bootstrap=time_limit_bootstrap)
        n = rewards.shape[1]
        if rewards.size > 1:  # (the doubled std uses 2n - 1 degrees of freedom: redo exactly)
            return skrl_gae(rewards, values, terminated, truncated, last_values, final_values,
                            gamma=gamma, gae_lambda=gae_lambda,
                            time_limit_bootstrap=time_limit_bootstrap)
        return (adv[:, :n] * 0 + (ret[:, :n] - values)), ret[:, :n]

    def skrl_time_limit(rewards, values, terminated, truncated, last_values, final_values, *,
                        gamma, gae_lambda):
        return skrl_gae_n2(rewards, values, terminated, truncated, last_values, final_values,
                           gamma=gamma, gae_lambda=gae_lambda, time_limit_bootstrap=True)

    run_table("skrl 2.1.1: compute_gae", [
        ("check_gae(layout=normalized_outputs, convention=skrl)",
         lambda: check_gae(skrl_gae, layout="normalized_outputs", convention="skrl",
                           max_examples=300)),
        ("one element passed through unchanged: check_gae(convention=skrl)",
         lambda: check_gae(skrl_gae_n2, layout="normalized_outputs", convention="skrl",
                           max_examples=300)),
        ("one element passed through unchanged: identify(gae)",
         lambda: identify(skrl_gae_n2, "gae", layout="normalized_outputs")),
        ("time_limit_bootstrap=True: identify(gae)",
         lambda: identify(skrl_time_limit, "gae", layout="normalized_outputs")),
    ])


if __name__ == "__main__":
    main()
