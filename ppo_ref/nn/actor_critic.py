"""The MLP actor-critic of PPO: a policy tower and a value tower, separate or on a shared trunk.

Architecture (SB3 ``ActorCriticPolicy`` / CleanRL ``ppo.py`` defaults)::

    separate towers (default)                 shared trunk (shared_trunk=True)
    pi: obs -> 64 -> 64 -> policy_out [P]      trunk: obs -> 64 -> 64 -> z
    vf: obs -> 64 -> 64 -> value [1]           pi: z -> policy_out [P];  vf: z -> value [1]

Hidden layers use ``activation`` (tanh by default); heads are linear. Init is orthogonal
(:func:`ppo_ref.nn.init.orthogonal`) with gain sqrt(2) for hidden layers, ``policy_gain`` (0.01)
for the policy head and ``value_gain`` (1.0) for the value head; every bias is zero
(Huang et al. 2022, "The 37 Implementation Details of PPO", details 2 and 13).

``policy_out`` is what a distribution head reads: categorical logits ``[B, n_actions]`` or the
Gaussian mean ``[B, action_dim]`` (the state-independent ``log_std`` lives in the policy, not
here).

Parameters are one flat dict (so one Adam state, one gradient clip and one checkpoint cover
everything), keys ``"pi.w0", "pi.b0", ...``, ``"vf.w0", ...`` and with a shared trunk
``"trunk.w0", ...``. Each tower's keys follow :func:`ppo_ref.nn.mlp.mlp_init`.
"""
from __future__ import annotations

import math
import threading
from typing import Any, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ppo_ref._checks import check_choice, check_real_scalar
from ppo_ref._numba import njit
from ppo_ref.flat import FlatArrays
from ppo_ref.nn.mlp import (
    ACTIVATIONS, MLPCache, Params, _activation_grad_inplace, _as_grad, _as_input, _check_dim,
    _check_params_mapping, _mlp_backward_2d, _mlp_forward_2d, _mlp_layers, mlp_init,
)

__all__ = ["ActorCriticCache", "actor_critic_init", "actor_critic_forward",
           "actor_critic_backward", "value_forward"]

HIDDEN_GAIN = math.sqrt(2.0)


class ActorCriticCache(NamedTuple):
    """What :func:`actor_critic_backward` needs.

    Attributes:
        shared_trunk: whether the trunk is shared.
        trunk: :class:`~ppo_ref.nn.mlp.MLPCache` of the shared trunk, or ``None``.
        pi: cache of the policy tower (with a shared trunk: the policy head on the trunk output).
        vf: cache of the value tower (same).
        trunk_out: with a shared trunk, ``z`` (float64 ``[B, width]``): the activated trunk
            output read by both heads (``obs`` itself when ``net_arch=()``); ``None`` otherwise.
    """
    shared_trunk: bool
    trunk: Optional[MLPCache]
    pi: MLPCache
    vf: MLPCache
    trunk_out: Optional[np.ndarray]


