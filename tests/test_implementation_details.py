"""docs/implementation_details.md: every detail of Huang et al. 2022 has a row; every option,
function and test a row names exists; the file, ppo_ref.details and `ppo-ref details` agree."""
import dataclasses
import importlib
import os
import re

import pytest

from ppo_ref import cli, details
from ppo_ref.config import PRESETS, PPOConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, details.MARKDOWN_PATH)
COLUMNS = ["key", "detail", "implemented by", "default", "presets that differ", "tests", "note"]
FIELDS = {f.name for f in dataclasses.fields(PPOConfig)}


def _read_rows():
    """The table of the markdown file as a list of {column: cell} dicts."""
    with open(DOC, encoding="utf-8") as fh:
        lines = [line.rstrip("\n") for line in fh if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == COLUMNS
    assert set(lines[1].strip("|").split("|")) == {"---"}
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        assert len(cells) == len(COLUMNS), line
        rows.append(dict(zip(COLUMNS, cells)))
    return rows


ROWS = _read_rows()


def _names(cell):
    """The backticked names of a cell ([] for n/a)."""
    if cell == "n/a":
        return []
    names = re.findall(r"`([^`]+)`", cell)
    assert names and re.sub(r"`[^`]+`", "", cell).strip() == "", f"malformed cell {cell!r}"
    return names


def _resolve(dotted):
    """Import the longest importable module prefix of ``dotted``, then getattr the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)  # AttributeError: the name does not exist
        return obj
    raise ImportError(dotted)


def test_file_is_generated_from_the_module():
    with open(DOC, encoding="utf-8") as fh:
        assert fh.read() == details.markdown(), (
            f"{details.MARKDOWN_PATH} is stale: regenerate it from ppo_ref.details.markdown()")


def test_one_row_per_detail_in_the_blogs_groups():
    keys = [row["key"] for row in ROWS]
    assert len(keys) == len(set(keys)) == 41  # 37 + 4 auxiliary
    expected = [f"{group}-{i}" for group, n in details.GROUPS.items() for i in range(1, n + 1)]
    assert keys == expected
    assert sum(n for g, n in details.GROUPS.items() if g != "auxiliary") == 37


@pytest.mark.parametrize("row", ROWS, ids=[row["key"] for row in ROWS])
def test_named_options_functions_and_tests_exist(row):
    implemented, tests = _names(row["implemented by"]), _names(row["tests"])
    not_applicable = row["key"].startswith("atari-") or row["key"] == "auxiliary-2"
    if not_applicable:
        assert implemented == [] and tests == []
        assert re.match(r"(out of scope|not applicable): ", row["note"]), row["note"]
        return
    assert implemented and tests and row["default"] not in ("", "-")
    for name in implemented:
        if name.startswith("PPOConfig."):
            assert name.split(".", 1)[1] in FIELDS, f"{row['key']}: no option {name}"
        else:
            assert name.startswith("ppo_ref."), name
            assert callable(_resolve(name)), f"{row['key']}: {name} is not callable"
    for name in tests:
        path, _, func = name.partition("::")
        full = os.path.join(ROOT, path)
        assert path.startswith("tests/") and os.path.isfile(full), f"{row['key']}: no {path}"
        with open(full, encoding="utf-8") as fh:
            assert re.search(rf"^def {re.escape(func)}\(", fh.read(), re.M), (
                f"{row['key']}: {path} has no test {func}")


@pytest.mark.parametrize("row", ROWS, ids=[row["key"] for row in ROWS])
def test_preset_cells_name_real_presets_and_values(row):
    """``preset[, preset]: field=value, ...; ...``: each preset exists and, where a part is
    exactly ``field=value``, the preset sets that value (a field name as value: that field's
    value)."""
    if row["presets that differ"] == "-":
        return
    for segment in row["presets that differ"].split(";"):
        names, _, rest = segment.partition(":")
        presets = [n.strip() for n in names.split(",")]
        assert rest and all(p in PRESETS for p in presets), segment
        for part in rest.split(","):
            m = re.fullmatch(r"\s*(\w+)=(\S+)\s*", part)
            if m is None:
                continue
            field, text = m.groups()
            assert field in FIELDS, f"{row['key']}: unknown field {field}"
            for p in presets:
                config = PPOConfig.preset(p)
                value = getattr(config, text) if text in FIELDS else text
                assert str(getattr(config, field)) == str(value), f"{row['key']}: {p}.{field}"


def test_cli_prints_the_same_table(capsys):
    def norm(text):
        return " ".join(text.split())

    assert cli.main(["details"]) == 0
    out = norm(capsys.readouterr().out)
    for row in ROWS:
        for column in COLUMNS:
            cell = row[column].replace("\\|", "|")
            assert norm(cell) in out, f"{row['key']} {column}: {cell!r} not printed"
    assert cli.main(["details", "--markdown"]) == 0
    with open(DOC, encoding="utf-8") as fh:
        assert capsys.readouterr().out == fh.read()
    assert cli.main(["details", "--group", "lstm"]) == 0
    out = capsys.readouterr().out
    assert "lstm-5" in out and "core-1" not in out
