"""Parameter dicts backed by one contiguous buffer (a speed layout; the dict API is unchanged).

``ppo_ref`` passes parameters, gradients and Adam moments around as ``{name: ndarray}``
dicts. A :class:`FlatArrays` *is* such a dict (a ``dict`` subclass: every function that takes
a dict takes it), whose values are views into one 1-D buffer ``flat``. Functions that see one
can work on the whole buffer in a single pass instead of one pass per array:

* the fast update's step (:func:`ppo_ref.fast.optim.clipped_adam_step`) computes the global norm
  and runs one fused, in-place clipped-Adam kernel over ``flat`` (the spec's Adam element
  arithmetic, see :mod:`ppo_ref.spec.optim`);
* the MLP policy (:mod:`ppo_ref.train.policies`) lays the two towers' first layers side by side, so
  ``pi.w0`` and ``vf.w0`` form one ``[2H, obs_dim]`` matrix and the first layer of both towers
  is one matrix product; its backward writes gradients straight into a new buffer.

The *layout* (:class:`FlatLayout`) lists, in the dict's key order, each key's offset and shape
in the buffer; offsets need not follow key order (that is how adjacent first layers are made).
Two ``FlatArrays`` are compatible when their layouts are equal. The fast paths check that the
dict still holds exactly the views it was built with (:meth:`FlatArrays.intact`): replacing an
entry (``d[k] = other``) turns a ``FlatArrays`` back into an ordinary dict for these
functions (the fast update then raises ``ValueError``; the policies take their general
per-array path). Writing *into* a view
(``d[k][...] = x``) writes the buffer, as for any view.
"""
from __future__ import annotations

import operator
from typing import Iterable, Mapping, Optional, Sequence, Tuple

import numpy as np

__all__ = ["FlatLayout", "FlatArrays", "flatten_arrays", "is_flat", "same_layout"]


class FlatLayout:
    """Where each key lives in a flat buffer: ``entries = ((key, offset, shape), ...)`` in the
    dict's key order, ``size`` the buffer length, ``keys`` the keys in that order. Immutable;
    compared by value."""

    __slots__ = ("entries", "size", "_key", "_hash", "slices", "keys", "_views_spec")

    def __init__(self, entries: Sequence[Tuple[str, int, Tuple[int, ...]]], size: int):
        self.entries = tuple((str(k), int(o), tuple(int(s) for s in shape))
                             for k, o, shape in entries)
        self.size = int(size)
        covered = np.zeros(self.size, dtype=np.int8)
        for k, o, shape in self.entries:
            n = int(np.prod(shape, dtype=np.int64))
            if o < 0 or o + n > self.size:
                raise ValueError(f"layout entry {k!r} [{o}, {o + n}) lies outside the buffer "
                                 f"of size {self.size}")
            covered[o:o + n] += 1
        if (covered != 1).any():
            raise ValueError("layout entries must tile the buffer exactly once")
        self._key = (self.entries, self.size)
        self._hash = hash(self._key)  # computed once: layouts key per-layout caches
        self.slices = tuple((k, o, o + int(np.prod(shape, dtype=np.int64)), shape)
                            for k, o, shape in self.entries)
        # (start, stop, shape or None): None where the slice already has the shape (1-D)
        self._views_spec = tuple((o, stop, None if len(shape) == 1 else shape)
                                 for _, o, stop, shape in self.slices)
        self.keys = tuple(k for k, _, _ in self.entries)

    @classmethod
    def in_order(cls, shapes: Iterable[Tuple[str, Tuple[int, ...]]],
                 order: Optional[Sequence[str]] = None) -> "FlatLayout":
        """Layout of ``shapes`` (``(key, shape)`` pairs, the dict's key order) with the keys
        stored in ``order`` (default: the same order) one after the other."""
        shapes = [(k, tuple(s)) for k, s in shapes]
        by_key = dict(shapes)
        order = [k for k, _ in shapes] if order is None else list(order)
        if sorted(order) != sorted(by_key):
            raise ValueError(f"order {order} must hold exactly the keys {sorted(by_key)}")
        offsets = {}
        pos = 0
        for k in order:
            offsets[k] = pos
            pos += int(np.prod(by_key[k], dtype=np.int64))
        return cls([(k, offsets[k], s) for k, s in shapes], pos)

    def offset(self, key: str) -> int:
        for k, o, _ in self.entries:
            if k == key:
                return o
        raise KeyError(key)

    def __eq__(self, other) -> bool:
        return self is other or (isinstance(other, FlatLayout) and self._key == other._key)

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):  # rebuilt on unpickling: the string hash differs between processes
        return (FlatLayout, (self.entries, self.size))

    def __repr__(self) -> str:
        return f"FlatLayout({list(self.entries)}, size={self.size})"


