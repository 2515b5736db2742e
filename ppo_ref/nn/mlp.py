"""Linear layers, tanh/relu activations and the multilayer perceptron, with manual backprop.

Conventions (shared by every layer in :mod:`ppo_ref.nn`):

* Weights are in torch layout ``w: [out, in]`` and a linear layer computes
  ``y = x @ w.T + b`` (``torch.nn.Linear``), so weights can be copied to and from torch as-is.
* ``params`` and ``grads`` are ``dict[str, float64 ndarray]`` with identical keys and shapes.
* Every layer is a pair ``*_forward(params, x) -> (y, cache)`` and
  ``*_backward(params, cache, dy) -> (dx, grads)``; caches are NamedTuples holding exactly what
  the backward pass reads; backward never mutates ``params``, ``cache`` or ``dy``.
* Work is in float64. float32 (and integer/bool) inputs are cast to float64 on entry.
* Inputs ``x`` are ``[..., in]``: any leading batch shape (``[B, in]``, ``[T, N, in]`` or a
  single ``[in]`` vector); the leading shape is carried through to ``y`` and ``dx``.

Backward equations, for ``y = x @ w.T + b`` and an upstream gradient ``dy = dL/dy``
(leading dimensions flattened into one batch dimension)::

    dL/dx = dy @ w          dL/dw = dy.T @ x          dL/db = sum_batch dy

and for the activations ``h = tanh(a)``: ``dL/da = dL/dh * (1 - h^2)``;
``h = relu(a) = max(a, 0)``: ``dL/da = dL/dh * [a > 0]`` (derivative 0 at ``a = 0``, as torch).
"""
from __future__ import annotations

import math
from typing import Dict, List, Mapping, NamedTuple, Sequence, Tuple

import numpy as np

from ppo_ref._checks import as_float_array, check_choice, check_real_scalar
from ppo_ref._numba import njit
from ppo_ref.nn.init import orthogonal
from ppo_ref.fast.lstm import (_add_products, _column_sums, _linear_rows, _tanh_any,
                              _transpose_into, _wide)

__all__ = [
    "ACTIVATIONS", "LinearCache", "ActivationCache", "MLPCache",
    "linear_init", "linear_forward", "linear_backward",
    "tanh_forward", "tanh_backward", "relu_forward", "relu_backward",
    "mlp_init", "mlp_forward", "mlp_backward",
]

ACTIVATIONS = ("tanh", "relu")
"""Hidden-layer activations understood by :func:`mlp_forward`."""

Params = Dict[str, np.ndarray]


class LinearCache(NamedTuple):
    """What :func:`linear_backward` needs: the layer input ``x`` (float64, ``[..., in]``)."""
    x: np.ndarray


class ActivationCache(NamedTuple):
    """What an activation backward needs: its output ``y`` (float64, any shape).

    ``tanh'(a) = 1 - y^2`` and ``relu'(a) = [y > 0]`` are both functions of the output alone.
    """
    y: np.ndarray


class MLPCache(NamedTuple):
    """What :func:`mlp_backward` needs.

    Attributes:
        layer_inputs: ``(x, h_1, ..., h_L)``: the input of every linear layer, each float64
            ``[M, width]`` with the leading batch dimensions of ``x`` flattened into ``M``.
            ``h_i`` is the activation output of hidden layer ``i`` (post-activation), from which
            both activation derivatives are computed.
        batch_shape: the leading shape of ``x`` (``x.shape[:-1]``), restored on ``dx``.
        activation: ``"tanh"`` or ``"relu"``.
    """
    layer_inputs: Tuple[np.ndarray, ...]
    batch_shape: Tuple[int, ...]
    activation: str


# --------------------------------------------------------------------------------------------
# validation helpers (cheap: shape and dtype checks plus one finiteness pass over inputs)

