"""The ppo-ref command line: run-dir files, determinism, resume, eval, plot, errors."""
import builtins
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ppo_ref import cli
from ppo_ref.config import PRESETS
from ppo_ref.io.checkpoint import load_checkpoint
from ppo_ref.io.runlog import EPISODE_COLUMNS, METRIC_COLUMNS, RunLogger, read_csv
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
                                           "metrics.csv", "timing.csv"]  # the lock file is gone
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
    from ppo_ref.train.ppo import PPOTrainer
    probe = PPOTrainer(env_id, PPOConfig.zoo_cartpole(), seed=0)
    bad_seed = probe.env_seeds[5]
    probe.close()
    run_dir = str(tmp_path / "bad")
    # the env kwargs travel through a small trainer subclass registered for this test
    class Faulty(PPOTrainer):
        def __init__(self, env, config=None, **kw):
            kw.setdefault("env_kwargs", {"fault": "nan", "at": 100, "bad_seed": bad_seed})
            super().__init__(env, config, **kw)
    import ppo_ref.train.ppo as ppo_module
    ppo_module.FaultyForTest = Faulty
    cli.TRAINERS["faulty_test"] = "ppo_ref.train.ppo:FaultyForTest"
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


@pytest.mark.parametrize("how", ["plain", "inside a compiled call", "other"])
def test_ctrl_c_during_eval_is_one_line_and_exit_130(tmp_path, capsys, monkeypatch, how):
    """Ctrl-C while evaluating: exit 130 and one line, also when it lands while numba runs
    Python code inside a compiled call (numba then raises SystemError from the
    KeyboardInterrupt); any other SystemError is not taken for an interrupt."""
    from ppo_ref.train.ppo import PPOTrainer
    _, run_dir = _train(tmp_path, "a")
    capsys.readouterr()

    def evaluate(self, *args, **kwargs):
        if how == "plain":
            raise KeyboardInterrupt
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            if how == "other":
                raise SystemError("a real failure")
            raise SystemError("returned a result with an exception set") from interrupt
    monkeypatch.setattr(PPOTrainer, "evaluate", evaluate)
    if how == "other":
        with pytest.raises(SystemError, match="a real failure"):
            cli.main(["eval", run_dir])
        return
    assert cli.main(["eval", run_dir]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "ppo-ref eval: interrupted (Ctrl-C); no result"


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
    for argv in (["train", "--no-such-option"], ["train", "--total-timesteps", "1e5"],
                 ["train", "--policy", "gru"], ["no-such-command"]):
        with pytest.raises(SystemExit) as info:  # argparse's errors, on one line
            cli.main(argv)
        assert info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "error:" in err[0] and "--help" in err[0], err


def test_config_choice_for_env():
    from ppo_ref.config import PPOConfig
    assert cli.build_config("CartPole-v1", None, [], None) == PPOConfig.zoo_cartpole()
    assert cli.build_config("LunarLander-v3", None, ["n_steps=64"], 2) == PPOConfig(n_steps=64, n_envs=2)
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


@pytest.mark.parametrize("name, code", [("SIGTERM", 143), ("SIGHUP", 129)])
def test_sigterm_saves_the_last_good_state_and_the_run_resumes(tmp_path, name, code):
    """SIGTERM (a scheduler's stop) or SIGHUP (the terminal closed) after the first checkpoint
    interval: the state of the last completed update is saved (newer than the first periodic
    checkpoint), the exit status is 128 + the signal's number."""
    import signal
    import time
    run_dir = str(tmp_path / "sigterm")
    proc = subprocess.Popen([sys.executable, "-m", "ppo_ref", "train", "--total-timesteps", "1000000",
                             "--run-dir", run_dir, "--quiet", "--checkpoint-every", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checkpoint = os.path.join(run_dir, "checkpoint.npz")
    metrics = os.path.join(run_dir, "metrics.csv")
    deadline = time.time() + 90
    while time.time() < deadline and not os.path.exists(checkpoint):
        time.sleep(0.1)
    first = load_checkpoint(checkpoint)[1]["num_timesteps"]
    while time.time() < deadline and read_csv(metrics)["timesteps"][-1] < first + 2 * 256:
        time.sleep(0.05)
    proc.send_signal(getattr(signal, name))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert f"terminated ({name}); saved the last good checkpoint" in err
    _, meta = load_checkpoint(checkpoint)
    assert meta["num_timesteps"] > first and meta["num_timesteps"] % 256 == 0
    assert meta["num_timesteps"] in read_csv(metrics)["timesteps"]
    assert cli.main(["train", "--resume", run_dir, "--total-timesteps",
                     str(meta["num_timesteps"] + 256), "--quiet"]) == 0
    assert load_checkpoint(checkpoint)[1]["num_timesteps"] == meta["num_timesteps"] + 256


# -- problems reported by a fresh user (README in a clean venv) ---------------------------------

def _one_line_error(capsys, cmd):
    """The captured stderr is exactly one line ``ppo-ref <cmd>: ...``; returns it."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"ppo-ref {cmd}: "), err
    assert "Traceback" not in err
    return lines[0]


def _files(run_dir):
    return {name: open(os.path.join(run_dir, name), "rb").read() for name in sorted(os.listdir(run_dir))}


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A finished 512-step CartPole run (zoo preset, n_epochs=2)."""
    run_dir = str(tmp_path_factory.mktemp("saved") / "run")
    assert cli.main(["train", "--total-timesteps", "512", "--run-dir", run_dir, "--quiet",
                     "--set", "n_epochs=2"]) == 0
    return run_dir


@pytest.mark.parametrize("existing", ["checkpoint.npz", "metrics.csv"])
def test_train_refuses_a_run_dir_that_holds_a_run(saved_run, tmp_path, capsys, existing):
    run_dir = str(tmp_path / "r")
    os.makedirs(run_dir)
    with open(os.path.join(saved_run, existing), "rb") as src, open(os.path.join(run_dir, existing), "wb") as dst:
        dst.write(src.read())
    before = _files(run_dir)
    capsys.readouterr()
    assert cli.main(["train", "--total-timesteps", "256", "--run-dir", run_dir, "--quiet"]) == 2
    line = _one_line_error(capsys, "train")
    assert run_dir in line and f"--resume {run_dir}" in line and "--run-dir" in line
    assert _files(run_dir) == before  # nothing overwritten


def test_a_run_dir_stopped_before_its_first_update_can_be_reused(saved_run, tmp_path):
    # Ctrl-C before the first update leaves config.json and header-only CSVs, no checkpoint:
    # nothing to resume, so training into that directory again must be allowed.
    run_dir = tmp_path / "stopped_early"
    run_dir.mkdir()
    for name in ("config.json", "metrics.csv", "episodes.csv"):
        with open(os.path.join(saved_run, name), "rb") as src:
            head = src.read() if name == "config.json" else src.readline()
        (run_dir / name).write_bytes(head)
    (run_dir / "error.log").write_text("a failed earlier attempt's traceback\n")
    (run_dir / "learning_curve.png").write_bytes(b"ppo-ref plot DIR's output")
    assert cli.main(["train", "--total-timesteps", "256", "--run-dir", str(run_dir), "--quiet"]) == 0
    assert (run_dir / "checkpoint.npz").exists()
    assert len((run_dir / "metrics.csv").read_text().strip().splitlines()) == 2  # header + 1 update


def test_train_into_an_existing_empty_dir_is_fine(tmp_path):
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    assert cli.main(["train", "--total-timesteps", "256", "--run-dir", str(run_dir), "--quiet"]) == 0
    assert (run_dir / "checkpoint.npz").exists()


def test_train_into_a_dir_holding_only_a_gitkeep_is_fine(tmp_path):
    run_dir = tmp_path / "runs"
    run_dir.mkdir()
    (run_dir / ".gitkeep").write_text("")
    assert cli.main(["train", "--total-timesteps", "256", "--run-dir", str(run_dir),
                     "--quiet"]) == 0
    assert (run_dir / "checkpoint.npz").exists() and (run_dir / ".gitkeep").exists()


@pytest.mark.parametrize("async_", [False, True])
def test_train_refuses_an_existing_dir_holding_files_of_no_run(tmp_path, capsys, async_):
    run_dir = tmp_path / "thesis"
    (run_dir / "figures").mkdir(parents=True)
    for name in ("thesis.tex", "config.json.bak", ".tmp-notes.txt-1"):
        (run_dir / name).write_text("mine")
    before = sorted(p.name for p in run_dir.rglob("*"))
    capsys.readouterr()
    assert cli.main(["train", "--total-timesteps", "256", "--run-dir", str(run_dir), "--quiet",
                     *(["--async"] if async_ else [])]) == 2
    line = _one_line_error(capsys, "train")
    assert f"--run-dir {run_dir} is not empty" in line and "(.tmp-notes.txt-1, config.json.bak, " \
        "figures, ...)" in line, line
    assert sorted(p.name for p in run_dir.rglob("*")) == before   # nothing written or removed


def test_default_run_dirs_started_in_the_same_second_do_not_collide(tmp_path, monkeypatch):
    import ppo_ref.io.runlog as runlog
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runlog.time, "strftime", lambda fmt, *a: "20260101-000000")
    for _ in range(3):
        assert cli.main(["train", "--total-timesteps", "256", "--quiet", "--seed", "1"]) == 0
    base = "CartPole-v1-mlp-seed1-20260101-000000"
    assert sorted(os.listdir(tmp_path / "runs")) == [base, base + "-2", base + "-3"]
    for name in (base, base + "-2", base + "-3"):
        _, meta = load_checkpoint(tmp_path / "runs" / name / "checkpoint.npz")
        assert meta["num_timesteps"] == 256


def test_unique_dir_is_created_atomically(tmp_path):
    base = str(tmp_path / "x")
    made = [cli.make_unique_dir(base) for _ in range(3)]
    assert made == [base, base + "-2", base + "-3"] and all(os.path.isdir(d) for d in made)


def _fake_env_error(kind):
    import gymnasium
    env_id = f"PpoRefCliTest{kind}-v0"

    def entry(**kwargs):
        if kind == "Dependency":
            raise gymnasium.error.DependencyNotInstalled("Box2D is not installed, pip install box2d")
        raise ImportError("No module named 'not_a_real_physics_engine'")
    if env_id not in gymnasium.registry:
        gymnasium.register(env_id, entry_point=entry)
    return env_id


@pytest.mark.parametrize("env_id, message", [
    ("NoSuchEnv-v0", "doesn't exist"),
    ("ALE/Pong-v5", "Namespace ALE not found"),
    ("Taxi-v3", "deprecated"),
    ("Dependency", "Box2D is not installed"),
    ("Import", "not_a_real_physics_engine"),
])
@pytest.mark.parametrize("mode", [[], ["--policy", "lstm"], ["--async"]])
def test_env_problems_are_one_line_errors(tmp_path, capsys, env_id, message, mode):
    if env_id == "ALE/Pong-v5":
        try:
            import ale_py  # noqa: F401
            pytest.skip("ale_py is installed: ALE/Pong-v5 exists")
        except ImportError:
            pass
    if env_id in ("Dependency", "Import"):
        env_id = _fake_env_error(env_id)
    run_dir = tmp_path / "r"
    assert cli.main(["train", "--env", env_id, "--run-dir", str(run_dir), "--quiet", *mode]) == 2
    line = _one_line_error(capsys, "train")
    assert env_id in line and message in line
    assert not run_dir.exists()


@pytest.mark.parametrize("argv, words", [
    (["--vtrace"], ["--vtrace", "--async"]),
    (["--num-actors", "2"], ["--num-actors", "--async"]),
    (["--broadcast-every", "3"], ["--broadcast-every", "--async"]),
    (["--async", "--policy", "lstm"], ["--async", "lstm", "not supported"]),
    (["--async", "--env", "ppo_ref/MemoryCue-v0"], ["--async", "LSTM", "--policy mlp"]),
    (["--async", "--env", "Acrobot-v1"],   # every setting to turn off, in one line
     ["normalize_observations=false", "normalize_rewards=false", "clip_observations=none",
      "clip_rewards=none"]),
    (["--async", "--num-actors", "0"], ["--num-actors"]),
    (["--total-timesteps", "-5"], ["--total-timesteps"]),
    (["--total-timesteps", "0"], ["--total-timesteps"]),
    (["--checkpoint-every", "-1"], ["--checkpoint-every"]),
    (["--progress-every", "-1"], ["--progress-every"]),
    (["--n-envs", "0"], ["--n-envs"]),
    (["--preset", "nope"], ["nope", "zoo", "default", "reference", "sb3", "cleanrl", "thrust"]),
])
def test_bad_train_flags_are_rejected_before_a_run_dir_exists(tmp_path, capsys, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "r"
    assert cli.main(["train", "--run-dir", str(run_dir), "--quiet", *argv]) == 2
    line = _one_line_error(capsys, "train")
    for word in words:
        assert word in line
    assert not run_dir.exists() and not (tmp_path / "runs").exists()
    assert cli.main(["train", "--quiet", *argv]) == 2  # default run dir: not created either
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("argv, words", [
    (["--set", "use_sde=true"], ["use_sde", "Box", "Discrete"]),   # CartPole: the trainer's refusal
    (["--vectorization", "envpool", "--env", "ppo_ref/CartPoleNoVel-v1"],
     ["envpool", "ppo_ref/CartPoleNoVel-v1"]),   # an id envpool lacks (or envpool not installed)
])
def test_settings_the_trainer_refuses_are_refused_before_anything_is_printed(
        tmp_path, capsys, monkeypatch, argv, words):
    """A refusal at the trainer's construction comes before the zoo note: no output on stdout,
    one line on stderr, no run directory."""
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    for run_dir in ([], ["--run-dir", str(tmp_path / "r")]):
        assert cli.main(["train", *run_dir, *argv]) == 2
        out, err = capsys.readouterr()
        assert out == "", out
        assert len(err.strip().splitlines()) == 1 and err.startswith("ppo-ref train: "), err
        assert all(word in err for word in words), err
        assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("argv, flag", [
    (["--env", "Acrobot-v1"], "--env"),
    (["--policy", "lstm"], "--policy"),
    (["--seed", "3"], "--seed"),
    (["--n-envs", "4"], "--n-envs"),
    (["--preset", "cleanrl"], "--preset"),
    (["--set", "n_epochs=5"], "--set n_epochs=5"),
    (["--set", "n_epochs=2", "--set", "gamma=0.9"], "--set gamma=0.9"),
    (["--vectorization", "async"], "--vectorization"),
    (["--async"], "--async"),
    (["--run-dir", "elsewhere"], "--run-dir"),
])
def test_resume_rejects_flags_that_differ_from_the_saved_run(saved_run, capsys, argv, flag):
    before = _files(saved_run)
    capsys.readouterr()
    assert cli.main(["train", "--resume", saved_run, "--total-timesteps", "1024", "--quiet", *argv]) == 2
    line = _one_line_error(capsys, "train")
    assert flag in line and "--resume" in line
    assert _files(saved_run) == before


def test_resume_accepts_flags_equal_to_the_saved_run(saved_run, tmp_path, capsys):
    import shutil
    run_dir = str(tmp_path / "copy")
    shutil.copytree(saved_run, run_dir)
    assert cli.main(["train", "--resume", run_dir, "--total-timesteps", "768", "--quiet",
                     "--env", "CartPole-v1", "--policy", "mlp", "--seed", "0", "--n-envs", "8",
                     "--preset", "zoo", "--set", "n_epochs=2", "--run-dir", run_dir]) == 0
    _, meta = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"))
    assert meta["num_timesteps"] == 768


def test_extending_a_run_records_the_new_target_and_notes_the_schedules(saved_run, tmp_path,
                                                                        capsys):
    import shutil
    run_dir = str(tmp_path / "copy")
    shutil.copytree(saved_run, run_dir)
    info = json.load(open(os.path.join(run_dir, "config.json")))
    assert info["total_timesteps"] == 512 and info["config"]["lr_schedule"] == "linear"
    capsys.readouterr()
    assert cli.main(["train", "--resume", run_dir, "--total-timesteps", "768", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "target changed from 512 to 768" in err and "learning rate and clip range" in err
    info = json.load(open(os.path.join(run_dir, "config.json")))
    assert info["total_timesteps"] == 768 and info["resumed_at"] == [512]
    assert info["resume_argv"][-1][-3:] == ["--total-timesteps", "768", "--quiet"]
    import csv
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3                    # counts and flags are written as integers
    assert [(r["n_epochs_run"], r["n_gradient_steps"], r["kl_stopped"]) for r in rows] == \
        [("2", "2", "0")] * 3


def test_progress_eta_starts_after_the_first_update(tmp_path):
    import io
    from collections import deque
    from types import SimpleNamespace
    from ppo_ref.io.runlog import RunLogger
    stream = io.StringIO()
    logger = RunLogger(str(tmp_path / "run"), {"env_id": "X"}, progress_every=0.0, stream=stream)
    trainer = SimpleNamespace(n_updates=0, num_timesteps=0, n_episodes=0, total_timesteps=1024,
                              recent_returns=deque([1.0]), last_episodes=[],
                              state_arrays=lambda: {})
    logger.begin(trainer)
    for update in (1, 2, 3):
        trainer.n_updates, trainer.num_timesteps = update, 256 * update
        logger.callback(trainer, {})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].endswith("ETA       -")       # first update: compile time, no estimate
    assert lines[1].rstrip().endswith("s") and "ETA       -" not in lines[1]
    logger.close()


def test_resume_of_a_finished_run_says_how_to_extend_it(saved_run, capsys):
    before = _files(saved_run)
    capsys.readouterr()
    assert cli.main(["train", "--resume", saved_run, "--quiet"]) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "already reached" in text and "512" in text and "--total-timesteps" in text
    assert _files(saved_run) == before


def test_resume_of_an_async_run_without_its_settings_is_one_line(saved_run, tmp_path, capsys):
    """--async runs resume (tests/test_nothing_lost.py); one whose actor-learner settings are
    not recorded anywhere is refused with one line."""
    import json
    import shutil
    run_dir = str(tmp_path / "async_run")
    shutil.copytree(saved_run, run_dir)
    path = os.path.join(run_dir, "config.json")
    info = json.load(open(path))
    info["mode"] = "async"
    json.dump(info, open(path, "w"))
    assert cli.main(["train", "--resume", run_dir, "--total-timesteps", "1024", "--quiet"]) == 2
    assert "actor-learner settings" in _one_line_error(capsys, "train")


def test_resume_of_a_dir_without_checkpoint(tmp_path, capsys):
    assert cli.main(["train", "--resume", str(tmp_path / "none"), "--quiet"]) == 2
    assert "checkpoint" in _one_line_error(capsys, "train")


def test_partial_rollout_target_prints_a_note(tmp_path, capsys):
    run_dir = str(tmp_path / "r")
    assert cli.main(["train", "--total-timesteps", "10", "--run-dir", run_dir, "--quiet"]) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "whole rollouts" in text and "256" in text
    _, meta = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"))
    assert meta["num_timesteps"] == 256


@pytest.mark.parametrize("episodes", ["0", "-1"])
def test_eval_rejects_fewer_than_one_episode(saved_run, capsys, episodes):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cli.main(["eval", saved_run, "--episodes", episodes]) == 2
    assert "--episodes" in _one_line_error(capsys, "eval")


def test_eval_of_a_run_directory_without_a_checkpoint_says_when_one_is_written(tmp_path, capsys):
    assert cli.main(["eval", str(tmp_path)]) == 2
    message = _one_line_error(capsys, "eval")
    assert "no checkpoint.npz yet" in message and "--checkpoint-every" in message


def test_eval_of_a_file_that_is_not_a_checkpoint_says_so(tmp_path, capsys):
    not_a_run = tmp_path / "notes.txt"
    not_a_run.write_text("x")
    assert cli.main(["eval", str(not_a_run)]) == 2
    assert "is a file" in _one_line_error(capsys, "eval")


def test_version(capsys):
    import ppo_ref
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert ppo_ref.__version__ in capsys.readouterr().out


def test_foreign_checkpoint_is_named_as_such(tmp_path, capsys):
    path = tmp_path / "checkpoint.npz"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    assert cli.main(["eval", str(path)]) == 2
    line = _one_line_error(capsys, "eval")
    assert "not a ppo_ref checkpoint" in line and "pickle" not in line


@pytest.mark.skipif(not _have_matplotlib(), reason="plot needs matplotlib")
def test_plot_to_an_unwritable_path(saved_run, tmp_path, capsys):
    out = str(tmp_path / "no_such_dir" / "x.png")
    assert cli.main(["plot", saved_run, "--output", out]) == 2
    assert out in _one_line_error(capsys, "plot")


def test_plot_of_a_corrupt_csv(saved_run, tmp_path, capsys):
    import shutil
    run_dir = str(tmp_path / "c")
    shutil.copytree(saved_run, run_dir)
    with open(os.path.join(run_dir, "metrics.csv"), "a") as fh:
        fh.write("garbage,row\n")
    code = cli.main(["plot", run_dir])
    if _have_matplotlib():
        assert code == 2
        assert "metrics.csv" in _one_line_error(capsys, "plot")


def test_vectors_to_an_unwritable_dir(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert cli.main(["vectors", "--out", str(blocker / "sub")]) == 2
    assert str(blocker / "sub") in _one_line_error(capsys, "vectors")
    if os.path.isdir("/proc/self"):
        assert cli.main(["vectors", "--out", "/proc/nope"]) == 2
        assert "/proc/nope" in _one_line_error(capsys, "vectors")


@pytest.mark.parametrize("flags", [["--preset", "nope"], ["--set", "gamma=\"x\""],
                                   ["--set", "gama=0.9"]])  # (a typo no case has was ignored)
def test_vectors_refused_before_anything_is_written(tmp_path, capsys, flags):
    out = tmp_path / "vectors"
    assert cli.main(["vectors", "--out", str(out)] + flags) == 2
    _one_line_error(capsys, "vectors")
    assert not out.exists()


@pytest.mark.parametrize("preset", list(PRESETS))
def test_vectors_under_every_preset(tmp_path, capsys, preset):
    # (the policy-loss case with asymmetric bounds under a reciprocal-interval preset raised)
    assert cli.main(["vectors", "--preset", preset, "--out", str(tmp_path)]) == 0, \
        capsys.readouterr().err


def test_vectors_are_computed_by_the_spec_tier_by_default(tmp_path, capsys):
    from ppo_ref.vectors import write_vectors
    cli_dir, spec_dir = tmp_path / "cli", tmp_path / "spec"
    assert cli.main(["vectors", "--out", str(cli_dir)]) == 0
    names = write_vectors(str(spec_dir), backend="spec")
    for name in names + ["index"]:
        assert (cli_dir / f"{name}.json").read_bytes() == (spec_dir / f"{name}.json").read_bytes()


@pytest.fixture(scope="module")
def vectors_dir(tmp_path_factory):
    from ppo_ref.vectors import write_vectors
    out = str(tmp_path_factory.mktemp("vectors"))
    write_vectors(out)
    return out


@pytest.mark.parametrize("flag", ["--atol", "--rtol"])
def test_check_rejects_a_negative_tolerance(vectors_dir, tmp_path, capsys, flag):
    results = tmp_path / "results.json"
    results.write_text('{"format": "ppo_ref.results/1", "cases": {}}')
    assert cli.main(["check", vectors_dir, "--results", str(results), flag, "-1"]) == 2
    assert f"{flag} must be" in _one_line_error(capsys, "check")


def test_check_file_errors_are_one_line(vectors_dir, tmp_path, capsys):
    missing = str(tmp_path / "nonexistent.json")
    assert cli.main(["check", vectors_dir, "--results", missing]) == 2
    assert missing in _one_line_error(capsys, "check")
    not_json = tmp_path / "results.json"
    not_json.write_text("this is not JSON {")
    assert cli.main(["check", vectors_dir, "--results", str(not_json)]) == 2
    assert str(not_json) in _one_line_error(capsys, "check")
    wrong_shape = tmp_path / "list.json"
    wrong_shape.write_text('{"format": "ppo_ref.results/1", "cases": [1, 2]}')
    assert cli.main(["check", vectors_dir, "--results", str(wrong_shape)]) == 2
    assert str(wrong_shape) in _one_line_error(capsys, "check")
    no_dir = str(tmp_path / "no_vectors")
    assert cli.main(["check", no_dir, "--results", str(not_json)]) == 2
    line = _one_line_error(capsys, "check")
    assert no_dir in line and "vectors" in line


def test_an_error_inside_training_is_one_line_and_exit_3(tmp_path, monkeypatch, capsys):
    """Any exception raised while training (a bug included) ends the run with one line and exit
    status 3, never a traceback on the terminal; the traceback goes to DIR/error.log."""
    from ppo_ref.train.ppo import PPOTrainer

    def broken_learn(self, total_timesteps, callback=None):
        raise ValueError("internal bug inside learn")
    monkeypatch.setattr(PPOTrainer, "learn", broken_learn)
    run_dir = tmp_path / "r"
    capsys.readouterr()
    assert cli.main(["train", "--total-timesteps", "256", "--run-dir", str(run_dir), "--quiet"]) == 3
    line = _one_line_error(capsys, "train")
    assert "ValueError: internal bug inside learn" in line and "error.log" in line
    assert "internal bug inside learn" in (run_dir / "error.log").read_text()
    assert "Traceback" in (run_dir / "error.log").read_text()


def test_check_with_a_results_file_of_the_wrong_format(vectors_dir, tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text('{"format": "something/else", "cases": {}}')
    assert cli.main(["check", vectors_dir, "--results", str(path)]) == 2
    line = _one_line_error(capsys, "check")
    assert str(path) in line and "ppo_ref.results/1" in line


@pytest.mark.parametrize("results, tolerances, flags, flag", [
    ('{"format": "something/else", "cases": {}}', None, [], "--results"),
    ('{"format": "ppo_ref.results/1", "cases": {}}', None, ["--atol", "nan"], "--atol"),
    ('{"format": "ppo_ref.results/1", "cases": {}}', '{"gae_reference": {"atol": -1}}', [],
     "--tolerances"),
    ('{"format": "ppo_ref.results/1", "cases": {}}', '[1, 2]', [], "--tolerances"),
    ('{"format": "ppo_ref.results/1", "cases": {}}', '[1, 2', [], "--tolerances"),
    ('{"format": "ppo_ref.results/1", "cases": {}}', None, ["--skip-output", "nosuch"],
     "--skip-output names no output of these vectors: ['nosuch']"),
    ('{"format": "ppo_ref.results/1", "cases": {}}', None,
     ["--skip-output", "clip_fraction", "--skip-output", "gae_reference/nosuch"],
     "--skip-output names no output of these vectors: ['gae_reference/nosuch']")])
def test_check_errors_name_the_flag_typed(vectors_dir, tmp_path, capsys, results, tolerances,
                                          flags, flag):
    # (the command printed check_results' parameter name: "results_file format must be ...")
    path = tmp_path / "r.json"
    path.write_text(results)
    if tolerances is not None:
        (tmp_path / "tol.json").write_text(tolerances)
        flags = flags + ["--tolerances", str(tmp_path / "tol.json")]
    assert cli.main(["check", vectors_dir, "--results", str(path)] + flags) == 2
    line = _one_line_error(capsys, "check")
    assert line.startswith(f"ppo-ref check: error: {flag}"), line
    assert "results_file" not in line


# -- loading never imports code without consent ------------------------------------------------------

def test_eval_and_resume_import_an_env_module_only_with_allow_import(saved_run, tmp_path, capsys):
    from ppo_ref.io.checkpoint import save_checkpoint
    name = "ppo_ref_cli_untrusted_env"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(
        "import gymnasium, pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('ran')\n"
        "gymnasium.register('PpoRefCliUntrusted-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv',"
        " max_episode_steps=500)\n")
    run_dir = tmp_path / "downloaded"
    run_dir.mkdir()
    arrays, meta = load_checkpoint(os.path.join(saved_run, "checkpoint.npz"))
    meta.pop("format_version")
    meta["env_id"] = f"{name}:PpoRefCliUntrusted-v0"
    meta["total_timesteps"] = 512
    save_checkpoint(run_dir / "checkpoint.npz", arrays, meta)
    sys.path.insert(0, str(tmp_path))
    try:
        capsys.readouterr()
        for argv in (["eval", str(run_dir), "--episodes", "1"],
                     ["train", "--resume", str(run_dir), "--total-timesteps", "768", "--quiet"]):
            assert cli.main(argv) == 2
            line = _one_line_error(capsys, argv[0])
            assert name in line and "--allow-import" in line
            assert not marker.exists() and name not in sys.modules
        assert cli.main(["eval", str(run_dir), "--episodes", "1", "--allow-import"]) == 0
        assert marker.exists()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


# -- one writer per run directory -----------------------------------------------------------------

def _wait_for(predicate, proc, seconds=120):
    import time
    deadline = time.monotonic() + seconds
    while not predicate():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_second_writer_of_a_training_run_dir_is_refused(tmp_path):
    """While one process trains into DIR, a second ``train --run-dir DIR`` or ``--resume DIR``
    is refused with one line and touches nothing in DIR."""
    import signal
    run_dir = str(tmp_path / "busy")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    first = subprocess.Popen([sys.executable, "-m", "ppo_ref", "train", "--total-timesteps", "10000000",
                              "--run-dir", run_dir, "--quiet", "--checkpoint-every", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _wait_for(lambda: os.path.exists(os.path.join(run_dir, "checkpoint.npz")), first)
        config_before = open(os.path.join(run_dir, "config.json"), "rb").read()
        for argv in (["--run-dir", run_dir, "--total-timesteps", "1024"],
                     ["--resume", run_dir, "--total-timesteps", "20000000"]):
            second = subprocess.run([sys.executable, "-m", "ppo_ref", "train", "--quiet", *argv],
                                    capture_output=True, text=True, env=env, timeout=120)
            assert second.returncode == 2, second.stderr
            lines = second.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
            assert run_dir in lines[0] and "in use by another ppo-ref process" in lines[0]
            assert str(first.pid) in lines[0]
            assert open(os.path.join(run_dir, "config.json"), "rb").read() == config_before
            assert first.poll() is None
        metrics = open(os.path.join(run_dir, "metrics.csv")).read().splitlines()
        assert metrics[0].startswith("update,") and len(metrics) > 1
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=120)
    assert first.returncode == 130
    assert not os.path.exists(os.path.join(run_dir, ".lock"))  # released and removed at exit
    done = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"))[1]["num_timesteps"]
    assert cli.main(["train", "--resume", run_dir, "--total-timesteps", str(done + 256), "--quiet"]) == 0


def test_the_run_dir_lock_is_exclusive_within_a_process_too(tmp_path):
    with cli.run_dir_lock(str(tmp_path / "d")):
        with pytest.raises(cli.UsageError, match="in use"):
            with cli.run_dir_lock(str(tmp_path / "d")):
                pass
    with cli.run_dir_lock(str(tmp_path / "d")):  # released
        pass


# -- a failure never loses finished work ------------------------------------------------------------

def _fail_update(monkeypatch, at, exc):
    """Make the ``at``-th PPOTrainer.train_on (the epochs of an update) of this process raise
    ``exc`` (once)."""
    from ppo_ref.train.ppo import PPOTrainer
    real = PPOTrainer.train_on
    calls = []

    def failing(self, rollout, advantages, returns):
        calls.append(1)
        if len(calls) == at:
            self.n_updates += 1  # a half-done update: the counters must come from the snapshot
            raise exc
        return real(self, rollout, advantages, returns)
    monkeypatch.setattr(PPOTrainer, "train_on", failing)
    return real


@pytest.mark.parametrize("exc", [FloatingPointError("overflow in the gradient norm"),
                                 ValueError("advantages overflowed to inf"),
                                 MemoryError()])
def test_a_failed_update_saves_the_last_good_state_and_resumes_exactly(tmp_path, monkeypatch,
                                                                       capsys, exc):
    _, full = _train(tmp_path, "full")
    real = _fail_update(monkeypatch, 3, exc)
    capsys.readouterr()
    code, part = _train(tmp_path, "part")
    assert code == 3
    line = _one_line_error(capsys, "train")
    assert type(exc).__name__ in line and "512 steps" in line and f"--resume {part}" in line
    _, meta = load_checkpoint(os.path.join(part, "checkpoint.npz"))
    assert (meta["num_timesteps"], meta["n_updates"]) == (512, 2)
    episodes = read_csv(os.path.join(part, "episodes.csv"))
    assert len(episodes["episode"]) == meta["n_episodes"]
    assert list(read_csv(os.path.join(part, "metrics.csv"))["update"]) == [1, 2]
    from ppo_ref.train.ppo import PPOTrainer
    monkeypatch.setattr(PPOTrainer, "train_on", real)
    assert cli.main(["train", "--resume", part, "--quiet"]) == 0
    for name in ("metrics.csv", "episodes.csv"):
        assert open(os.path.join(full, name), "rb").read() == open(os.path.join(part, name), "rb").read()


def _register_raising():
    import gymnasium as gym

    class Raising(gym.Wrapper):
        """CartPole whose ``at``-th step raises RuntimeError or returns an array reward."""

        def __init__(self, at=100, what="raise"):
            super().__init__(gym.make("CartPole-v1", disable_env_checker=True))
            self.at, self.what, self.steps = at, what, 0

        def reset(self, **kwargs):
            self.resets = getattr(self, "resets", 0) + 1
            if self.what == "reset" and self.resets == self.at:
                raise RuntimeError("reset failed: simulator exploded")
            return self.env.reset(**kwargs)

        def step(self, action):
            self.steps += 1
            obs, reward, terminated, truncated, info = self.env.step(action)
            if self.steps == self.at and self.what != "reset":
                if self.what == "raise":
                    raise RuntimeError("simulator exploded")
                reward = np.array([1.0, 2.0])
            return obs, reward, terminated, truncated, info
    env_id = "ppo_ref_test/Raising-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=Raising)
    return env_id


def _raising_trainer(**env_kwargs):
    from ppo_ref.train.ppo import PPOTrainer

    class Raising(PPOTrainer):
        def __init__(self, env, config=None, **kw):
            kw.setdefault("env_kwargs", env_kwargs)
            super().__init__(env, config, **kw)
    return Raising


@pytest.mark.parametrize("at, words", [(1, ["cannot train", "RuntimeError", "reset failed"]),
                                       (10, ["last good checkpoint", "reset failed"])])
def test_an_env_raising_in_reset_is_one_line(tmp_path, capsys, at, words):
    """At the first reset (while the trainer is built): exit 2, no run directory; at a later
    reset (an autoreset while training): exit 3 with the last good checkpoint."""
    import ppo_ref.train.ppo as ppo_module
    env_id = _register_raising()
    ppo_module.RaisingForTest = _raising_trainer(at=at, what="reset")
    cli.TRAINERS["raising_test"] = "ppo_ref.train.ppo:RaisingForTest"
    run_dir = tmp_path / "r"
    try:
        capsys.readouterr()
        code = cli.main(["train", "--env", env_id, "--policy", "raising_test", "--preset", "zoo",
                         "--total-timesteps", "8192", "--run-dir", str(run_dir), "--quiet"])
    finally:
        del cli.TRAINERS["raising_test"]
        del ppo_module.RaisingForTest
    line = _one_line_error(capsys, "train")
    for word in words:
        assert word in line
    if at == 1:
        assert code == 2 and not run_dir.exists()
    else:
        assert code == 3
        _, meta = load_checkpoint(run_dir / "checkpoint.npz")
        assert meta["n_updates"] >= 1


@pytest.mark.parametrize("what", ["raise", "array_reward"])
def test_an_env_raising_in_step_saves_the_last_good_state(tmp_path, capsys, what):
    env_id = _register_raising()
    Raising = _raising_trainer(at=100, what=what)
    import ppo_ref.train.ppo as ppo_module
    ppo_module.RaisingForTest = Raising
    cli.TRAINERS["raising_test"] = "ppo_ref.train.ppo:RaisingForTest"
    run_dir = str(tmp_path / "r")
    try:
        capsys.readouterr()
        code = cli.main(["train", "--env", env_id, "--policy", "raising_test", "--preset", "zoo",
                         "--total-timesteps", "4096", "--run-dir", run_dir, "--quiet"])
    finally:
        del cli.TRAINERS["raising_test"]
        del ppo_module.RaisingForTest
    assert code == 3
    line = _one_line_error(capsys, "train")
    assert "last good checkpoint" in line
    _, meta = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"))
    assert meta["num_timesteps"] == 3 * 256  # vector step 100 is in the 4th rollout of 32 steps


def test_a_run_that_failed_before_its_first_update_can_be_reused_or_restarted(tmp_path, monkeypatch,
                                                                             capsys):
    real = _fail_update(monkeypatch, 1, FloatingPointError("invalid value in the loss"))
    run_dir = str(tmp_path / "r")
    capsys.readouterr()
    assert cli.main(["train", "--total-timesteps", "512", "--run-dir", run_dir, "--quiet",
                     "--seed", "3"]) == 3
    line = _one_line_error(capsys, "train")
    assert "no update had completed" in line and f"--resume {run_dir}" in line
    assert not os.path.exists(os.path.join(run_dir, "checkpoint.npz"))
    from ppo_ref.train.ppo import PPOTrainer
    monkeypatch.setattr(PPOTrainer, "train_on", real)
    # --resume restarts it from scratch with its saved settings, saying so
    assert cli.main(["train", "--resume", run_dir, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "no checkpoint" in out and "from scratch" in out
    _, meta = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"))
    assert meta["num_timesteps"] == 512 and meta["seed"] == 3
    # and after the same failure, --run-dir again reuses the directory
    other = str(tmp_path / "o")
    _fail_update(monkeypatch, 1, FloatingPointError("x"))
    assert cli.main(["train", "--total-timesteps", "256", "--run-dir", other, "--quiet"]) == 3
    monkeypatch.setattr(PPOTrainer, "train_on", real)
    assert cli.main(["train", "--total-timesteps", "256", "--run-dir", other, "--quiet"]) == 0


def test_metrics_rows_without_a_checkpoint_can_be_restarted_with_resume(saved_run, tmp_path):
    """A run killed before its first checkpoint leaves metrics rows and no checkpoint: --resume
    restarts it from scratch (the rows are dropped), instead of a dead end."""
    run_dir = tmp_path / "killed"
    run_dir.mkdir()
    for name in ("config.json", "metrics.csv", "episodes.csv"):
        (run_dir / name).write_bytes(open(os.path.join(saved_run, name), "rb").read())
    assert cli.main(["train", "--resume", str(run_dir), "--quiet"]) == 0
    for name in ("metrics.csv", "episodes.csv"):
        assert open(os.path.join(saved_run, name), "rb").read() == (run_dir / name).read_bytes()


@pytest.mark.parametrize("name, partial", [
    ("metrics.csv", "2,512,5,22.4,-0.01"),       # a row cut short (update 2 <= the checkpoint's)
    ("metrics.csv", "\x00\x00\x00"),             # a crash that left zeros
    ("episodes.csv", "99,3,12.0,12,1024,"),      # the update column cut off
    ("episodes.csv", "99,3,12.0,12,1024,4"),     # complete-looking but no line end
])
def test_a_partial_last_csv_row_does_not_break_resume_nor_survive(tmp_path, monkeypatch, name, partial):
    _, full = _train(tmp_path, "full")
    original = RunLogger.callback

    def stop_at_1024(self, trainer, stats):
        keep_going = original(self, trainer, stats)
        if trainer.num_timesteps >= 1024:
            self.request_stop()
            return False
        return keep_going
    monkeypatch.setattr(RunLogger, "callback", stop_at_1024)
    code, part = _train(tmp_path, "part")
    assert code == 130
    monkeypatch.setattr(RunLogger, "callback", original)
    with open(os.path.join(part, name), "a", newline="") as fh:
        fh.write(partial)  # ENOSPC or a crash mid-row: no line end
    assert cli.main(["train", "--resume", part, "--quiet"]) == 0
    for csv_name in ("metrics.csv", "episodes.csv"):
        assert open(os.path.join(full, csv_name), "rb").read() == open(os.path.join(part, csv_name), "rb").read()


def test_read_csv_ignores_a_partial_last_row(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("update,timesteps\r\n1,256\r\n2,51")
    assert list(read_csv(str(path))["timesteps"]) == [256.0]


def test_advantages_overflowing_end_the_run_with_one_line(tmp_path, capsys):
    """Rewards of 1e300 make the advantages' variance overflow inside the first update: exit 3,
    one line, and the directory can be reused (no update completed, nothing to keep)."""
    import gymnasium as gym

    class Huge(gym.Wrapper):
        def __init__(self):
            super().__init__(gym.make("CartPole-v1", disable_env_checker=True))

        def step(self, action):
            obs, _, terminated, truncated, info = self.env.step(action)
            return obs, 1e300, terminated, truncated, info
    env_id = "ppo_ref_test/HugeReward-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=Huge)
    run_dir = str(tmp_path / "r")
    capsys.readouterr()
    assert cli.main(["train", "--env", env_id, "--preset", "zoo", "--total-timesteps", "512",
                     "--run-dir", run_dir, "--quiet"]) == 3
    line = _one_line_error(capsys, "train")
    assert "training failed" in line and "no update had completed" in line
    assert os.path.exists(os.path.join(run_dir, "error.log"))
    assert cli.main(["train", "--total-timesteps", "256", "--run-dir", run_dir, "--quiet"]) == 0
    assert not os.path.exists(os.path.join(run_dir, "error.log"))  # the failed attempt's, gone


def test_a_setting_without_effect_is_one_warning_line(capsys):
    assert cli.main(["train", "--list-fields", "--set", "huber_delta=2"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert lines == ["ppo-ref train: warning: PPOConfig: settings that have no effect in this "
                     "configuration: huber_delta=2.0 (it needs value_loss_mode='huber')"]
