"""Orthogonal initialisation, the linear layer, tanh/relu and the multilayer perceptron.

Weights are in torch layout ``w: [out, in]`` (``torch.nn.Linear``: ``y = x @ w.T + b``), so they
copy to and from torch unchanged. ``params`` and ``grads`` are ``dict[str, float64 ndarray]``
with the same keys and shapes: a linear layer ``{"w", "b"}``, an MLP ``{"w0", "b0", ..., "wL",
"bL"}``. Each layer is ``*_forward(params, x) -> (y, cache)`` and ``*_backward(params, cache,
dy) -> (dx, grads)`` (activations: ``*_forward(x)``, ``*_backward(cache, dy) -> dx``); caches
are NamedTuples of what the backward reads, and nothing is mutated. Inputs ``x [..., in]`` are
cast to float64 and any leading batch shape is carried through.
"""
from __future__ import annotations

import math
from typing import Dict, Mapping, NamedTuple, Sequence, Tuple

import numpy as np

from ppo_ref._checks import (as_float_array, check_choice, check_count, check_generator,
                             check_last_dim, check_positive_int, check_real_scalar,
                             check_same_shape, get_param)

__all__ = [
    "ACTIVATIONS", "LinearCache", "ActivationCache", "MLPCache",
    "orthogonal", "linear_init", "torch_linear_init", "linear_forward", "linear_backward",
    "tanh_forward", "tanh_backward", "relu_forward", "relu_backward",
    "mlp_init", "mlp_forward", "mlp_backward", "mlp_depth",
]

ACTIVATIONS = ("tanh", "relu")
"""Hidden-layer activations understood by :func:`mlp_forward`."""

Params = Dict[str, np.ndarray]


class LinearCache(NamedTuple):
    """What :func:`linear_backward` reads: the layer input ``x`` (float64 ``[..., in]``)."""
    x: np.ndarray


class ActivationCache(NamedTuple):
    """What an activation backward reads: its output ``y`` (float64, any shape)."""
    y: np.ndarray


class MLPCache(NamedTuple):
    """What :func:`mlp_backward` reads: a :class:`LinearCache` per layer ``0..L``, an
    :class:`ActivationCache` per hidden layer ``0..L-1``, and the activation's name."""
    linear: Tuple[LinearCache, ...]
    hidden: Tuple[ActivationCache, ...]
    activation: str


def _as_float64(x, name: str) -> np.ndarray:
    return as_float_array(x, name).astype(np.float64, copy=False)


