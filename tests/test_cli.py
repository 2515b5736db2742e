"""The ppo-ref command line: run-dir files, determinism, resume, eval, plot, errors."""
import builtins
import os
import subprocess
import sys

import numpy as np
import pytest

from ppo_ref import cli
from ppo_ref.checkpoint import load_checkpoint
from ppo_ref.runlog import EPISODE_COLUMNS, METRIC_COLUMNS, RunLogger, read_csv
from test_rollout_helpers import register_faulty


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _train(tmp_path, name, *extra):
    run_dir = str(tmp_path / name)
    code = cli.main(["train", "--total-timesteps", "2048", "--run-dir", run_dir, "--quiet",
                     "--set", "n_epochs=2", *extra])
    return code, run_dir


def test_train_writes_run_dir(tmp_path):
    code, run_dir = _train(tmp_path, "a")
    assert code == 0
    assert sorted(os.listdir(run_dir)) == ["checkpoint.npz", "config.json", "episodes.csv",
                                           "metrics.csv", "timing.csv"]
    metrics = read_csv(os.path.join(run_dir, "metrics.csv"))
    assert tuple(metrics) == METRIC_COLUMNS
    np.testing.assert_array_equal(metrics["update"], np.arange(1, 9))
    np.testing.assert_array_equal(metrics["timesteps"], 256 * np.arange(1, 9))
    episodes = read_csv(os.path.join(run_dir, "episodes.csv"))
    assert tuple(episodes) == EPISODE_COLUMNS and len(episodes["return"]) == metrics["episodes"][-1]
    np.testing.assert_array_equal(episodes["return"], episodes["length"])  # CartPole: +1 per step
    import json
    info = json.load(open(os.path.join(run_dir, "config.json")))
    assert info["env_id"] == "CartPole-v1" and info["config"]["n_envs"] == 8
    assert info["config"]["n_epochs"] == 2 and info["config"]["lr_schedule"] == "linear"
    _, meta = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"))
    assert meta["num_timesteps"] == 2048


def test_same_seed_gives_bit_identical_metrics_csv(tmp_path):
    _, a = _train(tmp_path, "a", "--seed", "4")
    _, b = _train(tmp_path, "b", "--seed", "4")
    for name in ("metrics.csv", "episodes.csv"):
        assert open(os.path.join(a, name), "rb").read() == open(os.path.join(b, name), "rb").read()


def test_interrupted_then_resumed_run_matches_uninterrupted(tmp_path, monkeypatch):
    _, full = _train(tmp_path, "full")
    original = RunLogger.callback

    def stop_at_1024(self, trainer, stats):
        keep_going = original(self, trainer, stats)
        if trainer.num_timesteps >= 1024:
            self.request_stop()  # what the first Ctrl-C does
            return False
        return keep_going
    monkeypatch.setattr(RunLogger, "callback", stop_at_1024)
    code, part = _train(tmp_path, "part")
    assert code == 130
    _, meta = load_checkpoint(os.path.join(part, "checkpoint.npz"))
    assert meta["num_timesteps"] == 1024
    monkeypatch.setattr(RunLogger, "callback", original)
    assert cli.main(["train", "--resume", part, "--quiet"]) == 0
    for name in ("metrics.csv", "episodes.csv"):
        assert open(os.path.join(full, name), "rb").read() == open(os.path.join(part, name), "rb").read()
    a, _ = load_checkpoint(os.path.join(full, "checkpoint.npz"))
    b, _ = load_checkpoint(os.path.join(part, "checkpoint.npz"))
    for k in a:
        if k.startswith("params/"):
            np.testing.assert_array_equal(a[k], b[k])


