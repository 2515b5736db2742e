"""zoo_parity.py: SB3 receives exactly each zoo row's settings (checked on the constructed SB3
model against the PPOConfig), unmappable settings fail before training, and a tiny run on one
MLP and one LSTM row writes the table, the JSON, the cache and the plot."""
import json
import math

import numpy as np
import pytest

import zoo_parity as zp
from ppo_ref.config import PPOConfig
from ppo_ref.zoo import ZOO


def _sb3_modules():
    pytest.importorskip("torch")
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("sb3_contrib")


def _linear_widths(sequential):
    import torch as th
    return tuple(m.out_features for m in sequential if isinstance(m, th.nn.Linear))


def _activations(sequential):
    import torch as th
    return {type(m).__name__ for m in sequential if not isinstance(m, th.nn.Linear)}


def assert_model_has_config(model, config, policy: str, env_id: str):
    """Every setting of ``config`` read back from the SB3 model (not from zp.sb3_settings)."""
    from stable_baselines3.common.vec_env import VecNormalize
    c, env = config, model.get_env()
    assert type(model).__name__ == ("RecurrentPPO" if policy == "lstm" else "PPO")
    assert env.num_envs == c.n_envs
    for name in ("n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "ent_coef",
                 "max_grad_norm", "normalize_advantage", "target_kl"):
        assert getattr(model, name) == getattr(c, name), name
    assert model.vf_coef == pytest.approx(c.vf_coef * c.value_loss_scale)
    for p in (1.0, 0.7, 0.25, 0.0):
        assert model.lr_schedule(p) == pytest.approx(c.learning_rate_at(p), abs=0), p
        assert model.clip_range(p) == pytest.approx(c.clip_range_at(p), abs=0), p
        if c.clip_range_vf is None:
            assert model.clip_range_vf is None
        else:
            assert model.clip_range_vf(p) == pytest.approx(c.clip_range_vf, abs=0)
    assert model.policy.optimizer.defaults["eps"] == c.adam_eps
    assert model.policy.ortho_init == c.ortho_init
    extractor = model.policy.mlp_extractor
    assert _linear_widths(extractor.policy_net) == tuple(c.net_arch)
    assert _linear_widths(extractor.value_net) == tuple(c.net_arch)
    if c.net_arch:
        expected = {"tanh": "Tanh", "relu": "ReLU"}[c.activation]
        assert _activations(extractor.policy_net) == {expected}
        assert _activations(extractor.value_net) == {expected}
    if hasattr(model.policy, "log_std"):
        assert np.all(model.policy.log_std.detach().numpy() == np.float32(c.log_std_init))
    if isinstance(env, VecNormalize):
        assert c.normalize_observations or c.normalize_rewards
        assert env.norm_obs == c.normalize_observations
        assert env.norm_reward == c.normalize_rewards
        assert env.clip_obs == (math.inf if c.clip_observations is None else c.clip_observations)
        assert env.clip_reward == (math.inf if c.clip_rewards is None else c.clip_rewards)
        assert env.gamma == c.gamma
    else:
        assert not (c.normalize_observations or c.normalize_rewards)
    for name in zp.SDE_ARGS:           # gSDE, once PPOConfig has it
        if hasattr(c, name):
            assert getattr(model, name) == getattr(c, name), name
    if getattr(c, "use_sde", False):
        for name in zp.SDE_POLICY_KWARGS:
            if hasattr(c, name):
                assert model.policy.dist_kwargs[name] == getattr(c, name), name
    if policy == "lstm":
        assert model.policy.lstm_actor.hidden_size == c.lstm_hidden_size
        assert model.policy.lstm_critic is not None      # one LSTM per tower
        assert model.policy.lstm_actor.num_layers == 1
        if c.ortho_init:                                  # as ppo_ref.spec.lstm.lstm_init
            for lstm in (model.policy.lstm_actor, model.policy.lstm_critic):
                for name, w in lstm.named_parameters():
                    w = w.detach().double().numpy()
                    if name.startswith("weight"):
                        np.testing.assert_allclose(w.T @ w, np.eye(w.shape[1]), atol=1e-5)
                    else:
                        assert not w.any(), name
    # the same network: ppo_ref's parameter count (torch keeps two LSTM biases where ppo_ref
    # stores their sum)
    from ppo_ref.cli.common import trainer_class
    trainer = trainer_class(policy)(env_id, config, seed=0)
    try:
        ours = sum(int(v.size) for v in trainer.params.values())
    finally:
        trainer.close()
    extra = 2 * 4 * c.lstm_hidden_size if policy == "lstm" else 0
    theirs = sum(int(p.numel()) for p in model.policy.parameters()) - extra
    assert theirs == ours


