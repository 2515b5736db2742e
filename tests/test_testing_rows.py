"""The row layouts: token-level PPO of LLM fine-tuning (masked_rows) and lists of episodes.

The functions below are written from the usual definitions in LLM-PPO code (verl's
compute_gae_advantage_return and compute_policy_loss, TRL's masked_whiten, OpenRLHF's advantage
normalization), re-typed in NumPy or torch, and checked through layout="masked_rows"."""
import functools
import re
from pathlib import Path

import numpy as np
import pytest

from ppo_ref import gae
from ppo_ref.spec.losses import normalize_advantages, policy_loss, value_loss
from ppo_ref.testing import (Episodes, MaskedRows, Mismatch, check_gae,
                             check_normalize_advantages, check_policy_loss, check_value_loss,
                             identify)

FEW = 40


# -- GAE -------------------------------------------------------------------------------------

def token_gae(token_level_rewards, values, response_mask, *, gamma, gae_lambda):
    """Backward over the tokens; a masked token carries the next value and the running
    advantage through unchanged (multi-turn observation tokens, padding)."""
    nextvalues = np.zeros(values.shape[0])
    lastgaelam = np.zeros(values.shape[0])
    advantages_reversed = []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * gae_lambda * lastgaelam
        m = response_mask[:, t]
        nextvalues = values[:, t] * m + (1 - m) * nextvalues
        lastgaelam = lastgaelam_ * m + (1 - m) * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = np.stack(advantages_reversed[::-1], axis=1)
    return advantages, advantages + values


def right_padded_gae(token_level_rewards, values, response_mask, *, gamma, gae_lambda):
    """The older form: ignores the mask and relies on zeros after the response."""
    L = token_level_rewards.shape[-1]
    lastgaelam = 0.0
    out = []
    for t in reversed(range(L)):
        nextvalues = values[:, t + 1] if t < L - 1 else 0.0
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * gae_lambda * lastgaelam
        out.append(lastgaelam)
    return np.stack(out[::-1], axis=1)


def test_token_level_gae_passes_through_masked_rows():
    check_gae(token_gae, layout="masked_rows", max_examples=FEW)
    check_gae(token_gae, layout="masked_rows", dtype="float32", max_examples=FEW)


def test_a_gae_that_ignores_the_mask_is_caught_with_padding_inside():
    zeros = MaskedRows(pad_value=0.0)
    with pytest.raises(Mismatch) as info:
        check_gae(right_padded_gae, layout=zeros, max_examples=FEW)
    m = info.value
    assert m.example["_rows"] != 0  # the left-aligned arrangement would pass
    assert "as passed to right_padded_gae:" in str(m) and "response_mask = " in str(m)


def test_episodes_layout_with_a_per_episode_function():
    def one_episode(rewards, values, last_r, gamma, lam):
        v = np.append(values, last_r)
        delta = rewards + gamma * v[1:] - v[:-1]
        adv = np.zeros_like(delta)
        running = 0.0
        for t in reversed(range(len(delta))):
            running = delta[t] + gamma * lam * running
            adv[t] = running
        return adv

    def per_episode(rewards, values, bootstrap_values, *, gamma, gae_lambda):
        return [one_episode(r, v, b, gamma, gae_lambda)
                for r, v, b in zip(rewards, values, bootstrap_values)]
    check_gae(per_episode, layout="episodes", max_examples=FEW)


def test_row_layouts_decide_the_bootstrap_options():
    report = identify(token_gae, "gae", layout="masked_rows", max_examples=20)
    assert report.verdict == "match" and len(report.matches) == 1
    assert report.matches[0] == {"truncation": "bootstrap", "bootstrap_terminal_last_row": False}


# -- whitening -------------------------------------------------------------------------------

def openrlhf_normalize(advantages, action_mask):
    num_actions = action_mask.sum()
    mean = (advantages * action_mask).sum() / num_actions
    var = ((advantages - mean) ** 2 * action_mask).sum() / num_actions
    rstd = 1.0 / np.sqrt(np.maximum(var, 1e-8))
    return (advantages - mean) * rstd


def trl_masked_whiten(values, mask):
    def masked_mean(x):
        return (x * mask).sum() / mask.sum()
    mean = masked_mean(values)
    with np.errstate(divide="ignore", invalid="ignore"):
        var = masked_mean((values - mean) ** 2) * (mask.sum() / (mask.sum() - 1))
        return (values - mean) / np.sqrt(var + 1e-8)


OPENRLHF = {"advantage_norm_ddof": 0, "advantage_norm_eps": 1e-4,
            "advantage_norm_eps_placement": "clamp"}


