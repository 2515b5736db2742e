"""Machinery of the compiled networks (private): fused multiply-adds, ``tanh`` from basic
operations, products ``out += a @ w_t`` as chains of FMAs in index order, and arrays reused
across calls. Why each exists and what it guarantees (the same bits whichever rows share a call,
on any vector width; interpreted under ``NUMBA_DISABLE_JIT=1`` with the same results):
docs/fast_tier_notes.md; what each buys: docs/BENCHMARKS.md.
"""
from __future__ import annotations

import functools
import math
import sys
import threading
from fractions import Fraction

import numpy as np
from llvmlite import ir as llvm_ir
from numba.core import cgutils, types
from numba.core import config as _numba_config
from numba.core.errors import TypingError as NumbaTypingError
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic, lower_builtin, overload, type_callable

from ppo_ref._numba import njit

# Exact constants typed float32: in a float32 kernel they keep the arithmetic in float32 (a
# Python float literal is float64 in numba and would widen it); in a float64 kernel they are
# widened exactly, so the float64 arithmetic is the one written with 0.5 and 1.0.
_ZERO = np.float32(0.0)
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)

# Fused multiply-add


def _fma(a, b, c):
    """``a * b + c`` rounded once (IEEE 754 fusedMultiplyAdd): float32 when all three are
    float32 (as ``llvm.fma.f32``), else float64. Compiled: ``llvm.fma``. Interpreted: the same
    results, for scalars (:func:`_fma_scalar`) or NumPy arrays, elementwise and broadcast
    (:func:`_fma_arrays`)."""
    if np.ndim(a) == 0 and np.ndim(b) == 0 and np.ndim(c) == 0:
        return _fma_scalar(a, b, c)
    return _fma_arrays(a, b, c)


def _fma_scalar(a, b, c):
    """:func:`_fma` of three scalars by exact rational arithmetic: the exact ``a * b + c`` as an
    integer over a power of two, then one correctly rounded conversion (Python's integer
    division for float64, :func:`_round_to_float32` for float32). An exact zero gets IEEE's
    sign (-0 only for a zero product and a zero ``c``, both negative); non-finite operands
    give a non-finite result (as the compiled FMA does)."""
    f32 = isinstance(a, np.float32) and isinstance(b, np.float32) and isinstance(c, np.float32)
    a, b, c = float(a), float(b), float(c)
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
        r = a * b + c
        return np.float32(r) if f32 else r
    (na, da), (nb, db), (nc, dc) = (a.as_integer_ratio(), b.as_integer_ratio(),
                                    c.as_integer_ratio())
    num = na * nb * dc + nc * da * db
    den = da * db * dc
    if num == 0:
        negative = (a == 0.0 or b == 0.0) and c == 0.0 and math.copysign(1.0, c) < 0.0 and \
            math.copysign(1.0, a) * math.copysign(1.0, b) < 0.0
        zero = -0.0 if negative else 0.0
        return np.float32(zero) if f32 else zero
    if f32:
        return _round_to_float32(Fraction(num, den))
    try:
        return num / den     # int / int: correctly rounded (round half to even)
    except OverflowError:
        return math.inf if num > 0 else -math.inf


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


_SPLIT = 134217729.0   # 2**27 + 1: Veltkamp's splitting constant for float64


def _two_sum(x, y):
    """``(s, e)``: ``s = x + y`` rounded and its exact error ``e = x + y - s`` (Knuth)."""
    s = x + y
    yy = s - x
    return s, (x - (s - yy)) + (y - yy)


def _two_product(x, y):
    """``(p, e)``: ``p = x * y`` rounded and its exact error (Dekker, Veltkamp's splits; exact
    when nothing overflows or underflows)."""
    p = x * y
    t = _SPLIT * x
    xh = t - (t - x)
    xl = x - xh
    t = _SPLIT * y
    yh = t - (t - y)
    yl = y - yh
    return p, ((xh * yh - p) + xh * yl + xl * yh) + xl * yl


