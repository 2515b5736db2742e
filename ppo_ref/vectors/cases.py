"""The golden-vector cases, ppo_ref's outputs for them (:func:`compute_outputs`) and the writer.

The cases (docs/specification.md section in brackets): episode starts [1]; GAE in the reference,
CleanRL and thrust-rl conventions and V-trace [2]; the categorical distribution, Adam, global-norm
clipping and the LSTM with their gradients [3]; each loss with its gradient [4]; one PPO minibatch
update of a tiny MLP actor-critic [4, 5]; edge cases (both flags on one step, gamma or lambda 0,
a long rollout, per-step discounts, exact clip kinks, the library options).
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np
from gymnasium import spaces

from ppo_ref.config import CONVENTION_FIELDS, PRESETS, PPOConfig
from ppo_ref.io.checkpoint import write_atomic
from ppo_ref.spec.networks import actor_critic_init
from ppo_ref.spec.optim import adam_init
from ppo_ref.spec.update import Minibatch, aggregation_weights, run_epochs, truncation_weights
from ppo_ref.tiers import BACKENDS, tier_for
from ppo_ref.train.policies import MLPPolicy
from ppo_ref.vectors.codec import (DEFAULT_TOLERANCE, FORMAT, decode, decode_settings,
                                   dumps, encode)

__all__ = ["SEED", "BACKENDS", "KINDS", "OPTION_KEYS", "compute_outputs", "apply_preset",
           "write_vectors", "case_table"]

SEED = 20261129
#: The options that say how the advantage kernels read the truncation flags.
_TRUNCATION_OPTIONS = ("truncation", "bootstrap_terminal_last_row")


def _episode_starts(inputs, settings, tier):
    return {"episode_starts": tier.masks.episode_starts(
        inputs["terminated"], inputs["truncated"], inputs["initial"])}


def _truncation(options: Mapping[str, Any]) -> dict:
    """The truncation options of case settings or of a preset (:data:`ppo_ref.config.PRESETS`)."""
    return {k: options[k] for k in _TRUNCATION_OPTIONS}


def _per_step(value):
    """A scalar or per-step setting (``gamma``, ``gae_lambda``, ``lambda_``) as the kernels
    take it: a list becomes a float64 array."""
    return np.asarray(value, dtype=np.float64) if isinstance(value, (list, tuple)) else value


def _gae(inputs, settings, tier):
    adv, ret = tier.advantages.gae(
        inputs["rewards"], inputs["values"], inputs["terminated"], inputs["truncated"],
        inputs["last_values"], inputs.get("final_values"), gamma=_per_step(settings["gamma"]),
        gae_lambda=_per_step(settings["gae_lambda"]), **_truncation(settings))
    return {"advantages": adv, "returns": ret}


def _vtrace(inputs, settings, tier):
    out = tier.advantages.vtrace(
        inputs["behaviour_log_probs"], inputs["target_log_probs"], inputs["rewards"],
        inputs["values"], inputs["terminated"], inputs["truncated"], inputs["last_values"],
        inputs.get("final_values"), gamma=_per_step(settings["gamma"]),
        rho_bar=settings["rho_bar"], c_bar=settings["c_bar"], pg_rho_bar=settings["pg_rho_bar"],
        lambda_=_per_step(settings["lambda_"]), **_truncation(settings))
    return {"vs": out.vs, "pg_advantages": out.pg_advantages}


def _categorical(inputs, settings, tier):
    d = tier.distributions
    logits, actions = inputs["logits"], inputs["actions"]
    return {"log_softmax": d.log_softmax(logits), "entropy": d.categorical_entropy(logits),
            "log_probs": d.categorical_log_prob(logits, actions),
            "d_logits_from_log_probs": d.categorical_log_prob_backward(
                logits, actions, inputs["d_log_probs"]),
            "d_logits_from_entropy": d.categorical_entropy_backward(logits, inputs["d_entropy"])}


def _aggregation(inputs, settings, first: str):
    """``(weights, factor)`` of the case's ``aggregation`` setting (default token-mean) with its
    optional inputs ``weights``, ``sequences`` (:func:`ppo_ref.spec.update.aggregation_weights`)."""
    return aggregation_weights(settings.get("aggregation", "token-mean"), np.size(inputs[first]),
                               inputs.get("weights"), inputs.get("sequences"),
                               settings.get("aggregation_norm"))


def _policy_loss(inputs, settings, tier):
    weights, factor = _aggregation(inputs, settings, "new_log_probs")
    loss, grad, info = tier.losses.policy_loss(
        inputs["new_log_probs"], inputs["old_log_probs"], inputs["advantages"],
        settings["clip_range"], clip_range_low=settings.get("clip_range_low"),
        clip_range_high=settings.get("clip_range_high"), dual_clip=settings.get("dual_clip"),
        clip_interval=settings.get("clip_interval", "symmetric"), weights=weights,
        clip_fraction_mode=settings.get("clip_fraction_mode", "outside"))
    estimator = settings.get("kl_estimator", "k3")
    kl = info["approx_kl"] if estimator == "k3" else tier.losses.approx_kl(
        inputs["old_log_probs"], inputs["new_log_probs"], estimator, weights=weights)
    return {"loss": factor * loss, "d_new_log_probs": factor * grad,
            "clip_fraction": info["clip_fraction"], "approx_kl": kl}


def _value_loss(inputs, settings, tier):
    weights, factor = _aggregation(inputs, settings, "values")
    loss, grad = tier.losses.value_loss(
        inputs["values"], inputs["old_values"], inputs["returns"], settings["clip_range_vf"],
        mode=settings["mode"], huber_delta=settings.get("huber_delta", 1.0), weights=weights,
        boundary_grad=settings.get("boundary_grad", 1.0))
    scale = factor * float(settings.get("scale", 1.0))
    return {"loss": scale * loss, "d_values": scale * grad}


def _entropy_loss(inputs, settings, tier):
    loss, grad = tier.losses.entropy_loss(inputs["entropy"])
    return {"loss": loss, "d_entropy": grad}


def _normalize_advantages(inputs, settings, tier):
    return {"normalized": tier.losses.normalize_advantages(
        inputs["advantages"], ddof=settings["ddof"], eps=settings.get("eps", 1e-8),
        placement=settings.get("placement", "add"),
        single_element=settings.get("single_element", "unchanged"))}


def _approx_kl(inputs, settings, tier):
    return {"approx_kl": tier.losses.approx_kl(inputs["old_log_probs"], inputs["new_log_probs"],
                                               estimator=settings["estimator"])}


def _adam(inputs, settings, tier):
    params = dict(inputs["params"])
    state = adam_init(params)
    out = {}
    for step in sorted(inputs["grads"], key=int):
        params, state = tier.optim.adam_update(params, inputs["grads"][step], state,
                                               lr=settings["lr"], betas=tuple(settings["betas"]),
                                               eps=settings["eps"])
        out[step] = dict(params)
    return {"params_after_step": out}


def _clip(inputs, settings, tier):
    grads, norm = tier.optim.clip_by_global_norm(inputs["grads"], settings["max_norm"])
    return {"grads": dict(grads), "norm": norm}


def _lstm(inputs, settings, tier):
    h_seq, (h_T, c_T), cache = tier.lstm.lstm_forward(
        inputs["params"], inputs["x"], inputs["h0"], inputs["c0"], inputs["episode_starts"])
    dx, grads, (dh0, dc0) = tier.lstm.lstm_backward(inputs["params"], cache, inputs["dh_seq"],
                                                    inputs["dh_T"], inputs["dc_T"])
    return {"h_seq": h_seq, "h_T": h_T, "c_T": c_T, "dx": dx, "grads": dict(grads),
            "dh0": dh0, "dc0": dc0}


def _ppo_minibatch_update(inputs, settings, tier):
    """One epoch of one minibatch: :func:`ppo_ref.spec.update.run_epochs` with the tier's
    policy, losses and optimizer."""
    config = PPOConfig.from_dict(settings["config"]).replace(backend=tier.name)
    obs = inputs["observations"]
    policy = MLPPolicy(spaces.Box(-np.inf, np.inf, (obs.shape[1],), np.float64),
                       spaces.Discrete(settings["n_actions"]), config, tier)
    params = dict(inputs["params"])
    seen = {}

    def evaluate(p, data):
        out = policy.evaluate(p, data)  # (log_probs, entropy, values, cache)
        for key, value in zip(("log_probs", "entropy", "values"), out):
            seen.setdefault(key, value)
        return out

    def backward(p, cache, d_log_probs, d_entropy, d_values):
        grads = policy.backward(p, cache, d_log_probs, d_entropy, d_values)
        seen.setdefault("grads", {k: np.array(v) for k, v in grads.items()})
        return grads

    weights = inputs.get("weights")
    if "truncated" in inputs:
        weights = truncation_weights(inputs["terminated"], inputs["truncated"],
                                     config.drop_truncated_steps)
    mb = Minibatch(inputs["old_log_probs"], inputs["advantages"], inputs["returns"],
                   inputs["old_values"], (obs, inputs["actions"]), weights, inputs.get("sequences"))
    new_params, _, stats = run_epochs(
        params, adam_init(params), config=config, lr=settings["learning_rate"],
        clip_range=settings["clip_range"], minibatches=lambda epoch: [mb], evaluate=evaluate,
        backward=backward, losses=tier.losses, optim=tier.optim)
    return {"new_log_probs": seen["log_probs"], "entropy": seen["entropy"],
            "values": seen["values"], "loss": stats["loss"], "policy_loss": stats["policy_loss"],
            "value_loss": stats["value_loss"], "mean_entropy": stats["entropy"],
            "approx_kl": stats["approx_kl"], "clip_fraction": stats["clip_fraction"],
            "grads": seen["grads"], "grad_norm": stats["grad_norm"],
            "params_after": dict(new_params)}


#: Case kind -> the function computing its outputs ``(inputs, settings, tier) -> dict``.
KINDS: Dict[str, Callable] = {
    "episode_starts": _episode_starts, "gae": _gae, "vtrace": _vtrace, "categorical": _categorical,
    "policy_loss": _policy_loss, "value_loss": _value_loss, "entropy_loss": _entropy_loss,
    "normalize_advantages": _normalize_advantages, "approx_kl": _approx_kl, "adam": _adam,
    "clip_by_global_norm": _clip, "lstm": _lstm, "ppo_minibatch_update": _ppo_minibatch_update}

#: Case kind -> the ppo_ref function it documents (a case file's ``function``).
_FUNCTIONS = {
    "episode_starts": "ppo_ref.episode_starts", "gae": "ppo_ref.gae", "vtrace": "ppo_ref.vtrace",
    "categorical": "ppo_ref.spec.distributions (log_softmax, categorical_entropy, "
                   "categorical_log_prob and their backward)",
    "policy_loss": "ppo_ref.spec.losses.policy_loss (approx_kl: ppo_ref.spec.losses.approx_kl "
                   "with settings.kl_estimator, default k3)",
    **{kind: f"ppo_ref.spec.losses.{kind}"
       for kind in ("value_loss", "entropy_loss", "normalize_advantages", "approx_kl")},
    "adam": "ppo_ref.spec.optim.adam_init + adam_update (one call per step)",
    "clip_by_global_norm": "ppo_ref.spec.optim.clip_by_global_norm",
    "lstm": "ppo_ref.spec.lstm.lstm_forward + lstm_backward",
    "ppo_minibatch_update": "ppo_ref.spec.update.run_epochs (1 epoch, 1 minibatch) with "
                            "ppo_ref.train.policies.MLPPolicy",
}


def compute_outputs(case: Mapping, backend: str = "spec") -> Dict[str, Any]:
    """ppo_ref's outputs ``{name: array or dict}`` for a decoded case, computed by the tier of
    ``backend`` (a value of ``PPOConfig.backend``, :func:`ppo_ref.tiers.tier_for`; by default
    the spec tier, as every function of this module). ``ValueError``: an unknown kind or backend."""
    kind = case["kind"]
    if kind not in KINDS:
        raise ValueError(f"case kind must be one of {sorted(KINDS)}, got {kind!r}")
    return KINDS[kind](case["inputs"], case["settings"], tier_for(backend))


def _case(name, kind, preset, description, inputs, settings, tolerance=None):
    return {"format": FORMAT, "name": name, "kind": kind, "function": _FUNCTIONS[kind],
            "preset": preset, "description": description, "inputs": inputs,
            "settings": settings, "tolerance": dict(tolerance or DEFAULT_TOLERANCE)}


def _rollout(rng, T, N):
    terminated, truncated = rng.random((T, N)) < 0.15, rng.random((T, N)) < 0.15
    terminated[-1, 0] = True           # a terminal on the last row (thrust-rl differs there)
    truncated[T // 2, -1] = True       # a truncation mid-rollout
    terminated[T // 2, -1] = False
    return {"rewards": rng.normal(size=(T, N)).round(6), "values": rng.normal(size=(T, N)).round(6),
            "terminated": terminated, "truncated": truncated,
            "last_values": rng.normal(size=N).round(6),
            "final_values": np.where(truncated, rng.normal(size=(T, N)).round(6), 0.0)}


def _build_cases(rng: np.random.Generator) -> List[dict]:
    cases = []
    T, N = 8, 3
    term, trunc = rng.random((T, N)) < 0.2, rng.random((T, N)) < 0.2
    cases.append(_case(
        "episode_starts", "episode_starts", "reference",
        "episode_starts[t] = terminated[t-1] or truncated[t-1]; [0] = initial",
        {"terminated": term, "truncated": trunc, "initial": np.array([True, False, True])}, {}))

    roll = _rollout(rng, T, N)
    for preset, desc in (("reference",
                          "reference: bootstrap V(final_obs) on truncation, cut the trace"),
                         ("cleanrl", "CleanRL: truncation treated as termination"),
                         ("thrust", "thrust-rl: truncated ignored; terminal last row bootstraps")):
        cases.append(_case(f"gae_{preset}", "gae", preset, desc, roll,
                           {"gamma": 0.99, "gae_lambda": 0.95, **_truncation(PRESETS[preset])}))
    single = _rollout(rng, 6, 1)
    single = {k: (v[:, 0] if np.ndim(v) == 2 else v[0]) for k, v in single.items()}
    cases.append(_case("gae_single_env", "gae", "reference",
                       "one env as [T] arrays with a scalar last_values", single,
                       {"gamma": 0.9, "gae_lambda": 0.8, **_truncation(PRESETS["reference"])}))

    vt = {**roll, "behaviour_log_probs": (-rng.exponential(1.0, (T, N))).round(6),
          "target_log_probs": (-rng.exponential(1.0, (T, N))).round(6)}
    cases.append(_case("vtrace_reference", "vtrace", "reference",
                       "IMPALA V-trace with truncation bootstrap, lambda_ 0.9, distinct bars", vt,
                       {"gamma": 0.97, "rho_bar": 1.0, "c_bar": 0.9, "pg_rho_bar": 1.5,
                        "lambda_": 0.9, **_truncation(PRESETS["reference"])}))
    cases.append(_case("vtrace_thrust", "vtrace", "thrust",
                       "thrust-rl conventions (no lambda, pg weight = rho)", vt,
                       {"gamma": 0.97, "rho_bar": 1.0, "c_bar": 1.0, "pg_rho_bar": None,
                        "lambda_": 1.0, **_truncation(PRESETS["thrust"])}))

    logits = (rng.normal(size=(5, 4)) * 3.0).round(6)
    logits[1, 2] = -np.inf                     # a masked action
    actions = np.array([0, 3, 1, 2, 3])
    cases.append(_case(
        "categorical", "categorical", "reference", "log-softmax (max-shifted), entropy, "
        "log-probs and both gradients; row 1 has a masked action (-inf logit)",
        {"logits": logits, "actions": actions, "d_log_probs": rng.normal(size=5).round(6),
         "d_entropy": rng.normal(size=5).round(6)}, {}))

    B = 10
    old = (-rng.exponential(1.0, B)).round(6)
    new = (old + rng.normal(scale=0.3, size=B)).round(6)
    adv = rng.normal(size=B).round(6)
    cases.append(_case("policy_loss", "policy_loss", "reference",
                       "clipped surrogate; some ratios outside [0.8, 1.2]",
                       {"new_log_probs": new, "old_log_probs": old, "advantages": adv},
                       {"clip_range": 0.2}))
    values = rng.normal(size=B).round(6)
    old_values = (values + rng.normal(scale=0.4, size=B)).round(6)
    returns = rng.normal(size=B).round(6)
    vinputs = {"values": values, "old_values": old_values, "returns": returns}
    for suffix, clip, mode, preset in (("unclipped", None, "max", "reference"),
                                       ("clipped_max", 0.2, "max", "cleanrl"),
                                       ("clipped_sb3", 0.2, "sb3", "sb3")):
        cases.append(_case(f"value_loss_{suffix}", "value_loss", preset,
                           "value loss without the 0.5 factor (scale with vf_coef)", vinputs,
                           {"clip_range_vf": clip, "mode": mode}))
    cases.append(_case("entropy_loss", "entropy_loss", "reference", "-mean(entropy)",
                       {"entropy": rng.uniform(0.1, 1.4, B).round(6)}, {}))
    for ddof, preset in ((1, "reference"), (0, "thrust")):
        cases.append(_case(f"normalize_advantages_ddof{ddof}", "normalize_advantages", preset,
                           "(A - mean) / (std(ddof) + 1e-8)", {"advantages": adv}, {"ddof": ddof}))
    for est, preset in (("k3", "reference"), ("k1", "thrust")):
        cases.append(_case(f"approx_kl_{est}", "approx_kl", preset, "KL(old || new) estimator",
                           {"old_log_probs": old, "new_log_probs": new}, {"estimator": est}))

    params = {"w": rng.normal(size=(3, 2)).round(6), "b": rng.normal(size=3).round(6)}
    grads = {str(s): {"w": rng.normal(size=(3, 2)).round(6), "b": rng.normal(size=3).round(6)}
             for s in (1, 2, 3)}
    cases.append(_case("adam", "adam", "reference",
                       "three torch.optim.Adam steps from a fresh state (bias correction, eps "
                       "after sqrt(v_hat))", {"params": params, "grads": grads},
                       {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-5}))
    for suffix, max_norm in (("active", 0.5), ("inactive", 100.0)):
        cases.append(_case(f"clip_by_global_norm_{suffix}", "clip_by_global_norm", "reference",
                           "one L2 norm over all arrays; scale max_norm/(norm+1e-6) only if < 1",
                           {"grads": grads["1"]}, {"max_norm": max_norm}))

    T, N, D, H = 5, 2, 3, 4
    lstm_params = {"w_ih": (rng.normal(size=(4 * H, D)) * 0.5).round(6),
                   "w_hh": (rng.normal(size=(4 * H, H)) * 0.5).round(6),
                   "b": (rng.normal(size=4 * H) * 0.1).round(6)}
    starts = np.zeros((T, N), dtype=bool)
    starts[0, 1] = starts[3, 0] = True
    cases.append(_case(
        "lstm_resets", "lstm", "reference", "torch gate order (i, f, g, o), b = b_ih + b_hh; "
        "state zeroed where episode_starts; BPTT with dh_seq, dh_T, dc_T",
        {"params": lstm_params, "x": rng.normal(size=(T, N, D)).round(6),
         "h0": rng.normal(size=(N, H)).round(6), "c0": rng.normal(size=(N, H)).round(6),
         "episode_starts": starts, "dh_seq": rng.normal(size=(T, N, H)).round(6),
         "dh_T": rng.normal(size=(N, H)).round(6), "dc_T": rng.normal(size=(N, H)).round(6)}, {}))

    step = ("one PPO minibatch step: evaluate, loss (per-minibatch advantage normalization), "
            "backward, global-norm clip, one Adam step from a fresh state; params: pi.w0 [4,3], "
            "pi.b0, pi.w1 [2,4], pi.b1, vf.w0, vf.b0, vf.w1 [1,4], vf.b1 (y = x @ w.T + b, tanh)")
    cases.extend(_ppo_cases(rng, [(p, p, {}, {}, step) for p in ("reference", "cleanrl")]))
    return cases


def _edge_cases(rng: np.random.Generator) -> List[dict]:
    """The cases that catch logic bugs (module docstring); ``final_values`` holds non-zero junk
    wherever the reference does not read it, so code that reads it there fails."""
    cases = []
    ref = _truncation(PRESETS["reference"])
    # the minimal both-flags input (skrl, Sample Factory, torchrl auto_reset_env bootstrap it:
    # skrl gives advantages [1, 0], the reference [0, 0]) next to a both-flags step mid-rollout
    # and on the last row
    both = {"rewards": np.array([[0.0, 0.5], [0.0, -1.0], [1.0, 0.25]]),
            "values": np.array([[1.0, 0.5], [0.0, 2.0], [0.75, -0.5]]),
            "terminated": np.array([[True, False], [False, True], [False, True]]),
            "truncated": np.array([[True, False], [False, True], [True, True]]),
            "last_values": np.array([3.0, -2.0]),
            "final_values": np.array([[2.0, 9.0], [7.0, 4.0], [1.5, 6.0]])}
    for preset in ("reference", "cleanrl", "thrust"):
        cases.append(_case(f"gae_both_flags_{preset}", "gae", preset,
                           "steps terminated and truncated at once (termination wins: no "
                           "bootstrap); final_values junk where not read", both,
                           {"gamma": 0.5, "gae_lambda": 0.9, **_truncation(PRESETS[preset])}))
    roll = _rollout(rng, 6, 3)
    roll["terminated"][1, 1] = roll["truncated"][1, 1] = True    # both flags mid-rollout
    roll["final_values"] = np.where(roll["final_values"] == 0.0,
                                    rng.normal(size=(6, 3)).round(6) + 3.0, roll["final_values"])
    for name, gamma, lam in (("gamma0", 0.0, 0.95), ("lambda0", 0.99, 0.0),
                             ("gamma1_lambda1", 1.0, 1.0)):
        cases.append(_case(f"gae_{name}", "gae", "reference",
                           f"gamma={gamma}, gae_lambda={lam} (one-step TD or Monte Carlo "
                           "edges); final_values junk where not read", roll,
                           {"gamma": gamma, "gae_lambda": lam, **ref}))
    cases.append(_case("gae_per_step", "gae", "rlax",
                       "per-step discounts and lambdas ([T, N] gamma, [T] gae_lambda: rlax "
                       "discount_t / lambda_)", roll,
                       {"gamma": rng.choice([0.0, 0.5, 0.9, 1.0], (6, 3)),
                        "gae_lambda": rng.choice([0.0, 0.8, 1.0], 6), **ref}))
    long = _rollout(rng, 2000, 2)
    long["terminated"] &= rng.random((2000, 2)) < 0.05          # long episodes
    long["truncated"] &= rng.random((2000, 2)) < 0.05
    cases.append(_case("gae_long", "gae", "reference",
                       "T = 2000: a long accumulation (gamma 0.999, lambda 0.99)", long,
                       {"gamma": 0.999, "gae_lambda": 0.99, **ref},
                       tolerance={"atol": 1e-9, "rtol": 1e-9}))
    vt = {**roll, "behaviour_log_probs": (-rng.exponential(1.0, (6, 3))).round(6),
          "target_log_probs": (-rng.exponential(1.0, (6, 3))).round(6)}
    for name, gamma, lam in (("both_flags", 0.9, 0.9), ("gamma0", 0.0, 1.0),
                             ("lambda0", 0.95, 0.0)):
        cases.append(_case(f"vtrace_{name}", "vtrace", "reference",
                           "V-trace edges (both flags on a step, gamma 0, lambda 0)", vt,
                           {"gamma": gamma, "rho_bar": 1.0, "c_bar": 0.9, "pg_rho_bar": 1.2,
                            "lambda_": lam, **ref}))
    cases.append(_case("vtrace_per_step", "vtrace", "rlax",
                       "per-step discounts and lambdas, c_bar = 1 (rlax has no c_bar)", vt,
                       {"gamma": rng.choice([0.0, 0.9, 1.0], 6).tolist(), "rho_bar": 1.0,
                        "c_bar": 1.0, "pg_rho_bar": 1.0,
                        "lambda_": rng.choice([0.5, 1.0], (6, 3)).tolist(), **ref}))
    # ratios exactly on 1 +- eps (exp(new - old) == 1 +- eps in float64), both signs of A
    old = np.array([-1.0, -0.5, -2.0, -1.0, -0.75, -1.25])
    new = old + np.log(np.array([1.25, 0.75, 1.25, 0.75, 1.0, 2.0]))
    ratio = np.exp(new - old)
    eps = 0.25
    assert np.sum((ratio == 1.0 + eps) | (ratio == 1.0 - eps)) >= 2
    adv = np.array([1.0, -1.0, -0.5, 0.5, 2.0, -1.5])
    kink = {"new_log_probs": new, "old_log_probs": old, "advantages": adv}
    cases.append(_case("policy_loss_kinks", "policy_loss", "reference",
                       "ratios exactly at 1 +- clip_range (the clamp passes the gradient at its "
                       "bounds) and one at 2", kink, {"clip_range": eps}))
    for name, extra, preset in (
            ("reciprocal", {"clip_interval": "reciprocal"}, "sample_factory"),
            ("asymmetric", {"clip_range_low": 0.1, "clip_range_high": 0.3}, "torchrl"),
            ("dual_clip", {"dual_clip": 1.5}, "tianshou")):
        cases.append(_case(f"policy_loss_{name}", "policy_loss", preset,
                           f"clipped surrogate with {extra}", kink, {"clip_range": eps, **extra}))
    mask = {**kink, "weights": np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])}
    cases.append(_case("policy_loss_valid_mask", "policy_loss", "sample_factory",
                       "a 0/1 valid mask: means over the valid rows only", mask,
                       {"clip_range": eps}))
    values = rng.normal(size=8).round(6) * 2
    vinputs = {"values": values, "old_values": (values + rng.normal(scale=0.6, size=8)).round(6),
               "returns": rng.normal(size=8).round(6) * 2}
    for name, clip in (("huber", None), ("huber_clipped", 0.3)):
        cases.append(_case(f"value_loss_{name}", "value_loss", "torchrl",
                           "Huber value loss, delta 1 (torchrl smooth_l1), max form when clipped",
                           vinputs, {"clip_range_vf": clip, "mode": "huber", "huber_delta": 1.0}))
    cases.append(_case("value_loss_valid_mask", "value_loss", "sample_factory",
                       "clipped max form over the valid rows only",
                       {**vinputs, "weights": np.array([1.0, 1, 0, 1, 0, 0, 1, 1])},
                       {"clip_range_vf": 1.0, "mode": "max"}))
    spread = {"advantages": np.array([0.0, 1e-7, -1e-7, 2e-7, 0.0, -3e-7])}
    for name, ddof, eps_n, placement, preset in (("clamp_1e-6", 1, 1e-6, "clamp", "torchrl"),
                                                 ("clamp_1e-7", 1, 1e-7, "clamp", "sample_factory"),
                                                 ("add_1e-8", 1, 1e-8, "add", "reference")):
        cases.append(_case(f"normalize_advantages_{name}", "normalize_advantages", preset,
                           "a spread of 1e-7: where the eps and its placement show", spread,
                           {"ddof": ddof, "eps": eps_n, "placement": placement}))
    return cases


def _convention_cases(rng: np.random.Generator) -> List[dict]:
    """One case per convention option value no earlier case pins down: the k2 KL estimator,
    the clip-fraction counts, the sqrt eps placement, the one-element normalizations, the
    value-clip subgradient at the exact bound, the loss aggregations and dropped truncated
    steps (:data:`OPTION_KEYS`; a preset of ``"-"``: no preset uses that value)."""
    cases = []
    B = 10
    old = (-rng.exponential(1.0, B)).round(6)
    new = (old + rng.normal(scale=0.4, size=B)).round(6)
    adv = rng.normal(size=B).round(6)
    ratio = np.exp(new - old)
    outside = (ratio < 0.8) | (ratio > 1.2)
    active = ((adv > 0) & (ratio > 1.2)) | ((adv < 0) & (ratio < 0.8))
    assert np.sum(outside & ~active) >= 1 and np.sum(active) >= 1
    pol = {"new_log_probs": new, "old_log_probs": old, "advantages": adv}
    cases.append(_case("approx_kl_k2", "approx_kl", "-", "k2 = mean(r^2 / 2), r = new - old",
                       {"old_log_probs": old, "new_log_probs": new}, {"estimator": "k2"}))
    cases.append(_case("policy_loss_kl_k2", "policy_loss", "-",
                       "clipped surrogate with approx_kl by the k2 estimator", pol,
                       {"clip_range": 0.2, "kl_estimator": "k2"}))
    for mode, preset, what in (("outside", "reference", "the ratio outside [0.8, 1.2]"),
                               ("active", "-", "where the clip changes the term (verl)")):
        cases.append(_case(f"policy_loss_clip_fraction_{mode}", "policy_loss", preset,
                           f"clip_fraction counts {what}; ratios outside the interval on the "
                           "unclipped side of min(...) make the two counts differ", pol,
                           {"clip_range": 0.2, "clip_fraction_mode": mode}))
    spread = {"advantages": np.array([0.0, 1e-7, -1e-7, 2e-7, 0.0, -3e-7])}
    plain = {"advantages": rng.normal(size=8).round(6)}
    for name, inputs in (("sqrt_1e-8", spread), ("sqrt", plain)):
        cases.append(_case(f"normalize_advantages_{name}", "normalize_advantages", "-",
                           "(A - mean) / sqrt(var + 1e-8), var with ddof 1 (TRL's and verl's "
                           "masked_whiten)", inputs, {"ddof": 1, "eps": 1e-8, "placement": "sqrt"}))
    for result, preset, ddof in (("unchanged", "reference", 1), ("zero", "purejaxrl", 0),
                                 ("NaN", "cleanrl", 1)):
        cases.append(_case(f"normalize_advantages_single_{result}", "normalize_advantages",
                           preset, f"one element normalizes to: {result}",
                           {"advantages": np.array([1.5])},
                           {"ddof": ddof, "single_element": result}))
    # dyadic numbers: V - V_old == +-c exactly, V_old + clip(V - V_old) == V; rows 0-3 on the
    # bound (both signs, with and without a larger clipped term elsewhere), 4 inside, 5 outside
    # with the clipped term larger, 6 outside with the unclipped term larger, 7 a mirror tie
    c = 0.25
    old_v = np.array([0.5, -1.0, 2.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    values = old_v + np.array([c, -c, c, -c, 0.125, 0.5, 0.5, 0.5])
    returns = np.array([0.0, 1.0, -2.0, 3.0, 0.5, 0.75, -1.0, 0.375])
    vinputs = {"values": values, "old_values": old_v, "returns": returns}
    for grad, preset in ((1.0, "reference"), (0.75, "purejaxrl"), (0.5, "-"), (0.0, "-")):
        cases.append(_case(f"value_loss_boundary_grad_{grad:g}", "value_loss", preset,
                           f"clipped max form; where |V - V_old| == clip_range_vf exactly the "
                           f"gradient is {grad:g} x the unclipped one", vinputs,
                           {"clip_range_vf": c, "mode": "max", "boundary_grad": grad}))
    seq = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 2])
    mask = np.array([1.0, 1, 1, 1, 1, 1, 1, 1, 1, 0])
    rows = {**pol, "weights": mask, "sequences": seq}
    for mode, extra in (("seq-mean-token-mean", {}), ("token-sum", {}), ("seq-mean-token-sum", {}),
                        ("seq-mean-token-sum-norm", {"aggregation_norm": 8.0})):
        cases.append(_case(f"policy_loss_aggregation_{mode}", "policy_loss", "-",
                           f"a 0/1 mask and three sequences (4, 2, 3 valid rows), loss "
                           f"aggregation {mode}", rows,
                           {"clip_range": 0.2, "aggregation": mode, **extra}))
    cases.append(_case("value_loss_aggregation_seq-mean-token-mean", "value_loss", "-",
                       "the mean over sequences of each sequence's masked mean",
                       {**vinputs, "weights": mask[:8], "sequences": seq[:8]},
                       {"clip_range_vf": c, "mode": "max", "aggregation": "seq-mean-token-mean"}))
    step = "one PPO minibatch step as ppo_minibatch_update_reference; "
    cases.extend(_ppo_cases(rng, [
        ("seq_mean_token_sum", "-", {"sequences": np.array([0, 0, 0, 1, 1, 2])},
         {"loss_aggregation": "seq-mean-token-sum"},
         step + "loss aggregation seq-mean-token-sum over sequences of 3, 2 and 1 rows"),
        ("drop_truncated", "-", {"terminated": np.array([False, True, False, True, False, False]),
                                 "truncated": np.array([False, False, True, True, False, True])},
         {"drop_truncated_steps": True},
         step + "rows 2 and 5 truncated without terminating (dropped: weight 0), row 3 both "
         "(kept)")]))
    return cases


def _ppo_cases(rng, variants) -> List[dict]:
    """One-minibatch updates of a tiny MLP actor-critic (B = 6 rows, obs_dim 3, net_arch (4,),
    2 actions), one per ``(name, preset, extra inputs, config fields, description)`` (a preset
    of ``"-"``: the reference preset's config with those fields)."""
    B, obs_dim, n_actions = 6, 3, 2
    params = actor_critic_init(rng, obs_dim, n_actions, net_arch=(4,), policy_gain=1.0)
    inputs = {"params": {k: v.round(6) for k, v in params.items()},
              "observations": rng.normal(size=(B, obs_dim)).round(6),
              "actions": rng.integers(0, n_actions, B),
              "old_log_probs": (-rng.uniform(0.4, 1.0, B)).round(6),
              "advantages": rng.normal(size=B).round(6), "returns": rng.normal(size=B).round(6),
              "old_values": rng.normal(size=B).round(6)}
    out = []
    for name, preset, extra_inputs, fields, description in variants:
        config = PPOConfig.preset("reference" if preset == "-" else preset, n_steps=B,
                                  batch_size=B, n_epochs=1, net_arch=(4,), ent_coef=0.01,
                                  learning_rate=0.01, **fields)
        settings = {"config": config.to_dict(), "n_actions": n_actions, "learning_rate": 0.01,
                    "clip_range": config.clip_range}
        out.append(_case(f"ppo_minibatch_update_{name}", "ppo_minibatch_update", preset,
                         description, {**inputs, **extra_inputs}, settings))
    return out


#: For each kind whose result depends on convention options: ``{option name of
#: ppo_ref.conventions.OPTIONS: settings key}``.
OPTION_KEYS: Dict[str, Dict[str, str]] = {
    "gae": {k: k for k in _TRUNCATION_OPTIONS}, "vtrace": {k: k for k in _TRUNCATION_OPTIONS},
    "value_loss": {"value_loss_mode": "mode", "value_loss_scale": "scale",
                   "value_clip_boundary_grad": "boundary_grad", "loss_aggregation": "aggregation"},
    "normalize_advantages": {"advantage_norm_ddof": "ddof", "advantage_norm_eps": "eps",
                             "advantage_norm_eps_placement": "placement",
                             "advantage_norm_single_element": "single_element"},
    "approx_kl": {"kl_estimator": "estimator"},
    "policy_loss": {"clip_interval": "clip_interval", "dual_clip": "dual_clip",
                    "kl_estimator": "kl_estimator", "clip_fraction_mode": "clip_fraction_mode",
                    "loss_aggregation": "aggregation"},
}


def apply_preset(case: dict, preset: str) -> dict:
    """``case`` (a new dict; inputs shared) with the settings of :data:`OPTION_KEYS` (and the
    value loss's ``huber_delta``, the policy loss's ``clip_range_low`` and ``clip_range_high``)
    taken from ``preset``; the minibatch update gets the whole preset config with the case's
    hyperparameters. Other kinds keep their settings. ``ValueError``: an unknown preset."""
    config = PPOConfig.preset(preset)
    settings = dict(case["settings"])
    kind = case["kind"]
    if kind == "ppo_minibatch_update":
        base = PPOConfig.from_dict(settings["config"])
        keep = {k: v for k, v in base.to_dict().items() if k not in CONVENTION_FIELDS}
        settings["config"] = PPOConfig.preset(preset, **{**keep, "net_arch": tuple(
            keep["net_arch"])}).to_dict()
    else:
        for option, key in OPTION_KEYS.get(kind, {}).items():
            if kind == "value_loss" and option == "value_loss_mode" and (
                    settings.get("clip_range_vf") is None and config.value_loss_mode != "huber"):
                continue  # without clipping "max" and "sb3" are one loss
            settings[key] = getattr(config, option)
        if kind == "value_loss":
            settings["huber_delta"] = config.huber_delta
        if kind == "policy_loss":  # the ratio interval is the preset's as a whole
            settings["clip_range_low"] = config.clip_range_low
            settings["clip_range_high"] = config.clip_range_high
    return {**case, "preset": preset, "settings": settings}


def _all_cases(seed: int) -> List[dict]:
    """Every case of :func:`write_vectors` (inputs and settings; no expected outputs yet)."""
    return (_build_cases(np.random.default_rng(seed))
            + _edge_cases(np.random.default_rng([seed, 1]))
            + _convention_cases(np.random.default_rng([seed, 2])))


def _settings_text(settings: Mapping[str, Any]) -> str:
    """A case's settings in one line: scalars as ``k=v``, arrays by their shape, a PPO config
    by the fields it sets otherwise than ``PPOConfig()``."""
    parts = []
    for key, value in settings.items():
        if key == "config":
            default = PPOConfig().to_dict()
            parts.append("config: " + ", ".join(f"{k}={v!r}" for k, v in value.items()
                                                if default[k] != v) + ";")
        elif isinstance(value, np.ndarray) or (isinstance(value, (list, tuple))
                                               and key != "betas"):
            parts.append(f"{key}=<{'x'.join(map(str, np.shape(value)))} array>")
        else:
            parts.append(f"{key}={value!r}")
    return ", ".join(parts).replace(";,", ";") if parts else "-"


def case_table(seed: int = SEED) -> str:
    """The Markdown table of every case :func:`write_vectors` writes, in ``index.json``'s
    order, one row each: ``| case | kind | preset | settings | description |`` (a preset of
    ``-``: no preset uses the case's option values). validation/README.md holds this table; a
    test keeps the two equal."""
    lines = ["| case | kind | preset | settings | description |", "|---|---|---|---|---|"]
    for case in _all_cases(seed):
        cells = [f"`{case['name']}`", case["kind"], case["preset"],
                 _settings_text(case["settings"]), case["description"]]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def write_vectors(out_dir: str, *, seed: int = SEED, backend: str = "spec",
                  preset: Optional[str] = None,
                  settings: Optional[Mapping[str, Any]] = None) -> List[str]:
    """Write every case to ``out_dir/<name>.json`` (format in :mod:`ppo_ref.vectors`) and
    ``out_dir/index.json``; return the case names in order.

    Inputs come from ``np.random.default_rng(seed)``, rounded to 6 decimals; the expected
    outputs are computed by the ``backend`` tier from the *decoded* JSON inputs, so a reader
    gets exactly the numbers ppo_ref computes from what it reads. ``preset`` recomputes every
    convention-dependent case under that preset (:func:`apply_preset`); ``settings`` replaces
    those settings in every case that has them (``{"gamma": 0.9}``).

    Every case is computed before anything is written (a bad preset, backend or setting leaves
    ``out_dir`` as it was); each file is then replaced atomically
    (:func:`ppo_ref.io.checkpoint.write_atomic`), ``index.json`` last. ``ValueError``: an
    unknown preset or backend, a setting no case has."""
    cases = _all_cases(seed)
    if preset is not None:
        cases = [apply_preset(case, preset) for case in cases]
    known = {key for case in cases for key in case["settings"]}
    if set(settings or ()) - known:
        raise ValueError(f"settings: no case has {sorted(set(settings) - known)}; the cases' "
                         f"settings are {', '.join(sorted(known))}")
    files, index = [], []
    for case in cases:
        case["settings"] = {k: (settings or {}).get(k, v) for k, v in case["settings"].items()}
        encoded = {k: encode(v) if k in ("inputs", "settings") else v for k, v in case.items()}
        decoded = {**encoded, "inputs": decode(encoded["inputs"]),
                   "settings": decode_settings(encoded["settings"])}
        encoded["expected"] = encode(compute_outputs(decoded, backend))
        files.append((f"{case['name']}.json", dumps(encoded) + "\n"))
        index.append({"name": case["name"], "kind": case["kind"], "preset": case["preset"],
                      "file": f"{case['name']}.json"})
    files.append(("index.json", json.dumps({"format": FORMAT, "seed": seed, "cases": index},
                                           indent=1) + "\n"))
    for name, text in files:
        write_atomic(os.path.join(out_dir, name), text.encode("utf-8"))
    return [entry["name"] for entry in index]
