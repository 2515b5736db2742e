"""The repository's own specification (docs/specification.md) and the citations of it.

(a) No file cites the external brief the project started from (its citation forms are listed
    in _FOREIGN); the specification in docs/ replaces it.
(b) Every ``docs/specification.md §N`` citation names a section that exists.
(c) Every PPOConfig field appears in the specification's config table (§5.1), and nothing
    else does.
(d) README.md, docs/*.md and validation/README.md name only real code: every ``ppo_ref/...``,
    ``validation/...``, ``tests/...`` or ``docs/...`` file or directory path exists, every dotted
    ``ppo_ref.x.y`` name imports (the longest importable module, then attributes), and every
    relative Markdown link points at a file that exists.
(e) validation/README.md lists every golden-vector case the code writes (its case table is
    ``ppo_ref.vectors.cases.case_table()``'s output).
"""
from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from ppo_ref.config import PPOConfig

ROOT = Path(__file__).resolve().parents[1]
SPEC_DOC = ROOT / "docs" / "specification.md"
SCANNED = ("ppo_ref", "tests", "validation", "docs", "README.md")
TEXT_SUFFIXES = {".py", ".md", ".json", ".txt", ".toml", ".cfg", ".ini", ".rst", ".yaml", ".yml"}
THIS_FILE = Path(__file__).resolve()

# the citation forms of the external brief: "SPEC.md", "SPEC §", "DESIGN.md", "DESIGN §", and
# the word SPEC after "see", "the", "per", "in", "by" or "from" (not a Python name such as the
# tier variable in ``losses=SPEC.losses`` or ``run_on(SPEC, config)``, nor part of a longer
# identifier such as SPEC_DEFAULTS or _SPECIAL)
_FOREIGN = re.compile(r"(?<![A-Za-z0-9_])SPEC(?:\.md|\s*§)|DESIGN\.md|DESIGN\s*§"
                      r"|\b(?:[Ss]ee|[Tt]he|per|in|by|from)\s+SPEC(?![A-Za-z0-9_(\[=]|\.\w)")
_CITATION = re.compile(r"specification\.md\s*§\s*([0-9]+[a-z]?)")
_HEADING = re.compile(r"^## ([0-9]+[a-z]?)\. ", re.MULTILINE)
_SUBHEADING = re.compile(r"^### ([0-9]+[a-z]?\.[0-9]+) ", re.MULTILINE)
EXPECTED_SECTIONS = ("1", "2", "3", "4", "5", "6", "6b", "6c", "7", "8", "9")


def _files():
    for entry in SCANNED:
        path = ROOT / entry
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        for f in candidates:
            if (f.is_file() and f.suffix in TEXT_SUFFIXES and "__pycache__" not in f.parts
                    and f.resolve() != THIS_FILE):
                yield f


def _lines(path: Path):
    text = path.read_text(encoding="utf-8", errors="replace")
    return text.splitlines()


def _sections():
    text = SPEC_DOC.read_text(encoding="utf-8")
    return set(_HEADING.findall(text)) | set(_SUBHEADING.findall(text))


def test_specification_has_every_numbered_section():
    sections = _sections()
    missing = [s for s in EXPECTED_SECTIONS if s not in sections]
    assert not missing, f"docs/specification.md lacks the sections {missing}"


def test_scanner_finds_a_foreign_citation_when_there_is_one():
    # the pattern of (a) matches the citation forms and not identifiers that contain them
    assert _FOREIGN.search("see " + "SPEC" + " §2")
    assert _FOREIGN.search("the " + "DESIGN" + ".md table")
    assert _FOREIGN.search("(" + "DESIGN" + " §4)")
    assert not _FOREIGN.search("_" + "SPEC" + "IAL = {}")
    assert not _FOREIGN.search("SPEC" + "_DEFAULTS = dict(")
    assert not _FOREIGN.search("ppo_ref/spec/ and backend='spec'")
    assert _FOREIGN.search("as " + "SPEC" + ".md says")
    assert _FOREIGN.search("see " + "SPEC" + ".")
    assert not _FOREIGN.search("SPEC" + ", FAST = tier_for('spec'), tier_for('fast')")
    assert not _FOREIGN.search("losses=" + "SPEC" + ".losses, optim=" + "SPEC" + ".optim")
    assert not _FOREIGN.search("run_on(" + "SPEC" + ", config)")


