"""Cross-check Sample Factory 2.1.1's GAE (``sample_factory.algo.utils.rl_utils.gae_advantages``)
against ppo_ref with ``ppo_ref.testing``.

``gae_advantages(rewards, dones, values, valids, gamma, lambda)`` takes env-major ``[E, T]``
rewards and dones and ``[E, T+1]`` values (the ``dones`` layout, transposed), all rows valid.
Its default is ``value_bootstrap=False`` (truncation as termination); with ``value_bootstrap``
the learner first adds ``gamma * V(s_t) * time_outs * dones`` to the rewards
(``Learner._prepare_batch``), with ``time_outs`` the truncated flag: every truncated step, also
one that terminated as well. ``V(s_t)`` stands in for the value of the final observation (in
ppo_ref's terms ``final_values = values``): the second adapter is faithful to that, the third
hands the library ``final_values`` there so that only the rule of which steps bootstrap is
compared.

Run: ``python validation/crosscheck_sample_factory.py`` (SKIP when sample-factory is not
installed; it pins gymnasium < 1 and numpy < 2, which ppo_ref's own imports do not need here).
"""
import numpy as np

from crosscheck_common import require, run_table


def main():
    rl_utils = require("sample_factory.algo.utils.rl_utils", "Sample Factory")
    import torch
    from ppo_ref.testing import check_gae, identify

    def sf_gae(rewards, values, dones, *, gamma, gae_lambda):
        t = lambda x: torch.as_tensor(np.ascontiguousarray(np.asarray(x, np.float64).T))
        valids = torch.ones(values.shape[1], values.shape[0], dtype=torch.bool)
        adv = rl_utils.gae_advantages(t(rewards), t(dones), t(values), valids, gamma,
                                      gae_lambda)
        return adv.numpy().T, adv.numpy().T + values[:-1]

    def sf_value_bootstrap(rewards, values, terminated, truncated, last_values, final_values, *,
                           gamma, gae_lambda, time_out_values=None):
        # reference layout in, so the time-outs are known: reward += gamma * V(s_t) there
        boot = values if time_out_values is None else time_out_values
        dones = terminated | truncated
        r = rewards + gamma * boot * truncated * dones
        ext = np.concatenate([values, last_values[None]], axis=0)
        return sf_gae(r, ext, dones, gamma=gamma, gae_lambda=gae_lambda)

    def sf_value_bootstrap_final(rewards, values, terminated, truncated, last_values,
                                 final_values, *, gamma, gae_lambda):
        return sf_value_bootstrap(rewards, values, terminated, truncated, last_values,
                                  final_values, gamma=gamma, gae_lambda=gae_lambda,
                                  time_out_values=final_values)

    run_table("Sample Factory 2.1.1: gae_advantages", [
        ("check_gae(layout=dones, convention=sample_factory)",
         lambda: check_gae(sf_gae, layout="dones", convention="sample_factory",
                           max_examples=300)),
        ("identify(gae)", lambda: identify(sf_gae, "gae", layout="dones")),
        ("value_bootstrap=True: identify(gae)",
         lambda: identify(sf_value_bootstrap, "gae")),
        ("value_bootstrap=True, V(final_obs) for V(s_t): identify(gae)",
         lambda: identify(sf_value_bootstrap_final, "gae")),
    ])


if __name__ == "__main__":
    main()
