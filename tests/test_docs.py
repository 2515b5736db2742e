"""The repository's own specification (docs/specification.md) and the citations of it.

(a) No file cites the external brief the project started from (its citation forms are listed
    in _FOREIGN); the specification in docs/ replaces it.
(b) Every ``docs/specification.md §N`` citation names a section that exists.
(c) Every PPOConfig field appears in the specification's config table (§5.1), and nothing
    else does.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ppo_ref.config import PPOConfig

ROOT = Path(__file__).resolve().parents[1]
SPEC_DOC = ROOT / "docs" / "specification.md"
SCANNED = ("ppo_ref", "tests", "validation", "docs", "README.md")
TEXT_SUFFIXES = {".py", ".md", ".json", ".txt", ".toml", ".cfg", ".ini", ".rst", ".yaml", ".yml"}
THIS_FILE = Path(__file__).resolve()

# the citation forms of the external brief: the word SPEC (not part of a longer identifier such
# as SPEC_DEFAULTS or _SPECIAL), "SPEC §", "DESIGN.md", "DESIGN §"
_FOREIGN = re.compile(r"(?<![A-Za-z0-9_])SPEC(?![A-Za-z0-9_])|DESIGN\.md|DESIGN §")
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
