"""Test configuration for tests/: hypothesis profiles and shared fixtures."""
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/oracles.py, tests/gradcheck.py

import hypothesis_profiles  # noqa: E402,F401  (registers and loads the bounded profile)


@pytest.fixture
def rng():
    """A fresh, seeded generator for each test (never global random state)."""
    return np.random.default_rng(12345)


@pytest.fixture
def resumed_half_way(tmp_path):
    """``make(cfg) -> (full, part, resumed)``: PPOTrainer("Pendulum-v1", cfg, seed=3) trained
    for 1024 steps (``full``), the same run stopped at 512 steps and saved (``part``), and that
    checkpoint loaded (``resumed``, not yet continued): the exact-resume tests' setup."""
    from ppo_ref import PPOTrainer

    def make(cfg):
        full = PPOTrainer("Pendulum-v1", cfg, seed=3)
        full.learn(1024)
        part = PPOTrainer("Pendulum-v1", cfg, seed=3)
        part.learn(1024, lambda t, s: t.num_timesteps < 512)
        path = tmp_path / "ckpt.npz"
        part.save(path)
        return full, part, PPOTrainer.load(path)
    return make


# -- command lines started at the end of collection ---------------------------------------------
# A test marked ``early_cli(args)`` checks what ``python -m ppo_ref ARGS --run-dir DIR`` did. Such
# a run takes minutes of CPU in its own processes while the other tests run in this one, mostly
# on one core: it is started as soon as collection has selected its test, at a lower priority
# (nice + 10) so the tests running meanwhile keep their core, and its test waits for it to end.

EARLY_NICE = 10
_early_runs: dict = {}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "early_cli(args): the test reads `python -m ppo_ref ARGS --run-dir DIR`, "
                   "started at the end of collection (fixture early_cli_run)")


def _start_early_cli(args) -> dict:
    """Start ``python -m ppo_ref ARGS --run-dir DIR`` (DIR in a new temporary directory, its
    output to a file there) at a lower priority."""
    base = tempfile.mkdtemp(prefix="ppo_ref-early-cli-")
    run_dir = os.path.join(base, "run")
    with open(os.path.join(base, "output.log"), "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ppo_ref", *args, "--run-dir", run_dir],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    with contextlib.suppress(OSError):  # it may have ended already; lowering is only a courtesy
        os.setpriority(os.PRIO_PROCESS, proc.pid, EARLY_NICE)
    return {"proc": proc, "base": base, "run_dir": run_dir}


def pytest_collection_finish(session):
    for item in session.items:
        marker = item.get_closest_marker("early_cli")
        if marker is not None and item.nodeid not in _early_runs:
            _early_runs[item.nodeid] = _start_early_cli(marker.args[0])


def pytest_sessionfinish(session):
    """Stop the runs whose test did not wait for them (a stopped or failing session): SIGTERM
    (``ppo-ref train`` saves and stops its seeds), SIGKILL after 90 s; remove their files."""
    for started in _early_runs.values():
        proc = started["proc"]
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(started["base"], ignore_errors=True)
    _early_runs.clear()


@pytest.fixture
def early_cli_run(request):
    """``(exit code, output, run directory)`` of the test's ``early_cli`` command line, once it
    has ended (started now if collection did not start it)."""
    marker = request.node.get_closest_marker("early_cli")
    assert marker is not None, "early_cli_run needs the test marked early_cli(args)"
    started = _early_runs.get(request.node.nodeid)
    if started is None:
        started = _early_runs[request.node.nodeid] = _start_early_cli(marker.args[0])
    code = started["proc"].wait()
    with open(os.path.join(started["base"], "output.log"), errors="replace") as f:
        output = f.read()
    return code, output, started["run_dir"]