def actor_critic_init(rng: np.random.Generator, obs_dim: int, policy_out_dim: int, *,
                      net_arch: Sequence[int] = (64, 64), activation: str = "tanh",
                      shared_trunk: bool = False, policy_gain: float = 0.01,
                      value_gain: float = 1.0) -> Params:
    """Initial actor-critic parameters (flat dict of float64 arrays).

    Separate towers: ``pi.*`` = ``mlp_init(obs_dim, net_arch, policy_out_dim, out_gain=policy_gain)``
    and ``vf.*`` = ``mlp_init(obs_dim, net_arch, 1, out_gain=value_gain)``, hidden gain sqrt(2).
    Shared trunk: ``trunk.w{i}`` for the hidden layers of ``net_arch`` (gain sqrt(2)) and
    one-layer heads ``pi.w0 [P, net_arch[-1]]`` (gain ``policy_gain``) and
    ``vf.w0 [1, net_arch[-1]]`` (gain ``value_gain``). Biases are zero.

    Draw order from ``rng``: separate: pi tower (layer order) then vf tower; shared: trunk,
    pi head, vf head.

    Args:
        rng: ``np.random.Generator``.
        obs_dim: observation size (> 0).
        policy_out_dim: ``P``, the number of logits (discrete) or the action dimension (Gaussian mean).
        net_arch: hidden widths, default ``(64, 64)``; may be empty (linear heads on ``obs``).
        activation: ``"tanh"`` or ``"relu"``. Validated only: the initialisation is the same
            for both (as in SB3); accepted so a config can be passed through unchanged.
        shared_trunk: share the hidden layers between policy and value.
        policy_gain, value_gain: head gains (default 0.01 and 1.0; thrust-rl uses 0.01 for both).

    Raises:
        ValueError: bad dimensions, unknown activation or non-finite gains.
    """
    obs_dim = _check_dim(obs_dim, "obs_dim")
    policy_out_dim = _check_dim(policy_out_dim, "policy_out_dim")
    try:
        arch = tuple(_check_dim(h, "net_arch entries") for h in net_arch)
    except TypeError:
        raise ValueError(f"net_arch must be a sequence of ints, got {net_arch!r}") from None
    check_choice(activation, "activation", ACTIVATIONS)
    policy_gain = check_real_scalar(policy_gain, "policy_gain")
    value_gain = check_real_scalar(value_gain, "value_gain")
    params: Params = {}
    if not shared_trunk:
        for prefix, out_dim, gain in (("pi.", policy_out_dim, policy_gain), ("vf.", 1, value_gain)):
            tower = mlp_init(rng, obs_dim, arch, out_dim, hidden_gain=HIDDEN_GAIN, out_gain=gain)
            params.update({prefix + k: v for k, v in tower.items()})
        return params
    head_in = obs_dim
    if arch:
        # the trunk is an MLP whose last layer is itself hidden (activated): build it as
        # hidden layers [obs -> arch[0] -> ... -> arch[-1]], all with the hidden gain
        trunk = mlp_init(rng, obs_dim, arch[:-1], arch[-1], hidden_gain=HIDDEN_GAIN,
                         out_gain=HIDDEN_GAIN)
        params.update({"trunk." + k: v for k, v in trunk.items()})
        head_in = arch[-1]
    for prefix, out_dim, gain in (("pi.", policy_out_dim, policy_gain), ("vf.", 1, value_gain)):
        head = mlp_init(rng, head_in, (), out_dim, out_gain=gain)
        params.update({prefix + k: v for k, v in head.items()})
    return params


def _structure(params: Mapping, shared_trunk: bool):
    """Parse and check the towers: returns ``(trunk_layers or None, pi_layers, vf_layers)``."""
    _check_params_mapping(params)
    pi = _mlp_layers(params, "pi.")
    vf = _mlp_layers(params, "vf.")
    if vf[-1][0].shape[0] != 1:
        raise ValueError(f"params['vf.w{len(vf) - 1}'] must have 1 output row, got "
                         f"{vf[-1][0].shape[0]}")
    n_keys = 2 * (len(pi) + len(vf))
    trunk = None
    if shared_trunk:
        if len(pi) != 1 or len(vf) != 1:
            raise ValueError("shared_trunk=True expects one-layer heads pi.w0/vf.w0 on a "
                             f"'trunk.' MLP, got {len(pi)} pi and {len(vf)} vf layers")
        if "trunk.w0" in params:
            trunk = _mlp_layers(params, "trunk.")
            n_keys += 2 * len(trunk)
            z_dim = trunk[-1][0].shape[0]
        else:
            z_dim = None
        for name, layers in (("pi", pi), ("vf", vf)):
            w = layers[0][0]
            want = z_dim if z_dim is not None else pi[0][0].shape[1]
            if w.shape[1] != want:
                raise ValueError(f"params['{name}.w0'] has input width {w.shape[1]}, expected "
                                 f"{want} (the trunk output width)")
    else:
        if pi[0][0].shape[1] != vf[0][0].shape[1]:
            raise ValueError(f"params['pi.w0'] and params['vf.w0'] have different input widths "
                             f"{pi[0][0].shape[1]} and {vf[0][0].shape[1]}")
    if len(params) != n_keys:
        known = ("pi.", "vf.") + (("trunk.",) if shared_trunk else ())
        extra = sorted(k for k in params if not k.startswith(known))
        hint = " (a shared trunk? pass shared_trunk=True)" if any(
            k.startswith("trunk.") for k in extra) else ""
        raise ValueError(f"params has unexpected keys {extra or sorted(params)}{hint}")
    return trunk, pi, vf


