"""Recurrent policy parity: ppo_ref's ``RecurrentPolicy`` (``ppo_ref.train.policies``, on the
default backend's tier) vs sb3-contrib's ``MlpLstmPolicy`` (``RecurrentActorCriticPolicy``) with
copied weights, over a sequence with episode starts.

Architecture mapping (sb3-contrib 2.x, ``enable_critic_lstm=True``, ``shared_lstm=False``, the
defaults, = ppo_ref ``lstm_shared=False``)::

    sb3-contrib                                   ppo_ref key
    lstm_actor.weight_ih_l0 [4H, D]               lstm_pi.w_ih
    lstm_actor.weight_hh_l0 [4H, H]               lstm_pi.w_hh
    lstm_actor.bias_ih_l0 + bias_hh_l0 [4H]       lstm_pi.b        (one bias: their sum)
    lstm_critic.*                                 lstm_vf.*
    mlp_extractor.policy_net.{0,2,..}             pi.w0, pi.w1, ...  (net_arch after the LSTM)
    action_net                                    pi.w<last>
    mlp_extractor.value_net.{0,2,..}, value_net   vf.*

Both use torch's gate order (i, f, g, o) and multiply the carried state by
``1 - episode_starts[t]`` before step t. sb3-contrib flattens a batch of sequences
*sequence-major* (``features.reshape(n_seq, T, D).swapaxes(0, 1)``); ppo_ref is time-major
``[T, N]``: inputs are transposed accordingly and outputs transposed back.

Compared, in float64 (``policy.double()``; ``extract_features`` replaced by the float64
identity, as SB3's ``preprocess_obs`` would cast to float32): log-probs, entropies and values
over ``T = 9`` steps of ``N = 3`` sequences that start from stored non-zero LSTM states, with
resets mid-sequence and at t = 0; and the gradient of ``sum(a * log_probs + b * values + c *
entropy)`` with respect to every parameter (ppo_ref's BPTT vs torch autograd). For
``net_arch = (64,)`` and ``net_arch = ()`` (linear heads right after the LSTM).

A last row documents a difference: with ``shared_lstm=True`` sb3-contrib *detaches* the critic's
input (``latent_vf = latent_pi.detach()``), so the value loss never trains the shared LSTM;
ppo_ref's ``lstm_shared=True`` (CleanRL, thrust-rl) sums both towers' gradients into it.
Forward outputs agree; the LSTM gradients differ.

Run: ``python validation/parity_lstm_sb3contrib.py`` (needs torch and sb3_contrib).
"""
from __future__ import annotations

import numpy as np
import torch as th
from gymnasium import spaces

from parity_common import Row, compare, expect_difference, print_table

from ppo_ref.config import PPOConfig
from ppo_ref.spec.recurrent_networks import LSTMStates
from ppo_ref.tiers import tier_for
from ppo_ref.train.policies import RecurrentPolicy

OBS_DIM, N_ACTIONS, HIDDEN = 5, 3, 8
T, N = 9, 3
OBS_SPACE = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
ACT_SPACE = spaces.Discrete(N_ACTIONS)


def contrib_policy(net_arch, shared_lstm: bool, seed: int):
    from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
    th.manual_seed(seed)
    policy = RecurrentActorCriticPolicy(
        OBS_SPACE, ACT_SPACE, lambda _: 1e-3, net_arch=dict(pi=list(net_arch), vf=list(net_arch)),
        activation_fn=th.nn.Tanh, lstm_hidden_size=HIDDEN, shared_lstm=shared_lstm,
        enable_critic_lstm=not shared_lstm)
    policy.double()
    policy.extract_features = lambda obs, features_extractor=None: obs.double()
    return policy


def _lstm_params(state, prefix, name):
    return {f"{name}.w_ih": state[f"{prefix}.weight_ih_l0"],
            f"{name}.w_hh": state[f"{prefix}.weight_hh_l0"],
            f"{name}.b": state[f"{prefix}.bias_ih_l0"] + state[f"{prefix}.bias_hh_l0"]}