def test_no_file_cites_the_external_brief():
    hits = [f"{f.relative_to(ROOT)}:{i}: {line.strip()[:100]}"
            for f in _files() for i, line in enumerate(_lines(f), 1) if _FOREIGN.search(line)]
    assert not hits, (f"{len(hits)} citation(s) of the external brief; cite "
                      "docs/specification.md §N instead:\n" + "\n".join(hits))


def test_every_specification_citation_names_an_existing_section():
    sections = _sections()
    bad = []
    for f in list(_files()) + [THIS_FILE]:
        for i, line in enumerate(_lines(f), 1):
            for label in _CITATION.findall(line):
                if label not in sections:
                    bad.append(f"{f.relative_to(ROOT)}:{i}: §{label}")
    assert not bad, "citations of sections docs/specification.md does not have:\n" + "\n".join(bad)


def _config_table_fields():
    """The first column of the table under '### 5.1' (backquoted names)."""
    text = SPEC_DOC.read_text(encoding="utf-8")
    start = text.index("### 5.1 ")
    end = text.index("\n### ", start + 1)
    names = []
    for line in text[start:end].splitlines():
        m = re.match(r"^\| `([A-Za-z_][A-Za-z0-9_]*)` \|", line)
        if m:
            names.append(m.group(1))
    return names


def test_config_table_lists_every_ppoconfig_field_once():
    table = _config_table_fields()
    fields = [f.name for f in dataclasses.fields(PPOConfig)]
    missing = [n for n in fields if n not in table]
    unknown = [n for n in table if n not in fields]
    duplicated = sorted({n for n in table if table.count(n) > 1})
    assert not missing, f"PPOConfig fields missing from the table of §5.1: {missing}"
    assert not unknown, f"names in the table of §5.1 that are not PPOConfig fields: {unknown}"
    assert not duplicated, f"fields listed twice in §5.1: {duplicated}"


def test_config_table_defaults_match_the_code():
    text = SPEC_DOC.read_text(encoding="utf-8")
    start = text.index("### 5.1 ")
    end = text.index("\n### ", start + 1)
    defaults = {}
    for line in text[start:end].splitlines():
        m = re.match(r"^\| `([A-Za-z_][A-Za-z0-9_]*)` \| `([^`]*)` \|", line)
        if m:
            defaults[m.group(1)] = m.group(2)
    for f in dataclasses.fields(PPOConfig):
        shown = repr(f.default) if not isinstance(f.default, tuple) else (
            "(" + ", ".join(str(v) for v in f.default) + ")")
        assert defaults.get(f.name) == shown, (f.name, defaults.get(f.name), shown)


# -- (d) the documents name only real code ------------------------------------------------------