def householder_qr(a: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Reduced QR of a tall matrix by Householder reflections: ``a = Q R``.

    Golub & Van Loan, "Matrix Computations" (4th ed.), Algorithm 5.2.1, LAPACK's sign choice.
    For column ``k = 0 .. n-1`` of the partly reduced ``R`` (initially ``a``)::

        x      = R[k:, k]
        alpha  = -sign(x_0) * ||x||                  (sign(0) taken as +)
        v      = x - alpha * e_1                      the reflector I - 2 v v^T / (v^T v)
        R[k:, j] <- R[k:, j] - (2 v.R[k:, j] / v.v) v     for every column j > k
        R_kk   = alpha

    then ``Q`` = the reflections applied to ``I[:, :n]`` in reverse order. Every inner product
    is a ``math.fsum`` (correctly rounded), so the bits are the same on every IEEE 754 machine
    (no BLAS). ``a``: float64 ``[m, n]``, ``m >= n`` (not modified). Returns ``(q, r_diag)``:
    ``q [m, n]`` with orthonormal columns, ``r_diag [n]`` the diagonal of ``R`` (0 where a
    column is already zero below the diagonal).
    """
    m, n = a.shape
    r = np.array(a, dtype=np.float64)
    reflectors = []
    r_diag = np.zeros(n)
    for k in range(n):
        x = r[k:, k]
        norm = math.sqrt(math.fsum(x * x))
        alpha = -norm if x[0] >= 0.0 else norm
        v = x.copy()
        v[0] -= alpha
        vv = math.fsum(v * v)
        reflectors.append((v, vv))
        if vv == 0.0:  # x = 0 (probability zero): no reflection
            continue
        r_diag[k] = alpha
        for j in range(k + 1, n):
            r[k:, j] -= (2.0 * math.fsum(v * r[k:, j]) / vv) * v
    q = np.eye(m, n)
    for k in reversed(range(n)):
        v, vv = reflectors[k]
        if vv == 0.0:
            continue
        for j in range(n):
            q[k:, j] -= (2.0 * math.fsum(v * q[k:, j]) / vv) * v
    return q, r_diag


def orthogonal(rng: np.random.Generator, shape: Sequence[int], gain: float = 1.0) -> np.ndarray:
    """A random (semi-)orthogonal matrix scaled by ``gain``, as ``torch.nn.init.orthogonal_``
    (Saxe, McClelland & Ganguli 2014, arXiv:1312.6120).

    ``rows = shape[0]``, ``cols = prod(shape[1:])``; draw ``A ~ N(0, 1)^{rows x cols}`` (C
    order), transpose it if ``rows < cols``, take ``Q, R =`` :func:`householder_qr` ``(A)``,
    ``Q <- Q * sign(diag(R))`` column-wise (Haar-distributed: Mezzadri 2007,
    arXiv:math-ph/0609050), transpose back, return ``gain * Q`` reshaped to ``shape``. So
    ``W W^T = gain^2 I`` when ``rows <= cols`` and ``W^T W = gain^2 I`` when ``rows >= cols``. A
    zero ``R_jj`` keeps sign +1 (torch would zero the column). Same distribution as torch, not
    the same values for a seed; the same bits on every machine. PPO implementations use gain
    sqrt(2) for hidden layers, 0.01 for the policy head, 1.0 for the value head, zero biases
    (Huang et al. 2022, "The 37 Implementation Details of PPO", detail 2).

    ``shape``: at least two positive int dimensions, torch layout ``[out, in, ...]``; ``gain``:
    a finite real (0 gives a zero matrix). Returns float64 of ``shape``. Raises ``ValueError``
    for ``rng`` not a Generator, a ``shape`` of fewer than two dimensions or a dimension that is
    not an int >= 1, or a non-finite ``gain``.
    """
    check_generator(rng)
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__"):
        raise ValueError(f"shape must be a sequence of ints, got {shape!r}")
    if len(shape) < 2:
        raise ValueError(f"shape must have at least 2 dimensions (torch semantics), got "
                         f"{tuple(shape)}")
    dims = tuple(check_count(d, f"shape[{k}]", 1) for k, d in enumerate(shape))
    g = check_real_scalar(gain, "gain")
    rows, cols = dims[0], math.prod(dims[1:])
    a = rng.standard_normal((rows, cols))
    wide = rows < cols
    if wide:
        a = a.T
    q, r_diag = householder_qr(a)  # reduced: q is [max, min] with orthonormal columns
    signs = np.where(r_diag < 0.0, -1.0, 1.0)
    q = q * signs  # column j times sign(R_jj)
    if wide:
        q = q.T
    return np.ascontiguousarray(g * q).reshape(dims)


def linear_init(rng: np.random.Generator, in_dim: int, out_dim: int, gain: float) -> Params:
    """A linear layer: ``w = orthogonal(rng, (out_dim, in_dim), gain)``, ``b = zeros(out_dim)``
    (CleanRL ``layer_init``, SB3 ``ActorCriticPolicy.init_weights``), float64. Raises
    ``ValueError`` for a dimension that is not a positive int or a non-finite ``gain``."""
    in_dim = check_positive_int(in_dim, "in_dim")
    out_dim = check_positive_int(out_dim, "out_dim")
    gain = check_real_scalar(gain, "gain")
    return {"w": orthogonal(rng, (out_dim, in_dim), gain), "b": np.zeros(out_dim)}


def torch_linear_init(rng: np.random.Generator, in_dim: int, out_dim: int) -> Params:
    """A linear layer as ``torch.nn.Linear`` initializes itself (its ``reset_parameters``)::

        w [out_dim, in_dim], b [out_dim] ~ U(-k, k),    k = 1 / sqrt(in_dim)

    (``kaiming_uniform_`` with ``a = sqrt(5)`` has that bound), ``w`` drawn from ``rng`` before
    ``b``: SB3's ``ortho_init=False``. The same distribution as torch, not the same values for a
    seed. Returns float64 arrays. Raises ``ValueError`` for a dimension that is not a positive
    int."""
    in_dim = check_positive_int(in_dim, "in_dim")
    out_dim = check_positive_int(out_dim, "out_dim")
    k = 1.0 / math.sqrt(in_dim)
    w = rng.uniform(-k, k, size=(out_dim, in_dim))
    return {"w": w, "b": rng.uniform(-k, k, size=out_dim)}


def _linear_params(params: Mapping, wkey: str = "w",
                   bkey: str = "b") -> Tuple[np.ndarray, np.ndarray]:
    """``(params[wkey] [out, in], params[bkey] [out])``, checked float64."""
    w = get_param(params, wkey, (None, None))
    b = get_param(params, bkey, (w.shape[0],))
    return w, b


def linear_forward(params: Mapping[str, np.ndarray], x) -> Tuple[np.ndarray, LinearCache]:
    """``y = x @ w.T + b`` (``torch.nn.Linear``) for ``params = {"w": [out, in], "b": [out]}``
    and finite ``x [..., in]``. Returns ``(y [..., out], LinearCache)``. Raises ``ValueError``
    for bad params, a wrong last dimension or non-finite ``x``."""
    w, b = _linear_params(params)
    x = _as_float64(x, "x")
    check_last_dim(x, "x", w.shape[1])
    y = x @ w.T + b
    return y, LinearCache(x)


def linear_backward(params: Mapping[str, np.ndarray], cache: LinearCache, dy
                    ) -> Tuple[np.ndarray, Params]:
    """Gradients of :func:`linear_forward` for ``dy = dL/dy [..., out]``, leading dimensions
    flattened into one batch::

        dx = dy @ w,    dw = dy.T @ x,    db = sum_batch dy

    Returns ``(dx [..., in], {"w": [out, in], "b": [out]})``. Raises ``ValueError`` for bad
    params, a cache that is not a :class:`LinearCache`, or a ``dy`` of the wrong shape or
    non-finite.
    """
    w, _ = _linear_params(params)
    if not isinstance(cache, LinearCache):
        raise ValueError(f"cache must be a LinearCache, got {type(cache).__name__}")
    x = cache.x
    dy = _as_float64(dy, "dy")
    check_same_shape(dy, "dy", x.shape[:-1] + (w.shape[0],), "the forward output")
    dy_rows = dy.reshape(-1, w.shape[0])  # [M, out], M = prod(batch shape)
    x_rows = x.reshape(-1, w.shape[1])  # [M, in]
    dw = dy_rows.T @ x_rows
    db = dy_rows.sum(axis=0)
    dx = dy @ w
    return dx, {"w": dw, "b": db}


def tanh_forward(x) -> Tuple[np.ndarray, ActivationCache]:
    """``y = tanh(x)`` elementwise for finite ``x``; returns ``(y, ActivationCache)``."""
    x = _as_float64(x, "x")
    y = np.tanh(x)
    return y, ActivationCache(y)


def _activation_backward_inputs(cache, dy) -> Tuple[np.ndarray, np.ndarray]:
    """The checked ``(y, dy)`` of an activation's backward."""
    if not isinstance(cache, ActivationCache):
        raise ValueError(f"cache must be an ActivationCache, got {type(cache).__name__}")
    dy = _as_float64(dy, "dy")
    check_same_shape(dy, "dy", cache.y.shape, "the forward output")
    return cache.y, dy


def tanh_backward(cache: ActivationCache, dy) -> np.ndarray:
    """``dx = dy * (1 - y^2)`` with ``y = tanh(x)`` from the cache. Raises ``ValueError`` for
    a bad cache or a ``dy`` not of ``y``'s shape or non-finite."""
    y, dy = _activation_backward_inputs(cache, dy)
    return dy * (1.0 - y * y)


def relu_forward(x) -> Tuple[np.ndarray, ActivationCache]:
    """``y = max(x, 0)`` elementwise for finite ``x``; returns ``(y, ActivationCache)``."""
    x = _as_float64(x, "x")
    y = np.maximum(x, 0.0)
    return y, ActivationCache(y)


def relu_backward(cache: ActivationCache, dy) -> np.ndarray:
    """``dx = dy * [y > 0]`` (0 at ``x = 0``, as torch). Raises ``ValueError`` as
    :func:`tanh_backward`."""
    y, dy = _activation_backward_inputs(cache, dy)
    return dy * (y > 0.0)


_ACTIVATION_FUNCTIONS = {
    "tanh": (tanh_forward, tanh_backward),
    "relu": (relu_forward, relu_backward),
}


def mlp_init(rng: np.random.Generator, in_dim: int, hidden_sizes: Sequence[int], out_dim: int, *,
             hidden_gain: float = math.sqrt(2.0), out_gain: float = 1.0,
             ortho_init: bool = True) -> Params:
    """Parameters of an MLP ``in_dim -> hidden_sizes... -> out_dim``: keys ``w0, b0, ..., wL,
    bL`` in order (``L = len(hidden_sizes)``, which may be 0), ``w_i =`` :func:`orthogonal`
    ``(rng, (out_i, in_i), gain_i)`` drawn in layer order with ``hidden_gain`` for the hidden
    layers and ``out_gain`` for the last, zero biases (SB3, CleanRL); with ``ortho_init=False``
    each layer is :func:`torch_linear_init` instead (the gains unused). Returns float64 arrays.
    Raises ``ValueError`` for non-positive or non-int sizes or non-finite gains."""
    in_dim = check_positive_int(in_dim, "in_dim")
    out_dim = check_positive_int(out_dim, "out_dim")
    try:
        hidden = [check_positive_int(h, "hidden_sizes entries") for h in hidden_sizes]
    except TypeError:
        raise ValueError(f"hidden_sizes must be a sequence of ints, got {hidden_sizes!r}") from None
    hidden_gain = check_real_scalar(hidden_gain, "hidden_gain")
    out_gain = check_real_scalar(out_gain, "out_gain")
    sizes = [in_dim] + hidden + [out_dim]
    n_layers = len(sizes) - 1
    params: Params = {}
    for i in range(n_layers):
        if ortho_init:
            gain = out_gain if i == n_layers - 1 else hidden_gain
            layer = {"w": orthogonal(rng, (sizes[i + 1], sizes[i]), gain),
                     "b": np.zeros(sizes[i + 1])}
        else:
            layer = torch_linear_init(rng, sizes[i], sizes[i + 1])
        params[f"w{i}"], params[f"b{i}"] = layer["w"], layer["b"]
    return params


def mlp_depth(params: Mapping, prefix: str = "") -> int:
    """The number of layers of the MLP under ``prefix + "w0", prefix + "b0", ...``: the one
    check of an MLP's parameters (finite float64 ``w [out, in]``, ``b [out]``, widths that
    chain; other keys are not read). Raises ``ValueError`` for not a mapping, no ``w0``, a
    missing or malformed array, or widths that do not chain."""
    get_param(params, prefix + "w0", (None, None))  # a mapping with at least one layer
    depth = 0
    while prefix + f"w{depth}" in params:
        w, _ = _linear_params(params, prefix + f"w{depth}", prefix + f"b{depth}")
        if depth > 0 and w.shape[1] != params[prefix + f"w{depth - 1}"].shape[0]:
            raise ValueError(f"params[{prefix + f'w{depth}'!r}] has input width {w.shape[1]}, "
                             f"expected {params[prefix + f'w{depth - 1}'].shape[0]} (the previous "
                             f"layer's output width)")
        depth += 1
    return depth


def _mlp_layer(params: Mapping, i: int, prefix: str = "") -> Params:
    """Layer ``i`` of an MLP as linear-layer params ``{"w", "b"}`` (the same arrays)."""
    return {"w": params[prefix + f"w{i}"], "b": params[prefix + f"b{i}"]}


def _check_mlp_keys(params: Mapping, depth: int) -> None:
    """``ValueError`` unless ``params`` has exactly the keys ``w0, b0, ..., w{depth-1}, ...``."""
    expected = {f"{k}{i}" for i in range(depth) for k in ("w", "b")}
    if set(params) != expected:
        extra = sorted(set(params) - expected)
        raise ValueError(f"params must have exactly the keys w0, b0, ..., w{depth - 1}, "
                         f"b{depth - 1}; unexpected: {extra}")


def mlp_forward(params: Mapping[str, np.ndarray], x, activation: str = "tanh"
                ) -> Tuple[np.ndarray, MLPCache]:
    """MLP forward, hidden layers activated, output layer linear::

        h_0 = x,    h_{i+1} = act(h_i @ w_i.T + b_i)  (i = 0 .. L-1),    y = h_L @ w_L.T + b_L

    ``params``: exactly the keys of :func:`mlp_init`; ``x``: finite ``[..., in]``;
    ``activation``: a key of :data:`ACTIVATIONS` (``"tanh"``: SB3/CleanRL PPO). Returns
    ``(y [..., out], MLPCache)``. Raises ``ValueError`` for an unknown activation, malformed
    params (missing or extra keys, widths that do not chain), or a bad ``x``.
    """
    check_choice(activation, "activation", ACTIVATIONS)
    depth = mlp_depth(params)
    _check_mlp_keys(params, depth)
    act_forward, _ = _ACTIVATION_FUNCTIONS[activation]
    h = _as_float64(x, "x")
    check_last_dim(h, "x", params["w0"].shape[1])
    linear_caches, hidden_caches = [], []
    for i in range(depth - 1):
        a, linear_cache = linear_forward(_mlp_layer(params, i), h)
        h, hidden_cache = act_forward(a)
        linear_caches.append(linear_cache)
        hidden_caches.append(hidden_cache)
    y, linear_cache = linear_forward(_mlp_layer(params, depth - 1), h)
    linear_caches.append(linear_cache)
    return y, MLPCache(tuple(linear_caches), tuple(hidden_caches), activation)


def mlp_backward(params: Mapping[str, np.ndarray], cache: MLPCache, dy
                 ) -> Tuple[np.ndarray, Params]:
    """MLP backward, last layer first: :func:`linear_backward` of each layer, and between two
    layers the activation's backward. ``dy``: finite ``[..., out]``. Returns ``(dx [..., in],
    grads)`` with the keys (and key order) of ``params``. Raises ``ValueError`` for malformed
    params, a cache that is not an :class:`MLPCache` or does not match ``params``, or a bad
    ``dy``."""
    depth = mlp_depth(params)
    _check_mlp_keys(params, depth)
    if not isinstance(cache, MLPCache):
        raise ValueError(f"cache must be an MLPCache, got {type(cache).__name__}")
    if len(cache.linear) != depth or len(cache.hidden) != depth - 1:
        raise ValueError(f"cache holds {len(cache.linear)} layers but params has {depth}")
    _, act_backward = _ACTIVATION_FUNCTIONS[cache.activation]
    grads: Params = {}
    d = dy
    for i in reversed(range(depth)):
        d, layer_grads = linear_backward(_mlp_layer(params, i), cache.linear[i], d)
        grads[f"w{i}"] = layer_grads["w"]
        grads[f"b{i}"] = layer_grads["b"]
        if i > 0:
            d = act_backward(cache.hidden[i - 1], d)
    return d, {k: grads[k] for k in params}
