"""learning_curves.py without training: shared settings, table and plot on synthetic curves."""
import pytest

import learning_curves as lc


def test_both_implementations_get_the_zoo_settings_with_sb3_conventions():
    from ppo_ref.config import PPOConfig
    zoo, sb3 = PPOConfig.zoo_cartpole(), PPOConfig.preset("sb3")
    for task in ("mlp", "lstm"):
        c = lc.make_config(task)
        for field in ("n_envs", "n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda",
                      "learning_rate", "lr_schedule", "clip_range", "clip_range_schedule",
                      "ent_coef", "vf_coef", "max_grad_norm"):
            assert getattr(c, field) == getattr(zoo, field), field
        for field in ("truncation", "value_loss_mode", "value_loss_scale", "clip_range_vf",
                      "advantage_norm_scope", "advantage_norm_ddof", "kl_stop_rule",
                      "schedule_progress"):
            assert getattr(c, field) == getattr(sb3, field), field
    assert lc.make_config("lstm").lstm_shared is False      # = sb3-contrib enable_critic_lstm


def test_table_and_plot_from_synthetic_runs(tmp_path):
    pytest.importorskip("matplotlib")
    run = lambda final: {"steps": [256, 512, 768], "returns": [10.0, 20.0, final],  # noqa: E731
                         "timesteps": 768, "seconds": 2.0}
    results = {"mlp": {"ppo_ref": [run(30.0), run(40.0)], "SB3": [run(50.0), run(50.0)]}}
    md = lc.table(results)
    assert "| CartPole-v1 | ppo_ref | 2 | 35.0 +- 5.0 | 30.0, 40.0 | 384 | 768 |" in md
    assert "| CartPole-v1 | SB3 | 2 | 50.0 +- 0.0 |" in md
    path = tmp_path / "curves.png"
    lc.plot(results, str(path))
    assert path.stat().st_size > 1000
