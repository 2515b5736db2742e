"""Numba options and the compiled-code cache, in one place (design: docs/fast_tier_notes.md).

:func:`njit` compiles with :data:`NJIT_OPTIONS`: ``nogil=True`` and ``fastmath=False`` (no
reassociated float sums: results equal ``.py_func``'s bit for bit where the operation order is
the same); ``NUMBA_DISABLE_JIT=1`` runs every kernel as plain Python.

Cache: an entry is loaded only if its function's file and every ``.py`` file under ``ppo_ref/``
are byte for byte unchanged (:class:`PackageCacheLocator`: a kernel embeds the functions it
calls and the globals it reads, from any file). Entries live in ``NUMBA_CACHE_DIR`` if set,
else in :data:`USER_CACHE_DIR`, else in ``__pycache__`` beside the file (none writable: each
process compiles afresh), under ``ppo_ref-<sources hash>/`` and the file's path in the package,
so another install of the same sources loads them (numba's index also keys the CPU and the
Python and numba versions); the :data:`KEPT_VERSIONS` newest such directories are kept. Other
packages' numba functions are untouched. :func:`announce_compiling` says on stderr when
compiling takes long.

Threads: ``njit(parallel=True)`` compiles ``numba.prange`` loops as parallel loops only when
:data:`PARALLEL_LOOPS` (numba's threading layer is TBB or OpenMP, which allow calls from
several Python threads; ``workqueue`` ends the process), else as the plain loop, cached apart in
a ``plain`` subdirectory. A ``prange`` loop may only write disjoint arrays and read nothing
another iteration writes, so results are the plain loop's bits for any thread count. GNU
OpenMP cannot run a parallel loop in a ``fork`` child of a parent that ran one: start such
children with ``spawn``/``forkserver`` or set ``NUMBA_THREADING_LAYER=workqueue``.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import threading
import time

import numba
from numba.core import caching, config, event
from numba.core.dispatcher import Dispatcher
from numba.misc.appdirs import AppDirs
from numba.np.ufunc import parallel as numba_parallel

NJIT_OPTIONS = {"nogil": True, "fastmath": False}
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
#: The per-user cache directory (``$XDG_CACHE_HOME/ppo_ref`` or ``~/.cache/ppo_ref`` on Linux).
USER_CACHE_DIR = AppDirs(appname="ppo_ref", appauthor=False).user_cache_dir
#: Directories of compiled code of different package sources kept in a cache directory.
KEPT_VERSIONS = 8


def _threadsafe_layer() -> bool:
    """Whether the threading layer numba selects (started here, as its first parallel loop
    would) is TBB or OpenMP; False for ``workqueue`` or a requested layer that does not load."""
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


@functools.cache
def _version_directory(base: str) -> str:
    """``ppo_ref-<first 16 hex digits of the sources hash>``, the directory of this package's
    compiled code in the cache directory ``base``; when it does not exist yet, the oldest
    sibling directories beyond the :data:`KEPT_VERSIONS` - 1 newest are removed first."""
    name = "ppo_ref-" + package_sources_hash()[:16]
    if not os.path.isdir(os.path.join(base, name)):
        try:
            siblings = [e for e in os.scandir(base)
                        if e.name.startswith("ppo_ref-") and e.is_dir(follow_symlinks=False)]
        except OSError:
            siblings = []
        siblings.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime, reverse=True)
        for old in siblings[KEPT_VERSIONS - 1:]:
            shutil.rmtree(old.path, ignore_errors=True)
    return name


def _plain(path: str) -> str:
    """``path``, or its ``plain`` subdirectory without :data:`PARALLEL_LOOPS` (kept apart)."""
    return path if PARALLEL_LOOPS else os.path.join(path, "plain")


def _cache_directory(relative: str = ".") -> str:
    """The cache directory of the package directory ``relative`` (module docstring)."""
    base = config.CACHE_DIR or USER_CACHE_DIR
    return _plain(os.path.normpath(os.path.join(base, _version_directory(base), relative)))


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
        relative = os.path.relpath(os.path.dirname(os.path.abspath(py_file)), PACKAGE_DIR)
        if relative == os.pardir or relative.startswith(os.pardir + os.sep):
            subpath = cls.get_suitable_cache_subpath(py_file)   # a file outside the package
            candidates = [_plain(os.path.join(config.CACHE_DIR or USER_CACHE_DIR, subpath))]
        else:
            candidates = [_cache_directory(relative)]
        candidates.append(_plain(os.path.join(os.path.dirname(py_file), "__pycache__")))
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


def njit(py_func=None, *, parallel: bool = False, inline: str = "never"):
    """Compile ``py_func`` (a function from any module) with :data:`NJIT_OPTIONS` and the
    package-keyed cache; under ``NUMBA_DISABLE_JIT=1`` return ``py_func`` itself.

    ``parallel=True`` compiles ``numba.prange`` loops as parallel loops when
    :data:`PARALLEL_LOOPS` (module docstring, "Threads"), else as plain loops.
    ``inline="always"``: numba inlines the function's code into every compiled caller before
    typing (numba's ``inline`` option)."""
    if py_func is None:
        return functools.partial(njit, parallel=parallel, inline=inline)
    options = dict(NJIT_OPTIONS, parallel=True) if parallel and PARALLEL_LOOPS else NJIT_OPTIONS
    dispatcher = numba.njit(**options, inline=inline)(py_func)
    if isinstance(dispatcher, Dispatcher):
        dispatcher._cache = _package_cache(dispatcher.py_func)
    return dispatcher


def claim_first(name: str) -> bool:
    """Whether this is the first call with ``name`` for these sources' compiled code in the
    cache directory (:class:`PackageCacheLocator`): it makes the file ``name`` beside that code,
    exclusively. False when the file exists, no cache directory is writable, or under
    ``NUMBA_DISABLE_JIT=1``."""
    if config.DISABLE_JIT:
        return False
    directory = _cache_directory()
    try:
        os.makedirs(directory, exist_ok=True)
        os.close(os.open(os.path.join(directory, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:
        return False
    return True


class _CompileNotice(event.Listener):
    """Once outermost numba compiles have taken ``after`` seconds in all, one line on
    ``stream`` (printed by a timer thread while a compile runs, so a long one shows)."""

    def __init__(self, stream, after: float):
        self.stream, self.left, self.depth, self.timer = stream, after, 0, None
        self.lock = threading.Lock()

    def on_start(self, ev):
        with self.lock:
            self.depth += 1
            if self.depth == 1 and self.left is not None:
                self.started = time.perf_counter()
                self.timer = threading.Timer(max(self.left, 0.0), self.notice)
                self.timer.daemon = True
                self.timer.start()

    def on_end(self, ev):
        with self.lock:
            self.depth -= 1
            if self.depth == 0 and self.left is not None:
                self.timer.cancel()
                self.left -= time.perf_counter() - self.started

    def notice(self):
        with self.lock:
            if self.left is None or self.depth == 0:
                return
            self.left = None      # once per process
        print("compiling kernels, once per machine: later runs load them from "
              f"{config.CACHE_DIR or USER_CACHE_DIR}", file=self.stream or sys.stderr, flush=True)


_notice = None


def announce_compiling(stream=None, after: float = 1.0) -> None:
    """Print ``compiling kernels, once per machine: ...`` on ``stream`` (default
    ``sys.stderr``) once numba has spent ``after`` seconds compiling in this process, so that a
    first run never looks hung. Idempotent; does nothing under ``NUMBA_DISABLE_JIT=1``."""
    global _notice
    if _notice is None and not config.DISABLE_JIT:
        _notice = _CompileNotice(stream, after)
        event.register("numba:compile", _notice)
