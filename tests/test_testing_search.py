"""Seeing past a difference: exclude=, identify with two differences, differences confined to
kinks, tolerances that follow the conditioning, and check/identify/ppo-ref check trying the
same options."""
import json

import numpy as np
import pytest
from hypothesis import given, settings

from ppo_ref import vectors
from ppo_ref.conventions import QUANTITIES, options_for
from ppo_ref import gae
from ppo_ref.spec.losses import approx_kl, policy_loss, value_loss
from ppo_ref.spec.update import aggregation_weights
from ppo_ref.testing import (Mismatch, check_gae, check_normalize_advantages,
                             check_policy_loss, check_value_loss, identify)
from ppo_ref.testing.quantities import QUANTITY_SPECS
from ppo_ref.vectors.cases import OPTION_KEYS

FEW = 40


@pytest.mark.parametrize("quantity", sorted(QUANTITY_SPECS))
def test_an_excluded_condition_never_holds(quantity):
    q = QUANTITY_SPECS[quantity]
    for prop in q.properties:
        @settings(max_examples=8, database=None)
        @given(q.strategy("any", frozenset({prop.key}), None, False))
        def never(ex):
            assert not prop.holds(ex), prop.name
        never()


def test_exclude_names_conditions_by_key_or_name():
    check_gae(gae, exclude=("both_flags", "a long rollout (T > 64)"), max_examples=5)
    with pytest.raises(ValueError, match="unknown condition 'both flags'.*'both_flags'"):
        check_gae(gae, exclude=("both flags",))


# -- two differences -------------------------------------------------------------------------

def _two_bugs_gae(rewards, values, terminated, truncated, last_values, final_values, *, gamma,
                  gae_lambda):
    """Bootstraps a step with both flags (the truncation read first), and takes a truncation
    on the last row as a termination."""
    following = np.concatenate([values[1:], last_values[None]])
    next_values = np.where(truncated, final_values, np.where(terminated, 0.0, following))
    next_values[-1] = np.where(truncated[-1], 0.0, next_values[-1])
    keep = 1.0 - (terminated | truncated)
    adv = np.zeros_like(rewards)
    running = np.zeros_like(last_values)
    for t in range(len(rewards) - 1, -1, -1):
        delta = rewards[t] + gamma * next_values[t] - values[t]
        running = delta + gamma * gae_lambda * (keep[t] * running if t < len(rewards) - 1
                                                else 0.0)
        adv[t] = running
    return adv, adv + values


def test_identify_names_two_differences():
    with pytest.raises(Mismatch):
        check_gae(_two_bugs_gae, exclude=("both_flags",), max_examples=FEW)
    report = identify(_two_bugs_gae, "gae", max_examples=FEW)
    reference = {"truncation": "bootstrap", "bootstrap_terminal_last_row": False}
    assert report.verdict == "match_except"
    assert (reference, ("steps with both flags", "a truncated step on the last row"),
            False) in report.except_on
    assert "except on inputs with steps with both flags or with a truncated step on the " \
           "last row" in str(report)
    check_gae(_two_bugs_gae, exclude=("both_flags", "truncated_last_row"), max_examples=FEW)


# -- kinks -----------------------------------------------------------------------------------

def _quarter_gradient_on_the_value_clip_bound(values, old_values, returns, clip_range_vf):
    """A quarter of the unclipped gradient on the exact bound: no autodiff rule gives it."""
    loss, d = value_loss(values, old_values, returns, clip_range_vf)
    if clip_range_vf is not None:
        d = np.where(np.abs(values - old_values) == clip_range_vf, 0.25 * d, d)
    return loss, d


def test_a_difference_only_at_the_exact_clip_bound_is_reported_as_such():
    fn = _quarter_gradient_on_the_value_clip_bound
    with pytest.raises(Mismatch) as info:
        check_value_loss(fn, max_examples=FEW)
    m = info.value
    assert m.output == "d_values" and m.kink_only
    assert "confined to exact kinks" in str(m) and "('value_clip_boundary',)" in str(m)
    check_value_loss(fn, exclude=("value_clip_boundary",), max_examples=FEW)
    report = identify(fn, "value_loss", max_examples=FEW)
    assert report.except_on[0][1] == ("V - V_old exactly at +-clip_range_vf",)


def _jax_style_value_loss(values, old_values, returns, clip_range_vf):
    """PureJaxRL's clipped value loss (no 0.5) with JAX's subgradients written out: on the
    exact bound ``jnp.maximum`` gives half to each tied term and ``jnp.clip`` (``minimum(maximum(
    x, lo), hi)``) passes half: 0.5 + 0.5 * 0.5 of the unclipped gradient."""
    if clip_range_vf is None:
        return value_loss(values, old_values, returns, None)
    delta = values - old_values
    clipped = old_values + np.clip(delta, -clip_range_vf, clip_range_vf)
    err, err_clip = values - returns, clipped - returns
    sq, sq_clip = err ** 2, err_clip ** 2
    through_clip = np.where(np.abs(delta) < clip_range_vf, 1.0,
                            np.where(np.abs(delta) == clip_range_vf, 0.5, 0.0))
    w_unclipped = np.where(sq > sq_clip, 1.0, np.where(sq == sq_clip, 0.5, 0.0))
    grad = w_unclipped * 2 * err + (1.0 - w_unclipped) * 2 * err_clip * through_clip
    return float(np.mean(np.maximum(sq, sq_clip))), grad / values.size