def _as_input(x, name: str, in_dim: int) -> np.ndarray:
    """``x`` as a float64 array ``[..., in_dim]``; ``ValueError`` naming ``name`` otherwise."""
    if type(x) is np.ndarray and x.dtype == np.float64:
        arr = x
        if arr.ndim == 0:
            raise ValueError(f"{name} must have at least 1 dimension [..., {in_dim}], got a scalar")
        if arr.size and not np.isfinite(arr).all():
            arr = as_float_array(arr, name)  # raises, naming the first bad entry
    else:
        arr = as_float_array(x, name)
        if arr.ndim == 0:
            raise ValueError(f"{name} must have at least 1 dimension [..., {in_dim}], got a scalar")
        if arr.dtype != np.float64:
            arr = arr.astype(np.float64)
    if arr.shape[-1] != in_dim:
        raise ValueError(f"{name} must have last dimension {in_dim}, got shape {arr.shape}")
    return arr


def _as_grad(dy, name: str, shape: Tuple[int, ...]) -> np.ndarray:
    """Upstream gradient ``dy`` as float64 with exactly ``shape``."""
    if type(dy) is np.ndarray and dy.dtype == np.float64:
        arr = dy
        if arr.size and not np.isfinite(arr).all():
            arr = as_float_array(arr, name)  # raises
    else:
        arr = as_float_array(dy, name)
        if arr.dtype != np.float64:
            arr = arr.astype(np.float64)
    if arr.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (the forward output), got {arr.shape}")
    return arr


def _check_dim(value, name: str) -> int:
    """A positive int dimension."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return int(value)


def _check_params_mapping(params, name: str = "params") -> None:
    if not isinstance(params, Mapping):
        raise ValueError(f"{name} must be a dict of arrays, got {type(params).__name__}")


def _layer(params: Mapping, wkey: str, bkey: str, in_dim: int = -1) -> Tuple[np.ndarray, np.ndarray]:
    """Fetch and check one linear layer ``(w [out, in], b [out])`` (float64)."""
    try:
        w = params[wkey]
        b = params[bkey]
    except KeyError as exc:
        raise ValueError(f"params is missing key {exc.args[0]!r}") from None
    if not (isinstance(w, np.ndarray) and w.ndim == 2 and w.dtype == np.float64):
        raise ValueError(f"params[{wkey!r}] must be a float64 array [out, in], got "
                         f"{getattr(w, 'dtype', type(w).__name__)} {getattr(w, 'shape', '')}")
    if not (isinstance(b, np.ndarray) and b.shape == (w.shape[0],) and b.dtype == np.float64):
        raise ValueError(f"params[{bkey!r}] must be a float64 array of shape {(w.shape[0],)}, got "
                         f"{getattr(b, 'dtype', type(b).__name__)} {getattr(b, 'shape', '')}")
    if in_dim >= 0 and w.shape[1] != in_dim:
        raise ValueError(f"params[{wkey!r}] has input width {w.shape[1]}, expected {in_dim} "
                         f"(the previous layer's output width)")
    return w, b


_W = tuple(f"w{i}" for i in range(64))
_B = tuple(f"b{i}" for i in range(64))


def _mlp_layers(params: Mapping, prefix: str = "") -> List[Tuple[np.ndarray, np.ndarray]]:
    """The layers ``[(w0, b0), ..., (wL, bL)]`` stored under ``prefix + "w{i}"``, chained.

    Raises ``ValueError`` if there is no layer, a key is missing, or widths do not chain.
    """
    layers = []
    in_dim = -1
    i = 0
    while True:
        wkey = prefix + (_W[i] if i < 64 else f"w{i}")
        if wkey not in params:
            break
        w, b = _layer(params, wkey, prefix + (_B[i] if i < 64 else f"b{i}"), in_dim)
        layers.append((w, b))
        in_dim = w.shape[0]
        i += 1
    if not layers:
        raise ValueError(f"params has no layer {prefix}w0")
    return layers


# --------------------------------------------------------------------------------------------
# private unchecked kernels (2-D float64 arrays), shared with ppo_ref.nn.actor_critic

@njit
def _tanh_grad_inplace(dh, h):
    """``dh *= 1 - h * h`` elementwise (2-D), one pass instead of NumPy's three.

    Same operations in the same order as ``dh * (1.0 - h * h)`` (no fastmath), so the same bits.
    """
    rows, cols = dh.shape
    for i in range(rows):
        for j in range(cols):
            dh[i, j] *= 1.0 - h[i, j] * h[i, j]


def _activation_grad_inplace(dh: np.ndarray, h: np.ndarray, activation: str) -> None:
    """``dh *= act'(a)`` given the activation output ``h``; ``dh`` must be a fresh array."""
    if activation == "relu":
        dh *= h > 0.0
    else:
        _tanh_grad_inplace(dh, h)