def _round_odd_sum(x, y):
    """``x + y`` (float64 arrays) rounded to odd: exact when representable, else the one of its
    two float64 neighbours whose last significand bit is 1."""
    s, e = _two_sum(x, y)
    s = np.array(s)
    even = (s.view(np.int64) & 1) == 0
    fix = (e != 0.0) & even & np.isfinite(s)
    s[fix] = np.nextafter(s[fix], np.where(e[fix] > 0.0, np.inf, -np.inf))
    return s


def _fma_arrays(a, b, c):
    """:func:`_fma` elementwise on NumPy arrays (broadcast), with correctly rounded results
    (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using
    rounding to odd", IEEE Trans. Computers 57(4), 2008): float32 by float64 arithmetic (the
    product exact, the sum rounded to odd, then to float32); float64 by ``a * b = uh + ul``
    (exact), ``c + uh = th + tl`` (exact), ``th + RO(tl + ul)``. Elements outside the range
    where those steps are exact (huge, tiny or non-finite operands) by :func:`_fma_scalar`."""
    a, b, c = np.asarray(a), np.asarray(b), np.asarray(c)
    with np.errstate(all="ignore"):
        if a.dtype == b.dtype == c.dtype == np.float32:
            p = a.astype(np.float64) * b.astype(np.float64)      # exact: 48 bits
            return _round_odd_sum(p, np.broadcast_to(c.astype(np.float64), p.shape)
                                  ).astype(np.float32)
        a, b, c = (v.astype(np.float64, copy=False) for v in (a, b, c))
        uh, ul = _two_product(a, b)
        th, tl = _two_sum(c, uh)
        v = _round_odd_sum(tl, np.broadcast_to(ul, tl.shape))
        z = np.where(v == 0.0, th, th + v)   # (th + 0 would turn th = -0 into +0)
        safe = ((abs(a) < 2.0 ** 995) & (abs(b) < 2.0 ** 995) & (abs(c) < 2.0 ** 1020)
                & ((a == 0.0) | (b == 0.0) | (abs(uh) >= 2.0 ** -960)) & np.isfinite(z))
    if not safe.all():
        z = np.array(z)
        aa, bb, cc = np.broadcast_arrays(a, b, c)
        for i in zip(*np.nonzero(~safe)):
            z[i] = _fma_scalar(aa[i], bb[i], cc[i])
    return z


def _lowered(py_func, typer, *arg_types):
    """Compile calls of ``py_func`` into the caller's code (no function of their own): typed by
    ``typer(context, *argument types)`` (None: not typed), lowered by the decorated function."""
    type_callable(py_func)(lambda context: functools.partial(typer, context))
    return lower_builtin(py_func, *arg_types)


def _fma_type(context, a, b, c):
    if all(isinstance(t, (types.Float, types.Integer)) for t in (a, b, c)):
        return types.float32 if a == b == c == types.float32 else types.float64


@_lowered(_fma, _fma_type, types.Number, types.Number, types.Number)
def _fma_lower(context, builder, sig, args):
    """Compiled :func:`_fma`: the operands cast to the result type, then ``llvm.fma.f64``
    (``llvm.fma.f32``), emitted in the caller. An explicit operation, not a compiler
    contraction: every sum keeps its written order."""
    operands = [context.cast(builder, v, t, sig.return_type) for v, t in zip(args, sig.args)]
    return builder.fma(*operands)


def _select(cond, a, b):
    """``a`` where ``cond`` else ``b``: a branch for scalars (compiled, where LLVM makes it a
    select), ``np.where`` for arrays (interpreted)."""
    if np.ndim(cond) == 0:
        return a if cond else b
    return np.where(cond, a, b)


def _select_type(context, cond, a, b):
    if isinstance(cond, (types.Boolean, types.Number)) and all(
            isinstance(t, types.Number) for t in (a, b)):
        return context.unify_pairs(a, b)   # numbers only (as the lowering)


