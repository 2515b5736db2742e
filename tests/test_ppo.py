"""PPO update and trainer: KL stop rules, ratio 1, schedules, minibatch coverage, learning."""
import math

import numpy as np
import pytest

from ppo_ref.config import PPOConfig
from ppo_ref.kernels import gae
from ppo_ref.ppo import PPOTrainer, progress_remaining
from ppo_ref.spec.update import Minibatch, minibatch_loss, run_epochs
from ppo_ref.spec.update import row_minibatches as shuffled_minibatch_indices


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

    def evaluate(params, idx):
        new = old[idx] + params["s"][0] * x[idx]
        values = np.full(len(idx), params["v"][0])
        kls.append(float(np.mean(np.expm1(new - old[idx]) - (new - old[idx]))))
        return new, np.zeros(len(idx)), values, idx

    def backward(params, idx, d_log_probs, d_entropy, d_values):
        return {"s": np.array([np.sum(d_log_probs * x[idx])]), "v": np.array([np.sum(d_values)])}

    def make_minibatches(perm_rng):
        def minibatches(epoch):
            for idx in shuffled_minibatch_indices(perm_rng, B, MB):
                yield Minibatch(old[idx], adv[idx], ret[idx], old_values[idx], idx)
        return minibatches
    params = {"s": np.zeros(1), "v": np.zeros(1)}
    return params, evaluate, backward, make_minibatches, kls


def _run(rule, target_kl, n_epochs=5, lr=0.05):
    from ppo_ref.optim import adam_init
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
def test_minibatch_indices_cover_every_row_once(n_rows, batch):
    chunks = shuffled_minibatch_indices(np.random.default_rng(0), n_rows, batch)
    allidx = np.concatenate(chunks)
    np.testing.assert_array_equal(np.sort(allidx), np.arange(n_rows))
    assert all(len(c) == batch for c in chunks[:-1]) and 0 < len(chunks[-1]) <= batch


def test_trainer_epochs_visit_each_rollout_row_exactly_once():
    cfg = PPOConfig.zoo_cartpole(n_steps=16, batch_size=48, n_epochs=3)  # 128 rows, last chunk 32
    tr = PPOTrainer("CartPole-v1", cfg, seed=0)
    rollout = tr.collect_rollout()
    seen = []
    original = tr.policy._evaluate_rows  # what evaluate and the update's own passes run

    def recording(params, net, x, actions, *buffers):
        seen.append(x.copy())
        return original(params, net, x, actions, *buffers)
    tr.policy._evaluate_rows = recording
    stats = tr.update(rollout)
    assert stats["n_epochs_run"] == 3 and stats["n_gradient_steps"] == 3 * 3
    rows = rollout.observations.reshape(128, -1)
    key = {r.tobytes(): i for i, r in enumerate(rows)}
    assert len(key) == 128  # rows are distinct
    for epoch in range(3):
        batch = np.concatenate(seen[3 * epoch:3 * epoch + 3])
        idx = sorted(key[r.tobytes()] for r in batch)
        assert idx == list(range(128))


# -- ratio 1, schedules, determinism ------------------------------------------------------------

@pytest.mark.parametrize("compute_dtype", ["float64", "float32"])
def test_first_minibatch_of_each_update_has_ratio_exactly_one(compute_dtype):
    cfg = PPOConfig.zoo_cartpole(n_epochs=2, compute_dtype=compute_dtype)
    tr = PPOTrainer("CartPole-v1", cfg, seed=1)
    ratios = []
    tr.learn(256 * 6, lambda t, s: ratios.append(s["first_max_abs_log_ratio"]))
    assert ratios == [0.0] * 6
    # and directly: recompute the rollout's log-probs with a training-size batch
    r = tr.collect_rollout()
    idx = np.random.default_rng(0).permutation(256)
    ev = tr.policy.evaluate(tr.params, r.observations.reshape(256, -1)[idx], r.actions.reshape(256)[idx])
    np.testing.assert_array_equal(np.exp(ev.log_probs - r.log_probs.reshape(256)[idx]), 1.0)


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

