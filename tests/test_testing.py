"""ppo_ref.testing: the checks pass on the reference through every layout, catch planted bugs
with a shrunk example, tell precision from logic, identify conventions; trace_update and
`ppo-ref diff`."""
import json

import numpy as np
import pytest

import ppo_ref
from ppo_ref import cli
from ppo_ref.spec.losses import normalize_advantages, policy_loss, value_loss
from ppo_ref.testing import (Mismatch, check_gae, check_normalize_advantages,
                             check_policy_loss, check_value_loss, check_vtrace, diff_traces,
                             identify, identify_trace, load_trace, trace_update)

FEW = 40


# --- the reference re-expressed in each layout (adapters round-trip) --------------------------

def _gae_from_next_values(rewards, values, next_values, terminated, truncated, *, gamma,
                          gae_lambda):
    # next_values holds V(final_obs) wherever a step ended, and last_values on the last row
    return ppo_ref.gae(rewards, values, terminated, truncated, next_values[-1], next_values,
                       gamma=gamma, gae_lambda=gae_lambda)


def _done_gae(rewards, values, done, last_values, gamma, gae_lambda):
    return ppo_ref.gae(rewards, values, done, np.zeros_like(done), last_values, gamma=gamma,
                       gae_lambda=gae_lambda)


def _gae_from_episode_starts(rewards, values, episode_starts, last_values, last_episode_starts,
                             *, gamma, gae_lambda):
    done = np.concatenate([episode_starts[1:], last_episode_starts[None]], axis=0)
    return _done_gae(rewards, values, done, last_values, gamma, gae_lambda)


def _gae_from_dones(rewards, values, dones, *, gamma, gae_lambda):
    return _done_gae(rewards, values[:-1], dones, values[-1], gamma, gae_lambda)


