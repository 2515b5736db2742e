"""The steps of the algorithm (ppo_ref.spec.update), which run as written under both tiers: the
gradients of the minibatch loss against central differences (tests/gradcheck.py); the
minibatch loss and the epoch loop given the compiled tier's losses and optimizer against the
spec's own (the loss bit for bit; the epochs within the global norm's summation order); the
minibatch draws against ``rng.permutation`` written out here; a bad loss setting found at the
first minibatch."""
import math
from dataclasses import replace as dataclasses_replace

import numpy as np
import pytest

from gradcheck import check_gradients
from ppo_ref.config import PPOConfig
from ppo_ref.spec import update as spec
from ppo_ref.spec.optim import adam_init
from ppo_ref.spec.recurrent_networks import LSTMStates
from ppo_ref.tiers import tier_for

SPEC, FAST = tier_for("spec"), tier_for("fast")


# -- the minibatch loss ------------------------------------------------------------------------

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


LOSS_CONFIGS = [
    PPOConfig.zoo_cartpole(),
    PPOConfig(ent_coef=0.01, clip_range_vf=0.2, kl_estimator="k1"),
    PPOConfig(clip_range_vf=0.1, value_loss_mode="sb3", normalize_advantage=False),
    PPOConfig(advantage_norm_ddof=0, value_loss_scale=0.5, dual_clip=2.0,
              clip_interval="reciprocal"),
    PPOConfig(ent_coef=0.01, clip_range_vf=0.3, value_loss_mode="huber", huber_delta=0.5,
              clip_range_low=0.1, clip_range_high=0.3, advantage_norm_eps_placement="clamp",
              advantage_norm_eps=1e-6, kl_estimator="k3"),
    PPOConfig(ent_coef=0.01, clip_range_vf=0.2, loss_aggregation="token-sum",
              value_clip_boundary_grad=0.75, advantage_norm_single_element="zero",
              kl_estimator="k2"),
    PPOConfig(ent_coef=0.01, loss_aggregation="seq-mean-token-sum-norm",
              loss_aggregation_norm=32.0),
]


def _loss_inputs(rng, n=64, shape=None):
    """new and old log-probs, entropy, values, advantages, returns, old values (the order of
    minibatch_loss) with the new log-probs near the old ones."""
    new, entropy, values, old, adv, ret, old_values = (rng.standard_normal(n) for _ in range(7))
    new = old + 0.3 * rng.standard_normal(n)
    args = [new, entropy, values, old, adv, ret, old_values]
    return [a.reshape(shape) for a in args] if shape else args


def _assert_same(fast, slow):
    assert type(fast) is type(slow)
    for name in slow._fields:
        a, b = getattr(fast, name), getattr(slow, name)
        if b is None:
            assert a is None, name
        elif isinstance(b, float) and math.isnan(b):
            assert math.isnan(a), name
        else:
            assert np.array_equal(a, b) and np.shape(a) == np.shape(b), name


@pytest.mark.parametrize("config", LOSS_CONFIGS)
@pytest.mark.parametrize("clip_range", [0.2, 0.0])
@pytest.mark.parametrize("n, shape", [(1, None), (64, None), (1000, None), (64, (8, 8))])
def test_minibatch_loss_on_the_compiled_losses_is_the_spec_loss_bit_for_bit(
        rng, config, clip_range, n, shape):
    """The same function given ``losses=ppo_ref.fast.losses``: every scalar and gradient bit
    for bit (1000 rows: NumPy's pairwise sums use several blocks; [8, 8]: 2-d minibatches),
    without and with per-row weights, with and without the log-ratio."""
    args = _loss_inputs(rng, n, shape)
    weights = ((rng.random(n) < 0.7) * rng.choice([1.0, 0.5], n)).reshape(shape or (n,))
    weights.flat[0] = 1.0
    for w in (None, weights):
        for with_log_ratio in (True, False):
            kw = dict(config=config, clip_range=clip_range, with_log_ratio=with_log_ratio,
                      weights=w)
            _assert_same(spec.minibatch_loss(*args, **kw, losses=FAST.losses),
                         spec.minibatch_loss(*args, **kw, losses=SPEC.losses))