@pytest.mark.slow
def test_cartpole_zoo_settings_solve_within_100k_steps():
    """The README's default run: CartPole-v1, rl-zoo settings, seed 0, 100k steps."""
    tr = PPOTrainer("CartPole-v1", PPOConfig.zoo_cartpole(), seed=0)
    tr.learn(100_000)
    last20 = list(tr.recent_returns)[-20:]
    assert len(last20) == 20
    assert np.mean(last20) >= 475.0, np.mean(last20)


@pytest.mark.slow
def test_pendulum_continuous_actions_smoke():
    """Gaussian policy on Pendulum-v1: finite losses and a better return after a short run."""
    cfg = PPOConfig(n_envs=4, n_steps=256, batch_size=256, n_epochs=10, gamma=0.9,
                    gae_lambda=0.95, learning_rate=1e-3, ent_coef=0.0, clip_range=0.2)
    tr = PPOTrainer("Pendulum-v1", cfg, seed=0)
    returns = []
    stats = []

    def cb(t, s):
        stats.append(s)
        returns.extend(ep[1] for ep in t.last_episodes)
    tr.learn(40_000, cb)
    assert all(math.isfinite(s["policy_loss"]) and math.isfinite(s["value_loss"]) for s in stats)
    first, last = np.mean(returns[:12]), np.mean(returns[-12:])
    assert last > first + 150, (first, last)


def test_run_epochs_one_buffer_params_updated_in_place_same_trajectory():
    """The fast run_epochs (one-buffer params) copies the caller's params and moments once and
    updates its copies in place at every step: the same parameters at every step as the spec
    run_epochs on plain dicts (one-entry arrays: the global norms are summed alike, so the bits
    agree), and the caller's params and state are not written."""
    from ppo_ref.fast import update
    from ppo_ref.fast.flat import flatten_arrays
    from ppo_ref.optim import adam_init
    cfg = PPOConfig(n_steps=B, batch_size=MB, n_epochs=3)
    results = []
    for flat in (False, True):
        params, evaluate, backward, make_mb, _ = _synthetic()
        seen = []

        def recording(p, idx, evaluate=evaluate, seen=seen):
            seen.append((p["s"][0], p["v"][0], p))  # values now; the dict kept alive
            return evaluate(p, idx)
        run = run_epochs
        if flat:  # params and gradients in one buffer each: the fast update
            params = flatten_arrays(params)
            backward = (lambda p, idx, *d, backward=backward:
                        flatten_arrays(backward(p, idx, *d), p.layout))
            run = update.run_epochs
        state = adam_init(params)
        before = {k: v.copy() for k, v in params.items()}
        m_before = {k: v.copy() for k, v in state["m"].items()}
        out_params, out_state, stats = run(
            params, state, config=cfg, lr=0.05, clip_range=0.2,
            minibatches=make_mb(np.random.default_rng(1)), evaluate=recording, backward=backward)
        for k in before:
            assert np.array_equal(params[k], before[k]) and np.array_equal(state["m"][k], m_before[k])
        results.append((seen, dict(out_params), dict(out_state["v"]), stats))
    (seen_d, p_d, v_d, st_d), (seen_f, p_f, v_f, st_f) = results
    assert [s[:2] for s in seen_d] == [s[:2] for s in seen_f] and len(seen_f) == 12
    assert len({id(s[2]) for s in seen_f}) == 1  # the loop's own dict, updated in place
    assert all(s[2] is not params for s in seen_f)  # (a copy: never the caller's params)
    for k in p_d:
        assert np.array_equal(p_d[k], p_f[k]) and np.array_equal(v_d[k], v_f[k])
    assert st_d == st_f


def test_evaluate_rejects_fewer_than_one_episode():
    from ppo_ref.config import PPOConfig
    from ppo_ref.ppo import PPOTrainer
    trainer = PPOTrainer("CartPole-v1", PPOConfig(n_envs=1, n_steps=64, batch_size=64), seed=0)
    with pytest.raises(ValueError, match="n_episodes"):
        trainer.evaluate(0)
    assert len(trainer.evaluate(2)) == 2


@pytest.mark.parametrize("n_rows,n_epochs", [(256, 20), (37, 3), (1, 2)])
def test_epoch_permutations_equal_successive_permutations(n_rows, n_epochs):
    from ppo_ref.fast.update import epoch_permutations
    r1, r2 = np.random.default_rng(11), np.random.default_rng(11)
    want = np.stack([r1.permutation(n_rows) for _ in range(n_epochs)])
    got = epoch_permutations(r2, n_rows, n_epochs)
    assert np.array_equal(got, want) and got.dtype == want.dtype and got.flags.c_contiguous
    assert r1.bit_generator.state == r2.bit_generator.state


