"""The PPO update: minibatch loss, KL early stop, clipping + Adam, epochs, minibatches.

The algorithm's steps, run as written under both backends: the trainers pass their tier's loss
and optimizer modules (``losses=``, ``optim=``: :mod:`ppo_ref.spec` or the compiled twins in
:mod:`ppo_ref.fast`), which supply the leaf computations.

Sources: Schulman et al. 2017 (arXiv:1707.06347) eq. 9; Huang et al. 2022, "The 37
Implementation Details of PPO" (minibatch advantage normalization, global gradient clipping,
early stopping); the implementations named at :func:`run_epochs` for the stop rules.
"""
from __future__ import annotations

import math
from types import ModuleType
from typing import Any, Callable, Dict, Iterable, NamedTuple, Optional, Tuple

import numpy as np

from ppo_ref._checks import check_nonnegative
from ppo_ref.spec import losses as spec_losses
from ppo_ref.spec import optim as spec_optim

__all__ = ["Minibatch", "MinibatchLoss", "minibatch_loss", "batch_advantages",
           "normalized_advantages",
           "feedforward_minibatches", "recurrent_minibatches", "run_epochs",
           "effective_clip_range", "aggregation_weights", "truncation_weights",
           "KL_STOP_RULES", "LOSS_AGGREGATIONS", "STATS_KEYS"]

KL_STOP_RULES = ("sb3", "cleanrl", "thrust", "skrl")
#: How the minibatch loss reduces its per-row terms (:func:`aggregation_weights`; the reference
#: first; the names are verl's ``loss_agg_mode``).
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "token-sum", "seq-mean-token-sum",
                     "seq-mean-token-sum-norm")

#: The keys of the stats dict returned by :func:`run_epochs`.
STATS_KEYS = ("policy_loss", "value_loss", "entropy", "loss", "approx_kl", "clip_fraction",
              "grad_norm", "n_epochs_run", "n_gradient_steps", "kl_stopped",
              "first_max_abs_log_ratio", "learning_rate", "clip_range")

_MEANS = ("policy_loss", "value_loss", "entropy", "loss", "approx_kl", "clip_fraction")

# A linearly annealed clip range reaches 0 on the last update; policy_loss requires > 0, and
# the smallest positive normal double, finfo(float64).tiny = 2**-1022 (about 2.2e-308), clips
# identically (1 +- 2**-1022 == 1), so it stands in for 0.
_TINY_CLIP = float(np.finfo(np.float64).tiny)


def effective_clip_range(clip_range: float) -> float:
    """``clip_range`` as a float, or ``finfo(float64).tiny`` for 0. Raises ``ValueError``
    naming ``clip_range`` unless it is a finite real number >= 0."""
    clip_range = check_nonnegative(clip_range, "clip_range")
    return clip_range if clip_range > 0.0 else _TINY_CLIP


class Minibatch(NamedTuple):
    """One minibatch: the rollout's ``old_log_probs`` (nats), ``advantages``, ``returns`` and
    ``old_values``, float64 ``[B]`` (recurrent: the group's ``[T, n]`` rows flattened, row
    ``t * n + j``); ``data``, opaque, what the policy's ``evaluate`` reads; ``weights``, None
    or per-row weights >= 0 (a 0/1 valid mask) for weighted loss means; ``sequences``, None
    (the minibatch is one sequence) or the int64 ``[B]`` sequence index of every row (recurrent:
    the env, ``j``), read by the sequence aggregations (:func:`aggregation_weights`)."""
    old_log_probs: np.ndarray
    advantages: np.ndarray
    returns: np.ndarray
    old_values: np.ndarray
    data: Any
    weights: Optional[np.ndarray] = None
    sequences: Optional[np.ndarray] = None


class MinibatchLoss(NamedTuple):
    """Scalars and gradients of one minibatch loss (see :func:`minibatch_loss`)."""
    loss: float
    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clip_fraction: float
    max_abs_log_ratio: float
    d_log_probs: np.ndarray
    d_entropy: Optional[np.ndarray]
    d_values: np.ndarray


