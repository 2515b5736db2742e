"""Numba options and the compiled-code cache, in one place.

Every compiled kernel in ``ppo_ref`` is made by :func:`njit` (``@njit``, or ``njit(f)`` of a
plain function from any module) with :data:`NJIT_OPTIONS`: ``nogil=True`` (the thread backend
can overlap kernel work with Python work) and ``fastmath=False`` (no reassociated float sums, so
results match the oracles and ``.py_func`` bit for bit where the operation order is the same).
``NUMBA_DISABLE_JIT=1`` runs every kernel as plain Python.

Cache guarantee: compiled machine code is reused by a later process only if the function's own
file and every ``.py`` file under ``ppo_ref/`` are byte for byte what they were when it was
compiled (:func:`package_sources_hash`). A kernel embeds the compiled functions it calls and the
globals it reads, from whichever file, so any edit to any package source (whatever its size or
modification time) makes every cached kernel recompile, and stale code is never run. Entries
live in ``NUMBA_CACHE_DIR`` if set, else in ``__pycache__`` beside the function's file, else in
numba's user-wide cache directory; with none writable each process compiles afresh (no error).
Other packages' numba functions are untouched.

Threads: a kernel compiled with ``njit(parallel=True)`` runs its ``numba.prange`` loops on
numba's threads (``numba.get_num_threads()``: by default one per CPU, ``NUMBA_NUM_THREADS``;
``numba.set_num_threads`` sets it for the calling Python thread only; the trainers set it for
each iteration, to their ``threads``, default 1). Only a loop whose iterations write disjoint
arrays and read nothing another iteration writes may be a ``prange`` loop, so that every result
is the plain loop's, bit for bit, whatever the number of threads (no kernel of the compiled tier
has one at present). Such kernels would be called from several Python threads at once (the
actor-learner's thread backend, two trainers in one process), which only
numba's TBB and OpenMP threading layers allow (its fallback layer, ``workqueue``, ends the
process). So :data:`PARALLEL_LOOPS` is whether numba runs on one of those two (as numba selects
its layer: OpenMP needs ``libgomp``, present on most Linux systems); without one,
``njit(parallel=True)`` compiles the plain loop (the same results, on one thread). The choice
is part of the cache stamp, and the plain builds are cached in a ``plain`` subdirectory.
GNU OpenMP cannot run a parallel loop in a child made by ``fork`` after the parent ran one (the
child is terminated: "fork() called from a process already using GNU OpenMP"): start such
children with ``spawn``/``forkserver`` (as the actor-learner does), or set
``NUMBA_THREADING_LAYER=workqueue`` (plain loops).
"""
from __future__ import annotations

import functools
import hashlib
import os

import numba
from numba.core import caching, config
from numba.core.dispatcher import Dispatcher
from numba.misc.appdirs import AppDirs
from numba.np.ufunc import parallel as numba_parallel

NJIT_OPTIONS = {"nogil": True, "fastmath": False}
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

def _threadsafe_layer() -> bool:
    """Whether numba's threading layer is TBB or OpenMP, as numba itself selects it (its
    ``NUMBA_THREADING_LAYER``, ``NUMBA_THREADING_LAYER_PRIORITY`` and which layers' libraries
    load): the layer is started here, as numba's first parallel loop would start it. False when
    it is ``workqueue``, or when the requested layer does not load (numba would raise then)."""
    try:
        numba_parallel._launch_threads()
    except ValueError:
        return False
    return numba.threading_layer() in ("tbb", "omp")


#: Whether ``njit(parallel=True)`` compiles parallel loops (module docstring, "Threads").
PARALLEL_LOOPS = _threadsafe_layer()


@functools.cache
def package_sources_hash() -> str:
    """SHA-256 over the relative path and the bytes of every ``.py`` file under ``ppo_ref/``
    (computed once per process)."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(PACKAGE_DIR):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                content = f.read()
            relative = os.path.relpath(path, PACKAGE_DIR).replace(os.sep, "/")
            digest.update(relative.encode() + b"\0" + hashlib.sha256(content).digest())
    return digest.hexdigest()


class PackageCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """Numba cache locator whose freshness stamp is (the function's own file, every package
    source): an entry written before any edit to the package is never loaded."""

    def __init__(self, py_func, py_file, cache_path):
        self._py_file, self._cache_path = py_file, cache_path
        self._lineno = py_func.__code__.co_firstlineno

    def get_cache_path(self):
        return self._cache_path

    def get_source_stamp(self):
        return super().get_source_stamp(), package_sources_hash(), PARALLEL_LOOPS

    @classmethod
    def from_function(cls, py_func, py_file):
        if not os.path.isfile(py_file):
            return None
        subpath = cls.get_suitable_cache_subpath(py_file)
        user_wide = AppDirs(appname="numba", appauthor=False).user_cache_dir
        candidates = [os.path.join(config.CACHE_DIR, subpath)] if config.CACHE_DIR else []
        candidates += [os.path.join(os.path.dirname(py_file), "__pycache__"),
                       os.path.join(user_wide, subpath)]
        if not PARALLEL_LOOPS:   # the plain-loop builds apart: both kinds stay cached
            candidates = [os.path.join(path, "plain") for path in candidates]
        for path in candidates:
            locator = cls(py_func, py_file, path)
            try:
                locator.ensure_cache_path()
            except OSError:
                continue
            return locator
        return None


class _PackageCacheImpl(caching.CompileResultCacheImpl):
    _locator_classes = [PackageCacheLocator]


class PackageFunctionCache(caching.FunctionCache):
    """numba's per-function cache with :class:`PackageCacheLocator` as its only locator."""
    _impl_class = _PackageCacheImpl


def _package_cache(py_func) -> caching._Cache:
    try:
        cache = PackageFunctionCache(py_func)
    except RuntimeError:  # no writable cache directory
        return caching.NullCache()
    # NUMBA_CACHE_LOCATOR_CLASSES may impose a locator without the package stamp: no cache then.
    return cache if isinstance(cache._impl.locator, PackageCacheLocator) else caching.NullCache()


def njit(py_func=None, *, parallel: bool = False):
    """Compile ``py_func`` (a function from any module) with :data:`NJIT_OPTIONS` and the
    package-keyed cache; under ``NUMBA_DISABLE_JIT=1`` return ``py_func`` itself.

    ``parallel=True`` (as ``@njit(parallel=True)``) compiles with numba's ``parallel`` option
    when :data:`PARALLEL_LOOPS`: the function's ``numba.prange`` loops run their iterations on
    numba's threads (module docstring, "Threads"); otherwise ``prange`` is a plain loop."""
    if py_func is None:
        return functools.partial(njit, parallel=parallel)
    options = dict(NJIT_OPTIONS, parallel=True) if parallel and PARALLEL_LOOPS else NJIT_OPTIONS
    dispatcher = numba.njit(**options)(py_func)
    if isinstance(dispatcher, Dispatcher):
        dispatcher._cache = _package_cache(dispatcher.py_func)
    return dispatcher