@_lowered(_select, _select_type, types.Any, types.Number, types.Number)
def _select_lower(context, builder, sig, args):
    """Compiled :func:`_select`: an LLVM ``select`` of the values cast to the result type."""
    cond = context.is_true(builder, sig.args[0], args[0])
    a, b = (context.cast(builder, v, t, sig.return_type) for v, t in zip(args[1:], sig.args[1:]))
    return builder.select(cond, a, b)


# Vector width


def _wide():
    """Ask for 512-bit vectors in the compiled kernel that calls it (a no-op when interpreted):
    LLVM vectorizes 256 bits wide on AVX-512 targets unless the function is marked
    ``"prefer-vector-width"="512"``. Results never depend on it (no fastmath)."""


@_lowered(_wide, lambda context: types.none)
def _wide_lower(context, builder, sig, args):
    """Compiled :func:`_wide`: adds the attribute to the calling function (verbatim through
    the set's own ``add``: llvmlite's check knows no key-value attributes; should a later
    llvmlite store attributes otherwise, nothing is added)."""
    attributes = builder.function.attributes
    if isinstance(attributes, set):
        set.add(attributes, '"prefer-vector-width"="512"')
    return context.get_dummy_value()


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

# tanh

def _compile_exponent(py_func, nb_float, ll_float, int_bits, bias, mantissa_bits):
    """Compile ``py_func(k)`` (``k`` of type ``nb_float``, integer-valued) as ``2.0 ** k``: the
    float whose exponent field is ``k + bias`` and whose mantissa is zero (an integer shift and
    a bit cast, emitted in the caller, which LLVM vectorizes; ``math.ldexp`` is a scalar
    library call)."""
    @_lowered(py_func, lambda context, k: nb_float if isinstance(k, types.Float) else None,
              types.Number)
    def exponent_lower(context, builder, sig, args):
        int_type = llvm_ir.IntType(int_bits)
        k_int = builder.fptosi(context.cast(builder, args[0], sig.args[0], nb_float), int_type)
        bits = builder.shl(builder.add(k_int, llvm_ir.Constant(int_type, bias)),
                           llvm_ir.Constant(int_type, mantissa_bits))
        return builder.bitcast(bits, ll_float)


def _pow2(k, one=1.0):
    """``one * 2.0 ** k`` for an integer-valued float ``k`` in [-1022, 1023] (``one`` = 1.0 of
    the result's dtype), exactly; elementwise for an array (a non-finite ``k``: a NaN or any
    power, whose product with the NaN beside it is NaN either way)."""
    if np.ndim(k) == 0:
        return type(one)(math.ldexp(1.0, int(k))) if math.isfinite(k) else k
    return np.ldexp(one, np.where(np.isfinite(k), k, 0.0).astype(np.int64))


_compile_exponent(_pow2, types.float64, llvm_ir.DoubleType(), 64, 1023, 52)  # compiled: k only


def _pow2_f32(k):
    """``2.0 ** k`` as float32 for an integer-valued float32 ``k`` in [-126, 127], exactly
    (elementwise for an array, as :func:`_pow2`)."""
    return _pow2(k, _ONE)


_compile_exponent(_pow2_f32, types.float32, llvm_ir.FloatType(), 32, 127, 23)


