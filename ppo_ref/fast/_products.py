"""Machinery of the compiled networks (private): fused multiply-adds, ``tanh`` from basic
operations, and products ``out += a @ w_t`` as chains of FMAs in index order.

Shared by the compiled LSTM (:mod:`ppo_ref.fast.lstm`) and the compiled MLP layers. Nothing here
is a twin of a spec function; it is how the twins compute their products and activations.

Products. :func:`_add_products` adds ``sum_k a[n, k] * w_t[k, j]`` to ``out[n, j]`` term by term
in the order ``k = 0, 1, ..., K-1``, each term by one fused multiply-add (:func:`_fma`, one
rounding). Which loop or register block computes an element never changes its operations, so a
row's result does not depend on the other rows of the call (a BLAS product's rounding can), nor
on the machine's vector width. That is what lets a network's fast twin act on N rows, replay T
steps of them or train on any subset and give every row the same bits.

``tanh``. :func:`_tanh` (float64) and :func:`_tanh_f32` (float32) are made of basic IEEE
operations, so the loops calling them vectorize (numba's ``math.tanh`` is a scalar library call,
which does not). :func:`_tanh_any` picks the one of the argument's dtype.

Vector width. :func:`_wide` asks LLVM for 512-bit vectors in the kernel that calls it (on a
target with AVX-512; elsewhere nothing changes). Vector width never changes a result: no
fastmath, no reassociation.
"""
from __future__ import annotations

import math
import sys
import threading
from fractions import Fraction

import numpy as np
from llvmlite import ir as llvm_ir
from numba.core import cgutils, types
from numba.core.errors import TypingError as NumbaTypingError
from numba.extending import intrinsic, overload

from ppo_ref._numba import njit

# Exact constants typed float32: in a float32 kernel they keep the arithmetic in float32 (a
# Python float literal is float64 in numba and would widen it); in a float64 kernel they are
# widened exactly, so the float64 arithmetic is the one written with 0.5 and 1.0.
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)

# --------------------------------------------------------------------------------------------
# Fused multiply-add
# --------------------------------------------------------------------------------------------


def _fma(a, b, c):
    """``a * b + c`` rounded once (IEEE 754 fusedMultiplyAdd), for finite floats: exact
    rational arithmetic, then one correctly rounded conversion (to float32 when all three are
    float32, as ``llvm.fma.f32``; else to float64). The interpreted version of the compiled one
    (same bits; it runs under ``NUMBA_DISABLE_JIT=1``)."""
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
    """Compiled :func:`_fma`: ``llvm.fma.f64`` (``llvm.fma.f32`` for three float32 operands).
    An explicit operation, not a compiler contraction: every sum keeps its written order."""
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


# --------------------------------------------------------------------------------------------
# Vector width
# --------------------------------------------------------------------------------------------


def _wide():
    """Ask for 512-bit vectors in the compiled kernel that calls it (a no-op when interpreted).

    LLVM tunes its x86 targets that have AVX-512 to vectorize loops 256 bits wide; compiled,
    :func:`_wide` marks the calling function ``"prefer-vector-width"="512"``. The attribute
    only states a preference; results never depend on it (no fastmath, no reassociation).
    """


@intrinsic
def _wide_attribute(typingctx):
    """Compiled :func:`_wide`: adds the attribute to the function being lowered (intrinsics
    are emitted inline, so that is the caller). llvmlite checks attribute names against a list
    without key-value attributes, so the set's own ``add`` writes it verbatim; should a later
    llvmlite store attributes otherwise, nothing is added (the same results)."""
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


def _target_vector_bits() -> int:
    """The width of the vector registers numba compiles for: 512 when the target has AVX-512F
    (``NUMBA_CPU_FEATURES`` when set, else the host's features, as numba itself decides),
    else 256."""
    from numba.core import config
    if config.CPU_FEATURES:
        features = set(config.CPU_FEATURES.replace(" ", "").split(","))
        return 512 if "+avx512f" in features else 256
    import llvmlite.binding as llvm_binding
    return 512 if llvm_binding.get_host_cpu_features().get("avx512f", False) else 256


