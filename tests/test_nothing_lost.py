"""Nothing lost, nothing silently wrong: env failures of every kind under every vectorization,
bounds checked before anything is built, hostile lock, checkpoint, JSON and run files, closed
streams, Ctrl-C with hung env workers, printable output (the command line and the trainer's
public API)."""
import errno
import io
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from ppo_ref import cli
from ppo_ref.io.checkpoint import array_to_json, json_to_array, load_checkpoint, save_checkpoint

HOSTILE = "hostile_envs:Hostile-v0"  # tests/hostile_envs.py, steered by PPO_REF_HOSTILE
TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
# 2 envs x 16 steps per update: a copy's 40th step falls in the third rollout, after 2 updates
SMALL = ["--set", "n_envs=2", "--set", "n_steps=16", "--set", "batch_size=32", "--set",
         "n_epochs=1", "--quiet"]


def _stderr_lines(capsys):
    return [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]


def _one_line(capsys, command="train", tmp_path=None):
    """The one stderr line of a failed command (with ``tmp_path`` written ``<tmp>``, so that
    words looked for cannot come from the test's directory name)."""
    lines = _stderr_lines(capsys)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"ppo-ref {command}: error: "), lines
    return lines[0] if tmp_path is None else lines[0].replace(str(tmp_path), "<tmp>")


def _train(run_dir, *extra, env="CartPole-v1", steps="512"):
    return cli.main(["train", "--env", env, "--run-dir", str(run_dir), "--total-timesteps",
                     steps] + SMALL + list(extra))


def _subprocess_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, TESTS] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("saved") / "run"
    assert _train(run_dir, steps="128") == 0
    return str(run_dir)


def _copy(saved_run, tmp_path, name="copy"):
    target = str(tmp_path / name)
    shutil.copytree(saved_run, target)
    return target


def _rewrite_checkpoint(path, meta_changes=None, state_changes=None):
    """Rewrite a checkpoint with changed metadata and state record (a crafted file)."""
    arrays, meta = load_checkpoint(path)
    meta.update(meta_changes or {})
    if state_changes is not None:
        state = array_to_json(arrays["state_json"])
        state_changes(state)
        arrays["state_json"] = json_to_array(state)
    meta.pop("format_version", None)
    save_checkpoint(path, arrays, meta)


# -- 4. an env raising SystemExit / a BaseException ---------------------------------------------

@pytest.mark.parametrize("what, name", [("exit", "SystemExit"), ("base", "HostileBase")])
def test_an_env_raising_a_base_exception_is_an_env_failure_that_keeps_the_last_good_state(
        tmp_path, capsys, monkeypatch, what, name):
    monkeypatch.setenv("PPO_REF_HOSTILE", f"{what}@40")
    run_dir = tmp_path / "run"
    assert _train(run_dir, env=HOSTILE) == 3
    line = _one_line(capsys, tmp_path=tmp_path)
    assert "environment error" in line and f"raised {name}" in line and "env " in line
    assert "last good checkpoint (64 steps)" in line
    assert "Traceback" in (run_dir / "error.log").read_text()
    _, meta = load_checkpoint(str(run_dir / "checkpoint.npz"))
    assert meta["n_updates"] == 2


# -- 5. a dead async env worker ---------------------------------------------------------------

@pytest.mark.parametrize("what, words", [
    ("die", "an env worker process of the async vector env ended"),  # os._exit in the worker
    ("exit", "env 0 raised SystemExit: 5"),  # caught where the env runs: the worker lives on
])
def test_a_dead_async_env_worker_is_one_line_and_exit_3(tmp_path, capsys, monkeypatch, what,
                                                        words):
    monkeypatch.setenv("PPO_REF_HOSTILE", f"{what}@40")
    run_dir = tmp_path / "run"
    assert _train(run_dir, "--vectorization", "async", env=HOSTILE) == 3
    line = _one_line(capsys, tmp_path=tmp_path)
    assert "environment error" in line and words in line
    assert "last good checkpoint (64 steps)" in line
    assert multiprocessing.active_children() == []


# -- 6. env values checked the same way under every vectorization -----------------------------

