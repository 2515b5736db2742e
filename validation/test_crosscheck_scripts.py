"""The crosscheck_<library>.py scripts run: the two that need only NumPy (CleanRL and PureJaxRL,
re-expressed from their published source) pass their checks; the others skip cleanly with a
message when their library is not installed (CI installs torch, stable-baselines3 and
sb3-contrib only)."""
import importlib.util
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY_SCRIPTS = {"tianshou": "tianshou", "torchrl": "torchrl", "rlax": "rlax", "skrl": "skrl",
                   "sample_factory": "sample_factory"}


def _argv(name):
    return [sys.executable, os.path.join(HERE, f"crosscheck_{name}.py")]


ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [os.path.dirname(HERE), HERE, os.environ.get("PYTHONPATH", "")]))


def _run(name):
    return subprocess.run(_argv(name), capture_output=True, text=True, timeout=900, env=ENV)


# these two run for seconds: started at the end of collection (tests/early_commands.py)
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.early_command(
    _argv(name), env=ENV, timeout=900)) for name in ("cleanrl", "purejaxrl")])
def test_re_expressed_scripts_pass(name, early_command):
    done, _ = early_command
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("== ")
    assert "check_gae" in lines[1] and lines[1].rstrip().endswith("PASS"), done.stdout


@pytest.mark.parametrize("name", sorted(LIBRARY_SCRIPTS))
def test_library_scripts_skip_cleanly_without_their_library(name):
    if importlib.util.find_spec(LIBRARY_SCRIPTS[name]) is not None:
        pytest.skip(f"{name} is installed here: the script runs for real (validation/README.md)")
    done = _run(name)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("SKIP "), done.stdout
