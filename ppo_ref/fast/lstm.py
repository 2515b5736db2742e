"""The compiled tier of the LSTM: a single-layer LSTM with episode resets, forward and backward
(BPTT) in compiled kernels, and the product, ``tanh`` and FMA primitives every compiled network
of :mod:`ppo_ref.fast` shares.

Its public functions are the fast twins of :mod:`ppo_ref.spec.lstm` (the readable definition,
which :mod:`ppo_ref.nn.lstm` re-exports): :func:`lstm_forward`, :func:`lstm_backward` and
:func:`lstm_step` take and return what their spec namesakes do (parameters from
:func:`ppo_ref.spec.lstm.lstm_init`) and equal them in float64 within rtol 1e-12, atol 1e-14
(``|fast - spec| <= 1e-14 + 1e-12 * max|spec|`` per result array: the ``lstm`` row of
``tests/test_tiers.py``). The unchecked stacked helpers (:func:`forward_stacked`,
:func:`backward_stacked`, :func:`step_stacked`) are the recurrent policy's fast path.

The cell is ``torch.nn.LSTM``'s (Hochreiter & Schmidhuber 1997, with the forget gate of Gers,
Schmidhuber & Cummins 2000), with the reset convention of recurrent PPO (sb3-contrib
``RecurrentPPO``, CleanRL ``ppo_atari_lstm``): before step ``t`` the carried state is multiplied
by ``keep[t] = 1 - episode_starts[t]``, so an episode that starts at ``t`` starts from the zero
state. Per environment ``n`` and step ``t = 0 .. T-1``::

    h~[t] = keep[t] * h[t-1]        c~[t] = keep[t] * c[t-1]        (h[-1] = h0, c[-1] = c0)
    z[t]  = x[t] @ w_ih.T + h~[t] @ w_hh.T + b                      [4H], blocks (i, f, g, o)
    i = sigmoid(z_i)   f = sigmoid(z_f)   g = tanh(z_g)   o = sigmoid(z_o)
    c[t]  = f * c~[t] + i * g
    h[t]  = o * tanh(c[t])

``b`` is torch's ``b_ih + b_hh`` (one bias; the sum is all the forward pass sees). The returned
``h_seq[t] = h[t]`` and ``(h_T, c_T) = (h[T-1], c[T-1])`` are *unmasked*: the next call's
``episode_starts[0]`` decides whether that state is carried on.

Backpropagation through time, given ``dh_seq[t] = dL/dh[t]`` (the direct gradient of the
outputs) and ``dh_T, dc_T`` (gradient arriving from a later segment, for truncated BPTT);
``dh~[T] = dh_T``, ``dc~[T] = dc_T``, ``keep[T] = 1``; for ``t = T-1 .. 0``::

    dh    = dh_seq[t] + keep[t+1] * dh~[t+1]            total gradient of h[t]
    dc    = keep[t+1] * dc~[t+1] + dh * o * (1 - tanh(c[t])^2)
    dz_i  = dc * g * i * (1 - i)          dz_f = dc * c~[t] * f * (1 - f)
    dz_g  = dc * i * (1 - g^2)            dz_o = dh * tanh(c[t]) * o * (1 - o)
    dh~[t] = dz[t] @ w_hh                 dc~[t] = dc * f
    dh0 = keep[0] * dh~[0]                dc0 = keep[0] * dc~[0]

and, summed over every step and environment (after the loop, each sum over the rows
``m = t N + n`` in increasing order, one FMA per product term)::

    dw_ih = sum_t dz[t].T @ x[t]     dw_hh = sum_t dz[t].T @ h~[t]     db = sum_t,n dz[t]
    dx[t] = dz[t] @ w_ih

The factor ``keep`` is where the gradient stops: a state cut by a reset receives exactly 0.

Numerics. All work of the public functions is float64 (float32, integer or bool inputs are
cast on entry). The unchecked stacked helpers of the recurrent policy's fast path
(:func:`forward_stacked`, :func:`backward_stacked`, :func:`step_stacked`) run the same
kernels on float32 arrays when asked (``compute_dtype="float32"``): float32 products and
FMA chains, and ``tanh`` in float32 arithmetic (:func:`_tanh_f32`). The sigmoid is
evaluated as ``sigmoid(z) = (1 + tanh(z / 2)) / 2``, an exact identity that never overflows
(``1 / (1 + exp(-z))`` overflows ``exp`` for ``z < -709``); ``z / 2`` is exact in binary
floating point (barring underflow). ``tanh`` is this module's own (:func:`_tanh_any`:
:func:`_tanh` in float64, within 3 units in the last place of NumPy's, and :func:`_tanh_f32`
in float32, within 4 float32 units of NumPy's float64 tanh; both tested), made of basic
operations so the loops calling it vectorize.
The forward recursion over all T steps is one compiled call (:func:`_forward_kernel`), and so
is BPTT (:func:`_backward_kernel`); their small products are loops of fused multiply-adds in
index order (:func:`_add_products`), so an environment's results do not depend on the other
environments in the call, and ``lstm_step`` (the same kernel with T = 1) reproduces
``lstm_forward`` bit for bit. The weight gradients and ``dx``, one product each over all
steps after the loop, are the same FMA chains (:func:`_weight_grads`), not BLAS products: their
summation order is the documented one on every machine. Results agree with
``torch.nn.LSTM`` (float64) and with the plain oracle of the tests to rounding. The stacked
helpers run their L LSTMs on numba's threads (``ppo_ref._numba``, "Threads"): each LSTM's
arithmetic is the same on any number of threads.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Dict, Mapping, NamedTuple, Tuple

import numpy as np
from llvmlite import ir as llvm_ir
from numba import prange
from numba.core import cgutils, types
from numba.core.errors import TypingError as NumbaTypingError
from numba.extending import intrinsic, overload

from ppo_ref.fast import workspace
from ppo_ref._checks import (LSTM_PARAM_KEYS, as_float_array, as_flag_array, check_lstm_params,
                             check_lstm_state, check_same_shape)
from ppo_ref._numba import njit

__all__ = ["LSTMCache", "StackedArrays", "lstm_forward", "lstm_backward", "lstm_step",
           "forward_stacked", "backward_stacked", "step_stacked", "keep_rows", "all_finite",
           "all_finite_1d"]

Params = Dict[str, np.ndarray]
PARAM_KEYS = LSTM_PARAM_KEYS


class LSTMCache(NamedTuple):
    """What :func:`lstm_backward` reads; written by :func:`lstm_forward`. All float64.

    Attributes:
        x: ``[T, N, D]`` the inputs (the caller's array itself when it was float64: not copied,
            so it must not be modified between the forward and the backward pass).
        keep: ``[T + 1, N]`` ``1 - episode_starts`` for steps ``0..T-1``, and ``keep[T] = 1``
            (the gradients ``dh_T, dc_T`` enter unmasked).
        h_prev: ``[T, N, H]`` ``h~[t] = keep[t] * h[t-1]``, the state the cell read at step t.
        c_prev: ``[T, N, H]`` ``c~[t] = keep[t] * c[t-1]``.
        gates: ``[T, N, 4H]`` activations ``(i, f, g, o)`` (after sigmoid/tanh), torch order.
        tanh_c: ``[T, N, H]`` ``tanh(c[t])``.
    """
    x: np.ndarray
    keep: np.ndarray
    h_prev: np.ndarray
    c_prev: np.ndarray
    gates: np.ndarray
    tanh_c: np.ndarray


# --------------------------------------------------------------------------------------------
# Compiled kernels. One call runs the whole recursion over T steps (forward) or back over them
# (BPTT); no Python runs per step. The small products are explicit loops, written so that LLVM
# vectorizes them over the contiguous output index j without reassociating any sum: every
# output element is the sum of its terms in index order, ``((b + a_0 w_0) + a_1 w_1) + ...``,
# whatever the number of rows (environments) in the call. An environment's results therefore
# do not depend on which other environments share the call (the replay of a whole rollout and
# a training minibatch of some of its envs compute the same bits), nor on whether the sequence
# is run at once or step by step (lstm_step runs this same kernel with T = 1).
# --------------------------------------------------------------------------------------------

# Exact constants typed float32: in a float32 kernel they keep the arithmetic in float32 (a
# Python float literal is float64 in numba and would widen it); in a float64 kernel they are
# widened exactly, so the float64 arithmetic is the one written with 0.5 and 1.0.
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)

_LN2_HI = 6.93147180369123816490e-01   # ln 2 rounded to 32 significant bits: k * _LN2_HI is
_LN2_LO = 1.90821492927058770002e-10   # exact for |k| < 2^20; _LN2_HI + _LN2_LO = ln 2
_INV_LN2 = 1.44269504088896338700e+00  # 1 / ln 2
_ROUND = 6755399441055744.0            # 1.5 * 2^52: (v + _ROUND) - _ROUND = v rounded to integer


def _pow2(k):
    """``2.0 ** k`` for an integer-valued float ``k`` in [-1022, 1023], exactly."""
    return math.ldexp(1.0, int(k))


def _exponent_intrinsic(name, nb_float, ll_float, int_bits, bias, mantissa_bits):
    """An intrinsic ``k -> 2.0 ** k`` for an integer-valued ``k`` of type ``nb_float``: the
    float whose exponent field is ``k + bias`` and whose mantissa is zero (an integer shift and
    a bit cast, which LLVM vectorizes; ``math.ldexp`` is a scalar library call)."""
    def exponent_bits(typingctx, k):
        sig = nb_float(nb_float)

        def codegen(context, builder, signature, args):
            int_type = llvm_ir.IntType(int_bits)
            k_int = builder.fptosi(args[0], int_type)
            bits = builder.shl(builder.add(k_int, llvm_ir.Constant(int_type, bias)),
                               llvm_ir.Constant(int_type, mantissa_bits))
            return builder.bitcast(bits, ll_float)
        return sig, codegen
    exponent_bits.__name__ = exponent_bits.__qualname__ = name
    return intrinsic(exponent_bits)


# Compiled :func:`_pow2`: the float64 whose exponent field is ``k + 1023``.
_pow2_bits = _exponent_intrinsic("_pow2_bits", types.float64, llvm_ir.DoubleType(), 64, 1023, 52)


@overload(_pow2)
def _pow2_compiled(k):
    return lambda k: _pow2_bits(k)


def _fma(a, b, c):
    """``a * b + c`` rounded once (IEEE 754 fusedMultiplyAdd), for finite floats: exact
    rational arithmetic, then one correctly rounded conversion (to float32 when all three are
    float32, as ``llvm.fma.f32``; else to float64). The interpreted version of the compiled one
    below (same bits); only the tests run it."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    if all(isinstance(v, np.float32) for v in (a, b, c)):
        return _round_to_float32(exact)
    return float(exact)


