"""Full PPO update parity: ppo_ref (``PPOConfig.preset("cleanrl")``) vs a CleanRL-style update
written in torch below (the structure of CleanRL's ``ppo.py`` update loop, float64).

The torch update follows CleanRL's ``ppo.py`` conventions, written here from its description:

* ``Agent``: separate ``critic`` and ``actor`` towers ``Linear-Tanh-Linear-Tanh-Linear``
  (64, 64), orthogonal init (``sqrt(2)`` hidden, 1.0 critic head, 0.01 actor head), zero biases;
  one Adam over all parameters with ``eps=1e-5``.
* per epoch, shuffle the row indices and walk minibatches; per minibatch: new log-prob, entropy
  and value; ``ratio = exp(logratio)``; advantages normalized per minibatch
  (``(A - mean) / (std + 1e-8)``, unbiased std); policy loss ``mean(max(-A r, -A clip(r)))``;
  value loss ``0.5 * mean(max((V - R)^2, (V_old + clamp(V - V_old, -c, c) - R)^2))`` with
  ``c = clip_coef`` (``clip_vloss=True``); ``loss = pg - ent_coef * H + vf_coef * v``;
  ``clip_grad_norm_`` then ``optimizer.step()``;
* after each epoch: ``if target_kl is not None and approx_kl > target_kl: break`` with the last
  minibatch's k3 estimate ``mean((r - 1) - log r)``.

Weights: ``actor.0/2/4`` -> ``pi.w0..w2``, ``critic.0/2/4`` -> ``vf.w0..w2``. Both sides walk the
same fixed permutations (ppo_ref through ``run_epochs``'s ``minibatches(epoch)`` callback).

Scenarios: (a) no target_kl; (b) ``target_kl`` small enough that CleanRL's after-epoch rule
stops the update early. One more row shows the documented difference to the reference value loss
(``preset("reference")`` with the same clip range: no 0.5 factor).

Run: ``python validation/parity_cleanrl_update.py`` (needs torch).
"""
from __future__ import annotations

import math

import numpy as np
import torch as th
from torch import nn

from parity_common import Row, print_table
from parity_sb3_update import (N_ACTIONS, OBS_DIM, chunks, make_batch, max_param_diff,
                               params_from_torch, permutations, run_ppo_ref, spec_policy)

from ppo_ref.config import PPOConfig

CLEANRL_LAYOUT = (("actor.0", "pi.w0", "pi.b0"), ("actor.2", "pi.w1", "pi.b1"),
                  ("actor.4", "pi.w2", "pi.b2"), ("critic.0", "vf.w0", "vf.b0"),
                  ("critic.2", "vf.w1", "vf.b1"), ("critic.4", "vf.w2", "vf.b2"))


def _init_layer(layer: nn.Linear, std: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, 0.0)
    return layer


class Agent(nn.Module):
    """CleanRL-style discrete actor-critic with separate towers."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64):
        super().__init__()
        self.critic = nn.Sequential(
            _init_layer(nn.Linear(obs_dim, hidden), math.sqrt(2)), nn.Tanh(),
            _init_layer(nn.Linear(hidden, hidden), math.sqrt(2)), nn.Tanh(),
            _init_layer(nn.Linear(hidden, 1), 1.0))
        self.actor = nn.Sequential(
            _init_layer(nn.Linear(obs_dim, hidden), math.sqrt(2)), nn.Tanh(),
            _init_layer(nn.Linear(hidden, hidden), math.sqrt(2)), nn.Tanh(),
            _init_layer(nn.Linear(hidden, n_actions), 0.01))

    def action_value(self, obs, actions):
        dist = th.distributions.Categorical(logits=self.actor(obs))
        return dist.log_prob(actions), dist.entropy(), self.critic(obs).view(-1)


def cleanrl_update(agent: Agent, batch: dict, perms, *, lr, clip_coef, ent_coef, vf_coef,
                   max_grad_norm, minibatch_size, target_kl=None, norm_adv=True,
                   clip_vloss=True) -> dict:
    """The update loop in CleanRL's style, over the given per-epoch permutations."""
    b = {k: th.as_tensor(v, dtype=th.float64 if v.dtype.kind == "f" else th.int64)
         for k, v in batch.items()}
    optimizer = th.optim.Adam(agent.parameters(), lr=lr, eps=1e-5)
    steps = epochs = 0
    approx_kl = th.tensor(0.0)
    for perm in perms:
        epochs += 1
        for mb_inds in chunks(perm, minibatch_size):
            i = th.as_tensor(mb_inds)
            newlogprob, entropy, newvalue = agent.action_value(b["observations"][i],
                                                               b["actions"][i])
            logratio = newlogprob - b["old_log_probs"][i]
            ratio = logratio.exp()
            with th.no_grad():
                approx_kl = ((ratio - 1) - logratio).mean()
            mb_adv = b["advantages"][i]
            if norm_adv:
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
            pg_loss = th.max(-mb_adv * ratio,
                             -mb_adv * th.clamp(ratio, 1 - clip_coef, 1 + clip_coef)).mean()
            returns, old_values = b["returns"][i], b["old_values"][i]
            if clip_vloss:
                unclipped = (newvalue - returns) ** 2
                v_clipped = old_values + th.clamp(newvalue - old_values, -clip_coef, clip_coef)
                v_loss = 0.5 * th.max(unclipped, (v_clipped - returns) ** 2).mean()
            else:
                v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
            loss = pg_loss - ent_coef * entropy.mean() + v_loss * vf_coef
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), max_grad_norm)
            optimizer.step()
            steps += 1
        if target_kl is not None and approx_kl > target_kl:
            break
    return {"steps": steps, "epochs": epochs}


