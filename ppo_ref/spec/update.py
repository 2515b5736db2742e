"""The PPO update (the readable tier): minibatch loss, KL early stop, clipping + Adam, epochs.

Per minibatch (:func:`minibatch_loss`), with ``A`` the advantages (normalized per minibatch when
``config.normalize_advantage`` and ``config.advantage_norm_scope == "minibatch"``)::

    loss = policy_loss(new_log_probs, old_log_probs, A, clip_range)
         + vf_coef * value_loss_scale * value_loss(values, old_values, returns, clip_range_vf, mode)
         - ent_coef * mean(entropy)

and the gradients of ``loss`` with respect to ``new_log_probs``, ``entropy`` and ``values``,
which the policy's ``backward`` turns into parameter gradients. Then
``clip_by_global_norm(grads, max_grad_norm)`` and one ``adam_update`` step (:func:`run_epochs`).

KL early stop (``config.target_kl`` not None), the rule named by ``config.kl_stop_rule`` with
the estimator ``config.kl_estimator`` (:func:`ppo_ref.spec.losses.approx_kl`):

* ``"sb3"`` (Stable-Baselines3, the default): per minibatch, *before* its step; if
  ``approx_kl > 1.5 * target_kl`` that step is skipped and every remaining epoch stops.
* ``"cleanrl"`` (CleanRL ``ppo.py``): after each epoch, if the last minibatch's ``approx_kl``
  (computed before its step) ``> target_kl``, the remaining epochs stop.
* ``"thrust"`` (thrust-rl): per minibatch, *after* its step; if ``approx_kl > target_kl`` the
  rest of the current epoch is skipped; the next epoch starts as usual.
* ``"skrl"`` (skrl ``PPO._update``, skrl/agents/torch/ppo/ppo.py lines 381-389 at commit
  c29ced63): per minibatch, *before* its step (k3 estimate); if ``approx_kl > target_kl`` that
  step is skipped and the rest of the current epoch with it (``break`` out of the minibatch
  loop); the next epoch starts as usual.

Minibatches: :func:`row_minibatches` (feedforward: every epoch a permutation of the ``T*N``
rows, cut in chunks) and :func:`env_minibatches` (recurrent: a permutation of the envs, cut in
groups, so every minibatch holds whole ``[T]`` sequences).

Sources: Schulman et al. 2017 (arXiv:1707.06347) eq. 9; Huang et al. 2022, "The 37
Implementation Details of PPO" (minibatch advantage normalization, global gradient clipping,
early stopping); the implementations named above for the stop rules.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple

import numpy as np

from ppo_ref._checks import check_nonnegative
from ppo_ref.spec.losses import (approx_kl, entropy_loss, normalize_advantages, policy_loss,
                                 value_loss)
from ppo_ref.spec.optim import adam_update, clip_by_global_norm

__all__ = ["Minibatch", "MinibatchLoss", "minibatch_loss", "batch_advantages",
           "row_minibatches", "env_minibatches", "feedforward_minibatches",
           "recurrent_minibatches", "run_epochs", "epoch_loop",
           "effective_clip_range", "clip_options", "KL_STOP_RULES", "STATS_KEYS"]

KL_STOP_RULES = ("sb3", "cleanrl", "thrust", "skrl")

#: The keys of the stats dict returned by :func:`run_epochs`.
STATS_KEYS = ("policy_loss", "value_loss", "entropy", "loss", "approx_kl", "clip_fraction",
              "grad_norm", "n_epochs_run", "n_gradient_steps", "kl_stopped",
              "first_max_abs_log_ratio", "learning_rate", "clip_range")

# A linearly annealed clip range reaches exactly 0 on the last update (SB3 progress
# convention). ``policy_loss`` requires clip_range > 0; the smallest positive double clips
# identically (1 +- 5e-324 == 1 in float64), so it stands in for 0.
_TINY_CLIP = float(np.finfo(np.float64).tiny)


def effective_clip_range(clip_range: float) -> float:
    """``clip_range`` itself (a float), or the smallest positive float64 when it is 0 (the same
    clipping). Raises ``ValueError`` unless ``clip_range`` is a finite number >= 0."""
    clip_range = check_nonnegative(clip_range, "clip_range")
    return clip_range if clip_range > 0.0 else _TINY_CLIP


class Minibatch(NamedTuple):
    """One minibatch of the PPO update.

    ``old_log_probs``, ``advantages``, ``returns``, ``old_values``: float64 arrays of one shape
    (``[B]`` feedforward, ``[T * n]`` or ``[T, n]`` recurrent), the rollout's behaviour
    log-probs (nats), advantages (already batch-normalized if that scope is chosen),
    lambda-returns and values. ``data``: whatever the policy's ``evaluate`` needs
    (observations, actions, initial LSTM states, ...); opaque here. ``weights``: None, or
    per-row weights >= 0 of that shape (a 0/1 valid mask, as torchrl and Sample Factory): the
    loss means become weighted means (:func:`minibatch_loss`).
    """
    old_log_probs: np.ndarray
    advantages: np.ndarray
    returns: np.ndarray
    old_values: np.ndarray
    data: Any
    weights: Optional[np.ndarray] = None


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


def batch_advantages(advantages: np.ndarray, config) -> np.ndarray:
    """Advantages as the minibatches receive them: normalized over the whole batch when
    ``config.normalize_advantage`` and ``config.advantage_norm_scope == "batch"`` (thrust-rl's
    feedforward convention, with ``advantage_norm_ddof``, ``advantage_norm_eps`` and
    ``advantage_norm_eps_placement``), otherwise unchanged (float64)."""
    if config.normalize_advantage and config.advantage_norm_scope == "batch":
        return normalize_advantages(advantages, ddof=config.advantage_norm_ddof,
                                    eps=config.advantage_norm_eps,
                                    placement=config.advantage_norm_eps_placement)
    return np.asarray(advantages, dtype=np.float64)


def clip_options(config) -> dict:
    """The keyword options of :func:`ppo_ref.spec.losses.policy_loss` that ``config`` sets:
    ``clip_range_low``, ``clip_range_high``, ``clip_interval``, ``dual_clip``."""
    return {"clip_range_low": config.clip_range_low, "clip_range_high": config.clip_range_high,
            "clip_interval": config.clip_interval, "dual_clip": config.dual_clip}


def minibatch_loss(new_log_probs, entropy, values, old_log_probs, advantages, returns,
                   old_values, *, config, clip_range: float,
                   with_log_ratio: bool = True, weights=None) -> MinibatchLoss:
    """The PPO loss of one minibatch and its gradients w.r.t. the policy's outputs.

    Args:
        new_log_probs, entropy, values: the current policy's outputs for the minibatch rows
            (nats, nats, units of the returns), float arrays of one shape ``S``.
        old_log_probs, advantages, returns, old_values: the rollout's data for those rows,
            shape ``S``.
        config: a PPOConfig (``normalize_advantage``, ``advantage_norm_scope``,
            ``advantage_norm_ddof``, ``advantage_norm_eps``, ``advantage_norm_eps_placement``,
            ``vf_coef``, ``value_loss_scale``, ``value_loss_mode``, ``huber_delta``,
            ``clip_range_vf``, ``clip_range_low``, ``clip_range_high``, ``clip_interval``,
            ``dual_clip``, ``ent_coef``, ``kl_estimator``).
        clip_range: the current (possibly annealed) clip range, >= 0 (0 clips everything:
            :func:`effective_clip_range`).
        with_log_ratio: compute ``max_abs_log_ratio`` (nan when False; the epoch loop asks for
            it on the first minibatch only).
        weights: None, or per-row weights >= 0 of shape ``S`` (a 0/1 valid mask: torchrl,
            Sample Factory): the policy, value and entropy means, ``approx_kl`` and
            ``clip_fraction`` become ``sum(w * x) / sum(w)`` (and their gradients follow).
            Advantage normalization still uses every row; ``max_abs_log_ratio`` too.

    Returns:
        :class:`MinibatchLoss`: total ``loss`` and its parts (``entropy`` is the mean entropy),
        ``approx_kl`` with ``config.kl_estimator``, ``clip_fraction``, ``max_abs_log_ratio``
        (``max |new - old|``: 0 on the first minibatch of an update) and the gradients of
        ``loss``: ``d_log_probs``, ``d_entropy`` (``None`` when ``ent_coef == 0``: the term is
        absent), ``d_values``, each of shape ``S``.

    Raises:
        ValueError: from :mod:`ppo_ref.spec.losses` (shape mismatch, non-finite input,
            overflow), or the total loss or the scaled ``d_values`` overflows float64.
    """
    adv = np.asarray(advantages, dtype=np.float64)
    if config.normalize_advantage and config.advantage_norm_scope == "minibatch":
        adv = normalize_advantages(adv, ddof=config.advantage_norm_ddof,
                                   eps=config.advantage_norm_eps,
                                   placement=config.advantage_norm_eps_placement)
    p_loss, d_log_probs, info = policy_loss(new_log_probs, old_log_probs, adv,
                                            effective_clip_range(clip_range),
                                            weights=weights, **clip_options(config))
    v_loss, d_values = value_loss(values, old_values, returns, config.clip_range_vf,
                                  mode=config.value_loss_mode, huber_delta=config.huber_delta,
                                  weights=weights)
    v_scale = float(config.vf_coef) * float(config.value_loss_scale)
    ent_coef = float(config.ent_coef)
    e_loss, d_entropy = entropy_loss(entropy, weights=weights)
    # with ent_coef 0 the entropy term is absent from the loss (its value is still reported)
    d_entropy = d_entropy * ent_coef if ent_coef != 0.0 else None
    total = p_loss + v_scale * v_loss + ent_coef * e_loss
    if config.kl_estimator == "k3":
        kl = info["approx_kl"]
    else:
        kl = approx_kl(old_log_probs, new_log_probs, config.kl_estimator, weights=weights)
    with np.errstate(over="ignore", invalid="ignore"):
        d_values = d_values * v_scale
    if not (math.isfinite(total) and np.isfinite(d_values).all()):
        raise total_loss_overflow_error()
    if with_log_ratio:
        max_abs_log_ratio = float(np.max(np.abs(np.asarray(new_log_probs)
                                                - np.asarray(old_log_probs))))
    else:
        max_abs_log_ratio = math.nan
    return MinibatchLoss(
        loss=float(total), policy_loss=float(p_loss), value_loss=float(v_loss),
        entropy=-float(e_loss), approx_kl=float(kl), clip_fraction=float(info["clip_fraction"]),
        max_abs_log_ratio=max_abs_log_ratio, d_log_probs=d_log_probs, d_entropy=d_entropy,
        d_values=d_values)


def total_loss_overflow_error() -> ValueError:
    """The error for a total minibatch loss (or its value gradient) that overflows float64
    while each of its parts is finite."""
    return ValueError("the total loss policy_loss + vf_coef * value_loss_scale * value_loss + "
                      "ent_coef * entropy_loss (or its gradient w.r.t. values) overflows "
                      "float64: config.vf_coef or config.ent_coef too large for these values")


def row_minibatches(rng: np.random.Generator, n_rows: int, batch_size: int) -> List[np.ndarray]:
    """One epoch's minibatches of rows: ``rng.permutation(n_rows)`` cut into chunks of
    ``batch_size`` (the last chunk smaller when ``batch_size`` does not divide ``n_rows``, as
    in SB3). Every row appears in exactly one chunk. One call of ``rng.permutation`` per epoch:
    the draws of the feedforward trainer (``ppo_ref.train.ppo``), SB3's ``RolloutBuffer.get`` and
    CleanRL's ``b_inds`` shuffle."""
    if n_rows < 1 or batch_size < 1:
        raise ValueError(f"n_rows and batch_size must be >= 1, got {n_rows}, {batch_size}")
    perm = rng.permutation(n_rows)
    return [perm[i:i + batch_size] for i in range(0, n_rows, batch_size)]