def normalized_advantages(advantages, config, losses: ModuleType = spec_losses) -> np.ndarray:
    """``losses.normalize_advantages`` of ``advantages`` with the config's settings
    (``advantage_norm_ddof``, ``_eps``, ``_eps_placement``, ``_single_element``), whatever
    ``advantage_norm_scope`` and ``normalize_advantage`` say (the callers decide)."""
    return losses.normalize_advantages(advantages, ddof=config.advantage_norm_ddof,
                                       eps=config.advantage_norm_eps,
                                       placement=config.advantage_norm_eps_placement,
                                       single_element=config.advantage_norm_single_element)


def batch_advantages(advantages: np.ndarray, config, losses: ModuleType = spec_losses
                     ) -> np.ndarray:
    """The advantages as the minibatches receive them, float64: normalized over the whole
    batch when ``config.normalize_advantage`` and ``advantage_norm_scope == "batch"``
    (thrust-rl, feedforward), otherwise unchanged."""
    advantages = np.asarray(advantages, dtype=np.float64)
    if config.normalize_advantage and config.advantage_norm_scope == "batch":
        return normalized_advantages(advantages, config, losses)
    return advantages


def truncation_weights(terminated, truncated, drop_truncated: bool) -> Optional[np.ndarray]:
    """The per-row loss weights that drop truncated steps (``PPOConfig.drop_truncated_steps``)::

        w[t, n] = 0   if truncated[t, n] and not terminated[t, n]
                = 1   otherwise

    A dropped step is the step whose transition the env cut by a time limit (the rollout's
    ``truncated[t, n]``: ``s_{t+1}`` is ``final_obs``, not a successor the policy reached by
    ending the episode); a step both terminated and truncated ended the episode and is kept,
    as is every step of the episode before the cut. The dropped steps take no part in any loss
    mean, gradient, ``approx_kl`` or ``clip_fraction``; they still enter the advantage
    computation of the earlier steps (as ``truncation`` says) and the advantage normalization.
    A minibatch whose every row is dropped has no loss: :func:`run_epochs` skips it.
    ``terminated``, ``truncated``: bool arrays of one shape (the rollout's ``[T, N]``). Returns
    None when ``drop_truncated`` is False (every row weighs 1), else float64 weights of that
    shape. Raises ``ValueError`` when the shapes differ.
    """
    if not drop_truncated:
        return None
    term, trunc = np.asarray(terminated, dtype=bool), np.asarray(truncated, dtype=bool)
    if term.shape != trunc.shape:
        raise ValueError(f"truncated must have the shape of terminated {term.shape}, got "
                         f"{trunc.shape}")
    return np.where(trunc & ~term, 0.0, 1.0)