def _tanh_of(t, clamp, ln2_hi, ln2_lo, inv_ln2, round_, expm1_terms, pow2):
    """A compiled tanh in the arithmetic of the float type ``t`` from basic IEEE operations
    only, so that loops calling it vectorize; ``x`` may also be a NumPy array of ``t``
    (interpreted: the same operations elementwise).

    With ``a = min(|x|, clamp)`` (``tanh(clamp)`` rounds to 1) and ``e(y) = exp(y) - 1``::

        a > 0.55:  tanh(a) = 1 - 2 / (e(2a) + 2)        a <= 0.55:  tanh(a) = -e(-2a) / (e(-2a) + 2)

    and ``tanh(x) = sign(x) tanh(a)``. ``e(y)`` by the classic reduction (as fdlibm's expm1):
    ``y = k ln2 + r`` with ``k = round(y / ln2)`` (``(y / ln2 + round_) - round_``), ``|r| <=
    ln2 / 2``, ``k ln2`` subtracted in two parts ``ln2_hi + ln2_lo`` (Cody & Waite); ``e(r) = r
    + r^2 (1/2! + r (1/3! + ... r / n!))`` by Horner, ``n = expm1_terms + 1``; ``e(y) = 2^k e(r)
    + (2^k - 1)`` (``pow2``: ``2^k`` exactly). Never above 1 in magnitude; +-inf give +-1, NaN
    gives NaN."""
    clamp, cut, zero, one, two = t(clamp), t(0.55), t(0.0), t(1.0), t(2.0)
    ln2_hi, ln2_lo, inv_ln2, round_ = t(ln2_hi), t(ln2_lo), t(inv_ln2), t(round_)
    coefficients = tuple(t(1.0 / math.factorial(i)) for i in range(expm1_terms + 1, 1, -1))
    first, rest = coefficients[0], coefficients[1:]

    def tanh(x):
        a = np.minimum(abs(x), clamp)
        big = a > cut
        y = _select(big, two * a, -two * a)
        k = (y * inv_ln2 + round_) - round_
        r = (y - k * ln2_hi) - k * ln2_lo
        p = first
        for c in rest:
            p = _fma(p, r, c)
        em = _fma(r * r, p, r)
        s = pow2(k)
        e = _fma(s, em, s - one)
        # np.divide: numba's "/" checks for a zero divisor (Python semantics), which stops
        # vectorization; the divisor here is >= 1. One division serves both branches.
        q = np.divide(_select(big, two, -e), e + two)
        v = _select(big, one - q, q)
        return _select(x >= zero, v, -v)
    return njit(tanh)


# float64: e(r) to r^13 / 13! (truncation < 2e-17 relative), within 3 units in the last place
# of NumPy's np.tanh; ln 2 split at 32 significant bits (k * ln2_hi exact for |k| < 2^20).
_tanh = _tanh_of(np.float64, 20.0, 6.93147180369123816490e-01, 1.90821492927058770002e-10,
                 1.44269504088896338700e+00, 6755399441055744.0, 12, _pow2)   # 1.5 * 2^52
# float32: e(r) to r^8 / 8! (truncation < 2e-8 relative), within 4 float32 units in the last
# place of np.tanh in float64; fdlibm's expf split of ln 2 (17 bits: exact for |k| < 2^7).
_tanh_f32 = _tanh_of(np.float32, 10.0, 6.9313812256e-01, 9.0580006145e-06, 1.4426950216e+00,
                     12582912.0, 7, _pow2_f32)                                # 1.5 * 2^23


def _tanh_any(x):
    """``tanh`` in the arithmetic of ``x``: :func:`_tanh_f32` for float32, else :func:`_tanh`
    (a scalar, or interpreted a NumPy array)."""
    return _tanh_f32(x) if np.asarray(x).dtype == np.float32 else _tanh(x)


@overload(_tanh_any)
def _tanh_any_compiled(x):
    if x == types.float32:
        return lambda x: _tanh_f32(x)
    return lambda x: _tanh(x)


# Products