def _affine(h: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``h @ w.T + b`` as a new array (one BLAS product, then the broadcast bias addition)."""
    a = h @ w.T
    a += b
    return a


def _mlp_forward_2d(layers, x2: np.ndarray, activation: str, affine=_affine):
    """Forward through ``layers`` on a 2-D batch; returns ``(y, layer_inputs)``.

    ``affine(h, w, b) -> a`` computes each layer's ``h @ w.T + b`` as a new array (default
    :func:`_affine`); the fast paths pass their own (compiled bias addition, row-wise sums)
    and keep this one loop of layers and activations."""
    inputs = [x2]
    h = x2
    last = len(layers) - 1
    relu = activation == "relu"
    for i, (w, b) in enumerate(layers):
        a = affine(h, w, b)
        if i < last:
            if relu:
                np.maximum(a, 0.0, out=a)
            else:
                np.tanh(a, out=a)
            inputs.append(a)
        h = a
    return h, tuple(inputs)


def _mlp_backward_2d(layers, layer_inputs, dy2: np.ndarray, activation: str, prefix: str,
                     grads: Params, need_dx: bool):
    """Backward through ``layers``; writes ``grads[prefix + "w{i}"]`` etc., returns ``dx`` or None.

    ``dy2`` is never modified (only freshly computed arrays are updated in place).
    """
    d = dy2
    for i in range(len(layers) - 1, -1, -1):
        w, _ = layers[i]
        h = layer_inputs[i]
        grads[prefix + (_W[i] if i < 64 else f"w{i}")] = d.T @ h
        grads[prefix + (_B[i] if i < 64 else f"b{i}")] = d.sum(axis=0)
        if i == 0 and not need_dx:
            return None
        dh = d @ w  # a fresh array: safe to update in place
        if i > 0:
            _activation_grad_inplace(dh, h, activation)
        d = dh
    return d


# --------------------------------------------------------------------------------------------
# Compiled MLP on a flat parameter buffer (the recurrent policy's towers on its fast path)
#
# An MLP whose layers live in one 1-D buffer ``flat`` (float64 or float32), described by a
# layer table ``table`` int64 ``[L, 4]``: row i = ``(w offset, b offset, out_i, in_i)``, so
# ``w_i = flat[w_off : w_off + out_i * in_i].reshape(out_i, in_i)`` (torch layout) and
# ``b_i = flat[b_off : b_off + out_i]``. The gradients go into a buffer of the same layout (the
# same table). The outputs of all layers of a batch of M rows are kept in one 1-D buffer
# ``acts`` of ``M * sum_i out_i`` entries: layer i's block ``[M, out_i]`` (post-activation for
# the hidden layers, the linear output for the last) follows layer i-1's.
#
# Summation order (documented, BLAS-independent, so the results are the same on every machine
# with IEEE 754 fused multiply-add, whatever BLAS is installed): every product is a chain of
# FMAs by :func:`ppo_ref.fast.lstm._add_products`,
#
#     forward     a[n, j]     = fma(h[n, K-1], w[j, K-1], ... fma(h[n, 0], w[j, 0], b[j]))
#                               (k = 0 .. in-1: a row never depends on another row)
#     backward    gw[j, k]    = fma(d[M-1, j], h[M-1, k], ... fma(d[0, j], h[0, k], 0))
#                               (rows n = 0 .. M-1 in order)
#                 gb[j]       = (((0 + d[0, j]) + d[1, j]) + ...) + d[M-1, j]
#                 dh[n, k]    = fma(d[n, out-1], w[out-1, k], ... fma(d[n, 0], w[0, k], 0))
#                               (j = 0 .. out-1), then times act'(.) for a hidden layer;
#                 dx[n, k]   += the same chain for layer 0, continuing from dx's entry.
#
# Activations: relu ``max(a, 0)`` (derivative ``[h > 0]``, 0 at 0 as torch) or tanh by the
# project's own :func:`ppo_ref.fast.lstm._tanh_any` (derivative ``1 - h^2``), in the dtype of the
# buffers. The kernels call ``_add_products``, ``_linear_rows`` and ``_tanh_any`` of
# :mod:`ppo_ref.nn.lstm` (one product primitive for the whole project); numba's on-disk cache
# does not see edits to those: after changing them, delete the ``*.nbi``/``*.nbc`` files of
# ``ppo_ref/nn/__pycache__``.
# --------------------------------------------------------------------------------------------

_ZERO_F32 = np.float32(0.0)   # dtype-neutral constants: float32 stays float32, float64 exact
_ONE_F32 = np.float32(1.0)


@njit
def _activate_inplace(a, relu):
    """``a <- relu(a)`` (``a > 0 ? a : 0``) or ``a <- tanh(a)`` (:func:`_tanh_any`), 2-D."""
    _wide()
    rows, cols = a.shape
    if relu:
        for n in range(rows):
            for j in range(cols):
                v = a[n, j]
                a[n, j] = v if v > _ZERO_F32 else _ZERO_F32
    else:
        for n in range(rows):
            for j in range(cols):
                a[n, j] = _tanh_any(a[n, j])


@njit
def _activation_grad(d, h, relu):
    """``d <- d * act'(h)`` (``h`` the activation's output: relu ``[h > 0]``, tanh ``1 - h^2``),
    2-D ``d, h [M, W]``. tanh: the operations of :func:`_activation_grad_inplace` (same bits);
    relu: ``d`` where ``h > 0``, else +0 (a product ``d * 0.0`` could give -0; no sum
    downstream differs)."""
    _wide()
    rows, cols = d.shape
    if relu:
        for n in range(rows):
            for j in range(cols):
                d[n, j] = d[n, j] if h[n, j] > _ZERO_F32 else _ZERO_F32
    else:
        for n in range(rows):
            for j in range(cols):
                d[n, j] *= _ONE_F32 - h[n, j] * h[n, j]


@njit
def _activation_grad_transposed(d, h, relu, d_t):
    """:func:`_activation_grad` on ``d`` then ``d_t <- d.T`` (:func:`_transpose_into`),
    ``d_t [W, M]``."""
    _activation_grad(d, h, relu)
    _transpose_into(d, d_t)


@njit
def _mlp_forward_flat(x, flat, table, relu, acts):
    """Compiled MLP forward on a flat parameter buffer (section comment above).

    Args:
        x: ``[M, in_0]`` C-contiguous, the dtype of ``flat`` (float64 or float32).
        flat: 1-D parameter buffer; table: int64 ``[L, 4]`` layer table.
        relu: True for relu hidden layers, False for tanh.
        acts: 1-D ``[M * sum_i out_i]``, written: every layer's output (the last block is
            ``y [M, out_L]``).

    ``a_i = b_i + h_i @ w_i.T`` by :func:`ppo_ref.fast.lstm._linear_rows` (FMA chains in input
    order, row by row: a row's outputs never depend on the other rows of the call), ``h_{i+1} =
    act(a_i)`` for i < L-1. Each weight is transposed into a scratch ``[in, out]`` first.
    Unchecked: the caller guarantees shapes, contiguity and one dtype.
    """
    rows = x.shape[0]
    n_layers = table.shape[0]
    h = x
    start = 0
    for i in range(n_layers):
        w_off, b_off, n_out, n_in = table[i, 0], table[i, 1], table[i, 2], table[i, 3]
        w_t = np.empty((n_in, n_out), flat.dtype)
        _transpose_into(flat[w_off:w_off + n_out * n_in].reshape(n_out, n_in), w_t)
        a = acts[start:start + rows * n_out].reshape(rows, n_out)
        _linear_rows(h, w_t, flat[b_off:b_off + n_out], a)
        if i < n_layers - 1:
            _activate_inplace(a, relu)
        h = a
        start += rows * n_out


@njit
def _mlp_backward_flat(x, acts, flat, table, relu, dy, grads, dx):
    """Compiled MLP backward on a flat parameter buffer (section comment above).

    Args:
        x, acts, flat, table, relu: as given to (and written by) :func:`_mlp_forward_flat`.
        dy: ``[M, out_L]`` C-contiguous, ``dL/dy``; not modified.
        grads: 1-D buffer of the layout of ``flat``: ``dL/dw_i``, ``dL/db_i`` are written at the
            table's offsets (other entries untouched).
        dx: ``[M, in_0]``: ``dL/dx`` is ADDED to it (zero it first for ``dL/dx`` alone; two
            towers on the same input accumulate into one array); ``None``: not computed (the
            input is data, e.g. observations).

    ``dw_i = d_i.T @ h_i``, ``db_i = sum_n d_i[n]``, ``d_{i-1} = (d_i @ w_i) * act'(h_i)``
    with ``d_L = dy``, in the summation order of the section comment (gw by
    ``_add_products(gw, d_i.T, h_i)``, rows in order). All arrays one dtype; unchecked.
    """
    rows = x.shape[0]
    n_layers = table.shape[0]
    end = 0
    for i in range(n_layers):
        end += rows * table[i, 2]
    d = dy
    d_t = np.empty((dy.shape[1], rows), dy.dtype)
    _transpose_into(dy, d_t)
    for i in range(n_layers - 1, -1, -1):
        w_off, b_off, n_out, n_in = table[i, 0], table[i, 1], table[i, 2], table[i, 3]
        end -= rows * n_out          # now the start of layer i's block = the end of its input's
        h = x if i == 0 else acts[end - rows * n_in:end].reshape(rows, n_in)
        w = flat[w_off:w_off + n_out * n_in].reshape(n_out, n_in)
        gw = grads[w_off:w_off + n_out * n_in].reshape(n_out, n_in)
        gw[:, :] = 0.0
        _add_products(gw, d_t, h)
        _column_sums(d, grads[b_off:b_off + n_out])
        if i == 0:
            if dx is not None:
                _add_products(dx, d, w)
        else:
            d_prev = np.zeros((rows, n_in), dy.dtype)
            _add_products(d_prev, d, w)
            d_t = np.empty((n_in, rows), dy.dtype)
            _activation_grad_transposed(d_prev, h, relu, d_t)
            d = d_prev


# --------------------------------------------------------------------------------------------
# linear layer

def linear_init(rng: np.random.Generator, in_dim: int, out_dim: int, gain: float) -> Params:
    """A linear layer ``{"w": [out_dim, in_dim], "b": [out_dim]}``: orthogonal ``w``, zero ``b``.

    ``w = orthogonal(rng, (out_dim, in_dim), gain)`` (:func:`ppo_ref.nn.init.orthogonal`), as
    SB3/CleanRL's ``layer_init``. Both arrays float64.

    Raises:
        ValueError: a dimension is not a positive int, or ``gain`` is not finite.
    """
    in_dim = _check_dim(in_dim, "in_dim")
    out_dim = _check_dim(out_dim, "out_dim")
    gain = check_real_scalar(gain, "gain")
    return {"w": orthogonal(rng, (out_dim, in_dim), gain), "b": np.zeros(out_dim)}


def linear_forward(params: Mapping[str, np.ndarray], x) -> Tuple[np.ndarray, LinearCache]:
    """``y = x @ w.T + b`` (``torch.nn.Linear``).

    Args:
        params: ``{"w": float64 [out, in], "b": float64 [out]}``.
        x: ``[..., in]`` real array (float32/int cast to float64), finite.

    Returns:
        ``(y, cache)``: ``y`` float64 ``[..., out]``; ``cache`` a :class:`LinearCache`.

    Raises:
        ValueError: bad params, wrong last dimension or non-finite ``x``.
    """
    _check_params_mapping(params)
    w, b = _layer(params, "w", "b")
    x = _as_input(x, "x", w.shape[1])
    y = x @ w.T
    y += b
    return y, LinearCache(x)


def linear_backward(params: Mapping[str, np.ndarray], cache: LinearCache, dy
                    ) -> Tuple[np.ndarray, Params]:
    """Gradients of ``y = x @ w.T + b``: ``dx = dy @ w``, ``dw = dy.T @ x``, ``db = sum dy``.

    Args:
        params: as given to :func:`linear_forward`.
        cache: the :class:`LinearCache` it returned.
        dy: ``dL/dy``, shape ``[..., out]`` (the forward output's shape).

    Returns:
        ``(dx [..., in], {"w": [out, in], "b": [out]})``, all float64.

    Raises:
        ValueError: bad params or a ``dy`` of the wrong shape.
    """
    _check_params_mapping(params)
    w, _ = _layer(params, "w", "b")
    if not isinstance(cache, LinearCache):
        raise ValueError(f"cache must be a LinearCache, got {type(cache).__name__}")
    x = cache.x
    dy = _as_grad(dy, "dy", x.shape[:-1] + (w.shape[0],))
    dy2 = dy.reshape(-1, w.shape[0])
    x2 = x.reshape(-1, w.shape[1])
    grads = {"w": dy2.T @ x2, "b": dy2.sum(axis=0)}
    return dy @ w, grads


# --------------------------------------------------------------------------------------------
# activations (no parameters: backward returns dx only)

def tanh_forward(x) -> Tuple[np.ndarray, ActivationCache]:
    """``y = tanh(x)`` elementwise; ``x`` any shape (cast to float64). Returns ``(y, cache)``."""
    x = as_float_array(x, "x").astype(np.float64, copy=False)
    y = np.tanh(x)
    return y, ActivationCache(y)


def tanh_backward(cache: ActivationCache, dy) -> np.ndarray:
    """``dx = dy * (1 - y^2)`` with ``y = tanh(x)`` from the cache. ``dy`` has ``y``'s shape."""
    if not isinstance(cache, ActivationCache):
        raise ValueError(f"cache must be an ActivationCache, got {type(cache).__name__}")
    dy = _as_grad(dy, "dy", cache.y.shape)
    return dy * (1.0 - cache.y * cache.y)


def relu_forward(x) -> Tuple[np.ndarray, ActivationCache]:
    """``y = max(x, 0)`` elementwise; ``x`` any shape (cast to float64). Returns ``(y, cache)``."""
    x = as_float_array(x, "x").astype(np.float64, copy=False)
    y = np.maximum(x, 0.0)
    return y, ActivationCache(y)


def relu_backward(cache: ActivationCache, dy) -> np.ndarray:
    """``dx = dy * [x > 0]`` (0 at ``x = 0``, torch's choice); ``[x > 0] = [y > 0]``."""
    if not isinstance(cache, ActivationCache):
        raise ValueError(f"cache must be an ActivationCache, got {type(cache).__name__}")
    dy = _as_grad(dy, "dy", cache.y.shape)
    return dy * (cache.y > 0.0)


# --------------------------------------------------------------------------------------------
# MLP

def mlp_init(rng: np.random.Generator, in_dim: int, hidden_sizes: Sequence[int], out_dim: int, *,
             hidden_gain: float = math.sqrt(2.0), out_gain: float = 1.0) -> Params:
    """Parameters of an MLP ``in_dim -> hidden_sizes... -> out_dim``.

    Keys ``w0, b0, ..., wL, bL`` with ``L = len(hidden_sizes)``; ``w_i`` is ``[out_i, in_i]``
    (torch layout), orthogonal with gain ``hidden_gain`` for the hidden layers and ``out_gain``
    for the output layer; biases are zero (SB3 ``ActorCriticPolicy`` / CleanRL ``layer_init``).
    Weights are drawn from ``rng`` in layer order ``w0, w1, ...``. ``hidden_sizes`` may be empty
    (a single linear layer).

    Returns:
        dict of float64 arrays.

    Raises:
        ValueError: non-positive or non-int sizes, or non-finite gains.
    """
    in_dim = _check_dim(in_dim, "in_dim")
    out_dim = _check_dim(out_dim, "out_dim")
    try:
        hidden = [_check_dim(h, "hidden_sizes entries") for h in hidden_sizes]
    except TypeError:
        raise ValueError(f"hidden_sizes must be a sequence of ints, got {hidden_sizes!r}") from None
    hidden_gain = check_real_scalar(hidden_gain, "hidden_gain")
    out_gain = check_real_scalar(out_gain, "out_gain")
    sizes = [in_dim] + hidden + [out_dim]
    params: Params = {}
    last = len(sizes) - 2
    for i in range(len(sizes) - 1):
        gain = out_gain if i == last else hidden_gain
        params[f"w{i}"] = orthogonal(rng, (sizes[i + 1], sizes[i]), gain)
        params[f"b{i}"] = np.zeros(sizes[i + 1])
    return params


def _check_mlp_keys(params: Mapping, n_layers: int) -> None:
    expected = {f"{k}{i}" for i in range(n_layers) for k in ("w", "b")}
    if len(params) != len(expected) or set(params) != expected:
        extra = sorted(set(params) - expected)
        raise ValueError(f"params must have exactly the keys w0, b0, ..., w{n_layers - 1}, "
                         f"b{n_layers - 1}; unexpected: {extra}")


def mlp_forward(params: Mapping[str, np.ndarray], x, activation: str = "tanh"
                ) -> Tuple[np.ndarray, MLPCache]:
    """MLP forward: ``h_0 = x``, ``h_{i+1} = act(h_i @ w_i.T + b_i)``, ``y = h_L @ w_L.T + b_L``.

    The output layer is linear (no activation).

    Args:
        params: from :func:`mlp_init` (keys ``w0, b0, ..., wL, bL``, float64).
        x: ``[..., in]`` finite real array (cast to float64).
        activation: ``"tanh"`` (default, SB3/CleanRL PPO) or ``"relu"`` for the hidden layers.

    Returns:
        ``(y, cache)``: ``y`` float64 ``[..., out]``; ``cache`` an :class:`MLPCache`.

    Raises:
        ValueError: unknown activation, malformed params (missing/extra keys, widths that do
            not chain), wrong last dimension or non-finite ``x``.
    """
    check_choice(activation, "activation", ACTIVATIONS)
    _check_params_mapping(params)
    layers = _mlp_layers(params)
    _check_mlp_keys(params, len(layers))
    x = _as_input(x, "x", layers[0][0].shape[1])
    batch_shape = x.shape[:-1]
    y, inputs = _mlp_forward_2d(layers, x.reshape(-1, x.shape[-1]), activation)
    return y.reshape(batch_shape + (y.shape[-1],)), MLPCache(inputs, batch_shape, activation)


def mlp_backward(params: Mapping[str, np.ndarray], cache: MLPCache, dy
                 ) -> Tuple[np.ndarray, Params]:
    """MLP backward (chain rule through each linear layer and activation, last layer first).

    Args:
        params: as given to :func:`mlp_forward`.
        cache: the :class:`MLPCache` it returned.
        dy: ``dL/dy`` with the shape of the forward output ``[..., out]``.

    Returns:
        ``(dx [..., in], grads)``: ``grads`` has the keys of ``params``; all float64.

    Raises:
        ValueError: malformed params/cache or a ``dy`` of the wrong shape.
    """
    _check_params_mapping(params)
    if not isinstance(cache, MLPCache):
        raise ValueError(f"cache must be an MLPCache, got {type(cache).__name__}")
    layers = _mlp_layers(params)
    _check_mlp_keys(params, len(layers))
    if len(cache.layer_inputs) != len(layers):
        raise ValueError(f"cache holds {len(cache.layer_inputs)} layers but params has {len(layers)}")
    out_dim = layers[-1][0].shape[0]
    dy = _as_grad(dy, "dy", tuple(cache.batch_shape) + (out_dim,))
    grads: Params = {}
    dx = _mlp_backward_2d(layers, cache.layer_inputs, dy.reshape(-1, out_dim), cache.activation,
                          "", grads, need_dx=True)
    grads = {k: grads[k] for k in params}  # same key order as params
    return dx.reshape(tuple(cache.batch_shape) + (dx.shape[-1],)), grads
