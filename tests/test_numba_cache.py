"""The compiled-code cache of ``ppo_ref._numba``: every kernel of the package uses it, a second
process loads what the first compiled, and an edit to any source of the package makes every
cached kernel recompile (numba's own cache checks only the function's own file, so a caller in
one file kept a stale copy of a callee edited in another)."""
import ast
import importlib
import json
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from numba.core.registry import CPUDispatcher

import ppo_ref
from ppo_ref import _numba

from early_commands import assert_succeeded, python_call

pytestmark = pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1",
                                reason="needs the compiler")

COMPILING_NAMES = {"jit", "njit", "generated_jit", "vectorize", "guvectorize", "cfunc",
                   "stencil", "jit_module"}


def _package_dispatchers():
    """Every numba dispatcher reachable from a module of ppo_ref (module globals and class
    attributes), by dotted name."""
    found = {}
    for info in pkgutil.walk_packages(ppo_ref.__path__, "ppo_ref."):
        if info.name.endswith(".__main__"):  # importing it runs the CLI
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            members = vars(value).items() if isinstance(value, type) else [("", value)]
            for attr, member in members:
                member = getattr(member, "__func__", member)  # staticmethod
                if isinstance(member, CPUDispatcher):
                    found[".".join(filter(None, (info.name, name, attr)))] = member
    return found


def test_every_kernel_uses_the_package_keyed_cache():
    dispatchers = _package_dispatchers()
    assert len(dispatchers) >= 10, sorted(dispatchers)
    for name, dispatcher in dispatchers.items():
        cache = dispatcher._cache
        assert isinstance(cache, _numba.PackageFunctionCache), (name, cache)
        assert isinstance(cache._impl.locator, _numba.PackageCacheLocator), name
        stamp = cache._impl.locator.get_source_stamp()
        assert stamp[1] == _numba.package_sources_hash(), name


def test_no_module_compiles_with_numba_directly():
    """A kernel made with numba's own decorators would bypass the cache stamp."""
    root = Path(_numba.PACKAGE_DIR)
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if path == root / "_numba.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("numba"):
                offenders += [f"{path}: from {node.module} import {a.name}"
                              for a in node.names if a.name in COMPILING_NAMES]
            elif (isinstance(node, ast.Attribute) and node.attr in COMPILING_NAMES
                  and isinstance(node.value, ast.Name) and node.value.id == "numba"):
                offenders.append(f"{path}:{node.lineno}: numba.{node.attr}")
    assert not offenders


# --- behaviour: a minimal copy of the package, run in fresh processes ----------------------

CALLEE = '''\
from ppo_ref._numba import njit


def plain_value():
    return 1.25


@njit
def jitted_value():
    return 0.50
'''

CALLER = '''\
from ppo_ref._numba import njit
from ppo_ref.probe_callee import jitted_value, plain_value

compiled_plain_value = njit(plain_value)


@njit
def via_plain():
    return 2.0 * compiled_plain_value()


@njit
def via_jitted():
    return 2.0 * jitted_value()
'''

RUN = '''\
import json
import ppo_ref
from ppo_ref import probe_caller as c
kernels = {"via_plain": c.via_plain, "via_jitted": c.via_jitted}
print(json.dumps({
    "file": ppo_ref.__file__,
    "values": {name: k() for name, k in kernels.items()},
    "hits": sum(sum(k.stats.cache_hits.values()) for k in kernels.values()),
    "misses": sum(sum(k.stats.cache_misses.values()) for k in kernels.values()),
}))
'''


def _make_tree(root: Path) -> Path:
    package = root / "ppo_ref"
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.copyfile(_numba.__file__, package / "_numba.py")
    (package / "probe_callee.py").write_text(CALLEE)
    (package / "probe_caller.py").write_text(CALLER)
    return package