# Register blocks of _add_products: R rows x V vectors of the target's width (8 float64 or 16
# float32 lanes with AVX-512, 4 or 8 with AVX2), the accumulators in registers for the whole k
# loop. Blocks of two vectors by _ROWS rows (AVX-512: 16 accumulators of its 32 registers;
# AVX2: 6 rows, 12 of 16), then _HALF_ROWS, then one; a block of one vector beside them where
# the width leaves one. With AVX-512, a call of at least _WIDE_MIN_ROWS rows whose width is a
# multiple of four vectors runs blocks of _WIDE_ROWS rows by four vectors first (24
# accumulators: each weight vector loaded serves 6 rows, each broadcast 4 vectors).
if _VECTOR_BITS >= 512:
    _ROWS, _WIDE_ROWS, _WIDE_MIN_ROWS = 8, 6, 24
else:
    _ROWS, _WIDE_ROWS, _WIDE_MIN_ROWS = 6, 6, 2 ** 62   # (never wide)
_HALF_ROWS = _ROWS // 2


def _lanes(dtype) -> int:
    """Lanes of one vector register for ``dtype`` (a NumPy or numba float type)."""
    return _VECTOR_BITS // (32 if dtype in (np.float32, types.float32) else 64)


def _vector_lanes(a):
    """Lanes of one vector register for the dtype of the array ``a`` (compiled: a constant)."""
    return _lanes(a.dtype)


@_lowered(_vector_lanes, lambda context, a: types.intp if isinstance(a, types.Array) else None,
          types.Array)
def _vector_lanes_lower(context, builder, sig, args):
    """Compiled :func:`_vector_lanes`: the constant."""
    return context.get_constant(types.intp, _lanes(sig.args[0].dtype))


def _block_intrinsic(rows, vectors):
    """The register block of ``rows`` rows by ``vectors`` vector registers of columns, an
    intrinsic ``(out, a, w_t, n, j0)``: the chains of :func:`_add_products` for the rows ``n ..
    n + rows - 1`` and the ``vectors * lanes`` columns from ``j0``, the accumulators in vector
    registers for the whole k loop (per k: each weight vector loaded once, ``a[m, k]``
    broadcast, one ``llvm.fma`` per accumulator). Operands as :func:`_add_products`."""
    def block(typingctx, out, a, w_t, n, j0):
        if not (all(isinstance(t, types.Array) and t.ndim == 2 and t.dtype == out.dtype
                    for t in (out, a, w_t)) and out.layout == w_t.layout == "C"
                and out.dtype in (types.float32, types.float64)):
            raise NumbaTypingError("_add_products takes 2-D float64 or float32 arrays of one "
                                   f"dtype, out and w_t C-contiguous, got {out}, {a}, {w_t}")
        is_f32 = out.dtype == types.float32

        def codegen(context, builder, signature, args):
            out_arr, a_arr, w_arr = [context.make_array(ty)(context, builder, v)
                                     for ty, v in zip(signature.args[:3], args[:3])]
            out_ty, a_ty, w_ty = signature.args[:3]
            intp = context.get_value_type(types.intp)
            n_ = context.cast(builder, args[3], signature.args[3], types.intp)
            j_ = context.cast(builder, args[4], signature.args[4], types.intp)
            elem = llvm_ir.FloatType() if is_f32 else llvm_ir.DoubleType()
            lanes = _lanes(out_ty.dtype)
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
            for r in range(rows):
                for v in range(vectors):
                    ptr = builder.bitcast(pointer(out_arr, out_ty, builder.add(n_, const(r)),
                                                  builder.add(j_, const(lanes * v))), vec_ptr)
                    slot = cgutils.alloca_once(builder, vec)
                    builder.store(builder.load(ptr, align=item), slot)
                    slots.append((slot, ptr))
            n_k = cgutils.unpack_tuple(builder, a_arr.shape)[1]
            with cgutils.for_range(builder, n_k) as loop:
                k = loop.index
                w_vecs = [builder.load(builder.bitcast(
                    pointer(w_arr, w_ty, k, builder.add(j_, const(lanes * v))), vec_ptr),
                    align=item) for v in range(vectors)]
                for r in range(rows):
                    a_k = builder.load(pointer(a_arr, a_ty, builder.add(n_, const(r)), k))
                    a_vec = builder.shuffle_vector(builder.insert_element(undef, a_k, lane0),
                                                   undef, splat)
                    for v in range(vectors):
                        slot = slots[r * vectors + v][0]
                        builder.store(builder.call(fma, [a_vec, w_vecs[v], builder.load(slot)]),
                                      slot)
            for slot, ptr in slots:
                builder.store(builder.load(slot), ptr, align=item)
            return context.get_dummy_value()
        return types.none(out, a, w_t, n, j0), codegen
    block.__name__ = block.__qualname__ = f"_block_{rows}x{vectors}"
    return intrinsic(block)