def _round_to_float32(q: Fraction) -> np.float32:
    """The float32 nearest to the rational ``q`` (ties to even; +-inf beyond the largest
    float32), rounded once: ``np.float32(float(q))`` would round twice."""
    if q == 0:
        return np.float32(0.0)
    sign = -1 if q < 0 else 1
    q = abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()  # 2**e <= q < 2**(e+2)
    if Fraction(2) ** e > q:
        e -= 1
    e = max(e, -126)                                           # subnormals: a fixed exponent
    n = round(q / Fraction(2) ** (e - 23))                     # 24-bit significand, half-even
    if n >= 2 ** 24:
        n //= 2                                                # exact: n was 2**24
        e += 1
    if e > 127:
        return np.float32(sign * np.inf)
    return np.float32(sign * math.ldexp(n, e - 23))


@intrinsic
def _fma_llvm(typingctx, a, b, c):
    """Compiled :func:`_fma`: LLVM's ``llvm.fma.f64`` (one vector FMA instruction per lane when
    the loop is vectorized). An explicit operation, not a compiler contraction: the order of
    every sum stays as written. Three float32 operands give ``llvm.fma.f32`` (one rounding to
    float32; the float32 kernels), anything else float64."""
    if all(t == types.float32 for t in (a, b, c)):
        sig = types.float32(types.float32, types.float32, types.float32)
    else:
        sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return sig, codegen


@overload(_fma)
def _fma_compiled(a, b, c):
    return lambda a, b, c: _fma_llvm(a, b, c)


def _wide():
    """Ask for 512-bit vectors in the compiled kernel that calls it (a no-op when interpreted).

    LLVM tunes its x86 targets that have AVX-512 to vectorize loops 256 bits wide (4 float64
    lanes), to spare the clock drop some CPUs take on 512-bit instructions. Compiled,
    :func:`_wide` marks the calling function ``"prefer-vector-width"="512"``, so the loop
    vectorizer of that kernel uses 512-bit vectors (8 float64 lanes) on such CPUs; elsewhere
    nothing changes (the attribute only states a preference; the instruction set is still the
    host's). The vector width never changes results: every vectorized loop here computes each
    element with the same operations in the same order (no fastmath, no reassociation), and
    the tests compare the compiled kernels with their interpreted versions bit for bit.
    """


@intrinsic
def _wide_attribute(typingctx):
    """Compiled :func:`_wide`: adds the function attribute to the function being lowered
    (``builder.function``, the caller: intrinsics are emitted inline). llvmlite checks
    attribute names against a list without key-value attributes, so the set's own ``add``
    is called; the attribute is written verbatim into the IR. Should a later llvmlite store
    attributes differently, nothing is added (the kernels then vectorize 256 bits wide: the
    same results, a little slower)."""
    sig = types.none()

    def codegen(context, builder, signature, args):
        attributes = builder.function.attributes
        if isinstance(attributes, set):
            set.add(attributes, '"prefer-vector-width"="512"')
        return context.get_dummy_value()
    return sig, codegen


@overload(_wide, inline="always")
def _wide_compiled():
    return lambda: _wide_attribute()


@njit
def _tanh(x):
    """tanh(x) from basic IEEE operations only, so that loops calling it vectorize (numba's
    ``math.tanh`` is a scalar libm call, which does not).

    With ``a = min(|x|, 20)`` (tanh(20) rounds to 1) and ``e(y) = exp(y) - 1`` (expm1)::

        a > 0.55:  tanh(a) = 1 - 2 / (e(2a) + 2)        a <= 0.55:  tanh(a) = -e(-2a) / (e(-2a) + 2)

    and ``tanh(x) = sign(x) tanh(a)``. ``e(y)`` by the classic reduction (as fdlibm's expm1):
    ``y = k ln2 + r`` with ``k = round(y / ln2)``, ``|r| <= ln2 / 2``, ``k ln2`` subtracted in two
    parts (Cody & Waite); ``e(r)`` = its Taylor series to ``r^13 / 13!`` (truncation < 2e-17
    relative); ``e(y) = 2^k e(r) + (2^k - 1)``. Within 3 units in the last place of NumPy's
    ``np.tanh`` and never above 1 in magnitude (``tests/test_lstm.py``). NaN is not expected
    (inputs are checked finite); +-inf give +-1.
    """
    a = min(abs(x), 20.0)
    big = a > 0.55
    y = 2.0 * a if big else -2.0 * a
    k = (y * _INV_LN2 + _ROUND) - _ROUND
    r = (y - k * _LN2_HI) - k * _LN2_LO
    p = 1.0 / 6227020800.0             # Horner: e(r) = r + r^2 (1/2! + r (1/3! + ... r / 13!))
    p = _fma(p, r, 1.0 / 479001600.0)
    p = _fma(p, r, 1.0 / 39916800.0)
    p = _fma(p, r, 1.0 / 3628800.0)
    p = _fma(p, r, 1.0 / 362880.0)
    p = _fma(p, r, 1.0 / 40320.0)
    p = _fma(p, r, 1.0 / 5040.0)
    p = _fma(p, r, 1.0 / 720.0)
    p = _fma(p, r, 1.0 / 120.0)
    p = _fma(p, r, 1.0 / 24.0)
    p = _fma(p, r, 1.0 / 6.0)
    p = _fma(p, r, 0.5)
    em = _fma(r * r, p, r)
    s = _pow2(k)
    e = _fma(s, em, s - 1.0)
    # np.divide: numba's "/" checks for a zero divisor (Python semantics), which stops
    # vectorization; the divisor here is >= 1. One division serves both branches (a vectorized
    # loop evaluates both sides of a select, and division is its slowest operation).
    q = np.divide(2.0 if big else -e, e + 2.0)
    v = 1.0 - q if big else q
    return v if x >= 0.0 else -v


# float32 tanh: the same construction with float32 constants (fdlibm's expf split of ln 2,
# whose high part has 17 significant bits, so k * _LN2_HI_F32 is exact for |k| < 2^7).
_F32 = np.float32
_LN2_HI_F32 = _F32(6.9313812256e-01)
_LN2_LO_F32 = _F32(9.0580006145e-06)
_INV_LN2_F32 = _F32(1.4426950216e+00)
_ROUND_F32 = _F32(12582912.0)          # 1.5 * 2^23
_EXPM1_F32 = tuple(_F32(1.0 / math.factorial(i)) for i in range(8, 1, -1))  # 1/8! .. 1/2!


def _pow2_f32(k):
    """``2.0 ** k`` as float32 for an integer-valued ``k`` in [-126, 127], exactly."""
    return np.float32(math.ldexp(1.0, int(k)))


# Compiled :func:`_pow2_f32`: the float32 whose exponent field is ``k + 127``.
_pow2_f32_bits = _exponent_intrinsic("_pow2_f32_bits", types.float32, llvm_ir.FloatType(), 32,
                                     127, 23)


@overload(_pow2_f32)
def _pow2_f32_compiled(k):
    return lambda k: _pow2_f32_bits(k)


@njit
def _tanh_f32(x):
    """:func:`_tanh` in float32 arithmetic for a float32 ``x`` (16 lanes per AVX-512 vector):
    ``a = min(|x|, 10)`` (tanh(10) rounds to 1 in float32), the same two formulas and range
    reduction, ``e(r)`` by its Taylor series to ``r^8 / 8!`` (truncation < 2e-8 relative for
    ``|r| <= ln2 / 2``). Within 4 units in the last place (float32) of ``np.tanh`` evaluated in
    float64 (tested), never above 1 in magnitude."""
    a = min(abs(x), _F32(10.0))
    big = a > _F32(0.55)
    y = _F32(2.0) * a if big else _F32(-2.0) * a
    k = (y * _INV_LN2_F32 + _ROUND_F32) - _ROUND_F32
    r = (y - k * _LN2_HI_F32) - k * _LN2_LO_F32
    c8, c7, c6, c5, c4, c3, c2 = _EXPM1_F32
    p = _fma(c8, r, c7)
    p = _fma(p, r, c6)
    p = _fma(p, r, c5)
    p = _fma(p, r, c4)
    p = _fma(p, r, c3)
    p = _fma(p, r, c2)
    em = _fma(r * r, p, r)
    s = _pow2_f32(k)
    e = _fma(s, em, s - _ONE)
    q = np.divide(_F32(2.0) if big else -e, e + _F32(2.0))
    v = _ONE - q if big else q
    return v if x >= _F32(0.0) else -v


def _tanh_any(x):
    """``tanh`` in the arithmetic of ``x``: :func:`_tanh_f32` for float32, else :func:`_tanh`."""
    return _tanh_f32(x) if isinstance(x, np.float32) else _tanh(x)


@overload(_tanh_any)
def _tanh_any_compiled(x):
    if x == types.float32:
        return lambda x: _tanh_f32(x)
    return lambda x: _tanh(x)


def _target_vector_bits() -> int:
    """The width of the vector registers numba compiles for: 512 when the target has AVX-512F
    (``NUMBA_CPU_FEATURES`` when set, else the host's features, as numba itself decides),
    else 256 (AVX2; also taken for older targets)."""
    from numba.core import config
    if config.CPU_FEATURES:
        features = set(config.CPU_FEATURES.replace(" ", "").split(","))
        return 512 if "+avx512f" in features else 256
    import llvmlite.binding as llvm_binding
    return 512 if llvm_binding.get_host_cpu_features().get("avx512f", False) else 256


# The register blocks of _add_products (rows, columns), chosen for the target's vector
# registers; which block computes an element never changes its bits (the same FMA chain).
# AVX-512 (32 registers of 8 float64): 8 x 16 (16 accumulators) for calls of few rows (an LSTM
# step's environments), and 6 x 32 (24 accumulators: each weight vector loaded serves 6 rows
# and each broadcast 4 vectors) for calls of many rows whose width 32 divides. AVX2 (16
# registers of 4 float64): 6 x 8 (12 accumulators in float64; 6 in float32), the only block,
# since the larger ones would not fit in the registers.
_VECTOR_BITS = _target_vector_bits()
if _VECTOR_BITS >= 512:
    _BLOCK_ROWS, _BLOCK_COLS = 8, 16
    _WIDE_ROWS, _WIDE_COLS = 6, 32
    _WIDE_MIN_ROWS = 24   # fewer rows than this: the 8 x 16 blocks