@pytest.mark.parametrize("clip_range", [-0.5, float("nan"), float("inf")])
@pytest.mark.parametrize("tier", [SPEC, FAST], ids=["spec", "fast"])
def test_minibatch_loss_rejects_a_bad_clip_range_naming_it(rng, clip_range, tier):
    """A negative or non-finite clip range is refused (not replaced by the tiny stand-in for 0)
    under either tier's losses."""
    args = _loss_inputs(rng, 8)
    with pytest.raises(ValueError, match="clip_range"):
        spec.minibatch_loss(*args, config=PPOConfig(), clip_range=clip_range,
                            losses=tier.losses)


# -- the epoch loop on a linear softmax policy with a linear value head -----------------------

N_ROWS, N_FEATURES, N_ACTIONS, BATCH = 96, 5, 3, 24


def linear_problem(seed=0):
    """``(params, rollout, evaluate, backward)``: a policy ``softmax(x @ w + b)`` with value
    ``x @ vw + vb`` on fixed features, a rollout drawn from it (the arrays
    feedforward_minibatches takes, the observations being the row numbers), and the
    evaluate/backward pair run_epochs calls."""
    r = np.random.default_rng(seed)
    x = r.standard_normal((N_ROWS, N_FEATURES))
    params = {"w": 0.3 * r.standard_normal((N_FEATURES, N_ACTIONS)), "b": np.zeros(N_ACTIONS),
              "vw": 0.3 * r.standard_normal(N_FEATURES), "vb": np.zeros(1)}
    logits = x @ params["w"] + params["b"]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    actions = np.array([r.choice(N_ACTIONS, p=row) for row in p])
    rollout = dict(old_log_probs=np.log(p[np.arange(N_ROWS), actions]),
                   advantages=r.standard_normal(N_ROWS), returns=r.standard_normal(N_ROWS),
                   old_values=x @ params["vw"] + params["vb"][0],
                   observations=np.arange(N_ROWS), actions=actions)

    def evaluate(params, data):
        rows, acts = data
        xs = x[rows]
        z = xs @ params["w"] + params["b"]
        z = z - z.max(1, keepdims=True)
        log_p = z - np.log(np.exp(z).sum(1, keepdims=True))
        prob = np.exp(log_p)
        entropy = -(prob * log_p).sum(1)
        values = xs @ params["vw"] + params["vb"][0]
        return log_p[np.arange(len(rows)), acts], entropy, values, (rows, acts, prob, log_p,
                                                                   entropy)

    def backward(params, cache, d_log_probs, d_entropy, d_values):
        rows, acts, prob, log_p, entropy = cache
        d_z = d_log_probs[:, None] * (np.eye(N_ACTIONS)[acts] - prob)
        if d_entropy is not None:
            d_z += d_entropy[:, None] * (-prob * (log_p + entropy[:, None]))
        xs = x[rows]
        return {"w": xs.T @ d_z, "b": d_z.sum(0), "vw": xs.T @ d_values,
                "vb": np.array([d_values.sum()])}

    return params, rollout, evaluate, backward


def run_on(tier, config, lr=0.05):
    params, rollout, evaluate, backward = linear_problem()
    minibatches = spec.feedforward_minibatches(np.random.default_rng(7), config.batch_size,
                                               **rollout)
    return spec.run_epochs(params, adam_init(params), config=config, lr=lr, clip_range=0.2,
                           minibatches=minibatches, evaluate=evaluate, backward=backward,
                           losses=tier.losses, optim=tier.optim)


RTOL = 1e-10  # the tiers' global gradient norms are sums in different orders (rtol 1e-13)


@pytest.mark.parametrize("rule, target_kl", [("sb3", None), ("sb3", 0.02), ("cleanrl", 0.04),
                                             ("thrust", 0.01), ("skrl", 0.01)])
def test_run_epochs_on_the_compiled_tier_equals_the_spec_tier(rule, target_kl):
    """Six epochs with clipping, an entropy bonus and each KL stop rule (each fires here):
    the same steps taken, parameters, Adam moments and stats within RTOL."""
    config = PPOConfig(n_steps=N_ROWS, batch_size=BATCH, n_epochs=6, target_kl=target_kl,
                       kl_stop_rule=rule, max_grad_norm=0.3, ent_coef=0.01)
    sp, ss, sst = run_on(SPEC, config)
    fp, fs, fst = run_on(FAST, config)
    assert set(sst) == set(fst) == set(spec.STATS_KEYS)
    for key in ("n_epochs_run", "n_gradient_steps", "kl_stopped", "learning_rate", "clip_range"):
        assert sst[key] == fst[key], key
    for key in sst:
        assert fst[key] == pytest.approx(sst[key], rel=RTOL, abs=1e-15), key
    assert sst["kl_stopped"] == (0.0 if target_kl is None else 1.0)  # the rule did fire
    if target_kl is None:
        assert sst["n_gradient_steps"] == 6 * N_ROWS // BATCH
    else:  # stopped after a few steps
        assert 1 <= sst["n_gradient_steps"] < 6 * N_ROWS // BATCH
    assert ss["t"] == fs["t"] == sst["n_gradient_steps"]
    for k in sp:
        for got, want in ((fp[k], sp[k]), (fs["m"][k], ss["m"][k]), (fs["v"][k], ss["v"][k])):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-14, err_msg=k)
    assert any(not np.array_equal(sp[k], linear_problem()[0][k]) for k in sp)  # it moved