def test_identify_names_the_jax_subgradient_on_the_value_clip_bound():
    fn = _jax_style_value_loss
    with pytest.raises(Mismatch) as info:
        check_value_loss(fn, max_examples=FEW)
    assert info.value.kink_only
    check_value_loss(fn, convention={"value_clip_boundary_grad": 0.75}, max_examples=FEW)
    report = identify(fn, "value_loss", max_examples=FEW)
    assert report.verdict == "match"
    assert {m["value_clip_boundary_grad"] for m in report.matches} == {0.75}
    assert "purejaxrl" not in str(report)  # (its value_loss_scale is 0.5)


# -- precision follows the conditioning ------------------------------------------------------

def _float32_normalize(advantages):
    a = np.asarray(advantages, np.float32)
    if a.size < 2:
        return a.copy()
    return (a - a.mean(dtype=np.float32)) / (a.std(ddof=1, dtype=np.float32) + np.float32(1e-8))


def test_a_float32_normalizer_with_a_tiny_std_is_rounding_not_logic():
    constant = np.full(7, 0.1, np.float32)
    assert abs(_float32_normalize(constant)[0]) > 0.4  # 0 in exact arithmetic: 1/eps shows
    check_normalize_advantages(_float32_normalize, dtype="float32", max_examples=FEW)
    check_normalize_advantages(_float32_normalize, dtype="float32",
                               fixed={"advantages": constant})
    with pytest.raises(Mismatch) as info:  # float64 inputs: a float32 computation, rounding
        check_normalize_advantages(_float32_normalize, max_examples=FEW)
    assert info.value.precision
    assert identify(_float32_normalize, "normalize_advantages",
                    max_examples=FEW).verdict == "match_float32"


# -- one set of options ----------------------------------------------------------------------

def test_golden_vectors_and_identify_try_the_same_options():
    for quantity in QUANTITIES:
        assert set(OPTION_KEYS[quantity]) == {o.name for o in options_for(quantity)}, quantity


def test_ppo_ref_check_names_k1_for_a_policy_loss_case(tmp_path):
    vec = tmp_path / "vec"
    vectors.write_vectors(str(vec), backend="spec")
    cases = {}
    for case in vectors.load_cases(str(vec)):
        if case["kind"] == "policy_loss":
            out = vectors.compute_outputs(case, backend="spec")
            inputs, settings = case["inputs"], case["settings"]
            weights, _ = aggregation_weights(  # the weights of the case's means
                settings.get("aggregation", "token-mean"), inputs["new_log_probs"].size,
                inputs.get("weights"), inputs.get("sequences"), settings.get("aggregation_norm"))
            out["approx_kl"] = approx_kl(inputs["old_log_probs"], inputs["new_log_probs"], "k1",
                                         weights=weights)
            cases[case["name"]] = {"outputs": vectors.encode(out)}
    path = tmp_path / "k1.json"
    path.write_text(json.dumps({"format": vectors.RESULTS_FORMAT, "implementation": "k1",
                                "cases": cases}))
    rows = [r for r in vectors.check_results(str(vec), str(path), allow_missing=True)
            if r["kind"] == "policy_loss"]
    assert rows and all(r["status"] == "FAIL" for r in rows)
    for r in rows:
        assert any("kl_estimator='k1'" in a for a in r["alternatives"]), r


def _k2_policy_loss(new_log_probs, old_log_probs, advantages, clip_range):
    """The reference surrogate with approx_kl reported as k2 = mean(r^2) / 2 (OpenRLHF's
    ``kl_estimator="k2"``, verl's ``kl_penalty="mse"``), written out."""
    loss, grad, info = policy_loss(new_log_probs, old_log_probs, advantages, clip_range)
    r = np.asarray(new_log_probs, np.float64) - np.asarray(old_log_probs, np.float64)
    return loss, grad, {"clip_fraction": info["clip_fraction"],
                        "approx_kl": 0.5 * float(np.mean(r * r))}


def test_identify_names_the_k2_estimator():
    with pytest.raises(Mismatch) as info:
        check_policy_loss(_k2_policy_loss, max_examples=FEW)
    assert info.value.output == "approx_kl"
    assert any("kl_estimator='k2'" in a for a in info.value.alternatives)
    check_policy_loss(_k2_policy_loss, convention={"kl_estimator": "k2"}, max_examples=FEW)
    report = identify(_k2_policy_loss, "policy_loss", max_examples=FEW)
    assert report.verdict == "match"
    assert {m["kl_estimator"] for m in report.matches} == {"k2"}