def _tower_map(net_arch, tower):
    """[(torch prefix, ppo_ref layer index)] for one tower."""
    seq = "policy_net" if tower == "pi" else "value_net"
    layers = [(f"mlp_extractor.{seq}.{2 * i}", i) for i in range(len(net_arch))]
    layers.append(("action_net" if tower == "pi" else "value_net", len(net_arch)))
    return layers


def params_from_contrib(policy, net_arch, shared_lstm: bool) -> dict:
    state = {k: v.detach().numpy().astype(np.float64).copy()
             for k, v in policy.state_dict().items()}
    if shared_lstm:
        params = _lstm_params(state, "lstm_actor", "lstm")
    else:
        params = {**_lstm_params(state, "lstm_actor", "lstm_pi"),
                  **_lstm_params(state, "lstm_critic", "lstm_vf")}
    for tower in ("pi", "vf"):
        for prefix, i in _tower_map(net_arch, tower):
            params[f"{tower}.w{i}"] = state[prefix + ".weight"]
            params[f"{tower}.b{i}"] = state[prefix + ".bias"]
    return params


def grads_from_contrib(policy, net_arch, shared_lstm: bool) -> dict:
    named = dict(policy.named_parameters())
    g = {k: (v.grad.numpy().copy() if v.grad is not None else np.zeros(tuple(v.shape)))
         for k, v in named.items()}
    out = {}
    lstms = [("lstm_actor", "lstm")] if shared_lstm else [("lstm_actor", "lstm_pi"),
                                                          ("lstm_critic", "lstm_vf")]
    for prefix, name in lstms:
        out[f"{name}.w_ih"] = g[f"{prefix}.weight_ih_l0"]
        out[f"{name}.w_hh"] = g[f"{prefix}.weight_hh_l0"]
        out[f"{name}.b"] = g[f"{prefix}.bias_ih_l0"]      # == bias_hh grad (b = b_ih + b_hh)
    for tower in ("pi", "vf"):
        for prefix, i in _tower_map(net_arch, tower):
            out[f"{tower}.w{i}"] = g[prefix + ".weight"]
            out[f"{tower}.b{i}"] = g[prefix + ".bias"]
    return out


def sequence_data(rng):
    obs = rng.normal(size=(T, N, OBS_DIM))
    actions = rng.integers(0, N_ACTIONS, (T, N))
    starts = np.zeros((T, N), dtype=bool)
    starts[0, 2] = True           # a fresh episode at the segment start (stored state ignored)
    starts[4, 0] = True
    starts[2, 1] = starts[7, 1] = True
    h0 = rng.normal(scale=0.5, size=(2, N, HIDDEN))
    c0 = rng.normal(scale=0.5, size=(2, N, HIDDEN))
    weights = {k: rng.normal(size=(T, N)) for k in ("log_probs", "values", "entropy")}
    return obs, actions, starts, h0, c0, weights


def _seq_major(a):
    """time-major [T, N, ...] -> sb3-contrib's sequence-major flat [N * T, ...]."""
    a = np.asarray(a)
    return np.ascontiguousarray(a.swapaxes(0, 1)).reshape((a.shape[0] * a.shape[1],) + a.shape[2:])


def _time_major(flat):
    """sb3-contrib's flat [N * T] -> time-major [T, N]."""
    return np.asarray(flat).reshape(N, T).T