def env_minibatches(rng: np.random.Generator, n_envs: int, per_minibatch: int) -> List[np.ndarray]:
    """One epoch's env groups for a recurrent update: ``rng.permutation(n_envs)`` cut into
    chunks of ``per_minibatch`` envs, each minibatch the whole ``[T]`` sequences of its envs
    (sb3-contrib and CleanRL ``ppo_atari_lstm.py`` split by env so that an LSTM replays whole
    sequences). Every env appears in exactly one group; ``n_envs`` must be a multiple of
    ``per_minibatch``. One call of ``rng.permutation`` per epoch (the recurrent trainer's
    draws)."""
    if per_minibatch < 1 or n_envs % per_minibatch != 0:
        raise ValueError(f"per_minibatch ({per_minibatch}) must be >= 1 and divide "
                         f"n_envs ({n_envs})")
    perm = rng.permutation(n_envs)
    return [perm[i:i + per_minibatch] for i in range(0, n_envs, per_minibatch)]


def feedforward_minibatches(rng: np.random.Generator, batch_size: int, old_log_probs,
                            advantages, returns, old_values, observations, actions):
    """The feedforward update's minibatches: ``minibatches(epoch)`` for :func:`run_epochs`.

    Each epoch draws :func:`row_minibatches` over the ``B = T * N`` rows (flattened time-major:
    row ``t * N + n``) and yields, per chunk of rows, a :class:`Minibatch` of those rows with
    ``data = (observations[rows], actions[rows])``. Arrays: ``[B]`` (``observations [B, D]``,
    ``actions [B, ...]``)."""
    def per_epoch(epoch: int):
        for rows in row_minibatches(rng, len(old_log_probs), batch_size):
            yield Minibatch(old_log_probs[rows], advantages[rows], returns[rows],
                            old_values[rows], (observations[rows], actions[rows]))
    return per_epoch


