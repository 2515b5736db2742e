"""One-line, bounded handling of hostile CLI input and JSON files (train, eval, check)."""
import errno
import json
import os
import stat

import pytest

from ppo_ref import cli
from ppo_ref.config import PPOConfig
from ppo_ref.train.ppo import PPOTrainer


def _one_line_error(capsys, cmd):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"ppo-ref {cmd}: "), err
    assert "Traceback" not in err
    return lines[0]


# -- train ------------------------------------------------------------------------------------

def test_total_timesteps_above_2_53_is_refused_before_the_run_dir_exists(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert cli.main(["train", "--run-dir", str(run_dir), "--total-timesteps", str(2 ** 53 + 1),
                     "--quiet"]) == 2
    assert "--total-timesteps" in _one_line_error(capsys, "train")
    assert not run_dir.exists()


@pytest.mark.parametrize("flag, value", [("--n-envs", 10 ** 5), ("--seed", 2 ** 64),
                                         ("--num-actors", 10 ** 4)])
def test_counts_above_their_stated_bound_are_refused(tmp_path, capsys, flag, value):
    extra = ["--async"] if flag == "--num-actors" else []
    assert cli.main(["train", "--run-dir", str(tmp_path / "r"), flag, str(value), *extra]) == 2
    assert flag in _one_line_error(capsys, "train")
    assert not (tmp_path / "r").exists()


def test_disk_full_during_a_save_is_one_line(tmp_path, capsys, monkeypatch):
    import ppo_ref.train.ppo as ppo_module

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "checkpoint.npz"))
    monkeypatch.setattr(ppo_module, "save_checkpoint", full)
    code = cli.main(["train", "--run-dir", str(tmp_path / "r"), "--total-timesteps", "256",
                     "--quiet"])
    assert code == 3  # a failure while training (the final save is part of it): exit 3
    assert "No space left on device" in _one_line_error(capsys, "train")


def test_disk_full_outside_training_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    import ppo_ref.vectors.cases as cases_module

    def full(path, data, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", path)
    monkeypatch.setattr(cases_module, "write_atomic", full)
    assert cli.main(["vectors", "--out", str(tmp_path / "v")]) == 1   # as the README says
    line = _one_line_error(capsys, "vectors")
    assert "No space left on device" in line and "free some space" in line, line


def test_async_flags_with_resume_say_the_run_keeps_its_settings(tmp_path, capsys):
    assert cli.main(["train", "--resume", str(tmp_path), "--num-actors", "8"]) == 2
    line = _one_line_error(capsys, "train")
    assert line.endswith("--num-actors: --resume continues a run with its saved settings "
                         "(drop the flag)"), line


def test_a_seed_killed_by_a_signal_is_recorded_as_128_plus_the_signal(tmp_path, capsys,
                                                                      monkeypatch):
    import signal
    import subprocess

    class KilledAtStart:  # a seed's process that SIGINT ended while it imported
        returncode = -signal.SIGINT

        def __init__(self, *args, **kwargs):
            pass

        def poll(self):
            return self.returncode
    monkeypatch.setattr(subprocess, "Popen", KilledAtStart)
    run_dir = tmp_path / "seeds"
    assert cli.main(["train", "--seeds", "0-1", "--run-dir", str(run_dir), "--quiet"]) == 3
    runs = json.load(open(run_dir / "summary.json"))["runs"]
    assert [r["exit_code"] for r in runs] == [130, 130]
    assert "seed 0: exit 130," in capsys.readouterr().out


# -- eval -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("runs") / "r")
    assert cli.main(["train", "--run-dir", d, "--total-timesteps", "256", "--quiet"]) == 0
    return d


@pytest.mark.parametrize("seed, episodes", [("-1", "1"), (str(2 ** 64), "1"),
                                            (str(2 ** 63 - 1), "2")])
def test_eval_seed_out_of_range_is_one_line(run_dir, capsys, seed, episodes):
    assert cli.main(["eval", run_dir, "--episodes", episodes, "--seed", seed]) == 2
    assert "--seed" in _one_line_error(capsys, "eval")


def test_eval_takes_the_largest_seed_for_one_episode(run_dir):
    assert cli.main(["eval", run_dir, "--episodes", "1", "--seed", str(2 ** 63 - 1)]) == 0


def test_plot_names_the_csv_file_a_run_directory_lacks(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    (tmp_path / "episodes.csv").write_text("timesteps,return\n")
    assert cli.main(["plot", str(tmp_path)]) == 2
    line = _one_line_error(capsys, "plot")
    assert line.endswith(f"{tmp_path} has no metrics.csv"), line


def test_check_of_vectors_that_are_a_file_says_so(tmp_path, capsys):
    (tmp_path / "v").write_text("")
    assert cli.main(["check", str(tmp_path / "v"), "--results", str(tmp_path / "r.json")]) == 2
    assert f"vectors directory {tmp_path / 'v'} is a file" in _one_line_error(capsys, "check")


@pytest.mark.parametrize("what", ["missing", "a file"])
def test_plot_of_a_path_that_is_no_directory_says_so(tmp_path, capsys, what):
    path = tmp_path / "x"
    if what == "a file":
        path.write_text("")
    assert cli.main(["plot", str(path)]) == 2
    line = _one_line_error(capsys, "plot")
    assert f"{path} is not a run directory" in line and \
        ("a file" if what == "a file" else "does not exist") in line, line


def test_ctrl_c_during_eval_is_one_line(run_dir, capsys, monkeypatch):
    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(PPOTrainer, "evaluate", interrupted)
    assert cli.main(["eval", run_dir, "--episodes", "1"]) == 130
    assert "interrupted" in _one_line_error(capsys, "eval")


def test_an_env_raising_during_eval_is_one_line(run_dir, capsys, monkeypatch):
    def raising(self, *args, **kwargs):
        raise ValueError("late explosion")
    monkeypatch.setattr(PPOTrainer, "evaluate", raising)
    assert cli.main(["eval", run_dir, "--episodes", "1"]) == 3
    assert "ValueError: late explosion" in _one_line_error(capsys, "eval")


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000,
                                  '{"a": ' * 500 + "1" + "}" * 500,
                                  '{"total_timesteps": ' + "9" * 5000 + "}",
                                  '{"seed": ' + "9" * 400 + "}"])