_WIDE_BLOCK = _block_intrinsic(_WIDE_ROWS, 4)
_FULL2, _HALF2, _ONE2 = (_block_intrinsic(rows, 2) for rows in (_ROWS, _HALF_ROWS, 1))
_FULL1, _HALF1, _ONE1 = (_block_intrinsic(rows, 1) for rows in (_ROWS, _HALF_ROWS, 1))


def _add_products(out, a, w_t):
    """``out[n, j] += sum_k a[n, k] * w_t[k, j]``: every element the chain ``fma(a[n, K-1],
    w_t[K-1, j], ... fma(a[n, 0], w_t[0, j], out[n, j]))``, k in increasing order.

    ``out [M, J]``, ``a [M, K]``, ``w_t [K, J]``: one dtype, float64 or float32, ``out`` and
    ``w_t`` C-contiguous, ``a`` of any strides (callers pass :func:`_strided` views: one
    compiled version per dtype); other operands are a ``TypingError`` when compiled.
    Compiled: :func:`_add_products_compiled`; interpreted: one whole-array FMA per k.
    """
    for k in range(a.shape[1]):
        out[...] = _fma(a[:, k:k + 1], w_t[k:k + 1, :], out)


def _add_products_compiled(out, a, w_t):
    """Compiled :func:`_add_products`: the register blocks (the comment above them), then the
    columns right of the last vector (a value head, a policy head of a few actions) eight rows'
    chains at a time. An element's chain is the same whichever of them computes it."""
    lanes = _vector_lanes(out)
    pair, wide = 2 * lanes, 4 * lanes
    n_rows, n_k = a.shape
    n_j = w_t.shape[1]
    n = 0
    if n_rows >= _WIDE_MIN_ROWS and n_j % wide == 0:
        while n + _WIDE_ROWS <= n_rows:
            for j0 in range(0, n_j, wide):
                _WIDE_BLOCK(out, a, w_t, n, j0)
            n += _WIDE_ROWS
    j_pairs = n_j - n_j % pair        # columns in blocks of two vectors
    j_vectors = n_j - n_j % lanes     # and in one block of one vector
    while n < n_rows:
        if n_rows - n >= _ROWS:
            for j0 in range(0, j_pairs, pair):
                _FULL2(out, a, w_t, n, j0)
            if j_vectors > j_pairs:
                _FULL1(out, a, w_t, n, j_pairs)
            n += _ROWS
        elif n_rows - n >= _HALF_ROWS:
            for j0 in range(0, j_pairs, pair):
                _HALF2(out, a, w_t, n, j0)
            if j_vectors > j_pairs:
                _HALF1(out, a, w_t, n, j_pairs)
            n += _HALF_ROWS
        else:
            for j0 in range(0, j_pairs, pair):
                _ONE2(out, a, w_t, n, j0)
            if j_vectors > j_pairs:
                _ONE1(out, a, w_t, n, j_pairs)
            n += 1
    n8 = n_rows - n_rows % 8
    for j in range(j_vectors, n_j):   # the last columns: eight rows' chains at a time
        for m in range(0, n8, 8):
            o0, o1, o2, o3 = out[m, j], out[m + 1, j], out[m + 2, j], out[m + 3, j]
            o4, o5, o6, o7 = out[m + 4, j], out[m + 5, j], out[m + 6, j], out[m + 7, j]
            for k in range(n_k):
                w = w_t[k, j]
                o0 = _fma(a[m, k], w, o0)
                o1 = _fma(a[m + 1, k], w, o1)
                o2 = _fma(a[m + 2, k], w, o2)
                o3 = _fma(a[m + 3, k], w, o3)
                o4 = _fma(a[m + 4, k], w, o4)
                o5 = _fma(a[m + 5, k], w, o5)
                o6 = _fma(a[m + 6, k], w, o6)
                o7 = _fma(a[m + 7, k], w, o7)
            out[m, j], out[m + 1, j], out[m + 2, j], out[m + 3, j] = o0, o1, o2, o3
            out[m + 4, j], out[m + 5, j], out[m + 6, j], out[m + 7, j] = o4, o5, o6, o7
        for m in range(n8, n_rows):
            o = out[m, j]
            for k in range(n_k):
                o = _fma(a[m, k], w_t[k, j], o)
            out[m, j] = o