def test_run_epochs_without_clipping_is_the_same_bits_on_both_tiers():
    """No clipping (a huge max_grad_norm): the clipped gradients are the gradients, so the
    parameters, the moments and every stat but the reported norm are the same bits."""
    config = PPOConfig(n_steps=N_ROWS, batch_size=BATCH, n_epochs=3, max_grad_norm=1e6)
    sp, ss, sst = run_on(SPEC, config)
    fp, fs, fst = run_on(FAST, config)
    for k in sp:
        for got, want in ((fp[k], sp[k]), (fs["m"][k], ss["m"][k]), (fs["v"][k], ss["v"][k])):
            np.testing.assert_array_equal(got, want, err_msg=k)
    for key in sst:
        if key == "grad_norm":
            assert fst[key] == pytest.approx(sst[key], rel=1e-13)
        else:
            assert fst[key] == sst[key], key


@pytest.mark.parametrize("change, match", [
    (dict(advantage_norm_eps_placement="middle"), "placement"),
    (dict(value_loss_mode="l1"), "mode"),
])
def test_a_bad_loss_setting_raises_at_the_first_minibatch_and_changes_nothing(change, match):
    """run_epochs does not check the loss settings itself: on the spec tier the spec losses'
    own error, naming the setting, is raised at the first minibatch, after its evaluate,
    before any step. (PPOConfig refuses these settings before any tier sees them; the
    compiled losses do not check them again.)"""
    with pytest.raises(ValueError, match=match):
        PPOConfig(**change)
    config = object.__new__(PPOConfig)  # a config that skips PPOConfig's own validation
    config.__dict__.update({**vars(PPOConfig(n_steps=N_ROWS, batch_size=BATCH)), **change})
    params, rollout, evaluate, backward = linear_problem()
    before = {k: v.copy() for k, v in params.items()}
    evaluated = []

    def counting(p, data):
        evaluated.append(len(data[0]))
        return evaluate(p, data)
    minibatches = spec.feedforward_minibatches(np.random.default_rng(0), BATCH, **rollout)
    with pytest.raises(ValueError, match=match):
        spec.run_epochs(params, adam_init(params), config=config, lr=1e-3, clip_range=0.2,
                        minibatches=minibatches, evaluate=counting, backward=backward,
                        losses=SPEC.losses, optim=SPEC.optim)
    assert evaluated == [BATCH]
    assert all(np.array_equal(params[k], before[k]) for k in params)


# -- the minibatch draws -----------------------------------------------------------------------

@pytest.mark.parametrize("n_rows, batch_size, n_epochs", [(96, 24, 4), (37, 10, 3), (5, 5, 2)])
def test_feedforward_minibatches_are_chunks_of_one_permutation_per_epoch(n_rows, batch_size,
                                                                          n_epochs):
    """Epoch e's minibatches are ``rng.permutation(B)`` cut in chunks of ``batch_size`` (the
    last one smaller when it does not divide), one draw per epoch, the rows of every array
    taken at those indices; the generator is left where the draws leave it."""
    r = np.random.default_rng(1)
    arrays = [r.standard_normal(n_rows) for _ in range(4)]
    obs, actions = r.standard_normal((n_rows, 3)), r.integers(0, 4, n_rows)
    drawn, mine = np.random.default_rng(3), np.random.default_rng(3)
    per_epoch = spec.feedforward_minibatches(drawn, batch_size, *arrays, obs, actions)
    for epoch in range(n_epochs):
        perm = mine.permutation(n_rows)
        chunks = [perm[i:i + batch_size] for i in range(0, n_rows, batch_size)]
        got = list(per_epoch(epoch))
        assert len(got) == len(chunks) == math.ceil(n_rows / batch_size)
        for mb, rows in zip(got, chunks):
            assert isinstance(mb, spec.Minibatch) and mb.weights is None
            for a, b in zip(mb[:4], arrays):
                np.testing.assert_array_equal(a, b[rows])
            np.testing.assert_array_equal(mb.data[0], obs[rows])
            np.testing.assert_array_equal(mb.data[1], actions[rows])
    assert drawn.bit_generator.state == mine.bit_generator.state


