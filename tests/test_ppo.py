"""PPO update and trainer: KL stop rules, ratio 1, schedules, minibatch coverage, learning."""
import copy
import math

import numpy as np
import pytest

from ppo_ref import gae
from ppo_ref.config import PPOConfig
from ppo_ref.spec.optim import adam_init
from ppo_ref.spec.update import Minibatch, feedforward_minibatches, minibatch_loss, run_epochs
from ppo_ref.tiers import tier_for
from ppo_ref.train.ppo import PPOTrainer, progress_remaining

from early_commands import assert_succeeded, python_call


# -- a synthetic policy for run_epochs: log-probs shift along a fixed direction -------------------

B, MB = 64, 16  # rows, minibatch size -> 4 minibatches per epoch


def _synthetic(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(B)
    old = np.log(rng.uniform(0.2, 0.8, B))
    adv = rng.standard_normal(B)
    ret = rng.standard_normal(B)
    old_values = rng.standard_normal(B)
    kls = []

    def evaluate(params, data):
        idx = data[0]  # the rows of the minibatch (feedforward_minibatches' observations)
        new = old[idx] + params["s"][0] * x[idx]
        values = np.full(len(idx), params["v"][0])
        kls.append(float(np.mean(np.expm1(new - old[idx]) - (new - old[idx]))))
        return new, np.zeros(len(idx)), values, idx

    def backward(params, idx, d_log_probs, d_entropy, d_values):
        return {"s": np.array([np.sum(d_log_probs * x[idx])]), "v": np.array([np.sum(d_values)])}

    def make_minibatches(perm_rng):
        rows = np.arange(B)
        return feedforward_minibatches(perm_rng, MB, old, adv, ret, old_values, rows, rows)
    params = {"s": np.zeros(1), "v": np.zeros(1)}
    return params, evaluate, backward, make_minibatches, kls


def _run(rule, target_kl, n_epochs=5, lr=0.05):
    params, evaluate, backward, make_mb, kls = _synthetic()
    cfg = PPOConfig(n_steps=B, batch_size=MB, n_epochs=n_epochs, target_kl=target_kl,
                    kl_stop_rule=rule, kl_estimator="k3")
    params, _, stats = run_epochs(params, adam_init(params), config=cfg, lr=lr, clip_range=0.2,
                                  minibatches=make_mb(np.random.default_rng(1)),
                                  evaluate=evaluate, backward=backward)
    return stats, kls


def test_no_target_kl_runs_every_minibatch():
    stats, kls = _run("sb3", None)
    assert stats["n_gradient_steps"] == 5 * 4 and stats["n_epochs_run"] == 5
    assert stats["kl_stopped"] == 0.0 and len(kls) == 20


def test_sb3_rule_skips_the_step_and_stops_all_epochs():
    _, kls = _run("sb3", None)
    target = 0.3 * max(kls)
    j = next(i for i, k in enumerate(kls) if k > 1.5 * target)  # first offending minibatch
    stats, kls_stop = _run("sb3", target)
    # identical trajectory up to j; minibatch j is evaluated but its step skipped
    assert kls_stop == kls[:j + 1]
    assert stats["n_gradient_steps"] == j and stats["kl_stopped"] == 1.0
    assert stats["n_epochs_run"] == j // 4 + 1


def test_rule_variants_with_a_tiny_target():
    tiny = 1e-14
    # minibatch 0 has KL 0 (ratio 1): stepped; minibatch 1 exceeds -> skipped, everything stops
    s, _ = _run("sb3", tiny)
    assert (s["n_gradient_steps"], s["n_epochs_run"]) == (1, 1)
    # cleanrl: the whole first epoch runs, then the check after the epoch stops
    s, _ = _run("cleanrl", tiny)
    assert (s["n_gradient_steps"], s["n_epochs_run"]) == (4, 1)
    # thrust: checked after the step, leaves only the current epoch: epoch 0 steps on minibatches
    # 0 and 1, each later epoch steps once (its first minibatch already exceeds), all epochs run
    s, _ = _run("thrust", tiny)
    assert (s["n_gradient_steps"], s["n_epochs_run"]) == (2 + 4, 5)
    # skrl: checked before the step, leaves only the current epoch: minibatch 0 of epoch 0 is
    # stepped, then every epoch's first evaluated minibatch exceeds and is skipped
    s, _ = _run("skrl", tiny)
    assert (s["n_gradient_steps"], s["n_epochs_run"], s["kl_stopped"]) == (1, 5, 1.0)


def test_cleanrl_rule_uses_last_minibatch_kl_of_the_epoch():
    _, kls = _run("cleanrl", None)
    target = 0.5 * max(kls)
    e = next(ep for ep in range(5) if kls[4 * ep + 3] > target)
    stats, _ = _run("cleanrl", target)
    assert stats["n_gradient_steps"] == 4 * (e + 1) and stats["n_epochs_run"] == e + 1


def test_minibatch_loss_gradients_scale_with_coefficients():
    rng = np.random.default_rng(0)
    n = 10
    new, old = rng.normal(-1, 0.1, n), rng.normal(-1, 0.1, n)
    ent, val = rng.uniform(0.1, 1, n), rng.normal(size=n)
    adv, ret, oldv = rng.normal(size=n), rng.normal(size=n), rng.normal(size=n)
    base = PPOConfig(vf_coef=0.5, ent_coef=0.01)
    out = minibatch_loss(new, ent, val, old, adv, ret, oldv, config=base, clip_range=0.2)
    np.testing.assert_allclose(out.d_entropy, -0.01 / n * np.ones(n))
    np.testing.assert_allclose(out.d_values, 0.5 * 2 * (val - ret) / n)
    assert out.loss == pytest.approx(out.policy_loss + 0.5 * out.value_loss - 0.01 * out.entropy)
    scaled = minibatch_loss(new, ent, val, old, adv, ret, oldv,
                            config=base.replace(value_loss_scale=0.5), clip_range=0.2)
    np.testing.assert_allclose(scaled.d_values, 0.5 * out.d_values)
    # a linearly annealed clip range of exactly 0 still works (clips to ratio 1)
    zero = minibatch_loss(new, ent, val, old, adv, ret, oldv, config=base, clip_range=0.0)
    assert math.isfinite(zero.loss)


# -- minibatches ----------------------------------------------------------------------------------

@pytest.mark.parametrize("n_rows, batch", [(256, 256), (256, 64), (100, 32), (7, 3)])
def test_minibatch_rows_cover_every_row_once_per_epoch(n_rows, batch):
    """feedforward_minibatches: each epoch is one permutation of the rows cut in chunks of
    ``batch`` (the last one smaller when ``batch`` does not divide the rows)."""
    rng = np.random.default_rng(0)
    rows = np.arange(n_rows)
    per_epoch = feedforward_minibatches(rng, batch, *(rows.astype(float),) * 4, rows, rows)
    for epoch in range(2):
        chunks = [mb.data[0] for mb in per_epoch(epoch)]
        np.testing.assert_array_equal(np.sort(np.concatenate(chunks)), rows)
        assert all(len(c) == batch for c in chunks[:-1]) and 0 < len(chunks[-1]) <= batch
        for mb in per_epoch(epoch):  # every field holds the same rows
            np.testing.assert_array_equal(mb.old_log_probs, mb.data[1])


def test_trainer_epochs_visit_each_rollout_row_exactly_once():
    """Each epoch of an update evaluates every row of the rollout exactly once, in minibatches
    drawn from one permutation per epoch of the trainer's minibatch generator."""
    cfg = PPOConfig.zoo_cartpole(n_steps=16, batch_size=48, n_epochs=3)  # 128 rows, last chunk 32
    tr = PPOTrainer("CartPole-v1", cfg, seed=0)
    rollout = tr.collect_rollout()
    seen = []
    evaluate = tr.policy.evaluate  # what run_epochs calls for each minibatch

    def recording(params, data):
        seen.append(data[0].copy())
        return evaluate(params, data)
    tr.policy.evaluate = recording
    expected_rng = copy.deepcopy(tr.minibatch_rng)
    stats = tr.update(rollout)
    assert stats["n_epochs_run"] == 3 and stats["n_gradient_steps"] == 3 * 3 and len(seen) == 9
    rows = rollout.observations.reshape(128, -1)
    key = {r.tobytes(): i for i, r in enumerate(rows)}
    assert len(key) == 128  # rows are distinct
    for epoch in range(3):
        order = [key[r.tobytes()] for r in np.concatenate(seen[3 * epoch:3 * epoch + 3])]
        np.testing.assert_array_equal(order, expected_rng.permutation(128))
    assert tr.minibatch_rng.bit_generator.state == expected_rng.bit_generator.state
    tr.close()


# -- ratio 1, schedules, determinism ------------------------------------------------------------

@pytest.mark.parametrize("backend, compute_dtype", [("fast", "float64"), ("fast", "float32"),
                                                    ("spec", "float64")])
def test_first_minibatch_of_each_update_has_ratio_one(backend, compute_dtype):
    """The behaviour log-probs recorded while acting are what the update recomputes: exactly on
    the compiled tier (per-row arithmetic that does not depend on the other rows of a call), to
    the last bit or so on the readable tier (BLAS products of other shapes)."""
    cfg = PPOConfig.zoo_cartpole(n_epochs=2, compute_dtype=compute_dtype, backend=backend)
    tr = PPOTrainer("CartPole-v1", cfg, seed=1)
    ratios = []
    tr.learn(256 * 6, lambda t, s: ratios.append(s["first_max_abs_log_ratio"]))
    if backend == "fast":
        assert ratios == [0.0] * 6
    else:
        assert len(ratios) == 6 and max(ratios) <= 1e-14, ratios
    # and directly: recompute the rollout's log-probs with a training-size batch
    r = tr.collect_rollout()
    idx = np.random.default_rng(0).permutation(256)
    log_probs = tr.policy.evaluate(tr.params, (r.observations.reshape(256, -1)[idx],
                                               r.actions.reshape(256)[idx]))[0]
    log_ratio = log_probs - r.log_probs.reshape(256)[idx]
    if backend == "fast":
        np.testing.assert_array_equal(np.exp(log_ratio), 1.0)
    else:
        assert np.abs(log_ratio).max() <= 1e-14
    tr.close()


@pytest.mark.parametrize("progress", ["after_rollout", "before_rollout"])
def test_linear_annealing_of_lr_and_clip_range(progress):
    cfg = PPOConfig.zoo_cartpole(n_epochs=1, schedule_progress=progress)
    tr = PPOTrainer("CartPole-v1", cfg, seed=0)
    seen = []
    tr.learn(256 * 4, lambda t, s: seen.append((s["timesteps"], s["learning_rate"], s["clip_range"])))
    for steps, lr, clip in seen:
        done = steps if progress == "after_rollout" else steps - 256
        assert lr == pytest.approx(1e-3 * (1 - done / 1024), abs=1e-15)
        assert clip == pytest.approx(0.2 * (1 - done / 1024), abs=1e-15)
    assert seen[-1][1] == (0.0 if progress == "after_rollout" else 1e-3 * 0.25)
    assert progress_remaining(0, 1000) == 1.0 and progress_remaining(2000, 1000) == 0.0


def test_constant_schedule_keeps_values():
    cfg = PPOConfig(n_envs=2, n_steps=32, batch_size=64, n_epochs=1)
    tr = PPOTrainer("CartPole-v1", cfg, seed=0)
    seen = []
    tr.learn(128, lambda t, s: seen.append((s["learning_rate"], s["clip_range"])))
    assert seen == [(3e-4, 0.2)] * 2


def test_same_seed_is_bit_identical_and_other_seed_differs():
    cfg = PPOConfig.zoo_cartpole(n_epochs=2)

    def run(seed):
        rows = []
        tr = PPOTrainer("CartPole-v1", cfg, seed=seed)
        tr.learn(2048, lambda t, s: rows.append((s["policy_loss"], s["value_loss"], s["approx_kl"])))
        return rows, tr.params
    a, pa = run(0)
    b, pb = run(0)
    c, _ = run(1)
    assert a == b and all(np.array_equal(pa[k], pb[k]) for k in pa)
    assert a != c


def test_advantages_use_the_config_conventions():
    cfg = PPOConfig.zoo_cartpole(truncation="terminate", bootstrap_terminal_last_row=True)
    tr = PPOTrainer("CartPole-v1", cfg, seed=0)
    r = tr.collect_rollout()
    adv, ret = tr.compute_advantages(r)
    want = gae(r.rewards, r.values, r.terminated, r.truncated, r.last_values, r.final_values,
               gamma=0.98, gae_lambda=0.8, truncation="terminate", bootstrap_terminal_last_row=True)
    np.testing.assert_array_equal(adv, want[0])
    np.testing.assert_array_equal(ret, want[1])


def test_stats_are_reported_and_finite():
    tr = PPOTrainer("CartPole-v1", PPOConfig.zoo_cartpole(n_epochs=2), seed=0)
    got = []
    tr.learn(512, lambda t, s: got.append(s))
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction",
                "explained_variance", "grad_norm", "learning_rate", "clip_range", "n_epochs_run",
                "fps", "timesteps"):
        assert math.isfinite(got[-1][key]), key
    assert got[-1]["n_epochs_run"] == 2 and got[-1]["timesteps"] == 512