def test_masked_whitening_of_openrlhf_is_torchrls_convention_with_one_element_zero():
    check_normalize_advantages(openrlhf_normalize, layout="masked_rows", convention=OPENRLHF,
                               exclude=("single_element",), max_examples=FEW)
    with pytest.raises(Mismatch) as info:  # one token normalizes to 0, not unchanged
        check_normalize_advantages(openrlhf_normalize, layout="masked_rows",
                                   convention=OPENRLHF, max_examples=FEW)
    assert info.value.example["advantages"].size == 1
    check_normalize_advantages(openrlhf_normalize, layout="masked_rows",
                               convention={**OPENRLHF, "advantage_norm_single_element": "zero"},
                               max_examples=FEW)
    report = identify(openrlhf_normalize, "normalize_advantages", layout="masked_rows",
                      max_examples=FEW)
    assert report.verdict == "match"
    assert report.matches[0] == {**OPENRLHF, "advantage_norm_single_element": "zero"}


TRL = {"advantage_norm_eps_placement": "sqrt"}


def test_trl_masked_whiten_is_the_sqrt_placement_past_one_element():
    # (A - mean) / sqrt(var + 1e-8), var with Bessel's correction: placement "sqrt", ddof 1
    check_normalize_advantages(trl_masked_whiten, layout="masked_rows", convention=TRL,
                               exclude=("single_element",), max_examples=FEW)
    with pytest.raises(Mismatch) as info:  # against / (std + eps): where eps shows
        check_normalize_advantages(trl_masked_whiten, layout="masked_rows",
                                   exclude=("single_element",), max_examples=FEW)
    assert not info.value.precision
    assert "a spread below 1e-3 (where eps shows)" in info.value.properties
    report = identify(trl_masked_whiten, "normalize_advantages", layout="masked_rows",
                      exclude=("single_element",), max_examples=FEW)
    assert report.verdict == "match"
    assert {m["advantage_norm_eps_placement"] for m in report.matches} == {"sqrt"}
    assert all(m["advantage_norm_ddof"] == 1 for m in report.matches)
    # one token: the Bessel factor 1 / (n - 1) makes it NaN
    report = identify(trl_masked_whiten, "normalize_advantages", layout="masked_rows",
                      max_examples=FEW)
    assert report.verdict == "match"
    assert {m["advantage_norm_single_element"] for m in report.matches} == {"NaN"}


# -- the dual-clip policy loss (torch, autograd) ---------------------------------------------

def _verl_policy_loss(aggregation):
    torch = pytest.importorskip("torch")

    def agg(loss_mat, mask):
        if aggregation == "token-mean":
            return (loss_mat * mask).sum() / mask.sum()
        if aggregation == "seq-mean-token-mean":
            return ((loss_mat * mask).sum(-1) / mask.sum(-1)).mean()
        return (loss_mat * mask).sum() / mask.shape[-1]  # seq-mean-token-sum-norm

    def compute_policy_loss(log_prob, old_log_prob, advantages, response_mask, cliprange,
                            clip_ratio_c=3.0):
        log_prob = torch.tensor(log_prob, requires_grad=True)
        old_log_prob, advantages, response_mask = (
            torch.as_tensor(x) for x in (old_log_prob, advantages, response_mask))
        negative_approx_kl = log_prob - old_log_prob
        ratio = torch.exp(negative_approx_kl)
        ppo_kl = (-negative_approx_kl * response_mask).sum() / response_mask.sum()
        pg_losses1 = -advantages * ratio
        pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange, 1 + cliprange)
        clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
        pg_losses3 = -advantages * clip_ratio_c
        clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
        pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
        pg_loss = agg(pg_losses, response_mask)
        pg_clipfrac = ((pg_losses2 > pg_losses1).double() * response_mask).sum() / \
            response_mask.sum()
        (grad,) = torch.autograd.grad(pg_loss, log_prob)
        return pg_loss, grad, {"approx_kl": ppo_kl, "clip_fraction": pg_clipfrac}
    return compute_policy_loss


VERL = {"dual_clip": 3.0, "kl_estimator": "k1", "clip_fraction_mode": "active"}


def test_dual_clip_loss_through_masked_rows():
    # verl counts clip_fraction only where clipping changes the loss ("active")
    check_policy_loss(_verl_policy_loss("token-mean"), layout="masked_rows", convention=VERL,
                      max_examples=FEW)
    with pytest.raises(Mismatch) as info:
        check_policy_loss(_verl_policy_loss("token-mean"), layout="masked_rows",
                          convention={**VERL, "clip_fraction_mode": "outside"},
                          max_examples=FEW)
    assert info.value.output == "clip_fraction"
    report = identify(_verl_policy_loss("token-mean"), "policy_loss", layout="masked_rows",
                      max_examples=FEW)
    assert report.verdict == "match"
    assert report.matches[0] == {"clip_interval": "symmetric", **VERL,
                                 "loss_aggregation": "token-mean"}