_VECTOR_BITS = _target_vector_bits()

# --------------------------------------------------------------------------------------------
# tanh
# --------------------------------------------------------------------------------------------

_LN2_HI = 6.93147180369123816490e-01   # ln 2 rounded to 32 significant bits: k * _LN2_HI is
_LN2_LO = 1.90821492927058770002e-10   # exact for |k| < 2^20; _LN2_HI + _LN2_LO = ln 2
_INV_LN2 = 1.44269504088896338700e+00  # 1 / ln 2
_ROUND = 6755399441055744.0            # 1.5 * 2^52: (v + _ROUND) - _ROUND = v rounded to integer


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


def _pow2(k):
    """``2.0 ** k`` for an integer-valued float ``k`` in [-1022, 1023], exactly."""
    return math.ldexp(1.0, int(k))


_pow2_bits = _exponent_intrinsic("_pow2_bits", types.float64, llvm_ir.DoubleType(), 64, 1023, 52)


@overload(_pow2)
def _pow2_compiled(k):
    return lambda k: _pow2_bits(k)


@njit
def _tanh(x):
    """tanh(x) in float64 from basic IEEE operations only, so that loops calling it vectorize.

    With ``a = min(|x|, 20)`` (tanh(20) rounds to 1) and ``e(y) = exp(y) - 1`` (expm1)::

        a > 0.55:  tanh(a) = 1 - 2 / (e(2a) + 2)        a <= 0.55:  tanh(a) = -e(-2a) / (e(-2a) + 2)

    and ``tanh(x) = sign(x) tanh(a)``. ``e(y)`` by the classic reduction (as fdlibm's expm1):
    ``y = k ln2 + r`` with ``k = round(y / ln2)``, ``|r| <= ln2 / 2``, ``k ln2`` subtracted in two
    parts (Cody & Waite); ``e(r)`` = its Taylor series to ``r^13 / 13!`` (truncation < 2e-17
    relative); ``e(y) = 2^k e(r) + (2^k - 1)``. Within 3 units in the last place of NumPy's
    ``np.tanh``, never above 1 in magnitude; +-inf give +-1, NaN gives NaN.
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
    # vectorization; the divisor here is >= 1. One division serves both branches.
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


_pow2_f32_bits = _exponent_intrinsic("_pow2_f32_bits", types.float32, llvm_ir.FloatType(), 32,
                                     127, 23)


@overload(_pow2_f32)
def _pow2_f32_compiled(k):
    return lambda k: _pow2_f32_bits(k)


@njit
def _tanh_f32(x):
    """:func:`_tanh` in float32 arithmetic for a float32 ``x``: ``a = min(|x|, 10)`` (tanh(10)
    rounds to 1 in float32), the same two formulas and range reduction, ``e(r)`` by its Taylor
    series to ``r^8 / 8!`` (truncation < 2e-8 relative for ``|r| <= ln2 / 2``). Within 4 units in
    the last place (float32) of ``np.tanh`` evaluated in float64, never above 1 in magnitude."""
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


# --------------------------------------------------------------------------------------------
# Products
# --------------------------------------------------------------------------------------------

# Register blocks of _add_products: R rows x C columns held in vector accumulators, C = two
# vectors of the target's width (16 float64 or 32 float32 columns with AVX-512, 8 or 16 with
# AVX2, where R = 6 keeps 12 accumulators within its 16 registers). Rows left over by the R-row
# blocks go through blocks of R / 2 rows, then of one row.
# With AVX-512, a call of at least _WIDE_MIN_ROWS rows whose width is a multiple of _WIDE_COLS
# (_WIDE_COLS_F32) runs blocks of _WIDE_ROWS rows by four vectors first (24 accumulators: each
# weight vector loaded serves 6 rows, each broadcast 4 vectors; 15% faster on the products of
# the LSTM's weight gradients and of a tower's 256 rows).
if _VECTOR_BITS >= 512:
    _BLOCK_ROWS, _BLOCK_COLS, _BLOCK_COLS_F32 = 8, 16, 32
    _WIDE_ROWS, _WIDE_COLS, _WIDE_COLS_F32, _WIDE_MIN_ROWS = 6, 32, 64, 24
else:
    _BLOCK_ROWS, _BLOCK_COLS, _BLOCK_COLS_F32 = 6, 8, 16
    _WIDE_ROWS, _WIDE_COLS, _WIDE_COLS_F32, _WIDE_MIN_ROWS = 6, 8, 16, 2 ** 62   # (never)
_HALF_BLOCK_ROWS = _BLOCK_ROWS // 2
#: at most this many columns: _add_products_narrow (a value head, a two-action policy head)
_NARROW_COLS = 2


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


def _block_vector_intrinsic(block_rows, block_cols, panel=False, f32_cols=None):
    """The compiled block of ``block_rows`` x ``block_cols`` (:func:`_block_loops`) for float64
    (or float32) arrays, ``out`` and ``w_t`` C-contiguous (``a``: any strides): the columns of
    each row are held in vector accumulators of the target's register width for the whole k
    loop; per k, the weight row segment is loaded once and each ``a[m, k]`` is broadcast into
    an ``llvm.fma`` per accumulator. Element for element the same FMA chain as the scalar loops
    (no reassociation), without a load and store of ``out`` per term.

    With ``panel`` True, the block of a panel layout instead: arguments ``(out, a, w_panel, b,
    n, j0, c0)``, every accumulator starting from the bias ``b[j0 + c0 + c]`` rather than from
    ``out``, the weights read from the panel ``w_panel [K, >= c0 + block_cols]`` (its columns
    ``c0 ..``) and the sums stored into ``out[n + r, j0 + c0 + c]``. ``f32_cols``: the block's
    width for float32 operands (default ``block_cols``)."""
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
    else is refused when the caller is compiled (a ``TypingError``)."""
    if not (all(isinstance(t, types.Array) and t.ndim == 2 for t in (out, a, w_t))
            and out.layout == "C" and w_t.layout == "C"
            and out.dtype in (types.float32, types.float64)
            and a.dtype == out.dtype and w_t.dtype == out.dtype):
        raise NumbaTypingError(
            "_add_products takes 2-D float64 or float32 arrays of one dtype, out and w_t "
            f"C-contiguous, got {out}, {a}, {w_t}: pass np.ascontiguousarray copies")