@pytest.mark.parametrize("mode, value, words", [
    ("sync", "reward:'1.0'", ["reward '1.0'", "str"]),
    ("normalized", "reward:'1.0'", ["reward '1.0'", "str"]),
    ("async", "reward:'1.0'", ["reward '1.0'", "str"]),
    ("async", "terminated:'yes'", ["terminated 'yes'", "str"]),
    ("actors", "reward:'1.0'", ["reward '1.0'", "str", "actor"]),
    ("actors", "truncated:'yes'", ["truncated 'yes'", "str", "actor"]),
    ("sync", "obs:#4", ["observation of shape (3,)"]),         # hostile_envs.JUNK["obs"][4]
    ("async", "obs:#4", ["observation of shape (3,)"]),
    ("actors", "obs:#4", ["observation of shape (3,)", "actor"]),
    ("async", "obs:#0", ["non-finite observation"]),           # [nan, 0, 0, 0]
    ("actors", "obs:#0", ["non-finite observation", "actor"]),
])
def test_env_values_are_checked_the_same_way_under_every_vectorization(
        tmp_path, capsys, monkeypatch, mode, value, words):
    monkeypatch.setenv("PPO_REF_HOSTILE", f"{value}@40")
    extra = {"sync": [], "normalized": ["--set", "normalize_rewards=True"],
             "async": ["--vectorization", "async"],
             "actors": ["--async", "--num-actors", "2"]}[mode]
    assert _train(tmp_path / "run", *extra, env=HOSTILE) == 3
    line = _one_line(capsys, tmp_path=tmp_path)
    for word in words:
        assert word in line, line
    assert "Traceback" not in line
    assert multiprocessing.active_children() == []


# -- 7. one bound for n_envs, checked before anything is built --------------------------------

@pytest.fixture
def counted_makes(monkeypatch):
    """gymnasium.make, failing once more than 32 envs were made (a refusal must come first)."""
    import gymnasium
    made = []
    real = gymnasium.make

    def make(*args, **kwargs):
        made.append(args[0] if args else kwargs.get("id"))
        if len(made) > 32:
            raise RuntimeError(f"{len(made)} envs made before the refusal")
        return real(*args, **kwargs)
    monkeypatch.setattr(gymnasium, "make", make)
    return made


@pytest.mark.parametrize("value", ["200000", "4097", "1000000"])
def test_set_n_envs_has_the_bound_of_n_envs(tmp_path, capsys, counted_makes, value):
    assert cli.main(["train", "--run-dir", str(tmp_path / "r"), "--set", f"n_envs={value}",
                     "--quiet"]) == 2
    line = _one_line(capsys)
    assert "n_envs" in line and "4096" in line
    assert counted_makes == [] and not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", ["eval", "resume", "restart"])
def test_a_saved_n_envs_beyond_the_bound_is_refused_before_any_env_is_made(
        saved_run, tmp_path, capsys, counted_makes, command):
    run_dir = _copy(saved_run, tmp_path)
    path = os.path.join(run_dir, "checkpoint.npz")
    _, meta = load_checkpoint(path)
    config = dict(meta["config"], n_envs=100_000)
    _rewrite_checkpoint(path, {"config": config})
    if command == "restart":  # no checkpoint: config.json's settings
        os.remove(path)
        info = json.load(open(os.path.join(run_dir, "config.json")))
        info["config"] = config
        json.dump(info, open(os.path.join(run_dir, "config.json"), "w"))
    argv = (["eval", run_dir, "--episodes", "1"] if command == "eval"
            else ["train", "--resume", run_dir, "--quiet"])
    assert cli.main(argv) == 2
    line = _one_line(capsys, argv[0], tmp_path)
    assert "n_envs" in line and "4096" in line
    assert counted_makes == []


# -- 8. a checkpoint's env id that is not a string --------------------------------------------