def test_resume_with_hostile_config_json_is_one_line(run_dir, tmp_path, capsys, text):
    import shutil
    copy = str(tmp_path / "copy")
    shutil.copytree(run_dir, copy)
    with open(os.path.join(copy, "config.json"), "w") as fh:
        fh.write(text)
    assert cli.main(["train", "--resume", copy, "--total-timesteps", "512", "--quiet"]) == 2
    assert "config.json" in _one_line_error(capsys, "train")


# -- save -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trainer():
    t = PPOTrainer("CartPole-v1", PPOConfig(n_envs=1, n_steps=16, batch_size=16), seed=0)
    yield t
    t.close()


def test_save_refuses_to_replace_a_fifo(trainer, tmp_path):
    fifo = tmp_path / "checkpoint.npz"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        trainer.save(str(fifo))
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_save_refuses_a_symlink_to_a_device(trainer, tmp_path):
    link = tmp_path / "checkpoint.npz"
    os.symlink("/dev/null", link)
    with pytest.raises(ValueError, match="not a regular file"):
        trainer.save(str(link))


def test_save_gives_the_permissions_of_other_run_files(trainer, tmp_path):
    other = tmp_path / "metrics.csv"
    other.write_text("x\n")  # created with the umask, as the run's CSV files are
    path = tmp_path / "checkpoint.npz"
    trainer.save(str(path))
    assert stat.S_IMODE(os.stat(path).st_mode) == stat.S_IMODE(os.stat(other).st_mode)
    os.chmod(path, 0o640)  # an existing checkpoint keeps the mode its owner gave it
    trainer.save(str(path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


# -- check ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vectors_dir(tmp_path_factory):
    from ppo_ref.vectors import write_vectors
    out = str(tmp_path_factory.mktemp("vectors"))
    write_vectors(out)
    return out


@pytest.fixture(scope="module")
def reference(vectors_dir):
    from ppo_ref.vectors import reference_results
    return reference_results(vectors_dir)


def _write(tmp_path, doc, name="results.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def test_allow_missing_counts_passed_and_skipped(vectors_dir, reference, tmp_path, capsys):
    some = dict(reference, cases=dict(list(reference["cases"].items())[:3]))
    n = len(reference["cases"])
    assert cli.main(["check", vectors_dir, "--results", _write(tmp_path, some),
                     "--allow-missing"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"3 passed, {n - 3} skipped"


def test_unknown_cases_and_extra_outputs_are_reported(vectors_dir, reference, tmp_path, capsys):
    doc = json.loads(json.dumps(reference))
    doc["cases"]["no_such_case"] = {"outputs": {"x": [1.0]}}
    first = next(iter(doc["cases"]))
    doc["cases"][first]["outputs"]["surprise"] = [1.0]
    assert cli.main(["check", vectors_dir, "--results", _write(tmp_path, doc)]) == 1
    out = capsys.readouterr().out
    assert "no_such_case" in out and "UNKNOWN" in out
    assert "surprise" in out


def test_string_numbers_are_refused(vectors_dir, reference, tmp_path, capsys):
    doc = json.loads(json.dumps(reference))
    # the first case with a float array output; its numbers become strings ("0.5")
    first, key = next((name, k) for name, c in doc["cases"].items()
                      for k, v in c["outputs"].items()
                      if isinstance(v, list) and "." in json.dumps(v))
    outputs = doc["cases"][first]["outputs"]
    outputs[key] = json.loads(json.dumps(outputs[key]), parse_float=str)
    assert cli.main(["check", vectors_dir, "--results", _write(tmp_path, doc)]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith(first))
    assert "FAIL" in row and "not numeric" in row


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000,
                                  '{"format": "ppo_ref.results/1", "cases": ' + "[" * 500
                                  + "]" * 500 + "}",
                                  '{"format": "ppo_ref.results/1", "cases": {"a": {"outputs": '
                                  '{"x": [' + "9" * 400 + "]}}}}",
                                  '{"format": 1' + "0" * 5000 + "}"])
def test_hostile_results_json_is_one_line(vectors_dir, tmp_path, capsys, text):
    assert cli.main(["check", vectors_dir, "--results", _write(tmp_path, text)]) == 2
    _one_line_error(capsys, "check")


def test_endless_results_file_is_refused_with_a_stated_limit(vectors_dir, capsys):
    from ppo_ref.vectors import MAX_JSON_BYTES
    assert cli.main(["check", vectors_dir, "--results", "/dev/zero"]) == 2
    assert f"{MAX_JSON_BYTES}" in _one_line_error(capsys, "check")


def _copy_vectors(vectors_dir, tmp_path):
    import shutil
    out = str(tmp_path / "vec")
    shutil.copytree(vectors_dir, out)
    return out


@pytest.mark.parametrize("name", ["../outside.json", "/etc/passwd", "sub/../../x.json"])
def test_index_paths_leaving_the_vectors_dir_are_refused(vectors_dir, reference, tmp_path,
                                                         capsys, name):
    vec = _copy_vectors(vectors_dir, tmp_path)
    index_path = os.path.join(vec, "index.json")
    index = json.load(open(index_path))
    index["cases"][0]["file"] = name
    json.dump(index, open(index_path, "w"))
    assert cli.main(["check", vec, "--results", _write(tmp_path, reference)]) == 2
    assert "leaves the vectors directory" in _one_line_error(capsys, "check")


@pytest.mark.parametrize("damage", ["no_inputs", "inputs_list", "no_expected", "name_number",
                                    "not_object", "tolerance_string"])
def test_malformed_case_files_are_one_line(vectors_dir, reference, tmp_path, capsys, damage):
    vec = _copy_vectors(vectors_dir, tmp_path)
    index = json.load(open(os.path.join(vec, "index.json")))
    path = os.path.join(vec, index["cases"][0]["file"])
    case = json.load(open(path))
    if damage == "no_inputs":
        del case["inputs"]
    elif damage == "inputs_list":
        case["inputs"] = [1, 2]
    elif damage == "no_expected":
        del case["expected"]
    elif damage == "name_number":
        case["name"] = 7
    elif damage == "tolerance_string":
        case["tolerance"] = {"atol": "1e-3", "rtol": 0}
    else:
        case = [case]
    json.dump(case, open(path, "w"))
    assert cli.main(["check", vec, "--results", _write(tmp_path, reference)]) == 2
    assert os.path.basename(path) in _one_line_error(capsys, "check")


@pytest.mark.parametrize("extra", [[], ["--list-fields"], ["--async"]])
def test_an_empty_env_is_refused_not_read_as_the_default_env(tmp_path, capsys, extra):
    run_dir = tmp_path / "run"
    assert cli.main(["train", "--env", "", "--run-dir", str(run_dir), "--total-timesteps",
                     "256", "--quiet", *extra]) == 2
    line = _one_line_error(capsys, "train")
    assert "--env" in line and "''" in line
    assert not run_dir.exists()  # nothing trained (CartPole-v1 was, silently)


# -- found by a fresh user's run of the README ----------------------------------------------

@pytest.mark.parametrize("value", ["", "64,,64", ",64"])
def test_an_empty_net_arch_item_is_refused_not_read_as_a_smaller_network(value, capsys):
    assert cli.main(["train", "--set", f"net_arch={value}", "--total-timesteps", "256",
                     "--quiet"]) == 2
    assert "net_arch" in _one_line_error(capsys, "train")


def test_a_refused_async_run_leaves_no_run_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--async", "--num-actors", "3", "--total-timesteps", "3000",
                     "--quiet"]) == 2
    assert "num_actors" in _one_line_error(capsys, "train")
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def test_ctrl_c_while_the_trainer_is_built_is_one_line(tmp_path, monkeypatch, capsys):
    from ppo_ref.train.ppo import PPOTrainer

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(PPOTrainer, "__init__", interrupted)
    assert cli.main(["train", "--run-dir", str(tmp_path / "r"), "--quiet"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ppo-ref train: interrupted"]


class _Logger:
    """The part of the run logger :class:`ppo_ref.cli.common.SigintStopper` reads."""
    stop_requested = False
    snapshot = None
    run_dir = "/nonexistent/run"
    checkpoint_path = "/nonexistent/run/checkpoint.npz"

    def request_stop(self):
        self.stop_requested = True


@pytest.fixture
def exit_raises(monkeypatch):
    """``os._exit`` in ``ppo_ref.cli.common`` raises SystemExit (the test process lives on)."""
    def fake_exit(code):
        raise SystemExit(code)
    monkeypatch.setattr("ppo_ref.cli.common.os._exit", fake_exit)


NOTHING_SAVED = ("no update had completed: nothing saved; start it again with ppo-ref train "
                 "--resume /nonexistent/run (from scratch, same settings) or reuse --run-dir "
                 "/nonexistent/run\n")


def test_a_ctrl_c_before_the_first_update_stops_at_once(exit_raises, capsys):
    """Nothing to save yet (the first update compiles the kernels): the first Ctrl-C exits 130
    at once with the usual line, instead of waiting for the update or raising inside whatever
    is running; after an update, the first stops at the next boundary, the second raises."""
    from ppo_ref.cli.common import SigintStopper
    with pytest.raises(SystemExit) as info:
        SigintStopper(_Logger())._handle(2, None)
    assert info.value.code == 130
    assert capsys.readouterr().err == "\nppo-ref: interrupted; " + NOTHING_SAVED
    logger = _Logger()
    logger.snapshot = {"state": 1}
    stopper = SigintStopper(logger)
    stopper._handle(2, None)
    assert logger.stop_requested and "stopping at the end of this update" in capsys.readouterr().err
    with pytest.raises(KeyboardInterrupt):  # an update completed: interrupt, save it
        stopper._handle(2, None)


def test_ctrl_c_while_the_first_update_compiles_stops_at_once(tmp_path):
    """``ppo-ref train`` with an empty numba cache compiles its kernels in the first update
    (seconds): a Ctrl-C then exits 130 within seconds with the usual line, leaving a run
    stopped before its first update (config.json and header-only CSVs, no checkpoint, no
    lock)."""
    import signal
    import subprocess
    import sys
    import time
    run_dir = tmp_path / "run"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    proc = subprocess.Popen([sys.executable, "-m", "ppo_ref", "train", "--run-dir", str(run_dir),
                             "--total-timesteps", "512", "--quiet"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "config.json").exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        time.sleep(1.0)                     # in the first update: numba compiling
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130 and took < 10.0, (took, err)  # (before: about 13 s)
    assert err.endswith("\nppo-ref: interrupted; " + NOTHING_SAVED.replace("/nonexistent/run",
                                                                           str(run_dir))), err
    assert sorted(os.listdir(run_dir)) == ["config.json", "episodes.csv", "metrics.csv",
                                           "timing.csv"]
    assert len((run_dir / "metrics.csv").read_text().splitlines()) == 1


def test_sigterm_before_the_first_update_exits_143_at_once(exit_raises, capsys):
    """As a second Ctrl-C: nothing to save yet exits 143 at once; after an update, Terminated
    (a KeyboardInterrupt: saved as one) is raised."""
    from ppo_ref.cli.common import SigintStopper, Terminated
    with pytest.raises(SystemExit) as info:
        SigintStopper(_Logger())._terminate(15, None)
    assert info.value.code == 143
    assert capsys.readouterr().err == "\nppo-ref: terminated (SIGTERM); " + NOTHING_SAVED
    logger = _Logger()
    logger.snapshot = {"state": 1}
    with pytest.raises(Terminated):
        SigintStopper(logger)._terminate(15, None)


def test_sigterm_before_the_first_update_removes_the_run_dir_lock_file(tmp_path, exit_raises,
                                                                       capsys):
    """The exit before the first update skips ``finally`` blocks (``os._exit``): the run
    directory's lock file is removed before it, and the next run takes the directory."""
    from ppo_ref.cli.common import SigintStopper
    run_dir = str(tmp_path / "run")
    with cli.run_dir_lock(run_dir) as lock:
        assert os.path.exists(lock)
        with pytest.raises(SystemExit):
            SigintStopper(_Logger())._terminate(15, None)
        assert not os.path.exists(lock)
        with cli.run_dir_lock(run_dir):  # a new lock file: the next run is not blocked
            with open(lock) as f:
                assert f.read() == f"{os.getpid()}\n"
    assert capsys.readouterr().err == "\nppo-ref: terminated (SIGTERM); " + NOTHING_SAVED


def test_a_lock_file_left_by_a_dead_process_does_not_block_the_next_run(tmp_path):
    """A process killed while holding the run directory (SIGKILL: no cleanup) leaves its
    ``.lock`` with its pid; the lock itself (``flock``) ended with it, so the next run takes
    the directory and writes its own pid."""
    import signal
    import subprocess
    import sys
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock = run_dir / ".lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "os.write(fd, f'{os.getpid()}\\n'.encode())\n"
         "print('held', flush=True)\n"
         "time.sleep(120)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(cli.UsageError, match=f"in use by another ppo-ref process "
                                                 rf"\(pid {holder.pid}\)"):
            with cli.run_dir_lock(str(run_dir)):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate(timeout=30)
    assert lock.read_text() == f"{holder.pid}\n"  # left behind
    with cli.run_dir_lock(str(run_dir)):
        assert lock.read_text() == f"{os.getpid()}\n"
    assert not lock.exists()


@pytest.mark.parametrize("source", ['raise RuntimeError("boom at import")\n',
                                    "import gymnasium\nclass E(gymnasium.Env):\n"
                                    "    def __init__(self):\n        raise RuntimeError('boom')\n"
                                    "gymnasium.register('Boom-v0', entry_point=E)\n"])
def test_an_env_whose_module_or_constructor_raises_is_one_line(source, tmp_path, capsys,
                                                               monkeypatch):
    (tmp_path / "boom_env.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    run_dir = tmp_path / "run"
    assert cli.main(["train", "--env", "boom_env:Boom-v0", "--run-dir", str(run_dir)]) == 2
    line = _one_line_error(capsys, "train")
    assert "cannot make env 'boom_env:Boom-v0': RuntimeError: boom" in line, line
    assert not run_dir.exists()


def test_an_empty_run_dir_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--run-dir", "", "--total-timesteps", "256"]) == 2
    assert "--run-dir" in _one_line_error(capsys, "train")
    assert os.listdir(tmp_path) == []  # (no runs/ made for it)


@pytest.mark.parametrize("argv, words", [
    (["train", "--set", "n_epochs"], "--set: expected 'field=value'"),
    (["train", "--backend", "spec", "--set", "backend=fast"], "--backend and --set backend="),
    (["train", "--n-envs", "4", "--set", "n_envs=2"], "--n-envs and --set n_envs="),
    (["vectors", "--out", "{tmp}/v", "--preset", "nosuch"], "--preset must be one of"),
])
def test_flag_errors_name_the_flag(argv, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (nothing may be created)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert cli.main(argv + (["--total-timesteps", "256"] if argv[0] == "train" else [])) == 2
    assert words in _one_line_error(capsys, argv[0])
    assert os.listdir(tmp_path) == []