def test_recurrent_minibatches_are_groups_of_envs_replayed_whole():
    """Epoch e's minibatches are ``rng.permutation(N)`` cut in groups of
    ``envs_per_minibatch``; a group's minibatch holds its envs' whole [T, n] sequences (the
    loss rows flattened time-major, row t * n + j), the LSTM states they had at the rollout's
    start and their episode starts."""
    n_steps, n_envs, per_group = 5, 8, 2
    r = np.random.default_rng(2)
    arrays = [r.standard_normal((n_steps, n_envs)) for _ in range(4)]
    obs, actions = r.standard_normal((n_steps, n_envs, 3)), r.integers(0, 4, (n_steps, n_envs))
    states = LSTMStates(r.standard_normal((2, n_envs, 6)), r.standard_normal((2, n_envs, 6)))
    starts = r.random((n_steps, n_envs)) < 0.3
    drawn, mine = np.random.default_rng(9), np.random.default_rng(9)
    per_epoch = spec.recurrent_minibatches(drawn, per_group, *arrays, obs, actions, states,
                                           starts)
    for epoch in range(3):
        perm = mine.permutation(n_envs)
        got = list(per_epoch(epoch))
        assert len(got) == n_envs // per_group
        for g, mb in enumerate(got):
            envs = perm[g * per_group:(g + 1) * per_group]
            for a, b in zip(mb[:4], arrays):
                assert a.shape == (n_steps * per_group,)
                for t in range(n_steps):
                    for j, n in enumerate(envs):
                        assert a[t * per_group + j] == b[t, n]
            o, acts, state, st = mb.data
            np.testing.assert_array_equal(o, obs[:, envs])
            np.testing.assert_array_equal(acts, actions[:, envs])
            np.testing.assert_array_equal(st, starts[:, envs])
            np.testing.assert_array_equal(state.h, states.h[:, envs])
            np.testing.assert_array_equal(state.c, states.c[:, envs])
    assert drawn.bit_generator.state == mine.bit_generator.state


# -- loss aggregation and dropped truncated steps ----------------------------------------------

SEQUENCES = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 5])   # four sequences (labels need not be 0..)
MASK = np.array([1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0])  # sequence 5 all masked


def _aggregate(mode, x, norm=None):
    """The equations of ``aggregation_weights``, written out per sequence."""
    kept = [b for b in np.unique(SEQUENCES) if MASK[SEQUENCES == b].sum() > 0]
    total = float(np.sum(MASK * x))
    if mode == "token-mean":
        return total / MASK.sum()
    if mode == "seq-mean-token-mean":
        return float(np.mean([np.sum((MASK * x)[SEQUENCES == b]) / MASK[SEQUENCES == b].sum()
                              for b in kept]))
    if mode == "token-sum":
        return total
    if mode == "seq-mean-token-sum":
        return total / len(kept)
    return total / (4.0 if norm is None else norm)  # the longest sequence has 4 rows


@pytest.mark.parametrize("mode, norm", [("token-mean", None), ("seq-mean-token-mean", None),
                                        ("token-sum", None), ("seq-mean-token-sum", None),
                                        ("seq-mean-token-sum-norm", None),
                                        ("seq-mean-token-sum-norm", 3.0)])
