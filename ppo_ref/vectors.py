"""Golden vectors: ppo_ref's numbers as JSON, and a checker for another implementation's outputs.

``write_vectors(out_dir)`` writes one JSON file per case (plus ``index.json``): the inputs, the
settings (including the convention preset and every convention option that matters), and the
outputs ppo_ref computes from exactly those inputs. Another implementation (Rust, JAX, PyTorch,
...) reads each case, runs its own code on ``inputs`` with ``settings``, and writes a results
file; ``check_results(vectors_dir, results_file)`` compares it case by case and returns one row
per case with the largest error. The command line is ``ppo-ref vectors --out DIR`` and
``ppo-ref check DIR --results FILE`` (exit status 1 when a case fails or is missing).

File format (``FORMAT = "ppo_ref.vectors/1"``), one case per file ``<name>.json``::

    {"format": "ppo_ref.vectors/1", "name": "gae_reference", "kind": "gae",
     "function": "ppo_ref.gae", "preset": "reference", "description": "...",
     "inputs":   {"rewards": [[...], ...], "terminated": [[true, false], ...], ...},
     "settings": {"gamma": 0.99, "gae_lambda": 0.95, "truncation": "bootstrap", ...},
     "expected": {"advantages": [[...]], "returns": [[...]]},
     "tolerance": {"atol": 1e-10, "rtol": 1e-9}}

* Arrays are nested JSON lists, row-major, time-major ``[T, N, ...]`` as in docs/specification.md §1; bool
  arrays are lists of ``true``/``false``; integer arrays (actions) are JSON integers; floats are
  float64 written with Python's shortest round-trip repr. IEEE specials are the strings
  ``"inf"``, ``"-inf"``, ``"nan"`` (JSON has no literal for them).
* A dict of arrays (network parameters, gradients) is a JSON object of arrays; a sequence of
  such dicts (Adam's gradient per step) is an object keyed ``"1"``, ``"2"``, ...
* Scalars are JSON numbers. ``None`` is ``null``.

Results file (``RESULTS_FORMAT = "ppo_ref.results/1"``)::

    {"format": "ppo_ref.results/1", "implementation": "my-ppo 0.3",
     "cases": {"gae_reference": {"outputs": {"advantages": [[...]], "returns": [[...]]}}, ...}}

``outputs`` uses exactly the names, nesting and shapes of ``expected``. An output passes when
every element satisfies ``|got - expected| <= atol + rtol * |expected|`` (infinities must match
exactly); a case passes when all its expected outputs pass.

The cases cover (docs/specification.md section in brackets): episode starts [1]; GAE in the reference, CleanRL and
thrust-rl conventions [2]; V-trace with truncation, lambda and bars [2]; log-softmax, entropy,
log-probs with masked actions and their gradients [3]; each loss with its gradient [4]; Adam steps
and global-norm clipping [3]; the LSTM forward with resets and its gradients [3]; one full PPO
minibatch update of a tiny MLP actor-critic (reference and CleanRL presets) [4, 5].
"""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

__all__ = ["FORMAT", "RESULTS_FORMAT", "write_vectors", "load_case", "load_cases",
           "compute_outputs", "reference_results", "check_results", "format_table",
           "encode", "decode", "dumps", "add_cli_commands", "configure_vectors",
           "configure_check", "cli_vectors", "cli_check", "main", "read_json_file",
           "MAX_JSON_BYTES"]

#: The largest JSON file (case, index, results, run config) that is read: larger files, and
#: endless ones such as a device, are refused after reading at most this many bytes + 1.
MAX_JSON_BYTES = 64 * 2 ** 20
#: The deepest nesting of lists/objects accepted in such a file (cases need fewer than 10).
MAX_JSON_DEPTH = 64
#: JSON integers must have at most this many digits (every count and integer array fits).
MAX_JSON_INT_DIGITS = 19

FORMAT = "ppo_ref.vectors/1"
RESULTS_FORMAT = "ppo_ref.results/1"
DEFAULT_TOLERANCE = {"atol": 1e-10, "rtol": 1e-9}
SEED = 20261129


# ----------------------------------------------------------------------------------------------
# JSON encoding
# ----------------------------------------------------------------------------------------------

def _encode_float(x: float):
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(x)


def encode(value):
    """Python/NumPy value -> JSON-safe value (see the module docstring for the rules)."""
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not (value and isinstance(value[0], (int, float, bool, np.generic))):
        return [encode(v) for v in value]
    if isinstance(value, (np.ndarray, list, tuple, np.generic)):
        arr = np.asarray(value)
        if arr.dtype == np.bool_:
            return arr.tolist()
        if np.issubdtype(arr.dtype, np.integer):
            return arr.astype(np.int64).tolist()
        if np.issubdtype(arr.dtype, np.floating):
            flat = [_encode_float(float(x)) for x in arr.astype(np.float64).ravel()]
            if arr.ndim == 0:
                return flat[0]
            return np.array(flat, dtype=object).reshape(arr.shape).tolist()
        raise ValueError(f"cannot encode array of dtype {arr.dtype}")
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _encode_float(value)
    raise ValueError(f"cannot encode {type(value).__name__}")


_SPECIAL = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _is_numeric_leaf(x) -> bool:
    return isinstance(x, (int, float, bool)) or (isinstance(x, str) and x in _SPECIAL)


def _leaves(x):
    while isinstance(x, list) and x:
        x = x[0]
    return x


def decode(value):
    """JSON value -> NumPy: lists become arrays (bool, int64 or float64 by their leaves),
    objects become dicts, special-float strings become floats."""
    if isinstance(value, dict):
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        leaf = _leaves(value)
        if isinstance(leaf, list):       # empty innermost list
            return np.asarray(value, dtype=np.float64)
        if isinstance(leaf, bool):
            return np.asarray(value, dtype=np.bool_)
        if isinstance(leaf, int) and not _has_float(value):
            return np.asarray(value, dtype=np.int64)
        return np.asarray(_floats(value), dtype=np.float64)
    if isinstance(value, str) and value in _SPECIAL:
        return _SPECIAL[value]
    return value


def _has_float(value) -> bool:
    if isinstance(value, list):
        return any(_has_float(v) for v in value)
    return isinstance(value, float) or isinstance(value, str)


def _floats(value):
    if isinstance(value, list):
        return [_floats(v) for v in value]
    if isinstance(value, str):
        if value not in _SPECIAL:
            raise ValueError(f"unexpected string {value!r} in a numeric array")
        return _SPECIAL[value]
    return float(value)


# ----------------------------------------------------------------------------------------------
# The reference computation of every kind of case (inputs, settings -> outputs)
# ----------------------------------------------------------------------------------------------

def _episode_starts(inputs, settings, backend):
    from ppo_ref.kernels import episode_starts
    return {"episode_starts": episode_starts(inputs["terminated"], inputs["truncated"],
                                             inputs["initial"], backend=backend)}


def _kernel_options(settings):
    return {"truncation": settings["truncation"],
            "bootstrap_terminal_last_row": settings["bootstrap_terminal_last_row"]}