def test_a_dual_clip_identify_does_not_try_is_a_convention_too():
    fn = functools.partial(_verl_policy_loss("token-mean"), clip_ratio_c=1.5)
    check_policy_loss(fn, layout="masked_rows", convention={**VERL, "dual_clip": 1.5},
                      skip=("clip_fraction",), max_examples=FEW)
    with pytest.raises(Mismatch):
        check_policy_loss(fn, layout="masked_rows", convention=VERL, skip=("clip_fraction",),
                          max_examples=FEW)
    with pytest.raises(ValueError, match="convention option dual_clip must be > 1"):
        check_policy_loss(fn, layout="masked_rows", convention={"dual_clip": 0.5})


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_loss_aggregations_through_masked_rows(aggregation):
    fn = _verl_policy_loss(aggregation)
    check_policy_loss(fn, layout=MaskedRows(aggregation=aggregation), convention=VERL,
                      skip=("clip_fraction", "approx_kl"), max_examples=FEW)
    with pytest.raises(Mismatch) as info:  # the token mean is another loss on several rows
        check_policy_loss(fn, layout="masked_rows", convention=VERL,
                          skip=("clip_fraction", "approx_kl"), max_examples=FEW)
    assert info.value.output in ("loss", "d_new_log_probs") and info.value.example["_rows"]


def _token_sum_value_loss(aggregation):
    """A masked squared error reduced as verl's ``agg_loss`` does, gradient by hand."""
    def fn(values, old_values, returns, mask, clip_range_vf):
        err = (values - returns) * mask
        per_row = (err ** 2).sum(-1)
        if aggregation == "token-sum":
            scale = np.ones(len(values))
        elif aggregation == "seq-mean-token-sum":
            scale = np.full(len(values), 1.0 / len(values))
        else:  # seq-mean-token-mean
            scale = 1.0 / (len(values) * mask.sum(-1))
        return float((per_row * scale).sum()), 2.0 * err * scale[:, None]
    return fn


@pytest.mark.parametrize("aggregation", ["token-sum", "seq-mean-token-sum",
                                         "seq-mean-token-mean"])
def test_identify_names_the_loss_aggregation(aggregation):
    fn = _token_sum_value_loss(aggregation)
    unclipped = {"clip_range_vf": None}
    check_value_loss(fn, layout=MaskedRows(aggregation=aggregation), fixed=unclipped,
                     max_examples=FEW)
    report = identify(fn, "value_loss", layout=MaskedRows(aggregation=None), fixed=unclipped,
                      max_examples=FEW)
    assert report.verdict == "match"
    assert {m["loss_aggregation"] for m in report.matches} == {aggregation}
    assert {m["value_loss_scale"] for m in report.matches} == {1.0}


def test_value_loss_and_reference_losses_through_rows():
    def masked_value_loss(values, old_values, returns, mask, clip_range_vf):
        loss, d = value_loss(values[mask > 0], old_values[mask > 0], returns[mask > 0],
                             clip_range_vf)
        grad = np.zeros_like(values)
        grad[mask > 0] = d
        return loss, grad
    check_value_loss(masked_value_loss, layout="masked_rows", max_examples=FEW)

    def listed_policy_loss(new, old, adv, clip_range):
        sizes = np.cumsum([len(a) for a in adv])[:-1]
        loss, d, info = policy_loss(np.concatenate(new), np.concatenate(old),
                                    np.concatenate(adv), clip_range)
        return loss, np.split(d, sizes), info
    check_policy_loss(listed_policy_loss, layout="episodes", max_examples=FEW)
    check_normalize_advantages(
        lambda a: np.split(normalize_advantages(np.concatenate(a)),
                           np.cumsum([len(x) for x in a])[:-1]),
        layout=Episodes(), max_examples=FEW)


def test_row_results_of_the_wrong_shape_are_mismatches():
    short = ("long_rollout",)
    with pytest.raises(Mismatch, match=r"shape \(.*\), expected the mask's"):
        check_gae(lambda r, v, m, **k: r[:, :-1], layout="masked_rows", exclude=short,
                  max_examples=5)
    with pytest.raises(Mismatch, match="expected a list of"):
        check_gae(lambda r, v, b, **k: np.zeros(3), layout="episodes", exclude=short,
                  max_examples=5)
    with pytest.raises(ValueError, match="aggregation must be one of"):
        MaskedRows(aggregation="mean")
    with pytest.raises(ValueError, match=r"convention sets loss_aggregation='token-sum', but "
                                         r"layout 'masked_rows' fixes .*MaskedRows\(aggregation"):
        check_value_loss(lambda *a: None, layout="masked_rows",
                         convention={"loss_aggregation": "token-sum"})


def test_the_readme_example_checks_a_token_level_gae_and_value_loss():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S)
                if 'layout="masked_rows"' in b]
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    tests = sorted(name for name in namespace if name.startswith("test_"))
    assert tests == ["test_token_gae", "test_token_value_loss"]
    for name in tests:
        namespace[name]()