@pytest.mark.parametrize("batch_size", [32, 12])  # one and several (uneven) minibatches per epoch
def test_train_on_all_epochs_gather_equals_per_epoch_path(batch_size):
    """Without a KL stop, train_on draws every epoch's permutation at once and gathers once;
    with a target_kl that never fires it takes the per-epoch path: same parameters, Adam
    state, stats and generator state, bit for bit."""
    results = []
    for target_kl in (None, 1e9):
        cfg = PPOConfig(n_envs=2, n_steps=16, batch_size=batch_size, n_epochs=3,
                        target_kl=target_kl)
        tr = PPOTrainer("CartPole-v1", cfg, seed=3)
        rollout = tr.collect_rollout()
        adv, ret = tr.compute_advantages(rollout)
        stats = tr.train_on(rollout, adv, ret)
        results.append((tr.params.flat.copy(), tr.adam_state["m"].flat.copy(),
                        tr.adam_state["v"].flat.copy(), stats,
                        tr.minibatch_rng.bit_generator.state))
        tr.close()
    (p1, m1, v1, s1, g1), (p2, m2, v2, s2, g2) = results
    assert np.array_equal(p1, p2) and np.array_equal(m1, m2) and np.array_equal(v1, v2)
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


def test_a_rollout_too_large_to_gather_for_all_epochs_is_gathered_per_epoch(monkeypatch):
    """Above update.GATHER_ALL_EPOCHS_MAX_BYTES (here 0) the trainers gather epoch by epoch
    (a rollout copied n_epochs times could exhaust memory): the same draws, the same bits."""
    from ppo_ref.fast import update
    from ppo_ref.recurrent_ppo import RecurrentPPOTrainer
    calls = []
    real = update.epoch_permutations

    def counted(*args):
        calls.append(args)
        return real(*args)
    monkeypatch.setattr(update, "epoch_permutations", counted)

    def run(cls, cfg):
        tr = cls("CartPole-v1", cfg, seed=5)
        tr.learn(cfg.n_steps * cfg.n_envs * 2)
        out = (tr.params.flat.copy(), tr.adam_state["m"].flat.copy(),
               tr.minibatch_rng.bit_generator.state)
        tr.close()
        return out
    configs = [(PPOTrainer, PPOConfig(n_envs=2, n_steps=16, batch_size=12, n_epochs=3)),
               (RecurrentPPOTrainer, PPOConfig(n_envs=4, n_steps=8, batch_size=16, n_epochs=3,
                                               lstm_hidden_size=8, net_arch=(8,)))]
    cap = update.GATHER_ALL_EPOCHS_MAX_BYTES
    for cls, cfg in configs:
        calls.clear()
        together = run(cls, cfg)
        assert len(calls) == 2  # one draw of all epochs per update
        calls.clear()
        monkeypatch.setattr(update, "GATHER_ALL_EPOCHS_MAX_BYTES", 0)
        per_epoch = run(cls, cfg)
        monkeypatch.setattr(update, "GATHER_ALL_EPOCHS_MAX_BYTES", cap)
        assert calls == []
        assert np.array_equal(together[0], per_epoch[0]), cls.__name__
        assert np.array_equal(together[1], per_epoch[1]) and together[2] == per_epoch[2]


def test_fast_update_refuses_bad_rollout_rows_as_evaluate_does():
    """Rows the update's one check refuses raise evaluate's error for the rollout's rows
    (flattened time-major: row t * N + n) before any step: the parameters and Adam state stay."""
    cfg = PPOConfig.zoo_cartpole(n_steps=16, batch_size=48, n_epochs=2)  # 128 rows
    tr = PPOTrainer("CartPole-v1", cfg, seed=0)
    rollout = tr.collect_rollout()
    rollout.observations[5, 3, 2] = np.nan  # flat row 5 * 8 + 3
    params = tr.params.flat.copy()
    with pytest.raises(ValueError, match=r"^obs must be finite; row 43 is not$"):
        tr.update(rollout)
    assert np.array_equal(tr.params.flat, params) and tr.adam_state["t"] == 0