DOCUMENTS = ([ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
             + [ROOT / "validation" / "README.md"])
# a dotted name of the package (not the start of a longer path or name: "x.ppo_ref.y", and not
# a format tag such as "ppo_ref.vectors/1": followed by "/")
_DOTTED = re.compile(r"(?<![\w./])ppo_ref(?:\.[A-Za-z_][A-Za-z0-9_]*)+(?![\w/])")
# a file or directory path of the repository (in ppo_ref/, validation/, tests/ or docs/; not
# the tail of a longer path or URL): ends in a file name with an extension or in "/" (env ids
# such as "ppo_ref/CartPoleNoVel-v1" are neither)
_PATH = re.compile(r"(?<![\w./-])(?:ppo_ref|validation|tests|docs)/(?:[A-Za-z0-9_.-]+/)*"
                   r"(?:[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_]+)+\b)?")
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` imports: the longest importable module prefix, then attributes (a
    field of a NamedTuple or dataclass counts as an attribute)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
                continue  # that module does not exist: try a shorter prefix
            raise
        for i, attr in enumerate(parts[cut:]):
            fields = tuple(getattr(obj, "_fields", ())) + tuple(
                getattr(obj, "__dataclass_fields__", {}))
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            elif attr in fields and i == len(parts[cut:]) - 1:
                return True
            else:
                return False
        return True
    return False


def _named_code(text: str):
    """``(kind, what)`` for every package path, dotted name and relative link of ``text``."""
    for m in _PATH.finditer(text):
        if m.group(0) != "ppo_ref/":  # (the bare prefix of a bundled env id)
            yield "path", m.group(0)
    for m in _DOTTED.finditer(text):
        yield "name", m.group(0)
    for m in _LINK.finditer(text):
        if not re.match(r"[a-z]+:", m.group(1)):
            yield "link", m.group(1)


def _missing(document: Path):
    text = document.read_text(encoding="utf-8")
    out = []
    for kind, what in _named_code(text):
        if kind == "path":
            ok = (ROOT / what).exists()
        elif kind == "name":
            ok = _resolves(what)
        else:
            ok = (document.parent / what).exists()
        if not ok:
            out.append(f"{document.relative_to(ROOT)}: {kind} {what}")
    return sorted(set(out))


@pytest.mark.parametrize("document", DOCUMENTS, ids=[d.name for d in DOCUMENTS])
def test_documents_name_only_real_paths_and_names(document):
    missing = _missing(document)
    assert not missing, "names of code that does not exist:\n" + "\n".join(missing)


def test_the_path_and_name_checks_reject_what_they_must():
    assert _resolves("ppo_ref.spec.losses.policy_loss")
    assert _resolves("ppo_ref.train.ppo.PPOTrainer.iteration")
    assert _resolves("ppo_ref.distributed.AsyncActorLearnerConfig.actors")  # a dataclass field
    assert not _resolves("ppo_ref.kernels")
    assert not _resolves("ppo_ref.optim")
    assert not _resolves("ppo_ref.spec.losses.no_such_function")
    assert not _resolves("ppo_ref.spec.update.row_minibatches")
    found = list(_named_code(
        "`ppo_ref/spec/losses.py`, `ppo_ref/fast/`, env `ppo_ref/CartPoleNoVel-v1`, format "
        '"ppo_ref.vectors/1", `ppo_ref.nn.lstm` and [x](docs/README.md#a), [y](https://a.b)'))
    assert found == [("path", "ppo_ref/spec/losses.py"), ("path", "ppo_ref/fast/"),
                     ("path", "docs/README.md"), ("name", "ppo_ref.nn.lstm"),
                     ("link", "docs/README.md")]
    found = list(_named_code(
        "run `python validation/bench_elements.py --kind mlp` (see tests/test_tiers.py:12, "
        "validation/data/x.json and https://example.org/docs/a.md)"))
    assert found == [("path", "validation/bench_elements.py"), ("path", "tests/test_tiers.py"),
                     ("path", "validation/data/x.json")]
    assert not (ROOT / "validation" / "bench_elements.py").exists()


# -- (e) validation/README.md lists every golden-vector case ------------------------------------

def test_validation_readme_lists_every_golden_vector_case(tmp_path):
    """The case table of validation/README.md is ``case_table()``'s output: every case the code
    writes, in order, with its settings (a case added to ppo_ref/vectors/cases.py and not to the
    README, or a README row the code no longer writes, fails here)."""
    from ppo_ref.vectors import write_vectors
    from ppo_ref.vectors.cases import case_table
    text = (ROOT / "validation" / "README.md").read_text(encoding="utf-8")
    table = case_table()
    names = re.findall(r"^\| `([^`]+)` \| ", table, re.MULTILINE)
    assert names == write_vectors(str(tmp_path), backend="spec")  # the cases written
    section = text[text.index("cases written"):]
    section = section[:section.index("\n\n", section.index("| case |"))]
    listed = re.findall(r"^\| `([^`]+)` \| ", section, re.MULTILINE)
    missing = [n for n in names if n not in listed]
    unknown = [n for n in listed if n not in names]
    assert not missing, f"golden-vector cases missing from validation/README.md: {missing}"
    assert not unknown, f"validation/README.md lists cases the code does not write: {unknown}"
    assert table in text, "the case table of validation/README.md differs from case_table()"
    assert f"The {len(names)} cases written" in text
