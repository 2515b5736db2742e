"""The PPO update, written once: minibatch loss, KL early stop, clipping + Adam, the epoch loop.

Every trainer in ``ppo_ref`` (feedforward, recurrent, the actor-learner's learner) calls
:func:`run_epochs` with its own minibatch iterator and a policy ``evaluate``/``backward``
pair; the arithmetic of one PPO update therefore lives only here.

Per minibatch (:func:`minibatch_loss`), with ``A`` the advantages (normalized per minibatch when
``config.normalize_advantage`` and ``config.advantage_norm_scope == "minibatch"``)::

    loss = policy_loss(new_log_probs, old_log_probs, A, clip_range)
         + vf_coef * value_loss_scale * value_loss(values, old_values, returns, clip_range_vf, mode)
         - ent_coef * mean(entropy)

and the gradients of ``loss`` with respect to ``new_log_probs``, ``entropy`` and ``values``,
which the policy's ``backward`` turns into parameter gradients. Then
``clip_by_global_norm(grads, max_grad_norm)`` and one ``adam_update`` step.

KL early stop (``config.target_kl`` not None), the rule named by ``config.kl_stop_rule`` with
the estimator ``config.kl_estimator`` (``approx_kl`` of :mod:`ppo_ref.losses`):

* ``"sb3"`` (Stable-Baselines3, the default): per minibatch, *before* its step; if
  ``approx_kl > 1.5 * target_kl`` that step is skipped and every remaining epoch stops.
* ``"cleanrl"`` (CleanRL ``ppo.py``): after each epoch, if the last minibatch's ``approx_kl``
  (computed before its step) ``> target_kl``, the remaining epochs stop.
* ``"thrust"`` (thrust-rl): per minibatch, *after* its step; if ``approx_kl > target_kl`` the
  rest of the current epoch is skipped; the next epoch starts as usual.

Sources: Schulman et al. 2017 (arXiv:1707.06347) eq. 9; Huang et al. 2022, "The 37
Implementation Details of PPO" (minibatch advantage normalization, global gradient clipping,
early stopping); the implementations named above for the stop rules.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple

import numpy as np

from ppo_ref.losses import (_minibatch_loss_kernel, approx_kl, entropy_loss, normalize_advantages,
                            policy_loss, value_loss)
from ppo_ref.optim import (_clipped_adam_step_in_place, adam_update, clip_by_global_norm,
                           clipped_adam_step)

__all__ = ["Minibatch", "MinibatchLoss", "minibatch_loss", "batch_advantages",
           "shuffled_minibatch_indices", "run_epochs", "effective_clip_range", "KL_STOP_RULES"]

KL_STOP_RULES = ("sb3", "cleanrl", "thrust")

# A linearly annealed clip range reaches exactly 0 on the last update (SB3 progress
# convention). ``policy_loss`` requires clip_range > 0; the smallest positive double clips
# identically (1 +- 5e-324 == 1 in float64), so it stands in for 0.
_TINY_CLIP = float(np.finfo(np.float64).tiny)


def effective_clip_range(clip_range: float) -> float:
    """``clip_range`` itself, or the smallest positive float64 when it is 0 (same clipping)."""
    return clip_range if clip_range > 0.0 else _TINY_CLIP


class Minibatch(NamedTuple):
    """One minibatch of the PPO update.

    ``old_log_probs``, ``advantages``, ``returns``, ``old_values``: float64 arrays of one shape
    (``[B]`` feedforward, ``[T, n]`` recurrent), the rollout's behaviour log-probs, advantages
    (already batch-normalized if that scope is chosen), lambda-returns and values.
    ``data``: whatever the policy's ``evaluate`` needs (observations, actions, initial LSTM
    states, ...); opaque here.
    """
    old_log_probs: np.ndarray
    advantages: np.ndarray
    returns: np.ndarray
    old_values: np.ndarray
    data: Any


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
    feedforward convention, with ``advantage_norm_ddof``), otherwise unchanged."""
    if config.normalize_advantage and config.advantage_norm_scope == "batch":
        return normalize_advantages(advantages, ddof=config.advantage_norm_ddof)
    return np.asarray(advantages, dtype=np.float64)