def test_loss_aggregations_equal_their_equations(mode, norm):
    """Each part of the minibatch loss is the aggregation of its per-row terms (the elements
    written out with the spec's element functions), and the gradients are the loss's."""
    r = np.random.default_rng(5)
    new, entropy, values, old, adv, ret, old_values = _loss_inputs(r, n=len(MASK))
    config = PPOConfig(normalize_advantage=False, ent_coef=0.01, vf_coef=0.5,
                       loss_aggregation=mode, loss_aggregation_norm=norm)
    out = spec.minibatch_loss(new, entropy, values, old, adv, ret, old_values, config=config,
                              clip_range=0.2, weights=MASK, sequences=SEQUENCES)
    surrogate = np.array([SPEC.losses.clipped_surrogate_element(n - o, a, 0.8, 1.2, 0.2, True,
                                                                0.0)[0]
                          for n, o, a in zip(new, old, adv)])
    p, v, e = -surrogate, (values - ret) ** 2, -entropy
    assert out.policy_loss == pytest.approx(_aggregate(mode, p, norm), rel=1e-14)
    assert out.value_loss == pytest.approx(_aggregate(mode, v, norm), rel=1e-14)
    expected = (_aggregate(mode, p, norm) + 0.5 * _aggregate(mode, v, norm)
                + 0.01 * _aggregate(mode, e, norm))
    assert out.loss == pytest.approx(expected, rel=1e-14)
    mean_weights = spec.aggregation_weights(mode, len(MASK), MASK, SEQUENCES, norm)[0]
    w = MASK if mean_weights is None else mean_weights
    assert out.entropy == pytest.approx(np.sum(w * entropy) / np.sum(w), rel=1e-14)
    inputs = {"new": new, "entropy": entropy, "values": values}
    grads = {"new": out.d_log_probs, "entropy": out.d_entropy, "values": out.d_values}
    check_gradients(lambda: spec.minibatch_loss(
        new, entropy, values, old, adv, ret, old_values, config=config, clip_range=0.2,
        weights=MASK, sequences=SEQUENCES).loss, inputs, grads)


def test_token_mean_is_the_plain_weighted_mean_and_sequences_are_checked():
    assert spec.aggregation_weights("token-mean", 10, MASK, SEQUENCES) == (MASK, 1.0)
    assert spec.aggregation_weights("token-mean", 10) == (None, 1.0)
    w, f = spec.aggregation_weights("seq-mean-token-mean", 10, MASK, SEQUENCES)
    assert f == 1.0 and w.sum() == pytest.approx(3.0)  # three sequences with a valid row
    with pytest.raises(ValueError, match="aggregation must be one of"):
        spec.aggregation_weights("mean", 10)
    with pytest.raises(ValueError, match="sequences must have 10 entries"):
        spec.aggregation_weights("token-sum", 10, None, SEQUENCES[:4])
    with pytest.raises(ValueError, match="norm must be > 0"):
        spec.aggregation_weights("seq-mean-token-sum-norm", 10, norm=0.0)
    with pytest.raises(ValueError, match="positive sum"):
        spec.aggregation_weights("token-sum", 3, np.zeros(3))