else:
    _BLOCK_ROWS, _BLOCK_COLS = 6, 8
    _WIDE_ROWS, _WIDE_COLS = 6, 8
    _WIDE_MIN_ROWS = 2 ** 62   # (never: one block shape)


def _block_loops(out, a, w_t, n, j0, rows, cols):
    """``out[n:n+rows, j0:j0+cols] += a[n:n+rows] @ w_t[:, j0:j0+cols]``, every element a chain
    of FMAs in the order k = 0, 1, ..., K-1 starting from its value in ``out`` (the arithmetic
    of :func:`_add_products`)."""
    for m in range(n, n + rows):
        for j in range(j0, j0 + cols):
            o = out[m, j]
            for k in range(a.shape[1]):
                o = _fma(a[m, k], w_t[k, j], o)
            out[m, j] = o


def _add_block(out, a, w_t, n, j0):
    """:func:`_block_loops` on the 8 x 16 block at ``(n, j0)``. Interpreted here; compiled, a
    register block of :func:`_block_vector_intrinsic`."""
    _block_loops(out, a, w_t, n, j0, _BLOCK_ROWS, _BLOCK_COLS)


def _add_block_wide(out, a, w_t, n, j0):
    """:func:`_block_loops` on the 6 x 32 block at ``(n, j0)``. Interpreted here; compiled, a
    register block of :func:`_block_vector_intrinsic`."""
    _block_loops(out, a, w_t, n, j0, _WIDE_ROWS, _WIDE_COLS)


def _block_vector_intrinsic(block_rows, block_cols, panel=False, f32_cols=None):
    """The compiled block of ``block_rows`` x ``block_cols`` (:func:`_block_loops`) for float64
    (or float32) arrays, ``out`` and ``w_t`` C-contiguous (``a``: any strides): the columns of
    each row are held in vector accumulators of the target's register width (``<8 x double>``
    or ``<16 x float>`` with AVX-512, ``<4 x double>`` or ``<8 x float>`` otherwise) for the
    whole k loop; per k, the weight row segment is loaded once and each ``a[m, k]`` is broadcast into
    an ``llvm.fma`` per accumulator. Element for element the same FMA chain as the scalar loops
    (no reassociation), without a load and store of ``out`` per few terms: the loop runs at the
    FMA units' rate instead of the store port's. (Accumulators live in stack slots that LLVM
    promotes to registers.)

    With ``panel`` True, the block of :func:`_panel_block` instead: arguments ``(out, a,
    w_panel, b, n, j0, c0)``, every accumulator starting from the bias ``b[j0 + c0 + c]`` (1-D,
    contiguous) rather than from ``out``, the weights read from the panel ``w_panel [K, >= c0 +
    block_cols]`` (C-contiguous, its columns ``c0 .. c0 + block_cols - 1``) and the sums stored
    into ``out[n + r, j0 + c0 + c]``: ``out = b + a @ w`` on the block, the same FMA chain per
    element. ``f32_cols``: the block's width for float32 operands (default ``block_cols``), so
    that one block holds the same number of vectors in both dtypes."""
    def block_vector(typingctx, out, a, w_t, n, j0):
        return block_typed(types.none(out, a, w_t, n, j0), out.dtype == types.float32)

    def panel_vector(typingctx, out, a, w_panel, b, n, j0, c0):
        return block_typed(types.none(out, a, w_panel, b, n, j0, c0),
                           out.dtype == types.float32)

    def block_typed(sig, is_f32):
        cols = (f32_cols or block_cols) if is_f32 else block_cols

        def codegen(context, builder, signature, args):
            out_ty, a_ty, w_ty = signature.args[:3]
            arrays = [context.make_array(ty)(context, builder, v)
                      for ty, v in zip((out_ty, a_ty, w_ty), args[:3])]
            out_arr, a_arr, w_arr = arrays
            intp = context.get_value_type(types.intp)
            if panel:
                b_ty = signature.args[3]
                b_arr = context.make_array(b_ty)(context, builder, args[3])
                args, int_types = args[1:], signature.args[1:]
            else:
                int_types = signature.args
            n_ = context.cast(builder, args[3], int_types[3], types.intp)
            j_ = context.cast(builder, args[4], int_types[4], types.intp)
            if panel:  # out and b from column j0 + c0, the panel from column c0
                w_j = context.cast(builder, args[5], int_types[5], types.intp)
                j_ = builder.add(j_, w_j)
            elem = llvm_ir.FloatType() if is_f32 else llvm_ir.DoubleType()
            lanes = _VECTOR_BITS // (32 if is_f32 else 64)   # one vector register
            n_vec = cols // lanes
            vec = llvm_ir.VectorType(elem, lanes)
            vec_ptr = vec.as_pointer()
            item = 4 if is_f32 else 8  # vector loads/stores only assume the element's alignment
            fma = cgutils.get_or_insert_function(
                builder.module, llvm_ir.FunctionType(vec, [vec, vec, vec]),
                f"llvm.fma.v{lanes}{'f32' if is_f32 else 'f64'}")
            undef = llvm_ir.Constant(vec, llvm_ir.Undefined)
            lane0 = llvm_ir.Constant(llvm_ir.IntType(32), 0)
            splat = llvm_ir.Constant(llvm_ir.VectorType(llvm_ir.IntType(32), lanes), [0] * lanes)

            def const(v):
                return llvm_ir.Constant(intp, v)

            def pointer(arr, ty, *indices):
                return cgutils.get_item_pointer2(
                    context, builder, arr.data, cgutils.unpack_tuple(builder, arr.shape),
                    cgutils.unpack_tuple(builder, arr.strides), ty.layout, list(indices),
                    wraparound=False)

            slots = []
            for r in range(block_rows):
                for v in range(n_vec):
                    ptr = builder.bitcast(pointer(out_arr, out_ty, builder.add(n_, const(r)),
                                                  builder.add(j_, const(lanes * v))), vec_ptr)
                    if panel:
                        start = builder.bitcast(
                            pointer(b_arr, b_ty, builder.add(j_, const(lanes * v))), vec_ptr)
                    else:
                        start = ptr
                    slot = cgutils.alloca_once(builder, vec)
                    builder.store(builder.load(start, align=item), slot)
                    slots.append((slot, ptr))
            if not panel:
                w_j = j_
            n_k = cgutils.unpack_tuple(builder, a_arr.shape)[1]
            with cgutils.for_range(builder, n_k) as loop:
                k = loop.index
                w_vecs = [builder.load(builder.bitcast(
                    pointer(w_arr, w_ty, k, builder.add(w_j, const(lanes * v))), vec_ptr),
                    align=item) for v in range(n_vec)]
                for r in range(block_rows):
                    a_k = builder.load(pointer(a_arr, a_ty, builder.add(n_, const(r)), k))
                    a_vec = builder.shuffle_vector(builder.insert_element(undef, a_k, lane0),
                                                   undef, splat)
                    for v in range(n_vec):
                        slot = slots[r * n_vec + v][0]
                        builder.store(builder.call(fma, [a_vec, w_vecs[v], builder.load(slot)]),
                                      slot)
            for slot, ptr in slots:
                builder.store(builder.load(slot), ptr, align=item)
            return context.get_dummy_value()
        return sig, codegen
    typing = panel_vector if panel else block_vector
    typing.__name__ = typing.__qualname__ = \
        f"_{'panel' if panel else 'block'}_{block_rows}x{block_cols}"
    return intrinsic(typing)


def _check_block_operands(out, a, w_t):
    """Typing-time check of the compiled blocks' operands: 2-D arrays of one dtype, float64 or
    float32, ``out`` and ``w_t`` C-contiguous (read and written as vectors) and ``a`` of any
    strides (read as scalars: e.g. the transposed view ``d.T`` of a C array, no copy); anything
    else is refused when the caller is compiled (a ``TypingError``), so no layout or dtype
    selects another code path."""
    if not (all(isinstance(t, types.Array) and t.ndim == 2 for t in (out, a, w_t))
            and out.layout == "C" and w_t.layout == "C"
            and out.dtype in (types.float32, types.float64)
            and a.dtype == out.dtype and w_t.dtype == out.dtype):
        raise NumbaTypingError(
            "_add_products/_add_block take 2-D float64 or float32 arrays of one dtype, out and "
            f"w_t C-contiguous, got {out}, {a}, {w_t}: pass np.ascontiguousarray copies")


_add_block_vector = _block_vector_intrinsic(_BLOCK_ROWS, _BLOCK_COLS)
_add_block_wide_vector = _block_vector_intrinsic(_WIDE_ROWS, _WIDE_COLS)


@overload(_add_block)
def _add_block_compiled(out, a, w_t, n, j0):
    """Compiled, :func:`_add_block` is the 8 x 16 register block (operands:
    :func:`_check_block_operands`)."""
    _check_block_operands(out, a, w_t)
    return lambda out, a, w_t, n, j0: _add_block_vector(out, a, w_t, n, j0)


@overload(_add_block_wide)
def _add_block_wide_compiled(out, a, w_t, n, j0):
    """Compiled, :func:`_add_block_wide` is the 6 x 32 register block (operands:
    :func:`_check_block_operands`)."""
    _check_block_operands(out, a, w_t)
    return lambda out, a, w_t, n, j0: _add_block_wide_vector(out, a, w_t, n, j0)