def aggregation_weights(aggregation: str, n_rows: int, weights=None, sequences=None,
                        norm: Optional[float] = None) -> Tuple[Optional[np.ndarray], float]:
    """The weights ``w`` and the factor ``f`` with which the losses (each ``sum_i w_i x_i /
    sum_i w_i``, :mod:`ppo_ref.spec.losses`) give the aggregation of the per-row terms ``x``.

    With ``m_i`` the row weights (``weights``, 1 when None), ``s_i`` the sequence of row i
    (``sequences``; None: one sequence), ``n_b = sum_{s_i = b} m_i``, ``B`` the sequences with
    ``n_b > 0`` and ``N = sum_i m_i``::

        aggregation                loss                                   w            f
        "token-mean"               sum_i m_i x_i / N                      m            1
        "seq-mean-token-mean"      (1/B) sum_b sum_{s_i=b} m_i x_i / n_b  m_i / n_b    1
        "token-sum"                sum_i m_i x_i                          m            N
        "seq-mean-token-sum"       sum_i m_i x_i / B                      m            N / B
        "seq-mean-token-sum-norm"  sum_i m_i x_i / norm                   m            N / norm

    (the names of verl's ``loss_agg_mode``; TRL's masked mean is token-mean; Dr. GRPO divides
    by a constant).
    ``norm`` > 0 or None: the row count of the longest sequence (weights not counted).
    ``n_rows``: the minibatch's rows. Returns ``(w, f)``: ``w`` None (every row 1) or float64
    ``[n_rows]``; ``f`` a Python float (exactly 1.0 for the means). Raises ``ValueError`` for
    an unknown ``aggregation``, ``weights`` or ``sequences`` not of ``n_rows`` entries, a
    negative weight, weights summing to 0, or ``norm`` not > 0.
    """
    if aggregation not in LOSS_AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {list(LOSS_AGGREGATIONS)}, got "
                         f"{aggregation!r}")
    if norm is not None and not (isinstance(norm, (int, float)) and norm > 0):
        raise ValueError(f"norm must be > 0 or None, got {norm!r}")
    if aggregation == "token-mean":
        return weights, 1.0
    m = np.ones(n_rows) if weights is None else np.asarray(weights, dtype=np.float64).ravel()
    seq = (np.zeros(n_rows, dtype=np.int64) if sequences is None
           else np.asarray(sequences).ravel().astype(np.int64))
    if m.size != n_rows or seq.size != n_rows:
        raise ValueError(f"weights and sequences must have {n_rows} entries (one per row), got "
                         f"{m.size} and {seq.size}")
    if np.any(m < 0):
        raise ValueError("weights must be >= 0 (a mask of 0/1 or per-row weights)")
    labels, index = np.unique(seq, return_inverse=True)
    per_sequence = np.zeros(labels.size)
    np.add.at(per_sequence, index, m)
    total = float(np.sum(m))
    if not total > 0.0:
        raise ValueError(f"weights must have a positive sum, got {total}")
    if aggregation == "seq-mean-token-mean":
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.where(m > 0, m / per_sequence[index], 0.0)
        return w, 1.0
    if aggregation == "token-sum":
        return weights, total
    if aggregation == "seq-mean-token-sum":
        return weights, total / float(np.count_nonzero(per_sequence > 0))
    if norm is None:
        norm = float(np.max(np.bincount(index)))
    return weights, total / float(norm)