@pytest.mark.parametrize("env_id", [42, ["CartPole-v1"], {"id": 1}, ""])
@pytest.mark.parametrize("command", ["eval", "resume"])
def test_a_checkpoint_env_id_that_is_not_an_id_is_one_line(saved_run, tmp_path, capsys, env_id,
                                                           command):
    run_dir = _copy(saved_run, tmp_path)
    _rewrite_checkpoint(os.path.join(run_dir, "checkpoint.npz"), {"env_id": env_id},
                        lambda state: state.update(env_id=env_id))
    argv = (["eval", run_dir, "--episodes", "1"] if command == "eval"
            else ["train", "--resume", run_dir, "--quiet"])
    assert cli.main(argv) == 2
    assert "env_id" in _one_line(capsys, argv[0], tmp_path)


# -- 9. a hostile .lock -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo", "directory"])
@pytest.mark.parametrize("command", ["resume", "new"])
def test_a_lock_file_that_is_not_a_plain_file_of_its_own_is_refused_untouched(
        saved_run, tmp_path, capsys, kind, command):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    run_dir = _copy(saved_run, tmp_path) if command == "resume" else str(tmp_path / "new")
    os.makedirs(run_dir, exist_ok=True)
    lock = os.path.join(run_dir, ".lock")
    {"symlink": lambda: os.symlink(precious, lock), "hardlink": lambda: os.link(precious, lock),
     "fifo": lambda: os.mkfifo(lock), "directory": lambda: os.mkdir(lock)}[kind]()
    argv = (["train", "--resume", run_dir, "--quiet"] if command == "resume"
            else ["train", "--run-dir", run_dir, "--total-timesteps", "64"] + SMALL)
    assert cli.main(argv) == 2
    assert "lock file .lock is not a plain file" in _one_line(capsys, tmp_path=tmp_path)
    assert precious.read_text() == "keep me\n"
    assert os.path.lexists(lock)


# -- 10. bounded JSON in ppo-ref diff ---------------------------------------------------------

@pytest.mark.parametrize("text", ["[" * 50_000 + "]" * 50_000, '{"a": ' * 5000 + "1" + "}" * 5000,
                                  '{"format": "ppo_ref.trace/1", "trace": {"x": ' + "9" * 5000
                                  + "}}"])
def test_diff_of_hostile_json_is_one_line(tmp_path, capsys, text):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    assert cli.main(["diff", str(bad), str(bad)]) == 2
    _one_line(capsys, "diff")