def minibatch_loss(new_log_probs, entropy, values, old_log_probs, advantages, returns,
                   old_values, *, config, clip_range: float,
                   with_log_ratio: bool = True) -> MinibatchLoss:
    """The PPO loss of one minibatch and its gradients w.r.t. the policy's outputs.

    Args:
        new_log_probs, entropy, values: the current policy's outputs for the minibatch rows,
            float64, all of one shape ``S``.
        old_log_probs, advantages, returns, old_values: the rollout's data for those rows, shape
            ``S``.
        config: a PPOConfig (``normalize_advantage``, ``advantage_norm_scope``,
            ``advantage_norm_ddof``, ``vf_coef``, ``value_loss_scale``, ``value_loss_mode``,
            ``clip_range_vf``, ``ent_coef``, ``kl_estimator``).
        clip_range: the current (possibly annealed) clip range, >= 0.
        with_log_ratio: compute ``max_abs_log_ratio`` (nan when False; the epoch loop asks for
            it on the first minibatch only).

    Returns:
        :class:`MinibatchLoss`: total ``loss`` and its parts (``entropy`` is the mean entropy),
        ``approx_kl`` with ``config.kl_estimator``, ``clip_fraction``, ``max_abs_log_ratio``
        (``max |new - old|``: 0 on the first minibatch of an update) and the gradients
        ``d_log_probs``, ``d_entropy`` (``None`` when ``ent_coef == 0``), ``d_values``, each of
        shape ``S``.

    Raises:
        ValueError: from :mod:`ppo_ref.losses` (shape mismatch, non-finite input, overflow).
    """
    fast = _fast_minibatch_loss(new_log_probs, entropy, values, old_log_probs, advantages,
                                returns, old_values, config, clip_range, with_log_ratio)
    if fast is not None:
        return fast
    adv = np.asarray(advantages, dtype=np.float64)
    if config.normalize_advantage and config.advantage_norm_scope == "minibatch":
        adv = normalize_advantages(adv, ddof=config.advantage_norm_ddof)
    p_loss, d_log_probs, info = policy_loss(new_log_probs, old_log_probs, adv,
                                            effective_clip_range(float(clip_range)))
    v_loss, d_v = value_loss(values, old_values, returns, config.clip_range_vf,
                             mode=config.value_loss_mode)
    v_scale = float(config.vf_coef) * float(config.value_loss_scale)
    ent_coef = float(config.ent_coef)
    if ent_coef != 0.0:
        e_loss, d_e = entropy_loss(entropy)
    else:  # the entropy term is absent from the loss; its value is still reported
        e_loss, d_e = -float(np.mean(entropy)), None
    total = p_loss + v_scale * v_loss + ent_coef * e_loss
    if config.kl_estimator == "k3":
        kl = info["approx_kl"]
    else:
        kl = approx_kl(old_log_probs, new_log_probs, config.kl_estimator)
    if with_log_ratio:
        max_abs_log_ratio = float(np.max(np.abs(np.asarray(new_log_probs) - np.asarray(old_log_probs))))
    else:
        max_abs_log_ratio = math.nan
    return MinibatchLoss(
        loss=float(total), policy_loss=float(p_loss), value_loss=float(v_loss),
        entropy=-float(e_loss), approx_kl=float(kl), clip_fraction=float(info["clip_fraction"]),
        max_abs_log_ratio=max_abs_log_ratio,
        d_log_probs=d_log_probs, d_entropy=(d_e * ent_coef) if d_e is not None else None,
        d_values=d_v * v_scale)