def test_env_error_saves_last_good_checkpoint_and_names_env(tmp_path, capsys):
    env_id = register_faulty()
    from ppo_ref.config import PPOConfig
    from ppo_ref.ppo import PPOTrainer
    probe = PPOTrainer(env_id, PPOConfig.zoo_cartpole(), seed=0)
    bad_seed = probe.env_seeds[5]
    probe.close()
    run_dir = str(tmp_path / "bad")
    # the env kwargs travel through a small trainer subclass registered for this test
    class Faulty(PPOTrainer):
        def __init__(self, env, config=None, **kw):
            kw.setdefault("env_kwargs", {"fault": "nan", "at": 100, "bad_seed": bad_seed})
            super().__init__(env, config, **kw)
    import ppo_ref.ppo as ppo_module
    ppo_module.FaultyForTest = Faulty
    cli.TRAINERS["faulty_test"] = "ppo_ref.ppo:FaultyForTest"
    try:
        code = cli.main(["train", "--env", env_id, "--policy", "faulty_test", "--preset", "zoo",
                         "--total-timesteps", "4096", "--run-dir", run_dir, "--quiet"])
    finally:
        del cli.TRAINERS["faulty_test"]
        del ppo_module.FaultyForTest
    err = capsys.readouterr().err
    assert code == 3
    assert "env 5" in err and "vector step 99" in err and "last good checkpoint" in err
    _, meta = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"))
    assert meta["num_timesteps"] == 3 * 256  # the boundary before the failing rollout


def test_eval_and_plot(tmp_path, capsys):
    _, run_dir = _train(tmp_path, "a")
    capsys.readouterr()
    assert cli.main(["eval", run_dir, "--episodes", "3", "--deterministic"]) == 0
    out = capsys.readouterr().out
    assert "mean return" in out and "3 episodes (deterministic)" in out
    code = cli.main(["plot", run_dir])
    png = os.path.join(run_dir, "learning_curve.png")
    if _have_matplotlib():  # matplotlib is in the `plot` extra only, not in `test`
        assert code == 0
        assert os.path.getsize(png) > 1000
    else:
        assert code == 2
        assert "needs matplotlib" in capsys.readouterr().err
        assert not os.path.exists(png)


def test_plot_without_matplotlib_gives_a_clear_message(tmp_path, capsys, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert cli.main(["plot", str(tmp_path)]) == 2
    assert "needs matplotlib" in capsys.readouterr().err


def test_bad_inputs_give_exit_code_2(tmp_path, capsys):
    bad = tmp_path / "checkpoint.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    assert cli.main(["eval", str(tmp_path)]) == 2
    assert "not a valid checkpoint" in capsys.readouterr().err
    assert cli.main(["train", "--set", "gamma=2", "--run-dir", str(tmp_path / "x"), "--quiet"]) == 2
    assert "gamma" in capsys.readouterr().err
    assert cli.main(["train", "--set", "nonsense", "--run-dir", str(tmp_path / "y")]) == 2
    assert "expected 'field=value'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: unknown option
        cli.main(["train", "--no-such-option"])


def test_config_choice_for_env():
    from ppo_ref.config import PPOConfig
    assert cli.build_config("CartPole-v1", None, [], None) == PPOConfig.zoo_cartpole()
    assert cli.build_config("Pendulum-v1", None, ["n_steps=64"], 2) == PPOConfig(n_steps=64, n_envs=2)
    assert cli.build_config("Acrobot-v1", "cleanrl", [], None) == PPOConfig.preset("cleanrl")


def test_python_dash_m_entry_point():
    out = subprocess.run([sys.executable, "-m", "ppo_ref", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0
    for name in ("train", "eval", "plot"):
        assert name in out.stdout


def test_ctrl_c_saves_a_checkpoint_at_a_rollout_boundary(tmp_path):
    import signal
    import time
    run_dir = str(tmp_path / "sigint")
    proc = subprocess.Popen([sys.executable, "-m", "ppo_ref", "train", "--total-timesteps", "1000000",
                             "--run-dir", run_dir, "--quiet", "--checkpoint-every", "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = os.path.join(run_dir, "metrics.csv")
    deadline = time.time() + 60
    while time.time() < deadline:
        if os.path.exists(metrics) and os.path.getsize(metrics) > 0:
            with open(metrics) as fh:
                if sum(1 for _ in fh) >= 3:
                    break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "resume with" in err
    _, meta = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"))
    rows = read_csv(metrics)
    assert meta["num_timesteps"] == rows["timesteps"][-1] and meta["num_timesteps"] % 256 == 0
    assert meta["num_timesteps"] < 1_000_000
