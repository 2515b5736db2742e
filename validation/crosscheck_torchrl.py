"""Cross-check torchrl's GAE functions (``torchrl.objectives.value.functional``, torchrl
0.14.1) and its advantage standardization against ppo_ref with ``ppo_ref.testing``.

``generalized_advantage_estimate`` (a loop) and ``vec_generalized_advantage_estimate``
(vectorized) take ``state_value``, ``next_state_value`` (V of the pre-reset next observation),
``reward``, ``done`` and ``terminated`` shaped ``[batch, T, 1]`` (``time_dim=-2``); the adapter
transposes the ``next_values`` layout into that, in float64. ``_standardize`` is the advantage
normalization of ``ClipPPOLoss(normalize_advantage=True)``.

Run: ``python validation/crosscheck_torchrl.py`` (SKIP when torchrl is not installed).
"""
import numpy as np

from crosscheck_common import require, run_table


def main():
    functional = require("torchrl.objectives.value.functional", "torchrl")
    import torch
    from torchrl._utils import _standardize
    from ppo_ref.testing import check_gae, check_normalize_advantages, identify

    def as_bt1(x, dtype=torch.float64):
        return torch.as_tensor(np.ascontiguousarray(np.asarray(x).T)[..., None], dtype=dtype)

    def adapter(fn):
        def torchrl_gae(rewards, values, next_values, terminated, truncated, *, gamma,
                        gae_lambda):
            adv, ret = fn(gamma, gae_lambda, as_bt1(values), as_bt1(next_values),
                          as_bt1(rewards), as_bt1(terminated | truncated, torch.bool),
                          as_bt1(terminated, torch.bool))
            return adv[..., 0].numpy().T, ret[..., 0].numpy().T
        torchrl_gae.__name__ = fn.__name__
        return torchrl_gae

    loop = adapter(functional.generalized_advantage_estimate)
    vec = adapter(functional.vec_generalized_advantage_estimate)

    def standardize(advantages):
        return _standardize(torch.as_tensor(np.asarray(advantages, np.float64))).numpy()

    run_table("torchrl 0.14.1: GAE and advantage standardization", [
        ("check_gae(generalized_advantage_estimate, convention=torchrl)",
         lambda: check_gae(loop, layout="next_values", convention="torchrl", max_examples=300)),
        ("check_gae(vec_generalized_advantage_estimate, convention=torchrl)",
         lambda: check_gae(vec, layout="next_values", convention="torchrl", max_examples=300)),
        ("identify(generalized_advantage_estimate)",
         lambda: identify(loop, "gae", layout="next_values")),
        ("identify(_standardize)", lambda: identify(standardize, "normalize_advantages")),
    ])


if __name__ == "__main__":
    main()