def recurrent_minibatches(rng: np.random.Generator, envs_per_minibatch: int, old_log_probs,
                          advantages, returns, old_values, observations, actions,
                          initial_states, episode_starts):
    """The recurrent update's minibatches: ``minibatches(epoch)`` for :func:`run_epochs`.

    Each epoch permutes the envs and cuts them into groups (:func:`env_minibatches`); a group's
    minibatch is its envs' whole ``[T, n]`` sequences, replayed by the policy from the LSTM
    states they had at the rollout's start (``initial_states.select(envs)``) with their stored
    ``episode_starts``: ``data = (observations[:, envs], actions[:, envs], states,
    episode_starts[:, envs])``. The loss sees the group's rows flattened (row ``t * n + j``).
    Arrays are ``[T, N, ...]``; ``initial_states`` has ``select(envs)``."""
    def per_epoch(epoch: int):
        for envs in env_minibatches(rng, old_log_probs.shape[1], envs_per_minibatch):
            yield Minibatch(old_log_probs[:, envs].reshape(-1), advantages[:, envs].reshape(-1),
                            returns[:, envs].reshape(-1), old_values[:, envs].reshape(-1),
                            (observations[:, envs], actions[:, envs],
                             initial_states.select(envs), episode_starts[:, envs]))
    return per_epoch


