"""``ppo-ref train --async``: run directory, checkpoint, progress line with the policy lag."""
import json
import multiprocessing
import os
import re

import numpy as np

from ppo_ref.cli import main
from ppo_ref.io.runlog import read_csv


def test_train_async_writes_the_run_directory(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    code = main(["train", "--async", "--num-actors", "2", "--vtrace", "--broadcast-every", "2",
                 "--total-timesteps", "1024", "--set", "n_epochs=2", "--run-dir", run_dir,
                 "--progress-every", "0"])
    assert code == 0
    out = capsys.readouterr().out
    assert "2 process actors" in out
    # the progress lines give each update's lag, the closing line their mean over the run (update
    # 1 acts with version 0: lag 0) next to the last update's, so 0.99 and 1.00 are not a clash
    each = re.findall(r"\| policy lag mean (\d\.\d\d) max (\d+)\n", out)
    closing = re.search(r"policy lag mean (\d\.\d\d) over 4 updates \(the last (\d\.\d\d)\) "
                        r"max (\d+), ", out)
    assert len(each) == 4 and closing is not None, out
    assert abs(float(closing[1]) - np.mean([float(m) for m, _ in each])) <= 0.0101, out
    assert closing[2] == each[-1][0] and int(closing[3]) == max(int(n) for _, n in each), out
    info = json.load(open(os.path.join(run_dir, "config.json")))
    assert info["mode"] == "async"
    al = info["actor_learner"]
    assert (al["num_actors"], al["use_vtrace"], al["broadcast_every"]) == (2, True, 2)
    assert al["n_steps"] == 32 * 8 // 2                  # zoo batch of 256 rows, split over actors
    metrics = read_csv(os.path.join(run_dir, "metrics.csv"))
    assert list(metrics["update"]) == [1.0, 2.0, 3.0, 4.0]
    assert list(metrics["timesteps"]) == [256.0, 512.0, 768.0, 1024.0]
    episodes = read_csv(os.path.join(run_dir, "episodes.csv"))
    assert set(episodes["env"]) <= {0.0, 1.0}
    from ppo_ref.train.ppo import PPOTrainer
    trainer = PPOTrainer.load(os.path.join(run_dir, "checkpoint.npz"))
    assert trainer.num_timesteps == 1024 and trainer.n_updates == 4
    trainer.close()
    assert main(["eval", run_dir, "--episodes", "2"]) == 0
    assert multiprocessing.active_children() == []


def test_train_async_with_an_uneven_split_is_a_one_line_error(tmp_path, capsys):
    run_dir = tmp_path / "run"
    # zoo: 256 rows per update = 32 steps x 8 envs; 3 actors cannot share them evenly, also
    # not with a batch_size that would fit 3 x 85 = 255 rows
    for extra in ([], ["--set", "batch_size=85"]):
        code = main(["train", "--async", "--num-actors", "3", "--run-dir", str(run_dir),
                     "--quiet"] + extra)
        assert code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "num_actors (3) must divide" in err[0] and "256" in err[0]
        assert "[1, 2, 4, 8, 16, 32, 64, 128, 256]" in err[0]
        assert not run_dir.exists()


def test_an_env_the_learner_refuses_is_one_line_before_any_output(tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)  # (the default run directory would be under ./runs)
    assert main(["train", "--async", "--env", "Blackjack-v1", "--total-timesteps", "100"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1, captured
    assert "cannot train mlp on Blackjack-v1" in captured.err and "Box" in captured.err
    assert os.listdir(tmp_path) == []


def test_async_config_from_ppo_splits_the_batch_and_refuses_too_many_processes():
    from ppo_ref.distributed import MAX_PROCESS_ACTORS_PER_CPU, async_config_from_ppo
    from ppo_ref.config import PPOConfig
    import pytest
    ppo = PPOConfig.zoo_cartpole()
    c = async_config_from_ppo(ppo, num_actors=4, total_timesteps=1000)
    assert (c.n_steps, c.num_actors) == (64, 4)
    assert c.num_updates == 4                  # 1000 steps -> ceil(1000 / 256) whole updates
    cpus = os.cpu_count() or 1
    too_many = MAX_PROCESS_ACTORS_PER_CPU * cpus * 2  # divides the 8 * too_many rows of big
    big = ppo.replace(n_steps=too_many, batch_size=too_many)
    with pytest.raises(ValueError, match="actor processes per CPU core"):
        async_config_from_ppo(big, num_actors=too_many, total_timesteps=10_000)
    threads = async_config_from_ppo(big, num_actors=too_many, total_timesteps=10_000,
                                    actors="thread")
    assert threads.n_steps == 8


def test_overshoot_note_speaks_of_updates_of_the_actors(capsys):
    from ppo_ref.distributed import async_config_from_ppo
    from ppo_ref.cli.common import rollout_note
    from ppo_ref.config import PPOConfig
    config = async_config_from_ppo(PPOConfig.zoo_cartpole(), num_actors=2, total_timesteps=5000)
    rollout_note(config.learner_ppo_config(), 0, 5000, unit="update",
                  factors="num_actors*n_steps")
    err = capsys.readouterr().err.strip()
    assert err == ("ppo-ref: note: training runs whole updates of num_actors*n_steps = 2*128 = "
                   "256 steps: 20 updates to reach --total-timesteps 5000, 5120 steps in all")
    rollout_note(PPOConfig.zoo_cartpole(), 0, 1000)
    assert "whole rollouts of n_steps*n_envs = 32*8 = 256 steps: 4 rollouts" in capsys.readouterr().err


def test_actor_kind_flags_are_checked_in_one_line(tmp_path, capsys, monkeypatch):
    import importlib.util
    run_dir = tmp_path / "run"
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "ray" else real_find_spec(name, *args))
    for argv, text in (
            (["--async", "--actors", "ray"], "--actors ray needs Ray, which is not installed: "
                                             "pip install 'ppo_ref[ray]'"),
            (["--async", "--ray-address", "127.0.0.1:6379"], "--ray-address only applies with "
                                                             "--actors ray"),
            (["--actors", "thread"], "--actors only applies to the actor-learner")):
        assert main(["train", *argv, "--run-dir", str(run_dir), "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("ppo-ref train: error: ") and text in err[0]
        assert not run_dir.exists()


def test_ray_actors_without_ray_is_one_clear_error(monkeypatch):
    import sys
    import pytest
    from ppo_ref.distributed import AsyncActorLearnerConfig, start_actors
    monkeypatch.setitem(sys.modules, "ray", None)          # import ray fails
    config = AsyncActorLearnerConfig(num_actors=2, n_steps=32, actors="ray")
    with pytest.raises(ImportError, match=r"^actors='ray' needs Ray, which is not installed: "
                                          r"pip install 'ppo_ref\[ray\]'$"):
        start_actors(config, "CartPole-v1")


def test_a_terminals_ctrl_c_while_the_actors_start_is_one_line(tmp_path):
    """Ctrl-C on a terminal reaches the whole process group: the actor processes, still
    importing, must not print a KeyboardInterrupt traceback each (they start with SIGINT
    ignored; the learner stops them)."""
    import signal
    import subprocess
    import sys
    import time
    import pytest
    if not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"):
        pytest.skip("needs Linux's /proc/PID/task/TID/children to see the actors start")
    proc = subprocess.Popen([sys.executable, "-m", "ppo_ref", "train", "--async",
                             "--num-actors", "2", "--total-timesteps", "100000", "--run-dir",
                             str(tmp_path / "run")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, text=True)
    children = f"/proc/{proc.pid}/task/{proc.pid}/children"
    deadline = time.monotonic() + 120
    try:
        # the two actors and multiprocessing's resource tracker started
        while not (os.path.exists(children) and len(open(children).read().split()) >= 3):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.01)
        time.sleep(0.3)                         # the actors import numpy, numba, gymnasium
        os.killpg(proc.pid, signal.SIGINT)      # as the terminal does, actors included
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
