"""Cross-check tianshou's GAE (``tianshou.algorithm.algorithm_base._gae``, tianshou 2.0.1)
against ppo_ref with ``ppo_ref.testing``.

tianshou computes ``_gae(v_s, v_s_, rew, end_flag, gamma, gae_lambda)`` over one env's
transitions, with ``v_s_ = V(obs_next) * (1 - terminated)`` (``value_mask``) and
``end_flag = terminated or truncated`` (and True on the last, unfinished, step of the buffer).
The adapter below builds exactly those arrays from the ``next_values`` layout.

Run: ``python validation/crosscheck_tianshou.py`` (prints a table; SKIP when tianshou is not
installed).
"""
import numpy as np

from crosscheck_common import require, run_table


def main():
    base = require("tianshou.algorithm.algorithm_base", "tianshou")
    from ppo_ref.testing import check_gae, identify

    def tianshou_gae(rewards, values, next_values, terminated, truncated, *, gamma, gae_lambda):
        adv = np.empty_like(np.asarray(rewards, np.float64))
        for n in range(rewards.shape[1]):                     # one env = one buffer segment
            end = (terminated[:, n] | truncated[:, n]).copy()
            end[-1] = True                                    # buffer.unfinished_index()
            v_next = next_values[:, n] * ~terminated[:, n]    # Algorithm.value_mask
            adv[:, n] = base._gae(values[:, n].astype(np.float64), v_next.astype(np.float64),
                                  rewards[:, n].astype(np.float64), end, gamma, gae_lambda)
        return adv, adv + values

    run_table("tianshou 2.0.1: _gae", [
        ("check_gae(layout=next_values, convention=tianshou)",
         lambda: check_gae(tianshou_gae, layout="next_values", convention="tianshou",
                           max_examples=300)),
        ("identify(gae)", lambda: identify(tianshou_gae, "gae", layout="next_values")),
    ])


if __name__ == "__main__":
    main()