def test_truncation_weights_drop_steps_that_ended_by_truncation_only():
    term = np.array([[False, True], [False, False], [True, False]])
    trunc = np.array([[True, True], [False, False], [False, True]])
    assert spec.truncation_weights(term, trunc, False) is None
    np.testing.assert_array_equal(spec.truncation_weights(term, trunc, True),
                                  [[0.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    with pytest.raises(ValueError, match="truncated must have the shape"):
        spec.truncation_weights(term, trunc[:2], True)


def test_dropped_steps_weigh_as_if_removed():
    """Weight 0 on the truncated rows gives the loss of the other rows alone (the advantages
    given as they are: no per-minibatch normalization)."""
    r = np.random.default_rng(8)
    args = _loss_inputs(r, n=12)
    term = r.random(12) < 0.2
    trunc = r.random(12) < 0.4
    trunc[0], term[0] = True, False
    w = spec.truncation_weights(term, trunc, True)
    config = PPOConfig(normalize_advantage=False, ent_coef=0.01, clip_range_vf=0.2,
                       drop_truncated_steps=True)
    out = spec.minibatch_loss(*args, config=config, clip_range=0.2, weights=w)
    keep = w > 0
    alone = spec.minibatch_loss(*(a[keep] for a in args), config=config, clip_range=0.2)
    for name in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
        assert getattr(out, name) == pytest.approx(getattr(alone, name), rel=1e-13), name
    np.testing.assert_allclose(out.d_log_probs[keep], alone.d_log_probs, rtol=1e-13)
    assert np.all(out.d_log_probs[~keep] == 0.0) and np.all(out.d_values[~keep] == 0.0)


def test_minibatches_carry_weights_and_recurrent_sequences():
    r = np.random.default_rng(4)
    n_steps, n_envs = 4, 6
    arrays = [r.standard_normal((n_steps, n_envs)) for _ in range(4)]
    weights = (r.random((n_steps, n_envs)) < 0.7).astype(float)
    obs, actions = r.standard_normal((n_steps, n_envs, 3)), r.integers(0, 4, (n_steps, n_envs))
    states = LSTMStates(r.standard_normal((1, n_envs, 5)), r.standard_normal((1, n_envs, 5)))
    starts = np.zeros((n_steps, n_envs), bool)
    drawn, mine = np.random.default_rng(1), np.random.default_rng(1)
    perm = mine.permutation(n_envs)
    for g, mb in enumerate(spec.recurrent_minibatches(drawn, 2, *arrays, obs, actions, states,
                                                      starts, weights)(0)):
        envs = perm[2 * g:2 * g + 2]
        assert mb.sequences.tolist() == [0, 1] * n_steps  # row t * n + j: sequence j
        np.testing.assert_array_equal(mb.weights, weights[:, envs].reshape(-1))
    flat = [a.reshape(-1) for a in arrays]
    w = weights.reshape(-1)
    drawn, mine = np.random.default_rng(2), np.random.default_rng(2)
    for mb, rows in zip(spec.feedforward_minibatches(drawn, 8, *flat, obs.reshape(-1, 3),
                                                     actions.reshape(-1), w)(0),
                        np.array_split(mine.permutation(n_steps * n_envs), 3)):
        np.testing.assert_array_equal(mb.weights, w[rows])
        assert mb.sequences is None


def test_the_trainer_drops_truncated_steps_only_when_asked():
    """The same rollout trained with drop_truncated_steps: the same bits when nothing was
    truncated, other parameters when something was."""
    from ppo_ref.train.ppo import PPOTrainer
    base = PPOConfig(n_steps=64, batch_size=32, n_epochs=1, net_arch=(8,), n_envs=2,
                     backend="spec", truncation="terminate")
    results = {}
    for drop in (False, True):
        tr = PPOTrainer("CartPole-v1", base.replace(drop_truncated_steps=drop), seed=0)
        rollout = tr.collect_rollout()
        rollout.truncated[:] = False
        rollout.truncated[5, 0] = True
        rollout.terminated[5, 0] = False
        untouched = {k: v.copy() for k, v in tr.params.items()}
        advantages, returns = tr.compute_advantages(rollout)
        plain = dataclasses_replace(rollout, truncated=np.zeros_like(rollout.truncated))
        tr.train_on(plain, advantages, returns)
        results[(drop, "none")] = tr.params
        tr.params, tr.adam_state = untouched, adam_init(untouched)
        tr.minibatch_rng = np.random.default_rng(7)
        tr.train_on(rollout, advantages, returns)
        results[(drop, "one")] = tr.params
    for k in results[(False, "none")]:
        assert np.array_equal(results[(False, "none")][k], results[(True, "none")][k])
    assert any(not np.array_equal(results[(False, "one")][k], results[(True, "one")][k])
               for k in results[(False, "one")])


@pytest.mark.parametrize("tier", [SPEC, FAST], ids=["spec", "fast"])
def test_a_minibatch_whose_rows_all_weigh_zero_is_skipped(tier):
    """Every row of the first minibatch dropped (weight 0, as ``truncation_weights`` gives a
    minibatch of truncated steps): that minibatch takes no step and is not in the stats; the
    update is the one of the other minibatches alone."""
    params, rollout, evaluate, backward = linear_problem()
    weights = np.ones(N_ROWS)
    weights[np.random.default_rng(7).permutation(N_ROWS)[:BATCH]] = 0.0
    config = PPOConfig(n_steps=N_ROWS, batch_size=BATCH, n_epochs=1, drop_truncated_steps=True)

    def minibatches():
        return spec.feedforward_minibatches(np.random.default_rng(7), BATCH, **rollout,
                                            weights=weights)
    with_all = minibatches()
    kw = dict(config=config, lr=0.05, clip_range=0.2, evaluate=evaluate, backward=backward,
              losses=tier.losses, optim=tier.optim)
    got = spec.run_epochs(params, adam_init(params), minibatches=with_all, **kw)
    every = minibatches()
    want = spec.run_epochs(params, adam_init(params),
                           minibatches=lambda epoch: list(every(epoch))[1:], **kw)
    assert got[2]["n_gradient_steps"] == want[2]["n_gradient_steps"] == N_ROWS // BATCH - 1
    assert got[1]["t"] == want[1]["t"]
    for k in params:
        np.testing.assert_array_equal(got[0][k], want[0][k], err_msg=k)
    assert got[2].keys() == want[2].keys()
    for key in got[2]:
        assert got[2][key] == want[2][key] or (math.isnan(got[2][key])
                                               and math.isnan(want[2][key])), key