EvaluateFn = Callable[[Dict[str, np.ndarray], Any], Tuple[np.ndarray, np.ndarray, np.ndarray, Any]]
BackwardFn = Callable[[Dict[str, np.ndarray], Any, np.ndarray, Optional[np.ndarray], np.ndarray],
                      Dict[str, np.ndarray]]


def run_epochs(params: Dict[str, np.ndarray], adam_state: dict, *, config, lr: float,
               clip_range: float, minibatches: Callable[[int], Iterable[Minibatch]],
               evaluate: EvaluateFn, backward: BackwardFn) -> Tuple[dict, dict, Dict[str, float]]:
    """Run up to ``config.n_epochs`` epochs of PPO minibatch steps on plain dicts.

    Every step is :func:`minibatch_loss`, ``backward``, ``clip_by_global_norm(grads,
    config.max_grad_norm)`` and ``adam_update(params, clipped, adam_state, lr=lr,
    eps=config.adam_eps)`` (:mod:`ppo_ref.spec.optim`), each making new dicts; the epochs and
    the KL stop rules are :func:`epoch_loop`.

    Args:
        params, adam_state: current parameters ``{name: float array}`` and Adam state (from
            ``adam_init``); never modified (new ones are returned).
        config: PPOConfig (loss knobs, ``n_epochs``, ``max_grad_norm``, ``adam_eps``,
            ``target_kl``, ``kl_stop_rule``).
        lr, clip_range: this update's (possibly annealed) learning rate and clip range.
        minibatches: ``minibatches(epoch) -> iterable of Minibatch`` (called once per epoch, in
            order; the caller owns the shuffling generator).
        evaluate: ``evaluate(params, data) -> (new_log_probs, entropy, values, cache)``.
        backward: ``backward(params, cache, d_log_probs, d_entropy, d_values) -> grads``
            (``d_entropy`` may be ``None``: zero).

    Returns:
        ``(params, adam_state, stats)``; ``stats`` holds the means over the evaluated
        minibatches of ``policy_loss``, ``value_loss``, ``entropy``, ``loss``, ``approx_kl``,
        ``clip_fraction``; ``grad_norm`` (mean pre-clip global norm over the steps taken, nan
        when none); ``n_epochs_run`` (epochs in which a minibatch was evaluated),
        ``n_gradient_steps``, ``kl_stopped`` (1.0 if the KL rule fired),
        ``first_max_abs_log_ratio`` (``max |new - old|`` on the first minibatch: 0 when the
        policy reproduces the behaviour log-probs), ``learning_rate``, ``clip_range``
        (:data:`STATS_KEYS`).

    Raises:
        FloatingPointError: a non-finite gradient norm (nothing of that step is applied).
        ValueError: an unknown ``config.kl_stop_rule``; bad inputs, from the losses and Adam.
    """
    max_norm, eps = config.max_grad_norm, config.adam_eps

    def step(params, grads, adam_state):
        clipped, norm = clip_by_global_norm(grads, max_norm)
        params, adam_state = adam_update(params, clipped, adam_state, lr=lr, eps=eps)
        return params, adam_state, norm

    return epoch_loop(params, adam_state, config=config, lr=lr, clip_range=clip_range,
                      minibatches=minibatches, evaluate=evaluate, backward=backward,
                      loss=minibatch_loss, step=step)