@njit
def _add_products_loops(out, a, w_t, n_lo, n_hi, j_lo):
    """The rows ``n_lo .. n_hi - 1`` and columns ``j_lo .. J - 1`` of :func:`_add_products`,
    four k and four rows at a time (each loaded weight serves four rows), the remaining k and
    rows one at a time; the loop over j vectorizes."""
    _wide()
    n_k = a.shape[1]
    n_j = w_t.shape[1]
    k4 = n_k - n_k % 4
    n4 = n_lo + (n_hi - n_lo) // 4 * 4
    for n in range(n_lo, n4, 4):
        for k in range(0, k4, 4):
            a0, a1, a2, a3 = a[n, k], a[n, k + 1], a[n, k + 2], a[n, k + 3]
            b0, b1, b2, b3 = a[n + 1, k], a[n + 1, k + 1], a[n + 1, k + 2], a[n + 1, k + 3]
            c0, c1, c2, c3 = a[n + 2, k], a[n + 2, k + 1], a[n + 2, k + 2], a[n + 2, k + 3]
            d0, d1, d2, d3 = a[n + 3, k], a[n + 3, k + 1], a[n + 3, k + 2], a[n + 3, k + 3]
            for j in range(j_lo, n_j):
                w0, w1, w2, w3 = w_t[k, j], w_t[k + 1, j], w_t[k + 2, j], w_t[k + 3, j]
                out[n, j] = _fma(a3, w3, _fma(a2, w2, _fma(a1, w1, _fma(a0, w0, out[n, j]))))
                out[n + 1, j] = _fma(b3, w3, _fma(b2, w2, _fma(b1, w1,
                                                                _fma(b0, w0, out[n + 1, j]))))
                out[n + 2, j] = _fma(c3, w3, _fma(c2, w2, _fma(c1, w1,
                                                                _fma(c0, w0, out[n + 2, j]))))
                out[n + 3, j] = _fma(d3, w3, _fma(d2, w2, _fma(d1, w1,
                                                                _fma(d0, w0, out[n + 3, j]))))
        for k in range(k4, n_k):
            for m in range(n, n + 4):
                am = a[m, k]
                for j in range(j_lo, n_j):
                    out[m, j] = _fma(am, w_t[k, j], out[m, j])
    for n in range(n4, n_hi):
        for k in range(0, k4, 4):
            a0, a1, a2, a3 = a[n, k], a[n, k + 1], a[n, k + 2], a[n, k + 3]
            for j in range(j_lo, n_j):
                out[n, j] = _fma(a3, w_t[k + 3, j], _fma(a2, w_t[k + 2, j], _fma(
                    a1, w_t[k + 1, j], _fma(a0, w_t[k, j], out[n, j]))))
        for k in range(k4, n_k):
            a0 = a[n, k]
            for j in range(j_lo, n_j):
                out[n, j] = _fma(a0, w_t[k, j], out[n, j])


@njit
def _add_products_narrow(out, a, w_t):
    """:func:`_add_products` for few columns (an output layer of one or two units): each
    column's chain over k = 0, 1, ... held in registers for eight rows at once (eight
    independent FMA chains in flight, instead of a load and store of ``out`` per few terms);
    the same FMA chain per element."""
    n_rows, n_k = a.shape
    n_j = w_t.shape[1]
    n8 = n_rows - n_rows % 8
    for n in range(0, n8, 8):
        for j in range(n_j):
            o0, o1, o2, o3 = out[n, j], out[n + 1, j], out[n + 2, j], out[n + 3, j]
            o4, o5, o6, o7 = out[n + 4, j], out[n + 5, j], out[n + 6, j], out[n + 7, j]
            for k in range(n_k):
                w = w_t[k, j]
                o0 = _fma(a[n, k], w, o0)
                o1 = _fma(a[n + 1, k], w, o1)
                o2 = _fma(a[n + 2, k], w, o2)
                o3 = _fma(a[n + 3, k], w, o3)
                o4 = _fma(a[n + 4, k], w, o4)
                o5 = _fma(a[n + 5, k], w, o5)
                o6 = _fma(a[n + 6, k], w, o6)
                o7 = _fma(a[n + 7, k], w, o7)
            out[n, j], out[n + 1, j], out[n + 2, j], out[n + 3, j] = o0, o1, o2, o3
            out[n + 4, j], out[n + 5, j], out[n + 6, j], out[n + 7, j] = o4, o5, o6, o7
    for n in range(n8, n_rows):
        for j in range(n_j):
            o = out[n, j]
            for k in range(n_k):
                o = _fma(a[n, k], w_t[k, j], o)
            out[n, j] = o


# at most this many columns: _add_products_narrow (one or two outputs: the value and a
# two-action policy head)
_NARROW_COLS = 2


@njit
def _add_products(out, a, w_t):
    """``out[n, j] += sum_k a[n, k] * w_t[k, j]``, term by term in the order k = 0, 1, ...,
    K-1, each term added by one fused multiply-add: ``o <- fma(a[n, k], w_t[k, j], o)``.

    ``out`` ``[M, J]``, ``a`` ``[M, K]``, ``w_t`` ``[K, J]`` (the weight pre-transposed so j is
    contiguous), 2-D arrays of one dtype, float64 or float32, ``out`` and ``w_t`` C-contiguous,
    ``a`` of any strides (e.g. a transposed view; other layouts are refused:
    :func:`_check_block_operands`). Register blocks accumulated in vector registers over all k:
    6 rows x 32 columns (:func:`_add_block_wide`) when there are at least 24 rows and the
    width is a multiple of 32, else 8 x 16 (:func:`_add_block`); the columns and rows left over
    by :func:`_add_products_loops`; one or two columns in all by :func:`_add_products_narrow`.
    The arithmetic of an element is the same chain of FMAs in every case (which block computes
    it changes nothing), so a row's result does not depend on the other rows of the call.
    """
    n_rows = a.shape[0]
    n_j = w_t.shape[1]
    if n_j <= _NARROW_COLS:
        _add_products_narrow(out, a, w_t)
        return
    if n_rows >= _WIDE_MIN_ROWS and n_j % _WIDE_COLS == 0:
        n6 = n_rows - n_rows % _WIDE_ROWS
        for n in range(0, n6, _WIDE_ROWS):
            for j0 in range(0, n_j, _WIDE_COLS):
                _add_block_wide(out, a, w_t, n, j0)
        if n6 < n_rows:
            _add_products_loops(out, a, w_t, n6, n_rows, 0)
        return
    n8 = n_rows - n_rows % _BLOCK_ROWS
    j16 = n_j - n_j % _BLOCK_COLS
    if j16 == 0:
        n8 = 0
    for n in range(0, n8, _BLOCK_ROWS):
        for j0 in range(0, j16, _BLOCK_COLS):
            _add_block(out, a, w_t, n, j0)
    if n8 > 0 and j16 < n_j:
        _add_products_loops(out, a, w_t, 0, n8, j16)
    if n8 < n_rows:
        _add_products_loops(out, a, w_t, n8, n_rows, 0)


# Panels: a transposed weight ``w_t [K, J]`` stored as ``w_p [P, K, C]`` with ``w_p[p, k, c] =
# w_t[k, p C + c]`` (C = _PANEL_COLS, P = ceil(J / C), zeros beyond column J), so that a
# register block reads its weights from one contiguous stretch of memory instead of a few
# vectors from each of K rows far apart. A full panel is computed in register blocks of
# _PANEL_WIDE_F64 (float64) or _PANEL_WIDE_F32 (float32) columns, on AVX-512 three vectors a
# row in either dtype (8 x 24 float64, 8 x 48 float32: 24 accumulators, each weight vector
# loaded serving 8 rows); the last, partial panel (4H = 256 = 5 x 48 + 16) in blocks of
# _BLOCK_COLS columns. AVX2 uses one block shape (6 x 8, panels of 8). Which layout the
# weights are read from and which block computes an element change no element's arithmetic:
# :func:`_linear_panels` is :func:`_linear_rows`, bit for bit.
if _VECTOR_BITS >= 512:
    _PANEL_COLS = 48
    _PANEL_WIDE_F64, _PANEL_WIDE_F32 = 24, 48
else:
    _PANEL_COLS = _BLOCK_COLS
    _PANEL_WIDE_F64 = _PANEL_WIDE_F32 = _BLOCK_COLS


def _panel_block(out, a, w_panel, b, n, j0, c0, cols, rows=_BLOCK_ROWS):
    """``out[n:n+R, j0+c0:j0+c0+cols] = b[j0+c0:j0+c0+cols] + a[n:n+R] @ w_panel[:, c0:c0+cols]``
    (R = ``rows``), every element the FMA chain of :func:`_linear_rows`."""
    for m in range(n, n + rows):
        for c in range(c0, c0 + cols):
            o = b[j0 + c]
            for k in range(a.shape[1]):
                o = _fma(a[m, k], w_panel[k, c], o)
            out[m, j0 + c] = o


def _linear_panel(out, a, w_panel, b, n, j0, c0):
    """:func:`_panel_block` of _BLOCK_COLS columns (a partial panel's). Interpreted here;
    compiled, a register block of :func:`_block_vector_intrinsic` (``panel=True``)."""
    _panel_block(out, a, w_panel, b, n, j0, c0, _BLOCK_COLS)


def _panel_wide_cols(out):
    """The width of the full panels' blocks for the dtype of ``out``: _PANEL_WIDE_F32 for
    float32, else _PANEL_WIDE_F64 (a constant when compiled)."""
    return _PANEL_WIDE_F32 if out.dtype == np.float32 else _PANEL_WIDE_F64


@overload(_panel_wide_cols)
def _panel_wide_cols_compiled(out):
    cols = _PANEL_WIDE_F32 if out.dtype == types.float32 else _PANEL_WIDE_F64
    return lambda out: cols


def _linear_panel_wide(out, a, w_panel, b, n, j0, c0):
    """:func:`_panel_block` of :func:`_panel_wide_cols` columns (a full panel's). Interpreted
    here; compiled, a register block of :func:`_block_vector_intrinsic` (``panel=True``)."""
    _panel_block(out, a, w_panel, b, n, j0, c0, _panel_wide_cols(out))


_linear_panel_vector = _block_vector_intrinsic(_BLOCK_ROWS, _BLOCK_COLS, panel=True)
_linear_panel_wide_vector = _block_vector_intrinsic(_BLOCK_ROWS, _PANEL_WIDE_F64, panel=True,
                                                    f32_cols=_PANEL_WIDE_F32)


def _check_panel_operands(out, a, w_panel, b):
    """Typing-time check of a panel block's operands: :func:`_check_block_operands`, and ``b``
    1-D, C-contiguous, of their dtype."""
    _check_block_operands(out, a, w_panel)
    if not (isinstance(b, types.Array) and b.ndim == 1 and b.layout == "C"
            and b.dtype == out.dtype):
        raise NumbaTypingError(f"_linear_panel takes a 1-D C-contiguous bias of the dtype of "
                               f"out, got {b}")


@overload(_linear_panel)
def _linear_panel_compiled(out, a, w_panel, b, n, j0, c0):
    """Compiled, :func:`_linear_panel` is a register block (:func:`_check_panel_operands`)."""
    _check_panel_operands(out, a, w_panel, b)
    return lambda out, a, w_panel, b, n, j0, c0: _linear_panel_vector(out, a, w_panel, b, n,
                                                                      j0, c0)


@overload(_linear_panel_wide)
def _linear_panel_wide_compiled(out, a, w_panel, b, n, j0, c0):
    """Compiled, :func:`_linear_panel_wide` is a register block
    (:func:`_check_panel_operands`)."""
    _check_panel_operands(out, a, w_panel, b)
    return lambda out, a, w_panel, b, n, j0, c0: _linear_panel_wide_vector(out, a, w_panel, b,
                                                                           n, j0, c0)