def minibatch_loss(new_log_probs, entropy, values, old_log_probs, advantages, returns,
                   old_values, *, config, clip_range: float, with_log_ratio: bool = True,
                   weights=None, losses: ModuleType = spec_losses,
                   sequences=None) -> MinibatchLoss:
    """The PPO loss of one minibatch (Schulman et al. 2017, eq. 9, negated to be minimized)::

        loss = f * ( policy_loss(new_log_probs, old_log_probs, A, clip_range; w)
                     + vf_coef * value_loss_scale * value_loss(values, old_values, returns; w)
                     + ent_coef * entropy_loss(entropy; w) )

    with the tier's ``losses`` (:mod:`~ppo_ref.spec.losses`), ``A`` the advantages
    (normalized here when ``config.normalize_advantage`` and ``advantage_norm_scope ==
    "minibatch"``), and ``(w, f)`` = :func:`aggregation_weights` of ``config.loss_aggregation``
    (token-mean: ``w = weights``, ``f = 1``, the plain weighted means), and the gradients of
    ``loss`` in the policy's outputs ``new_log_probs``, ``entropy``, ``values`` (float arrays
    of one shape ``S``, like the rollout's data). ``config``: a PPOConfig (its loss fields);
    ``clip_range``: the current clip range >= 0 (0 clips everything); ``with_log_ratio``:
    compute ``max_abs_log_ratio`` (else nan); ``weights``: None or per-row weights >= 0 of
    shape ``S`` (advantage normalization still uses every row); ``sequences``: None or the
    sequence index of every row (:class:`Minibatch`).

    Returns :class:`MinibatchLoss`: ``loss`` and its aggregated parts ``policy_loss``,
    ``value_loss``; ``entropy`` (the mean entropy under ``w``), ``approx_kl``
    (``config.kl_estimator``) and ``clip_fraction`` (means under ``w``, not scaled by ``f``),
    ``max_abs_log_ratio`` (``max |new - old|``) and the gradients ``d_log_probs``,
    ``d_entropy`` (None when ``ent_coef == 0``), ``d_values``. Raises ``ValueError`` from the
    losses or :func:`aggregation_weights`, or when the total overflows.
    """
    if config.normalize_advantage and config.advantage_norm_scope == "minibatch":
        advantages = normalized_advantages(advantages, config, losses)
    weights, factor = aggregation_weights(config.loss_aggregation, np.size(new_log_probs),
                                          weights, sequences, config.loss_aggregation_norm)
    p_loss, d_log_probs, info = losses.policy_loss(
        new_log_probs, old_log_probs, advantages, effective_clip_range(clip_range),
        clip_range_low=config.clip_range_low, clip_range_high=config.clip_range_high,
        clip_interval=config.clip_interval, dual_clip=config.dual_clip, weights=weights,
        clip_fraction_mode=config.clip_fraction_mode)
    v_loss, d_values = losses.value_loss(values, old_values, returns, config.clip_range_vf,
                                         mode=config.value_loss_mode,
                                         huber_delta=config.huber_delta, weights=weights,
                                         boundary_grad=config.value_clip_boundary_grad)
    e_loss, d_entropy = losses.entropy_loss(entropy, weights=weights)
    mean_entropy = -float(e_loss)
    if factor != 1.0:
        p_loss, v_loss, e_loss = factor * p_loss, factor * v_loss, factor * e_loss
        d_log_probs, d_values, d_entropy = (factor * d_log_probs, factor * d_values,
                                            factor * d_entropy)
    v_scale = float(config.vf_coef) * float(config.value_loss_scale)
    ent_coef = float(config.ent_coef)
    total = p_loss + v_scale * v_loss + ent_coef * e_loss
    with np.errstate(over="ignore", invalid="ignore"):
        d_values = d_values * v_scale
    if not (math.isfinite(total) and np.isfinite(d_values).all()):
        raise ValueError("the total loss policy_loss + vf_coef * value_loss_scale * value_loss "
                         "+ ent_coef * entropy_loss (or its gradient w.r.t. values) overflows "
                         "float64: config.vf_coef or config.ent_coef too large for these values")
    if config.kl_estimator == "k3":
        kl = info["approx_kl"]
    else:
        kl = losses.approx_kl(old_log_probs, new_log_probs, config.kl_estimator, weights=weights)
    max_abs_log_ratio = math.nan
    if with_log_ratio:
        max_abs_log_ratio = float(np.max(np.abs(np.asarray(new_log_probs, dtype=np.float64)
                                                - old_log_probs)))
    return MinibatchLoss(
        loss=float(total), policy_loss=float(p_loss), value_loss=float(v_loss),
        entropy=mean_entropy, approx_kl=float(kl), clip_fraction=float(info["clip_fraction"]),
        max_abs_log_ratio=max_abs_log_ratio, d_log_probs=d_log_probs,
        d_entropy=d_entropy * ent_coef if ent_coef != 0.0 else None, d_values=d_values)


def feedforward_minibatches(rng: np.random.Generator, batch_size: int, old_log_probs,
                            advantages, returns, old_values, observations, actions,
                            weights=None):
    """The feedforward update's ``minibatches(epoch)`` for :func:`run_epochs` (SB3
    ``RolloutBuffer.get``, CleanRL ``b_inds``): each epoch one ``rng.permutation(B)`` of the
    ``B = T * N`` time-major rows, cut into chunks of ``batch_size`` (the last one smaller if
    it does not divide), each a :class:`Minibatch` with ``data = (observations[rows],
    actions[rows])`` and ``weights[rows]`` (None: None; e.g. :func:`truncation_weights`
    flattened); each minibatch is one sequence. Arrays: ``[B]``, ``observations [B, D]``,
    ``actions [B, ...]``."""
    n_rows = len(old_log_probs)

    def per_epoch(epoch: int):
        perm = rng.permutation(n_rows)
        for i in range(0, n_rows, batch_size):
            rows = perm[i:i + batch_size]
            yield Minibatch(old_log_probs[rows], advantages[rows], returns[rows],
                            old_values[rows], (observations.take(rows, axis=0),
                                               actions.take(rows, axis=0)),
                            None if weights is None else weights[rows])
    return per_epoch