def test_diff_of_an_endless_file_stops_at_a_stated_limit(tmp_path):
    """/dev/zero: read up to the limit, then one line (run with a memory cap, so the test fails
    rather than the machine)."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_DATA, (3 << 30, 3 << 30));"
            "from ppo_ref.cli import main; sys.exit(main(['diff', '/dev/zero', '/dev/zero']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=_subprocess_env())
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-1000:]
    assert "limit" in lines[0]


# -- 11. another run's checkpoint -------------------------------------------------------------

def test_another_runs_checkpoint_copied_into_a_run_directory_is_refused(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert _train(a, steps="128") == 0
    assert _train(b, "--seed", "3", steps="128") == 0
    info = json.load(open(a / "config.json"))
    assert isinstance(info.get("run_id"), str) and len(info["run_id"]) >= 16
    shutil.copy2(b / "checkpoint.npz", a / "checkpoint.npz")
    before = (a / "metrics.csv").read_bytes()
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(a), "--total-timesteps", "256", "--quiet"]) == 2
    line = _one_line(capsys, tmp_path=tmp_path)
    assert "not this run's" in line and "run id" in line
    assert (a / "metrics.csv").read_bytes() == before


def test_eval_of_a_run_directory_refuses_another_runs_checkpoint(saved_run, tmp_path, capsys):
    other = tmp_path / "other"
    assert _train(other, "--seed", "5", steps="64") == 0
    run_dir = _copy(saved_run, tmp_path)
    shutil.copy2(other / "checkpoint.npz", os.path.join(run_dir, "checkpoint.npz"))
    capsys.readouterr()
    assert cli.main(["eval", run_dir, "--episodes", "1"]) == 2
    assert "not this run's" in _one_line(capsys, "eval", tmp_path)
    # the file itself can be evaluated
    assert cli.main(["eval", os.path.join(run_dir, "checkpoint.npz"), "--episodes", "1"]) == 0


@pytest.mark.parametrize("kind", ["fifo", "directory", "dangling"])
def test_resume_refuses_a_checkpoint_that_is_not_a_file_and_keeps_the_run(saved_run, tmp_path,
                                                                          capsys, kind):
    run_dir = _copy(saved_run, tmp_path)
    path = os.path.join(run_dir, "checkpoint.npz")
    os.remove(path)
    {"fifo": lambda: os.mkfifo(path), "directory": lambda: os.mkdir(path),
     "dangling": lambda: os.symlink(str(tmp_path / "gone.npz"), path)}[kind]()
    before = {name: open(os.path.join(run_dir, name), "rb").read()
              for name in ("metrics.csv", "episodes.csv", "config.json")}
    assert cli.main(["train", "--resume", run_dir, "--quiet"]) == 2
    assert "not a regular file" in _one_line(capsys, tmp_path=tmp_path)
    for name, data in before.items():
        assert open(os.path.join(run_dir, name), "rb").read() == data, name


def test_a_run_directory_without_a_run_id_still_resumes_and_gets_one(saved_run, tmp_path, capsys):
    """Runs written before run ids existed: resumed as before, and identified from then on."""
    run_dir = _copy(saved_run, tmp_path)
    path = os.path.join(run_dir, "config.json")
    info = json.load(open(path))
    info.pop("run_id", None)
    json.dump(info, open(path, "w"))
    arrays, meta = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"))
    meta.pop("run_id", None)
    meta.pop("format_version")
    save_checkpoint(os.path.join(run_dir, "checkpoint.npz"), arrays, meta)
    assert cli.main(["train", "--resume", run_dir, "--total-timesteps", "256", "--quiet"]) == 0
    run_id = json.load(open(path))["run_id"]
    assert load_checkpoint(os.path.join(run_dir, "checkpoint.npz"))[1]["run_id"] == run_id


# -- 12. counters and restored env limits vetted ----------------------------------------------

@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory):
    from ppo_ref.config import PPOConfig
    from ppo_ref.train.ppo import PPOTrainer
    trainer = PPOTrainer("CartPole-v1", PPOConfig(n_envs=2, n_steps=16, batch_size=32,
                                                  n_epochs=1), seed=0)
    trainer.learn(128)
    path = str(tmp_path_factory.mktemp("ckpt") / "checkpoint.npz")
    trainer.save(path)
    trainer.close()
    return path


def _sub_env_attrs(state, layer_class):
    return [layer["attrs"] for sub in state["collector"]["sub_envs"] for layer in sub["layers"]
            if layer["class"] == layer_class]


@pytest.mark.parametrize("change, word", [
    ({"n_updates": 10 ** 6}, "n_updates"),
    ({"num_timesteps": 10 ** 9}, "num_timesteps"),
    ({"num_timesteps": 100}, "num_timesteps"),
    ({"n_episodes": 10 ** 6}, "n_episodes"),
])
def test_checkpoint_counters_that_contradict_each_other_are_refused(small_checkpoint, tmp_path,
                                                                   change, word):
    from ppo_ref.io.checkpoint import CheckpointError
    from ppo_ref.train.ppo import PPOTrainer
    path = str(tmp_path / "c.npz")
    shutil.copy2(small_checkpoint, path)
    _rewrite_checkpoint(path, change, lambda state: state.update(change))
    with pytest.raises(CheckpointError, match=word):
        PPOTrainer.load(path)


@pytest.mark.parametrize("value", [10 ** 9, 1, -5, 2.5, "500", None])
def test_a_restored_episode_limit_must_be_the_envs_own(small_checkpoint, tmp_path, value):
    from ppo_ref.io.checkpoint import CheckpointError
    from ppo_ref.train.ppo import PPOTrainer

    def change(state):
        for attrs in _sub_env_attrs(state, "TimeLimit"):
            attrs["_max_episode_steps"] = value
    path = str(tmp_path / "c.npz")
    shutil.copy2(small_checkpoint, path)
    _rewrite_checkpoint(path, state_changes=change)
    with pytest.raises(CheckpointError, match="_max_episode_steps"):
        PPOTrainer.load(path)


@pytest.mark.parametrize("value", [-1, 501, 10 ** 12, "3", 2.5])
def test_a_restored_time_limit_count_must_be_within_the_limit(small_checkpoint, tmp_path, value):
    from ppo_ref.io.checkpoint import CheckpointError
    from ppo_ref.train.ppo import PPOTrainer

    def change(state):
        for attrs in _sub_env_attrs(state, "TimeLimit"):
            attrs["_elapsed_steps"] = value
    path = str(tmp_path / "c.npz")
    shutil.copy2(small_checkpoint, path)
    _rewrite_checkpoint(path, state_changes=change)
    with pytest.raises(CheckpointError, match="_elapsed_steps"):
        PPOTrainer.load(path)


# -- 13. a closed stdout ends printing, never training -----------------------------------------

class _ClosedPipe(io.TextIOBase):
    """A stdout whose reader went away."""

    def write(self, text):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


@pytest.mark.parametrize("argv", [["details"], ["eval", "{run}", "--episodes", "1"],
                                  ["train", "--run-dir", "{new}", "--total-timesteps", "128",
                                   "--progress-every", "0"] + SMALL[:-1],
                                  ["plot", "{run}", "--output", "{new}.png"]])
def test_every_command_ends_printing_quietly_when_stdout_is_closed(saved_run, tmp_path, capsys,
                                                                  monkeypatch, argv):
    if argv[0] == "plot":
        pytest.importorskip("matplotlib")
    argv = [a.format(run=saved_run, new=str(tmp_path / "new")) for a in argv]
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert cli.main(argv) == 0
    assert "Traceback" not in capsys.readouterr().err
    if argv[0] == "train":
        _, meta = load_checkpoint(str(tmp_path / "new" / "checkpoint.npz"))
        assert meta["num_timesteps"] == 128  # trained to the end


class _FullDevice:
    """A stdout on a full device (``ppo-ref details > /dev/full``)."""

    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self):
        pass


def test_output_lost_to_a_full_device_is_an_error(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdout", _FullDevice())
    assert cli.main(["details"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ppo-ref: error: cannot write the output: No space left on device"], err


def test_train_piped_into_head_trains_to_the_end(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "ppo_ref", "train", "--run-dir", str(run_dir),
                             "--total-timesteps", "2048", "--progress-every", "0"] + SMALL[:-1],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_subprocess_env())
    proc.stdout.readline()      # `| head -1`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(120) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err
    _, meta = load_checkpoint(str(run_dir / "checkpoint.npz"))
    assert meta["num_timesteps"] == 2048


# -- 14. a second Ctrl-C with a hung async env ------------------------------------------------

def test_a_second_ctrl_c_exits_within_2_s_when_an_async_env_hangs(tmp_path):
    run_dir = tmp_path / "run"
    env = _subprocess_env()
    env["PPO_REF_HOSTILE"] = "hang@40"
    proc = subprocess.Popen([sys.executable, "-m", "ppo_ref", "train", "--env", HOSTILE,
                             "--run-dir", str(run_dir), "--total-timesteps", "512",
                             "--vectorization", "async", "--checkpoint-every", "0"] + SMALL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(run_dir / "metrics.csv") or \
                len(open(run_dir / "metrics.csv").read().splitlines()) < 3:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        time.sleep(1.0)                     # the third rollout is stuck in a worker's step
        proc.send_signal(signal.SIGINT)     # stop at the end of this update: never comes
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)     # stop now
        t0 = time.monotonic()
        code = proc.wait(10)
        assert time.monotonic() - t0 < 2.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode()
    assert code == 130, err
    assert "Traceback" not in err
    _, meta = load_checkpoint(str(run_dir / "checkpoint.npz"))
    assert meta["num_timesteps"] == 64


def test_ctrl_c_in_the_terminal_stops_an_async_vectorized_run_at_a_rollout_boundary(tmp_path):
    """Ctrl-C reaches the whole process group: the env workers ignore it, the trainer stops at
    the end of its update (an exact checkpoint)."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "ppo_ref", "train", "--run-dir", str(run_dir),
                             "--total-timesteps", "100000", "--vectorization", "async",
                             "--checkpoint-every", "0"] + SMALL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_subprocess_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(run_dir / "metrics.csv") or \
                len(open(run_dir / "metrics.csv").read().splitlines()) < 3:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = proc.stderr.read().decode()
    assert code == 130 and "stopping at the end of this update" in err, err
    assert "Traceback" not in err and "stopped at" in err