def _gae_from_discounts(rewards, discounts, values, *, gae_lambda):
    # rlax style: A[t] = r + d V[t+1] - V[t] + d lambda A[t+1]; advantages only
    adv = np.zeros_like(rewards)
    following = np.zeros_like(rewards[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        delta = rewards[t] + discounts[t] * values[t + 1] - values[t]
        following = delta + discounts[t] * gae_lambda * following
        adv[t] = following
    return adv


def _gae_env_major(rewards, values, terminated, truncated, last_values, final_values, *, gamma,
                   gae_lambda):
    adv, ret = ppo_ref.gae(rewards.T, values.T, terminated.T, truncated.T, last_values,
                           final_values.T, gamma=gamma, gae_lambda=gae_lambda)
    return adv.T, ret.T


def _gae_normalized(*args, **kwargs):
    adv, ret = ppo_ref.gae(*args, **kwargs)
    return normalize_advantages(adv), ret


@pytest.mark.parametrize("layout, fn, convention", [
    ("reference", ppo_ref.gae, "reference"),
    ("next_values", _gae_from_next_values, "reference"),
    ("episode_starts", _gae_from_episode_starts, "cleanrl"),
    ("dones", _gae_from_dones, "cleanrl"),
    ("discounts", _gae_from_discounts, "cleanrl"),
    ("env_major", _gae_env_major, "reference"),
    ("normalized_outputs", _gae_normalized, "reference"),
])
def test_check_gae_passes_on_the_reference_in_every_layout(layout, fn, convention):
    check_gae(fn, layout=layout, convention=convention, max_examples=FEW)


def _vtrace_env_major(b, t, rewards, values, terminated, truncated, last_values, final_values,
                      **kw):
    vs, pg = ppo_ref.vtrace(b.T, t.T, rewards.T, values.T, terminated.T, truncated.T,
                            last_values, final_values.T, **kw)
    return vs.T, pg.T


def _vtrace_from_next_values(b, t, rewards, values, next_values, terminated, truncated, **kw):
    return ppo_ref.vtrace(b, t, rewards, values, terminated, truncated, next_values[-1],
                          next_values, **kw)


@pytest.mark.parametrize("layout, fn", [("reference", ppo_ref.vtrace),
                                        ("env_major", _vtrace_env_major),
                                        ("next_values", _vtrace_from_next_values)])
def test_check_vtrace_passes_on_the_reference(layout, fn):
    check_vtrace(fn, layout=layout, max_examples=FEW)


def test_loss_checks_pass_on_the_reference_in_both_dtypes():
    for dtype in ("float64", "any"):
        check_policy_loss(policy_loss, dtype=dtype, max_examples=FEW)
        check_value_loss(value_loss, dtype=dtype, max_examples=FEW)
        check_normalize_advantages(normalize_advantages, dtype=dtype, max_examples=FEW)
    check_gae(ppo_ref.gae, dtype="float32", max_examples=FEW)


@pytest.mark.parametrize("name, check", [("gae", check_gae), ("vtrace", check_vtrace)])
def test_the_reference_is_the_spec_tier(monkeypatch, name, check):
    """The checks compare with ppo_ref.spec (the readable definitions), not with the compiled
    tier, which is itself checked against the spec (tests/test_seam.py)."""
    import ppo_ref.spec.advantages as spec_advantages
    from ppo_ref.tiers import tier_for
    real, calls = getattr(spec_advantages, name), []

    def recording(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(spec_advantages, name, recording)
    check(getattr(tier_for("fast").advantages, name), max_examples=5)
    assert calls


def test_convention_dict_and_bad_arguments():
    check_gae(lambda *a, **k: ppo_ref.gae(*a, truncation="terminate", **k),
              convention={"truncation": "terminate"}, max_examples=FEW)
    with pytest.raises(ValueError, match="unknown option"):
        check_gae(ppo_ref.gae, convention={"truncate": "x"})
    with pytest.raises(ValueError, match="layout 'dones' applies to"):
        check_policy_loss(policy_loss, layout="dones")
    with pytest.raises(ValueError, match="skip names an unknown output"):
        check_policy_loss(policy_loss, skip=("clipfrac",))
    # identify checks its arguments as the checks do (it searched with float64 for any dtype)
    for bad, match in (({"dtype": "float16"}, "dtype must be one of"),
                       ({"max_examples": 0}, "max_examples must be >= 1"),
                       ({"skip": ("clipfrac",)}, "skip names an unknown output")):
        with pytest.raises(ValueError, match=match):
            identify(policy_loss, "policy_loss", **bad)


# --- planted bugs ---------------------------------------------------------------------------

def _loop_gae(next_value_rule, cut_rule=None):
    """A per-env loop GAE whose next value (and optionally trace cut) is given by rules."""
    def fn(rewards, values, terminated, truncated, last_values, final_values, *, gamma,
           gae_lambda):
        T, N = rewards.shape
        adv = np.zeros((T, N))
        for n in range(N):
            following = 0.0
            for t in range(T - 1, -1, -1):
                nv = next_value_rule(t, n, T, values, terminated, truncated, last_values,
                                     final_values)
                done = bool(terminated[t, n] or truncated[t, n])
                cut = done if cut_rule is None else cut_rule(t, n, T, terminated, truncated)
                delta = rewards[t, n] + gamma * nv - values[t, n]
                following = delta + (0.0 if cut or t == T - 1 else
                                     gamma * gae_lambda * following)
                adv[t, n] = following
        return adv, adv + values
    return fn


def _next_after(t, n, T, values, last_values):
    return values[t + 1, n] if t < T - 1 else last_values[n]


def _truncation_first(t, n, T, values, terminated, truncated, last_values, final_values):
    # skrl / torchrl / Sample Factory: a truncated step bootstraps even when it also terminated
    if truncated[t, n]:
        return final_values[t, n]
    if terminated[t, n]:
        return 0.0
    return _next_after(t, n, T, values, last_values)


def _reference_rule(t, n, T, values, terminated, truncated, last_values, final_values):
    if terminated[t, n]:
        return 0.0
    if truncated[t, n]:
        return final_values[t, n]
    return _next_after(t, n, T, values, last_values)


def test_both_flags_bootstrap_bug_issue_example():
    buggy = _loop_gae(_truncation_first)
    ex = dict(rewards=np.zeros((2, 1)), values=np.array([[1.0], [0.0]]),
              terminated=np.array([[True], [False]]), truncated=np.array([[True], [False]]),
              last_values=np.zeros(1), final_values=np.array([[2.0], [0.0]]))
    adv, _ = buggy(*ex.values(), gamma=0.5, gae_lambda=0.95)
    ref, _ = ppo_ref.gae(*ex.values(), gamma=0.5, gae_lambda=0.95)
    # returns = advantages + values: buggy [1, 0], reference [0, 0] (the issue's numbers)
    assert (adv + ex["values"])[:, 0].tolist() == [1.0, 0.0]
    assert (ref + ex["values"])[:, 0].tolist() == [0.0, 0.0]
    with pytest.raises(Mismatch) as info:
        check_gae(buggy, max_examples=100)
    m = info.value
    assert isinstance(m, AssertionError)
    assert m.output == "advantages" and not m.precision
    assert "steps with both flags" in m.properties
    # shrunk and cut down: at most the issue's two rows, one env, zero rewards, and the
    # differing step is the both-flags step
    T, N = m.example["rewards"].shape
    assert T <= 2 and N == 1 and not np.any(m.example["rewards"])
    assert m.index is not None and m.expected != m.actual
    t, n = m.index
    assert m.example["terminated"][t, n] and m.example["truncated"][t, n]
    assert "logic difference" in str(m) and "minimal input" in str(m)


def test_reading_final_values_where_not_truncated_is_caught():
    # reads final_values on a terminal step that also truncated... and on terminal steps
    def reads_final_on_terminal(t, n, T, values, terminated, truncated, last_values,
                                final_values):
        if terminated[t, n] or truncated[t, n]:
            return final_values[t, n]
        return _next_after(t, n, T, values, last_values)
    with pytest.raises(Mismatch) as info:
        check_gae(_loop_gae(reads_final_on_terminal), max_examples=100)
    m = info.value
    t, n = m.index
    assert m.example["terminated"][t, n]  # junk final value read where the reference does not


def test_off_by_one_trace_cut_is_caught():
    def cut_on_next(t, n, T, terminated, truncated):  # uses done[t+1] instead of done[t]
        return t + 1 < T and bool(terminated[t + 1, n] or truncated[t + 1, n])
    with pytest.raises(Mismatch) as info:
        check_gae(_loop_gae(_reference_rule, cut_on_next), max_examples=100)
    assert not info.value.precision
    assert info.value.example["rewards"].shape == (2, 1)  # the smallest rollout with a next step


def test_ddof_zero_normalization_is_caught_and_identified():
    def ddof0(advantages):
        a = np.asarray(advantages, np.float64)
        if a.size <= 1:
            return a.copy()
        return (a - a.mean()) / (a.std() + 1e-8)
    with pytest.raises(Mismatch) as info:
        check_normalize_advantages(ddof0, max_examples=FEW)
    assert info.value.output == "advantages" and not info.value.precision
    assert any("advantage_norm_ddof=0" in alt for alt in info.value.alternatives)
    check_normalize_advantages(ddof0, convention={"advantage_norm_ddof": 0}, max_examples=FEW)
    assert "advantage_norm_ddof=0" in str(identify(ddof0, "normalize_advantages",
                                                   max_examples=FEW))


def test_clip_fraction_with_ge_is_caught_at_the_kink():
    def ge_clip_fraction(new, old, adv, clip_range):
        loss, d, info = policy_loss(new, old, adv, clip_range)
        ratio = np.exp(np.asarray(new, np.float64) - np.asarray(old, np.float64))
        info = dict(info, clip_fraction=float(np.mean(np.abs(ratio - 1.0) >= clip_range)))
        return loss, d, info
    with pytest.raises(Mismatch) as info:
        check_policy_loss(ge_clip_fraction, max_examples=100)
    m = info.value
    assert m.output == "clip_fraction" and not m.precision
    assert "a ratio exactly at 1 +- clip_range" in m.properties
    assert m.example["advantages"].size == 1  # cut down to the element on the kink


def test_missing_output_is_reported_unless_skipped():
    def no_info(new, old, adv, clip_range):
        loss, d, _ = policy_loss(new, old, adv, clip_range)
        return loss, d
    with pytest.raises(Mismatch, match="does not return 'clip_fraction'"):
        check_policy_loss(no_info, max_examples=5)
    check_policy_loss(no_info, skip=("clip_fraction", "approx_kl"), max_examples=FEW)


def test_precision_flag_float32_gamma_vs_logic_bug():
    def float32_gamma(*args, gamma, gae_lambda):
        return ppo_ref.gae(*args, gamma=float(np.float32(gamma)), gae_lambda=gae_lambda)
    with pytest.raises(Mismatch) as info:
        check_gae(float32_gamma, max_examples=100)
    assert info.value.precision and "precision-sized" in str(info.value)
    # float32 inputs: the same implementation is within the float32 tolerance
    check_gae(float32_gamma, dtype="float32", max_examples=FEW)

    def value_loss_half(values, old_values, returns, clip_range_vf):
        loss, d = value_loss(values, old_values, returns, clip_range_vf)
        return 0.5 * loss, 0.5 * d
    with pytest.raises(Mismatch) as info:
        check_value_loss(value_loss_half, max_examples=FEW)
    assert not info.value.precision
    check_value_loss(value_loss_half, convention={"value_loss_scale": 0.5}, max_examples=FEW)


def test_fn_raising_is_a_mismatch():
    def breaks_at_zero_gamma_lambda(*args, gamma, gae_lambda):
        if gamma * gae_lambda == 0.0:
            raise IndexError("index 0 is out of bounds")
        return ppo_ref.gae(*args, gamma=gamma, gae_lambda=gae_lambda)
    with pytest.raises(Mismatch, match="raised IndexError") as info:
        check_gae(breaks_at_zero_gamma_lambda, max_examples=100)
    assert info.value.example["gamma"] * info.value.example["gae_lambda"] == 0.0


# --- identify ------------------------------------------------------------------------------

def _cleanrl_style_gae(rewards, values, episode_starts, last_values, last_episode_starts, *,
                       gamma, gae_lambda):
    """CleanRL's loop, re-expressed: dones are the episode-start flags of the next obs."""
    T = rewards.shape[0]
    adv = np.zeros_like(rewards)
    lastgaelam = 0.0
    for t in reversed(range(T)):
        if t == T - 1:
            nextnonterminal = 1.0 - last_episode_starts
            nextvalues = last_values
        else:
            nextnonterminal = 1.0 - episode_starts[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        adv[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return adv, adv + values


def _thrust_style_gae(rewards, values, terminated, truncated, last_values, final_values, *,
                      gamma, gae_lambda):
    """thrust-rl 0.4's rule, re-expressed: truncation ignored, the last row always bootstraps
    last_values."""
    T = rewards.shape[0]
    adv = np.zeros_like(rewards)
    following = np.zeros_like(rewards[0])
    for t in range(T - 1, -1, -1):
        if t == T - 1:
            delta = rewards[t] + gamma * last_values - values[t]
            following = delta
        else:
            keep = 1.0 - terminated[t]
            delta = rewards[t] + gamma * values[t + 1] * keep - values[t]
            following = delta + gamma * gae_lambda * keep * following
        adv[t] = following
    return adv, adv + values


def test_identify_names_cleanrl():
    report = identify(_cleanrl_style_gae, "gae", layout="episode_starts", max_examples=30)
    assert report.verdict == "match"
    assert str(report).startswith("gae: matches cleanrl/rlax/sample_factory/purejaxrl "
                                  "(truncation='terminate', bootstrap_terminal_last_row=False)")


def test_identify_names_thrust():
    report = identify(_thrust_style_gae, "gae", max_examples=30)
    assert report.verdict == "match"
    assert report.matches[0] == {"truncation": "ignore", "bootstrap_terminal_last_row": True}
    assert "thrust" in str(report)


def test_identify_reports_except_on_both_flags():
    report = identify(_loop_gae(_truncation_first), "gae", max_examples=30)
    assert report.verdict == "match_except"
    assert str(report).startswith("gae: matches reference/sb3/tianshou/torchrl "
                                  "(truncation='bootstrap', bootstrap_terminal_last_row=False) "
                                  "except on inputs with steps with both flags")


def _float32_gamma_bootstrapping_both_flags(env_major: bool):
    """skrl's compute_gae with time_limit_bootstrap, Sample Factory's value_bootstrap,
    re-expressed: gamma meets a float32 flag tensor (so it is rounded to float32), the
    truncation bootstrap gamma * V(final_obs) is added to the reward of every truncated step,
    also one that terminated, and the trace is cut at terminated or truncated."""
    def fn(rewards, values, terminated, truncated, last_values, final_values, *, gamma,
           gae_lambda):
        if env_major:  # Sample Factory: [E, T]
            rewards, values, terminated, truncated, final_values = (
                a.T for a in (rewards, values, terminated, truncated, final_values))
        not_done = (~(terminated | truncated)).astype(np.float32)
        g = np.float32(gamma)  # as a python float times a float32 tensor in torch
        boosted = rewards + g * final_values * truncated
        T = rewards.shape[0]
        adv = np.zeros(rewards.shape)
        following = np.zeros(rewards.shape[1])
        for t in range(T - 1, -1, -1):
            next_values = last_values if t == T - 1 else values[t + 1]
            delta = boosted[t] + (g * not_done[t]) * next_values - values[t]
            following = delta + (g * not_done[t]) * gae_lambda * following
            adv[t] = following
        if env_major:
            return adv.T, (adv + values).T
        return adv, adv + values
    return fn


@pytest.mark.parametrize("env_major", [False, True])
def test_identify_separates_float32_rounding_from_the_both_flags_bug(env_major):
    """A float32 gamma alone is a precision-only match; with the both-flags bootstrap on top,
    identify names the logic difference and says the rest matches up to float32 rounding."""
    fn = _float32_gamma_bootstrapping_both_flags(env_major)
    report = identify(fn, "gae", layout="env_major" if env_major else "reference",
                      max_examples=40)
    assert report.verdict == "match_except"
    assert not report.matches and not report.precision_only
    reference = {"truncation": "bootstrap", "bootstrap_terminal_last_row": False}
    assert report.except_on == [(reference, ("steps with both flags",), True)]
    assert str(report) == ("gae: matches reference/sb3/tianshou/torchrl (truncation='bootstrap', "
                           "bootstrap_terminal_last_row=False) (up to float32 rounding) except "
                           "on inputs with steps with both flags")


def test_identify_float32_gamma_alone_is_a_precision_only_match():
    def float32_gamma(*args, gamma, gae_lambda):
        return ppo_ref.gae(*args, gamma=float(np.float32(gamma)), gae_lambda=gae_lambda)
    report = identify(float32_gamma, "gae", max_examples=40)
    assert report.verdict == "match_float32" and not report.except_on
    assert report.precision_only == [{"truncation": "bootstrap",
                                      "bootstrap_terminal_last_row": False}]
    assert str(report).endswith("(up to float32 rounding)")
    # the same rounding with float64 logic elsewhere is an exact match at float32 precision
    assert identify(float32_gamma, "gae", dtype="float32", max_examples=20).verdict == "match"


def test_identify_no_known_convention():
    def nonsense(advantages):
        return np.asarray(advantages, np.float64) * 2.0
    report = identify(nonsense, "normalize_advantages", max_examples=20)
    assert report.verdict == "none"
    assert isinstance(report.counterexample, Mismatch)
    assert "no known convention matches" in str(report)


# --- trace_update and ppo-ref diff ---------------------------------------------------------

@pytest.mark.parametrize("backend", ["spec", "fast"])
def test_trace_update_is_the_trainers_update(backend):
    """trace_update's intermediates end where the trainers' minibatch update of either tier
    (the golden-vector case ppo_minibatch_update) ends."""
    from ppo_ref.vectors import compute_outputs
    for preset, overrides in (("reference", {}), ("cleanrl", {}),
                              ("reference", {"drop_truncated_steps": True,
                                             "loss_aggregation": "token-sum"})):
        doc = trace_update(preset=preset, **overrides)
        tr, inp = doc["trace"], doc["inputs"]
        case = {"kind": "ppo_minibatch_update", "inputs": {
            "params": inp["params"], "observations": inp["observations"],
            "actions": inp["actions"], "old_log_probs": inp["old_log_probs"],
            "advantages": tr["advantages"].reshape(-1), "returns": tr["returns"].reshape(-1),
            "old_values": inp["old_values"].reshape(-1),
            "terminated": inp["terminated"].reshape(-1),
            "truncated": inp["truncated"].reshape(-1)},
            "settings": {"config": doc["settings"], "n_actions": 2, "learning_rate": 0.01,
                         "clip_range": doc["settings"]["clip_range"]}}
        out = compute_outputs(case, backend=backend)
        for k, v in out["params_after"].items():
            np.testing.assert_allclose(tr["params_after"][k], v, rtol=1e-12, atol=1e-14)
        assert tr["loss"] == pytest.approx(out["loss"], rel=1e-12)
        assert tr["grad_norm"] == pytest.approx(out["grad_norm"], rel=1e-12)


def test_diff_names_the_first_quantity_in_data_flow_order(tmp_path, capsys):
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    trace_update(str(a))
    trace_update(str(b), preset="reference", clip_range_vf=None, max_grad_norm=0.5)
    assert cli.main(["diff", str(a), str(b)]) == 0
    assert "traces agree" in capsys.readouterr().out
    doc = json.loads(b.read_text())
    doc["trace"]["d_values"][0] += 1e-6     # a backward bug: everything after it differs too
    doc["trace"]["grad_norm"] += 1e-3
    b.write_text(json.dumps(doc))
    assert cli.main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("first difference: d_values[0]")
    assert "grad_norm" in out
    rows = diff_traces(load_trace(str(a)), load_trace(str(b)), rtol=1e-4, atol=1e-5)
    assert [r["quantity"] for r in rows] == ["grad_norm"]
    assert cli.main(["diff", str(a), str(tmp_path / "missing.json")]) == 2


def test_identify_trace_names_dropped_truncated_steps(tmp_path, capsys):
    """A trace whose losses drop the truncated steps (only a whole update shows this
    convention) is named, alone and beside a second option; a broken trace is not."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    reference = trace_update(str(a))
    trace_update(str(b), drop_truncated_steps=True)
    assert identify_trace(load_trace(str(b)), reference) == [{"drop_truncated_steps": True}]
    assert cli.main(["diff", str(a), str(b), "--identify"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("first difference: policy_loss")  # GAE and normalization unchanged
    assert "with: drop_truncated_steps=True" in out
    both = trace_update(drop_truncated_steps=True, kl_estimator="k1")
    assert identify_trace(both, reference) == [{"kl_estimator": "k1",
                                                 "drop_truncated_steps": True}]
    assert identify_trace(reference) == [{}]
    doc = json.loads(b.read_text())
    doc["trace"]["grad_norm"] += 1e-3
    b.write_text(json.dumps(doc))
    assert cli.main(["diff", str(a), str(b), "--identify"]) == 1
    assert "no change of up to two convention options gives B" in capsys.readouterr().out
    with pytest.raises(ValueError, match="inputs"):
        identify_trace({"trace": reference["trace"]})


def test_diff_of_two_conventions_parts_at_the_advantages():
    rows = diff_traces(trace_update(preset="reference"), trace_update(preset="cleanrl"))
    assert rows[0]["quantity"] == "advantages"  # truncation as terminal changes GAE first


# -- the library options in the table -------------------------------------------------------

def _clamped_normalize(eps):
    def normalize(advantages):
        a = np.asarray(advantages, np.float64)
        if a.size <= 1:
            return a.copy()
        return (a - a.mean()) / max(float(np.std(a, ddof=1)), eps)
    return normalize


def test_identify_names_the_eps_placement():
    """A Sample Factory style normalization (clamp_min(std, 1e-7)) is told apart from the
    reference's std + 1e-8 and from torchrl's 1e-6 clamp."""
    report = identify(_clamped_normalize(1e-7), "normalize_advantages", max_examples=60)
    assert report.verdict == "match"
    assert report.matches[0] == {"advantage_norm_ddof": 1, "advantage_norm_eps": 1e-7,
                                 "advantage_norm_eps_placement": "clamp",
                                 "advantage_norm_single_element": "unchanged"}
    assert "sample_factory" in str(report)


def test_identify_names_the_dual_clip():
    def dual_clip_loss(new_log_probs, old_log_probs, advantages, clip_range):
        ratio = np.exp(np.asarray(new_log_probs, np.float64) - old_log_probs)
        adv = np.asarray(advantages, np.float64)
        s = np.minimum(ratio * adv, np.clip(ratio, 1 - clip_range, 1 + clip_range) * adv)
        s = np.where(adv < 0, np.maximum(s, 3.0 * adv), s)
        return -float(np.mean(s))
    report = identify(dual_clip_loss, "policy_loss", max_examples=80,
                      skip=("d_new_log_probs", "clip_fraction", "approx_kl"))
    assert report.verdict == "match"
    assert all(m["dual_clip"] == 3.0 for m in report.matches)
