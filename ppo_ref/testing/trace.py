"""``trace_update``: every intermediate of one PPO minibatch update, and the diff of two traces.

The update is the trainer's (:mod:`ppo_ref.spec.update`) written out step by step with the spec
functions on a tiny fixed network (observation dim 3, one hidden layer of 4 tanh units per
tower, 2 actions; a rollout of ``T = 3`` steps of ``N = 2`` envs with a step both terminated and
truncated, one truncated and one terminal step; its six rows one minibatch, one sequence). The
quantities are :data:`TRACE_ORDER`, in data-flow order; ``clip_mask`` is 1.0 where ``|ratio -
1| > clip_range``; the losses and their gradients are those of
:func:`ppo_ref.spec.update.minibatch_loss` (``value_loss`` times ``value_loss_scale``,
``entropy_loss`` with the aggregation's factor); ``grads`` and what follows are per
parameter; ``adam_m``, ``adam_v`` are one step from a fresh state.

The file uses the golden-vector codec (:mod:`ppo_ref.vectors.codec`) with ``"format":
"ppo_ref.trace/1"``, the ``settings`` (the PPOConfig as a dict), the ``inputs`` and the
``trace`` (an object in data-flow order). Another implementation writes the same file from the
same inputs; ``ppo-ref diff A B`` (:func:`diff_traces`) reports the first quantity where they
part; :func:`identify_trace` names the convention options under which ppo_ref's update
reproduces another implementation's trace.
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from ppo_ref.config import PPOConfig
from ppo_ref.conventions import OPTIONS
from ppo_ref.spec.advantages import gae
from ppo_ref.spec.distributions import (categorical_entropy, categorical_entropy_backward,
                                        categorical_log_prob, categorical_log_prob_backward)
from ppo_ref.spec.networks import actor_critic_backward, actor_critic_forward, actor_critic_init
from ppo_ref.spec.optim import adam_init, adam_update, clip_by_global_norm
from ppo_ref.spec.update import (aggregation_weights, batch_advantages, minibatch_loss,
                                 normalized_advantages, truncation_weights)
from ppo_ref.vectors.codec import decode, dumps, encode, flatten, read_json_file

__all__ = ["TRACE_FORMAT", "TRACE_ORDER", "trace_inputs", "trace_update", "load_trace",
           "diff_traces", "format_diff", "quantity_count", "identify_trace"]

TRACE_FORMAT = "ppo_ref.trace/1"
TRACE_ORDER = ("advantages", "returns", "normalized_advantages", "logits", "values",
               "new_log_probs", "entropy", "ratios", "clip_mask", "policy_loss",
               "clip_fraction", "approx_kl", "value_loss", "entropy_loss", "loss",
               "d_log_probs", "d_values", "d_entropy", "d_logits", "grads", "grad_norm",
               "clip_scale", "clipped_grads", "adam_m", "adam_v", "params_after")


def trace_inputs(seed: int = 0) -> Dict[str, Any]:
    """The fixed inputs of the traced update (numbers rounded to 6 decimals)."""
    rng = np.random.default_rng(seed)
    T, N, obs_dim, n_actions = 3, 2, 3, 2
    params = {k: v.round(6) for k, v in actor_critic_init(rng, obs_dim, n_actions, net_arch=(4,),
                                                           policy_gain=1.0).items()}
    terminated = np.array([[True, False], [False, False], [False, True]])
    truncated = np.array([[True, False], [False, True], [False, False]])
    return {"params": params, "observations": rng.normal(size=(T * N, obs_dim)).round(6),
            "actions": rng.integers(0, n_actions, T * N),
            "old_log_probs": (-rng.uniform(0.4, 1.0, T * N)).round(6),
            "rewards": rng.normal(size=(T, N)).round(6),
            "old_values": rng.normal(size=(T, N)).round(6),
            "terminated": terminated, "truncated": truncated,
            "last_values": rng.normal(size=N).round(6),
            "final_values": rng.normal(size=(T, N)).round(6)}


def trace_update(path: Optional[str] = None, *, preset: str = "reference", seed: int = 0,
                 learning_rate: float = 0.01, inputs: Optional[Mapping[str, Any]] = None,
                 **config_overrides: Any) -> Dict[str, Any]:
    """Every intermediate of one PPO minibatch update (see the module docstring).

    Args:
        path: write the trace there as JSON (``"ppo_ref.trace/1"``) when given.
        preset: the convention preset of ``PPOConfig.preset``.
        seed: seed of :func:`trace_inputs` (ignored when ``inputs`` is given).
        learning_rate: Adam step size of the update.
        inputs: the inputs (as :func:`trace_inputs` returns them), e.g. read from a trace file.
        **config_overrides: PPOConfig fields (``ent_coef=0.01``, ``clip_range_vf=0.2``, ...).
            ``n_steps``, ``n_envs`` and ``batch_size`` are fixed by the inputs.

    Returns:
        The document: ``{"format", "preset", "settings", "inputs", "trace"}`` with NumPy
        arrays (the file holds the same numbers in the vectors' JSON encoding).

    Raises:
        ValueError: an unknown preset or config field, or inputs of the wrong shapes.
    """
    inp = dict(trace_inputs(seed) if inputs is None else inputs)
    T, N = np.shape(inp["rewards"])
    config = PPOConfig.preset(preset, **{"ent_coef": 0.01, "learning_rate": learning_rate,
                                         **config_overrides, "n_steps": T, "n_envs": N,
                                         "batch_size": T * N, "n_epochs": 1, "net_arch": (4,)})
    tr: Dict[str, Any] = {}

    adv, ret = gae(inp["rewards"], inp["old_values"], inp["terminated"], inp["truncated"],
                   inp["last_values"], inp["final_values"], gamma=config.gamma,
                   gae_lambda=config.gae_lambda, truncation=config.truncation,
                   bootstrap_terminal_last_row=config.bootstrap_terminal_last_row)
    tr["advantages"], tr["returns"] = adv, ret
    # the minibatch is the whole rollout, rows in time-major order (row = t * N + n)
    adv_rows, ret_rows = adv.reshape(-1), ret.reshape(-1)
    old_values = np.asarray(inp["old_values"], np.float64).reshape(-1)
    tr["normalized_advantages"] = (normalized_advantages(adv_rows, config)
                                   if config.normalize_advantage else adv_rows.copy())

    params = {k: np.asarray(v, np.float64) for k, v in inp["params"].items()}
    logits, values, cache = actor_critic_forward(params, inp["observations"])
    tr["logits"], tr["values"] = logits, values
    actions = np.asarray(inp["actions"])
    tr["new_log_probs"] = new_lp = categorical_log_prob(logits, actions)
    tr["entropy"] = entropy = categorical_entropy(logits)
    old_lp = np.asarray(inp["old_log_probs"], np.float64)
    tr["ratios"] = ratios = np.exp(new_lp - old_lp)
    tr["clip_mask"] = (np.abs(ratios - 1.0) > config.clip_range).astype(np.float64)

    # the rows weighted as drop_truncated_steps says; the factor of the loss aggregation
    weights = truncation_weights(inp["terminated"], inp["truncated"], config.drop_truncated_steps)
    weights = None if weights is None else weights.reshape(-1)
    factor = aggregation_weights(config.loss_aggregation, old_lp.size, weights, None,
                                 config.loss_aggregation_norm)[1]
    mb = minibatch_loss(new_lp, entropy, values, old_lp, batch_advantages(adv_rows, config),
                        ret_rows, old_values, config=config, clip_range=config.clip_range,
                        weights=weights)
    tr.update(policy_loss=mb.policy_loss, clip_fraction=mb.clip_fraction, approx_kl=mb.approx_kl,
              value_loss=config.value_loss_scale * mb.value_loss, entropy_loss=-factor * mb.entropy,
              loss=mb.loss, d_log_probs=mb.d_log_probs, d_values=mb.d_values,
              d_entropy=np.zeros_like(entropy) if mb.d_entropy is None else mb.d_entropy)
    tr["d_logits"] = d_logits = (categorical_log_prob_backward(logits, actions, tr["d_log_probs"])
                                 + categorical_entropy_backward(logits, tr["d_entropy"]))
    grads = actor_critic_backward(params, cache, d_logits, tr["d_values"])
    tr["grads"] = dict(grads)
    clipped, tr["grad_norm"] = clip_by_global_norm(grads, config.max_grad_norm)
    tr["clip_scale"] = min(1.0, config.max_grad_norm / (tr["grad_norm"] + 1e-6))
    tr["clipped_grads"] = dict(clipped)
    new_params, state = adam_update(params, clipped, adam_init(params), lr=config.learning_rate,
                                    eps=config.adam_eps)
    tr["adam_m"], tr["adam_v"] = dict(state["m"]), dict(state["v"])
    tr["params_after"] = dict(new_params)
    doc = {"format": TRACE_FORMAT, "preset": preset, "settings": config.to_dict(),
           "inputs": inp, "trace": {k: tr[k] for k in TRACE_ORDER}}
    if path is not None:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(dumps({k: encode(v) if k in ("inputs", "trace") else v
                            for k, v in doc.items()}) + "\n")
    return doc


def load_trace(path: str) -> Dict[str, Any]:
    """Read a trace file; ``inputs`` and ``trace`` decoded to NumPy (key order kept).

    The file is read with the bounds of :func:`ppo_ref.vectors.codec.read_json_file` (size,
    nesting depth, integer digits): an endless or hostile file is refused, never read to the end.

    Raises:
        ValueError: not JSON, beyond a bound, or not a ``"ppo_ref.trace/1"`` document with a
            ``trace`` object.
        OSError: the file cannot be read.
    """
    raw = read_json_file(path, "trace file")
    if not isinstance(raw, dict) or raw.get("format") != TRACE_FORMAT or not isinstance(
            raw.get("trace"), dict):
        raise ValueError(f"trace file {path} must be a {TRACE_FORMAT!r} document with a "
                         "'trace' object")
    raw["trace"] = {k: decode(v) for k, v in raw["trace"].items()}
    if "inputs" in raw:
        raw["inputs"] = decode(raw["inputs"])
    return raw


def quantity_count(trace: Mapping[str, Any]) -> int:
    """The number of quantities in the ``trace`` of a loaded trace, each entry of a dict (such
    as ``grads``) counted on its own: the count :func:`format_diff` reports when traces agree."""
    return len(flatten(trace["trace"]))


def diff_traces(a: Mapping[str, Any], b: Mapping[str, Any], *, rtol: float = 1e-9,
                atol: float = 1e-12) -> List[Dict[str, Any]]:
    """Compare two traces quantity by quantity in ``a``'s (data-flow) order.

    ``a`` and ``b`` are trace documents (:func:`trace_update` / :func:`load_trace`) or their
    ``trace`` dicts. An element agrees when ``|a - b| <= atol + rtol * |a|``; a dict-valued
    quantity (``grads``, ...) is compared per parameter (``grads/pi.w0``).

    Returns:
        One row per differing or missing quantity, first in data-flow order first:
        ``{"quantity", "index", "a", "b", "abs_diff", "detail"}``; empty when the traces agree.
    """
    ta = a.get("trace", a) if isinstance(a, Mapping) else a
    tb = b.get("trace", b) if isinstance(b, Mapping) else b
    rows = []
    flat_b = flatten(tb)
    for name, va in flatten(ta).items():
        xa = np.asarray(va, dtype=np.float64)
        xb = np.asarray(flat_b[name], dtype=np.float64) if name in flat_b else None
        if xb is None or xa.shape != xb.shape:
            rows.append({"quantity": name, "index": None, "a": None, "b": None,
                         "abs_diff": math.inf, "detail": "missing in B" if xb is None
                         else f"shape {xa.shape} vs {xb.shape}"})
            continue
        with np.errstate(invalid="ignore"):
            gap = np.abs(xa - xb)
            bad = ~(gap <= atol + rtol * np.abs(xa)) & ~((xa == xb) | (np.isnan(xa)
                                                                     & np.isnan(xb)))
        if np.any(bad):
            idx = tuple(int(i) for i in np.argwhere(bad)[0]) if xa.ndim else ()
            rows.append({"quantity": name, "index": idx, "a": float(xa[idx]),
                         "b": float(xb[idx]), "abs_diff": float(gap[idx]), "detail": ""})
    return rows


def format_diff(rows: List[Dict[str, Any]], n_quantities: int) -> str:
    """Text of :func:`diff_traces` rows: the first quantity where the traces part, then the
    quantities downstream that differ too."""
    if not rows:
        return f"traces agree ({n_quantities} quantities)"
    first = rows[0]
    if first["index"] is None:
        lines = [f"first difference: {first['quantity']} ({first['detail']})"]
    else:
        lines = [f"first difference: {first['quantity']}{list(first['index'])}: "
                 f"A = {first['a']!r}, B = {first['b']!r} (|diff| {first['abs_diff']:.3g})"]
    if len(rows) > 1:
        lines.append("also differ downstream: " + ", ".join(r["quantity"] for r in rows[1:]))
    return "\n".join(lines)


#: Fields :func:`trace_update` fixes from its inputs (not taken from a trace's settings).
_FIXED = ("n_steps", "n_envs", "batch_size", "n_epochs", "net_arch")


def identify_trace(trace: Mapping[str, Any], reference: Optional[Mapping[str, Any]] = None, *,
                   rtol: float = 1e-9, atol: float = 1e-12, max_changes: int = 2
                   ) -> List[Dict[str, Any]]:
    """The convention changes under which ppo_ref's traced update equals ``trace``.

    ppo_ref's update is :func:`trace_update` on the ``inputs`` and ``settings`` of ``reference`` (a
    trace document, e.g. the reference trace the other implementation was given; default ``trace``
    itself). Every change of one option of :data:`ppo_ref.conventions.OPTIONS` to another of its
    values is tried, then (when none matches and ``max_changes >= 2``) every change of two; a change
    matches when :func:`diff_traces` of ``trace`` and ppo_ref's trace with it finds no difference.
    This is how a convention no function quantity shows is named, such as ``drop_truncated_steps``.

    Returns the matching changes, each ``{option name: value}``, the fewest options first;
    ``[{}]`` when ``trace`` already equals ppo_ref's trace with the unchanged settings; ``[]``
    when nothing matches. Raises ``ValueError`` when the documents lack ``inputs`` or
    ``settings`` or for ``max_changes`` not 1 or 2."""
    base_doc = trace if reference is None else reference
    if not (isinstance(base_doc, Mapping) and "inputs" in base_doc and "settings" in base_doc):
        raise ValueError("identify_trace needs trace documents with 'inputs' and 'settings' "
                         "(as trace_update writes them)")
    if max_changes not in (1, 2):
        raise ValueError(f"max_changes must be 1 or 2, got {max_changes!r}")
    base = PPOConfig.from_dict(dict(base_doc["settings"]))
    fields = {k: v for k, v in vars(base).items() if k not in _FIXED}

    def matches(changes: Dict[str, Any]) -> bool:
        try:
            ours = trace_update(inputs=base_doc["inputs"], **{**fields, **changes})
        except ValueError:  # a combination the config refuses
            return False
        return not diff_traces(ours, trace, rtol=rtol, atol=atol)

    if matches({}):
        return [{}]
    alternatives = [(o.name, v) for o in OPTIONS for v in o.values if v != fields[o.name]]
    for n in range(1, max_changes + 1):
        found = [dict(c) for c in itertools.combinations(alternatives, n)
                 if len({name for name, _ in c}) == n and matches(dict(c))]
        if found:
            return found
    return []
