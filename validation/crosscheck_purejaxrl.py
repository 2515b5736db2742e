"""Cross-check PureJaxRL's GAE and loss, re-expressed here from its published source
(github.com/luchris429/purejaxrl, ``purejaxrl/ppo.py`` at commit
31756b197773a52db763fdbe6d635e4b46522a73, ``_calculate_gae`` and ``_loss_fn``), with
``ppo_ref.testing``. PureJaxRL is a script, not a library: the functions below restate its
equations in NumPy (written for this check, not copied):

* GAE, scanned backward over transitions ``(done, value, reward)`` from ``(0, last_val)``:
  ``delta = r + gamma * next_value * (1 - done) - value``,
  ``gae = delta + gamma * lambda * (1 - done) * gae``; targets ``= gae + value``.
* actor loss: advantages standardized with ``jnp`` std (ddof 0) + 1e-8, then
  ``-mean(min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A))``.

No JAX is needed. Run: ``python validation/crosscheck_purejaxrl.py``.
"""
import numpy as np

from crosscheck_common import run_table

COMMIT = "31756b197773a52db763fdbe6d635e4b46522a73"


def purejaxrl_gae(rewards, values, dones, *, gamma, gae_lambda):
    """``values`` ``[T+1, N]`` (the last row is ``last_val``), ``dones`` ``[T, N]``."""
    T = rewards.shape[0]
    adv = np.zeros(rewards.shape)
    gae, next_value = np.zeros(rewards.shape[1]), values[T]
    for t in range(T - 1, -1, -1):
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * not_done - values[t]
        gae = delta + gamma * gae_lambda * not_done * gae
        adv[t], next_value = gae, values[t]
    return adv, adv + values[:-1]


def purejaxrl_normalize(advantages):
    a = np.asarray(advantages, np.float64)
    return (a - a.mean()) / (a.std() + 1e-8)


def main():
    from ppo_ref.testing import check_gae, check_normalize_advantages, identify
    run_table(f"PureJaxRL ppo.py @ {COMMIT[:8]} (re-expressed)", [
        ("check_gae(layout=dones, convention=purejaxrl)",
         lambda: check_gae(purejaxrl_gae, layout="dones", convention="purejaxrl",
                           max_examples=300)),
        ("identify(gae)", lambda: identify(purejaxrl_gae, "gae", layout="dones")),
        ("identify(normalize_advantages)",
         lambda: identify(purejaxrl_normalize, "normalize_advantages")),
    ])


if __name__ == "__main__":
    main()