def _obs_dim(trunk, pi) -> int:
    return (trunk if trunk is not None else pi)[0][0].shape[1]


def _as_obs(obs, in_dim: int) -> np.ndarray:
    x = _as_input(obs, "obs", in_dim)
    if x.ndim != 2:
        raise ValueError(f"obs must have shape [batch, {in_dim}], got {x.shape} "
                         f"(use obs[None] for a single observation)")
    return x


def actor_critic_forward(params: Mapping[str, np.ndarray], obs, activation: str = "tanh",
                         shared_trunk: bool = False
                         ) -> Tuple[np.ndarray, np.ndarray, ActorCriticCache]:
    """Policy output and state values for a batch of observations.

    Separate: ``policy_out = MLP_pi(obs)``, ``values = MLP_vf(obs)[:, 0]``.
    Shared: ``z = act(MLP_trunk(obs))`` (every trunk layer activated),
    ``policy_out = z @ pi.w0.T + pi.b0``, ``values = (z @ vf.w0.T + vf.b0)[:, 0]``.

    Args:
        params: from :func:`actor_critic_init` with the same ``shared_trunk``.
        obs: ``[B, obs_dim]`` finite real array (float32 cast to float64).
        activation: hidden activation, ``"tanh"`` or ``"relu"``.
        shared_trunk: must match how ``params`` was built.

    Returns:
        ``(policy_out [B, P], values [B], cache)``, float64; ``cache`` an :class:`ActorCriticCache`.

    Raises:
        ValueError: unknown activation, params that do not match ``shared_trunk`` or do not
            chain, ``obs`` of the wrong shape or non-finite.
    """
    check_choice(activation, "activation", ACTIVATIONS)
    trunk, pi, vf = _structure(params, bool(shared_trunk))
    x = _as_obs(obs, _obs_dim(trunk, pi))
    if not shared_trunk:
        logits, pi_in = _mlp_forward_2d(pi, x, activation)
        v, vf_in = _mlp_forward_2d(vf, x, activation)
        cache = ActorCriticCache(False, None, MLPCache(pi_in, x.shape[:1], activation),
                                 MLPCache(vf_in, x.shape[:1], activation), None)
        return logits, v[:, 0], cache
    trunk_cache = None
    z = x
    if trunk is not None:
        z, trunk_in = _mlp_forward_2d(trunk, x, activation)
        if activation == "relu":
            np.maximum(z, 0.0, out=z)
        else:
            np.tanh(z, out=z)
        trunk_cache = MLPCache(trunk_in, x.shape[:1], activation)
    logits, pi_in = _mlp_forward_2d(pi, z, activation)
    v, vf_in = _mlp_forward_2d(vf, z, activation)
    cache = ActorCriticCache(True, trunk_cache, MLPCache(pi_in, x.shape[:1], activation),
                             MLPCache(vf_in, x.shape[:1], activation), z)
    return logits, v[:, 0], cache