def _fast_minibatch_loss(new_log_probs, entropy, values, old_log_probs, advantages, returns,
                         old_values, config, clip_range, with_log_ratio):
    """:func:`minibatch_loss` for the common case (C-contiguous float64 arrays of one shape
    with n >= 2 entries, all finite, nothing overflowing), through one call of the compiled
    kernels of :mod:`ppo_ref.losses` (``_minibatch_loss_kernel``: the same kernels and
    arithmetic as the public loss functions, on the arrays in C order) without their per-call
    argument checks. Returns ``None`` when the case does not apply; :func:`minibatch_loss` then
    takes the checked path (which also produces the errors)."""
    if type(new_log_probs) is not np.ndarray:
        return None
    shape = new_log_probs.shape
    n = new_log_probs.size
    if n < 2:
        return None
    arrays = (new_log_probs, entropy, values, old_log_probs, advantages, returns, old_values)
    for a in arrays:
        if not (type(a) is np.ndarray and a.dtype == np.float64 and a.shape == shape
                and a.flags.c_contiguous):
            return None
    normalize = config.normalize_advantage and config.advantage_norm_scope == "minibatch"
    ddof = config.advantage_norm_ddof
    if normalize and (isinstance(ddof, (bool, np.bool_)) or ddof not in (0, 1)):
        return None
    clip = effective_clip_range(float(clip_range))
    if not clip > 0.0:
        return None
    mode = config.value_loss_mode
    if mode not in ("max", "sb3"):
        return None
    c_vf = config.clip_range_vf
    clip_on = c_vf is not None
    if clip_on and not (math.isfinite(c_vf) and c_vf > 0):
        return None
    out = np.empty((3, n))  # rows: d_log_probs, d_values (scaled), normalized advantages
    if len(shape) != 1:
        arrays = tuple(a.reshape(-1) for a in arrays)
    v_scale = float(config.vf_coef) * float(config.value_loss_scale)
    status, surrogate_sum, n_clipped, k3_sum, v_sum = _minibatch_loss_kernel(
        *arrays, normalize, int(ddof) if normalize else 0, clip,
        float(c_vf) if clip_on else 0.0, clip_on, mode == "sb3", v_scale, out[2], out[0], out[1])
    if status != 0:
        return None
    p_loss = -surrogate_sum / n
    v_loss = v_sum / n
    ent_coef = float(config.ent_coef)
    e_loss = -(float(np.add.reduce(arrays[1])) / n)  # np.mean's sum and division, called directly
    total = p_loss + v_scale * v_loss + ent_coef * e_loss
    if config.kl_estimator == "k3":
        kl = k3_sum / n
    else:
        kl = approx_kl(old_log_probs, new_log_probs, config.kl_estimator)
    if not (math.isfinite(total) and math.isfinite(kl)):
        return None
    max_abs_log_ratio = (float(np.max(np.abs(new_log_probs - old_log_probs)))
                         if with_log_ratio else math.nan)
    d_log_probs, d_v = out[0], out[1]
    if len(shape) != 1:
        d_log_probs, d_v = d_log_probs.reshape(shape), d_v.reshape(shape)
    return MinibatchLoss(
        loss=float(total), policy_loss=float(p_loss), value_loss=float(v_loss),
        entropy=-e_loss, approx_kl=float(kl), clip_fraction=n_clipped / n,
        max_abs_log_ratio=max_abs_log_ratio, d_log_probs=d_log_probs,
        d_entropy=np.full(shape, -1.0 / n) * ent_coef if ent_coef != 0.0 else None, d_values=d_v)


def shuffled_minibatch_indices(rng: np.random.Generator, n_rows: int, batch_size: int) -> List[np.ndarray]:
    """One epoch's minibatches: a permutation of ``range(n_rows)`` cut into chunks of
    ``batch_size`` (the last chunk smaller when ``batch_size`` does not divide ``n_rows``, as
    in SB3). Every row appears in exactly one chunk. Uses ``rng.permutation`` only."""
    if n_rows < 1 or batch_size < 1:
        raise ValueError(f"n_rows and batch_size must be >= 1, got {n_rows}, {batch_size}")
    perm = rng.permutation(n_rows)
    return [perm[i:i + batch_size] for i in range(0, n_rows, batch_size)]


# Gathering every epoch's minibatches at once holds n_epochs copies of the rollout's arrays;
# above this many bytes the trainers gather epoch by epoch instead (the same values and bits).
GATHER_ALL_EPOCHS_MAX_BYTES = 64 * 2 ** 20


def _gather_all_epochs(config, rng, arrays) -> bool:
    """Whether a trainer draws and gathers every epoch's minibatches at once
    (:func:`_epoch_permutations`): no KL stop (so every epoch runs), ``rng`` a NumPy
    ``Generator`` (a test harness injecting permutations is asked once per epoch), and
    ``n_epochs`` copies of ``arrays`` within :data:`GATHER_ALL_EPOCHS_MAX_BYTES`."""
    return (config.target_kl is None and type(rng) is np.random.Generator
            and int(config.n_epochs) * sum(int(np.asarray(a).nbytes) for a in arrays)
            <= GATHER_ALL_EPOCHS_MAX_BYTES)


def _epoch_permutations(rng: np.random.Generator, n_rows: int, n_epochs: int) -> np.ndarray:
    """The permutations of ``n_epochs`` successive :func:`shuffled_minibatch_indices` calls,
    drawn at once: ``[n_epochs, n_rows]`` int64 in C order, row ``e`` the permutation of epoch
    ``e``.

    ``rng.permuted`` (in place) of ``n_epochs`` rows of ``arange(n_rows)`` along axis 1 shuffles the rows
    one after the other with the draws of ``rng.permutation``, so the rows and the generator
    state afterwards are exactly those of ``n_epochs`` successive ``rng.permutation(n_rows)``
    calls (a test checks this). For a caller that knows every epoch will run (no KL early
    stop): one call and one gather per array per update instead of one per epoch.
    """
    if n_rows < 1 or n_epochs < 1:
        raise ValueError(f"n_rows and n_epochs must be >= 1, got {n_rows}, {n_epochs}")
    perms = np.tile(np.arange(n_rows), (n_epochs, 1))  # C order: rows gather into rows
    rng.permuted(perms, axis=1, out=perms)
    return perms


