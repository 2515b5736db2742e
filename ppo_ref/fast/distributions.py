"""The compiled tier of the action distributions: categorical kernels for the fast policies'
hot loop and the compiled MultiDiscrete (product of categoricals) functions.

Each equals a function of :mod:`ppo_ref.spec.distributions` (the readable definition, which
:mod:`ppo_ref.nn.distributions` re-exports and the policy heads call):

* :data:`inverse_cdf_actions` is the spec's sampling loop compiled, and
  :func:`categorical_sample` draws the actions of
  :func:`ppo_ref.spec.distributions.categorical_sample` from the same uniforms, bit for bit;
* :func:`categorical_eval_kernel` computes :func:`ppo_ref.spec.distributions.categorical_log_prob`
  and :func:`~ppo_ref.spec.distributions.categorical_entropy` (finite logits) within rtol 1e-12,
  and :func:`categorical_backward_kernel` the sum of
  :func:`~ppo_ref.spec.distributions.categorical_log_prob_backward` and
  :func:`~ppo_ref.spec.distributions.categorical_entropy_backward` within rtol 1e-12;
* :func:`multi_categorical_log_prob`, :func:`multi_categorical_entropy`,
  :func:`multi_categorical_log_prob_backward` and :func:`multi_categorical_entropy_backward`
  equal their :mod:`ppo_ref.spec.distributions` namesakes within rtol 1e-12 (atol 1e-15 for the
  gradients); they check their arguments with the spec's own checks (the same errors).

The MLP and recurrent policies (:mod:`ppo_ref.train.policies`, :mod:`ppo_ref.train.recurrent_policies`)
run :func:`categorical_eval_kernel` / :func:`categorical_backward_kernel` for the categorical
head; the probabilities and entropies of the eval kernel are what the backward kernel reads.
"""
from __future__ import annotations

import math

import numpy as np

from ppo_ref._checks import check_generator
from ppo_ref._numba import njit
from ppo_ref.spec import distributions as spec_distributions
from ppo_ref.spec.distributions import as_upstream, multi_components, multi_actions

__all__ = ["inverse_cdf_actions", "categorical_sample", "multi_categorical_log_prob", "multi_categorical_entropy",
           "multi_categorical_log_prob_backward", "multi_categorical_entropy_backward",
           "categorical_eval_kernel", "categorical_backward_kernel"]


# --------------------------------------------------------------------------------------------
# categorical kernels (the policies' hot loop; finite logits, unchecked)

#: :func:`ppo_ref.spec.distributions.inverse_cdf_actions` compiled (the same function: bit for
#: bit).
inverse_cdf_actions = njit(spec_distributions.inverse_cdf_actions)


def categorical_sample(rng: np.random.Generator, logits) -> np.ndarray:
    """:func:`ppo_ref.spec.distributions.categorical_sample`, bit for bit (the same uniforms and
    the same loop, compiled), for the fast policies' 2-D logits ``[R, A]`` (float64 or
    float32). The loop checks each row before using it; a refused row raises the spec's
    ``ValueError`` (naming ``logits``) after the uniforms were drawn.

    Raises:
        ValueError: ``rng`` not a Generator, logits not a 2-D float array, or as
            :func:`ppo_ref.spec.distributions.log_softmax`.
    """
    check_generator(rng)
    z = np.ascontiguousarray(logits)
    if z.ndim != 2 or z.dtype not in (np.float64, np.float32) or z.shape[1] == 0:
        raise ValueError(f"logits must be a float32/float64 array [R, A] with A >= 1, got "
                         f"{z.dtype} {z.shape}")
    u = rng.random(z.shape[0])
    actions = np.empty(z.shape[0], dtype=np.int64)
    if not inverse_cdf_actions(z, u, actions):
        spec_distributions.log_softmax(z)  # raises, naming the refused row
    return actions


