"""``ppo-ref train --seeds``: one ordinary run per seed, run concurrently, and their summary."""
import csv
import json
import os

import numpy as np
import pytest

from ppo_ref import cli
from ppo_ref.cli.common import UsageError
from ppo_ref.cli.seeds import parse_seeds

STEPS = ["--total-timesteps", "1024", "--set", "n_epochs=2"]


def _returns(run_dir):
    with open(os.path.join(run_dir, "episodes.csv"), newline="") as f:
        return [float(row["return"]) for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def seeds_dir(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("seeds") / "runs")
    code = cli.main(["train", "--seeds", "0-1", "--jobs", "2", "--run-dir", run_dir, *STEPS])
    assert code == 0
    return run_dir


def test_each_seed_is_the_run_that_seed_gives_alone(seeds_dir, tmp_path):
    alone = str(tmp_path / "alone")
    assert cli.main(["train", "--seed", "1", "--run-dir", alone, "--quiet", *STEPS]) == 0
    for name in ("metrics.csv", "episodes.csv"):
        with open(os.path.join(alone, name), "rb") as a, \
                open(os.path.join(seeds_dir, "seed1", name), "rb") as b:
            assert a.read() == b.read(), name
    assert _returns(os.path.join(seeds_dir, "seed0")) != _returns(os.path.join(seeds_dir, "seed1"))


def test_summary_states_the_spread_of_the_final_return(seeds_dir):
    with open(os.path.join(seeds_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["seeds"] == [0, 1]
    assert [r["seed"] for r in summary["runs"]] == [0, 1]
    finals = []
    for run in summary["runs"]:
        assert run["exit_code"] == 0 and run["timesteps"] == 1024
        last = _returns(os.path.join(seeds_dir, f"seed{run['seed']}"))[-20:]
        finals.append(sum(last) / len(last))
        assert run["final_return"] == pytest.approx(finals[-1], rel=1e-12)
        assert run["steps_per_second"] > 0
    stats = summary["final_return"]
    assert stats["n"] == 2
    assert stats["mean"] == pytest.approx(np.mean(finals), rel=1e-12)
    assert stats["std"] == pytest.approx(np.std(finals, ddof=1), rel=1e-12)
    assert (stats["min"], stats["max"]) == (min(finals), max(finals))


def test_plot_draws_the_seeds(seeds_dir):
    pytest.importorskip("matplotlib")
    assert cli.main(["plot", seeds_dir]) == 0
    with open(os.path.join(seeds_dir, "learning_curves.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("text, seeds", [("0-3", [0, 1, 2, 3]), ("5", [5]),
                                         ("0,3,5", [0, 3, 5]), ("0-1,7", [0, 1, 7])])
def test_parse_seeds(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text, words", [
    ("3-1", "increasing"), ("a", "ranges like"), ("0,0", "seed 0 more than once"),
    ("0-1,1", "seed 1 more than once"), ("-1", "ranges like"), ("0-300", "at most 256"),
    ("", "ranges like")])
def test_bad_seeds_name_the_flag(text, words):
    with pytest.raises(UsageError, match="--seeds") as info:
        parse_seeds(text)
    assert words in str(info.value)


@pytest.mark.parametrize("extra, message", [
    (["--seeds", "0-1", "--seed", "3"], "--seeds cannot be combined with --seed"),
    (["--seeds", "0-1", "--async"], "--seeds cannot be combined with --async"),
    (["--seeds", "0-1", "--resume", "x"], "--seeds cannot be combined with --resume"),
    (["--jobs", "2"], "--jobs only applies with --seeds"),
    (["--seeds", "0-1", "--jobs", "0"], "--jobs must be >= 1"),
])
def test_flag_clashes_are_usage_errors(extra, message, capsys, tmp_path):
    assert cli.main(["train", "--run-dir", str(tmp_path / "r"), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "r")


def test_a_run_dir_that_is_not_empty_is_refused(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "keep.txt").write_text("x")
    assert cli.main(["train", "--seeds", "0-1", "--run-dir", str(tmp_path / "r"), *STEPS]) == 2
    assert "must be a new or empty directory" in capsys.readouterr().err


@pytest.mark.parametrize("name, code", [("SIGTERM", 143), ("SIGHUP", 129)])
def test_sigterm_stops_every_seed_and_still_writes_the_summary(tmp_path, name, code):
    """SIGTERM (or SIGHUP: the terminal closed) to the --seeds parent reaches every running seed
    as SIGTERM (each saves its last completed update and can be resumed) and the summary of the
    stopped runs is written; nothing is left running."""
    import signal
    import subprocess
    import sys
    import time
    run_dir = str(tmp_path / "runs")
    proc = subprocess.Popen([sys.executable, "-m", "ppo_ref", "train", "--seeds", "0-1",
                             "--jobs", "2", "--run-dir", run_dir, "--total-timesteps",
                             "1000000", "--checkpoint-every", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    checkpoints = [os.path.join(run_dir, f"seed{s}", "checkpoint.npz") for s in (0, 1)]
    while not all(os.path.exists(c) for c in checkpoints):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    proc.send_signal(getattr(signal, name))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == code, out
    with open(os.path.join(run_dir, "summary.json")) as f:
        runs = json.load(f)["runs"]
    logs = {r["seed"]: open(os.path.join(run_dir, f"seed{r['seed']}.log")).read()[-3000:]
            for r in runs if r["exit_code"] != 143}  # what a seed that did not stop said
    assert [r["exit_code"] for r in runs] == [143, 143], logs
    for r in runs:  # each stopped run resumes where it stopped
        saved = r["timesteps"]
        assert 0 < saved < 1_000_000
        assert cli.main(["train", "--resume", r["run_dir"], "--total-timesteps",
                         str(saved + 256), "--quiet"]) == 0
        with open(os.path.join(r["run_dir"], "metrics.csv")) as f:
            assert f.read().splitlines()[-1].split(",")[1] == str(saved + 256)


@pytest.mark.parametrize("to_group", [True, False], ids=["terminal", "parent-only"])
def test_one_ctrl_c_lets_every_seed_finish_its_update(tmp_path, to_group):
    """Ctrl-C in the terminal (the parent's process group) or a SIGINT to the parent alone
    reaches every seed once: each finishes its update, saves and exits 130 (not SIGTERM's
    143), and the parent writes the summary; the seed not yet started is named."""
    import signal
    import subprocess
    import sys
    import time
    run_dir = str(tmp_path / "runs")
    proc = subprocess.Popen([sys.executable, "-m", "ppo_ref", "train", "--seeds", "0-2",
                             "--jobs", "2", "--run-dir", run_dir, "--total-timesteps",
                             "1000000", "--checkpoint-every", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    checkpoints = [os.path.join(run_dir, f"seed{s}", "checkpoint.npz") for s in (0, 1)]
    while not all(os.path.exists(c) for c in checkpoints):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    if to_group:
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does
    else:
        proc.send_signal(signal.SIGINT)  # kill -INT PID
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    assert [r["exit_code"] for r in summary["runs"]] == [130, 130]
    assert summary["not_started"] == [2]
    assert b"seeds not started: 2" in out


def test_a_second_seeds_run_into_a_busy_directory_is_refused(tmp_path, capsys, monkeypatch):
    """The --seeds parent holds its run directory's lock while its seeds run: a second
    ``--seeds`` into the directory is refused with the single run's line, writing nothing
    there; the lock file is removed when the seeds end."""
    import ppo_ref.cli.seeds as seeds_module
    run_dir = str(tmp_path / "runs")
    os.mkdir(run_dir)  # an empty directory is accepted (a new one too)
    second = []

    def seeds_running(args, directory):
        assert os.listdir(directory) == [".lock"]
        second.append(cli.main(["train", "--seeds", "0-1", "--run-dir", run_dir, *STEPS]))
        second.append(capsys.readouterr().err)
        assert os.listdir(directory) == [".lock"]
        return 0
    monkeypatch.setattr(seeds_module, "cmd_train_seeds", seeds_running)
    assert cli.main(["train", "--seeds", "0-1", "--run-dir", run_dir, *STEPS]) == 0
    code, err = second
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert run_dir in lines[0] and "in use by another ppo-ref process" in lines[0]
    assert f"pid {os.getpid()}" in lines[0]
    assert os.listdir(run_dir) == []  # the lock file is removed


@pytest.mark.parametrize("argv", [["eval"], ["train", "--resume"]])
def test_eval_and_resume_of_a_seeds_directory_name_a_seed_run(tmp_path, capsys, argv):
    for seed in (0, 1):
        (tmp_path / f"seed{seed}").mkdir()
    assert cli.main([*argv, str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds the runs of --seeds" in err[0], err
    assert str(tmp_path / "seed0") in err[0]


@pytest.mark.parametrize("settings, words", [
    (["--set", "use_sde=true"], "use_sde"),       # the trainer refuses it for a discrete space
    (["--env", "ppo_ref/CartPoleNoVel-v1", "--vectorization", "envpool"], "envpool"),
])
def test_settings_the_trainer_refuses_are_one_line_before_any_seed(settings, words, tmp_path,
                                                                  capsys):
    if "envpool" in settings:
        pytest.importorskip("envpool")
    assert cli.main(["train", "--seeds", "0-1", "--run-dir", str(tmp_path / "r"), *STEPS,
                     *settings]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and words in captured.err and len(captured.err.splitlines()) == 1
    assert not os.path.exists(tmp_path / "r")