@njit
def _linear_panel_loops(out, a, w_p, b, n_lo, n_hi, p, c_lo):
    """The rows ``n_lo .. n_hi - 1`` and the columns ``c_lo ..`` of panel ``p`` (those below J)
    of :func:`_linear_panels`, the loop over the panel's columns vectorized."""
    _wide()
    j0 = p * _PANEL_COLS
    cols = min(_PANEL_COLS, out.shape[1] - j0)
    for m in range(n_lo, n_hi):
        for c in range(c_lo, cols):
            out[m, j0 + c] = b[j0 + c]
        for k in range(a.shape[1]):
            am = a[m, k]
            for c in range(c_lo, cols):
                out[m, j0 + c] = _fma(am, w_p[p, k, c], out[m, j0 + c])


@njit
def _linear_panels(x, w_p, b, out):
    """:func:`_linear_rows` (``out = b + x @ w_t``, the same FMA chain per element) with the
    weight as panels ``w_p [P, K, C]`` of ``w_t [K, J]`` (:func:`_pack_panels`): ``x [M, K]``
    (any strides), ``b [J]``, ``out [M, J]`` C-contiguous. Full panels in register blocks of
    :func:`_linear_panel_wide`, a last partial panel in blocks of :func:`_linear_panel` as far
    as they fit; the rows and columns left over by :func:`_linear_panel_loops`."""
    n_rows = x.shape[0]
    n_j = out.shape[1]
    n_blocked = n_rows - n_rows % _BLOCK_ROWS
    wide = _panel_wide_cols(out)
    for p in range(w_p.shape[0]):
        j0 = p * _PANEL_COLS
        cols = min(_PANEL_COLS, n_j - j0)
        if cols == _PANEL_COLS:
            for n in range(0, n_blocked, _BLOCK_ROWS):
                for c0 in range(0, _PANEL_COLS, wide):
                    _linear_panel_wide(out, x, w_p[p], b, n, j0, c0)
            c_blocked = cols
        else:
            c_blocked = cols - cols % _BLOCK_COLS
            for n in range(0, n_blocked, _BLOCK_ROWS):
                for c0 in range(0, c_blocked, _BLOCK_COLS):
                    _linear_panel(out, x, w_p[p], b, n, j0, c0)
        if c_blocked < cols:
            _linear_panel_loops(out, x, w_p, b, 0, n_blocked, p, c_blocked)
        if n_blocked < n_rows:
            _linear_panel_loops(out, x, w_p, b, n_blocked, n_rows, p, 0)


@njit
def _pack_panels(w, w_p, k0):
    """Rows ``k0 .. k0 + K - 1`` of the panels ``w_p [P, >= k0 + K, C]`` of ``w.T``, from a
    weight as stored, ``w [J, K]``: ``w_p[p, k0 + k, c] = w[p C + c, k]``, and 0 where ``p C + c
    >= J``."""
    n_j, n_k = w.shape
    for p in range(w_p.shape[0]):
        for k in range(n_k):
            for c in range(_PANEL_COLS):
                j = p * _PANEL_COLS + c
                w_p[p, k0 + k, c] = w[j, k] if j < n_j else 0.0