@njit
def categorical_eval_kernel(logits, actions, log_probs, entropy, probs):
    """Per row ``i`` of finite ``logits [B, A]``: ``log_probs[i] = log_softmax(logits)[i,
    actions[i]]``, ``entropy[i] = -sum_k pi_k log pi_k`` and ``probs[i] = pi`` (kept for
    :func:`categorical_backward_kernel`). Same steps as :func:`ppo_ref.spec.distributions.log_softmax` (shift by the row
    max, subtract the log of the sum of exponentials, left to right). Returns False (and
    stops) at a non-finite logit, a logit whose shift ``z - max`` overflows float64 (the
    logits :func:`ppo_ref._checks.check_logits` refuses) or an action outside [0, A); the
    caller then raises. float32 logits are widened entry by entry (``np.float64``): the
    arithmetic is float64's whatever the logits' dtype, compiled and interpreted alike."""
    rows, n = logits.shape
    for i in range(rows):
        if actions[i] < 0 or actions[i] >= n:
            return False
        m = np.float64(logits[i, 0])
        for k in range(n):
            z = np.float64(logits[i, k])
            if not math.isfinite(z):
                return False
            if z > m:
                m = z
        s = 0.0
        for k in range(n):
            shifted = np.float64(logits[i, k]) - m
            if shifted == -math.inf:  # finite logits whose spread overflows float64
                return False
            s += math.exp(shifted)
        lse = math.log(s)
        h = 0.0
        for k in range(n):
            lp = (np.float64(logits[i, k]) - m) - lse
            p = math.exp(lp)
            probs[i, k] = p
            h -= p * lp
        log_probs[i] = (np.float64(logits[i, actions[i]]) - m) - lse
        entropy[i] = h
    return True


@njit
def categorical_backward_kernel(probs, actions, entropy, d_log_probs, d_entropy, use_entropy,
                                 d_logits):
    """``d_logits = d_log_probs * (onehot(actions) - pi) - d_entropy * pi * (log pi + H)``
    (the sum of :func:`ppo_ref.spec.distributions.categorical_log_prob_backward` and
    :func:`~ppo_ref.spec.distributions.categorical_entropy_backward`)
    from the ``probs``/``entropy`` of :func:`categorical_eval_kernel`, in float64 whatever the
    arrays' dtype (entries widened by ``np.float64``; the result rounded once on storing)."""
    rows, n = probs.shape
    for i in range(rows):
        d = np.float64(d_log_probs[i])
        a = actions[i]
        for k in range(n):
            p = np.float64(probs[i, k])
            g = -p * d
            if use_entropy and p > 0.0:
                g -= np.float64(d_entropy[i]) * p * (math.log(p) + np.float64(entropy[i]))
            if k == a:
                g += d
            d_logits[i, k] = g


# --------------------------------------------------------------------------------------------
# MultiDiscrete: a product of independent categoricals over consecutive logit slices

def _multi_inputs(logits, nvec):
    """Checked ``(z [R, A] float64 C-contiguous, offsets [K + 1] int64, batch_shape, sizes)``
    by :mod:`ppo_ref.spec.distributions`' checks (``offsets[k]`` = the first logit of component
    ``k``)."""
    z, sizes, _ = multi_components(logits, nvec)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    z2 = np.ascontiguousarray(z.reshape(-1, z.shape[-1]), dtype=np.float64)
    return z2, offsets, z.shape[:-1], sizes, z


