"""The README's map from each quantity to the ``ppo_ref/spec/`` functions that define it and run
it under both backends.

The table under "### Where each quantity is defined" links, in its second column, one or more
functions as ``[`name`](ppo_ref/spec/<module>.py)``. Every linked function must

* exist in that module (defined there, not re-exported), be callable and carry a docstring (the
  README points to the docstrings for the equations);
* run under both backends: be among the spec functions that one iteration of a trainer executes
  with ``backend="spec"`` and with ``backend="fast"`` (the feedforward or the LSTM trainer;
  either will do), as traced by ``tests/test_seam.py``'s
  :func:`spec_functions_run_by_both_backends` (compiled code run as Python, so that the spec
  functions the fast tier compiles show in the trace).

Every quantity the README promises to map has a row, and every section number of the third
column exists in docs/specification.md.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from test_seam import RUNS, spec_functions_run_by_both_backends

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SPEC_DOC = ROOT / "docs" / "specification.md"
MAP_HEADING = "### Where each quantity is defined"

_LINK = re.compile(r"\[`([A-Za-z_][A-Za-z0-9_]*)`\]\(([^)\s]+)\)")
_SECTION = re.compile(r"§\s*([0-9]+[a-z]?(?:\.[0-9]+)?)")

# the quantities the map must cover (a row's first column contains the phrase, case-insensitive)
REQUIRED = ("transition flags", "GAE with truncation", "categorical sampling", "LSTM cell",
            "LSTM BPTT", "Adam", "schedules", "clipped surrogate and its gradient", "value loss",
            "KL estimator", "advantage normalization", "minibatch loss", "epoch loop", "KL stop",
            "feedforward minibatches", "recurrent minibatching", "one whole iteration",
            "observation normalization")


def _map_rows(text: str):
    """``[(quantity, links, sections)]`` of the map table in ``text``."""
    start = text.index(MAP_HEADING)
    end = text.find("\n### ", start + 1)
    end2 = text.find("\n## ", start + 1)
    stops = [e for e in (end, end2) if e != -1]
    section = text[start:min(stops)] if stops else text[start:]
    rows = []
    for line in section.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "quantity":
            continue
        rows.append((cells[0], _LINK.findall(cells[1]), _SECTION.findall(cells[2])))
    return rows


def _module_name(path: str) -> str:
    """``ppo_ref/spec/losses.py`` -> ``ppo_ref.spec.losses``."""
    return path[:-3].replace("/", ".")


def _problems(name: str, path: str) -> list:
    """Why ``[`name`](path)`` is not a function defined in a ``ppo_ref/spec/`` module."""
    if not re.fullmatch(r"ppo_ref/spec/[a-z_]+\.py", path):
        return [f"{name}: {path} is not a module of ppo_ref/spec/"]
    if not (ROOT / path).is_file():
        return [f"{name}: {path} does not exist"]
    module_name = _module_name(path)
    module = importlib.import_module(module_name)
    fn = getattr(module, name, None)
    if fn is None:
        return [f"{module_name} has no {name}"]
    out = []
    if not callable(fn):
        out.append(f"{module_name}.{name} is not callable")
    if getattr(fn, "__module__", None) != module_name:
        out.append(f"{module_name}.{name} is defined in {getattr(fn, '__module__', None)}, "
                   "not in the linked file")
    if not (getattr(fn, "__doc__", None) or "").strip():
        out.append(f"{module_name}.{name} has no docstring")
    return out


def _not_run_by_both(rows, ran) -> list:
    """The linked functions of ``rows`` that are not in ``ran``, the ``(module, function)``
    pairs that both backends executed."""
    return sorted({f"{_module_name(path)}.{name} (row {quantity!r})"
                   for quantity, links, _ in rows for name, path in links
                   if (_module_name(path), name) not in ran})


ROWS = _map_rows(README.read_text(encoding="utf-8"))


def test_the_map_has_rows():
    assert len(ROWS) >= len(REQUIRED)


@pytest.mark.parametrize("quantity,links,sections", ROWS, ids=[r[0][:40] for r in ROWS])
def test_every_named_function_exists_in_its_spec_module(quantity, links, sections):
    assert links, f"row {quantity!r} links no function"
    problems = [p for name, path in links for p in _problems(name, path)]
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def run_by_both_backends():
    """The spec functions one iteration executes under both backends, for either trainer."""
    ran = set()
    for kind in sorted(RUNS):
        ran |= spec_functions_run_by_both_backends(kind)
    return ran


def test_every_named_function_runs_under_both_backends(run_by_both_backends):
    missing = _not_run_by_both(ROWS, run_by_both_backends)
    assert not missing, ("functions the README's map links that an iteration of the trainers "
                         f"({', '.join(sorted(RUNS))}) does not execute under both backends:\n"
                         + "\n".join(missing))


def test_every_required_quantity_has_a_row():
    quantities = [q.lower() for q, _, _ in ROWS]
    missing = [r for r in REQUIRED if not any(r.lower() in q for q in quantities)]
    assert not missing, f"the README's map has no row for {missing}"


def test_every_cited_section_exists():
    text = SPEC_DOC.read_text(encoding="utf-8")
    headings = set(re.findall(r"^## ([0-9]+[a-z]?)\. ", text, re.MULTILINE))
    headings |= set(re.findall(r"^### ([0-9]+[a-z]?\.[0-9]+) ", text, re.MULTILINE))
    bad = [(q, s) for q, _, sections in ROWS for s in sections if s not in headings]
    assert not bad, f"sections docs/specification.md does not have: {bad}"
    assert all(sections for _, _, sections in ROWS), "a row cites no section"


def test_the_checker_rejects_what_it_must():
    # a missing name, a re-export, a path outside spec/ and a missing file are all reported
    assert _problems("no_such_function", "ppo_ref/spec/advantages.py")
    assert _problems("transition_flags", "ppo_ref/spec/advantages.py")  # imported there
    assert _problems("gae", "ppo_ref/fast/advantages.py")
    assert _problems("gae_recursion", "ppo_ref/spec/no_such_module.py")
    assert not _problems("gae_recursion", "ppo_ref/spec/advantages.py")
    rows = _map_rows("### Where each quantity is defined\n\n| quantity | f | s |\n|---|---|---|\n"
                     "| x | [`a`](ppo_ref/spec/m.py), [`b`](ppo_ref/spec/n.py) | §2.4, §6b |\n")
    assert rows == [("x", [("a", "ppo_ref/spec/m.py"), ("b", "ppo_ref/spec/n.py")],
                     ["2.4", "6b"])]
    # a function that only one backend ran (or none) is reported, one both ran is not
    ran = {("ppo_ref.spec.m", "a")}
    assert _not_run_by_both(rows, ran) == ["ppo_ref.spec.n.b (row 'x')"]
    assert not _not_run_by_both(rows, ran | {("ppo_ref.spec.n", "b")})
