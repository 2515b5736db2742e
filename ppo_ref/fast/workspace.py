"""Scratch arrays reused across calls of the hot paths, when nobody holds them any more.

Why: a minibatch step of the recurrent trainer makes a few MB of fresh arrays (the LSTM
activations, ``dz``, gradients). glibc's ``malloc`` serves arrays that large from ``mmap`` or
from the top of the heap, and gives the memory back to the kernel when they are freed
(``M_MMAP_THRESHOLD`` / ``M_TRIM_THRESHOLD``); the next step's arrays are then faulted in and
zeroed page by page again. Reusing the arrays avoids those page faults without touching the
process's allocator settings (the measurements: ``docs/fast_tier_notes.md``).

Safety rule: an array is handed out again only when no reference to it (or to a view of it:
a view holds its base) exists outside the pool, as counted by ``sys.getrefcount`` (CPython).
So results a caller keeps (e.g. the cache of ``evaluate`` still alive while another
``evaluate`` runs) are never overwritten: that call gets another array. Pools are per thread
(the actor-learner's thread backend runs replays concurrently) and hold at most
:data:`MAX_PER_KEY` arrays per (name, shape, dtype); beyond that, plain fresh arrays.
Contents of a handed-out array are undefined (like ``np.empty``).

Alignment: every array of :func:`empty` and :func:`aligned` with at least one element starts
at a multiple of :data:`ALIGN` bytes (a cache line, one AVX-512 vector; NumPy only promises 16), so that the
vector loads of the compiled passes from rows of a power-of-two length never straddle two
cache lines (a view of a byte buffer; the pools hold the byte buffers).
"""
from __future__ import annotations

import sys
import threading
from typing import Dict, List, Tuple

import numpy as np

__all__ = ["empty", "aligned", "MAX_PER_KEY", "ALIGN"]

MAX_PER_KEY = 4
ALIGN = 64

_local = threading.local()

def _refs(pool: List[np.ndarray], i: int) -> int:
    """References to ``pool[i]``, counted as CPython counts them (the list's own, plus the
    temporary of this call's argument)."""
    return sys.getrefcount(pool[i])


# the count of a pooled array nobody else holds, measured once the same way (so it is right
# whatever this interpreter version counts for the temporaries)
_FREE_REFCOUNT = _refs([np.empty(0)], 0)


def _aligned_view(buf: np.ndarray, shape: Tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The C-contiguous ``shape``/``dtype`` array inside the byte buffer ``buf`` (``ALIGN``
    bytes longer than it) that starts at a multiple of :data:`ALIGN` bytes."""
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    start = -buf.ctypes.data % ALIGN
    return buf[start:start + size].view(dtype).reshape(shape)


def aligned(shape, dtype=np.float64, zeros: bool = False) -> np.ndarray:
    """A fresh array like ``np.empty(shape, dtype)`` (``np.zeros`` with ``zeros``), C order,
    starting at a multiple of :data:`ALIGN` bytes (module docstring); not pooled."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize + ALIGN
    return _aligned_view((np.zeros if zeros else np.empty)(nbytes, np.uint8), shape, dtype)


def empty(name: str, shape: Tuple[int, ...], dtype) -> np.ndarray:
    """An array like ``np.empty(shape, dtype)`` (C order, starting at a multiple of
    :data:`ALIGN` bytes), from this thread's pool ``name`` when one of that shape and dtype is
    free (see the module docstring), else a fresh one (kept in the pool while it has room)."""
    pools: Dict[tuple, List[np.ndarray]] = getattr(_local, "pools", None)
    if pools is None:
        pools = _local.pools = {}
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    key = (name, shape, dtype)
    pool = pools.get(key)
    if pool is None:
        pool = pools[key] = []
    for i in range(len(pool)):
        if _refs(pool, i) == _FREE_REFCOUNT:
            return _aligned_view(pool[i], shape, dtype)
    buf = np.empty(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize + ALIGN, np.uint8)
    if len(pool) < MAX_PER_KEY:
        pool.append(buf)
    return _aligned_view(buf, shape, dtype)