def recurrent_minibatches(rng: np.random.Generator, envs_per_minibatch: int, old_log_probs,
                          advantages, returns, old_values, observations, actions,
                          initial_states, episode_starts, weights=None):
    """The recurrent update's ``minibatches(epoch)`` for :func:`run_epochs` (sb3-contrib,
    CleanRL ``ppo_atari_lstm``: split by env): each epoch one ``rng.permutation(N)`` of the
    envs, cut into groups of ``envs_per_minibatch`` (which divides N); a group's whole ``[T,
    n]`` sequences, replayed from their LSTM states at the rollout's start: ``data =
    (observations[:, envs], actions[:, envs], initial_states.select(envs), episode_starts[:,
    envs])``, rows flattened ``t * n + j``, with ``weights[:, envs]`` flattened alike (None:
    None) and ``sequences`` ``j`` (each env's column is one sequence). Arrays are ``[T, N,
    ...]``."""
    n_steps, n_envs = old_log_probs.shape[:2]

    def per_epoch(epoch: int):
        perm = rng.permutation(n_envs)
        for i in range(0, n_envs, envs_per_minibatch):
            envs = perm[i:i + envs_per_minibatch]
            lp, adv, ret, v, obs, act, starts = (x.take(envs, axis=1) for x in (
                old_log_probs, advantages, returns, old_values, observations, actions,
                episode_starts))
            w = None if weights is None else weights.take(envs, axis=1).reshape(-1)
            yield Minibatch(lp.reshape(-1), adv.reshape(-1), ret.reshape(-1), v.reshape(-1),
                            (obs, act, initial_states.select(envs), starts), w,
                            np.tile(np.arange(len(envs)), n_steps))
    return per_epoch


EvaluateFn = Callable[[Dict[str, np.ndarray], Any], Tuple[np.ndarray, np.ndarray, np.ndarray, Any]]
BackwardFn = Callable[[Dict[str, np.ndarray], Any, np.ndarray, Optional[np.ndarray], np.ndarray],
                      Dict[str, np.ndarray]]