# -- learning -------------------------------------------------------------------------------------

def cartpole_zoo_run():
    """The README's default run: CartPole-v1, rl-zoo settings, seed 0, 100k steps."""
    tr = PPOTrainer("CartPole-v1", PPOConfig.zoo_cartpole(), seed=0)
    tr.learn(100_000)
    last20 = list(tr.recent_returns)[-20:]
    assert len(last20) == 20
    assert np.mean(last20) >= 475.0, np.mean(last20)


@pytest.mark.slow
@pytest.mark.early_command(python_call(cartpole_zoo_run), timeout=900)
def test_cartpole_zoo_settings_solve_within_100k_steps(early_command):
    """:func:`cartpole_zoo_run` in a process of its own, started at the end of collection
    (tests/early_commands.py)."""
    assert_succeeded(early_command)


@pytest.mark.slow
def test_pendulum_continuous_actions_smoke():
    """Gaussian policy on Pendulum-v1: finite losses and a better return after a short run."""
    cfg = PPOConfig(n_envs=4, n_steps=256, batch_size=256, n_epochs=10, gamma=0.9,
                    gae_lambda=0.95, learning_rate=1e-3, ent_coef=0.0, clip_range=0.2)
    tr = PPOTrainer("Pendulum-v1", cfg, seed=0)
    returns = []
    stats = []

    def cb(t, s):  # stops once the improvement is there (at most the 40k budget)
        stats.append(s)
        returns.extend(ep[1] for ep in t.last_episodes)
        return not (len(returns) >= 24 and np.mean(returns[-12:]) > np.mean(returns[:12]) + 150)
    tr.learn(40_000, cb)
    assert all(math.isfinite(s["policy_loss"]) and math.isfinite(s["value_loss"]) for s in stats)
    first, last = np.mean(returns[:12]), np.mean(returns[-12:])
    assert last > first + 150, (first, last)