def run_case(net_arch, shared_lstm: bool, seed: int = 0):
    from sb3_contrib.common.recurrent.type_aliases import RNNStates
    rng = np.random.default_rng(seed)
    policy_c = contrib_policy(net_arch, shared_lstm, seed)
    config = PPOConfig(net_arch=tuple(net_arch), lstm_hidden_size=HIDDEN, lstm_shared=shared_lstm)
    ours = RecurrentPolicy(OBS_SPACE, ACT_SPACE, config, tier_for(config.backend))
    params = params_from_contrib(policy_c, net_arch, shared_lstm)
    assert set(ours.init_params(np.random.default_rng(0))) == set(params), "key mismatch"
    obs, actions, starts, h0, c0, w = sequence_data(rng)
    n_lstm = 1 if shared_lstm else 2
    state = LSTMStates(h0[:n_lstm], c0[:n_lstm])
    log_probs, entropy, values, cache = ours.evaluate(params, (obs, actions, state, starts))
    ev = {"log_probs": log_probs.reshape(T, N), "entropy": entropy.reshape(T, N),
          "values": values.reshape(T, N)}
    grads = ours.backward(params, cache, w["log_probs"].reshape(-1), w["entropy"].reshape(-1),
                          w["values"].reshape(-1))

    t = lambda a: th.as_tensor(a, dtype=th.float64)  # noqa: E731
    vf_state = (t(h0[-1:]), t(c0[-1:]))
    lstm_states = RNNStates(pi=(t(h0[:1]), t(c0[:1])), vf=vf_state)
    values, log_probs, entropy = policy_c.evaluate_actions(
        t(_seq_major(obs)), th.as_tensor(_seq_major(actions)), lstm_states,
        t(_seq_major(starts.astype(np.float64))))
    objective = ((log_probs * t(_seq_major(w["log_probs"]))).sum()
                 + (values.flatten() * t(_seq_major(w["values"]))).sum()
                 + (entropy * t(_seq_major(w["entropy"]))).sum())
    policy_c.zero_grad()
    objective.backward()
    theirs = {"log_probs": _time_major(log_probs.detach().numpy()),
              "values": _time_major(values.detach().numpy().ravel()),
              "entropy": _time_major(entropy.detach().numpy())}
    g_theirs = grads_from_contrib(policy_c, net_arch, shared_lstm)
    return ev, grads, theirs, g_theirs


def run() -> list:
    rows = []
    for net_arch in ((64,), ()):
        case = f"MlpLstmPolicy net_arch={list(net_arch)}"
        ev, grads, theirs, g_theirs = run_case(net_arch, shared_lstm=False)
        rows.append(compare(case, "log_probs", ev["log_probs"], theirs["log_probs"], 1e-10,
                            f"[T={T}, N={N}], resets at t=0 and mid-sequence, stored states"))
        rows.append(compare(case, "values", ev["values"], theirs["values"], 1e-10, "float64"))
        rows.append(compare(case, "entropy", ev["entropy"], theirs["entropy"], 1e-10,
                            "float64"))
        err = max(float(np.max(np.abs(grads[k] - g_theirs[k]))) for k in g_theirs)
        rows.append(Row(case, "all parameter gradients", err, 1e-9, err <= 1e-9,
                        f"BPTT vs torch autograd over {len(g_theirs)} arrays"))
    case = "MlpLstmPolicy shared_lstm=True, net_arch=[64]"
    ev, grads, theirs, g_theirs = run_case((64,), shared_lstm=True)
    rows.append(compare(case, "log_probs + values", np.stack([ev["log_probs"], ev["values"]]),
                        np.stack([theirs["log_probs"], theirs["values"]]), 1e-10,
                        "forward agrees"))
    towers = [k for k in g_theirs if not k.startswith("lstm")]
    err_towers = max(float(np.max(np.abs(grads[k] - g_theirs[k]))) for k in towers)
    rows.append(Row(case, "tower gradients", err_towers, 1e-9, err_towers <= 1e-9, "agree"))
    lstm_keys = ["lstm.w_ih", "lstm.w_hh", "lstm.b"]
    rows.append(expect_difference(
        case, "shared LSTM gradients", np.concatenate([grads[k].ravel() for k in lstm_keys]),
        np.concatenate([g_theirs[k].ravel() for k in lstm_keys]), 1e-6,
        "sb3-contrib detaches the critic input (latent_pi.detach()); ppo_ref sums both towers"))
    return rows


def main() -> list:
    rows = run()
    print_table("Recurrent policy: ppo_ref RecurrentPolicy vs sb3-contrib MlpLstmPolicy", rows)
    return rows


if __name__ == "__main__":
    main()