def epoch_loop(params, adam_state, *, config, lr: float, clip_range: float, minibatches,
               evaluate, backward, loss, step) -> Tuple[Any, dict, Dict[str, float]]:
    """The epochs of one PPO update, with the minibatch loss and the optimizer step given.

    ``loss`` has the signature and results of :func:`minibatch_loss`; ``step(params, grads,
    adam_state) -> (params, adam_state, norm)`` clips the gradients by their global norm
    (``norm``: before clipping) and takes one Adam step. :func:`run_epochs` passes the spec
    functions; the fast update (``ppo_ref.fast.update.run_epochs``) passes its compiled ones, so
    the epochs, the KL stop rules and the stats are this one loop in both tiers. Arguments
    and results otherwise as :func:`run_epochs`.
    """
    target_kl = config.target_kl
    rule = config.kl_stop_rule
    if rule not in KL_STOP_RULES:
        raise ValueError(f"config.kl_stop_rule must be one of {list(KL_STOP_RULES)}, got {rule!r}")
    sums = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "loss": 0.0,
            "approx_kl": 0.0, "clip_fraction": 0.0}
    n_evaluated = 0
    grad_norm_sum = 0.0
    n_steps = 0
    epochs_run = 0
    kl_stopped = False
    first_log_ratio = math.nan
    for epoch in range(int(config.n_epochs)):
        last_kl = None
        evaluated_this_epoch = False
        for mb in minibatches(epoch):
            new_log_probs, entropy, values, cache = evaluate(params, mb.data)
            out = loss(new_log_probs, entropy, values, mb.old_log_probs, mb.advantages,
                       mb.returns, mb.old_values, config=config, clip_range=clip_range,
                       with_log_ratio=n_evaluated == 0, weights=mb.weights)
            if n_evaluated == 0:
                first_log_ratio = out.max_abs_log_ratio
            n_evaluated += 1
            evaluated_this_epoch = True
            for key in sums:
                sums[key] += getattr(out, key)
            last_kl = out.approx_kl
            if target_kl is not None and rule == "sb3" and out.approx_kl > 1.5 * target_kl:
                kl_stopped = True
                break  # this minibatch's step is skipped, and every remaining epoch
            if target_kl is not None and rule == "skrl" and out.approx_kl > target_kl:
                kl_stopped = True
                break  # this minibatch's step is skipped, and the rest of this epoch only
            grads = backward(params, cache, out.d_log_probs, out.d_entropy, out.d_values)
            params, adam_state, norm = step(params, grads, adam_state)
            grad_norm_sum += norm
            n_steps += 1
            if target_kl is not None and rule == "thrust" and out.approx_kl > target_kl:
                kl_stopped = True
                break  # leaves only this epoch
        if evaluated_this_epoch:
            epochs_run += 1
        if kl_stopped and rule == "sb3":
            break
        if (target_kl is not None and rule == "cleanrl" and last_kl is not None
                and last_kl > target_kl):
            kl_stopped = True
            break
    denom = max(n_evaluated, 1)
    stats = {key: value / denom for key, value in sums.items()}
    stats.update({
        "grad_norm": grad_norm_sum / n_steps if n_steps else math.nan,
        "n_epochs_run": float(epochs_run),
        "n_gradient_steps": float(n_steps),
        "kl_stopped": float(kl_stopped),
        "first_max_abs_log_ratio": first_log_ratio,
        "learning_rate": float(lr),
        "clip_range": float(clip_range),
    })
    return params, adam_state, stats