@njit
def _multi_categorical_eval_kernel(z, offsets, actions, log_probs, entropy, probs, comp_entropy):
    """Per row ``i`` of validated logits ``z [R, A]`` (float64; each component's slice has a
    finite maximum, ``-inf`` marks a masked choice) and component ``k`` with slice
    ``offsets[k]:offsets[k+1]``: ``log pi_k = (z - max) - log(sum exp(z - max))`` (sums left
    to right), ``probs = exp(log pi_k)``, ``comp_entropy[i, k] = -sum_j p_j log pi_kj`` over
    ``p_j > 0``; ``log_probs[i] = sum_k log pi_k[actions[i, k]]`` and ``entropy[i] = sum_k
    comp_entropy[i, k]``, summed over k in order."""
    rows = z.shape[0]
    K = offsets.size - 1
    for i in range(rows):
        lp_sum = 0.0
        h_sum = 0.0
        for k in range(K):
            lo = offsets[k]
            hi = offsets[k + 1]
            m = -math.inf
            for j in range(lo, hi):
                if z[i, j] > m:
                    m = z[i, j]
            s = 0.0
            for j in range(lo, hi):
                s += math.exp(z[i, j] - m)
            lse = math.log(s)
            h = 0.0
            for j in range(lo, hi):
                lp = (z[i, j] - m) - lse
                p = math.exp(lp)
                probs[i, j] = p
                if p > 0.0:
                    h -= p * lp
            comp_entropy[i, k] = h
            h_sum += h
            lp_sum += (z[i, lo + actions[i, k]] - m) - lse
        log_probs[i] = lp_sum
        entropy[i] = h_sum


@njit
def _multi_categorical_backward_kernel(probs, offsets, actions, comp_entropy, d_log_probs,
                                       d_entropy, d_logits):
    """Per component slice of row ``i``: ``d_logits_j = d_log_probs[i] * ([j = a_k] - p_j)
    - d_entropy[i] * p_j * (log p_j + H_k)`` (0 where ``p_j = 0``), from the ``probs`` and
    ``comp_entropy`` of :func:`_multi_categorical_eval_kernel`; ``d_log_probs``/``d_entropy``
    ``[R]`` (zeros for a term that is absent)."""
    rows = probs.shape[0]
    K = offsets.size - 1
    for i in range(rows):
        d = d_log_probs[i]
        de = d_entropy[i]
        for k in range(K):
            h = comp_entropy[i, k]
            for j in range(offsets[k], offsets[k + 1]):
                p = probs[i, j]
                g = -p * d
                if p > 0.0:
                    g -= de * p * (math.log(p) + h)
                d_logits[i, j] = g
            d_logits[i, offsets[k] + actions[i, k]] += d


def _multi_eval(z2, offsets, a2):
    R = z2.shape[0]
    log_probs = np.empty(R)
    entropy = np.empty(R)
    probs = np.empty(z2.shape)
    comp_entropy = np.empty((R, offsets.size - 1))
    _multi_categorical_eval_kernel(z2, offsets, a2, log_probs, entropy, probs, comp_entropy)
    return log_probs, entropy, probs, comp_entropy


def multi_categorical_log_prob(logits, actions, nvec) -> np.ndarray:
    """Log-probability of MultiDiscrete actions under independent categoricals.

    The logits of component ``k`` are the slice ``logits[..., o_k : o_k + nvec[k]]`` with
    ``o_k = nvec[0] + ... + nvec[k-1]``; ``log pi(a) = sum_k log softmax(slice_k)[a_k]`` (the
    product of the components' probabilities; SB3 ``MultiCategoricalDistribution``, CleanRL
    ``ppo_multidiscrete.py``; Huang et al. 2022, MultiDiscrete detail). Compiled; equals
    :func:`ppo_ref.spec.distributions.multi_categorical_log_prob` within rtol 1e-12: the same
    per-component steps, the components summed in order.

    Args:
        logits: ``[..., sum(nvec)]`` real (float32 widened exactly to float64); ``-inf`` marks a
            masked choice, NaN and ``+inf`` are refused.
        nvec: ``[K]`` integers >= 1, the number of choices of each component.
        actions: integers ``[..., K]`` with ``actions[..., k]`` in ``[0, nvec[k])``.

    Returns:
        float64 ``[...]`` log-probabilities (nats; ``-inf`` if a chosen choice is masked).

    Raises:
        ValueError: bad ``nvec`` or ``logits`` size, NaN/``+inf`` logits or a component with
            every choice masked, ``actions`` of the wrong shape, non-integral or out of range
            (naming the component).
    """
    z2, offsets, batch_shape, sizes, z = _multi_inputs(logits, nvec)
    a2 = multi_actions(actions, z, sizes).reshape(z2.shape[0], len(sizes))
    return _multi_eval(z2, offsets, a2)[0].reshape(batch_shape)


