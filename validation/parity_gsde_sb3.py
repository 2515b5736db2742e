"""gSDE parity: ppo_ref's ``gsde_*`` functions (both tiers) vs Stable-Baselines3's
``StateDependentNoiseDistribution`` with torch autograd, in float64, on the same mean actions,
``log_std``, latent features, actions and exploration matrices.

Compared, for ``full_std`` True/False and ``use_expln`` True/False: the std matrix
(``get_std``), the log-probability and the entropy, the gradients of ``sum(g * log_prob) +
sum(h * entropy)`` in the mean, ``log_std`` and (with SB3's ``learn_features=True``) the
features, and the action ``mean + phi @ E`` (``get_noise`` with the same ``exploration_matrices``,
one per row). With ``learn_features=False`` (what SB3's PPO uses) SB3 gives the features no
gradient through the distribution, as ppo_ref's policy does not propagate ``d_features``.

Run: ``python validation/parity_gsde_sb3.py`` (needs torch and stable_baselines3).
"""
from __future__ import annotations

import numpy as np
import torch as th
from stable_baselines3.common.distributions import StateDependentNoiseDistribution

from parity_common import Row, compare, print_table

from ppo_ref.fast import distributions as fast
from ppo_ref.spec import distributions as spec

TOL = 1e-12


def _case(rng, full_std: bool, use_expln: bool, learn_features: bool, batch=9, latent=6,
          n_actions=3):
    name = (f"full_std={full_std} use_expln={use_expln} learn_features={learn_features}")
    mean = rng.standard_normal((batch, n_actions))
    log_std = rng.uniform(-1.5, 1.0, (latent, n_actions if full_std else 1))
    features = np.tanh(rng.standard_normal((batch, latent)))
    actions = mean + rng.standard_normal(mean.shape)
    matrices = 0.5 * rng.standard_normal((batch, latent, n_actions))
    g, h = rng.standard_normal(batch), rng.standard_normal(batch)

    dist = StateDependentNoiseDistribution(n_actions, full_std=full_std, use_expln=use_expln,
                                           learn_features=learn_features)
    dist.latent_sde_dim = latent   # (set by proba_distribution_net in a policy)
    t_mean, t_log_std, t_features = (th.tensor(a, requires_grad=True)
                                     for a in (mean, log_std, features))
    dist.proba_distribution(t_mean, t_log_std, t_features)
    t_log_prob = dist.log_prob(th.tensor(actions))
    t_entropy = dist.entropy()
    (th.sum(th.tensor(g) * t_log_prob) + th.sum(th.tensor(h) * t_entropy)).backward()
    dist.exploration_matrices = th.tensor(matrices)
    t_action = (t_mean + dist.get_noise(t_features)).detach().numpy()
    t_std = dist.get_std(t_log_std).detach().numpy()

    rows = []
    for tier_name, tier in (("spec", spec), ("fast", fast)):
        case = f"{name} [{tier_name}]"
        std = np.broadcast_to(tier.gsde_std(log_std, use_expln), (latent, n_actions))
        rows.append(compare(case, "std (get_std)", std, t_std, TOL))
        rows.append(compare(case, "log_prob", tier.gsde_log_prob(
            mean, log_std, features, actions, use_expln), t_log_prob.detach().numpy(), TOL))
        rows.append(compare(case, "entropy", tier.gsde_entropy(
            log_std, features, n_actions, use_expln), t_entropy.detach().numpy(), TOL))
        d_mean, d_log_std, d_features = tier.gsde_log_prob_backward(
            mean, log_std, features, actions, g, use_expln)
        e_log_std, e_features = tier.gsde_entropy_backward(log_std, features, n_actions, h,
                                                           use_expln)
        rows.append(compare(case, "d mean", d_mean, t_mean.grad.numpy(), TOL))
        rows.append(compare(case, "d log_std", d_log_std + e_log_std, t_log_std.grad.numpy(),
                            TOL))
        if learn_features:
            rows.append(compare(case, "d features", d_features + e_features,
                                t_features.grad.numpy(), TOL))
        else:
            rows.append(Row(case, "d features (detached in SB3)", float("nan"), 0.0,
                            t_features.grad is None, "SB3 gives none; ppo_ref's policy drops it"))
        rows.append(compare(case, "action mean + phi @ E", tier.gsde_action(
            mean, features, matrices), t_action, TOL))
    return rows


def run(seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = []
    for full_std in (True, False):
        for use_expln in (False, True):
            for learn_features in (True, False):
                rows += _case(rng, full_std, use_expln, learn_features)
    return rows


def main() -> int:
    return 0 if print_table("gSDE vs SB3 StateDependentNoiseDistribution", run()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