def _add_block(out, a, w_t, n, j0, rows):
    """:func:`_block_loops` on the block of ``rows`` rows (_BLOCK_ROWS, _HALF_BLOCK_ROWS or 1)
    and :func:`_block_cols` columns at ``(n, j0)``. Interpreted here; compiled, a register
    block."""
    _block_loops(out, a, w_t, n, j0, rows, _block_cols(out))


def _block_cols(out):
    """The width of a block for the dtype of ``out`` (a constant when compiled)."""
    return _BLOCK_COLS_F32 if out.dtype == np.float32 else _BLOCK_COLS


@overload(_block_cols)
def _block_cols_compiled(out):
    cols = _BLOCK_COLS_F32 if out.dtype == types.float32 else _BLOCK_COLS
    return lambda out: cols


def _wide_cols(out):
    """The width of a wide block for the dtype of ``out`` (a constant when compiled)."""
    return _WIDE_COLS_F32 if out.dtype == np.float32 else _WIDE_COLS


@overload(_wide_cols)
def _wide_cols_compiled(out):
    cols = _WIDE_COLS_F32 if out.dtype == types.float32 else _WIDE_COLS
    return lambda out: cols


def _add_wide_block(out, a, w_t, n, j0):
    """:func:`_block_loops` on the block of _WIDE_ROWS rows and :func:`_wide_cols` columns at
    ``(n, j0)``. Interpreted here; compiled, a register block."""
    _block_loops(out, a, w_t, n, j0, _WIDE_ROWS, _wide_cols(out))


