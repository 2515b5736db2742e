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


# -- the edge cases, presets, skips, tolerance overrides, profiles and explanations ----------

def _results_from(vec_dir, compute):
    """A results document whose outputs are ``compute(case)`` (ppo_ref's own where it returns
    None)."""
    cases = {}
    for case in vectors.load_cases(str(vec_dir)):
        out = compute(case)
        cases[case["name"]] = {"outputs": vectors.encode(
            vectors.compute_outputs(case) if out is None else out)}
    return {"format": vectors.RESULTS_FORMAT, "implementation": "test", "cases": cases}


def _truncation_wins_gae(case):
    """The bug found in skrl, Sample Factory and torchrl: a step terminated and truncated at
    once bootstraps V(final_obs) as if only truncated."""
    if case["kind"] != "gae":
        return None
    inp = dict(case["inputs"])
    inp["terminated"] = inp["terminated"] & ~inp["truncated"]
    return vectors.compute_outputs({**case, "inputs": inp})


def test_vectors_catch_a_both_flags_bootstrap_bug_at_the_default_seed(vec_dir, tmp_path):
    doc = _results_from(vec_dir, _truncation_wins_gae)
    rows = {r["case"]: r for r in vectors.check_results(str(vec_dir),
                                                       _write(tmp_path / "bug.json", doc))}
    assert rows["gae_both_flags_reference"]["status"] == "FAIL"
    assert rows["gae_lambda0"]["status"] == "FAIL"  # both flags mid-rollout there too
    assert rows["gae_gamma0"]["status"] == "PASS"   # (gamma 0: no bootstrap to get wrong)
    assert "no other known convention passes" in rows["gae_both_flags_reference"]["detail"]
    assert all(r["status"] == "PASS" for r in rows.values() if r["kind"] != "gae")


def test_edge_cases_are_present(vec_dir):
    names = {c["name"] for c in json.loads((vec_dir / "index.json").read_text())["cases"]}
    assert {"gae_both_flags_reference", "gae_gamma0", "gae_lambda0", "gae_long", "gae_per_step",
            "vtrace_both_flags", "vtrace_per_step", "policy_loss_kinks", "policy_loss_dual_clip",
            "policy_loss_reciprocal", "policy_loss_valid_mask", "value_loss_huber",
            "normalize_advantages_clamp_1e-7"} <= names
    long = vectors.load_case(str(vec_dir / "gae_long.json"))
    assert long["inputs"]["rewards"].shape == (2000, 2)
    both = vectors.load_case(str(vec_dir / "gae_both_flags_reference.json"))
    assert np.any(both["inputs"]["terminated"] & both["inputs"]["truncated"])
    kinks = vectors.load_case(str(vec_dir / "policy_loss_kinks.json"))["inputs"]
    ratio = np.exp(kinks["new_log_probs"] - kinks["old_log_probs"])
    assert np.sum((ratio == 1.25) | (ratio == 0.75)) >= 2


def test_a_fail_names_the_convention_that_would_pass(vec_dir, tmp_path):
    def cleanrl_gae(case):
        if case["kind"] != "gae":
            return None
        return vectors.compute_outputs({**case, "settings": {**case["settings"],
                                                             "truncation": "terminate"}})
    doc = _results_from(vec_dir, cleanrl_gae)
    rows = {r["case"]: r for r in vectors.check_results(str(vec_dir),
                                                       _write(tmp_path / "c.json", doc))}
    row = rows["gae_reference"]
    assert row["status"] == "FAIL"
    assert any(a.startswith("cleanrl") and "truncation='terminate'" in a
               for a in row["alternatives"]), row["alternatives"]
    assert "would pass under cleanrl" in row["detail"]


def test_skipped_outputs_and_tolerance_overrides(vec_dir, own_results, tmp_path):
    doc = copy.deepcopy(own_results)
    del doc["cases"]["policy_loss_kinks"]["outputs"]["clip_fraction"]
    doc["cases"]["policy_loss_dual_clip"]["skip"] = ["clip_fraction", "approx_kl"]
    del doc["cases"]["policy_loss_dual_clip"]["outputs"]["approx_kl"]
    adv = doc["cases"]["gae_reference"]["outputs"]["advantages"]
    adv[0][0] += 1e-6
    path = _write(tmp_path / "s.json", doc)
    rows = {r["case"]: r for r in vectors.check_results(str(vec_dir), path)}
    assert rows["policy_loss_kinks"]["status"] == "FAIL"      # missing, not skipped
    assert rows["policy_loss_dual_clip"]["status"] == "PASS"  # skipped by the results file
    assert "skipped outputs: approx_kl, clip_fraction" in rows["policy_loss_dual_clip"]["detail"]
    assert rows["gae_reference"]["status"] == "FAIL"
    rows = {r["case"]: r for r in vectors.check_results(
        str(vec_dir), path, skip_outputs=["policy_loss_kinks/clip_fraction"],
        tolerances={"gae_reference/advantages": {"atol": 1e-5}})}
    assert rows["policy_loss_kinks"]["status"] == "PASS"
    assert rows["gae_reference"]["status"] == "PASS"
    rows = {r["case"]: r for r in vectors.check_results(
        str(vec_dir), path, tolerances={"*/returns": {"atol": 1e-5}})}
    assert rows["gae_reference"]["status"] == "FAIL"          # only returns were relaxed
    with pytest.raises(ValueError, match="tolerances"):
        vectors.check_results(str(vec_dir), path, tolerances={"x": {"atol": -1}})


def test_float32_profile(vec_dir, own_results, tmp_path):
    doc = copy.deepcopy(own_results)
    for name in ("gae_reference", "gae_long", "vtrace_reference", "value_loss_huber"):
        outs = doc["cases"][name]["outputs"]
        for k, v in outs.items():
            outs[k] = np.asarray(v, dtype=np.float32).astype(np.float64).tolist()
    path = _write(tmp_path / "f32.json", doc)
    strict = {r["case"]: r["status"] for r in vectors.check_results(str(vec_dir), path)}
    loose = {r["case"]: r["status"] for r in vectors.check_results(str(vec_dir), path,
                                                                  profile="float32")}
    assert strict["gae_long"] == "FAIL" and loose["gae_long"] == "PASS"
    assert all(s == "PASS" for s in loose.values())


def test_preset_vectors(tmp_path):
    vectors.write_vectors(str(tmp_path), preset="cleanrl", settings={"gamma": 0.9})
    case = vectors.load_case(str(tmp_path / "gae_reference.json"))
    assert case["preset"] == "cleanrl" and case["settings"]["truncation"] == "terminate"
    assert case["settings"]["gamma"] == 0.9
    upd = vectors.load_case(str(tmp_path / "ppo_minibatch_update_reference.json"))
    assert upd["settings"]["config"]["value_loss_scale"] == 0.5
    rows = vectors.check_results(str(tmp_path), _write(
        tmp_path / "r.json", vectors.reference_results(str(tmp_path))))
    assert all(r["status"] == "PASS" for r in rows)