def multi_categorical_entropy(logits, nvec) -> np.ndarray:
    """Entropy of the product distribution: ``H = sum_k H(softmax(slice_k))`` (independent
    components; slices as :func:`multi_categorical_log_prob`). Compiled; equals
    :func:`ppo_ref.spec.distributions.multi_categorical_entropy` within rtol 1e-12.

    Returns float64 ``[...]`` (nats). Raises ``ValueError`` as
    :func:`multi_categorical_log_prob`.
    """
    z2, offsets, batch_shape, _, _ = _multi_inputs(logits, nvec)
    a2 = np.zeros((z2.shape[0], offsets.size - 1), dtype=np.int64)
    return _multi_eval(z2, offsets, a2)[1].reshape(batch_shape)


def _multi_backward(logits, nvec, actions, d_log_probs, d_entropy):
    z2, offsets, batch_shape, sizes, z = _multi_inputs(logits, nvec)
    R = z2.shape[0]
    if actions is None:
        a2 = np.zeros((R, offsets.size - 1), dtype=np.int64)
    else:
        a2 = multi_actions(actions, z, sizes).reshape(R, len(sizes))
    zeros = np.zeros(R)
    d_lp = zeros
    d_ent = zeros
    if d_log_probs is not None:
        d = as_upstream(d_log_probs, "d_log_probs", batch_shape, "logits[..., 0]")
        d_lp = np.ascontiguousarray(d.reshape(-1), dtype=np.float64)
    if d_entropy is not None:
        d = as_upstream(d_entropy, "d_entropy", batch_shape, "logits[..., 0]")
        d_ent = np.ascontiguousarray(d.reshape(-1), dtype=np.float64)
    _, _, probs, comp_entropy = _multi_eval(z2, offsets, a2)
    d_logits = np.empty(z2.shape)
    _multi_categorical_backward_kernel(probs, offsets, a2, comp_entropy, d_lp, d_ent, d_logits)
    return d_logits.reshape(tuple(batch_shape) + (z2.shape[1],))


def multi_categorical_log_prob_backward(logits, actions, nvec, d_log_probs) -> np.ndarray:
    """Gradient of :func:`multi_categorical_log_prob` w.r.t. the logits: in the slice of
    component ``k``, ``d_logits_j = d_log_probs * ([j = a_k] - pi_k(j))`` (each component's
    categorical gradient; the sum over components touches each slice once). Compiled; equals
    :func:`ppo_ref.spec.distributions.multi_categorical_log_prob_backward` within rtol 1e-12
    (atol 1e-15).

    Args:
        logits, actions, nvec: as :func:`multi_categorical_log_prob`.
        d_log_probs: ``[...]`` finite upstream gradient.

    Returns:
        float64 ``d_logits [..., sum(nvec)]``.

    Raises:
        ValueError: as :func:`multi_categorical_log_prob`; ``d_log_probs`` of the wrong shape
            or non-finite.
    """
    return _multi_backward(logits, nvec, actions, d_log_probs, None)


def multi_categorical_entropy_backward(logits, nvec, d_entropy) -> np.ndarray:
    """Gradient of :func:`multi_categorical_entropy` w.r.t. the logits: in the slice of
    component ``k``, ``d_logits_j = -d_entropy * pi_k(j) * (log pi_k(j) + H_k)`` (0 for a
    masked choice). Compiled; equals
    :func:`ppo_ref.spec.distributions.multi_categorical_entropy_backward` within rtol 1e-12
    (atol 1e-15).

    Returns float64 ``d_logits [..., sum(nvec)]``. Raises ``ValueError`` as
    :func:`multi_categorical_log_prob`, or for ``d_entropy`` of the wrong shape or non-finite.
    """
    return _multi_backward(logits, nvec, None, None, d_entropy)