# -- 15. printable output, one line per failure -----------------------------------------------

def test_control_characters_in_case_names_cannot_forge_check_rows(tmp_path, capsys):
    from ppo_ref.vectors import reference_results, write_vectors
    vectors = str(tmp_path / "vectors")
    write_vectors(vectors)
    results = reference_results(vectors)
    results["cases"]["gae_basic\nFORGED    PASS\x1b[2K"] = {"outputs": {}}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    capsys.readouterr()
    assert cli.main(["check", vectors, "--results", str(path)]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and not any(line.startswith("FORGED") for line in out.splitlines())
    assert len(out.strip().splitlines()) == len(results["cases"]) + 2  # header, rows, summary


def test_an_actor_failure_is_one_line_with_the_traceback_in_error_log(tmp_path, capsys,
                                                                      monkeypatch):
    monkeypatch.setenv("PPO_REF_HOSTILE", "raise@40")
    run_dir = tmp_path / "run"
    assert _train(run_dir, "--async", "--num-actors", "2", env=HOSTILE) == 3
    line = _one_line(capsys, tmp_path=tmp_path)
    assert "actor-learner error: actor" in line and "RuntimeError" in line
    assert "the env failed on purpose" in line
    assert "last good checkpoint" in line
    log = (run_dir / "error.log").read_text()
    assert "the env failed on purpose" in log and "hostile_envs.py" in log  # the actor's traceback


def test_out_of_space_without_a_file_name_reads_well(tmp_path, capsys, monkeypatch):
    from ppo_ref.cli import details

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setitem(cli.SUBCOMMANDS, "details", cli.SUBCOMMANDS["details"][:2] + (full,))
    assert cli.main(["details"]) == 1
    line = _one_line(capsys, "details")
    assert "error::" not in line and "No space left on device" in line
    assert details is not None


# -- the actor-learner keeps the trainer's guarantees ------------------------------------------

def test_a_learner_failure_keeps_the_last_good_state_and_the_run_resumes(tmp_path, capsys,
                                                                        monkeypatch):
    from ppo_ref.config import PPOConfig
    from ppo_ref.io.runlog import read_csv
    from ppo_ref.train.ppo import PPOTrainer
    real = PPOTrainer.train_on
    calls = []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise FloatingPointError("overflow in the value loss (on purpose)")
        return real(self, *args, **kwargs)
    monkeypatch.setattr(PPOTrainer, "train_on", failing)
    run_dir = tmp_path / "run"
    assert _train(run_dir, "--async", "--num-actors", "2", steps="256") == 3
    line = _one_line(capsys, tmp_path=tmp_path)
    assert "FloatingPointError" in line and "last good checkpoint (64 steps)" in line
    assert "overflow in the value loss" in (run_dir / "error.log").read_text()
    _, meta = load_checkpoint(str(run_dir / "checkpoint.npz"))
    assert meta["n_updates"] == 2 and meta["actor_learner"]["policy_version"] == 2
    assert multiprocessing.active_children() == []
    monkeypatch.setattr(PPOTrainer, "train_on", real)
    assert cli.main(["train", "--resume", str(run_dir), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    _, meta = load_checkpoint(str(run_dir / "checkpoint.npz"))
    assert meta["n_updates"] == 8 and meta["num_timesteps"] == 256
    assert meta["actor_learner"]["policy_version"] == 8
    metrics = read_csv(str(run_dir / "metrics.csv"))
    np.testing.assert_array_equal(metrics["update"], np.arange(1, 9))
    # the learning-rate schedule continues over the same horizon as an uninterrupted run's
    config = PPOConfig.from_dict(meta["config"])
    want = [config.learning_rate_at(1.0 - 32 * k / 256) for k in range(1, 9)]
    np.testing.assert_array_equal(metrics["learning_rate"], want)
    assert multiprocessing.active_children() == []