def _panel_count(n_cols: int) -> int:
    """The number of panels P of a weight with ``n_cols`` output columns: ceil(J / C)."""
    return -(-n_cols // _PANEL_COLS)


@njit
def _activate_gates(z):
    """In place on ``z`` ``[N, 4H]``: (i, f, o) blocks ``sigmoid(z) = 0.5 + 0.5 tanh(0.5 z)``
    (``0.5 z`` is exact), g block ``tanh(z)``. (One call site of :func:`_tanh` per kernel, so
    LLVM inlines it and vectorizes the loop.)"""
    _wide()
    n_env, four_h = z.shape
    lo, hi = four_h // 2, 3 * four_h // 4
    for n in range(n_env):
        for j in range(four_h):
            is_g = lo <= j < hi
            v = _tanh_any(z[n, j] if is_g else _HALF * z[n, j])
            z[n, j] = v if is_g else _HALF + _HALF * v


@njit
def _cell_output(t, z, keep, c_prev, h_prev, tanh_c, h_seq):
    """Step t from the activations ``z = gates[t]``: ``c = f c~ + i g``, ``h = o tanh(c)``;
    the next carried state ``(h~, c~)[t+1] = keep[t+1] (h, c)`` (``keep[T] = 1``: row T holds
    the unmasked final state)."""
    _wide()
    n_env, hidden = h_seq.shape[1], h_seq.shape[2]
    for n in range(n_env):
        k = keep[t + 1, n]
        for j in range(hidden):
            c = z[n, hidden + j] * c_prev[t, n, j] + z[n, j] * z[n, 2 * hidden + j]
            tanh_c[t, n, j] = _tanh_any(c)
            h = z[n, 3 * hidden + j] * tanh_c[t, n, j]  # tanh(c) as stored (float32: rounded)
            h_seq[t, n, j] = h
            h_prev[t + 1, n, j] = k * h
            c_prev[t + 1, n, j] = k * c


@njit
def _forward_kernel(x, w_ih_t, w_hh_t, b, keep, h_prev, c_prev, gates, tanh_c, h_seq):
    """The forward recursion over all T steps (module docstring), in place.

    Inputs: ``x`` ``[T, N, D]``, ``w_ih_t = w_ih.T`` ``[D, 4H]``, ``w_hh_t = w_hh.T``
    ``[H, 4H]``, ``b`` ``[4H]``, ``keep`` ``[T + 1, N]``, and rows 0 of ``h_prev``/``c_prev``
    (``[T + 1, N, H]``) holding ``keep[0] * (h0, c0)``. Writes rows 1..T of ``h_prev``/``c_prev``
    (row T: the unmasked final state), ``gates`` ``[T, N, 4H]`` (i, f, g, o), ``tanh_c``,
    ``h_seq``. Per step: ``z = (b + sum_d x_d w_ih_t[d]) + sum_k h~_k w_hh_t[k]``, then
    :func:`_activate_gates` and :func:`_cell_output`.
    """
    _wide()
    n_steps, n_env, _ = x.shape
    for t in range(n_steps):
        z = gates[t]
        _linear_rows(x[t], w_ih_t, b, z)
        _add_products(z, h_prev[t], w_hh_t)
        _activate_gates(z)
        _cell_output(t, z, keep, c_prev, h_prev, tanh_c, h_seq)


@njit
def _forward_kernel_panels(xh, w_p, b, keep, h_prev, c_prev, gates, tanh_c, h_seq):
    """:func:`_forward_kernel` with a step's two products as one over the concatenated input:
    ``z = b + [x[t], h~[t]] @ [w_ih.T; w_hh.T]`` is the same FMA chain per element (the bias,
    then the D input terms, then the H state terms, in that order). ``xh [T, N, D + H]`` holds
    ``x[t]`` in its first D columns; the last H columns of row t are set to ``h~[t]`` here;
    ``w_p`` the panels of ``[w_ih.T; w_hh.T]`` (``[D + H, 4H]``, :func:`_pack_panels`). The
    other arguments and results as :func:`_forward_kernel`."""
    _wide()
    n_steps, n_env, d_xh = xh.shape
    hidden = h_prev.shape[2]
    d_in = d_xh - hidden
    for t in range(n_steps):
        for n in range(n_env):
            for j in range(hidden):
                xh[t, n, d_in + j] = h_prev[t, n, j]
        z = gates[t]
        _linear_panels(xh[t], w_p, b, z)
        _activate_gates(z)
        _cell_output(t, z, keep, c_prev, h_prev, tanh_c, h_seq)


@njit
def _backward_kernel(dh_seq, dh_rec, dc_rec, keep, gates, tanh_c, c_prev, w_hh, dz):
    """BPTT over all T steps (module docstring), in place: ``dh_rec``/``dc_rec`` ``[N, H]``
    enter holding ``dh~[T], dc~[T]`` (``dh_T``, ``dc_T``) and leave holding ``dh~[0], dc~[0]``;
    writes ``dz`` ``[T, N, 4H]``. ``w_hh`` ``[4H, H]`` as stored (``dh~ = dz @ w_hh`` has the
    contiguous index innermost already)."""
    _backward_steps(dh_seq, dh_rec, dc_rec, keep, gates, tanh_c, c_prev, w_hh, dz, True)


@njit
def _backward_steps(dh_seq, dh_rec, dc_rec, keep, gates, tanh_c, c_prev, w_hh, dz,
                    initial_state_grads):
    """:func:`_backward_kernel`; with ``initial_state_grads`` False the last product, ``dh~[0] =
    dz[0] @ w_hh`` (read only by the initial-state gradient), is skipped: ``dz`` is the same,
    ``dh_rec``/``dc_rec`` are left undefined."""
    _wide()
    n_steps, n_env, hidden = dh_seq.shape
    for t in range(n_steps - 1, -1, -1):
        for n in range(n_env):
            k = keep[t + 1, n]
            for j in range(hidden):
                gi = gates[t, n, j]
                gf = gates[t, n, hidden + j]
                gg = gates[t, n, 2 * hidden + j]
                go = gates[t, n, 3 * hidden + j]
                tc = tanh_c[t, n, j]
                dh = dh_seq[t, n, j] + k * dh_rec[n, j]
                dc = k * dc_rec[n, j] + dh * go * (_ONE - tc * tc)
                dz[t, n, j] = dc * gg * gi * (_ONE - gi)
                dz[t, n, hidden + j] = dc * c_prev[t, n, j] * gf * (_ONE - gf)
                dz[t, n, 2 * hidden + j] = dc * gi * (_ONE - gg * gg)
                dz[t, n, 3 * hidden + j] = dh * tc * go * (_ONE - go)
                dc_rec[n, j] = dc * gf
        if t == 0 and not initial_state_grads:
            break
        dh_rec[:, :] = 0.0
        _add_products(dh_rec, dz[t], w_hh)


@njit
def _transpose_into(a, a_t):
    """``a_t[j, n] = a[n, j]`` (2-D): in tiles of 8 x 8, the leftover rows and columns one by
    one."""
    _wide()
    rows, cols = a.shape
    r8 = rows - rows % 8
    c8 = cols - cols % 8
    for n0 in range(0, r8, 8):
        for j0 in range(0, c8, 8):
            for j in range(j0, j0 + 8):
                for n in range(n0, n0 + 8):
                    a_t[j, n] = a[n, j]
        for j in range(c8, cols):
            for n in range(n0, n0 + 8):
                a_t[j, n] = a[n, j]
    for n in range(r8, rows):
        for j in range(cols):
            a_t[j, n] = a[n, j]


@njit
def _column_sums(d, out):
    """``out[j] = sum_n d[n, j]``, rows added in order from 0 (2-D ``d``, 1-D ``out``)."""
    _wide()
    out[:] = 0.0
    for n in range(d.shape[0]):
        for j in range(d.shape[1]):
            out[j] += d[n, j]


@njit
def _linear_rows(x, w_t, b, out):
    """``out = b + x @ w_t`` row by row (a dense layer ``x @ w.T + b`` with ``w_t = w.T``
    ``[K, J]``): ``out[n, j] = fma(x[n, K-1], w_t[K-1, j], ... fma(x[n, 0], w_t[0, j], b[j]))``,
    the chain of :func:`_add_products`. A row's result does not depend on the other rows of
    the call (a BLAS product's rounding can depend on the number of rows), which is what lets
    the recurrent policy's towers replay any subset of envs bit for bit."""
    _wide()
    for n in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[n, j] = b[j]
    _add_products(out, x, w_t)


# Several LSTMs reading the same inputs (the actor and critic LSTMs of a policy) in one call:
# the kernels above, once per LSTM, on stacked weights and outputs with a leading axis L. The
# arithmetic of each LSTM is that of lstm_forward / lstm_backward / lstm_step, bit for bit.

_FLOAT64_MAX = float(np.finfo(np.float64).max)  # abs(v) <= it is False exactly for inf, nan


@njit
def all_finite(a):
    """True if every entry of the C-contiguous float64 array ``a`` is finite (a count of
    comparisons, which vectorizes, rather than a loop that stops at the first failure)."""
    _wide()
    flat = a.reshape(-1)
    n_finite = 0
    for i in range(flat.size):
        n_finite += abs(flat[i]) <= _FLOAT64_MAX
    return n_finite == flat.size


@njit
def all_finite_1d(a) -> bool:
    """True if every entry of the 1-D float array ``a`` is finite (stops at the first that is
    not)."""
    for i in range(a.size):
        if not math.isfinite(a[i]):
            return False
    return True


@njit(parallel=True)
def _forward_stack(x, w_ih_t, w_hh_t, b, keep, h0, c0, h_prev, c_prev, gates, tanh_c, h_seq):
    """:func:`_forward_kernel` for L LSTMs on the same ``x [T, N, D]`` and ``keep [T + 1, N]``:
    ``w_ih_t [L, D, 4H]``, ``w_hh_t [L, H, 4H]``, ``b [L, 4H]``, carried states ``h0, c0
    [L, N, H]`` (multiplied by ``keep[0]`` here, as :func:`_run` does); writes ``h_prev,
    c_prev [L, T + 1, N, H]``, ``gates [L, T, N, 4H]``, ``tanh_c, h_seq [L, T, N, H]``. The L
    LSTMs share no written array, so they run on numba's threads (``prange``), with the results
    of the plain loop over ``l``."""
    n_lstm, n_env, hidden = h0.shape
    for l in prange(n_lstm):
        for n in range(n_env):
            k = keep[0, n]
            for j in range(hidden):
                h_prev[l, 0, n, j] = h0[l, n, j] * k
                c_prev[l, 0, n, j] = c0[l, n, j] * k
        _forward_kernel(x, w_ih_t[l], w_hh_t[l], b[l], keep, h_prev[l], c_prev[l], gates[l],
                        tanh_c[l], h_seq[l])


@njit
def _forward_one_t(x, w_ih, w_hh, b, keep, h0, c0, w_p, xh, h_prev, c_prev, gates, tanh_c,
                   h_seq):
    """One LSTM of :func:`_forward_stack_t` (its arguments without the leading ``L`` axis):
    ``x`` copied into the first D columns of ``xh [T, N, D + H]``, ``[w_ih.T; w_hh.T]`` packed
    into ``w_p`` (:func:`_pack_panels`), the carried state masked by ``keep[0]``, then
    :func:`_forward_kernel_panels`."""
    _wide()
    n_steps, n_env, d_in = x.shape
    hidden = h0.shape[1]
    for t in range(n_steps):
        for n in range(n_env):
            for d in range(d_in):
                xh[t, n, d] = x[t, n, d]
    _pack_panels(w_ih, w_p, 0)
    _pack_panels(w_hh, w_p, d_in)
    for n in range(n_env):
        k = keep[0, n]
        for j in range(hidden):
            h_prev[0, n, j] = h0[n, j] * k
            c_prev[0, n, j] = c0[n, j] * k
    _forward_kernel_panels(xh, w_p, b, keep, h_prev, c_prev, gates, tanh_c, h_seq)


@njit(parallel=True)
def _forward_stack_t(x, w_ih, w_hh, b, keep, h0, c0, w_p, xh, h_prev, c_prev, gates, tanh_c,
                     h_seq):
    """:func:`_forward_stack` from the weights as stored (``w_ih [L, 4H, D]``, ``w_hh
    [L, 4H, H]``), packed here into the scratch panels ``w_p [L, P, D + H, C]`` of ``[w_ih.T;
    w_hh.T]`` (:func:`_pack_panels`), by :func:`_forward_kernel_panels` with the scratch ``xh
    [L, T, N, D + H]`` (same results, bit for bit). The L LSTMs (:func:`_forward_one_t` each)
    share no written array, so they run on numba's threads (``prange``), with the results of
    the plain loop over ``l``."""
    for l in prange(w_ih.shape[0]):
        _forward_one_t(x, w_ih[l], w_hh[l], b[l], keep, h0[l], c0[l], w_p[l], xh[l], h_prev[l],
                       c_prev[l], gates[l], tanh_c[l], h_seq[l])


@njit
def _step_stack(x, w_ih_t, w_hh_t, b, keep, h, c, h_new, c_new):
    """One step of L LSTMs for acting: :func:`_forward_stack` with T = 1 on ``x [N, D]``,
    ``keep [2, N]`` (``1 - episode_starts``, then ones), ``h, c [L, N, H]``; writes the new
    states into ``h_new, c_new [L, N, H]`` (what ``lstm_step`` returns, bit for bit)."""
    n_lstm, n_env, hidden = h.shape
    x3 = x.reshape(1, n_env, x.shape[1])
    dtype = h.dtype
    h_prev = np.empty((n_lstm, 2, n_env, hidden), dtype)
    c_prev = np.empty((n_lstm, 2, n_env, hidden), dtype)
    gates = np.empty((n_lstm, 1, n_env, 4 * hidden), dtype)
    tanh_c = np.empty((n_lstm, 1, n_env, hidden), dtype)
    h_seq = np.empty((n_lstm, 1, n_env, hidden), dtype)
    _forward_stack(x3, w_ih_t, w_hh_t, b, keep, h, c, h_prev, c_prev, gates, tanh_c, h_seq)
    for l in range(n_lstm):
        for n in range(n_env):
            for j in range(hidden):
                h_new[l, n, j] = h_seq[l, 0, n, j]
                c_new[l, n, j] = c_prev[l, 1, n, j]


@njit
def _step_stack_flags(x, w_ih_t, w_hh_t, b, starts, h, c, h_new, c_new):
    """:func:`_step_stack` from the bool flags ``starts [N]``: ``keep`` (``[2, N]``, the values
    :func:`keep_rows` gives: ``1 - starts``, then ones) is made here."""
    n_env = x.shape[0]
    keep = np.ones((2, n_env), x.dtype)
    for n in range(n_env):
        if starts[n]:
            keep[0, n] = 0.0
    _step_stack(x, w_ih_t, w_hh_t, b, keep, h, c, h_new, c_new)


@njit
def _weight_grads(dz, x, h_prev, g_w_ih, g_w_hh, g_b, x_t, out):
    """The weight gradients of BPTT from ``dz [T, N, 4H]``, ``x [T, N, D]`` and the states the
    cell read, ``h_prev`` (rows ``0..T-1`` of ``[>= T, N, H]``), all C-contiguous of one
    dtype; overwrites ``g_w_ih [4H, D]``, ``g_w_hh [4H, H]``, ``g_b [4H]``::

        g_w_ih[j, d] = sum_m dz[m, j] x[m, d]    g_w_hh[j, k] = sum_m dz[m, j] h~[m, k]
        g_b[j] = sum_m dz[m, j]                  (m = t N + n over the T N rows)

    Every sum runs over the rows in the order m = 0, 1, ..., T N - 1, a product weight term
    added by one FMA (:func:`_add_products`), a bias term by one addition: the summation order
    is this documented one whatever the machine or BLAS (a BLAS product orders its sums by its
    own kernels), and the products run in vector registers. ``g_w_hh`` by
    ``_add_products(g_w_hh, dz.T, h~)`` (the transposed view: no copy); ``g_w_ih``, whose few
    columns D would not fill a vector, as its transpose ``x^T dz`` into ``out [D, 4H]``
    (scratch), then copied (the same products in the same order). ``x_t [D, T N]`` must hold
    ``x^T`` (the caller transposes ``x`` once for every LSTM reading it,
    :func:`_transpose_into`)."""
    _wide()
    n_steps, n_env, four_h = dz.shape
    hidden = h_prev.shape[2]
    rows = n_steps * n_env
    dz_rows = dz.reshape(rows, four_h)
    out[:, :] = 0.0
    _add_products(out, x_t, dz_rows)
    _transpose_into(out, g_w_ih)
    g_w_hh[:, :] = 0.0
    _add_products(g_w_hh, dz_rows.T, h_prev[:n_steps].reshape(rows, hidden))
    _column_sums(dz_rows, g_b)


@njit
def _backward_one(dh_seq, keep, gates, tanh_c, c_prev, w_hh, x, h_prev, dz, g_w_ih, g_w_hh, g_b,
                  x_t, products, w_hh_copy):
    """One LSTM of :func:`_backward_stack` (its arguments without the leading ``L`` axis,
    ``x_t`` already holding ``x^T``): ``w_hh`` copied into ``w_hh_copy``, then
    :func:`_backward_steps` from zero final-state gradients and :func:`_weight_grads`."""
    _wide()
    four_h, hidden = w_hh.shape
    n_env = dh_seq.shape[1]
    for j in range(four_h):
        for k in range(hidden):
            w_hh_copy[j, k] = w_hh[j, k]
    dh_rec = np.zeros((n_env, hidden), dh_seq.dtype)
    dc_rec = np.zeros((n_env, hidden), dh_seq.dtype)
    _backward_steps(dh_seq, dh_rec, dc_rec, keep, gates, tanh_c, c_prev, w_hh_copy, dz, False)
    _weight_grads(dz, x, h_prev, g_w_ih, g_w_hh, g_b, x_t, products)


@njit(parallel=True)
def _backward_stack(dh_seq, keep, gates, tanh_c, c_prev, w_hh, x, h_prev, dz, g_w_ih, g_w_hh,
                    g_b, x_t, products, w_hh_copy):
    """:func:`_backward_kernel` (without the initial-state product: :func:`_backward_steps`)
    then :func:`_weight_grads` for L LSTMs from zero final-state gradients: ``dh_seq [L, T, N,
    H]``, the ``keep``/``gates``/``tanh_c``/``c_prev`` of :func:`_forward_stack`, ``w_hh [L,
    4H, H]``, the inputs ``x [T, N, D]`` and ``h_prev [L, T + 1, N, H]``; writes ``dz [L, T,
    N, 4H]`` and the weight gradients ``g_w_ih [L, 4H, D]``, ``g_w_hh [L, 4H, H]``, ``g_b [L,
    4H]``. Scratch: ``x_t [D, T N]`` (``x^T``, written once here for every LSTM), ``products
    [L, D, 4H]`` (:func:`_weight_grads`'), ``w_hh_copy [L, 4H, H]`` (the steps read a copy of
    ``w_hh`` that starts at a cache line: StackedArrays). The L LSTMs (:func:`_backward_one`
    each) share no written array, so they run on numba's threads (``prange``), with the
    results of the plain loop over ``l``."""
    n_steps, n_env = dh_seq.shape[1], dh_seq.shape[2]
    _transpose_into(x.reshape(n_steps * n_env, x.shape[2]), x_t)
    for l in prange(dh_seq.shape[0]):
        _backward_one(dh_seq[l], keep, gates[l], tanh_c[l], c_prev[l], w_hh[l], x, h_prev[l],
                      dz[l], g_w_ih[l], g_w_hh[l], g_b[l], x_t, products[l], w_hh_copy[l])


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------

def _run(w_ih, w_hh, b, x, h0, c0, keep):
    """The forward recursion on validated float64 arrays; returns (h_seq, c_T, cache)."""
    n_steps, n_env, _ = x.shape
    hidden = w_hh.shape[1]
    x = np.ascontiguousarray(x)
    # h_prev[t], c_prev[t] = the carried state read at step t; row T holds (h_T, c_T) unmasked.
    h_prev = np.empty((n_steps + 1, n_env, hidden))
    c_prev = np.empty((n_steps + 1, n_env, hidden))
    np.multiply(h0, keep[0, :, None], out=h_prev[0])
    np.multiply(c0, keep[0, :, None], out=c_prev[0])
    gates = np.empty((n_steps, n_env, 4 * hidden))
    tanh_c = np.empty((n_steps, n_env, hidden))
    h_seq = np.empty((n_steps, n_env, hidden))
    _forward_kernel(x, np.ascontiguousarray(w_ih.T), np.ascontiguousarray(w_hh.T),
                    np.ascontiguousarray(b), keep, h_prev, c_prev, gates, tanh_c, h_seq)
    cache = LSTMCache(x=x, keep=keep, h_prev=h_prev[:n_steps], c_prev=c_prev[:n_steps],
                      gates=gates, tanh_c=tanh_c)
    return h_seq, c_prev[n_steps].copy(), cache


def _aligned_empty(name: str, shape: Tuple[int, ...], dtype, pooled: bool) -> np.ndarray:
    """An uninitialized C-contiguous array of ``shape`` and ``dtype`` starting at a multiple of
    64 bytes (:mod:`ppo_ref.fast.workspace`'s alignment): fresh, or with ``pooled`` from the
    reuse pool ``"lstm." + name``."""
    if pooled:
        return workspace.empty("lstm." + name, shape, dtype)
    return workspace.aligned(shape, dtype)


class StackedArrays(NamedTuple):
    """The arrays of :func:`forward_stacked` and :func:`backward_stacked` for ``L`` LSTMs of
    width ``H`` with ``D`` inputs over ``T`` steps of ``N`` environments, all C-contiguous of
    one dtype (the compute dtype): what the forward writes, ``h_seq [L, T, N, H]``, ``h_prev,
    c_prev [L, T + 1, N, H]``, ``gates [L, T, N, 4H]``, ``tanh_c [L, T, N, H]`` (the results of
    :func:`forward_stacked`); its scratch, ``w_p [L, P, D + H, C]`` (the weight panels,
    :func:`_pack_panels`) and ``xh [L, T, N, D + H]``; and the backward's scratch, ``dz [L, T,
    N, 4H]``, ``x_t [D, T N]``, ``products [L, D, 4H]``, ``w_hh [L, 4H, H]`` (a copy of the recurrent
    weights); each starting at a multiple of 64 bytes.
    Made once by :meth:`empty` and passed as
    ``arrays`` to both functions, so a caller that runs many passes of one size allocates
    nothing per pass."""
    h_seq: np.ndarray
    h_prev: np.ndarray
    c_prev: np.ndarray
    gates: np.ndarray
    tanh_c: np.ndarray
    w_p: np.ndarray
    xh: np.ndarray
    dz: np.ndarray
    x_t: np.ndarray
    products: np.ndarray
    w_hh: np.ndarray

    @classmethod
    def empty(cls, n_lstm: int, n_steps: int, n_env: int, d_in: int, hidden: int, dtype,
              pooled: bool = False) -> "StackedArrays":
        """Uninitialized :class:`StackedArrays` for these sizes in ``dtype``: fresh arrays
        (:func:`ppo_ref.fast.workspace.aligned`), or with ``pooled`` True arrays of the reuse
        pools of :mod:`ppo_ref.fast.workspace` (never one still held elsewhere)."""
        def new(name, shape):
            return _aligned_empty(name, shape, dtype, pooled)
        four_h = 4 * hidden
        state = (n_lstm, n_steps, n_env, hidden)
        carried = (n_lstm, n_steps + 1, n_env, hidden)
        return cls(new("h_seq", state), new("h_prev", carried), new("c_prev", carried),
                   new("gates", (n_lstm, n_steps, n_env, four_h)), new("tanh_c", state),
                   new("w_panels", (n_lstm, _panel_count(four_h), d_in + hidden, _PANEL_COLS)),
                   new("xh", (n_lstm, n_steps, n_env, d_in + hidden)),
                   new("dz", (n_lstm, n_steps, n_env, four_h)),
                   new("x_t", (d_in, n_steps * n_env)),
                   new("products", (n_lstm, d_in, four_h)),
                   new("w_hh", (n_lstm, four_h, hidden)))


def forward_stacked(w_ih, w_hh, b, x, h0, c0, keep, arrays=None):
    """Unchecked forward of L LSTMs over the same inputs, for the fast path of
    :class:`ppo_ref.train.recurrent_policies.RecurrentPolicy` (its caller has checked what
    :func:`lstm_forward` checks): ``w_ih [L, 4H, D]``, ``w_hh [L, 4H, H]``, ``b [L, 4H]``,
    ``x [T, N, D]`` C-contiguous, ``h0, c0 [L, N, H]`` C-contiguous, ``keep [T + 1, N]`` (as
    :func:`_keep_mask`), all float64: the arithmetic of :func:`lstm_forward` for each LSTM, bit
    for bit. All float32 instead: the same kernels in float32 (16 lanes per AVX-512 vector;
    the products are float32 FMA chains, ``tanh`` is evaluated in float32 arithmetic).

    ``arrays``: a :class:`StackedArrays` of these sizes and dtype to write into, or None for arrays of the reuse pools of
    :mod:`ppo_ref.fast.workspace` (never one still held).

    Returns ``(h_seq [L, T, N, H], h_prev [L, T + 1, N, H], c_prev [L, T + 1, N, H],
    gates [L, T, N, 4H], tanh_c [L, T, N, H])``: per LSTM what :class:`LSTMCache` holds (row
    ``T`` of ``h_prev``/``c_prev`` is the unmasked final state); with ``arrays``, its fields.
    """
    if arrays is None:
        n_lstm, four_h, d_in = w_ih.shape
        n_steps, n_env, _ = x.shape
        arrays = StackedArrays.empty(n_lstm, n_steps, n_env, d_in, four_h // 4, x.dtype,
                                     pooled=True)
    b = np.ascontiguousarray(b)
    a = arrays
    _forward_stack_t(x, w_ih, w_hh, b, keep, h0, c0, a.w_p, a.xh, a.h_prev, a.c_prev, a.gates,
                     a.tanh_c, a.h_seq)
    return a.h_seq, a.h_prev, a.c_prev, a.gates, a.tanh_c


def backward_stacked(w_hh, x, h_prev, c_prev, gates, tanh_c, keep, dh_seq, g_w_ih, g_w_hh, g_b,
                     arrays=None):
    """Unchecked BPTT for :func:`forward_stacked` (its arrays, ``w_hh [L, 4H, H]`` and
    ``dh_seq [L, T, N, H]`` C-contiguous, all float64 or all float32; zero gradient on the
    final states). Writes the weight gradients into ``g_w_ih [L, 4H, D]``, ``g_w_hh [L, 4H,
    H]``, ``g_b [L, 4H]`` with the products and sums of :func:`lstm_backward` (same bits);
    ``dx`` and the initial-state gradients are not computed. Scratch: the ``dz``, ``x_t``,
    ``products`` and ``w_hh`` of ``arrays`` (a :class:`StackedArrays` of these sizes), or of the
    reuse pools of :mod:`ppo_ref.fast.workspace` when ``arrays`` is None."""
    if arrays is None:
        n_lstm, n_steps, n_env, hidden = dh_seq.shape
        dtype = dh_seq.dtype
        d_in = x.shape[2]
        four_h = 4 * hidden
        dz = _aligned_empty("dz", (n_lstm, n_steps, n_env, four_h), dtype, True)
        x_t = _aligned_empty("x_t", (d_in, n_steps * n_env), dtype, True)
        products = _aligned_empty("products", (n_lstm, d_in, four_h), dtype, True)
        w_hh_copy = _aligned_empty("w_hh", w_hh.shape, dtype, True)
    else:
        dz, x_t, products, w_hh_copy = arrays.dz, arrays.x_t, arrays.products, arrays.w_hh
    _backward_stack(dh_seq, keep, gates, tanh_c, c_prev, w_hh, x, h_prev, dz, g_w_ih, g_w_hh,
                    g_b, x_t, products, w_hh_copy)


def _keep_mask(episode_starts, shape: Tuple[int, ...], shape_name: str) -> np.ndarray:
    """``keep[t] = 1 - episode_starts[t]`` with a row of ones appended: float64 ``[T + 1, N]``.

    ``shape`` is the expected shape of ``episode_starts``: ``(T, N)``, or ``(N,)`` for one step.
    """
    starts = as_flag_array(episode_starts, "episode_starts", ndim=(len(shape),))
    check_same_shape(starts, "episode_starts", shape, shape_name)
    n_env = shape[-1]
    return keep_rows(starts.reshape(-1, n_env), np.float64)


def keep_rows(starts: np.ndarray, dtype) -> np.ndarray:
    """``keep`` of :func:`_keep_mask` from checked flags ``starts [T, N]`` (bool or 0/1), no
    checks: ``1 - starts[t]`` for ``t < T`` and a row of ones, ``[T + 1, N]`` in ``dtype``."""
    keep = np.ones((starts.shape[0] + 1, starts.shape[1]), dtype)
    keep[:-1] -= starts
    return keep


def step_stacked(w_ih_t, w_hh_t, b, x, h, c, starts):
    """Unchecked one step of L LSTMs for acting, in the dtype of ``x [N, D]``: ``w_ih_t
    [L, D, 4H]``, ``w_hh_t [L, H, 4H]`` (transposed weights), ``b [L, 4H]``, states ``h, c
    [L, N, H]``, bool ``starts [N]``; returns the new ``(h, c)`` (:func:`_step_stack`, the
    arithmetic of ``lstm_step``; ``keep`` made in the same compiled call,
    :func:`_step_stack_flags`)."""
    h_new = np.empty(h.shape, x.dtype)
    c_new = np.empty(c.shape, x.dtype)
    _step_stack_flags(x, w_ih_t, w_hh_t, b, starts, h, c, h_new, c_new)
    return h_new, c_new


def lstm_forward(params: Mapping[str, np.ndarray], x, h0, c0, episode_starts):
    """Run the LSTM over a time-major sequence, resetting the state at episode starts.

    Equals :func:`ppo_ref.spec.lstm.lstm_forward` in float64 within rtol 1e-12, atol 1e-14
    per result array (the ``lstm`` row of ``tests/test_tiers.py``; compiled recursion,
    products as FMA chains in input order).

    Equations: the module docstring (torch.nn.LSTM cell, state multiplied by
    ``1 - episode_starts[t]`` before step t).

    Args:
        params: ``{"w_ih": [4H, D], "w_hh": [4H, H], "b": [4H]}`` (torch gate order i, f, g, o;
            ``b`` is torch's ``b_ih + b_hh``).
        x: ``[T, N, D]`` inputs, T >= 1 steps of N >= 1 environments.
        h0: ``[N, H]`` hidden state carried into step 0.
        c0: ``[N, H]`` cell state carried into step 0.
        episode_starts: ``[T, N]`` bool or 0/1 numbers; True at t = the first step of an
            episode (the carried state is zeroed before that step).

    Returns:
        ``(h_seq, (h_T, c_T), cache)``: ``h_seq`` ``[T, N, H]`` the hidden state after every
        step; ``h_T = h_seq[T-1]`` and ``c_T`` ``[N, H]`` the final state (unmasked, to carry
        into the next segment); ``cache`` an :class:`LSTMCache` for :func:`lstm_backward`.
        All float64; ``h_T`` and ``c_T`` are fresh arrays.

    Raises:
        ValueError: naming the argument, for a missing/misshapen parameter, wrong ranks or
            shapes (``x``, ``h0``, ``c0``, ``episode_starts``), non-finite values, flags other
            than 0/1, or T = 0 / N = 0.
    """
    w_ih, w_hh, b = check_lstm_params(params)
    hidden, d_in = w_hh.shape[1], w_ih.shape[1]
    x = as_float_array(x, "x", ndim=(3,)).astype(np.float64, copy=False)
    n_steps, n_env, d_x = x.shape
    if n_steps < 1 or n_env < 1:
        raise ValueError(f"x must be [T, N, D] with T >= 1 and N >= 1, got shape {x.shape}")
    if d_x != d_in:
        raise ValueError(f"x must have {d_in} features (params['w_ih'] is [4H, D] = "
                         f"{list(w_ih.shape)}), got shape {x.shape}")
    h0 = check_lstm_state(h0, "h0", n_env, hidden)
    c0 = check_lstm_state(c0, "c0", n_env, hidden)
    keep = _keep_mask(episode_starts, (n_steps, n_env), "[T, N]")
    h_seq, c_last, cache = _run(w_ih, w_hh, b, x, h0, c0, keep)
    return h_seq, (h_seq[n_steps - 1].copy(), c_last), cache


def lstm_step(params: Mapping[str, np.ndarray], x, h, c, episode_starts):
    """One LSTM step for acting: ``(h, c) <- cell(x, keep * h, keep * c)``, no cache.

    Equals :func:`ppo_ref.spec.lstm.lstm_step` in float64 within rtol 1e-12, atol 1e-14 per
    result array (the ``lstm`` row of ``tests/test_tiers.py``).

    The compiled recursion of :func:`lstm_forward` with T = 1 (``keep = 1 -
    episode_starts``), so stepping a sequence one step at a time gives the same states, bit for
    bit, as one :func:`lstm_forward` over it.

    Args:
        params: as :func:`lstm_forward`.
        x: ``[N, D]`` inputs of the current step.
        h: ``[N, H]`` carried hidden state.
        c: ``[N, H]`` carried cell state.
        episode_starts: ``[N]`` bool or 0/1; True where this step starts a new episode.

    Returns:
        ``(h_new, c_new)``, float64 ``[N, H]`` each (fresh arrays; inputs are not modified).

    Raises:
        ValueError: naming the argument (``x``, ``h``, ``c``, ``episode_starts``, ``params``).
    """
    w_ih, w_hh, b = check_lstm_params(params)
    hidden, d_in = w_hh.shape[1], w_ih.shape[1]
    x = as_float_array(x, "x", ndim=(2,)).astype(np.float64, copy=False)
    n_env, d_x = x.shape
    if n_env < 1:
        raise ValueError(f"x must be [N, D] with N >= 1, got shape {x.shape}")
    if d_x != d_in:
        raise ValueError(f"x must have {d_in} features (params['w_ih'] is [4H, D] = "
                         f"{list(w_ih.shape)}), got shape {x.shape}")
    h = check_lstm_state(h, "h", n_env, hidden)
    c = check_lstm_state(c, "c", n_env, hidden)
    keep = _keep_mask(episode_starts, (n_env,), "[N]")
    # The sequence kernel with T = 1: the same arithmetic as lstm_forward, bit for bit.
    h_seq, c_new, _ = _run(w_ih, w_hh, b, x[None], h, c, keep)
    return h_seq[0], c_new


def lstm_backward(params: Mapping[str, np.ndarray], cache: LSTMCache, dh_seq,
                  dh_T=None, dc_T=None):
    """Backpropagation through time for :func:`lstm_forward` (equations: module docstring).

    Equals :func:`ppo_ref.spec.lstm.lstm_backward` in float64 within rtol 1e-12, atol 1e-14
    per result array (the ``lstm`` row of ``tests/test_tiers.py``), given this module's
    :class:`LSTMCache` (the spec's cache is another type).

    Args:
        params: the parameters the forward pass used.
        cache: the :class:`LSTMCache` returned by :func:`lstm_forward`.
        dh_seq: ``[T, N, H]`` gradient of the loss w.r.t. ``h_seq``.
        dh_T: ``[N, H]`` or None (zero): gradient w.r.t. the returned ``h_T`` arriving from
            outside ``h_seq`` (e.g. from the next truncated-BPTT segment). It adds to
            ``dh_seq[T-1]``, since ``h_T`` is ``h_seq[T-1]``.
        dc_T: ``[N, H]`` or None (zero): gradient w.r.t. the returned ``c_T``.

    Returns:
        ``(dx, grads, (dh0, dc0))``: ``dx`` ``[T, N, D]``; ``grads`` a dict with the keys and
        shapes of ``params``; ``dh0``, ``dc0`` ``[N, H]`` (exactly 0 for environments whose
        ``episode_starts[0]`` is True). All float64, fresh arrays; nothing is mutated.

    Raises:
        ValueError: naming the argument, for a cache that is not an :class:`LSTMCache`,
            parameters that do not match the cache, or a misshapen / non-finite gradient.
    """
    w_ih, w_hh, b = check_lstm_params(params)
    if not isinstance(cache, LSTMCache):
        raise ValueError(f"cache must be the LSTMCache returned by lstm_forward, "
                         f"got {type(cache).__name__}")
    n_steps, n_env, d_in = cache.x.shape
    hidden = cache.tanh_c.shape[2]
    if w_hh.shape[1] != hidden or w_ih.shape[1] != d_in:
        raise ValueError(f"params do not match cache: params['w_ih'] {w_ih.shape}, "
                         f"params['w_hh'] {w_hh.shape}; cache has D = {d_in}, H = {hidden}")
    dh_seq = as_float_array(dh_seq, "dh_seq", ndim=(3,)).astype(np.float64, copy=False)
    check_same_shape(dh_seq, "dh_seq", (n_steps, n_env, hidden), "h_seq [T, N, H]")
    dh_rec = np.zeros((n_env, hidden)) if dh_T is None else \
        check_lstm_state(dh_T, "dh_T", n_env, hidden).copy()
    dc_rec = np.zeros((n_env, hidden)) if dc_T is None else \
        check_lstm_state(dc_T, "dc_T", n_env, hidden).copy()

    keep, gates, tanh_c, c_prev = cache.keep, cache.gates, cache.tanh_c, cache.c_prev
    dz = np.empty((n_steps, n_env, 4 * hidden))
    # dh_rec / dc_rec are overwritten in place, step by step, down to dh~[0] / dc~[0].
    _backward_kernel(np.ascontiguousarray(dh_seq), dh_rec, dc_rec, keep, gates, tanh_c, c_prev,
                     np.ascontiguousarray(w_hh), dz)
    dh0 = dh_rec * keep[0, :, None]
    dc0 = dc_rec * keep[0, :, None]

    grads = {"w_ih": np.empty_like(w_ih), "w_hh": np.empty_like(w_hh), "b": np.empty_like(b)}
    x = np.ascontiguousarray(cache.x)
    x_t = np.empty((d_in, n_steps * n_env))
    _transpose_into(x.reshape(n_steps * n_env, d_in), x_t)
    _weight_grads(dz, x, cache.h_prev, grads["w_ih"], grads["w_hh"], grads["b"], x_t,
                  np.empty((d_in, 4 * hidden)))
    dx = np.zeros((n_steps, n_env, d_in))
    _add_products(dx.reshape(n_steps * n_env, d_in), dz.reshape(n_steps * n_env, 4 * hidden),
                  w_ih)
    return dx, grads, (dh0, dc0)