_wide_block_vector = _block_vector_intrinsic(_WIDE_ROWS, _WIDE_COLS, f32_cols=_WIDE_COLS_F32)


@overload(_add_wide_block)
def _add_wide_block_compiled(out, a, w_t, n, j0):
    _check_block_operands(out, a, w_t)
    return lambda out, a, w_t, n, j0: _wide_block_vector(out, a, w_t, n, j0)


_block_vectors = tuple(_block_vector_intrinsic(rows, _BLOCK_COLS, f32_cols=_BLOCK_COLS_F32)
                       for rows in (_BLOCK_ROWS, _HALF_BLOCK_ROWS, 1))


@overload(_add_block)
def _add_block_compiled(out, a, w_t, n, j0, rows):
    _check_block_operands(out, a, w_t)
    full, half, one = _block_vectors

    def block(out, a, w_t, n, j0, rows):
        if rows == _BLOCK_ROWS:
            full(out, a, w_t, n, j0)
        elif rows == _HALF_BLOCK_ROWS:
            half(out, a, w_t, n, j0)
        else:
            one(out, a, w_t, n, j0)
    return block


@njit
def _add_products_narrow(out, a, w_t):
    """:func:`_add_products` for few columns (a value head, a two-action policy head): each
    column's chain over k held in registers for eight rows at once (eight independent FMA
    chains in flight); the same FMA chain per element. (Not a path of :func:`_add_products`,
    which the LSTM's products never need and which compiles faster without it.)"""
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


@njit
def _add_products(out, a, w_t):
    """``out[n, j] += sum_k a[n, k] * w_t[k, j]``, term by term in the order k = 0, 1, ...,
    K-1, each term added by one fused multiply-add: ``o <- fma(a[n, k], w_t[k, j], o)``.

    ``out [M, J]``, ``a [M, K]``, ``w_t [K, J]`` (the weight pre-transposed so j is
    contiguous): 2-D arrays of one dtype, float64 or float32, ``out`` and ``w_t``
    C-contiguous, ``a`` of any strides (callers pass :func:`_strided` views, so that one
    compiled version serves every call). Register blocks: of _WIDE_ROWS rows by
    :func:`_wide_cols` columns while they fit (calls of at least _WIDE_MIN_ROWS rows whose width
    they divide), then of :func:`_block_cols` columns and _BLOCK_ROWS rows, _HALF_BLOCK_ROWS,
    one; the columns right of the blocks one row at a time, the loop over them vectorized. The
    arithmetic of an element is the same chain whichever loop computes it, so a row's result
    does not depend on the other rows of the call (nor on which of them a block groups).
    """
    _wide()
    n_rows = a.shape[0]
    n_j = w_t.shape[1]
    n = 0
    wide = _wide_cols(out)
    if n_rows >= _WIDE_MIN_ROWS and n_j % wide == 0:
        while n + _WIDE_ROWS <= n_rows:
            for j0 in range(0, n_j, wide):
                _add_wide_block(out, a, w_t, n, j0)
            n += _WIDE_ROWS
    cols = _block_cols(out)
    j_blocked = n_j - n_j % cols
    while n < n_rows:
        rows = _BLOCK_ROWS if n_rows - n >= _BLOCK_ROWS else (
            _HALF_BLOCK_ROWS if n_rows - n >= _HALF_BLOCK_ROWS else 1)
        for j0 in range(0, j_blocked, cols):
            _add_block(out, a, w_t, n, j0, rows)
        for m in range(n, n + rows):
            for k in range(a.shape[1]):
                a_mk = a[m, k]
                for j in range(j_blocked, n_j):
                    out[m, j] = _fma(a_mk, w_t[k, j], out[m, j])
        n += rows