def test_run_epochs_leaves_the_callers_state_and_the_tiers_agree():
    """run_epochs returns new parameters and Adam state and never writes the caller's (params,
    moments); with the compiled tier's losses and optimizer it takes the spec's trajectory, bit
    for bit, on the same minibatches."""
    cfg = PPOConfig(n_steps=B, batch_size=MB, n_epochs=3)
    results = []
    for backend in ("spec", "fast"):
        tier = tier_for(backend)
        params, evaluate, backward, make_mb, _ = _synthetic()
        seen = []

        def recording(p, data, evaluate=evaluate, seen=seen):
            seen.append((p["s"][0], p["v"][0]))
            return evaluate(p, data)
        state = adam_init(params)
        before = copy.deepcopy((params, state))
        out_params, out_state, stats = run_epochs(
            params, state, config=cfg, lr=0.05, clip_range=0.2,
            minibatches=make_mb(np.random.default_rng(1)), evaluate=recording,
            backward=backward, losses=tier.losses, optim=tier.optim)
        for k in params:
            assert np.array_equal(params[k], before[0][k])
            assert np.array_equal(state["m"][k], before[1]["m"][k])
            assert np.array_equal(state["v"][k], before[1]["v"][k])
        assert state["t"] == 0 and out_state["t"] == 12 and len(seen) == 12
        assert not np.array_equal(out_params["s"], params["s"])
        results.append((seen, out_params, out_state, stats))
    (seen_s, p_s, st_s, stats_s), (seen_f, p_f, st_f, stats_f) = results
    assert seen_s == seen_f
    for k in p_s:
        assert np.array_equal(p_s[k], p_f[k]) and np.array_equal(st_s["v"][k], st_f["v"][k])
    assert stats_s == stats_f