def _run(root: Path, xdg_cache_home: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_CACHE_DIR", "NUMBA_CACHE_LOCATOR_CLASSES", "PYTHONPATH")}
    env["XDG_CACHE_HOME"] = str(xdg_cache_home)  # the per-user cache directory's parent
    proc = subprocess.run([sys.executable, "-B", "-c", RUN], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(out["file"]).resolve() == (root / "ppo_ref" / "__init__.py").resolve()
    return out


def _edit_keeping_size_and_mtime(path: Path, old: str, new: str) -> None:
    assert len(old) == len(new)
    before = path.stat()
    path.write_text(path.read_text().replace(old, new))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def editing_a_callee_run(directory):
    tmp_path = Path(directory)
    package = _make_tree(tmp_path)
    xdg = tmp_path / "xdg"
    first = _run(tmp_path, xdg)
    assert first["values"] == {"via_plain": 2.5, "via_jitted": 1.0}
    assert (first["hits"], first["misses"]) == (0, 2)
    index_files = sorted((xdg / "ppo_ref").glob("ppo_ref-*/probe_caller.*.nbi"))
    assert len(index_files) == 2
    index_bytes = [p.read_bytes() for p in index_files]

    second = _run(tmp_path, xdg)  # unchanged tree: both callers load from the cache
    assert second["values"] == first["values"]
    assert (second["hits"], second["misses"]) == (2, 0)
    assert [p.read_bytes() for p in index_files] == index_bytes

    # Only the callee's file changes, with the same size and modification time.
    _edit_keeping_size_and_mtime(package / "probe_callee.py", "1.25", "1.75")
    _edit_keeping_size_and_mtime(package / "probe_callee.py", "0.50", "0.25")
    third = _run(tmp_path, xdg)
    assert third["values"] == {"via_plain": 3.5, "via_jitted": 0.5}
    assert (third["hits"], third["misses"]) == (0, 2)
    assert not (package / "__pycache__").exists()  # the per-user directory was writable


@pytest.mark.early_command(python_call(editing_a_callee_run, "{dir}"), timeout=600)
def test_editing_a_callee_file_recompiles_its_callers(early_command):
    """:func:`editing_a_callee_run` in a process of its own, started at the end of collection
    (tests/early_commands.py)."""
    assert_succeeded(early_command)


def second_install_run(directory):
    """Two copies of the package at different paths (two virtual environments) share the
    per-user cache; a copy whose sources differ compiles afresh."""
    tmp_path = Path(directory)
    xdg = tmp_path / "xdg"
    first, second, edited = (tmp_path / name for name in ("venv1", "venv2", "venv3"))
    for root in (first, second, edited):
        root.mkdir()
        _make_tree(root)
    for root, expected in ((first, (0, 2)), (second, (2, 0))):
        out = _run(root, xdg)
        assert (out["hits"], out["misses"]) == expected
    _edit_keeping_size_and_mtime(edited / "ppo_ref" / "probe_callee.py", "1.25", "1.75")
    out = _run(edited, xdg)
    assert out["values"]["via_plain"] == 3.5 and (out["hits"], out["misses"]) == (0, 2)
    assert len(list((xdg / "ppo_ref").glob("ppo_ref-*"))) == 2   # one per version of sources
    out = _run(second, xdg)    # the edited copy wrote elsewhere
    assert out["values"]["via_plain"] == 2.5 and (out["hits"], out["misses"]) == (2, 0)


@pytest.mark.early_command(python_call(second_install_run, "{dir}"), timeout=600)
def test_a_second_install_of_the_same_sources_loads_the_first_ones_kernels(early_command):
    """:func:`second_install_run` in a process of its own, started at the end of collection
    (tests/early_commands.py)."""
    assert_succeeded(early_command)


def test_only_the_newest_versions_of_the_sources_stay_cached(tmp_path):
    xdg = tmp_path / "xdg"
    _make_tree(tmp_path)
    versions = xdg / "ppo_ref"
    versions.mkdir(parents=True)
    for i in range(_numba.KEPT_VERSIONS + 2):
        old = versions / f"ppo_ref-{i:016x}"
        old.mkdir()
        os.utime(old, (1e9 + i, 1e9 + i))
    (versions / "unrelated").mkdir()
    _run(tmp_path, xdg)
    kept = sorted(p.name for p in versions.iterdir())
    newest = [f"ppo_ref-{i:016x}" for i in range(3, _numba.KEPT_VERSIONS + 2)]
    assert len(kept) == _numba.KEPT_VERSIONS + 1
    assert set(newest) < set(kept) and "unrelated" in kept


def unwritable_directory_run(directory):
    tmp_path = Path(directory)
    package = _make_tree(tmp_path)
    blocked = tmp_path / "blocked"
    blocked.write_text("")  # a file: the per-user cache directory cannot be created
    for expected in ((0, 2), (2, 0)):  # the in-tree __pycache__ serves as the cache
        out = _run(tmp_path, blocked / "cache")
        assert out["values"] == {"via_plain": 2.5, "via_jitted": 1.0}
        assert (out["hits"], out["misses"]) == expected
    assert list((package / "__pycache__").glob("probe_caller.*.nbi"))

    shutil.rmtree(package / "__pycache__")
    (package / "__pycache__").write_text("")  # a file: no in-tree cache either
    for _ in range(2):  # compiled in each process, no error
        out = _run(tmp_path, blocked / "cache")
        assert out["values"] == {"via_plain": 2.5, "via_jitted": 1.0}
        assert (out["hits"], out["misses"]) == (0, 2)


@pytest.mark.early_command(python_call(unwritable_directory_run, "{dir}"), timeout=600)
def test_unwritable_user_directory_falls_back_then_degrades_to_no_cache(early_command):
    """:func:`unwritable_directory_run` in a process of its own, started at the end of
    collection (tests/early_commands.py)."""
    assert_succeeded(early_command)


# --- behaviour: the package's own kernels, in two fresh processes ----------------------------

_ADVANTAGES = """
import numpy as np
from ppo_ref import gae, vtrace
for dtype in (np.float32, np.float64):
    z = np.zeros((4, 2), dtype)
    gae(z, z, z, z, z[0], gamma=0.9, gae_lambda=0.9)
    vtrace(z, z, z, z, z, z, z[0], gamma=0.9)
"""


def second_process_run(directory):
    """With an empty ``NUMBA_CACHE_DIR``, the first process compiles and saves the kernels of
    gae and vtrace (float32 and float64); a second process loads every one of them and
    compiles nothing (numba's ``NUMBA_DEBUG_CACHE`` trace)."""
    tmp_path = Path(directory)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), NUMBA_DEBUG_CACHE="1",
               PYTHONPATH=os.path.dirname(_numba.PACKAGE_DIR))

    def trace():
        proc = subprocess.run([sys.executable, "-c", _ADVANTAGES], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = (proc.stdout + proc.stderr).splitlines()
        return ([x for x in lines if "[cache] data saved to" in x],
                [x for x in lines if "[cache] data loaded from" in x])
    saved, loaded = trace()
    assert len(saved) >= 4 and not loaded   # two loops, two dtypes: at least four entries
    saved_again, loaded = trace()
    assert not saved_again and len(loaded) == len(saved)


@pytest.mark.early_command(python_call(second_process_run, "{dir}"), timeout=600)
def test_a_second_process_loads_the_kernels_the_first_compiled(early_command):
    """:func:`second_process_run` in a process of its own, started at the end of collection
    (tests/early_commands.py)."""
    assert_succeeded(early_command)


_NOTICE = """
import io, sys
from ppo_ref import _numba
stream = io.StringIO()
_numba.announce_compiling(stream, after={after})
_numba.announce_compiling(stream, after={after})   # idempotent
@_numba.njit
def f(x):
    return x + 1
print(f(1), repr(stream.getvalue()))
"""


@pytest.mark.parametrize("after, lines", [(0.0, 1), (600.0, 0)])
def test_a_long_compile_announces_itself_once(tmp_path, after, lines):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.path.dirname(_numba.PACKAGE_DIR))
    proc = subprocess.run([sys.executable, "-c", _NOTICE.format(after=after)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    value, printed = proc.stdout.split(" ", 1)
    assert value == "2"
    printed = eval(printed)
    assert printed.count("\n") == lines
    assert printed.startswith("compiling kernels, once per machine: ") == bool(lines)