SCENARIOS = {"no target_kl": None, "target_kl=0.002 (after-epoch stop)": 0.002}


def run(seed: int = 1) -> list:
    rows = []
    for name, target_kl in SCENARIOS.items():
        rng = np.random.default_rng(seed)
        th.manual_seed(seed)
        config = PPOConfig.preset("cleanrl", n_steps=32, batch_size=8, n_epochs=4,
                                  learning_rate=3e-3, ent_coef=0.01, net_arch=(64, 64),
                                  target_kl=target_kl)
        agent = Agent(OBS_DIM, N_ACTIONS).double()
        params = params_from_torch(agent, CLEANRL_LAYOUT)
        batch = make_batch(rng, spec_policy(config), params, config.n_steps)
        perms = permutations(rng, config.n_steps, config.n_epochs)
        new_params, stats = run_ppo_ref(config, params, batch, perms)
        info = cleanrl_update(agent, batch, perms, lr=config.learning_rate,
                              clip_coef=config.clip_range, ent_coef=config.ent_coef,
                              vf_coef=config.vf_coef, max_grad_norm=config.max_grad_norm,
                              minibatch_size=config.batch_size, target_kl=target_kl)
        err = max_param_diff(new_params, agent, CLEANRL_LAYOUT)
        moved = max(float(np.max(np.abs(new_params[k] - params[k]))) for k in params)
        rows.append(Row(f"CleanRL-style torch, {name}", "all parameters", err, 1e-6,
                        err <= 1e-6, f"float64; params moved by up to {moved:.2e}"))
        n_ref = int(stats["n_gradient_steps"])
        rows.append(Row(f"CleanRL-style torch, {name}", "gradient steps",
                        float(abs(n_ref - info["steps"])), 0.0, n_ref == info["steps"],
                        f"ppo_ref {n_ref} ({int(stats['n_epochs_run'])} epochs), CleanRL "
                        f"{info['steps']} ({info['epochs']} epochs)"))
        if target_kl is None:
            spec = PPOConfig.preset("reference", n_steps=32, batch_size=8, n_epochs=4,
                                    learning_rate=3e-3, ent_coef=0.01, net_arch=(64, 64),
                                    clip_range_vf=config.clip_range_vf)
            spec_params, _ = run_ppo_ref(spec, params, batch, perms)
            diff = max_param_diff(spec_params, agent, CLEANRL_LAYOUT)
            rows.append(Row(f"CleanRL-style torch, {name}", "reference preset instead",
                            diff, 1e-6, diff > 1e-6,
                            "differs: reference value loss has no 0.5 factor (CleanRL's "
                            "value_loss_scale=0.5 halves the value gradient)"))
    return rows


def main() -> list:
    rows = run()
    print_table("Full PPO update: ppo_ref (cleanrl preset) vs a CleanRL-style torch update", rows)
    return rows


if __name__ == "__main__":
    main()