def test_evaluate_rejects_fewer_than_one_episode():
    trainer = PPOTrainer("CartPole-v1", PPOConfig(n_envs=1, n_steps=64, batch_size=64), seed=0)
    with pytest.raises(ValueError, match="n_episodes"):
        trainer.evaluate(0)
    assert len(trainer.evaluate(2)) == 2


@pytest.mark.parametrize("batch_size", [32, 12])  # one and several (uneven) minibatches per epoch
def test_a_target_kl_that_never_fires_changes_nothing(batch_size):
    """A KL stop rule that never fires leaves the update as without one: the same parameters,
    Adam state, stats and minibatch generator state, bit for bit."""
    results = []
    for target_kl in (None, 1e9):
        cfg = PPOConfig(n_envs=2, n_steps=16, batch_size=batch_size, n_epochs=3,
                        target_kl=target_kl)
        tr = PPOTrainer("CartPole-v1", cfg, seed=3)
        rollout = tr.collect_rollout()
        adv, ret = tr.compute_advantages(rollout)
        stats = tr.train_on(rollout, adv, ret)
        results.append((tr.params, tr.adam_state, stats, tr.minibatch_rng.bit_generator.state))
        tr.close()
    (p1, a1, s1, g1), (p2, a2, s2, g2) = results
    for k in p1:
        assert np.array_equal(p1[k], p2[k])
        assert np.array_equal(a1["m"][k], a2["m"][k]) and np.array_equal(a1["v"][k], a2["v"][k])
    assert s1["n_gradient_steps"] == 3 * -(-32 // batch_size) and g1 == g2
    for k in s1:
        assert s1[k] == s2[k] or (np.isnan(s1[k]) and np.isnan(s2[k])), k


@pytest.mark.parametrize("bad", ["100", 1.5, 1e5, True, float("nan"), -1, 2 ** 53 + 1, None])
def test_learn_refuses_a_total_timesteps_that_is_not_an_integer_in_range(bad):
    trainer = PPOTrainer("CartPole-v1", PPOConfig(n_envs=2, n_steps=16, batch_size=32), seed=0)
    with pytest.raises(ValueError, match="^total_timesteps"):
        trainer.learn(bad)
    assert trainer.num_timesteps == 0
    trainer.learn(np.int64(32))
    assert trainer.num_timesteps == 32


def test_unknown_env_id_and_module_form_give_value_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="NoSuchEnv-v0"):
        PPOTrainer("NoSuchEnv-v0", PPOConfig(n_envs=2, n_steps=16, batch_size=32))
    with pytest.raises(ValueError, match="no_such_module_xyz"):
        PPOTrainer("no_such_module_xyz:Env-v0", PPOConfig(n_envs=2, n_steps=16, batch_size=32))
    # gymnasium's "module:EnvId" form: the module registers the id when imported
    (tmp_path / "ppo_ref_test_userenv.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('PpoRefUserCartPole-v0', entry_point="
        "'gymnasium.envs.classic_control:CartPoleEnv', max_episode_steps=50)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    trainer = PPOTrainer("ppo_ref_test_userenv:PpoRefUserCartPole-v0",
                         PPOConfig(n_envs=2, n_steps=16, batch_size=32), seed=0)
    trainer.learn(32)
    assert trainer.num_timesteps == 32