if not _numba_config.DISABLE_JIT:
    _add_products = njit(_add_products_compiled)


def _strided(a):
    """``a`` (2-D) typed of any strides (layout ``"A"``; compiled: the same array retyped), so
    that every product passes :func:`_add_products` the same operand types: one compiled
    version per dtype serves row-major operands and transposed views alike (its first operand
    is read as scalars, whatever its strides)."""
    return a[:, 0:a.shape[1]]


def _strided_type(context, a):
    if isinstance(a, types.Array) and a.ndim == 2:
        return a.copy(layout="A")


@_lowered(_strided, _strided_type, types.Array)
def _strided_lower(context, builder, sig, args):
    return impl_ret_borrowed(context, builder, sig.return_type, args[0])


@njit
def _all_finite(a):
    """True if every entry of the 1-D array ``a`` is finite (a count of comparisons, which
    vectorizes; callers pass ``.reshape(-1)`` views, so one compiled version per dtype)."""
    n_finite = 0
    for i in range(a.size):
        n_finite += abs(a[i]) < _INF
    return n_finite == a.size


_INF = np.float32(np.inf)   # abs(v) < inf is False exactly for inf and NaN (in either dtype)


@njit
def _transpose_into(a, a_t):
    """``a_t[j, n] = a[n, j]`` for the rows and columns of ``a`` (2-D; a copy, no
    arithmetic), eight rows of ``a`` at a time (a cache line of ``a_t`` per column)."""
    rows, cols = a.shape
    for n0 in range(0, rows, 8):
        for j in range(cols):
            for n in range(n0, min(n0 + 8, rows)):
                a_t[j, n] = a[n, j]


# Arrays reused across calls

# A twin's pass takes its arrays as one bundle from a per-thread pool (freshly allocated arrays
# that large are faulted in page by page at every call: docs/BENCHMARKS.md). A bundle is handed
# out again only when none of its arrays, nor the owner of one that is a view, is referenced
# outside the pool (CPython's counts): results a caller still holds are never overwritten. At
# most _BUNDLES_PER_KEY bundles per key and _KEYS keys (the least recently used dropped).
_BUNDLES_PER_KEY = 4
_KEYS = 16
_pools = threading.local()


def _free_refcounts():
    """``sys.getrefcount`` of a view held only by a bundle and of its owner held only by it,
    as :func:`_free` calls it."""
    for a in (np.empty(8)[:4],):
        return sys.getrefcount(a), sys.getrefcount(a.base)


_FREE, _FREE_OWNER = _free_refcounts()


def _free(bundle) -> bool:
    """Whether no array of ``bundle`` (nor the owner of one that is a view) is referenced
    outside the pool."""
    for a in bundle:
        if sys.getrefcount(a) > _FREE or (a.base is not None
                                          and sys.getrefcount(a.base) > _FREE_OWNER):
            return False
    return True


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
        if _free(bundle):
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