@njit
def _strided(a):
    """``a`` (2-D) as a view typed of any strides (numba types ``a[:, 0:n]`` so), so that every
    product passes :func:`_add_products` the same operand types: one compiled version per dtype
    serves row-major operands and transposed views alike (its first operand is read as scalars,
    whatever its strides)."""
    return a[:, 0:a.shape[1]]


@njit
def _all_finite(a):
    """True if every entry of the 1-D array ``a`` is finite (a count of comparisons, which
    vectorizes; callers pass ``.reshape(-1)`` views, so one compiled version per dtype)."""
    _wide()
    n_finite = 0
    for i in range(a.size):
        n_finite += abs(a[i]) < _INF
    return n_finite == a.size


_INF = np.float32(np.inf)   # abs(v) < inf is False exactly for inf and NaN (in either dtype)


@njit
def _linear_rows(x, w_t, b, out):
    """``out = b + x @ w_t`` (a dense layer ``x @ w.T + b`` with ``w_t = w.T [K, J]``): every
    element the chain ``fma(x[n, K-1], w_t[K-1, j], ... fma(x[n, 0], w_t[0, j], b[j]))`` of
    :func:`_add_products`, so a row's result does not depend on the other rows."""
    for n in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[n, j] = b[j]
    _add_products(out, _strided(x), w_t)


@njit
def _transpose_into(a, a_t):
    """``a_t[j, n] = a[n, j]`` (2-D): in tiles of 8 x 8, the leftover rows and columns one by
    one."""
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


# --------------------------------------------------------------------------------------------
# Arrays reused across calls
# --------------------------------------------------------------------------------------------

# A pass of a network twin writes a few MB of arrays. glibc's malloc serves arrays that large
# from mmap or the top of the heap and gives them back to the kernel when they are freed, so
# fresh arrays are faulted in page by page at every call (at the LSTM benchmark's shapes, as
# long as the compiled pass itself). A twin therefore takes its arrays as one bundle from this
# pool: a bundle is handed out again only when none of its arrays (nor a view of one: a view
# holds its base) is referenced outside the pool, as CPython counts references. So results a
# caller still holds (a cache waiting for its backward pass) are never overwritten: that call
# gets another bundle. Per thread; at most _BUNDLES_PER_KEY bundles per key and _KEYS keys
# (the least recently used key is dropped).

_BUNDLES_PER_KEY = 4
_KEYS = 16
_pools = threading.local()


def _free_refcount() -> int:
    """``sys.getrefcount`` of an array held only by a bundle, as :func:`_bundle` calls it."""
    bundle = (np.empty(0),)
    return max(sys.getrefcount(a) for a in bundle)


_FREE = _free_refcount()


def _bundle(key, make):
    """A tuple of arrays ``make()`` for ``key`` (which must determine their shapes and dtypes),
    reused when no array of it is referenced outside the pool (the comment above); contents
    undefined, like ``np.empty``."""
    pools = getattr(_pools, "by_key", None)
    if pools is None:
        pools = _pools.by_key = {}
    bundles = pools.pop(key, None)
    if bundles is None:
        bundles = []
        if len(pools) >= _KEYS:
            pools.pop(next(iter(pools)))
    pools[key] = bundles   # most recently used last
    for bundle in bundles:
        if max(sys.getrefcount(a) for a in bundle) <= _FREE:
            return bundle
    bundle = make()
    if len(bundles) < _BUNDLES_PER_KEY:
        bundles.append(bundle)
    return bundle


def _aligned(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array starting at a multiple of 64 bytes (a cache line:
    vector loads of rows of a power-of-two length then never straddle two)."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buf = np.empty(size + 64, np.uint8)
    start = -buf.ctypes.data % 64
    return buf[start:start + size].view(dtype).reshape(shape)