def run_epochs(params: Dict[str, np.ndarray], adam_state: dict, *, config, lr: float,
               clip_range: float, minibatches: Callable[[int], Iterable[Minibatch]],
               evaluate: EvaluateFn, backward: BackwardFn, losses: ModuleType = spec_losses,
               optim: ModuleType = spec_optim) -> Tuple[dict, dict, Dict[str, float]]:
    """Up to ``config.n_epochs`` epochs of PPO minibatch steps.

    Each step: ``evaluate`` the minibatch, :func:`minibatch_loss`, the KL stop rule,
    ``backward``, then ``optim.clip_by_global_norm(grads, config.max_grad_norm)`` and
    ``optim.adam_update(params, clipped, adam_state, lr=lr, eps=config.adam_eps)``. A
    minibatch whose ``weights`` are all 0 (e.g. every row a dropped truncated step) has no
    loss: it is skipped (not evaluated, no step, not in the stats or the KL rules). KL stop
    rules (``config.target_kl`` not None; ``config.kl_stop_rule``, with ``approx_kl`` of
    ``config.kl_estimator``):

    * ``"sb3"`` (Stable-Baselines3, default): per minibatch, before its step; if ``approx_kl >
      1.5 * target_kl`` the step is skipped and every remaining epoch stops.
    * ``"cleanrl"`` (CleanRL ``ppo.py``): after each epoch, if the last minibatch's
      ``approx_kl > target_kl``, the remaining epochs stop.
    * ``"thrust"`` (thrust-rl): per minibatch, after its step; if ``approx_kl > target_kl`` the
      rest of the epoch is skipped.
    * ``"skrl"`` (skrl ``PPO._update``): per minibatch, before its step; if ``approx_kl >
      target_kl`` the step and the rest of the epoch are skipped.

    ``params`` (``{name: float64 array}``) and ``adam_state`` are never modified (new ones are
    returned); ``config``: a PPOConfig; ``lr``, ``clip_range``: this update's values;
    ``minibatches(epoch)``: an iterable of :class:`Minibatch`, called once per epoch;
    ``evaluate(params, data) -> (new_log_probs, entropy, values, cache)``; ``backward(params,
    cache, d_log_probs, d_entropy, d_values) -> grads`` (``d_entropy`` None: zero); ``losses``,
    ``optim``: the tier's modules.

    Returns ``(params, adam_state, stats)``; ``stats`` (:data:`STATS_KEYS`): the means over
    the evaluated minibatches of ``policy_loss``, ``value_loss``, ``entropy``, ``loss``,
    ``approx_kl``, ``clip_fraction``; ``grad_norm`` (mean pre-clip norm over the steps taken,
    nan when none); ``n_epochs_run`` (epochs with an evaluated minibatch), ``n_gradient_steps``,
    ``kl_stopped`` (1.0 if a rule fired), ``first_max_abs_log_ratio`` (on the first minibatch:
    0 when the policy reproduces the behaviour log-probs), ``learning_rate``, ``clip_range``.
    Raises ``FloatingPointError`` (a non-finite gradient norm or compiled result, naming the
    epoch and minibatch; nothing of that step is applied) and ``ValueError`` from the losses.
    """
    target_kl, rule = config.target_kl, config.kl_stop_rule
    sums = dict.fromkeys(_MEANS, 0.0)
    n_evaluated = n_steps = epochs_run = 0
    grad_norm_sum = 0.0
    kl_stopped = False
    first_log_ratio = math.nan
    for epoch in range(int(config.n_epochs)):
        last_kl = None
        for j, mb in enumerate(minibatches(epoch)):
            if mb.weights is not None and not np.any(mb.weights > 0):
                continue  # no row carries loss: no loss, no step
            try:
                new_log_probs, entropy, values, cache = evaluate(params, mb.data)
                out = minibatch_loss(new_log_probs, entropy, values, mb.old_log_probs,
                                     mb.advantages, mb.returns, mb.old_values, config=config,
                                     clip_range=clip_range, with_log_ratio=n_evaluated == 0,
                                     weights=mb.weights, losses=losses,
                                     sequences=mb.sequences)
                if n_evaluated == 0:
                    first_log_ratio = out.max_abs_log_ratio
                n_evaluated += 1
                for key in _MEANS:
                    sums[key] += getattr(out, key)
                last_kl = out.approx_kl
                if target_kl is not None and (
                        (rule == "sb3" and out.approx_kl > 1.5 * target_kl)
                        or (rule == "skrl" and out.approx_kl > target_kl)):
                    kl_stopped = True
                    break  # this minibatch's step is skipped (and, for sb3, every later epoch)
                grads = backward(params, cache, out.d_log_probs, out.d_entropy, out.d_values)
                clipped, norm = optim.clip_by_global_norm(grads, config.max_grad_norm)
                params, adam_state = optim.adam_update(params, clipped, adam_state, lr=lr,
                                                       eps=config.adam_eps)
                del cache, grads, clipped  # (a tier may then reuse their arrays)
            except FloatingPointError as exc:
                raise FloatingPointError(f"epoch {epoch}, minibatch {j}: {exc}") from None
            grad_norm_sum += norm
            n_steps += 1
            if target_kl is not None and rule == "thrust" and out.approx_kl > target_kl:
                kl_stopped = True
                break  # leaves only this epoch
        if last_kl is not None:
            epochs_run += 1
        if kl_stopped and rule == "sb3":
            break
        if (target_kl is not None and rule == "cleanrl" and last_kl is not None
                and last_kl > target_kl):
            kl_stopped = True
            break
    stats = {key: value / max(n_evaluated, 1) for key, value in sums.items()}
    stats.update({
        "grad_norm": grad_norm_sum / n_steps if n_steps else math.nan,
        "n_epochs_run": float(epochs_run), "n_gradient_steps": float(n_steps),
        "kl_stopped": float(kl_stopped), "first_max_abs_log_ratio": first_log_ratio,
        "learning_rate": float(lr), "clip_range": float(clip_range),
    })
    return params, adam_state, stats