def value_forward(params: Mapping[str, np.ndarray], obs, activation: str = "tanh",
                  shared_trunk: bool = False) -> np.ndarray:
    """Only the state values ``V(obs)`` ``[B]`` (float64): no policy tower, no cache.

    For bootstrapping (``last_values``, ``final_values``). Same arguments and errors as
    :func:`actor_critic_forward`; with separate towers it evaluates only the value tower.
    """
    check_choice(activation, "activation", ACTIVATIONS)
    trunk, pi, vf = _structure(params, bool(shared_trunk))
    x = _as_obs(obs, _obs_dim(trunk, pi))
    z = x
    if shared_trunk and trunk is not None:
        z, _ = _mlp_forward_2d(trunk, x, activation)
        if activation == "relu":
            np.maximum(z, 0.0, out=z)
        else:
            np.tanh(z, out=z)
    v, _ = _mlp_forward_2d(vf, z, activation)
    return v[:, 0]


def actor_critic_backward(params: Mapping[str, np.ndarray], cache: ActorCriticCache,
                          d_policy_out, d_values) -> Params:
    """Gradients of a scalar loss w.r.t. every parameter, given ``dL/dpolicy_out`` and ``dL/dvalues``.

    With a shared trunk the trunk receives the sum of both heads' input gradients, then goes
    back through its last activation (``tanh' = 1 - z^2``, ``relu' = [z > 0]``) and its layers.
    No gradient w.r.t. ``obs`` is computed (observations are data).

    Args:
        params: as given to :func:`actor_critic_forward`.
        cache: the :class:`ActorCriticCache` it returned.
        d_policy_out: ``[B, P]``; d_values: ``[B]`` (float32 cast to float64).

    Returns:
        ``grads``: dict with exactly the keys (and key order) of ``params``, float64.

    Raises:
        ValueError: malformed params/cache or gradients of the wrong shape.
    """
    if not isinstance(cache, ActorCriticCache):
        raise ValueError(f"cache must be an ActorCriticCache, got {type(cache).__name__}")
    trunk, pi, vf = _structure(params, cache.shared_trunk)
    if len(cache.pi.layer_inputs) != len(pi) or len(cache.vf.layer_inputs) != len(vf):
        raise ValueError("cache does not match params (different number of layers)")
    batch = cache.pi.layer_inputs[0].shape[0]
    d_pi = _as_grad(d_policy_out, "d_policy_out", (batch, pi[-1][0].shape[0]))
    d_v = _as_grad(d_values, "d_values", (batch,))
    activation = cache.pi.activation
    grads: Params = {}
    shared = cache.shared_trunk
    dz_pi = _mlp_backward_2d(pi, cache.pi.layer_inputs, d_pi, activation, "pi.", grads,
                             need_dx=shared and trunk is not None)
    dz_v = _mlp_backward_2d(vf, cache.vf.layer_inputs, d_v[:, None], activation, "vf.", grads,
                            need_dx=shared and trunk is not None)
    if shared and trunk is not None:
        dz = dz_pi
        dz += dz_v  # dz_pi is a fresh array
        _activation_grad_inplace(dz, cache.trunk_out, activation)
        _mlp_backward_2d(trunk, cache.trunk.layer_inputs, dz, activation, "trunk.", grads,
                         need_dx=False)
    return {k: grads[k] for k in params}


# --------------------------------------------------------------------------------------------
# one-buffer fast path (separate towers): both towers' first layers as one matrix product

