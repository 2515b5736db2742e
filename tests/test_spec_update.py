"""The readable update (ppo_ref.spec.update) and the fast one (ppo_ref.fast.update): gradients of the
spec minibatch loss, fast vs spec run_epochs on a small linear policy, and the minibatch draws."""
import math

import numpy as np
import pytest

from gradcheck import check_gradients
from ppo_ref.fast import update
from ppo_ref.config import PPOConfig
from ppo_ref.fast.flat import flatten_arrays
from ppo_ref.spec import update as spec
from ppo_ref.spec.optim import adam_init

# -- a linear softmax policy with a linear value head ------------------------------------------

N_ROWS, N_FEATURES, N_ACTIONS, BATCH = 96, 5, 3, 24


def linear_problem(seed=0):
    r = np.random.default_rng(seed)
    x = r.standard_normal((N_ROWS, N_FEATURES))
    params = {"w": 0.3 * r.standard_normal((N_FEATURES, N_ACTIONS)), "b": np.zeros(N_ACTIONS),
              "vw": 0.3 * r.standard_normal(N_FEATURES), "vb": np.zeros(1)}
    logits = x @ params["w"] + params["b"]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    actions = np.array([r.choice(N_ACTIONS, p=row) for row in p])
    old_log_probs = np.log(p[np.arange(N_ROWS), actions])
    advantages = r.standard_normal(N_ROWS)
    returns = r.standard_normal(N_ROWS)
    old_values = x @ params["vw"] + params["vb"][0]

    def evaluate(params, rows):
        xs = x[rows]
        z = xs @ params["w"] + params["b"]
        z = z - z.max(1, keepdims=True)
        log_p = z - np.log(np.exp(z).sum(1, keepdims=True))
        prob = np.exp(log_p)
        entropy = -(prob * log_p).sum(1)
        values = xs @ params["vw"] + params["vb"][0]
        return log_p[np.arange(len(rows)), actions[rows]], entropy, values, (rows, prob, log_p,
                                                                            entropy)

    def backward(params, cache, d_log_probs, d_entropy, d_values):
        rows, prob, log_p, entropy = cache
        onehot = np.eye(N_ACTIONS)[actions[rows]]
        d_z = d_log_probs[:, None] * (onehot - prob)
        if d_entropy is not None:
            d_z += d_entropy[:, None] * (-prob * (log_p + entropy[:, None]))
        xs = x[rows]
        return {"w": xs.T @ d_z, "b": d_z.sum(0), "vw": xs.T @ d_values,
                "vb": np.array([d_values.sum()])}

    def flat_backward(params, cache, *d):
        return flatten_arrays(backward(params, cache, *d), params.layout)

    def minibatches(rng):
        def per_epoch(epoch):
            for rows in spec.row_minibatches(rng, N_ROWS, BATCH):
                yield spec.Minibatch(old_log_probs[rows], advantages[rows], returns[rows],
                                     old_values[rows], rows)
        return per_epoch

    return params, evaluate, backward, flat_backward, minibatches


def test_spec_minibatch_loss_gradients_match_finite_differences():
    """d loss / d (new_log_probs, entropy, values) of the spec minibatch loss, including the
    coefficients and per-minibatch normalization, away from the clip kinks."""
    r = np.random.default_rng(2)
    n = 12
    old = r.standard_normal(n)
    new = old + 0.05 * r.standard_normal(n)  # ratios well inside 1 +- 0.2 (no kink)
    entropy, values = r.uniform(0.5, 1.0, n), r.standard_normal(n)
    adv, ret = r.standard_normal(n), r.standard_normal(n)
    old_values = values + 0.01 * r.standard_normal(n)  # inside clip_range_vf
    for config in (PPOConfig(ent_coef=0.01, vf_coef=0.7, value_loss_scale=0.5),
                   PPOConfig(ent_coef=0.0, clip_range_vf=0.2, value_loss_mode="sb3"),
                   PPOConfig(clip_range_vf=0.2, normalize_advantage=False, ent_coef=0.1)):
        out = spec.minibatch_loss(new, entropy, values, old, adv, ret, old_values,
                                  config=config, clip_range=0.2)
        inputs = {"new": new, "entropy": entropy, "values": values}
        d_entropy = out.d_entropy if out.d_entropy is not None else np.zeros(n)
        grads = {"new": out.d_log_probs, "entropy": d_entropy, "values": out.d_values}
        check_gradients(lambda: spec.minibatch_loss(new, entropy, values, old, adv, ret,
                                                    old_values, config=config,
                                                    clip_range=0.2).loss, inputs, grads)


# -- fast vs spec run_epochs ---------------------------------------------------------------------

RTOL = 1e-10  # the two tiers differ only in the summation order of the global gradient norm


def run_both(config, lr=0.05):
    params, evaluate, backward, flat_backward, minibatches = linear_problem()
    spec_params, spec_state, spec_stats = spec.run_epochs(
        params, adam_init(params), config=config, lr=lr, clip_range=0.2,
        minibatches=minibatches(np.random.default_rng(7)), evaluate=evaluate, backward=backward)
    flat = flatten_arrays(params)
    fast_params, fast_state, fast_stats = update.run_epochs(
        flat, adam_init(flat), config=config, lr=lr, clip_range=0.2,
        minibatches=minibatches(np.random.default_rng(7)), evaluate=evaluate,
        backward=flat_backward)
    return (spec_params, spec_state, spec_stats), (fast_params, fast_state, fast_stats)