def _per_step(value):
    """A setting that may be a scalar or a per-step list (``gamma``, ``gae_lambda``,
    ``lambda_``): lists become float64 arrays."""
    return np.asarray(value, dtype=np.float64) if isinstance(value, (list, tuple)) else value


def _gae(inputs, settings, backend):
    from ppo_ref.kernels import gae
    adv, ret = gae(inputs["rewards"], inputs["values"], inputs["terminated"], inputs["truncated"],
                   inputs["last_values"], inputs.get("final_values"),
                   gamma=_per_step(settings["gamma"]),
                   gae_lambda=_per_step(settings["gae_lambda"]), backend=backend,
                   **_kernel_options(settings))
    return {"advantages": adv, "returns": ret}


def _vtrace(inputs, settings, backend):
    from ppo_ref.kernels import vtrace
    out = vtrace(inputs["behaviour_log_probs"], inputs["target_log_probs"], inputs["rewards"],
                 inputs["values"], inputs["terminated"], inputs["truncated"],
                 inputs["last_values"], inputs.get("final_values"),
                 gamma=_per_step(settings["gamma"]),
                 rho_bar=settings["rho_bar"], c_bar=settings["c_bar"],
                 pg_rho_bar=settings["pg_rho_bar"], lambda_=_per_step(settings["lambda_"]),
                 backend=backend, **_kernel_options(settings))
    return {"vs": out.vs, "pg_advantages": out.pg_advantages}


def _categorical(inputs, settings, backend):
    from ppo_ref.nn import distributions as d
    logits, actions = inputs["logits"], inputs["actions"]
    return {
        "log_softmax": d.log_softmax(logits),
        "entropy": d.categorical_entropy(logits),
        "log_probs": d.categorical_log_prob(logits, actions),
        "d_logits_from_log_probs": d.categorical_log_prob_backward(logits, actions,
                                                                   inputs["d_log_probs"]),
        "d_logits_from_entropy": d.categorical_entropy_backward(logits, inputs["d_entropy"]),
    }


def _policy_loss(inputs, settings, backend):
    from ppo_ref.losses import policy_loss
    loss, grad, info = policy_loss(inputs["new_log_probs"], inputs["old_log_probs"],
                                   inputs["advantages"], settings["clip_range"],
                                   clip_range_low=settings.get("clip_range_low"),
                                   clip_range_high=settings.get("clip_range_high"),
                                   clip_interval=settings.get("clip_interval", "symmetric"),
                                   dual_clip=settings.get("dual_clip"),
                                   weights=inputs.get("weights"))
    return {"loss": loss, "d_new_log_probs": grad, "clip_fraction": info["clip_fraction"],
            "approx_kl": info["approx_kl"]}


def _value_loss(inputs, settings, backend):
    from ppo_ref.losses import value_loss
    loss, grad = value_loss(inputs["values"], inputs["old_values"], inputs["returns"],
                            settings["clip_range_vf"], mode=settings["mode"],
                            huber_delta=settings.get("huber_delta", 1.0),
                            weights=inputs.get("weights"))
    scale = float(settings.get("scale", 1.0))
    return {"loss": scale * loss, "d_values": scale * grad}


def _entropy_loss(inputs, settings, backend):
    from ppo_ref.losses import entropy_loss
    loss, grad = entropy_loss(inputs["entropy"])
    return {"loss": loss, "d_entropy": grad}


def _normalize_advantages(inputs, settings, backend):
    from ppo_ref.losses import normalize_advantages
    return {"normalized": normalize_advantages(inputs["advantages"], ddof=settings["ddof"],
                                               eps=settings.get("eps", 1e-8),
                                               placement=settings.get("placement", "add"))}


def _approx_kl(inputs, settings, backend):
    from ppo_ref.losses import approx_kl
    return {"approx_kl": approx_kl(inputs["old_log_probs"], inputs["new_log_probs"],
                                   estimator=settings["estimator"])}


def _adam(inputs, settings, backend):
    from ppo_ref.optim import adam_init, adam_update
    params = dict(inputs["params"])
    state = adam_init(params)
    out = {}
    for step in sorted(inputs["grads"], key=int):
        params, state = adam_update(params, inputs["grads"][step], state, lr=settings["lr"],
                                    betas=tuple(settings["betas"]), eps=settings["eps"])
        out[step] = dict(params)
    return {"params_after_step": out}


def _clip(inputs, settings, backend):
    from ppo_ref.optim import clip_by_global_norm
    grads, norm = clip_by_global_norm(inputs["grads"], settings["max_norm"])
    return {"grads": dict(grads), "norm": norm}


def _lstm(inputs, settings, backend):
    from ppo_ref.fast import lstm as fast_lstm
    from ppo_ref.spec import lstm as spec_lstm
    lstm_forward, lstm_backward = ((fast_lstm.lstm_forward, fast_lstm.lstm_backward)
                                   if backend == "fast" else
                                   (spec_lstm.lstm_forward, spec_lstm.lstm_backward))
    h_seq, (h_T, c_T), cache = lstm_forward(inputs["params"], inputs["x"], inputs["h0"],
                                            inputs["c0"], inputs["episode_starts"])
    dx, grads, (dh0, dc0) = lstm_backward(inputs["params"], cache, inputs["dh_seq"],
                                          inputs["dh_T"], inputs["dc_T"])
    return {"h_seq": h_seq, "h_T": h_T, "c_T": c_T, "dx": dx, "grads": dict(grads),
            "dh0": dh0, "dc0": dc0}


def _ppo_minibatch_update(inputs, settings, backend):
    """One PPO minibatch step (one epoch of one minibatch) through the update of ``backend``:
    the readable policy and update (:class:`ppo_ref.train.policies.SpecMLPPolicy`,
    :func:`ppo_ref.spec.update.run_epochs`) or the compiled ones
    (:class:`ppo_ref.train.policies.MLPPolicy`, :func:`ppo_ref.fast.update.run_epochs`)."""
    from gymnasium import spaces

    from ppo_ref.config import PPOConfig
    from ppo_ref.fast import update as fast_update
    from ppo_ref.optim import adam_init
    from ppo_ref.train.policies import make_mlp_policy
    from ppo_ref.spec import update as spec_update
    from ppo_ref.spec.update import Minibatch

    config = PPOConfig.from_dict(settings["config"]).replace(backend=backend)
    run_epochs = spec_update.run_epochs if backend == "spec" else fast_update.run_epochs
    obs = inputs["observations"]
    policy = make_mlp_policy(spaces.Box(-np.inf, np.inf, (obs.shape[1],), np.float64),
                             spaces.Discrete(settings["n_actions"]), config)
    params = policy.as_flat(inputs["params"])  # fast: the policy's one-buffer parameters
    seen = {}

    def evaluate(p, data):
        ev = policy.evaluate(p, *data)
        seen.setdefault("log_probs", ev.log_probs)
        seen.setdefault("entropy", ev.entropy)
        seen.setdefault("values", ev.values)
        return ev.log_probs, ev.entropy, ev.values, ev.cache

    def backward(p, cache, d_log_probs, d_entropy, d_values):
        grads = policy.backward(p, cache, d_log_probs, d_entropy, d_values)
        seen.setdefault("grads", {k: np.array(v) for k, v in grads.items()})
        return grads

    mb = Minibatch(inputs["old_log_probs"], inputs["advantages"], inputs["returns"],
                   inputs["old_values"], (obs, inputs["actions"]))
    new_params, _, stats = run_epochs(params, adam_init(params), config=config,
                                      lr=settings["learning_rate"],
                                      clip_range=settings["clip_range"],
                                      minibatches=lambda epoch: [mb], evaluate=evaluate,
                                      backward=backward)
    return {"new_log_probs": seen["log_probs"], "entropy": seen["entropy"],
            "values": seen["values"], "loss": stats["loss"], "policy_loss": stats["policy_loss"],
            "value_loss": stats["value_loss"], "mean_entropy": stats["entropy"],
            "approx_kl": stats["approx_kl"], "clip_fraction": stats["clip_fraction"],
            "grads": seen["grads"], "grad_norm": stats["grad_norm"],
            "params_after": dict(new_params)}