@pytest.mark.parametrize("row", list(ZOO))
def test_every_zoo_row_reaches_sb3_field_by_field(row):
    _sb3_modules()
    entry = ZOO[row]
    model, _ = zp.make_sb3_model(row, entry.config(), entry.policy, seed=0)
    try:
        assert_model_has_config(model, entry.config(), entry.policy, row)
    finally:
        model.get_env().close()


@pytest.mark.parametrize("env_id,policy,changes", [
    ("Pendulum-v1", "mlp", dict(value_loss_scale=0.5, adam_eps=1e-7, clip_range_vf=0.3,
                                value_loss_mode="sb3", target_kl=0.02, normalize_advantage=False,
                                activation="relu", net_arch=(16,), log_std_init=-1.0,
                                lr_schedule="linear", normalize_rewards=True,
                                clip_rewards=None)),
    ("ppo_ref/MemoryCue-v0", "lstm", dict(n_envs=2, n_steps=16, batch_size=16,
                                          lstm_hidden_size=8, net_arch=(8, 8),
                                          ortho_init=False, normalize_observations=True,
                                          clip_observations=5.0)),
])
def test_non_default_mappable_settings_reach_sb3(env_id, policy, changes):
    _sb3_modules()
    config = PPOConfig(**changes)
    model, _ = zp.make_sb3_model(env_id, config, policy, seed=0)
    try:
        assert_model_has_config(model, config, policy, env_id)
    finally:
        model.get_env().close()


@pytest.mark.parametrize("policy,changes,field", [
    ("mlp", dict(truncation="terminate"), "truncation"),
    ("mlp", dict(shared_trunk=True), "shared_trunk"),
    ("mlp", dict(policy_head_gain=1.0), "policy_head_gain"),
    ("mlp", dict(schedule_progress="before_rollout"), "schedule_progress"),
    ("mlp", dict(value_loss_mode="huber"), "value_loss_mode"),
    ("mlp", dict(clip_range_vf=0.2), "value_loss_mode"),         # the "max" form of a clip
    ("mlp", dict(target_kl=0.01, kl_estimator="k1"), "kl_estimator"),
    ("mlp", dict(advantage_norm_ddof=0), "advantage_norm_ddof"),
    ("mlp", dict(dual_clip=3.0), "dual_clip"),
    ("lstm", dict(lstm_shared=True), "lstm_shared"),
])
def test_an_unmappable_setting_fails_naming_the_field(policy, changes, field):
    with pytest.raises(zp.UnmappableSettings, match=field):
        zp.sb3_settings(PPOConfig(**changes), policy)


def test_a_field_without_a_known_mapping_fails_when_not_at_its_default(monkeypatch):
    zp.sb3_settings(PPOConfig(), "mlp")
    monkeypatch.setattr(zp, "MAPPED", tuple(f for f in zp.MAPPED if f != "gae_lambda"))
    zp.sb3_settings(PPOConfig(), "mlp")                       # at its default: nothing to map
    with pytest.raises(zp.UnmappableSettings, match="gae_lambda=0.9: no SB3 mapping"):
        zp.sb3_settings(PPOConfig(gae_lambda=0.9), "mlp")