@pytest.mark.parametrize("rule, target_kl", [("sb3", None), ("sb3", 0.02), ("cleanrl", 0.04),
                                             ("thrust", 0.01)])
def test_fast_run_epochs_equals_spec_run_epochs(rule, target_kl):
    config = PPOConfig(n_steps=N_ROWS, batch_size=BATCH, n_epochs=6, target_kl=target_kl,
                       kl_stop_rule=rule, max_grad_norm=0.3, ent_coef=0.01)
    (sp, ss, sst), (fp, fs, fst) = run_both(config)
    assert set(sst) == set(fst) == set(spec.STATS_KEYS)
    for key in ("n_epochs_run", "n_gradient_steps", "kl_stopped", "learning_rate", "clip_range"):
        assert sst[key] == fst[key], key
    for key in sst:
        assert fst[key] == pytest.approx(sst[key], rel=RTOL, abs=1e-15), key
    assert sst["kl_stopped"] == (0.0 if target_kl is None else 1.0)  # the rule did fire
    if target_kl is None:
        assert sst["n_gradient_steps"] == 6 * 4
    else:  # stopped after a few steps
        assert 2 <= sst["n_gradient_steps"] < 6 * 4
    assert ss["t"] == fs["t"] == sst["n_gradient_steps"]
    for k in sp:
        np.testing.assert_allclose(fp[k], sp[k], rtol=RTOL, atol=1e-14)
        np.testing.assert_allclose(fs["m"][k], ss["m"][k], rtol=RTOL, atol=1e-14)
        np.testing.assert_allclose(fs["v"][k], ss["v"][k], rtol=RTOL, atol=1e-14)
    assert any(not np.array_equal(sp[k], linear_problem()[0][k]) for k in sp)  # it moved


def test_fast_run_epochs_without_clipping_is_bit_exact():
    config = PPOConfig(n_steps=N_ROWS, batch_size=BATCH, n_epochs=3, max_grad_norm=1e6)
    (sp, ss, sst), (fp, fs, fst) = run_both(config)
    for k in sp:
        np.testing.assert_array_equal(fp[k], sp[k])
    for key in sst:
        assert fst[key] == sst[key] or (math.isnan(fst[key]) and math.isnan(sst[key])), key


def test_fast_run_epochs_refuses_plain_dicts_and_leaves_inputs_alone():
    params, evaluate, backward, flat_backward, minibatches = linear_problem()
    config = PPOConfig(n_steps=N_ROWS, batch_size=BATCH, n_epochs=1)
    with pytest.raises(ValueError, match="FlatArrays.*spec.update.run_epochs"):
        update.run_epochs(params, adam_init(params), config=config, lr=0.01, clip_range=0.2,
                          minibatches=minibatches(np.random.default_rng(0)), evaluate=evaluate,
                          backward=backward)
    flat = flatten_arrays(params)
    before = flat.flat.copy()
    state = adam_init(flat)
    with pytest.raises(ValueError, match="clipped_adam_step"):  # gradients as a plain dict
        update.run_epochs(flat, state, config=config, lr=0.01, clip_range=0.2,
                          minibatches=minibatches(np.random.default_rng(0)), evaluate=evaluate,
                          backward=backward)
    assert np.array_equal(flat.flat, before) and not any(m.any() for m in state["m"].values())


# -- minibatch draws ---------------------------------------------------------------------------

@pytest.mark.parametrize("n_rows, batch_size, n_epochs", [(96, 24, 4), (37, 10, 3), (5, 5, 2)])
def test_row_minibatches_draw_as_the_trainers_do(n_rows, batch_size, n_epochs):
    """One rng.permutation per epoch: the chunks of update.epoch_permutations (the trainers'
    all-epochs path) and the same generator state afterwards."""
    r1, r2 = np.random.default_rng(3), np.random.default_rng(3)
    chunks = [spec.row_minibatches(r1, n_rows, batch_size) for _ in range(n_epochs)]
    perms = update.epoch_permutations(r2, n_rows, n_epochs)
    for e in range(n_epochs):
        assert all(len(c) == batch_size for c in chunks[e][:-1])
        assert np.array_equal(np.concatenate(chunks[e]), perms[e])
    assert r1.bit_generator.state == r2.bit_generator.state


def test_env_minibatches_draw_as_the_recurrent_trainer_does():
    from ppo_ref.recurrent_ppo import env_minibatches
    r1, r2, r3 = (np.random.default_rng(9) for _ in range(3))
    for _ in range(3):
        a = spec.env_minibatches(r1, 8, 2)
        b = env_minibatches(r2, 8, 2)
        assert len(a) == 4 and all(np.array_equal(x, y) for x, y in zip(a, b))
    perms = update.epoch_permutations(r3, 8, 3)
    assert np.array_equal(np.concatenate(a), perms[2])
    assert r1.bit_generator.state == r2.bit_generator.state == r3.bit_generator.state
    with pytest.raises(ValueError, match="per_minibatch"):
        spec.env_minibatches(r1, 8, 3)
