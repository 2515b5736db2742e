"""What a user of ``ppo-ref`` sees: --list-fields, the closing line, --help, the plot's
explained-variance panel, and the per-env zoo settings (every bundled env learns with them)."""
import dataclasses
import json
import os
import re

import gymnasium
import numpy as np
import pytest

from ppo_ref import cli
from ppo_ref.config import PPOConfig
from ppo_ref.io.runlog import read_csv
from ppo_ref.zoo import ZOO, zoo_entry

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLOSING = re.compile(r"^ppo-ref: done: (\d+) steps, (\d+) updates, (\d+) episodes, "
                     r"return\(last 20\) (\S+), (\d+\.\d)s -> (.+?)( \| .*)?$")


# -- --list-fields ------------------------------------------------------------------------------

def test_list_fields_prints_every_field_with_default_and_help(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--list-fields"]) == 0
    out = capsys.readouterr().out
    default = PPOConfig()
    for f in dataclasses.fields(PPOConfig):
        value = getattr(default, f.name)
        shown = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
        assert f"  {f.name} (default {shown})" in out, f.name
        assert f.metadata["help"] in out, f.name
    assert "one of constant, linear" in out                  # choices are listed
    assert os.listdir(tmp_path) == []                        # nothing trained, nothing written


def test_list_fields_shows_what_the_env_zoo_settings_change(capsys):
    assert cli.main(["train", "--list-fields", "--env", "Pendulum-v1", "--set",
                     "n_epochs=3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    n_steps = next(line for line in lines if line.startswith("  n_steps "))
    assert n_steps.endswith(f": {ZOO['Pendulum-v1'].settings['n_steps']}]")
    n_epochs = next(line for line in lines if line.startswith("  n_epochs "))
    assert n_epochs.endswith(": 3]")
    gamma_vf = next(line for line in lines if line.startswith("  vf_coef "))
    assert "[" not in gamma_vf                               # unchanged fields show no value


def test_list_fields_reports_a_bad_set_as_a_usage_error(capsys):
    assert cli.main(["train", "--list-fields", "--set", "n_stepz=3"]) == 2
    assert "n_steps" in capsys.readouterr().err


def test_list_fields_refuses_an_env_that_does_not_exist(capsys):
    assert cli.main(["train", "--list-fields", "--env", "Nope-v0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppo-ref train: error: cannot make env 'Nope-v0'") and \
        len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("command, given", [("train", []), ("eval", ["run/checkpoint.npz"]),
                                            ("details", [])])
def test_an_unknown_argument_is_reported_by_its_subcommand(capsys, command, given):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, *given, "--bogus"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ppo-ref {command}: error: unrecognized arguments: --bogus "), err


# -- the closing line -----------------------------------------------------------------------------

def _closing(out: str):
    lines = [line for line in out.splitlines() if line.startswith("ppo-ref: done:")]
    assert len(lines) == 1, out
    match = CLOSING.match(lines[0])
    assert match, lines[0]
    return match


def _check_against_files(match, run_dir):
    metrics = read_csv(os.path.join(run_dir, "metrics.csv"))
    episodes = read_csv(os.path.join(run_dir, "episodes.csv"))
    assert int(match.group(1)) == int(metrics["timesteps"][-1])
    assert int(match.group(2)) == int(metrics["update"][-1])
    assert int(match.group(3)) == len(episodes["return"])
    assert float(match.group(4)) == pytest.approx(np.mean(episodes["return"][-20:]), abs=0.005)
    assert float(match.group(5)) >= 0  # wall seconds, printed to 0.1 s
    assert match.group(6) == run_dir


def test_closing_line_after_a_sync_run_also_when_quiet(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    assert cli.main(["train", "--total-timesteps", "512", "--set", "n_epochs=1", "--run-dir",
                     run_dir, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "steps 512/512" not in out                        # quiet: no progress line
    _check_against_files(_closing(out), run_dir)


def test_closing_line_after_an_async_run_also_when_quiet(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    assert cli.main(["train", "--async", "--num-actors", "2", "--total-timesteps", "512",
                     "--set", "n_epochs=1", "--run-dir", run_dir, "--quiet"]) == 0
    out = capsys.readouterr().out
    match = _closing(out)
    _check_against_files(match, run_dir)
    assert "policy lag mean" in match.group(7)


# -- --help ---------------------------------------------------------------------------------------

def test_train_help_shows_examples_zoo_envs_and_bundled_env_ids(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["train", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "ppo-ref train --list-fields" in out
    assert "ppo-ref train --env Pendulum-v1" in out
    bundled = [env_id for env_id in gymnasium.registry if env_id.startswith("ppo_ref/")]
    assert len(bundled) >= 3
    for env_id in list(bundled) + list(ZOO):
        assert env_id in out, env_id


# -- ppo-ref plot ---------------------------------------------------------------------------------

def test_plot_keeps_explained_variance_outliers_off_the_other_panels(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = np.arange(1.0, 11.0) * 100
    metrics = {"timesteps": steps, "approx_kl": np.full(10, 0.01),
               "clip_fraction": np.full(10, 0.1), "entropy": np.linspace(0.69, 0.5, 10),
               "explained_variance": np.array([-5e6, -30.0, 0.1, 0.5, 0.9, 0.95, 0.97, 0.98,
                                               0.99, 0.99])}
    episodes = {"timesteps": steps, "return": np.linspace(10.0, 200.0, 10)}
    fig = cli.learning_curve_figure(plt, episodes, metrics, "run")
    try:
        axes = fig.axes
        assert axes[3].get_ylim() == cli.EV_RANGE
        low, high = axes[2].get_ylim()                       # entropy keeps its own scale
        assert -1.0 < low < 0.5 and 0.69 < high < 1.0
        labels = [line.get_label() for line in axes[3].get_lines()]
        assert "2 update(s) below -1" in labels
        entropy_axis_data = np.concatenate([line.get_ydata() for line in axes[2].get_lines()])
        assert entropy_axis_data.min() > -1.0                # the outlier is not on it
    finally:
        plt.close(fig)


def test_plot_command_writes_the_png_and_documents_the_range(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run_dir = str(tmp_path / "run")
    assert cli.main(["train", "--total-timesteps", "512", "--set", "n_epochs=1", "--run-dir",
                     run_dir, "--quiet"]) == 0
    assert cli.main(["plot", run_dir]) == 0
    assert os.path.getsize(os.path.join(run_dir, "learning_curve.png")) > 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["plot", "--help"])
    assert "[-1, 1]" in capsys.readouterr().out


def test_plot_of_a_run_with_no_update_says_so(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run_dir = tmp_path / "run"
    assert cli.main(["train", "--total-timesteps", "256", "--set", "n_epochs=1", "--run-dir",
                     str(run_dir), "--quiet"]) == 0
    for name in ("metrics.csv", "episodes.csv"):       # as a run stopped before its first update
        header = (run_dir / name).read_text().splitlines()[0]
        (run_dir / name).write_text(header + "\n")
    capsys.readouterr()
    assert cli.main(["plot", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert "ppo-ref plot: note:" in err and "no completed update yet: it is empty" in err, err
    assert (run_dir / "learning_curve.png").stat().st_size > 0


# -- the zoo table --------------------------------------------------------------------------------

def test_zoo_table_covers_the_promised_envs_and_cites_a_source_per_row():
    wanted = {"CartPole-v1": "mlp", "Acrobot-v1": "mlp", "Pendulum-v1": "mlp",
              "MountainCarContinuous-v0": "mlp", "ppo_ref/CartPoleNoVel-v1": "lstm",
              "ppo_ref/MemoryCue-v0": "lstm", "ppo_ref/MultiChoice-v0": "mlp"}
    assert {env_id: e.policy for env_id, e in ZOO.items()} == wanted
    for env_id, entry in ZOO.items():
        assert entry.env_id == env_id and entry.n_timesteps > 0
        zoo = re.fullmatch(r"rl-baselines3-zoo hyperparams/(ppo|ppo_lstm)\.yml: (\S+)( .*)?",
                           entry.source)
        if zoo:   # the zoo's key is the env id without ppo_ref's namespace
            assert zoo.group(2) == env_id.split("/")[-1]
            assert (zoo.group(1) == "ppo_lstm") == (entry.policy == "lstm")
            assert entry.published is not None and "benchmark.md" in entry.published_source
        else:     # ppo_ref's own tuning names the files that check it, and they exist
            own = re.fullmatch(r"ppo_ref's own tuning \((.+)\)", entry.source)
            assert own, entry.source
            for path in own.group(1).split(", "):
                assert os.path.exists(os.path.join(REPO, path)), path
        entry.config()                                       # a valid PPOConfig


def test_cartpole_entry_is_zoo_cartpole_and_train_defaults_to_the_entries():
    assert ZOO["CartPole-v1"].config() == PPOConfig.zoo_cartpole()
    for env_id, entry in ZOO.items():
        assert cli.build_config(env_id, None, [], None) == entry.config()
        assert cli.build_config(env_id, "zoo", [], None) == entry.config()
        assert cli.default_policy(env_id) == entry.policy
        assert cli.default_timesteps(env_id, None) == entry.n_timesteps
    assert zoo_entry("LunarLander-v3") is None
    assert cli.build_config("LunarLander-v3", None, [], None) == PPOConfig()
    assert cli.default_timesteps("LunarLander-v3", None) == cli.DEFAULT_TIMESTEPS


def test_set_and_preset_override_the_zoo_settings():
    entry = ZOO["Pendulum-v1"]
    assert cli.build_config("Pendulum-v1", None, ["n_steps=64", "gamma=0.5"], 2) == \
        entry.config(n_steps=64, gamma=0.5, n_envs=2)
    assert cli.build_config("Pendulum-v1", "default", [], None) == PPOConfig()
    assert cli.build_config("Pendulum-v1", "cleanrl", [], None) == PPOConfig.preset("cleanrl")
    assert cli.default_timesteps("Pendulum-v1", "default") == cli.DEFAULT_TIMESTEPS


def test_train_prints_the_zoo_settings_it_uses(tmp_path, capsys):
    run_dir = str(tmp_path / "zoo")
    assert cli.main(["train", "--env", "ppo_ref/MultiChoice-v0", "--total-timesteps", "256",
                     "--run-dir", run_dir, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "using the zoo settings for ppo_ref/MultiChoice-v0 (ppo_ref's own tuning" in out
    with open(os.path.join(run_dir, "config.json")) as fh:
        info = json.load(fh)
    assert info["preset"] == "zoo" and info["policy"] == "mlp"
    assert PPOConfig.from_dict(info["config"]) == ZOO["ppo_ref/MultiChoice-v0"].config()

    other = str(tmp_path / "default")
    assert cli.main(["train", "--env", "ppo_ref/MultiChoice-v0", "--preset", "default",
                     "--total-timesteps", "256", "--set", "n_steps=128", "--run-dir", other,
                     "--quiet"]) == 0
    assert "zoo settings" not in capsys.readouterr().out


# -- every bundled env learns with its defaults (the CI's learning checks) -------------------------

def _train_defaults(tmp_path, env_id, *extra):
    run_dir = str(tmp_path / "run")
    assert cli.main(["train", "--env", env_id, "--run-dir", run_dir, "--quiet", *extra]) == 0
    with open(os.path.join(run_dir, "config.json")) as fh:
        info = json.load(fh)
    trainer = cli.trainer_class(info["policy"]).load(os.path.join(run_dir, "checkpoint.npz"))
    return info, trainer


@pytest.mark.slow
def test_memory_cue_learns_with_its_zoo_defaults(tmp_path):
    """``ppo-ref train --env ppo_ref/MemoryCue-v0 --policy lstm`` with nothing else: the LSTM
    must answer at least 95% of fresh episodes right (mean return >= 0.9; a memoryless policy
    expects 0), the bar of tests/test_recurrent_learning.py."""
    info, trainer = _train_defaults(tmp_path, "ppo_ref/MemoryCue-v0", "--policy", "lstm")
    try:
        assert info["total_timesteps"] == ZOO["ppo_ref/MemoryCue-v0"].n_timesteps
        returns = np.asarray(trainer.evaluate(200, deterministic=True, seed=10_000))
    finally:
        trainer.close()
    assert np.mean(returns) >= 0.9, f"mean return {np.mean(returns):.2f} (memoryless: 0)"


@pytest.mark.slow
def test_multi_choice_learns_with_its_zoo_defaults(tmp_path):
    """``ppo-ref train --env ppo_ref/MultiChoice-v0`` with nothing else (the MLP policy by
    default): deterministic mean return above 20 (random play 9.33, perfect 32), the bar of
    tests/test_multidiscrete.py."""
    info, trainer = _train_defaults(tmp_path, "ppo_ref/MultiChoice-v0")
    try:
        assert info["policy"] == "mlp"
        returns = np.asarray(trainer.evaluate(20, deterministic=True, seed=1000))
    finally:
        trainer.close()
    assert np.mean(returns) > 20.0, f"mean return {np.mean(returns):.2f} (random 9.33)"
