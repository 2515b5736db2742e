"""Cross-check CleanRL's GAE and advantage normalization, re-expressed here from its published
source (github.com/vwxyzjn/cleanrl, ``cleanrl/ppo.py`` at commit
fe8d8a03c41a7ef5b523e2e354bd01c363e786bb, lines 221-230 and 262), with ``ppo_ref.testing``.
The functions below restate its equations in NumPy (written for this check, not copied):

* GAE over ``dones[t]`` = "an episode starts at t" (``next_done = terminations | truncations``
  of the step before): ``nextnonterminal = 1 - next_done`` on the last row, ``1 - dones[t+1]``
  before it; ``delta = r + gamma * nextvalues * nextnonterminal - values``;
  ``A = delta + gamma * lambda * nextnonterminal * A_next``.
* minibatch normalization ``(A - mean) / (std + 1e-8)`` with torch's std (ddof 1).

Run: ``python validation/crosscheck_cleanrl.py`` (numpy only; CI runs it).
"""
import warnings

import numpy as np

from crosscheck_common import run_table

COMMIT = "fe8d8a03c41a7ef5b523e2e354bd01c363e786bb"


def cleanrl_gae(rewards, values, episode_starts, last_values, last_episode_starts, *, gamma,
                gae_lambda):
    T = rewards.shape[0]
    adv = np.zeros(rewards.shape)
    following = np.zeros(rewards.shape[1])
    for t in range(T - 1, -1, -1):
        if t == T - 1:
            keep, next_values = 1.0 - last_episode_starts, last_values
        else:
            keep, next_values = 1.0 - episode_starts[t + 1], values[t + 1]
        delta = rewards[t] + gamma * next_values * keep - values[t]
        following = delta + gamma * gae_lambda * keep * following
        adv[t] = following
    return adv, adv + values


def cleanrl_normalize(advantages):
    # ``(mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)``, unguarded:
    # torch's unbiased std of one element is NaN (the preset's advantage_norm_single_element)
    a = np.asarray(advantages, np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's "degrees of freedom <= 0"
        return (a - a.mean()) / (a.std(ddof=1) + 1e-8)


def main():
    from ppo_ref.testing import check_gae, check_normalize_advantages, identify
    run_table(f"CleanRL ppo.py @ {COMMIT[:8]} (re-expressed)", [
        ("check_gae(layout=episode_starts, convention=cleanrl)",
         lambda: check_gae(cleanrl_gae, layout="episode_starts", convention="cleanrl",
                           max_examples=300)),
        ("identify(gae)", lambda: identify(cleanrl_gae, "gae", layout="episode_starts")),
        ("check_normalize_advantages(convention=cleanrl)",
         lambda: check_normalize_advantages(cleanrl_normalize, convention="cleanrl")),
    ])


if __name__ == "__main__":
    main()