class FlatArrays(dict):
    """A ``{name: ndarray}`` dict whose values are views into the 1-D buffer ``flat``.

    Build with :meth:`from_buffer` or :func:`flatten_arrays`. ``layout`` is its
    :class:`FlatLayout`. Pickles and copies as a plain dict would (``dict(d)`` is a plain dict
    of the same views).
    """

    __slots__ = ("flat", "layout", "_views")

    @classmethod
    def from_buffer(cls, flat: np.ndarray, layout: FlatLayout) -> "FlatArrays":
        """Views of ``flat`` (1-D, C-contiguous, length ``layout.size``) per ``layout``."""
        if flat.ndim != 1 or flat.shape[0] != layout.size or not flat.flags.c_contiguous:
            raise ValueError(f"flat must be a contiguous 1-D array of length {layout.size}, "
                             f"got shape {flat.shape}")
        self = cls()
        views = tuple([flat[o:stop] if shape is None else flat[o:stop].reshape(shape)
                       for o, stop, shape in layout._views_spec])
        dict.update(self, zip(layout.keys, views))
        self.flat = flat
        self.layout = layout
        self._views = views
        return self

    def intact(self) -> bool:
        """True while the dict holds exactly the views it was built with."""
        views = self._views
        if len(self) != len(views):
            return False
        return all(map(operator.is_, self.values(), views))

    def empty_like(self) -> "FlatArrays":
        """A new ``FlatArrays`` of the same layout and dtype (uninitialised values)."""
        return FlatArrays.from_buffer(np.empty_like(self.flat), self.layout)

    def __reduce__(self):  # pickle as a plain dict (the views would be copied apart anyway)
        return (dict, (dict(self),))


def is_flat(arrays) -> bool:
    """True if ``arrays`` is an intact :class:`FlatArrays`."""
    return type(arrays) is FlatArrays and arrays.intact()


def same_layout(*arrays) -> bool:
    """True if every argument is an intact :class:`FlatArrays` with one layout and dtype."""
    first = arrays[0]
    if not is_flat(first):
        return False
    for a in arrays[1:]:
        if not (is_flat(a) and a.layout == first.layout and a.flat.dtype == first.flat.dtype):
            return False
    return True


def flatten_arrays(arrays: Mapping[str, np.ndarray], layout: Optional[FlatLayout] = None,
                   dtype=None) -> FlatArrays:
    """A :class:`FlatArrays` holding copies of ``arrays`` (same keys, key order and values).

    ``layout`` (default: keys stored in key order) must list exactly the keys and shapes of
    ``arrays``. ``dtype`` defaults to the arrays' common dtype (float64 if they differ).
    Raises ``ValueError`` on a key or shape mismatch.
    """
    items = [(k, np.asarray(v)) for k, v in arrays.items()]
    if layout is None:
        layout = FlatLayout.in_order([(k, v.shape) for k, v in items])
    want = {k: shape for k, _, shape in layout.entries}
    if [k for k, _, _ in layout.entries] != [k for k, _ in items]:
        raise ValueError(f"layout keys {[k for k, _, _ in layout.entries]} differ from the "
                         f"arrays' keys {[k for k, _ in items]} (or their order)")
    for k, v in items:
        if v.shape != want[k]:
            raise ValueError(f"arrays[{k!r}] has shape {v.shape}, the layout says {want[k]}")
    if dtype is None:
        dtypes = {v.dtype for _, v in items}
        dtype = dtypes.pop() if len(dtypes) == 1 else np.float64
    out = FlatArrays.from_buffer(np.empty(layout.size, dtype=dtype), layout)
    for k, v in items:
        out[k][...] = v
    return out