_KINDS: Dict[str, Callable] = {
    "episode_starts": _episode_starts,
    "gae": _gae,
    "vtrace": _vtrace,
    "categorical": _categorical,
    "policy_loss": _policy_loss,
    "value_loss": _value_loss,
    "entropy_loss": _entropy_loss,
    "normalize_advantages": _normalize_advantages,
    "approx_kl": _approx_kl,
    "adam": _adam,
    "clip_by_global_norm": _clip,
    "lstm": _lstm,
    "ppo_minibatch_update": _ppo_minibatch_update,
}

_FUNCTIONS = {
    "episode_starts": "ppo_ref.episode_starts",
    "gae": "ppo_ref.gae",
    "vtrace": "ppo_ref.vtrace",
    "categorical": "ppo_ref.nn.distributions (log_softmax, categorical_entropy, "
                   "categorical_log_prob and their backward)",
    "policy_loss": "ppo_ref.losses.policy_loss",
    "value_loss": "ppo_ref.losses.value_loss",
    "entropy_loss": "ppo_ref.losses.entropy_loss",
    "normalize_advantages": "ppo_ref.losses.normalize_advantages",
    "approx_kl": "ppo_ref.losses.approx_kl",
    "adam": "ppo_ref.optim.adam_init + adam_update (one call per step)",
    "clip_by_global_norm": "ppo_ref.optim.clip_by_global_norm",
    "lstm": "ppo_ref.nn.lstm.lstm_forward + lstm_backward",
    "ppo_minibatch_update": "ppo_ref.spec.update.run_epochs (1 epoch, 1 minibatch) with "
                            "ppo_ref.train.policies.MLPPolicy",
}


BACKENDS = ("fast", "spec")


