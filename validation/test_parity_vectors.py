"""Golden vectors: write, round trip through ppo_ref itself, and detect a perturbed output."""
import copy
import json
import math

import numpy as np
import pytest

from ppo_ref import vectors


@pytest.fixture(scope="module")
def vec_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("vectors")
    vectors.write_vectors(str(d))
    return d


@pytest.fixture(scope="module")
def own_results(vec_dir):
    return vectors.reference_results(str(vec_dir))


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return str(path)


def test_index_lists_every_kind(vec_dir):
    index = json.loads((vec_dir / "index.json").read_text())
    kinds = {c["kind"] for c in index["cases"]}
    assert kinds == {"episode_starts", "gae", "vtrace", "categorical", "policy_loss",
                     "value_loss", "entropy_loss", "normalize_advantages", "approx_kl", "adam",
                     "clip_by_global_norm", "lstm", "ppo_minibatch_update"}
    presets = {c["preset"] for c in index["cases"]}
    assert {"reference", "cleanrl", "thrust", "sb3"} <= presets


def test_files_are_strict_json_with_special_floats_as_strings(vec_dir):
    text = (vec_dir / "categorical.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON literal {c}"))
    case = vectors.load_case(str(vec_dir / "categorical.json"))
    assert case["inputs"]["logits"][1, 2] == -math.inf
    assert case["expected"]["log_probs"].dtype == np.float64


def test_round_trip_reference_passes(vec_dir, own_results, tmp_path):
    rows = vectors.check_results(str(vec_dir), _write(tmp_path / "r.json", own_results))
    assert [r["status"] for r in rows] == ["PASS"] * len(rows)
    assert all(r["max_err"] == 0.0 for r in rows)


@pytest.mark.parametrize("case, key", [("gae_thrust", "advantages"),
                                       ("lstm_resets", "grads/w_hh"),
                                       ("ppo_minibatch_update_reference", "params_after/vf.b1")])
def test_perturbed_output_fails_exactly_that_case(vec_dir, own_results, tmp_path, case, key):
    doc = copy.deepcopy(own_results)
    node = doc["cases"][case]["outputs"]
    *parents, leaf = key.split("/")
    for p in parents:
        node = node[p]
    arr = np.asarray(node[leaf], dtype=np.float64)
    arr.flat[arr.size // 2] += 1e-5
    node[leaf] = arr.tolist()
    rows = vectors.check_results(str(vec_dir), _write(tmp_path / "r.json", doc))
    failed = [r for r in rows if r["status"] != "PASS"]
    assert [r["case"] for r in failed] == [case]
    assert failed[0]["worst"] == key
    assert failed[0]["max_err"] == pytest.approx(1e-5, rel=1e-6)
    table = vectors.format_table(rows)
    assert "FAIL" in table and case in table


def test_missing_case_shape_and_inf_mismatch(vec_dir, own_results, tmp_path):
    doc = copy.deepcopy(own_results)
    del doc["cases"]["adam"]
    doc["cases"]["entropy_loss"]["outputs"]["d_entropy"] = [0.0]          # wrong shape
    lp = np.asarray(vectors.decode(own_results["cases"]["categorical"]["outputs"]["log_softmax"]))
    lp[1, 2] = -1e9                                                          # -inf replaced
    doc["cases"]["categorical"]["outputs"]["log_softmax"] = vectors.encode(lp)
    rows = {r["case"]: r for r in vectors.check_results(str(vec_dir),
                                                        _write(tmp_path / "r.json", doc))}
    assert rows["adam"]["status"] == "MISSING"
    assert rows["entropy_loss"]["status"] == "FAIL" and "shape" in rows["entropy_loss"]["detail"]
    assert rows["categorical"]["status"] == "FAIL" and "special" in rows["categorical"]["detail"]
    others = [r for name, r in rows.items() if name not in ("adam", "entropy_loss", "categorical")]
    assert all(r["status"] == "PASS" for r in others)
    skipped = vectors.check_results(str(vec_dir), _write(tmp_path / "r.json", doc),
                                    allow_missing=True)
    assert {r["case"]: r["status"] for r in skipped}["adam"] == "SKIP"


def test_tolerance_override_for_float32_implementations(vec_dir, own_results, tmp_path):
    doc = copy.deepcopy(own_results)
    out = doc["cases"]["gae_reference"]["outputs"]
    out["advantages"] = np.asarray(out["advantages"], np.float32).astype(np.float64).tolist()
    path = _write(tmp_path / "r.json", doc)
    strict = {r["case"]: r["status"] for r in vectors.check_results(str(vec_dir), path)}
    assert strict["gae_reference"] == "FAIL"
    loose = {r["case"]: r["status"]
             for r in vectors.check_results(str(vec_dir), path, atol=1e-6, rtol=1e-5)}
    assert loose["gae_reference"] == "PASS"


def test_bad_results_format_rejected(vec_dir, tmp_path):
    with pytest.raises(ValueError, match="results_file format"):
        vectors.check_results(str(vec_dir), _write(tmp_path / "r.json", {"cases": {}}))


@pytest.mark.parametrize("entry", ["ppo-ref", "python -m ppo_ref.vectors"])
def test_cli_vectors_and_check_exit_codes(tmp_path, capsys, entry):
    if entry == "ppo-ref":
        from ppo_ref.cli import main
    else:
        main = vectors.main
    out = tmp_path / "vec"
    assert main(["vectors", "--out", str(out)]) == 0
    res = vectors.reference_results(str(out))
    good = _write(tmp_path / "good.json", res)
    assert main(["check", str(out), "--results", good]) == 0
    bad = copy.deepcopy(res)
    bad["cases"]["approx_kl_k1"]["outputs"]["approx_kl"] += 0.5
    code = main(["check", str(out), "--results", _write(tmp_path / "bad.json", bad)])
    text = capsys.readouterr().out
    assert code == 1
    assert [line.split()[0] for line in text.splitlines() if " FAIL " in line] == ["approx_kl_k1"]