def fused_layout(params: Mapping[str, np.ndarray]):
    """The :class:`~ppo_ref.flat.FlatLayout` the fused path reads, for separate-tower params.

    Keys keep the order of ``params``; in the buffer ``pi.w0`` is followed by ``vf.w0`` and
    ``pi.b0`` by ``vf.b0``, so the first layers of both towers are one ``[2H, obs_dim]`` matrix
    and one ``[2H]`` bias; every other key follows in key order. Returns ``None`` when the
    fused path does not apply (shared trunk, no hidden layer, or first layers of different
    shapes).
    """
    from ppo_ref.flat import FlatLayout
    keys = list(params)
    need = ("pi.w0", "vf.w0", "pi.b0", "vf.b0", "pi.w1", "vf.w1")
    if any(k not in params for k in need) or any(k.startswith("trunk.") for k in keys):
        return None
    if np.shape(params["pi.w0"]) != np.shape(params["vf.w0"]):
        return None
    depth = {p: sum(1 for k in keys if k.startswith(p + "w")) for p in ("pi.", "vf.")}
    if depth["pi."] != depth["vf."]:
        return None
    head = ["pi.w0", "vf.w0", "pi.b0", "vf.b0"]
    order = head + [k for k in keys if k not in head]
    return FlatLayout.in_order([(k, np.shape(v)) for k, v in params.items()], order)


class FusedCache(NamedTuple):
    """Cache of :func:`fused_forward`: the input ``x [B, D]``, the activated first layer of
    both towers ``h0 [B, 2H]`` (``[:, :H]`` policy, ``[:, H:]`` value) and each tower's inputs
    of layers 1..L, all in the compute dtype; ``pi_layers``/``vf_layers``: each tower's
    ``(W, b)`` of layers 1..L as the pass used them (views of ``params`` in float64, of a
    float32 copy in float32)."""
    x: np.ndarray
    h0: np.ndarray
    pi_inputs: Tuple[np.ndarray, ...]
    vf_inputs: Tuple[np.ndarray, ...]
    activation: str
    pi_layers: Tuple[Tuple[np.ndarray, np.ndarray], ...]
    vf_layers: Tuple[Tuple[np.ndarray, np.ndarray], ...]


_FUSED_INFO = {}


def _fused_info(layout):
    """Per layout: ``(o_w, o_b, h, d, towers)``: offsets of the fused first-layer matrix and
    bias, hidden width, input width, and per prefix ``"pi."``/``"vf."`` the ``(w_key, b_key,
    w_start, w_stop, w_shape, b_start, b_stop)`` of layers 1..L."""
    info = _FUSED_INFO.get(layout)
    if info is None:
        shapes = {k: s for k, _, s in layout.entries}
        spans = {k: (start, stop) for k, start, stop, _ in layout.slices}
        h, d = shapes["pi.w0"]
        towers = {}
        for prefix in ("pi.", "vf."):
            i = 1
            names = []
            while f"{prefix}w{i}" in shapes:
                wk, bk = f"{prefix}w{i}", f"{prefix}b{i}"
                names.append((wk, bk) + spans[wk] + (shapes[wk],) + spans[bk])
                i += 1
            towers[prefix] = tuple(names)
        info = _FUSED_INFO[layout] = (spans["pi.w0"][0], spans["pi.b0"][0], h, d, towers)
    return info


@njit
def _add_bias(a, b):
    """In place ``a[i, j] += b[j]``: the broadcast ``a += b`` of a layer's bias (the same
    single rounded addition per entry), in one compiled pass instead of numpy's per-row
    inner loops."""
    rows, cols = a.shape
    for i in range(rows):
        for j in range(cols):
            a[i, j] += b[j]


