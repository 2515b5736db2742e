"""Commands started at the end of collection: the marker ``early_command(argv, ...)``, the
fixture ``early_command`` and the hooks that run and stop the commands (imported by the
conftest.py files of tests/ and validation/).

A test marked ``early_command(argv, env=None, timeout=None)`` checks what the command ``argv``
did once it ended (its exit code, output and files; ``{dir}`` in an argument is a fresh empty
directory of its own; a command still running ``timeout`` seconds after its start is killed and
its test fails). Such commands take seconds to minutes of CPU in their own processes while the
other tests run in pytest's process, mostly on one core. So once collection has selected their
tests, a thread starts them in the order of their tests, ``os.cpu_count() - 1`` running at a
time (at least one), each in a session of its own (a terminal's Ctrl-C reaches pytest only,
which stops them) and at a lower priority (nice + 10: the tests running meanwhile keep their
core). A test starts its command if the thread has not yet, and waits for it to end.
:func:`python_call` makes the command of a test whose body runs in a process of its own.
"""
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

EARLY_NICE = 10
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository


def python_call(function, *args: str) -> list:
    """The argv of a Python process that imports ``function``'s module (its directory and the
    repository first on ``sys.path``) and calls ``function(*args)`` (strings: ``"{dir}"`` is the
    command's directory): exit code 0 when it returned, 1 with its traceback on stderr when it
    raised (a failed ``assert`` among them)."""
    module = sys.modules[function.__module__]
    directory = os.path.dirname(os.path.abspath(module.__file__))
    return [sys.executable, "-c",
            f"import sys; sys.path[:0] = [{directory!r}, {ROOT!r}]; "
            f"import {function.__module__} as m; m.{function.__qualname__}(*sys.argv[1:])",
            *args]


def assert_succeeded(early_command) -> str:
    """Assert that the command of the fixture ``early_command`` exited 0 (the end of its stderr
    in the message: a :func:`python_call` body's traceback); return its directory."""
    done, directory = early_command
    assert done.returncode == 0, done.stderr[-3000:]
    return directory


class _Command:
    """One marked test's command, started once (under ``_lock``) by the runner thread or its
    test."""

    def __init__(self, marker):
        self.base = tempfile.mkdtemp(prefix="ppo_ref-early-")
        self.dir = os.path.join(self.base, "dir")
        os.mkdir(self.dir)
        self.argv = [str(arg).replace("{dir}", self.dir) for arg in marker.args[0]]
        self.env = marker.kwargs.get("env")
        self.timeout = marker.kwargs.get("timeout")
        self.proc = None
        self.start_time = None
        self.timed_out = False

    def start(self) -> None:
        if self.proc is not None:
            return
        with open(os.path.join(self.base, "stdout"), "wb") as out, \
                open(os.path.join(self.base, "stderr"), "wb") as err:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, env=self.env,
                                         start_new_session=True)
        self.start_time = time.monotonic()
        with contextlib.suppress(OSError):  # it may have ended already: lowering is a courtesy
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, EARLY_NICE)

    def wait(self) -> int:
        """Its exit code; kills it once ``timeout`` seconds have passed since its start or, if
        later, since this wait began (before it, the command ran at a lower priority)."""
        if self.timeout is None:
            return self.proc.wait()
        deadline = max(self.start_time, time.monotonic()) + self.timeout
        try:
            return self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.terminate()
            self.stop(grace=0.0)
            raise

    def terminate(self) -> None:
        """SIGTERM to its session's process group (``ppo-ref train`` saves and stops; the
        processes it started get the signal too)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def stop(self, grace: float) -> None:
        """After :meth:`terminate`: wait up to ``grace`` seconds for it, then SIGKILL its whole
        process group (children left behind included)."""
        if self.proc is None:
            return
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def output(self, stream: str) -> str:
        with open(os.path.join(self.base, stream), errors="replace") as f:
            return f.read()


_commands: dict = {}          # test node id -> _Command
_lock = threading.Lock()      # starting a command
_stopping = threading.Event()
_runner = []                  # the runner thread


def _run_all(queue) -> None:
    """Start the commands of ``queue`` in order while fewer than ``os.cpu_count() - 1`` (at
    least 1) of them run."""
    width = max(1, (os.cpu_count() or 1) - 1)
    for command in queue:
        while not _stopping.is_set():
            with _lock:
                if sum(c.proc is not None and c.proc.poll() is None for c in queue) < width:
                    command.start()
                    break
            time.sleep(0.05)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "early_command(argv, env=None, timeout=None): the test reads the result of "
                   "argv ({dir}: a fresh directory), started at the end of collection (fixture "
                   "early_command)")


def _skipped(item) -> bool:
    """Whether ``item`` is marked skip, or skipif with a condition that is True."""
    return (item.get_closest_marker("skip") is not None
            or any(m.args and m.args[0] is True for m in item.iter_markers("skipif")))


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    queue = []
    for item in session.items:
        marker = item.get_closest_marker("early_command")
        if marker is not None and item.nodeid not in _commands and not _skipped(item):
            _commands[item.nodeid] = _Command(marker)
            queue.append(_commands[item.nodeid])
    if queue:
        thread = threading.Thread(target=_run_all, args=(queue,), daemon=True,
                                  name="early-commands")
        thread.start()
        _runner.append(thread)


def pytest_sessionfinish(session):
    """Stop the runner and every command still running (a stopped or failing session):
    SIGTERM to each one's process group, SIGKILL to the groups still there 90 s later; remove
    their files."""
    _stopping.set()
    for thread in _runner:
        thread.join()
    for command in _commands.values():
        command.terminate()
    deadline = time.monotonic() + 90.0
    for command in _commands.values():
        command.stop(grace=max(0.0, deadline - time.monotonic()))
        shutil.rmtree(command.base, ignore_errors=True)
    _commands.clear()
    _runner.clear()
    _stopping.clear()


@pytest.fixture
def early_command(request):
    """``(completed, directory)`` of the test's ``early_command`` marker once the command has
    ended: a ``subprocess.CompletedProcess`` (text output) and the directory given as
    ``{dir}``."""
    marker = request.node.get_closest_marker("early_command")
    assert marker is not None, "the fixture early_command needs the marker early_command(argv)"
    with _lock:
        command = _commands.get(request.node.nodeid)
        if command is None:
            command = _commands[request.node.nodeid] = _Command(marker)
        command.start()          # unless the runner thread has started it
    try:
        code = command.wait()
    except subprocess.TimeoutExpired:
        command.timed_out = True   # the test fails in its call (pytest_pyfunc_call), not here
        code = command.proc.returncode
    return (subprocess.CompletedProcess(command.argv, code, command.output("stdout"),
                                        command.output("stderr")), command.dir)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Fail a test whose command was killed at its ``timeout`` before its body runs (a failure
    of the test naming the command, not an error of the fixture ``early_command``)."""
    command = _commands.get(pyfuncitem.nodeid)
    if command is not None and command.timed_out:
        pytest.fail(f"{command.argv} still ran {command.timeout} s after its start: killed",
                    pytrace=False)
