"""Commands started at the end of collection: the marker ``early_command(argv, ...)``, the
fixture ``early_command`` and the hooks that start and stop the commands (imported by the
conftest.py files of tests/ and validation/).

A test marked ``early_command(argv, env=None, timeout=None)`` checks what the command ``argv``
did once it ended (its exit code, output and files; ``{dir}`` in an argument is a fresh empty
directory of its own; a command still running ``timeout`` seconds after its start is killed and
its test fails). Such commands take seconds to minutes of CPU in their own processes while the
other tests run in pytest's process, mostly on one core: each is started as soon as collection
has selected its test, at a lower priority (nice + 10) so the tests running meanwhile keep
their core, and its test waits for it to end.
"""
import contextlib
import os
import shutil
import subprocess
import tempfile
import time

import pytest

EARLY_NICE = 10
_early: dict = {}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "early_command(argv, env=None, timeout=None): the test reads the result of "
                   "argv ({dir}: a fresh directory), started at the end of collection (fixture "
                   "early_command)")


def _start_early(marker) -> dict:
    """Start the marker's command (stdout and stderr to files beside its ``{dir}``) at a lower
    priority."""
    base = tempfile.mkdtemp(prefix="ppo_ref-early-")
    work = os.path.join(base, "dir")
    os.mkdir(work)
    argv = [str(arg).replace("{dir}", work) for arg in marker.args[0]]
    with open(os.path.join(base, "stdout"), "wb") as out, \
            open(os.path.join(base, "stderr"), "wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=marker.kwargs.get("env"))
    with contextlib.suppress(OSError):  # it may have ended already; lowering is only a courtesy
        os.setpriority(os.PRIO_PROCESS, proc.pid, EARLY_NICE)
    return {"proc": proc, "argv": argv, "base": base, "dir": work, "start": time.monotonic()}


def pytest_collection_finish(session):
    for item in session.items:
        marker = item.get_closest_marker("early_command")
        if marker is not None and item.nodeid not in _early:
            _early[item.nodeid] = _start_early(marker)


def pytest_sessionfinish(session):
    """Stop the commands whose test did not wait for them (a stopped or failing session):
    SIGTERM (``ppo-ref train`` saves and stops its seeds), SIGKILL after 90 s; remove their
    files."""
    for started in _early.values():
        proc = started["proc"]
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(started["base"], ignore_errors=True)
    _early.clear()


@pytest.fixture
def early_command(request):
    """``(completed, directory)`` of the test's ``early_command`` marker once the command has
    ended: a ``subprocess.CompletedProcess`` (text output) and the directory given as
    ``{dir}`` (started now if collection did not start it)."""
    marker = request.node.get_closest_marker("early_command")
    assert marker is not None, "the fixture early_command needs the marker early_command(argv)"
    started = _early.get(request.node.nodeid)
    if started is None:
        started = _early[request.node.nodeid] = _start_early(marker)
    timeout = marker.kwargs.get("timeout")
    try:
        code = started["proc"].wait(
            None if timeout is None else max(0.0, started["start"] + timeout - time.monotonic()))
    except subprocess.TimeoutExpired:
        started["proc"].kill()
        started["proc"].wait()
        pytest.fail(f"{started['argv']} still ran after {marker.kwargs['timeout']} s: killed")
    output = {}
    for stream in ("stdout", "stderr"):
        with open(os.path.join(started["base"], stream), errors="replace") as f:
            output[stream] = f.read()
    return (subprocess.CompletedProcess(started["argv"], code, output["stdout"],
                                        output["stderr"]), started["dir"])