def test_main_refuses_missing_packages_and_stray_budgets_before_training(monkeypatch, tmp_path,
                                                                         capsys):
    monkeypatch.setattr(zp, "run_one", lambda job: pytest.fail("trained"))
    real = zp.importlib.util.find_spec
    monkeypatch.setattr(zp.importlib.util, "find_spec",
                        lambda name: None if name == "matplotlib" else real(name))
    with pytest.raises(SystemExit) as exc:
        zp.main(["--rows", "CartPole-v1", "--libs", "ppo_ref", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "matplotlib is not installed" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        zp.main(["--rows", "CartPole-v1", "--timesteps", "Pendulum-v1=4000", "--no-plot",
                 "--out", str(tmp_path)])
    assert exc.value.code == 2 and "Pendulum-v1 is not one of the --rows" in \
        capsys.readouterr().err


def test_main_refuses_an_unmappable_row_before_training(monkeypatch, tmp_path, capsys):
    entry = ZOO["CartPole-v1"]
    bad = type(entry)(entry.env_id, entry.policy, dict(entry.settings, truncation="terminate"),
                      entry.n_timesteps, entry.source)
    monkeypatch.setitem(ZOO, "CartPole-v1", bad)
    monkeypatch.setattr(zp, "run_one", lambda job: pytest.fail("trained"))
    # (--no-plot --table-only: the refusal needs neither matplotlib nor SB3 installed)
    assert zp.main(["--rows", "CartPole-v1", "--out", str(tmp_path), "--no-plot",
                    "--table-only"]) == 2
    assert "truncation='terminate'" in capsys.readouterr().err


def test_the_rule_and_the_statistics():
    assert zp.row_passes([1.0, 2.0, 3.0], [2.0, 5.0]) == "range"   # mean 2 = SB3's min
    assert zp.row_passes([10.0], [0.0, 5.0]) == ""                 # one seed: no Welch test
    assert zp.row_passes([], [1.0]) is None
    # mean 1/3 outside [1, 3]; Welch: t = -(5/3) / sqrt(19/9 + 1/3) = -1.07: not rejected
    assert zp.row_passes([-2.0, 0.0, 3.0], [1.0, 2.0, 3.0]) == "welch"
    assert zp.row_passes([10.0, 11.0, 12.0], [1.0, 2.0, 3.0]) == ""  # t = 11.0: rejected
    s = zp.statistics([1.0, 2.0, 6.0])
    assert (s["n"], s["mean"], s["min"], s["max"]) == (3, 3.0, 1.0, 6.0)
    assert s["std"] == pytest.approx(np.sqrt(7.0))                 # ddof 1: 14 / 2


@pytest.mark.parametrize("t, nu, p", [(4.303, 2.0, 0.05), (2.776, 4.0, 0.05),
                                      (2.447, 6.0, 0.05), (4.604, 4.0, 0.01),
                                      (2.228, 10.0, 0.05), (1.96, 1e6, 0.05), (0.0, 4.0, 1.0)])
def test_welch_p_value_is_the_student_t_tail(t, nu, p):
    """Equal sizes and variances make Welch's nu = 2 (n - 1): samples built to a given t give
    the two-sided p of Student's t tables (rounded to the tables' 3 decimals)."""
    n = int(round(nu / 2)) + 1
    if nu > 1e5:    # the normal limit: a large n with the same t
        n = 500_001
    base = np.linspace(-1.0, 1.0, n)
    se = math.sqrt(2.0 * np.var(base, ddof=1) / n)
    got = zp.welch_p_value(base + t * se, base)
    assert got == pytest.approx(p, abs=5e-4 if p < 1 else 1e-12)


def test_tiny_run_writes_table_json_cache_and_plot(tmp_path, capsys, monkeypatch):
    _sb3_modules()
    pytest.importorskip("matplotlib")
    rows = ["ppo_ref/MultiChoice-v0", "ppo_ref/MemoryCue-v0"]
    argv = ["--rows", *rows, "--seeds", "0-1", "--eval-episodes", "2", "--out", str(tmp_path),
            "--timesteps", "ppo_ref/MultiChoice-v0=512", "ppo_ref/MemoryCue-v0=1024"]
    assert zp.main(argv) == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "zoo_parity.json").read_text())
    assert list(doc["rows"]) == rows
    for row, budget in zip(rows, (512, 1024)):
        item = doc["rows"][row]
        assert (item["timesteps"], item["zoo_budget"]) == (budget, False)
        assert f"{budget} (not the zoo's {ZOO[row].n_timesteps})" in out
        for lib in ("ppo_ref", "sb3"):
            data = item["libs"][lib]
            assert data["seeds"] == [0, 1]
            finals = [run["final_return"] for run in data["runs"]]
            assert data["final"]["std"] == pytest.approx(np.std(finals, ddof=1))
            for run in data["runs"]:
                assert run["timesteps"] >= budget and len(run["eval_returns"]) == 2
                assert len(run["steps"]) == len(run["returns"]) > 0
                assert run["config"] == ZOO[row].config().to_dict()
        ppo_mean = item["libs"]["ppo_ref"]["final"]["mean"]
        sb3 = item["libs"]["sb3"]["final"]
        assert item["passes"] == ("range" if sb3["min"] <= ppo_mean <= sb3["max"] else "")
        assert item["libs"]["sb3"]["runs"][0]["sb3"]["algo"] == \
            ("RecurrentPPO" if ZOO[row].policy == "lstm" else "PPO")
    assert len(list((tmp_path / "runs").glob("*.json"))) == 8
    assert (tmp_path / "zoo_parity.png").stat().st_size > 1000
    table = (tmp_path / "zoo_parity.md").read_text()
    assert "Rule: a row passes when ppo_ref's mean final return lies within [min, max]" in table

    # a cached config lacking a field (one PPOConfig gained since) counts at its default;
    # a changed field or a field PPOConfig does not have makes the run stale
    path = zp.cache_path(str(tmp_path), "ppo_ref/MemoryCue-v0", "sb3", 1)
    record = json.loads(open(path).read())
    load = lambda: zp.load_cached(str(tmp_path), "ppo_ref/MemoryCue-v0", "sb3", 1,  # noqa: E731
                                  1024, 2)
    assert load() == record
    for config in ({k: v for k, v in record["config"].items() if k != "huber_delta"},
                   dict(record["config"], gamma=0.5), dict(record["config"], no_such=1)):
        with open(path, "w") as fh:
            json.dump(dict(record, config=config), fh)
        assert (load() is not None) == (config.get("gamma") != 0.5 and "no_such" not in config)
    with open(path, "w") as fh:
        json.dump(record, fh)

    # rebuilt from the cache alone; a changed budget is not served from it
    monkeypatch.setattr(zp, "run_one", lambda job: pytest.fail(f"trained {job}"))
    assert zp.main(argv + ["--table-only"]) == 0
    assert (tmp_path / "zoo_parity.md").read_text() == table
    assert zp.main(argv[:-2] + ["ppo_ref/MultiChoice-v0=256", "ppo_ref/MemoryCue-v0=1024",
                                "--table-only"]) == 0
    assert "not in the cache at today's settings" in capsys.readouterr().err


def test_jobs_run_in_spawned_processes_and_fill_the_cache(tmp_path, capsys):
    argv = ["--rows", "ppo_ref/MultiChoice-v0", "--seeds", "0-1", "--libs", "ppo_ref",
            "--eval-episodes", "0", "--out", str(tmp_path), "--no-plot",
            "--timesteps", "ppo_ref/MultiChoice-v0=256"]
    assert zp.main(argv + ["--jobs", "2"]) == 0
    doc = json.loads((tmp_path / "zoo_parity.json").read_text())
    runs = doc["rows"]["ppo_ref/MultiChoice-v0"]["libs"]["ppo_ref"]["runs"]
    assert [run["seed"] for run in runs] == [0, 1]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        "ppo_ref_MultiChoice-v0__ppo_ref__seed0.json",
        "ppo_ref_MultiChoice-v0__ppo_ref__seed1.json"]
    assert "PASS" not in capsys.readouterr().out                   # no SB3 side: n/a
