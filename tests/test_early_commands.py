"""The harness of tests/early_commands.py, run by a pytest of its own on a temporary test file."""
import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))

CONFTEST = f"""
import sys
sys.path.insert(0, {TESTS!r})
from early_commands import (early_command, pytest_collection_finish,  # noqa: E402,F401
                            pytest_configure, pytest_pyfunc_call, pytest_sessionfinish)
"""

TESTS_FILE = f"""
import os

import pytest

@pytest.mark.early_command(["sleep", "60"], timeout=1)
def test_sleeper(early_command):
    raise AssertionError("the body of a test whose command was killed ran")

@pytest.mark.early_command([{sys.executable!r}, "-c", "print('hi')"], timeout=60)
def test_quick(early_command):
    done, directory = early_command
    assert done.returncode == 0 and done.stdout == "hi\\n" and os.path.isdir(directory)
"""


def test_a_command_past_its_timeout_fails_its_test_naming_it(tmp_path):
    """The command killed at its timeout is a failure of its test (not an error of the
    fixture), the message naming the command and the timeout; the body does not run; the
    other marked test passes."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_harness.py").write_text(TESTS_FILE)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rA", "test_harness.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed in" in done.stdout, done.stdout
    assert "error" not in done.stdout.lower(), done.stdout
    assert "['sleep', '60'] still ran 1 s after its start: killed" in done.stdout, done.stdout
    assert "the body of a test whose command was killed ran" not in done.stdout, done.stdout
