"""gSDE (generalized state-dependent exploration, ppo_ref.spec.distributions.gsde_*): central
finite differences of every gradient, an oracle in the paper's notation, properties, the
rollout's exploration matrices (drawn on the stated steps, kept by checkpoints), a learning smoke
run and the configuration errors. The fast twins against the spec: tests/test_tiers.py."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from early_commands import assert_succeeded, python_call
from gradcheck import check_gradients
from ppo_ref.config import PPOConfig
from ppo_ref.spec import distributions as spec
from ppo_ref.spec.distributions import GSDE_EPS
from ppo_ref.train.ppo import PPOTrainer


def _away_from_zero(rng, shape, low=0.05, high=1.2):
    """``log_std`` entries with ``|theta| >= low``: expln's two branches meet at 0 with a jump
    of ``log1p(eps)``, which a central difference must not straddle."""
    return rng.choice([-1.0, 1.0], shape) * rng.uniform(low, high, shape)


def _inputs(rng, batch=5, latent=4, n_actions=3, full_std=True):
    mean = rng.standard_normal((batch, n_actions))
    log_std = _away_from_zero(rng, (latent, n_actions if full_std else 1))
    features = np.tanh(rng.standard_normal((batch, latent)))
    actions = mean + rng.standard_normal(mean.shape)
    return mean, log_std, features, actions


# --------------------------------------------------------------------------------------------
# gradients: central differences in float64 on the spec tier

@pytest.mark.parametrize("use_expln", [False, True])
@pytest.mark.parametrize("full_std", [True, False])
def test_log_prob_gradients_in_mean_log_std_and_features(full_std, use_expln):
    rng = np.random.default_rng(1 + 2 * full_std + use_expln)
    mean, log_std, features, actions = _inputs(rng, full_std=full_std)
    g = rng.standard_normal(mean.shape[0])

    def f():
        return float(np.dot(g, spec.gsde_log_prob(mean, log_std, features, actions, use_expln)))
    d_mean, d_log_std, d_features = spec.gsde_log_prob_backward(mean, log_std, features, actions,
                                                                g, use_expln)
    check_gradients(f, {"mean": mean, "log_std": log_std, "features": features},
                    {"mean": d_mean, "log_std": d_log_std, "features": d_features})


@pytest.mark.parametrize("use_expln", [False, True])
@pytest.mark.parametrize("full_std", [True, False])
def test_entropy_gradients_in_log_std_and_features(full_std, use_expln):
    rng = np.random.default_rng(11 + 2 * full_std + use_expln)
    _, log_std, features, _ = _inputs(rng, full_std=full_std)
    g = rng.standard_normal(features.shape[0])

    def f():
        return float(np.dot(g, spec.gsde_entropy(log_std, features, 3, use_expln)))
    d_log_std, d_features = spec.gsde_entropy_backward(log_std, features, 3, g, use_expln)
    check_gradients(f, {"log_std": log_std, "features": features},
                    {"log_std": d_log_std, "features": d_features})


def test_std_derivative_on_both_expln_branches():
    """``gsde_std``'s slope through the log-probability's ``d_log_std`` of a one-feature,
    one-action distribution (``phi = 1``: ``var = sigma^2 + eps``) on each branch of expln:
    ``d_log_std = d log p / d var * 2 sigma * sigma'`` with ``sigma' = exp(theta)`` below 0 and
    ``1 / (1 + theta + eps)`` above."""
    mean, features, actions = np.array([[0.2]]), np.array([[1.0]]), np.array([[1.1]])
    for theta in (-0.7, 0.9):
        sigma = math.exp(theta) if theta <= 0 else math.log1p(theta + GSDE_EPS) + 1.0
        slope = math.exp(theta) if theta <= 0 else 1.0 / (1.0 + theta + GSDE_EPS)
        var = sigma * sigma + GSDE_EPS
        d_var = ((1.1 - 0.2) ** 2 / var - 1.0) / (2.0 * var)
        d_log_std = spec.gsde_log_prob_backward(mean, np.array([[theta]]), features, actions,
                                                np.ones(1), True)[1]
        assert d_log_std[0, 0] == pytest.approx(d_var * 2.0 * sigma * slope, rel=1e-13)


# --------------------------------------------------------------------------------------------
# oracle: the paper's notation, one scalar at a time

def _oracle(mean, log_std, features, actions, use_expln):
    """log pi(a | s) and H(s) per row, written out: sigma_ij from theta_ij, the variance of
    a_j = mu_j(s) + sum_i z_i(s) E_ij with E_ij ~ N(0, sigma_ij^2) independent:
    sigma_hat_j(s)^2 = sum_i z_i(s)^2 sigma_ij^2 (+ eps, SB3), then the Normal density."""
    def sigma(theta):
        if use_expln and theta > 0:
            return math.log1p(theta + GSDE_EPS) + 1.0
        return math.exp(theta)
    log_probs, entropies = [], []
    for b in range(mean.shape[0]):
        lp = h = 0.0
        for j in range(mean.shape[1]):
            col = j if log_std.shape[1] > 1 else 0
            var = sum(features[b, i] ** 2 * sigma(log_std[i, col]) ** 2
                      for i in range(features.shape[1])) + GSDE_EPS
            lp += -0.5 * (actions[b, j] - mean[b, j]) ** 2 / var - 0.5 * math.log(
                2 * math.pi * var)
            h += 0.5 * math.log(2 * math.pi * math.e * var)
        log_probs.append(lp)
        entropies.append(h)
    return np.array(log_probs), np.array(entropies)


@pytest.mark.parametrize("use_expln", [False, True])
@pytest.mark.parametrize("full_std", [True, False])
def test_log_prob_and_entropy_equal_the_oracle(full_std, use_expln):
    rng = np.random.default_rng(21)
    mean, log_std, features, actions = _inputs(rng, batch=7, latent=5, full_std=full_std)
    want_lp, want_h = _oracle(mean, log_std, features, actions, use_expln)
    np.testing.assert_allclose(spec.gsde_log_prob(mean, log_std, features, actions, use_expln),
                               want_lp, rtol=1e-13)
    np.testing.assert_allclose(spec.gsde_entropy(log_std, features, 3, use_expln), want_h,
                               rtol=1e-13)


def test_sampled_actions_have_the_stated_variance():
    """Actions ``mean + phi @ E`` over many matrices of :func:`gsde_exploration_matrices` have
    per dimension the mean and variance the log-probability uses (within 5 standard errors)."""
    rng = np.random.default_rng(5)
    n = 20_000
    log_std = rng.uniform(-1.0, 0.5, (4, 2))
    phi = np.tanh(rng.standard_normal((1, 4)))
    mean = np.array([[0.3, -1.0]])
    matrices = spec.gsde_exploration_matrices(rng, log_std, n, 2)
    actions = spec.gsde_action(np.repeat(mean, n, 0), np.repeat(phi, n, 0), matrices)
    var = (phi[0] ** 2) @ np.exp(2 * log_std)
    assert np.all(np.abs(actions.mean(0) - mean[0]) <= 5 * np.sqrt(var / n))
    assert np.all(np.abs(actions.var(0, ddof=1) - var) <= 5 * var * math.sqrt(2 / (n - 1)))


# --------------------------------------------------------------------------------------------
# properties

@given(batch=st.integers(1, 6), latent=st.integers(1, 6), n_actions=st.integers(1, 4),
       use_expln=st.booleans(), seed=st.integers(0, 2**31))
@settings(max_examples=25)
def test_one_std_per_feature_is_the_full_matrix_with_equal_columns(batch, latent, n_actions,
                                                                   use_expln, seed):
    """``log_std [L, 1]`` is ``[L, A]`` with every column equal; its gradient is the row sum."""
    rng = np.random.default_rng(seed)
    mean, column, features, actions = _inputs(rng, batch, latent, n_actions, full_std=False)
    full = np.repeat(column, n_actions, axis=1)
    g = rng.standard_normal(batch)
    np.testing.assert_allclose(spec.gsde_log_prob(mean, column, features, actions, use_expln),
                               spec.gsde_log_prob(mean, full, features, actions, use_expln),
                               rtol=1e-13)
    one = spec.gsde_log_prob_backward(mean, column, features, actions, g, use_expln)
    many = spec.gsde_log_prob_backward(mean, full, features, actions, g, use_expln)
    np.testing.assert_allclose(one[0], many[0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(one[1], many[1].sum(axis=1, keepdims=True), rtol=1e-11,
                               atol=1e-13)
    np.testing.assert_allclose(one[2], many[2], rtol=1e-12, atol=1e-14)
    e_one = spec.gsde_entropy_backward(column, features, n_actions, g, use_expln)
    e_many = spec.gsde_entropy_backward(full, features, n_actions, g, use_expln)
    np.testing.assert_allclose(e_one[0], e_many[0].sum(axis=1, keepdims=True), rtol=1e-11,
                               atol=1e-13)


@given(batch=st.integers(2, 40), latent=st.integers(1, 8), use_expln=st.booleans(),
       seed=st.integers(0, 2**31))
@settings(max_examples=25)
def test_fast_rows_do_not_depend_on_the_other_rows(batch, latent, use_expln, seed):
    """The compiled tier's log-probability and entropy of a row are the same bits in any
    subset of rows (acting on one rollout and evaluating minibatches agree: ratio exactly 1)."""
    from ppo_ref.fast import distributions as fast
    rng = np.random.default_rng(seed)
    mean, log_std, features, actions = _inputs(rng, batch, latent, 2)
    rows = rng.permutation(batch)[:max(1, batch // 3)]
    whole = fast.gsde_log_prob(mean, log_std, features, actions, use_expln)
    part = fast.gsde_log_prob(mean[rows], log_std, features[rows], actions[rows], use_expln)
    assert np.array_equal(whole[rows], part)
    assert np.array_equal(fast.gsde_entropy(log_std, features, 2, use_expln)[rows],
                          fast.gsde_entropy(log_std, features[rows], 2, use_expln))


@given(batch=st.integers(1, 6), latent=st.integers(1, 6), seed=st.integers(0, 2**31))
@settings(max_examples=25)
def test_the_mean_is_the_most_probable_action_and_zero_features_leave_only_eps(batch, latent,
                                                                                seed):
    rng = np.random.default_rng(seed)
    mean, log_std, features, actions = _inputs(rng, batch, latent, 2)
    at_mean = spec.gsde_log_prob(mean, log_std, features, mean)
    assert np.all(at_mean >= spec.gsde_log_prob(mean, log_std, features, actions))
    d_mean = spec.gsde_log_prob_backward(mean, log_std, features, mean, np.ones(batch))[0]
    assert np.all(d_mean == 0.0)
    zero = np.zeros_like(features)
    np.testing.assert_allclose(spec.gsde_entropy(log_std, zero, 2),
                               np.log(2 * np.pi * np.e * GSDE_EPS), rtol=1e-14)
    matrices = spec.gsde_exploration_matrices(rng, log_std, batch, 2)
    np.testing.assert_array_equal(spec.gsde_action(mean, zero, matrices), mean)


def test_errors_name_the_argument():
    rng = np.random.default_rng(0)
    mean, log_std, features, actions = _inputs(rng)
    with pytest.raises(ValueError, match="^features"):
        spec.gsde_log_prob(mean, log_std, features[:, :2], actions)
    with pytest.raises(ValueError, match="^log_std"):
        spec.gsde_log_prob(mean, log_std[:, :2], features, actions)
    with pytest.raises(ValueError, match="^actions"):
        spec.gsde_log_prob(mean, log_std, features, actions[:, :1])
    with pytest.raises(ValueError, match="^log_std is too large"):
        spec.gsde_std(np.full((2, 2), 800.0))
    with pytest.raises(ValueError, match="^exploration_matrices"):
        spec.gsde_action(mean, features, np.zeros((5, 4, 2)))
    with pytest.raises(ValueError, match="^n_envs"):
        spec.gsde_exploration_matrices(rng, log_std, 0, 3)
    with pytest.raises(ValueError, match="^d_entropy"):
        spec.gsde_entropy_backward(log_std, features, 3, np.ones(4))


# --------------------------------------------------------------------------------------------
# the policy and the rollout

def _recording(trainer):
    """Wrap the policy's ``act`` to record, per acting step, the exploration matrices it got
    and the ``(policy_out, actions)`` it returned."""
    seen = []
    act = trainer.policy.act

    def recorded(cparams, obs, state, starts, rng, noise=None):
        acted = act(cparams, obs, state, starts, rng, noise)
        seen.append((noise.copy(), acted.policy_out.copy(), acted.actions.copy()))
        return acted
    trainer.policy.act = recorded
    return seen


@pytest.mark.parametrize("sde_sample_freq, backend", [(3, "fast"), (-1, "spec")])
def test_rollout_draws_the_matrices_on_the_stated_steps(sde_sample_freq, backend):
    cfg = PPOConfig(n_envs=2, n_steps=10, batch_size=20, n_epochs=1, use_sde=True,
                    sde_sample_freq=sde_sample_freq, net_arch=(8,), backend=backend)
    trainer = PPOTrainer("Pendulum-v1", cfg, seed=0)
    seen = _recording(trainer)
    for _ in range(2):
        trainer.collect_rollout()
    assert len(seen) == 20
    head = trainer.policy.head
    for step, (noise, out, actions) in enumerate(seen):
        t = step % 10
        assert noise.shape == (2, 8, 1)
        drawn = t == 0 or (sde_sample_freq > 0 and t % sde_sample_freq == 0)
        if step:
            assert np.array_equal(noise, seen[step - 1][0]) != drawn, step
        mean, phi = out[:, :1], out[:, 1:]
        np.testing.assert_allclose(actions, mean + np.einsum("nl,nla->na", phi, noise),
                                   rtol=1e-13, atol=1e-15)
        assert head.latent_dim == phi.shape[1] == 8
    assert np.array_equal(trainer.collector.exploration_matrices, seen[-1][0])


def test_use_sde_errors_name_the_field():
    with pytest.raises(ValueError, match="use_sde"):
        PPOTrainer("CartPole-v1", PPOConfig(n_envs=1, n_steps=8, batch_size=8, use_sde=True))
    from ppo_ref.train.recurrent_ppo import RecurrentPPOTrainer
    with pytest.raises(ValueError, match="use_sde.*set use_sde=False"):  # how to turn it off
        RecurrentPPOTrainer("Pendulum-v1", PPOConfig(n_envs=1, n_steps=8, batch_size=8,
                                                     use_sde=True))
    from ppo_ref.distributed.config import AsyncActorLearnerConfig
    with pytest.raises(ValueError, match="use_sde.*set use_sde=False"):
        AsyncActorLearnerConfig(ppo=PPOConfig(use_sde=True))
    from ppo_ref.cli.train import zoo_note
    assert "use_sde=True" in zoo_note("Pendulum-v1", None, "mlp")  # the printed settings say so
    assert "use_sde" not in zoo_note("CartPole-v1", None, "mlp")
    import gymnasium as gym
    from ppo_ref.train.policies import make_head
    box = gym.spaces.Box(-1.0, 1.0, (2,))
    for latent_dim in (None, 0):
        with pytest.raises(ValueError, match="^latent_dim"):
            make_head(box, PPOConfig(use_sde=True), spec, latent_dim)


def test_full_std_false_and_log_std_init_shape_the_parameter():
    cfg = PPOConfig(n_envs=1, n_steps=8, batch_size=8, use_sde=True, full_std=False,
                    log_std_init=-2.0, net_arch=(16, 5))
    trainer = PPOTrainer("Pendulum-v1", cfg, seed=0)
    np.testing.assert_array_equal(trainer.params["log_std"], np.full((5, 1), -2.0))
    trainer.close()


def test_exact_resume_with_gsde(resumed_half_way):
    """Stop at 512 of 1024 steps, save, load, continue: the same parameters, exploration
    matrices and acting stream as the uninterrupted run."""
    cfg = PPOConfig(n_envs=2, n_steps=128, batch_size=64, n_epochs=2, use_sde=True,
                    sde_sample_freq=5, net_arch=(16, 16))
    full, part, resumed = resumed_half_way(cfg)
    np.testing.assert_array_equal(resumed.collector.exploration_matrices,
                                  part.collector.exploration_matrices)
    resumed.learn(1024)
    assert set(resumed.params) == set(full.params)
    for k in full.params:
        np.testing.assert_array_equal(resumed.params[k], full.params[k])
    np.testing.assert_array_equal(resumed.collector.exploration_matrices,
                                  full.collector.exploration_matrices)


def test_pendulum_learning_smoke():
    """A few thousand steps of Pendulum-v1 with gSDE: finite losses, a trained ``log_std``,
    new matrices exactly every ``sde_sample_freq`` steps, ratio exactly 1 on the first
    minibatch of every update (fast tier)."""
    cfg = PPOConfig(n_envs=4, n_steps=256, batch_size=256, n_epochs=4, gamma=0.9,
                    learning_rate=1e-3, use_sde=True, sde_sample_freq=4, log_std_init=-1.0)
    trainer = PPOTrainer("Pendulum-v1", cfg, seed=1)
    seen = _recording(trainer)
    stats = []
    trainer.learn(4096, lambda t, s: stats.append(s) or True)
    assert len(stats) == 4 and len(seen) == 4 * 256
    for s in stats:
        assert all(math.isfinite(s[k]) for k in ("loss", "policy_loss", "value_loss", "entropy"))
        assert s["first_max_abs_log_ratio"] == 0.0
    changed = [t for t in range(1, len(seen)) if not np.array_equal(seen[t][0], seen[t - 1][0])]
    assert changed == [t for t in range(1, len(seen)) if t % 4 == 0]
    assert not np.array_equal(trainer.params["log_std"], np.full((64, 1), -1.0))


def test_predict_mode_is_the_clipped_mean_and_sampling_adds_state_dependent_noise():
    cfg = PPOConfig(n_envs=1, n_steps=8, batch_size=8, use_sde=True, log_std_init=0.5,
                    net_arch=(8,))
    trainer = PPOTrainer("Pendulum-v1", cfg, seed=0)
    from ppo_ref.spec.networks import policy_forward
    obs = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, -2.0]])
    net = {k: v for k, v in trainer.params.items() if k != "log_std"}
    np.testing.assert_allclose(trainer.predict(obs, deterministic=True),
                               np.clip(policy_forward(net, obs), -2.0, 2.0), rtol=1e-12)
    before = trainer.predict_rng.bit_generator.state
    sampled = trainer.predict(obs)
    assert trainer.predict_rng.bit_generator.state != before   # a new matrix per row
    assert not np.array_equal(sampled, trainer.predict(obs, deterministic=True))
    trainer.close()


_BLAS_RUN = """
import json, sys
from ppo_ref.config import PPOConfig
from ppo_ref.train.ppo import PPOTrainer
out = {}
for dtype in ("float64", "float32"):
    cfg = PPOConfig(n_envs=4, n_steps=64, batch_size=64, n_epochs=2, use_sde=True,
                    sde_sample_freq=4, net_arch=(64, 64), compute_dtype=dtype)
    trainer = PPOTrainer("Pendulum-v1", cfg, seed=0)
    trainer.learn(512)
    out[dtype] = {k: v.tobytes().hex() for k, v in sorted(trainer.params.items())}
    trainer.close()
json.dump(out, sys.stdout)
"""


def gsde_two_openblas_kernels_run():
    """As the MLP trainer (tests/test_same_bits.py): the actions ``mean + phi @ E`` and the
    gradients of ``log_std`` sum in the code's order, so OpenBLAS's kernel for the CPU
    (Haswell: AVX2 + FMA; Sandybridge: no FMA) changes no parameter bit."""
    import json
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs = []
    for coretype in ("Haswell", "Sandybridge"):
        env = dict(os.environ, OPENBLAS_CORETYPE=coretype, PYTHONPATH=root)
        proc = subprocess.run([sys.executable, "-c", _BLAS_RUN], cwd=root, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs.append(json.loads(proc.stdout))
    assert runs[0] == runs[1]


@pytest.mark.early_command(python_call(gsde_two_openblas_kernels_run), timeout=1200)
def test_fast_gsde_run_is_the_same_bits_under_two_openblas_kernels(early_command):
    """:func:`gsde_two_openblas_kernels_run` in a process of its own, started at the end of
    collection (tests/early_commands.py)."""
    assert_succeeded(early_command)