@pytest.mark.parametrize("backend", ["fast", "spec"])
def test_a_non_finite_rollout_row_stops_the_update_before_any_step(backend):
    """A NaN in the rollout's observations: the compiled tier raises one FloatingPointError
    naming the update, the epoch and the minibatch that met it; the readable tier, on the same
    rollout, raises ValueError naming the input. Either way no step was taken: the parameters
    and the Adam state are those before the update."""
    cfg = PPOConfig.zoo_cartpole(n_steps=16, batch_size=48, n_epochs=2, backend=backend)
    tr = PPOTrainer("CartPole-v1", cfg, seed=0)  # 128 rows: minibatches of 48, 48, 32
    tr.learn(128)  # one update done: the failing one is update 1
    rollout = tr.collect_rollout()
    rollout.observations[5, 3, 2] = np.nan  # flat row 5 * 8 + 3
    position = int(np.flatnonzero(copy.deepcopy(tr.minibatch_rng).permutation(128) == 43)[0])
    params, adam = copy.deepcopy((tr.params, tr.adam_state))
    if backend == "fast":
        with pytest.raises(FloatingPointError,
                           match=f"^update 1, epoch 0, minibatch {position // 48}: "
                                 f"ppo_ref.fast.networks.actor_critic_forward: non-finite"):
            tr.update(rollout)
    else:
        with pytest.raises(ValueError, match="^obs must be finite"):
            tr.update(rollout)
    assert adam["t"] == tr.adam_state["t"] == 2 * 3
    for k in params:
        assert np.array_equal(tr.params[k], params[k])
        assert np.array_equal(tr.adam_state["m"][k], adam["m"][k])
    tr.close()
