"""The package's import graph runs one way, read from the source (AST) of every module.

Each top-level module or subpackage of ``ppo_ref`` (its *group*: ``train`` for
``ppo_ref.train.ppo``, ``config`` for ``ppo_ref.config``) has a rank in :data:`RANKS`. A module
may import from its own group and from groups of strictly lower rank; two different groups of
the same rank are independent. The table, highest first (the flow of the package docstring)::

    8  cli                      the ppo-ref command: calls the library, imported by nothing
    7  testing                  property checks of another implementation
    6  distributed, vectors,    the actor-learner loop (builds on train); golden vectors
       zoo                        (codec, cases, check: use the policies and the convention
                                  table); per-env defaults (PPOConfig values)
    5  train, conventions       rollout collection, policies, the trainers; the table of
                                  convention options (reads the presets of config)
    4  config, io, envs,        settings (config reads the backends of tiers); checkpoints and
       details                    run files; the bundled envs; the implementation-details table
    3  tiers                    tier_for(backend): the one place a backend becomes a tier
    2  fast                     the compiled tier (twins of spec functions)
    1  spec                     the readable tier
    0  _checks, _numba,         argument checks, the njit decorator, the parent-death lifeline
       _lifeline

Also checked: no private name (a leading underscore, dunders aside) and no private module is
imported from another group, nothing outside ``cli/`` imports ``ppo_ref.cli`` (the package's
``__main__`` is the command itself), and the package root is imported only for its dunders (``__version__``, ``__file__``).
(``tiers`` selects its tier with ``importlib``, which this table does not see: that it is the one
place a backend string becomes code is ``tests/test_seam.py``'s trace.)
"""
from __future__ import annotations

import ast
import pathlib

import ppo_ref

PACKAGE = pathlib.Path(ppo_ref.__file__).parent

RANKS = {
    "_checks": 0, "_numba": 0, "_lifeline": 0,
    "spec": 1,
    "fast": 2,
    "tiers": 3,
    "config": 4, "io": 4, "envs": 4, "details": 4,
    "train": 5, "conventions": 5,
    "distributed": 6, "vectors": 6, "zoo": 6,
    "testing": 7,
    "cli": 8,
}

#: Modules exempt from the rank rule as importers: the package root re-exports the public API;
#: ``python -m ppo_ref`` is the command line.
ROOT, MAIN = "ppo_ref", "ppo_ref.__main__"


def _modules():
    """``(dotted name, is_package, path)`` of every module of the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        yield ".".join(parts[:-1] if is_package else parts), is_package, path


def _group(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def _is_submodule(dotted: str) -> bool:
    rel = pathlib.Path(*dotted.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


def _imports(module: str, is_package: bool, tree: ast.AST):
    """``(line, target module, [imported names])`` of every ``ppo_ref`` import, module level or
    inside a function. ``from ppo_ref.x import y`` with ``y`` a submodule targets ``ppo_ref.x.y``."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "ppo_ref":
                    yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "ppo_ref":
                continue
            for alias in node.names:
                if _is_submodule(f"{target}.{alias.name}"):
                    yield node.lineno, f"{target}.{alias.name}", []
                else:
                    yield node.lineno, target, [alias.name]


def _root_attributes(tree: ast.AST):
    """Names read as ``ppo_ref.<name>`` in a module (after a bare ``import ppo_ref``)."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "ppo_ref"):
            yield node.lineno, node.attr


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def violations():
    found = []
    for module, is_package, path in _modules():
        tree = ast.parse(path.read_text(), str(path))
        src = _group(module)
        where = f"{path.relative_to(PACKAGE.parent)}"
        bare_root = False
        for line, target, names in _imports(module, is_package, tree):
            dst = _group(target)
            at = f"{where}:{line}: imports {target}"
            if target == ROOT:
                if names and names != ["__version__"] and module != ROOT:
                    found.append(f"{at} {names}: the package root re-exports from every layer; "
                                 "import the module that holds the name")
                if not names:  # bare `import ppo_ref`: only its dunders may be read
                    bare_root = True
                continue
            if dst == "cli" and src != "cli" and module != MAIN:
                found.append(f"{at}: only cli/ (and python -m ppo_ref) may import the command line")
                continue
            if src not in RANKS and module not in (ROOT, MAIN):
                found.append(f"{where}: group {src!r} has no rank in RANKS")
            if dst not in RANKS:
                found.append(f"{at}: {dst!r} has no rank in RANKS (an old module path? "
                             "import the module that holds the code)")
                continue
            if src == dst:
                continue
            if module not in (ROOT, MAIN) and src in RANKS and RANKS[dst] >= RANKS[src]:
                found.append(f"{at}: {src} (rank {RANKS[src]}) may not import {dst} "
                             f"(rank {RANKS[dst]})")
            hidden = [p for p in target.split(".")[2:] if _private(p)]
            if hidden:
                found.append(f"{at}: private module {hidden[0]} of another group")
            for name in names:
                if _private(name):
                    found.append(f"{at}: private name {name} of another group")
        if bare_root:  # ppo_ref.__version__, ppo_ref.__file__: not names re-exported there
            for attr_line, attr in sorted(set(_root_attributes(tree))):
                if not attr.startswith("__") and not _is_submodule(f"ppo_ref.{attr}"):
                    found.append(f"{where}:{attr_line}: reads ppo_ref.{attr} through the "
                                 "package root")
    return found


def test_imports_run_one_way_and_no_private_name_crosses_a_group():
    found = violations()
    assert not found, "\n".join(found)


def test_every_top_level_module_has_a_rank():
    names = {p.stem if p.suffix == ".py" else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p / "__init__.py").is_file())}
    names -= {"__init__", "__main__"}
    assert names == set(RANKS), (sorted(names - set(RANKS)), sorted(set(RANKS) - names))


def test_the_checker_finds_what_it_forbids(tmp_path):
    # the rules themselves, on made-up import lines
    tree = ast.parse("from ppo_ref.train.ppo import PPOTrainer\n"
                     "from ppo_ref.fast.lstm import _private_kernel\n"
                     "from ppo_ref import cli\n")
    got = list(_imports("ppo_ref.spec.layers", False, tree))
    assert [(t, n) for _, t, n in got] == [("ppo_ref.train.ppo", ["PPOTrainer"]),
                                           ("ppo_ref.fast.lstm", ["_private_kernel"]),
                                           ("ppo_ref.cli", [])]
    assert RANKS[_group("ppo_ref.train.ppo")] > RANKS[_group("ppo_ref.spec.layers")]
    # config reads the backends of tiers, which selects spec or fast
    assert (RANKS[_group("ppo_ref.spec.update")] < RANKS[_group("ppo_ref.fast.lstm")]
            < RANKS[_group("ppo_ref.tiers")] < RANKS[_group("ppo_ref.config")])
    assert _private("_private_kernel") and not _private("__version__")