def compute_outputs(case: Mapping, backend: str = "fast") -> Dict[str, Any]:
    """ppo_ref's outputs for a decoded case (``inputs`` and ``settings`` as NumPy values),
    computed by the tier ``backend`` (``PPOConfig.backend``'s values): the kernels
    (``episode_starts``, ``gae``, ``vtrace``: the spec loops interpreted or compiled), the LSTM
    (:mod:`ppo_ref.spec.lstm` or :mod:`ppo_ref.fast.lstm`) and the minibatch update (the spec
    or the fast policy and update); the other kinds have one definition (the spec's)."""
    kind = case["kind"]
    if kind not in _KINDS:
        raise ValueError(f"case kind must be one of {sorted(_KINDS)}, got {kind!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    return _KINDS[kind](case["inputs"], case["settings"], backend)


# ----------------------------------------------------------------------------------------------
# The cases
# ----------------------------------------------------------------------------------------------

def _flags(rng, shape, p):
    return rng.random(shape) < p


def _case(name, kind, preset, description, inputs, settings, tolerance=None):
    return {"format": FORMAT, "name": name, "kind": kind, "function": _FUNCTIONS[kind],
            "preset": preset, "description": description, "inputs": inputs,
            "settings": settings, "tolerance": dict(tolerance or DEFAULT_TOLERANCE)}


def _rollout(rng, T, N):
    terminated = _flags(rng, (T, N), 0.15)
    truncated = _flags(rng, (T, N), 0.15)
    terminated[-1, 0] = True           # a terminal on the last row (thrust-rl differs there)
    truncated[T // 2, -1] = True       # a truncation mid-rollout
    terminated[T // 2, -1] = False
    return {"rewards": rng.normal(size=(T, N)).round(6), "values": rng.normal(size=(T, N)).round(6),
            "terminated": terminated, "truncated": truncated,
            "last_values": rng.normal(size=N).round(6),
            "final_values": np.where(truncated, rng.normal(size=(T, N)).round(6), 0.0)}


_CONVENTIONS = {
    "reference": {"truncation": "bootstrap", "bootstrap_terminal_last_row": False},
    "sb3": {"truncation": "bootstrap", "bootstrap_terminal_last_row": False},
    "cleanrl": {"truncation": "terminate", "bootstrap_terminal_last_row": False},
    "thrust": {"truncation": "ignore", "bootstrap_terminal_last_row": True},
}


def _build_cases(rng: np.random.Generator) -> List[dict]:
    cases = []
    T, N = 8, 3
    term, trunc = _flags(rng, (T, N), 0.2), _flags(rng, (T, N), 0.2)
    cases.append(_case(
        "episode_starts", "episode_starts", "reference",
        "episode_starts[t] = terminated[t-1] or truncated[t-1]; [0] = initial",
        {"terminated": term, "truncated": trunc, "initial": np.array([True, False, True])}, {}))

    roll = _rollout(rng, T, N)
    for preset, desc in (("reference", "reference: bootstrap V(final_obs) on truncation, cut the trace"),
                         ("cleanrl", "CleanRL: truncation treated as termination"),
                         ("thrust", "thrust-rl: truncated ignored; terminal last row bootstraps")):
        cases.append(_case(f"gae_{preset}", "gae", preset, desc, roll,
                           {"gamma": 0.99, "gae_lambda": 0.95, **_CONVENTIONS[preset]}))
    single = _rollout(rng, 6, 1)
    single = {k: (v[:, 0] if np.ndim(v) == 2 else v[0]) for k, v in single.items()}
    cases.append(_case("gae_single_env", "gae", "reference",
                       "one env as [T] arrays with a scalar last_values", single,
                       {"gamma": 0.9, "gae_lambda": 0.8, **_CONVENTIONS["reference"]}))

    vt = dict(roll)
    vt["behaviour_log_probs"] = (-rng.exponential(1.0, (T, N))).round(6)
    vt["target_log_probs"] = (-rng.exponential(1.0, (T, N))).round(6)
    cases.append(_case("vtrace_reference", "vtrace", "reference",
                       "IMPALA V-trace with truncation bootstrap, lambda_ 0.9, distinct bars", vt,
                       {"gamma": 0.97, "rho_bar": 1.0, "c_bar": 0.9, "pg_rho_bar": 1.5,
                        "lambda_": 0.9, **_CONVENTIONS["reference"]}))
    cases.append(_case("vtrace_thrust", "vtrace", "thrust",
                       "thrust-rl conventions (no lambda, pg weight = rho)", vt,
                       {"gamma": 0.97, "rho_bar": 1.0, "c_bar": 1.0, "pg_rho_bar": None,
                        "lambda_": 1.0, **_CONVENTIONS["thrust"]}))

    logits = (rng.normal(size=(5, 4)) * 3.0).round(6)
    logits[1, 2] = -np.inf                     # a masked action
    actions = np.array([0, 3, 1, 2, 3])
    cases.append(_case(
        "categorical", "categorical", "reference",
        "log-softmax (max-shifted), entropy, log-probs and both gradients; row 1 has a masked "
        "action (-inf logit)",
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
    for ddof in (1, 0):
        cases.append(_case(f"normalize_advantages_ddof{ddof}", "normalize_advantages",
                           "reference" if ddof else "thrust",
                           "(A - mean) / (std(ddof) + 1e-8)", {"advantages": adv}, {"ddof": ddof}))
    for est in ("k3", "k1"):
        cases.append(_case(f"approx_kl_{est}", "approx_kl", "reference" if est == "k3" else "thrust",
                           "KL(old || new) estimator", {"old_log_probs": old, "new_log_probs": new},
                           {"estimator": est}))

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
    starts[0, 1] = True
    starts[3, 0] = True
    cases.append(_case(
        "lstm_resets", "lstm", "reference",
        "torch gate order (i, f, g, o), b = b_ih + b_hh; state zeroed where episode_starts; "
        "BPTT with dh_seq, dh_T, dc_T",
        {"params": lstm_params, "x": rng.normal(size=(T, N, D)).round(6),
         "h0": rng.normal(size=(N, H)).round(6), "c0": rng.normal(size=(N, H)).round(6),
         "episode_starts": starts, "dh_seq": rng.normal(size=(T, N, H)).round(6),
         "dh_T": rng.normal(size=(N, H)).round(6), "dc_T": rng.normal(size=(N, H)).round(6)},
        {}))

    cases.extend(_ppo_cases(rng))
    return cases


def _edge_cases(rng: np.random.Generator) -> List[dict]:
    """The cases that catch logic bugs: both flags on one step, gamma = 0, lambda = 0, a long
    rollout, per-step discounts, ratios exactly on the clip bounds, and the library options
    (reciprocal and asymmetric intervals, dual clip, Huber value loss, valid masks, the eps
    placement). ``final_values`` holds non-zero junk wherever the reference does not read it
    (steps that terminated, with or without a truncation), so code that reads it there fails."""
    cases = []
    ref = _CONVENTIONS["reference"]
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
                           {"gamma": 0.5, "gae_lambda": 0.9, **_CONVENTIONS[preset]}))
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
    vt = dict(roll)
    vt["behaviour_log_probs"] = (-rng.exponential(1.0, (6, 3))).round(6)
    vt["target_log_probs"] = (-rng.exponential(1.0, (6, 3))).round(6)
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
    d = np.log(np.array([1.25, 0.75, 1.25, 0.75, 1.0, 2.0]))
    new = old + d
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
    for name, ddof, eps_n, placement, preset in (
            ("clamp_1e-6", 1, 1e-6, "clamp", "torchrl"), ("clamp_1e-7", 1, 1e-7, "clamp",
                                                          "sample_factory"),
            ("add_1e-8", 1, 1e-8, "add", "reference")):
        cases.append(_case(f"normalize_advantages_{name}", "normalize_advantages", preset,
                           "a spread of 1e-7: where the eps and its placement show", spread,
                           {"ddof": ddof, "eps": eps_n, "placement": placement}))
    return cases


def _ppo_cases(rng) -> List[dict]:
    """Full minibatch update of a tiny MLP actor-critic: obs_dim 3, net_arch (4,), 2 actions."""
    from ppo_ref.config import PPOConfig
    from ppo_ref.nn.actor_critic import actor_critic_init

    B, obs_dim, n_actions = 6, 3, 2
    params = actor_critic_init(rng, obs_dim, n_actions, net_arch=(4,), policy_gain=1.0)
    params = {k: v.round(6) for k, v in params.items()}
    inputs = {"params": params, "observations": rng.normal(size=(B, obs_dim)).round(6),
              "actions": rng.integers(0, n_actions, B),
              "old_log_probs": (-rng.uniform(0.4, 1.0, B)).round(6),
              "advantages": rng.normal(size=B).round(6), "returns": rng.normal(size=B).round(6),
              "old_values": rng.normal(size=B).round(6)}
    out = []
    for preset in ("reference", "cleanrl"):
        config = PPOConfig.preset(preset, n_steps=B, batch_size=B, n_epochs=1, net_arch=(4,),
                                  ent_coef=0.01, learning_rate=0.01)
        out.append(_case(
            f"ppo_minibatch_update_{preset}", "ppo_minibatch_update", preset,
            "one PPO minibatch step: evaluate, loss (per-minibatch advantage normalization), "
            "backward, global-norm clip, one Adam step from a fresh state; params: pi.w0 [4,3], "
            "pi.b0, pi.w1 [2,4], pi.b1, vf.w0, vf.b0, vf.w1 [1,4], vf.b1 (y = x @ w.T + b, tanh)",
            inputs, {"config": config.to_dict(), "n_actions": n_actions,
                     "learning_rate": 0.01, "clip_range": config.clip_range}))
    return out


# ----------------------------------------------------------------------------------------------
# Conventions of a case: presets, overrides, and the other conventions a FAIL would pass under
# ----------------------------------------------------------------------------------------------

#: For each kind whose result depends on convention options: ``{option name: settings key}``
#: (the option names of ``ppo_ref.conventions.OPTIONS``).
_OPTION_KEYS: Dict[str, Dict[str, str]] = {
    "gae": {"truncation": "truncation",
            "bootstrap_terminal_last_row": "bootstrap_terminal_last_row"},
    "vtrace": {"truncation": "truncation",
               "bootstrap_terminal_last_row": "bootstrap_terminal_last_row"},
    "value_loss": {"value_loss_mode": "mode", "value_loss_scale": "scale"},
    "normalize_advantages": {"advantage_norm_ddof": "ddof", "advantage_norm_eps": "eps",
                             "advantage_norm_eps_placement": "placement"},
    "approx_kl": {"kl_estimator": "estimator"},
    "policy_loss": {"clip_interval": "clip_interval", "dual_clip": "dual_clip"},
}


def apply_preset(case: dict, preset: str) -> dict:
    """``case`` with the settings of ``preset``'s conventions (a new dict; inputs shared).

    The kernels take ``truncation`` and ``bootstrap_terminal_last_row``; the value loss
    ``value_loss_mode`` (when clipping is on), ``value_loss_scale`` and ``huber_delta``;
    the normalization ``advantage_norm_ddof``, ``_eps`` and ``_eps_placement``; the KL its
    estimator; the policy loss ``clip_interval`` and ``dual_clip``; the minibatch update the
    whole preset config with the case's hyperparameters. Other kinds are unchanged.
    """
    from ppo_ref.config import CONVENTION_FIELDS, PPOConfig
    config = PPOConfig.preset(preset)
    settings = dict(case["settings"])
    kind = case["kind"]
    if kind == "ppo_minibatch_update":
        base = PPOConfig.from_dict(settings["config"])
        keep = {k: v for k, v in base.to_dict().items() if k not in CONVENTION_FIELDS}
        settings["config"] = PPOConfig.preset(preset, **{**keep, "net_arch": tuple(
            keep["net_arch"])}).to_dict()
    else:
        for option, key in _OPTION_KEYS.get(kind, {}).items():
            if kind == "value_loss" and option == "value_loss_mode" and (
                    settings.get("clip_range_vf") is None and config.value_loss_mode != "huber"):
                continue  # without clipping "max" and "sb3" are one loss
            settings[key] = getattr(config, option)
        if kind == "value_loss":
            settings["huber_delta"] = config.huber_delta
    return {**case, "preset": preset, "settings": settings}


def _override_settings(settings: dict, overrides: Mapping[str, Any]) -> dict:
    """``settings`` with every key of ``overrides`` it has replaced."""
    return {k: overrides.get(k, v) for k, v in settings.items()}


def alternative_conventions(case: Mapping, got: Mapping[str, Any], atol: float,
                            rtol: float) -> List[str]:
    """The conventions under which ppo_ref's outputs for ``case`` equal ``got`` (flattened
    outputs, decoded) within the tolerance: each a description like ``"cleanrl/rlax
    (truncation='terminate', ...)"``. Tries every combination of the options of
    ``ppo_ref.conventions.OPTIONS`` that the case's kind reads (:data:`_OPTION_KEYS`); an
    empty list when none passes or the kind has no options."""
    from ppo_ref.conventions import QUANTITIES, describe, options_for
    import itertools
    keys = _OPTION_KEYS.get(case["kind"])
    if not keys:
        return []
    quantity = case["kind"] if case["kind"] in QUANTITIES else "policy_loss"
    table = [o for o in options_for(quantity) if o.name in keys]
    if case["kind"] == "approx_kl":
        from ppo_ref.conventions import OPTIONS
        table = [o for o in OPTIONS if o.name == "kl_estimator"]
    out = []
    for values in itertools.product(*(o.values for o in table)):
        combo = dict(zip((o.name for o in table), values))
        settings = dict(case["settings"])
        for name, value in combo.items():
            settings[keys[name]] = value
        if settings == dict(case["settings"]):
            continue
        try:
            expected = _flatten(encode_decode(compute_outputs({**case, "settings": settings})))
        except ValueError:
            continue
        if set(expected) <= set(got) and all(
                _compare(got[k], v, atol, rtol)[1] for k, v in expected.items()):
            text = ", ".join(f"{k}={v!r}" for k, v in combo.items())
            presets = [p for p in _presets_with(case["kind"], combo)]
            out.append(f"{'/'.join(presets)} ({text})" if presets else f"({text})")
    return out


def _presets_with(kind: str, combo: Mapping[str, Any]) -> List[str]:
    from ppo_ref.config import PRESETS
    return [name for name, fields in PRESETS.items()
            if all(fields.get(k) == v for k, v in combo.items())]


def encode_decode(outputs):
    """Outputs as a results file carries them (encoded to JSON values and decoded back)."""
    return decode(encode(outputs))


#: Tolerance profiles of ``check``: ``float64`` keeps each case's tolerance; ``float32`` is
#: for an implementation that computes in float32 (or rounds one step to float32): every
#: case's tolerance is raised to at least this.
TOLERANCE_PROFILES = {"float64": None, "float32": {"atol": 1e-4, "rtol": 1e-4}}


# ----------------------------------------------------------------------------------------------
# Writing, loading, checking
# ----------------------------------------------------------------------------------------------

def write_vectors(out_dir: str, *, seed: int = SEED, backend: str = "fast",
                  preset: Optional[str] = None,
                  settings: Optional[Mapping[str, Any]] = None) -> List[str]:
    """Write every case to ``out_dir/<name>.json`` and ``out_dir/index.json``.

    ``preset`` (a :meth:`ppo_ref.PPOConfig.preset` name) recomputes every convention-dependent
    case under that implementation's conventions (:func:`apply_preset`); ``settings``
    (``{key: value}``) replaces that setting in every case that has it (e.g. ``{"gamma":
    0.9}``).

    Inputs are generated from ``np.random.default_rng(seed)`` (rounded to 6 decimals so they
    read well); expected outputs are computed by ppo_ref's ``backend`` tier from the *decoded*
    JSON inputs, so a reader of the file gets exactly the numbers ppo_ref computes from what it
    reads (the two tiers agree within the vectors' tolerance: a test checks it).

    Returns:
        the case names, in order.
    """
    os.makedirs(out_dir, exist_ok=True)
    cases = (_build_cases(np.random.default_rng(seed))
             + _edge_cases(np.random.default_rng([seed, 1])))
    if preset is not None:
        cases = [apply_preset(case, preset) for case in cases]
    for case in cases:
        case["settings"] = _override_settings(case["settings"], settings or {})
    names = []
    index = []
    for case in cases:
        encoded = {k: encode(v) if k in ("inputs", "settings") else v for k, v in case.items()}
        decoded = {**encoded, "inputs": decode(encoded["inputs"]),
                   "settings": _decode_settings(encoded["settings"])}
        encoded["expected"] = encode(compute_outputs(decoded, backend))
        path = os.path.join(out_dir, f"{case['name']}.json")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(dumps(encoded) + "\n")
        names.append(case["name"])
        index.append({"name": case["name"], "kind": case["kind"], "preset": case["preset"],
                      "file": f"{case['name']}.json"})
    with open(os.path.join(out_dir, "index.json"), "w", encoding="utf-8") as fh:
        json.dump({"format": FORMAT, "seed": seed, "cases": index}, fh, indent=1)
        fh.write("\n")
    return names


def dumps(doc: Mapping, indent: int = 1) -> str:
    """JSON text of a case or results document: objects one key per line, each array on one
    line (readable diffs, no NaN/inf literals)."""
    def render(value, level):
        if isinstance(value, dict) and value:
            pad = " " * (indent * (level + 1))
            items = [f"{pad}{json.dumps(k)}: {render(v, level + 1)}" for k, v in value.items()]
            return "{\n" + ",\n".join(items) + "\n" + " " * (indent * level) + "}"
        return json.dumps(value, allow_nan=False)
    return render(doc, 0)


def _decode_settings(settings: Mapping) -> dict:
    """Settings are scalars, strings, lists of scalars and a config dict: keep lists as lists
    (e.g. ``betas``) and only turn the special-float strings into floats."""
    out = {}
    for k, v in settings.items():
        if isinstance(v, str) and v in _SPECIAL:
            out[k] = _SPECIAL[v]
        else:
            out[k] = v
    return out


def _bounded_int(text: str) -> int:
    digits = text.lstrip("-")
    if len(digits) > MAX_JSON_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits)} digits (at most {MAX_JSON_INT_DIGITS})")
    return int(text)


def _json_depth_ok(value) -> bool:
    """True when lists/objects nest at most :data:`MAX_JSON_DEPTH` deep (iterative walk)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > MAX_JSON_DEPTH:
                return False
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return True


def read_json_file(path: str, what: str, max_bytes: int = MAX_JSON_BYTES):
    """Parsed JSON of the file ``path``, read with bounds: at most ``max_bytes`` bytes (an
    endless file such as ``/dev/zero`` is refused after ``max_bytes + 1``), UTF-8, nesting at
    most :data:`MAX_JSON_DEPTH` deep, integers of at most :data:`MAX_JSON_INT_DIGITS` digits.
    Raises ``ValueError`` naming the file (``what`` says which file) for anything else;
    ``OSError`` (missing, unreadable) propagates unchanged."""
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{what} {path} is larger than the limit of {max_bytes} bytes")
    try:
        value = json.loads(data.decode("utf-8"), parse_int=_bounded_int)
    except RecursionError:
        raise ValueError(f"{what} {path} nests deeper than {MAX_JSON_DEPTH} levels") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} {path} is not valid JSON ({exc})") from None
    except ValueError as exc:  # _bounded_int
        raise ValueError(f"{what} {path} holds {exc}") from None
    if not _json_depth_ok(value):
        raise ValueError(f"{what} {path} nests deeper than {MAX_JSON_DEPTH} levels")
    return value


def _read_json(path: str, what: str):
    """:func:`read_json_file` (kept for the callers in this module)."""
    return read_json_file(path, what)


def _check_case_fields(raw, path: str) -> None:
    """``ValueError`` naming the case file unless it holds the fields a case needs, of the
    right JSON types (so a damaged file is one clear line, not a ``KeyError``)."""
    if not isinstance(raw, dict):
        raise ValueError(f"case file {path} must hold a JSON object")
    if raw.get("format") != FORMAT:
        raise ValueError(f"{path}: format must be {FORMAT!r}, got {raw.get('format')!r}")
    for key, kind in (("name", str), ("kind", str), ("preset", str), ("inputs", dict),
                      ("settings", dict), ("expected", dict)):
        if not isinstance(raw.get(key), kind):
            raise ValueError(f"case file {path}: {key!r} must be a JSON "
                             f"{'string' if kind is str else 'object'}, got "
                             f"{type(raw.get(key)).__name__}")
    tol = raw.get("tolerance", DEFAULT_TOLERANCE)
    if not (isinstance(tol, dict) and set(tol) == {"atol", "rtol"} and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
            for v in tol.values())):
        raise ValueError(f"case file {path}: 'tolerance' must be {{'atol': number >= 0, "
                         f"'rtol': number >= 0}}, got {tol!r}")


def load_case(path: str) -> dict:
    """Read one case file; ``inputs`` and ``expected`` decoded to NumPy (settings as JSON)."""
    raw = _read_json(path, "case file")
    _check_case_fields(raw, path)
    try:
        raw["inputs"] = decode(raw["inputs"])
        raw["settings"] = _decode_settings(raw["settings"])
        raw["expected"] = decode(raw["expected"])
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"case file {path}: {exc}") from None
    return raw


def load_cases(vectors_dir: str) -> List[dict]:
    """All cases listed in ``vectors_dir/index.json``, in order."""
    index_path = os.path.join(vectors_dir, "index.json")
    if not os.path.exists(index_path):
        raise ValueError(f"vectors_dir has no index.json: {vectors_dir!r} (write it with "
                         "`ppo-ref vectors --out DIR`)")
    index = _read_json(index_path, "vectors index")
    try:
        files = [entry["file"] for entry in index["cases"]]
    except (KeyError, TypeError):
        raise ValueError(f"vectors index {index_path} must hold {{'cases': [{{'file': ...}}, ...]}}") from None
    root = os.path.realpath(vectors_dir)
    paths = []
    for name in files:
        if not isinstance(name, str) or not name:
            raise ValueError(f"vectors index {index_path}: a case file name must be a non-empty "
                             f"string, got {name!r}")
        path = os.path.realpath(os.path.join(root, name))
        if os.path.isabs(name) or os.path.commonpath([root, path]) != root:
            raise ValueError(f"vectors index {index_path}: case file {name!r} leaves the vectors "
                             f"directory (names must be relative paths inside it)")
        paths.append(path)
    return [load_case(path) for path in paths]


def reference_results(vectors_dir: str, implementation: str = "ppo_ref") -> dict:
    """Run ppo_ref on every case's inputs and return a results document (the format another
    implementation writes). Used for the round-trip test and as an example of the layout."""
    import ppo_ref
    cases = {}
    for case in load_cases(vectors_dir):
        cases[case["name"]] = {"outputs": encode(compute_outputs(case))}
    return {"format": RESULTS_FORMAT, "implementation": f"{implementation} {ppo_ref.__version__}",
            "cases": cases}


def _flatten(value, prefix="") -> Dict[str, Any]:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}/"))
        return out
    return {prefix[:-1]: value}


def _compare(got, expected, atol: float, rtol: float):
    """``(max_abs_err, ok, detail)`` for one output."""
    exp = np.asarray(expected, dtype=np.float64)
    try:
        g = np.asarray(got)
        if g.dtype.kind not in "biuf":  # strings ("1.5") and objects are not numbers
            return math.inf, False, "not numeric"
        g = g.astype(np.float64)
    except (TypeError, ValueError, OverflowError):
        return math.inf, False, "not numeric"
    if g.shape != exp.shape:
        return math.inf, False, f"shape {g.shape} != expected {exp.shape}"
    if exp.size == 0:
        return 0.0, True, ""
    inf_e = np.isinf(exp)
    nan_e = np.isnan(exp)
    if np.any(g[inf_e] != exp[inf_e]) or np.any(~np.isnan(g[nan_e])):
        return math.inf, False, "special values (inf/nan) differ"
    fin = ~(inf_e | nan_e)
    if np.any(~np.isfinite(g[fin])):
        return math.inf, False, "non-finite where expected is finite"
    err = np.abs(g[fin] - exp[fin])
    ok = bool(np.all(err <= atol + rtol * np.abs(exp[fin])))
    return (float(err.max()) if err.size else 0.0), ok, ""


def check_results(vectors_dir: str, results_file: str, *, atol: Optional[float] = None,
                  rtol: Optional[float] = None, allow_missing: bool = False,
                  profile: str = "float64",
                  tolerances: Optional[Mapping[str, Mapping[str, float]]] = None,
                  skip_outputs: Sequence[str] = (), explain: bool = True) -> List[dict]:
    """Compare another implementation's outputs with the vectors.

    Args:
        vectors_dir: directory written by :func:`write_vectors`.
        results_file: JSON in the results format (module docstring).
        atol, rtol: override every case's tolerance (e.g. for a float32 implementation).
        allow_missing: a case absent from the results is ``SKIP`` instead of ``MISSING``.
        profile: ``"float64"`` (each case's own tolerance) or ``"float32"`` (every tolerance
            raised to at least :data:`TOLERANCE_PROFILES` ``["float32"]``).
        tolerances: per-case and per-output overrides, ``{"<case>": {"atol": .., "rtol": ..},
            "<case>/<output>": {...}, "*/<output>": {...}}`` (the most specific wins; over
            ``atol``/``rtol`` and the profile).
        skip_outputs: output names (``"clip_fraction"``, or ``"<case>/<output>"``) an
            implementation does not produce: not compared (the row's detail lists them). A
            results case may also list its own in ``"skip": [...]``.
        explain: for a FAIL of a kind with convention options, try the other conventions
            (:func:`alternative_conventions`) and name those that would pass in ``detail``.

    Returns:
        one dict per case, in index order: ``case``, ``kind``, ``preset``, ``status``
        (``PASS``/``FAIL``/``MISSING``/``SKIP``; ``UNKNOWN`` rows, after the index's, for case
        names in the results that the vectors do not have; outputs or keys the case does not
        expect, and strings where numbers belong, make it ``FAIL``), ``max_err`` (largest
        absolute error over the
        case's outputs; ``inf`` for a shape or special-value mismatch, ``nan`` if missing),
        ``worst`` (the output holding it), ``atol``, ``rtol``, ``detail``, ``alternatives``
        (list of conventions that would pass, for a FAIL).
    """
    if profile not in TOLERANCE_PROFILES:
        raise ValueError(f"profile must be one of {list(TOLERANCE_PROFILES)}, got {profile!r}")
    tolerances = dict(tolerances or {})
    for key, tol in tolerances.items():
        if not (isinstance(tol, Mapping) and set(tol) <= {"atol", "rtol"} and all(
                isinstance(v, (int, float)) and math.isfinite(v) and v >= 0
                for v in tol.values())):
            raise ValueError(f"tolerances[{key!r}] must be {{'atol': number >= 0, 'rtol': "
                             f"number >= 0}}, got {tol!r}")
    floor = TOLERANCE_PROFILES[profile]
    for name, tol in (("atol", atol), ("rtol", rtol)):
        if tol is not None and not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {tol!r}")
    results = _read_json(results_file, "results file")
    if not isinstance(results, dict):
        raise ValueError(f"results file {results_file} must hold a JSON object")
    if results.get("format") != RESULTS_FORMAT:
        raise ValueError(f"results_file format must be {RESULTS_FORMAT!r}, "
                         f"got {results.get('format')!r} in {results_file}")
    got_cases = results.get("cases", {})
    if not isinstance(got_cases, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("outputs", {}), dict) for v in got_cases.values()):
        raise ValueError(f"results file {results_file}: 'cases' must map case names to "
                         "{'outputs': {...}}")
    rows = []
    for case in load_cases(vectors_dir):
        tol = case.get("tolerance", DEFAULT_TOLERANCE)
        a = tol["atol"] if atol is None else atol
        r = tol["rtol"] if rtol is None else rtol
        if floor is not None:
            a, r = max(a, floor["atol"]), max(r, floor["rtol"])
        a = tolerances.get(case["name"], {}).get("atol", a)
        r = tolerances.get(case["name"], {}).get("rtol", r)

        def output_tolerance(key, a=a, r=r, name=case["name"]):
            out_tol = {**tolerances.get(f"*/{key}", {}), **tolerances.get(f"{name}/{key}", {})}
            return out_tol.get("atol", a), out_tol.get("rtol", r)
        row = {"case": case["name"], "kind": case["kind"], "preset": case["preset"],
               "atol": a, "rtol": r, "max_err": math.nan, "worst": "", "detail": "",
               "alternatives": []}
        if case["name"] not in got_cases:
            row["status"] = "SKIP" if allow_missing else "MISSING"
            rows.append(row)
            continue
        raw_outputs = got_cases[case["name"]].get("outputs", {})
        extra_keys = sorted(set(got_cases[case["name"]]) - {"outputs", "skip"})
        own_skip = got_cases[case["name"]].get("skip", [])
        if not (isinstance(own_skip, list) and all(isinstance(x, str) for x in own_skip)):
            own_skip = []
            extra_keys.append("skip (must be a list of output names)")
        expected = _flatten(case["expected"])
        skipped = sorted(k for k in expected
                         if k in own_skip or k in skip_outputs
                         or f"{case['name']}/{k}" in skip_outputs)
        known_outputs = set(expected)
        expected = {k: v for k, v in expected.items() if k not in skipped}
        try:
            got = _flatten(decode(raw_outputs))
        except (ValueError, TypeError, OverflowError) as exc:
            row.update(status="FAIL", max_err=math.inf, worst="",
                       detail=f"outputs not numeric: {exc}")
            rows.append(row)
            continue
        worst, worst_key, ok, details = 0.0, "", True, []
        unexpected = sorted(set(got) - known_outputs)
        if unexpected or extra_keys:
            ok = False
            details.append("unexpected " + ", ".join(
                ([f"outputs {unexpected}"] if unexpected else [])
                + ([f"keys {extra_keys}"] if extra_keys else [])))
        for key, exp in expected.items():
            if key not in got:
                ok = False
                details.append(f"missing output {key}")
                worst, worst_key = math.inf, key
                continue
            err, good, detail = _compare(got[key], exp, *output_tolerance(key))
            if not good:
                ok = False
                details.append(f"{key}: {detail}" if detail else f"{key} out of tolerance")
            if err > worst or not worst_key:
                worst, worst_key = err, key
        if skipped:
            details.append("skipped outputs: " + ", ".join(skipped))
        if not ok and explain and not unexpected and not extra_keys:
            try:
                row["alternatives"] = alternative_conventions(
                    case, {k: v for k, v in got.items() if k not in skipped}, a, r)
            except Exception:  # a results file that breaks the explanation still gets its row
                row["alternatives"] = []
            if row["alternatives"]:
                details.append("would pass under " + " | ".join(row["alternatives"]))
            else:
                details.append("no other known convention passes")
        row.update(status="PASS" if ok else "FAIL", max_err=worst, worst=worst_key,
                   detail="; ".join(details))
        rows.append(row)
    known = {row["case"] for row in rows}
    for name in got_cases:
        if name not in known:
            rows.append({"case": str(name), "kind": "", "preset": "", "status": "UNKNOWN",
                         "atol": math.nan, "rtol": math.nan, "max_err": math.nan, "worst": "",
                         "detail": "not a case of these vectors"})
    return rows


def format_table(rows: List[dict]) -> str:
    """The check rows as a fixed-width text table (one line per case, then a summary)."""
    w = max([len(r["case"]) for r in rows] + [4])
    lines = [f"{'case':<{w}}  {'kind':<22} {'preset':<9} {'status':<7} {'max |err|':>10}  "
             f"{'atol':>7} {'rtol':>7}  worst output / detail"]
    for r in rows:
        err = "" if math.isnan(r["max_err"]) else f"{r['max_err']:.3e}"
        extra = r["worst"] + (f" ({r['detail']})" if r["detail"] else "")
        tols = "" if math.isnan(r["atol"]) else f"{r['atol']:>7.0e} {r['rtol']:>7.0e}"
        lines.append(f"{r['case']:<{w}}  {r['kind']:<22} {r['preset']:<9} {r['status']:<7} "
                     f"{err:>10}  {tols:>15}  {extra}")
    counts = {status: sum(r["status"] == status for r in rows)
              for status in ("PASS", "FAIL", "MISSING", "SKIP", "UNKNOWN")}
    words = (("PASS", "passed"), ("FAIL", "failed"), ("MISSING", "missing"), ("SKIP", "skipped"),
             ("UNKNOWN", "unknown"))
    lines.append(", ".join(f"{counts[k]} {word}" for k, word in words
                           if counts[k] or k == "PASS"))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Command line: `ppo-ref vectors --out DIR` and `ppo-ref check DIR --results FILE`
# ----------------------------------------------------------------------------------------------

def _cli_error(command: str, message: str) -> int:
    print(f"ppo-ref {command}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def cli_vectors(args) -> int:
    """``ppo-ref vectors --out DIR``: write the cases; print one line per case. A directory
    that cannot be written is one line on stderr and exit status 2."""
    if args.seed < 0:
        return _cli_error("vectors", f"--seed must be >= 0, got {args.seed}")
    try:
        settings = {}
        for item in getattr(args, "set", None) or []:
            key, sep, text = item.partition("=")
            if not sep:
                return _cli_error("vectors", f"--set expects key=value, got {item!r}")
            try:
                settings[key.strip()] = json.loads(text)
            except json.JSONDecodeError:
                settings[key.strip()] = text
        names = write_vectors(args.out, seed=args.seed, backend=args.backend,
                              preset=getattr(args, "preset", None), settings=settings)
    except ValueError as exc:
        return _cli_error("vectors", str(exc))
    except OSError as exc:
        return _cli_error("vectors", f"cannot write {args.out}: {exc.strerror or exc}")
    print(f"wrote {len(names)} cases to {args.out} (index.json + one <name>.json per case)")
    for name in names:
        print(f"  {name}")
    return 0


def cli_check(args) -> int:
    """``ppo-ref check DIR --results FILE``: print the table; 1 if a case fails or is missing;
    2 (one line on stderr) when the vectors or the results file cannot be read."""
    if not os.path.isdir(args.vectors_dir):
        return _cli_error("check", f"vectors directory {args.vectors_dir} does not exist (write "
                                   "one with `ppo-ref vectors --out DIR`)")
    try:
        tolerances = (read_json_file(args.tolerances, "tolerances file")
                      if getattr(args, "tolerances", None) else None)
        rows = check_results(args.vectors_dir, args.results, atol=args.atol, rtol=args.rtol,
                             allow_missing=args.allow_missing,
                             profile=getattr(args, "profile", "float64"), tolerances=tolerances,
                             skip_outputs=getattr(args, "skip_output", None) or ())
    except OSError as exc:
        return _cli_error("check", f"cannot read {exc.filename or args.results}: {exc.strerror or exc}")
    except ValueError as exc:
        return _cli_error("check", str(exc))
    print(format_table(rows))
    return 1 if any(r["status"] in ("FAIL", "MISSING", "UNKNOWN") for r in rows) else 0


def configure_vectors(p) -> None:
    """Arguments of ``ppo-ref vectors`` on an argparse parser."""
    p.description = ("Write golden vectors (inputs, settings, expected outputs, convention preset) "
                     "as JSON, one file per case, plus index.json. Format: validation/README.md.")
    p.add_argument("--out", required=True, help="output directory (created if missing)")
    p.add_argument("--seed", type=int, default=SEED, help="seed of the generated inputs")
    p.add_argument("--backend", default="fast", choices=BACKENDS,
                   help="the tier that computes the expected outputs: fast (compiled, default) "
                        "or spec (the readable tier); they agree within the vectors' tolerance")
    p.add_argument("--preset", default=None,
                   help="compute every convention-dependent case under this PPOConfig preset's "
                        "conventions (reference, sb3, cleanrl, thrust, tianshou, torchrl, rlax, "
                        "skrl, sample_factory, purejaxrl)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="replace a setting in every case that has it (value as JSON, e.g. "
                        "gamma=0.9, dual_clip=2.0); repeatable")


def configure_check(p) -> None:
    """Arguments of ``ppo-ref check`` on an argparse parser."""
    p.description = ("Compare a results JSON (format ppo_ref.results/1) with golden vectors; "
                     "prints a pass/fail table with the largest error per case; exit status 1 "
                     "when a case fails or is missing.")
    p.add_argument("vectors_dir", help="directory written by `ppo-ref vectors`")
    p.add_argument("--results", required=True, help="results JSON of the implementation")
    p.add_argument("--atol", type=float, default=None, help="override every case's atol")
    p.add_argument("--rtol", type=float, default=None, help="override every case's rtol")
    p.add_argument("--allow-missing", action="store_true",
                   help="report cases absent from the results as SKIP instead of failing")
    p.add_argument("--profile", default="float64", choices=tuple(TOLERANCE_PROFILES),
                   help="float32: raise every tolerance to atol=rtol=1e-4 (an implementation "
                        "computing in float32)")
    p.add_argument("--tolerances", default=None, metavar="FILE",
                   help="JSON of per-case / per-output tolerance overrides: {\"case\": "
                        "{\"atol\": ..}, \"case/output\": {..}, \"*/output\": {..}}")
    p.add_argument("--skip-output", action="append", metavar="NAME",
                   help="an output the implementation does not produce (e.g. clip_fraction, "
                        "or case/output); repeatable")


def add_cli_commands(subparsers) -> None:
    """Register ``vectors`` and ``check`` on an argparse subparsers object (for a standalone
    parser; ``ppo_ref.cli`` registers the same functions); each sets ``func``."""
    configure_vectors(p := subparsers.add_parser("vectors", help="write golden JSON test vectors"))
    p.set_defaults(func=cli_vectors)
    configure_check(c := subparsers.add_parser(
        "check", help="compare another implementation's outputs with golden vectors"))
    c.set_defaults(func=cli_check)


def main(argv=None) -> int:
    """``python -m ppo_ref.vectors {vectors,check} ...`` (the same as the ppo-ref subcommands)."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m ppo_ref.vectors")
    add_cli_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