def _affine_compiled_bias(h: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``h @ w.T + b``: the BLAS product, then the bias by :func:`_add_bias` (same bits as
    numpy's broadcast addition)."""
    a = h @ w.T
    _add_bias(a, b)
    return a


def fused_forward(params, x: np.ndarray, activation: str, dtype=np.float64):
    """:func:`actor_critic_forward` for params in the :func:`fused_layout` (an intact
    :class:`~ppo_ref.flat.FlatArrays`), on a finite float64 ``x [B, D]``, without argument
    checks. Same equations; the first layer of both towers is one product
    ``x @ [w0_pi; w0_vf].T``. Returns ``(policy_out [B, P], values [B], FusedCache)``.

    ``dtype``: the arithmetic. ``np.float64`` (default) uses ``params`` as they are;
    ``np.float32`` rounds the parameters and ``x`` to float32 once and computes in float32
    (as torch's default), returning float32 outputs. Products are numpy's (BLAS), activations
    ``np.tanh``/``np.maximum``, bias additions one compiled pass per layer (the same single
    addition per entry as ``a += b``).
    """
    o_w, o_b, h, d, towers = _fused_info(params.layout)
    flat = params.flat
    if np.dtype(dtype) != flat.dtype:
        flat = flat.astype(dtype)
        x = x.astype(dtype)
        tower_layers = [tuple((flat[ws:we].reshape(shape), flat[bs:be])
                              for _, _, ws, we, shape, bs, be in towers[p])
                        for p in ("pi.", "vf.")]
    else:
        tower_layers = [tuple((params[wk], params[bk]) for wk, bk, *_ in towers[p])
                        for p in ("pi.", "vf.")]
    a = x @ flat[o_w:o_w + 2 * h * d].reshape(2 * h, d).T
    _add_bias(a, flat[o_b:o_b + 2 * h])
    relu = activation == "relu"
    if relu:
        np.maximum(a, 0.0, out=a)
    else:
        np.tanh(a, out=a)
    pi, vf = tower_layers
    out, pi_in = _mlp_forward_2d(pi, a[:, :h], activation, _affine_compiled_bias)
    v, vf_in = _mlp_forward_2d(vf, a[:, h:], activation, _affine_compiled_bias)
    return out, v[:, 0], FusedCache(x, a, pi_in, vf_in, activation, pi, vf)


@njit
def _act_grad_row(dh, h, relu, db, i):
    """Row ``i``: ``dh[i] *= act'(a[i])`` (``1 - h^2`` for tanh, ``[h > 0]`` for relu, from the
    activation output ``h``) and ``db += dh[i]`` (the bias gradient's running column sums)."""
    for j in range(dh.shape[1]):
        if relu:
            g = dh[i, j] if h[i, j] > 0.0 else 0.0
        else:
            g = dh[i, j] * (1.0 - h[i, j] * h[i, j])
        dh[i, j] = g
        db[j] += g


@njit
def _backprop_hidden(dh, h, relu, db):
    """In place ``dh *= act'(a)`` and ``db = sum over rows of the result``
    (:func:`_act_grad_row` row by row): the pre-activation gradient of a hidden layer and its
    bias gradient in one pass over ``[B, H]``."""
    for j in range(dh.shape[1]):
        db[j] = 0.0
    for i in range(dh.shape[0]):
        _act_grad_row(dh, h, relu, db, i)


@njit
def _backprop_head(dy, w, h, relu, dh, db, dw, dw_b):
    """The whole backward of a narrow head layer ``y = h @ w.T + b`` (``dy [B, K]``, K = P or
    1; ``w [K, H]``; activation output ``h [B, H]`` of the layer below) in one pass over the
    rows: ``dw = dy.T @ h`` and ``dw_b = column sums of dy`` (both summed over rows in order),
    and for the layer below ``dh = (dy @ w) * act'(a)`` (summed over k in order) and
    ``db = column sums of dh``. ``dh`` may be a column block of a wider array."""
    rows, k_dim = dy.shape
    cols = w.shape[1]
    for j in range(cols):
        db[j] = 0.0
    for k in range(k_dim):
        dw_b[k] = 0.0
        for j in range(cols):
            dw[k, j] = 0.0
    for i in range(rows):
        d = dy[i, 0]
        dw_b[0] += d
        for j in range(cols):
            dh[i, j] = d * w[0, j]
            dw[0, j] += d * h[i, j]
        for k in range(1, k_dim):
            d = dy[i, k]
            dw_b[k] += d
            for j in range(cols):
                dh[i, j] += d * w[k, j]
                dw[k, j] += d * h[i, j]
        _act_grad_row(dh, h, relu, db, i)


_SCRATCH = threading.local()


def _scratch_grads(layout, dtype) -> FlatArrays:
    """This thread's reusable ``FlatArrays`` of ``layout`` and ``dtype`` (uninitialised): the
    float32 gradients of :func:`fused_backward`, which are copied out (widened to float64)
    before it returns, so one buffer per thread serves every call."""
    held = getattr(_SCRATCH, "grads", None)
    if held is None or held.layout is not layout or held.flat.dtype != dtype:
        held = _SCRATCH.grads = FlatArrays.from_buffer(np.empty(layout.size, dtype=dtype), layout)
    return held


def fused_backward(params, cache: FusedCache, d_policy_out: np.ndarray, d_values: np.ndarray):
    """:func:`actor_critic_backward` of :func:`fused_forward`, without argument checks:
    gradients as a new :class:`~ppo_ref.flat.FlatArrays` in the layout of ``params`` (the
    head keys of the policy, if any, are left for the caller to fill). ``d_policy_out [B, P]``
    and ``d_values [B]`` float64.

    Same equations as :func:`ppo_ref.nn.mlp.mlp_backward` per tower (``dW = d.T @ h``,
    ``db = sum d``, ``dh = d @ W`` then the activation derivative). Each head (a few output
    columns) is one compiled pass (:func:`_backprop_head`: its weight and bias gradients and
    the gradient into the layer below); a hidden layer's activation derivative and bias sum are
    one compiled pass; the wide products are numpy's (BLAS). The first layers of both towers
    share one ``[B, 2H]`` gradient, one ``dW0 = d0.T @ x`` and one bias sum.
    """
    o_w, o_b, h, d, towers = _fused_info(params.layout)
    dtype = cache.x.dtype
    d_policy_out = d_policy_out.astype(dtype, copy=False)
    d_values = d_values.astype(dtype, copy=False)
    # float32: gradients in this thread's scratch buffer, widened into a new float64 one below
    grads = params.empty_like() if dtype == np.float64 else _scratch_grads(params.layout, dtype)
    gflat = grads.flat
    relu = cache.activation == "relu"
    batch = cache.x.shape[0]
    d0 = np.empty((batch, 2 * h), dtype=dtype)
    for names, layers, inputs, dy, c0 in (
            (towers["pi."], cache.pi_layers, cache.pi_inputs, d_policy_out, 0),
            (towers["vf."], cache.vf_layers, cache.vf_inputs, d_values.reshape(-1, 1), h)):
        last = len(names) - 1
        wkey, bkey = names[last][:2]
        if last > 0:
            dcur = np.empty((batch, inputs[last].shape[1]), dtype=dtype)
            db = grads[names[last - 1][1]]
            h_below = inputs[last]
        else:  # the head sits on the fused first layer
            dcur = d0[:, c0:c0 + h]
            db = gflat[o_b + c0:o_b + c0 + h]
            h_below = cache.h0[:, c0:c0 + h]
        _backprop_head(dy, layers[last][0], h_below, relu, dcur, db, grads[wkey], grads[bkey])
        for i in range(last - 1, -1, -1):
            wkey = names[i][0]
            hin = inputs[i]
            np.matmul(dcur.T, hin, out=grads[wkey])
            if i > 0:
                dh = dcur @ layers[i][0]
                _backprop_hidden(dh, hin, relu, grads[names[i - 1][1]])
                dcur = dh
            else:
                np.matmul(dcur, layers[i][0], out=d0[:, c0:c0 + h])
    if len(towers["pi."]) > 1:  # d0 holds d @ W1 of both towers: activation derivative + bias
        _backprop_hidden(d0, cache.h0, relu, gflat[o_b:o_b + 2 * h])
    np.matmul(d0.T, cache.x, out=gflat[o_w:o_w + 2 * h * d].reshape(2 * h, d))
    if dtype != np.float64:  # gradients of float64 parameters are float64
        grads = FlatArrays.from_buffer(gflat.astype(np.float64), grads.layout)
    return grads
