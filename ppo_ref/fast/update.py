"""The compiled tier of the PPO update: the epoch loop of :mod:`ppo_ref.spec.update` with the
compiled minibatch loss and the fused in-place clipped-Adam step, on one-buffer parameters.

What the trainers call (``ppo_ref.train.ppo``, ``ppo_ref.train.recurrent_ppo``, the actor-learner's
learner): :func:`run_epochs`, on parameters held as a float64
:class:`~ppo_ref.fast.flat.FlatArrays` (what the fast policies' ``init_params`` give). For plain
dicts, :func:`ppo_ref.spec.update.run_epochs` is the update (this one raises for them).

* :func:`minibatch_loss` equals :func:`ppo_ref.spec.update.minibatch_loss` bit for bit on
  float64 input of one shape (``tests/test_spec_update.py``): one compiled call
  (``_loss_pass``) runs the per-minibatch normalization
  ``ppo_ref.fast.losses._normalize_advantages_kernel`` (the spec's ``advantage_moments``,
  compiled), then ``ppo_ref.fast.losses._minibatch_loss_kernel``, which compiles the spec's
  element functions, and sums the entropies in NumPy's pairwise order
  (``ppo_ref.fast.sums.pairwise_sum``: the bits of the spec's ``np.mean`` where NumPy keeps
  that order).
* :func:`run_epochs` equals :func:`ppo_ref.spec.update.run_epochs` up to the summation order of
  the global gradient norm (see ``ppo_ref.fast.optim.clipped_adam_step``): the same loop
  (:func:`ppo_ref.spec.update.epoch_loop`), loss bits and Adam element arithmetic; bit for bit
  when no step clips, within rtol 1e-10 when steps clip (``tests/test_tiers.py``).
* :func:`feedforward_minibatches` and :func:`recurrent_minibatches` equal
  :func:`ppo_ref.spec.update.feedforward_minibatches` and
  :func:`ppo_ref.spec.update.recurrent_minibatches` bit for bit (the same minibatch arrays in
  the same order, the same Generator state afterwards), gathering every epoch at once when no
  KL stop can end the update early.

The types and helpers they share (``Minibatch``, ``MinibatchLoss``, ``batch_advantages``,
``row_minibatches``, ``env_minibatches``, ``effective_clip_range``, ``KL_STOP_RULES``) are those of
:mod:`ppo_ref.spec.update`; import them from there.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Iterable, NamedTuple, Optional, Tuple

import numpy as np

from ppo_ref._checks import (as_float_array, check_adam_hyperparameters, check_choice,
                             check_positive, check_step_count)
from ppo_ref.fast import workspace
from ppo_ref.fast.flat import FlatArrays, flatten_arrays, is_flat
from ppo_ref.fast.losses import (_minibatch_loss_sums, _normalize_advantages_kernel,
                                  _weighted_sum)
from ppo_ref._numba import njit
from ppo_ref.fast.optim import (_clipped_adam_kernel, _clipped_adam_step, _layout_segments,
                                _previous_values_scratch, _raise_step_failure,
                                check_flat_step_arguments)
from ppo_ref.spec.optim import adam_step_scalars
from ppo_ref.fast.sums import pairwise_sum
from ppo_ref.spec.losses import (NORM_EPS_PLACEMENTS, VALUE_LOSS_MODES, check_ddof,
                                 check_dual_clip, clip_bounds,
                                 entropy_overflow_error, log_ratio_overflow_error,
                                 normalize_advantages, ratio_overflow_error,
                                 surrogate_overflow_error, value_overflow_error)
from ppo_ref.spec.recurrent_networks import LSTMStates
from ppo_ref.spec.update import (BackwardFn, EvaluateFn, Minibatch, MinibatchLoss,
                                 effective_clip_range, env_minibatches, epoch_loop,
                                 row_minibatches, total_loss_overflow_error)
__all__ = ["minibatch_loss", "run_epochs", "feedforward_minibatches", "recurrent_minibatches",
           "epoch_permutations"]


def minibatch_loss(new_log_probs, entropy, values, old_log_probs, advantages, returns,
                   old_values, *, config, clip_range: float,
                   with_log_ratio: bool = True, weights=None) -> MinibatchLoss:
    """:func:`ppo_ref.spec.update.minibatch_loss`, bit for bit, through one compiled call: the
    ``ppo_ref.fast.losses._normalize_advantages_kernel`` (per-minibatch normalization), then
    ``ppo_ref.fast.losses._minibatch_loss_kernel`` and the entropies' sum in NumPy's pairwise
    order (what the spec's ``np.mean`` sums in).

    Args and results as the spec function, except: ``new_log_probs``, ``values``,
    ``old_log_probs``, ``advantages``, ``returns`` and ``old_values`` must have one shape ``S``
    (``entropy`` any shape, or ``S`` when ``weights`` is given); every array is converted to
    C-contiguous float64 (no copy when it already is), and the gradients are float64.
    ``weights`` (None or per-row weights >= 0 of shape ``S``) as the spec function: the kernel
    takes all ones for None, and the weighted entropy sum is
    ``ppo_ref.fast.losses._weighted_sum`` (the spec's sum in element order).

    Raises:
        ValueError: naming the argument: shapes that differ, an empty minibatch, an input not
            finite, a ratio (or its gradient) that overflows float64, a log-ratio, KL,
            surrogate, value, entropy or total sum that overflows float64, ``clip_range`` < 0,
            unknown ``config.value_loss_mode``/``config.kl_estimator``, ``clip_range_vf`` <= 0;
            the messages are those of :mod:`ppo_ref.spec.losses` and
            :mod:`ppo_ref.spec.update`.
    """
    arrays = _loss_arrays((new_log_probs, entropy, values, old_log_probs, advantages, returns,
                           old_values))
    return _loss_of_arrays(arrays, _loss_settings(config, clip_range), config, with_log_ratio,
                           weights)


_LOSS_ARGUMENTS = ("new_log_probs", "entropy", "values", "old_log_probs", "advantages",
                   "returns", "old_values")


def _loss_arrays(given) -> list:
    """The seven array arguments of :func:`minibatch_loss` as C-contiguous float64 arrays, after
    checking that all but ``entropy`` have one shape and that none is empty (the function's
    first checks, with its messages)."""
    arrays = [np.ascontiguousarray(a, dtype=np.float64) for a in given]
    shape = arrays[0].shape
    if not (arrays[2].shape == arrays[3].shape == arrays[4].shape == arrays[5].shape
            == arrays[6].shape == shape):
        for name, a in zip(_LOSS_ARGUMENTS, arrays):
            if name != "entropy" and a.shape != shape:
                raise ValueError(f"{name} must have the shape of new_log_probs {shape}, got "
                                 f"{a.shape}")
    if arrays[0].size == 0 or arrays[1].size == 0:
        raise ValueError("new_log_probs and entropy must not be empty (a mean over zero "
                         "elements is undefined)")
    return arrays


class _LossSettings(NamedTuple):
    """The loss settings of one ``config`` and ``clip_range``, checked (:func:`_loss_settings`):
    the ratio interval (``low``, ``high``, ``clip``, ``symmetric``), ``dual`` clip,
    ``huber_delta``, the value-loss mode's index, the value clip (``c_vf``, ``clip_on``),
    ``normalize`` (per-minibatch advantage normalization) with its checked ``(ddof, eps,
    placement)`` in ``norm`` (None when those settings are invalid: the loss then raises the spec's
    error), ``v_scale = vf_coef * value_loss_scale``, ``ent_coef`` and ``k3`` (the KL
    estimator is k3), and ``knobs``: these as the float64 array :func:`_loss_pass` reads
    (:func:`_loss_knobs`; the normalization's entries 0 when ``norm`` is None)."""
    low: float
    high: float
    clip: float
    symmetric: bool
    dual: float
    huber_delta: float
    value_mode: int
    c_vf: float
    clip_on: bool
    normalize: bool
    norm: Optional[Tuple[int, float, str]]
    v_scale: float
    ent_coef: float
    k3: bool
    knobs: np.ndarray


def _loss_settings(config, clip_range) -> _LossSettings:
    """Check the loss settings of ``config`` and ``clip_range`` (in the order and with the
    errors of :func:`minibatch_loss`) and return them as :class:`_LossSettings`. They depend
    on ``config`` (frozen) and ``clip_range`` only, so one update computes them once."""
    clip = effective_clip_range(clip_range)
    low, high, symmetric = clip_bounds(clip, config.clip_range_low, config.clip_range_high,
                                       config.clip_interval)
    dual = check_dual_clip(config.dual_clip)
    huber_delta = check_positive(config.huber_delta, "huber_delta")
    check_choice(config.value_loss_mode, "mode", VALUE_LOSS_MODES)
    check_choice(config.kl_estimator, "estimator", ("k3", "k1"))
    c_vf = config.clip_range_vf
    clip_on = c_vf is not None
    c_vf = check_positive(c_vf, "clip_range_vf") if clip_on else 0.0
    normalize = bool(config.normalize_advantage and config.advantage_norm_scope == "minibatch")
    norm = None
    if normalize:
        try:
            ddof = check_ddof(config.advantage_norm_ddof)
            eps = check_positive(config.advantage_norm_eps, "eps")
            check_choice(config.advantage_norm_eps_placement, "placement", NORM_EPS_PLACEMENTS)
            norm = (ddof, eps, config.advantage_norm_eps_placement)
        except ValueError:  # raised by the loss, after its checks of the weights
            norm = None
    s = _LossSettings(low, high, clip, symmetric, dual, huber_delta,
                      VALUE_LOSS_MODES.index(config.value_loss_mode), c_vf, clip_on,
                      normalize, norm, float(config.vf_coef) * float(config.value_loss_scale),
                      float(config.ent_coef), config.kl_estimator == "k3", None)
    ddof, eps, placement = norm if norm is not None else (0, 0.0, "add")
    return s._replace(knobs=_loss_knobs(s, ddof, eps, placement == "clamp"))


_ones = np.ones(0)


def _all_ones(n: int) -> np.ndarray:
    """A float64 array of ``n`` ones: the unit weights the loss kernel reads (and never writes;
    kept for the next call of the same length, and never handed out)."""
    global _ones
    ones = _ones
    if ones.size != n:
        ones = _ones = np.ones(n)
    return ones


@njit
def _loss_pass(new, entropy, values, old, adv, returns, old_values, weights, normalize, knobs,
               normalized, d_new, d_values):
    """The compiled part of :func:`_loss_of_arrays` in one call: when ``normalize``, the
    advantages by ``ppo_ref.fast.losses._normalize_advantages_kernel`` into ``normalized``
    (float64 ``[n]``), then ``ppo_ref.fast.losses._minibatch_loss_kernel``'s pass
    (``ppo_ref.fast.losses._minibatch_loss_sums``, which also tells whether every ``d_values``
    entry is finite) on them, then the sum of ``entropy`` (all its entries,
    :func:`ppo_ref.fast.sums.pairwise_sum`). ``knobs`` holds the settings as float64
    (:func:`_loss_knobs`: ``low, high, clip_range, symmetric, dual_clip, clip_range_vf,
    clip_on, value_mode, huber_delta, v_scale, ddof, eps, clamp``; each value exact in float64).
    Returns the loss kernel's eight results, that flag and that sum; ``status`` 3 (the rest
    meaningless) when the normalization's mean or std is not finite. Through
    :func:`minibatch_loss` it gives the bits of :func:`ppo_ref.spec.update.minibatch_loss` (the
    ``minibatch_loss`` row of ``tests/test_tiers.py``, BITS)."""
    if normalize:
        if not _normalize_advantages_kernel(adv, int(knobs[10]), knobs[11], knobs[12] != 0.0,
                                            normalized):
            return 3, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False, 0.0
        adv = normalized
    status, index, surrogate_sum, n_outside, k3_sum, k1_sum, v_sum, w_sum, finite = (
        _minibatch_loss_sums(new, entropy, values, old, adv, returns, old_values, weights,
                             knobs[0], knobs[1], knobs[2], knobs[3] != 0.0, knobs[4], knobs[5],
                             knobs[6] != 0.0, int(knobs[7]), knobs[8], knobs[9], d_new,
                             d_values))
    return (status, index, surrogate_sum, n_outside, k3_sum, k1_sum, v_sum, w_sum, finite,
            pairwise_sum(entropy, False))


def _loss_knobs(s: _LossSettings, ddof: int, eps: float, clamp: bool) -> np.ndarray:
    """The settings :func:`_loss_pass` reads, as a float64 array (every value exact: floats,
    booleans as 0.0/1.0, the small integers ``value_mode`` and ``ddof``)."""
    return np.array([s.low, s.high, s.clip, s.symmetric, s.dual, s.c_vf, s.clip_on,
                     s.value_mode, s.huber_delta, s.v_scale, ddof, eps, clamp],
                    dtype=np.float64)


def _loss_of_arrays(arrays, s: _LossSettings, config, with_log_ratio: bool,
                    weights) -> MinibatchLoss:
    """:func:`minibatch_loss` after its first checks: ``arrays`` from :func:`_loss_arrays`,
    ``s`` the :class:`_LossSettings` of ``config`` and the clip range."""
    shape = arrays[0].shape
    n = arrays[0].size
    if weights is None:
        w = _all_ones(n)
    else:
        w = np.ascontiguousarray(weights, dtype=np.float64)
        if w.shape != shape:
            raise ValueError(f"weights must have the shape of new_log_probs {shape}, got "
                             f"{w.shape}")
        if arrays[1].shape != shape:
            raise ValueError(f"entropy must have the shape of new_log_probs {shape} when weights "
                             f"are given, got {arrays[1].shape}")
        as_float_array(w, "weights")
        if np.any(w < 0):
            raise ValueError("weights must be >= 0 (a mask of 0/1 or per-row weights)")
        w = w.reshape(-1)
    flat = (arrays if len(shape) == 1 and arrays[1].ndim == 1  # 1-D already
            else [a.reshape(-1) for a in arrays])  # (views)
    normalize = s.normalize and n > 1  # (one element: unchanged, as the spec)
    if s.normalize:
        if s.norm is None:  # invalid settings: the spec's error, in the spec's order of checks
            placement = config.advantage_norm_eps_placement
            try:
                check_ddof(config.advantage_norm_ddof)
                check_positive(config.advantage_norm_eps, "eps")
                check_choice(placement, "placement", NORM_EPS_PLACEMENTS)
            except ValueError:
                normalize_advantages(arrays[4], ddof=config.advantage_norm_ddof,
                                     eps=config.advantage_norm_eps, placement=placement)
                raise
    v_scale = s.v_scale

    d_log_probs, d_values = np.empty(n), np.empty(n)
    (status, index, surrogate_sum, n_outside, k3_sum, k1_sum, v_sum, w_sum, d_values_finite,
     entropy_sum) = _loss_pass(*flat, w, normalize, s.knobs,
                               np.empty(n) if normalize else flat[4], d_log_probs, d_values)
    if status == 3:  # not finite, or the variance overflows: the spec's error
        ddof, eps, placement = s.norm
        normalize_advantages(arrays[4], ddof=ddof, eps=eps, placement=placement)
        raise ValueError("advantages must be finite")  # (the spec's function raises first)
    if status == 1:  # name the argument as the spec does (its order of checks)
        for j in (0, 3, 4, 2, 5, 6, 1):
            as_float_array(arrays[j], _LOSS_ARGUMENTS[j])
        raise ValueError(f"{(_LOSS_ARGUMENTS + ('weights',))[index]} must be finite")
    if status != 0:
        raise ratio_overflow_error(arrays[0], arrays[3], index, np.float64)
    # sums that overflow: refused with the spec's errors, in the spec's order
    if not math.isfinite(k3_sum):
        raise log_ratio_overflow_error("k3")
    if not math.isfinite(surrogate_sum):
        raise surrogate_overflow_error()
    if not math.isfinite(v_sum):  # (then every d_term / n is finite too)
        raise value_overflow_error()
    if not w_sum > 0.0 or not math.isfinite(w_sum):
        raise ValueError(f"weights must have a positive finite sum, got {w_sum}")
    ent_coef = s.ent_coef
    if weights is None:  # the spec's np.mean: numpy's sum (entropy_sum), then divided by the count
        entropy_size = arrays[1].size
        e_loss = -(entropy_sum / entropy_size)
        if not math.isfinite(e_loss):
            raise entropy_overflow_error()
        d_entropy = (None if ent_coef == 0.0
                     else np.full(arrays[1].shape, -1.0 / entropy_size) * ent_coef)
    else:  # the spec's entropy_loss with weights: sum(w * H) / sum(w), gradient -w / sum(w)
        mean = _weighted_sum(w, flat[1]) / w_sum
        if not math.isfinite(mean):
            raise entropy_overflow_error()
        e_loss = -mean
        d_entropy = None if ent_coef == 0.0 else (np.negative(w) / w_sum).reshape(shape) * ent_coef
    if not s.k3 and not math.isfinite(k1_sum):
        raise log_ratio_overflow_error("k1")
    p_loss = -surrogate_sum / w_sum
    v_loss = v_sum / w_sum
    total = p_loss + v_scale * v_loss + ent_coef * e_loss  # Python floats: inf, never a warning
    if not (math.isfinite(total) and d_values_finite):
        raise total_loss_overflow_error()
    kl = k3_sum / w_sum if s.k3 else k1_sum / w_sum
    max_abs_log_ratio = (float(np.max(np.abs(arrays[0] - arrays[3]))) if with_log_ratio
                         else math.nan)
    if len(shape) != 1:
        d_log_probs, d_values = d_log_probs.reshape(shape), d_values.reshape(shape)
    return MinibatchLoss(float(total), float(p_loss), float(v_loss), -e_loss, float(kl),
                         n_outside / w_sum, max_abs_log_ratio, d_log_probs, d_entropy, d_values)


# Gathering every epoch's minibatches at once holds n_epochs copies of the rollout's arrays;
# above this many bytes the minibatch functions gather epoch by epoch instead (the same values
# and bits).
GATHER_ALL_EPOCHS_MAX_BYTES = 64 * 2 ** 20


def _gathers_all_epochs(arrays, n_epochs: int, target_kl) -> bool:
    """Whether every epoch's minibatches are drawn and gathered at once: no KL stop
    (``target_kl`` None, so every one of the ``n_epochs`` epochs runs) and ``n_epochs`` copies
    of ``arrays`` within :data:`GATHER_ALL_EPOCHS_MAX_BYTES`."""
    return (target_kl is None
            and int(n_epochs) * sum(int(np.asarray(a).nbytes) for a in arrays)
            <= GATHER_ALL_EPOCHS_MAX_BYTES)


def epoch_permutations(rng: np.random.Generator, n_rows: int, n_epochs: int) -> np.ndarray:
    """The permutations of ``n_epochs`` successive ``rng.permutation(n_rows)`` calls
    (:func:`ppo_ref.spec.update.row_minibatches`, :func:`ppo_ref.spec.update.env_minibatches`),
    drawn at once: ``[n_epochs, n_rows]`` int64 in C order, row ``e`` the permutation of epoch
    ``e``.

    ``rng.permuted`` (in place) of ``n_epochs`` rows of ``arange(n_rows)`` along axis 1 shuffles
    the rows one after the other with the draws of ``rng.permutation``, so the rows and the
    generator state afterwards are exactly those of ``n_epochs`` successive calls
    (``tests/test_ppo.py``). For a caller that knows every epoch will run (no KL early stop).
    """
    if n_rows < 1 or n_epochs < 1:
        raise ValueError(f"n_rows and n_epochs must be >= 1, got {n_rows}, {n_epochs}")
    perms = np.tile(np.arange(n_rows), (n_epochs, 1))  # C order: rows gather into rows
    rng.permuted(perms, axis=1, out=perms)
    return perms


def _check_epochs(n_epochs) -> int:
    if isinstance(n_epochs, bool) or not isinstance(n_epochs, (int, np.integer)) or n_epochs < 1:
        raise ValueError(f"n_epochs must be an integer >= 1, got {n_epochs!r}")
    return int(n_epochs)


def feedforward_minibatches(rng: np.random.Generator, batch_size: int, old_log_probs,
                            advantages, returns, old_values, observations, actions, *,
                            n_epochs: int, target_kl: Optional[float]):
    """:func:`ppo_ref.spec.update.feedforward_minibatches`, bit for bit: ``minibatches(epoch)``
    for :func:`run_epochs` yielding the same :class:`Minibatch` rows in the same order, and
    leaving ``rng`` in the same state after every epoch has run (the ``feedforward_minibatches``
    row of ``tests/test_tiers.py``, BITS).

    Args as the spec function (``B = T * N`` rows: ``old_log_probs``, ``advantages``,
    ``returns``, ``old_values`` ``[B]``, ``observations [B, D]``, ``actions [B, ...]``), plus
    ``n_epochs`` (``config.n_epochs``) and ``target_kl`` (``config.target_kl``). When
    ``target_kl`` is None (every epoch runs) and ``n_epochs`` copies of the arrays fit in
    :data:`GATHER_ALL_EPOCHS_MAX_BYTES`, the first call draws every epoch's permutation at once
    (:func:`epoch_permutations`: the same draws) and gathers each array once, every minibatch
    then a C-contiguous slice of the gathered arrays; otherwise each epoch draws its
    :func:`ppo_ref.spec.update.row_minibatches` and gathers its own rows. ``rng`` needs
    ``permutation`` and ``permuted`` (a NumPy ``Generator``).

    Raises:
        ValueError: ``n_epochs`` not an integer >= 1; (when drawing) ``batch_size`` < 1 or no
            rows.
    """
    n_epochs = _check_epochs(n_epochs)
    arrays = (old_log_probs, advantages, returns, old_values, observations, actions)
    n_rows = len(old_log_probs)
    all_at_once = _gathers_all_epochs(arrays, n_epochs, target_kl)
    gathered = None

    def blocks(perms):
        """The minibatches of the epochs whose row permutations are the rows of ``perms``."""
        # np.take along axis 0: a[perms] (the same rows copied), without fancy indexing's
        # slower path for a 2-D index into a 2-D array
        g_lp, g_adv, g_ret, g_v, g_obs, g_act = (np.take(a, perms, axis=0) for a in arrays)
        return [[Minibatch(g_lp[e, i:i + batch_size], g_adv[e, i:i + batch_size],
                           g_ret[e, i:i + batch_size], g_v[e, i:i + batch_size],
                           (g_obs[e, i:i + batch_size], g_act[e, i:i + batch_size]))
                 for i in range(0, n_rows, batch_size)] for e in range(perms.shape[0])]

    def per_epoch(epoch: int):
        nonlocal gathered
        if not all_at_once:  # this epoch's permutation alone
            perm = np.concatenate(row_minibatches(rng, n_rows, batch_size))
            yield from blocks(perm[None])[0]
            return
        if gathered is None:
            if batch_size < 1:
                raise ValueError(f"n_rows and batch_size must be >= 1, got {n_rows}, "
                                 f"{batch_size}")
            gathered = blocks(epoch_permutations(rng, n_rows, n_epochs))
        yield from gathered[epoch]
    return per_epoch


def recurrent_minibatches(rng: np.random.Generator, envs_per_minibatch: int, old_log_probs,
                          advantages, returns, old_values, observations, actions,
                          initial_states, episode_starts, *, n_epochs: int,
                          target_kl: Optional[float]):
    """:func:`ppo_ref.spec.update.recurrent_minibatches`, bit for bit: ``minibatches(epoch)``
    for :func:`run_epochs` yielding the same :class:`Minibatch` arrays (the loss rows of each
    env group flattened, row ``t * n + j``; ``data = (observations, actions, LSTMStates,
    episode_starts)`` of the group) in the same order, and leaving ``rng`` in the same state
    after every epoch has run (the ``recurrent_minibatches`` row of ``tests/test_tiers.py``,
    BITS).

    Args as the spec function (``[T, N, ...]`` arrays; ``initial_states`` an
    :class:`~ppo_ref.spec.recurrent_networks.LSTMStates` ``[L, N, H]``), plus ``n_epochs``
    (``config.n_epochs``) and ``target_kl`` (``config.target_kl``). When ``target_kl`` is None
    and ``n_epochs`` copies of the arrays fit in :data:`GATHER_ALL_EPOCHS_MAX_BYTES`, the first
    call draws every epoch's env permutation at once (:func:`epoch_permutations`) and gathers
    each array once into ``[epoch, group, T, n, ...]`` blocks, each C-contiguous; otherwise
    each epoch draws its :func:`ppo_ref.spec.update.env_minibatches` and gathers its groups the
    same way. ``rng`` needs ``permutation`` and ``permuted`` (a NumPy ``Generator``).

    Raises:
        ValueError: ``n_epochs`` not an integer >= 1; (when drawing) ``envs_per_minibatch``
            < 1 or not dividing ``N``.
    """
    n_epochs = _check_epochs(n_epochs)
    per = envs_per_minibatch
    T, N = old_log_probs.shape[:2]
    arrays = (old_log_probs, advantages, returns, old_values, observations, actions,
              episode_starts)
    all_at_once = _gathers_all_epochs(arrays + tuple(initial_states), n_epochs, target_kl)
    gathered = None

    def blocks(perms):
        """The minibatches of the epochs whose env permutations are the rows of ``perms``:
        axis 1 of every ``[T, N, ...]`` array (and of the ``[L, N, H]`` states) indexed by the
        groups ``perms[e, j*per:(j+1)*per]``, one broadcast gather per array."""
        E = perms.shape[0]
        groups = perms.reshape(E, N // per, 1, per)
        steps = np.arange(T).reshape(1, 1, T, 1)
        layers = np.arange(initial_states.h.shape[0]).reshape(1, 1, -1, 1)
        lp, a, r, v, obs, act, starts = (x[steps, groups] for x in arrays)
        h, c = initial_states.h[layers, groups], initial_states.c[layers, groups]
        return [[Minibatch(lp[e, j].reshape(-1), a[e, j].reshape(-1), r[e, j].reshape(-1),
                           v[e, j].reshape(-1),
                           (obs[e, j], act[e, j], LSTMStates(h[e, j], c[e, j]), starts[e, j]))
                 for j in range(N // per)] for e in range(E)]

    def per_epoch(epoch: int):
        nonlocal gathered
        if not all_at_once:  # this epoch's permutation alone
            yield from blocks(np.concatenate(env_minibatches(rng, N, per))[None])[0]
            return
        if gathered is None:
            if per < 1 or N % per != 0:
                raise ValueError(f"per_minibatch ({per}) must be >= 1 and divide n_envs ({N})")
            gathered = blocks(epoch_permutations(rng, N, n_epochs))
        yield from gathered[epoch]
    return per_epoch


def run_epochs(params: FlatArrays, adam_state: dict, *, config, lr: float,
               clip_range: float, minibatches: Callable[[int], Iterable[Minibatch]],
               evaluate: EvaluateFn, backward: BackwardFn) -> Tuple[FlatArrays, dict, Dict[str, float]]:
    """:func:`ppo_ref.spec.update.run_epochs` for one-buffer parameters: the same loop
    (:func:`ppo_ref.spec.update.epoch_loop`) with :func:`minibatch_loss` (the spec's bits) and
    the fused in-place step ``ppo_ref.fast.optim.clipped_adam_step`` (the spec's element arithmetic;
    each array's sum of squares of the global norm in NumPy's pairwise order, written out in
    the kernel). When steps clip, three epochs' results agree with the spec's within rtol
    1e-10, atol 1e-14 per result array (``|fast - spec| <= 1e-14 + 1e-10 * max|spec|``: the
    ``run_epochs`` row of ``tests/test_tiers.py``, a contract that does not lean on NumPy's
    summation order; with NumPy 2.4 they are the same bits); when no step clips the
    parameters, moments and stats are the same bits, the ``grad_norm`` stat aside (the
    ``run_epochs_no_clip`` row, BITS).

    Args:
        params: an intact float64 :class:`~ppo_ref.fast.flat.FlatArrays` (what the fast policies
            give); never modified.
        adam_state: ``{"t", "m", "v"}`` with moments keyed and shaped like ``params`` (plain
            dicts or FlatArrays: they are copied into ``params``' layout); never modified.
        config, lr, clip_range, minibatches, evaluate, backward: as the spec function;
            ``backward`` must return the gradients as a FlatArrays in ``params``' layout.
            The loop copies ``params`` and the moments once and then updates its copies in
            place, step after step, so ``evaluate``/``backward`` must not keep the ``params``
            they get beyond their step. Every minibatch's loss is :func:`minibatch_loss`'s,
            with its loss settings (``config``, ``clip_range``) checked at the first minibatch
            and reused after.

    Returns:
        ``(params, adam_state, stats)``: new FlatArrays (the loop's copies), moments as
        FlatArrays in that layout, and the stats of the spec function (same keys).

    Raises:
        ValueError: ``params`` not an intact float64 FlatArrays (plain dicts: use
            ``ppo_ref.spec.update.run_epochs``), moments not matching it, gradients not in its
            layout, hyperparameters out of range, or the errors of the losses.
        FloatingPointError: a non-finite gradient norm (nothing of that step is applied).
    """
    if not (is_flat(params) and params.flat.dtype == np.float64):
        raise ValueError("ppo_ref.fast.update.run_epochs takes params as an intact float64 FlatArrays "
                         f"(ppo_ref.fast.flat; what the fast policies give), got {type(params).__name__}"
                         "; for plain dicts use ppo_ref.spec.update.run_epochs")
    if not (isinstance(adam_state, dict) and {"t", "m", "v"} <= adam_state.keys()):
        raise ValueError("adam_state must be an Adam state from adam_init (keys 't', 'm', 'v')")
    layout = params.layout
    own = FlatArrays.from_buffer(workspace.aligned(layout.size), layout)  # (64-byte aligned)
    own.flat[...] = params.flat
    m = flatten_arrays(adam_state["m"], layout, dtype=np.float64)
    v = flatten_arrays(adam_state["v"], layout, dtype=np.float64)
    t0 = check_step_count(adam_state["t"])
    lr_, beta1, beta2, eps = check_adam_hyperparameters(lr, (0.9, 0.999), config.adam_eps)
    max_norm = check_positive(config.max_grad_norm, "max_grad_norm")

    # ``own``, ``m`` and ``v`` are this loop's own buffers: distinct, float64, of one layout by
    # construction, and only ``own`` is ever handed out (to evaluate/backward). So each step
    # checks what can change between steps: that ``grads`` (from backward) is an intact
    # float64 FlatArrays of this layout on a buffer of its own, and that ``params`` still holds
    # its views; anything else goes to the full check, which raises naming the problem.
    ours = {id(own.flat), id(m.flat), id(v.flat)}

    # What every step of this loop reads and this loop settles once: the segments of the
    # layout, the moments' buffers and the scratch of the step kernel (this thread's, held for
    # the whole loop; only the kernel reads or writes it, and each call starts afresh).
    starts, stops = _layout_segments(layout)
    m_flat, v_flat = m.flat, v.flat
    previous = _previous_values_scratch(own.flat.size)
    float64 = np.dtype(np.float64)

    def step(params, grads, state):  # _clipped_adam_step, in place, on this loop's own buffers
        if not (type(grads) is FlatArrays and grads.layout is layout
                and grads.flat.dtype is float64 and grads.intact() and params.intact()
                and id(grads.flat if grads.flat.base is None else grads.flat.base) not in ours
                and state["m"] is m and state["v"] is v):
            check_flat_step_arguments(params, grads, state["m"], state["v"])
            t, norm = _clipped_adam_step(params, grads, state["t"], state["m"], state["v"],
                                         max_norm, lr_, beta1, beta2, eps)
            return params, {"t": t, "m": state["m"], "v": state["v"]}, norm
        t = state["t"] + 1
        step_size, bias_correction2_sqrt = adam_step_scalars(t, lr_, beta1, beta2)
        norm, written = _clipped_adam_kernel(params.flat, grads.flat, starts, stops, m_flat,
                                             v_flat, max_norm, beta1, beta2, step_size,
                                             bias_correction2_sqrt, eps, previous)
        if not written:  # then every value is as it was
            _raise_step_failure(params, grads, m, v, norm, max_norm, beta1, beta2, step_size,
                                bias_correction2_sqrt, eps)
        return params, {"t": t, "m": m, "v": v}, norm

    # The loss settings depend on config (frozen) and clip_range only: checked at the first
    # minibatch (where minibatch_loss checks them, so any error is the same), then reused.
    settings = None

    def loss(*given, config, clip_range, with_log_ratio, weights):  # minibatch_loss
        nonlocal settings
        arrays = _loss_arrays(given)
        if settings is None:
            settings = _loss_settings(config, clip_range)
        return _loss_of_arrays(arrays, settings, config, with_log_ratio, weights)

    return epoch_loop(own, {"t": t0, "m": m, "v": v}, config=config, lr=lr,
                      clip_range=clip_range, minibatches=minibatches, evaluate=evaluate,
                      backward=backward, loss=loss, step=step)