EvaluateFn = Callable[[Dict[str, np.ndarray], Any], Tuple[np.ndarray, np.ndarray, np.ndarray, Any]]
BackwardFn = Callable[[Dict[str, np.ndarray], Any, np.ndarray, Optional[np.ndarray], np.ndarray],
                      Dict[str, np.ndarray]]


def run_epochs(params: Dict[str, np.ndarray], adam_state: dict, *, config, lr: float,
               clip_range: float, minibatches: Callable[[int], Iterable[Minibatch]],
               evaluate: EvaluateFn, backward: BackwardFn) -> Tuple[dict, dict, Dict[str, float]]:
    """Run up to ``config.n_epochs`` epochs of PPO minibatch steps.

    Args:
        params, adam_state: current parameters and Adam state (not modified; new ones returned).
        config: PPOConfig (loss knobs, ``n_epochs``, ``max_grad_norm``, ``adam_eps``,
            ``target_kl``, ``kl_stop_rule``).
        lr, clip_range: this update's (possibly annealed) learning rate and clip range.
        minibatches: ``minibatches(epoch) -> iterable of Minibatch`` (called once per epoch, in
            order; the caller owns the shuffling generator).
        evaluate: ``evaluate(params, data) -> (new_log_probs, entropy, values, cache)``.
        backward: ``backward(params, cache, d_log_probs, d_entropy, d_values) -> grads``
            (``d_entropy`` may be ``None``: zero).
        With one-buffer dicts (:class:`~ppo_ref.flat.FlatArrays`) the first step writes new
        buffers and every later step updates this loop's own parameters and moments in place
        (``optim._clipped_adam_step_in_place``: the same bits, fewer buffers through the
        caches), so ``evaluate``/``backward`` must not keep the ``params`` they get beyond
        their step (the caller's own ``params`` and ``adam_state`` are never written).

    Returns:
        ``(params, adam_state, stats)``; ``stats`` holds the means over the evaluated
        minibatches of ``policy_loss``, ``value_loss``, ``entropy``, ``loss``, ``approx_kl``,
        ``clip_fraction``; ``grad_norm`` (mean pre-clip global norm over the steps taken);
        ``n_epochs_run`` (epochs in which a minibatch was evaluated), ``n_gradient_steps``,
        ``kl_stopped`` (1.0 if the KL rule fired), ``first_max_abs_log_ratio`` (``max |new -
        old|`` on the first minibatch: 0 when the policy reproduces the behaviour log-probs),
        ``learning_rate``, ``clip_range``.

    Raises:
        FloatingPointError: a non-finite gradient norm (nothing of that step is applied).
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
    own = False  # params/adam_state buffers were made by this loop's clipped_adam_step
    for epoch in range(int(config.n_epochs)):
        last_kl = None
        evaluated_this_epoch = False
        for mb in minibatches(epoch):
            new_log_probs, entropy, values, cache = evaluate(params, mb.data)
            out = minibatch_loss(new_log_probs, entropy, values, mb.old_log_probs, mb.advantages,
                                 mb.returns, mb.old_values, config=config, clip_range=clip_range,
                                 with_log_ratio=n_evaluated == 0)
            if n_evaluated == 0:
                first_log_ratio = out.max_abs_log_ratio
            n_evaluated += 1
            evaluated_this_epoch = True
            for key in sums:
                sums[key] += getattr(out, key)
            last_kl = out.approx_kl
            if target_kl is not None and rule == "sb3" and out.approx_kl > 1.5 * target_kl:
                kl_stopped = True
                break
            grads = backward(params, cache, out.d_log_probs, out.d_entropy, out.d_values)
            # one-buffer dicts: the two calls below in two passes, into new buffers on the
            # first step, then into this loop's own buffers (the caller's params and state
            # are never written)
            step = None
            if own:
                step = _clipped_adam_step_in_place(params, grads, adam_state,
                                                   max_norm=config.max_grad_norm, lr=lr,
                                                   eps=config.adam_eps)
            if step is None:
                step = clipped_adam_step(params, grads, adam_state,
                                         max_norm=config.max_grad_norm, lr=lr,
                                         eps=config.adam_eps)
            if step is not None:
                own = True
                params, adam_state, norm = step
            else:
                own = False
                grads, norm = clip_by_global_norm(grads, config.max_grad_norm)
                params, adam_state = adam_update(params, grads, adam_state, lr=lr,
                                                 eps=config.adam_eps)
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
