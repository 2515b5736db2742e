"""Kill ``ppo-ref train --resume`` at chosen points of its file operations (no tests here).

Used by tests/test_resume_kills.py and validation/fault_campaign.py::

    python tests/resume_kill_driver.py WORKDIR [--points N] [--seed S] [--random-delays M]

The driver imports ppo_ref once and forks a child for every run it makes, so each child starts
without paying the imports again; the parent itself never runs a compiled kernel (a child made
by ``fork`` could not run OpenMP loops after its parent did).

1. ``ref``: a run of 8 updates (2 CartPoles x 16 steps, a checkpoint after every update).
2. ``stopped``: the same run stopped after update 4 (what the first Ctrl-C does); its
   checkpoint replaces the reference's, so the directory holds the rows of 8 updates and the
   checkpoint of update 4, as a run killed -9 after update 8 whose last checkpoint was at 4.
3. Counting: a resume of a copy up to the start of training, every file operation in the run
   directory recorded (opening a file for writing, each write, flush, fsync, rename, remove,
   truncate, chmod): R operations, the rewrite of the run files.
4. For each chosen point k: a fresh copy, a resume that kills itself with SIGKILL just before
   its k-th operation; then the directory is checked (``check_dir``). The points are every
   one of the R operations and ``--points`` more drawn at random among the 80 after them
   (while it trains: appended rows, checkpoints).
5. Chained: one copy is resumed and killed again at every ``--chain-every``-th rewrite point
   in turn (and ``--random-delays`` times after a random delay), then resumed to the end; its files must equal the reference's (metrics.csv, episodes.csv byte for byte; the
   checkpoint's parameters and Adam moments bit for bit) and no temporary file may remain.

Prints one JSON object: ``{"rewrite_operations": R, "kills": K, "checks": C,
"failed_checks": F, "problems": [...]}`` (a check: one directory after a kill, or the final
comparison).
"""
from __future__ import annotations

import argparse
import builtins
import contextlib
import io
import json
import os
import random
import shutil
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TRAIN = ["--total-timesteps", "256", "--set", "n_envs=2", "--set", "n_steps=16", "--set",
         "batch_size=32", "--set", "n_epochs=1", "--checkpoint-every", "0", "--quiet"]
STOP_AT = 4
RUN_FILES = ("config.json", "metrics.csv", "episodes.csv", "timing.csv", "checkpoint.npz")


# -- file-operation hooks (installed in a child only) ----------------------------------------

class _Hooks:
    """Counts file operations under ``root``; SIGKILLs the process before operation ``kill_at``
    (1-based; 0: never). ``log`` keeps (kind, name) per operation."""

    def __init__(self, root: str, kill_at: int = 0):
        self.root = os.path.realpath(root)
        self.kill_at = kill_at
        self.count = 0
        self.log = []
        self.fds = set()

    def inside(self, path) -> bool:
        try:
            return os.path.realpath(os.fspath(path)).startswith(self.root + os.sep)
        except TypeError:
            return False

    def event(self, kind: str, name: str) -> None:
        self.count += 1
        if self.count == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        self.log.append((kind, os.path.basename(name)))


class _FileProxy:
    def __init__(self, hooks, fh, name):
        self._hooks, self._fh, self._name = hooks, fh, name

    def write(self, data):
        self._hooks.event("write", self._name)
        return self._fh.write(data)

    def flush(self):
        self._hooks.event("flush", self._name)
        return self._fh.flush()

    def close(self):
        if not self._fh.closed:
            self._hooks.fds.discard(self._fh.fileno())
        return self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __iter__(self):
        return iter(self._fh)

    def __getattr__(self, name):
        return getattr(self._fh, name)


def install_hooks(hooks: _Hooks) -> None:
    real_open, real_fdopen = builtins.open, os.fdopen
    fd_names = {}

    def writing(mode) -> bool:
        return any(c in str(mode) for c in "wax+")

    def hooked_open(file, mode="r", *args, **kwargs):
        if isinstance(file, int) or not writing(mode) or not hooks.inside(file):
            return real_open(file, mode, *args, **kwargs)
        hooks.event(f"open-{mode}", file)
        fh = real_open(file, mode, *args, **kwargs)
        hooks.fds.add(fh.fileno())
        fd_names[fh.fileno()] = os.fspath(file)
        return _FileProxy(hooks, fh, os.fspath(file))

    def hooked_fdopen(fd, mode="r", *args, **kwargs):
        fh = real_fdopen(fd, mode, *args, **kwargs)
        if fd in hooks.fds and writing(mode):
            return _FileProxy(hooks, fh, fd_names.get(fd, "?"))
        return fh

    def wrap_path(name, real):
        def hooked(path, *args, **kwargs):
            if hooks.inside(path):
                hooks.event(name, path)
            return real(path, *args, **kwargs)
        return hooked

    def wrap_two(name, real):
        def hooked(src, dst, *args, **kwargs):
            if hooks.inside(src) or hooks.inside(dst):
                hooks.event(name, dst)
            return real(src, dst, *args, **kwargs)
        return hooked

    def wrap_fd(name, real):
        def hooked(fd, *args, **kwargs):
            if fd in hooks.fds:
                hooks.event(name, fd_names.get(fd, "?"))
            return real(fd, *args, **kwargs)
        return hooked

    real_os_open = os.open

    def hooked_os_open(path, flags, *args, **kwargs):
        if hooks.inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            hooks.event("os.open", path)
            fd = real_os_open(path, flags, *args, **kwargs)
            hooks.fds.add(fd)
            fd_names[fd] = os.fspath(path)
            return fd
        fd = real_os_open(path, flags, *args, **kwargs)
        if hooks.inside(path) or os.path.realpath(path) == hooks.root:
            hooks.fds.add(fd)  # e.g. the directory, opened to fsync it
            fd_names[fd] = os.fspath(path)
        return fd

    real_close = os.close

    def hooked_close(fd):
        hooks.fds.discard(fd)
        return real_close(fd)

    builtins.open = hooked_open
    os.fdopen = hooked_fdopen
    os.open = hooked_os_open
    os.close = hooked_close
    for name in ("remove", "unlink", "rmdir", "chmod", "truncate"):
        setattr(os, name, wrap_path(name, getattr(os, name)))
    for name in ("replace", "rename"):
        setattr(os, name, wrap_two(name, getattr(os, name)))
    for name in ("write", "fsync", "fdatasync", "ftruncate", "fchmod"):
        setattr(os, name, wrap_fd(name, getattr(os, name)))


# -- children ---------------------------------------------------------------------------------

def _child_body(target, write_end) -> None:
    """In a child: run ``target(payload)`` with its output captured, send the payload (JSON) on
    ``write_end`` and exit with its code."""
    code = 99
    try:
        with contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()) as err:
            payload = {}
            try:
                code = target(payload)
            finally:
                payload["stderr"] = err.getvalue()[-2000:]
        os.write(write_end, json.dumps(payload).encode())
    except BaseException as exc:  # noqa: BLE001
        os.write(write_end, json.dumps({"error": repr(exc)}).encode())
    finally:
        os._exit(code if isinstance(code, int) else 98)


def _wait(pid, read_end, timeout):
    chunks = []
    deadline = time.monotonic() + timeout
    while True:
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    payload = json.loads(b"".join(chunks) or b"{}")
    if os.WIFSIGNALED(status):
        return ("killed" if os.WTERMSIG(status) == signal.SIGKILL else
                f"signal {os.WTERMSIG(status)}"), payload
    return os.WEXITSTATUS(status), payload


def run_child(spec: dict, fork: bool, timeout: float = 300.0):
    """Run the child described by ``spec`` (:func:`_target`): forked from this process (cheap:
    ppo_ref is imported already; only for children that stop before training, as a forked
    child cannot run the compiled kernels' OpenMP loops), or as a new interpreter. Returns
    ``(status, payload)``: the exit code or ``"killed"`` (SIGKILL), and the child's JSON."""
    read_end, write_end = os.pipe()
    if fork:
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            _child_body(_target(spec), write_end)
        os.close(write_end)
        return _wait(pid, read_end, timeout)
    import subprocess
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child",
                             json.dumps(spec), str(write_end)], pass_fds=(write_end,))
    os.close(write_end)
    try:
        chunks = []
        while True:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(read_end)
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "timeout", {}
    payload = json.loads(b"".join(chunks) or b"{}")
    if code == -signal.SIGKILL:
        return "killed", payload
    return (code if code >= 0 else f"signal {-code}"), payload


def _target(spec: dict):
    """The child's work: ``train`` (the reference run, keeping a copy of its checkpoint after
    update ``STOP_AT`` as ``<dir>.stop.npz``) or ``resume`` (with hooks under the run dir when
    ``kill_at`` or ``record``; ``stop_at_begin``: exit 0 when training would start;
    ``delay``: SIGKILL after that many seconds)."""
    def target(payload):
        from ppo_ref.cli import main
        from ppo_ref.io.runlog import RunLogger
        run_dir = spec["run_dir"]
        if spec["mode"] == "train":
            original = RunLogger.callback

            def callback(self, trainer, stats):
                keep = original(self, trainer, stats)
                if trainer.n_updates == STOP_AT:
                    shutil.copy2(self.checkpoint_path, run_dir + ".stop.npz")
                return keep
            RunLogger.callback = callback
            return main(["train", "--run-dir", run_dir] + TRAIN)
        hooks = None
        if spec.get("kill_at") or spec.get("record"):
            hooks = _Hooks(run_dir, spec.get("kill_at", 0))
            install_hooks(hooks)
        if spec.get("stop_at_begin"):
            def begin(self, trainer):
                if hooks is not None:
                    payload["operations"] = hooks.count
                    payload["log"] = hooks.log
                raise _TrainingWouldStart
            RunLogger.begin = begin
        if spec.get("delay"):
            import threading
            threading.Timer(spec["delay"], os.kill, (os.getpid(), signal.SIGKILL)).start()
        try:
            return main(["train", "--resume", run_dir, "--quiet"])
        except _TrainingWouldStart:
            return 0
    return target


class _TrainingWouldStart(BaseException):
    """Raised from ``RunLogger.begin`` by a child that stops before training."""


# -- checks -----------------------------------------------------------------------------------

def _lines(path):
    with open(path, "rb") as fh:
        data = fh.read()
    return data.split(b"\n")[:-1]  # complete lines only


def check_dir(run_dir: str, ref_dir: str, label: str) -> list:
    """What a kill at any instant must leave: every run file readable; the checkpoint loads;
    metrics.csv and episodes.csv a prefix of the reference's holding at least the checkpoint's
    updates; timing.csv a row per update up to the checkpoint at least."""
    from ppo_ref.io.checkpoint import load_checkpoint
    problems = []
    try:
        _, meta = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"))
        updates = int(meta["n_updates"])
    except Exception as exc:  # noqa: BLE001
        return [f"{label}: checkpoint unreadable: {exc}"]
    try:
        with open(os.path.join(run_dir, "config.json"), "rb") as fh:
            info = json.loads(fh.read())
        if info.get("env_id") != "CartPole-v1" or "config" not in info:
            problems.append(f"{label}: config.json lost the run's settings")
    except Exception as exc:  # noqa: BLE001
        problems.append(f"{label}: config.json unreadable: {type(exc).__name__}: {exc}")
    for name, column in (("metrics.csv", 0), ("episodes.csv", 5), ("timing.csv", 0)):
        path = os.path.join(run_dir, name)
        if not os.path.exists(path):
            problems.append(f"{label}: {name} is missing")
            continue
        got, want = _lines(path), _lines(os.path.join(ref_dir, name))
        if not got or got[0] != want[0]:
            problems.append(f"{label}: {name} lost its header ({len(got)} lines)")
            continue
        if name != "timing.csv" and got != want[:len(got)]:
            problems.append(f"{label}: {name} is not a prefix of the reference's")
        rows = [r.split(b",") for r in got[1:]]
        last = max((int(r[column]) for r in rows if len(r) > column and r[column].isdigit()),
                   default=0)
        if name == "episodes.csv":
            # every episode finished by the checkpoint's update is there
            want_rows = [r.split(b",") for r in want[1:]]
            need = sum(1 for r in want_rows if int(r[column]) <= updates)
            if len(rows) < need:
                problems.append(f"{label}: episodes.csv has {len(rows)} episodes, the checkpoint "
                                f"(update {updates}) needs {need}")
        elif last < updates:
            problems.append(f"{label}: {name} ends at update {last}, the checkpoint is at "
                            f"update {updates}")
    return problems


def compare_final(run_dir: str, ref_dir: str, label: str) -> list:
    import numpy as np
    from ppo_ref.io.checkpoint import load_checkpoint
    problems = []
    for name in ("metrics.csv", "episodes.csv"):
        with open(os.path.join(run_dir, name), "rb") as a, open(os.path.join(ref_dir, name), "rb") as b:
            if a.read() != b.read():
                problems.append(f"{label}: {name} differs from the uninterrupted run's")
    got, _ = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"))
    want, _ = load_checkpoint(os.path.join(ref_dir, "checkpoint.npz"))
    for key in want:
        if key.startswith(("params/", "adam/")) and not np.array_equal(got.get(key), want[key]):
            problems.append(f"{label}: {key} differs from the uninterrupted run's")
            break
    leftovers = sorted(set(os.listdir(run_dir)) - set(RUN_FILES))
    if leftovers:
        problems.append(f"{label}: files left behind: {leftovers}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", nargs="?")
    parser.add_argument("--points", type=int, default=2,
                        help="kill points drawn among the operations after the rewrite (each "
                             "trains: a new interpreter)")
    parser.add_argument("--random-delays", type=int, default=0,
                        help="resumes killed after a random delay instead (new interpreters)")
    parser.add_argument("--chain-every", type=int, default=1,
                        help="the chained resumes are killed at every this many rewrite points")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", nargs=2, metavar=("JSON", "FD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child_body(_target(json.loads(args.child[0])), int(args.child[1]))
    rng = random.Random(args.seed)
    import ppo_ref.cli  # noqa: F401  (imported once, before the children are forked)
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    ref, killed = os.path.join(work, "ref"), os.path.join(work, "killed")
    problems = []
    if not os.path.exists(ref + ".stop.npz"):
        shutil.rmtree(ref, ignore_errors=True)
        status, payload = run_child({"mode": "train", "run_dir": ref}, fork=False)
        if status != 0 or not os.path.exists(ref + ".stop.npz"):
            print(json.dumps({"problems": [f"the reference run ended with {status}: "
                                           f"{payload.get('stderr', '')[-300:]}"]}))
            return 1
    # the rows of 8 updates, the checkpoint of update 4: killed -9 between two checkpoints
    shutil.rmtree(killed, ignore_errors=True)
    shutil.copytree(ref, killed)
    shutil.copy2(ref + ".stop.npz", os.path.join(killed, "checkpoint.npz"))

    def fresh(name):
        target = os.path.join(work, name)
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(killed, target)
        return target

    # load the compiled kernels a resume uses before training (numba's typing context) once,
    # here, so every forked child starts with them: no OpenMP loop runs in this process
    from ppo_ref.train.ppo import PPOTrainer
    PPOTrainer.load(os.path.join(killed, "checkpoint.npz")).close()
    count_dir = fresh("count")
    status, payload = run_child({"mode": "resume", "run_dir": count_dir, "record": True,
                                 "stop_at_begin": True}, fork=True)
    rewrite = int(payload.get("operations", 0))
    tally = {"checks": 0, "failed": 0}

    def checked(found):
        tally["checks"] += 1
        tally["failed"] += bool(found)
        return found
    if status != 0 or not rewrite:
        problems.append(f"the counting resume ended with {status}: {payload}"[:400])
    shutil.rmtree(count_dir, ignore_errors=True)
    later = sorted(rng.sample(range(rewrite + 1, rewrite + 80), args.points))
    kills = 0
    for k in list(range(1, rewrite + 1)) + later:
        target = fresh(f"kill-{k}")
        status, payload = run_child({"mode": "resume", "run_dir": target, "kill_at": k,
                                     "stop_at_begin": k <= rewrite}, fork=k <= rewrite)
        kills += status == "killed"
        if status not in ("killed", 0):
            problems.append(f"kill before operation {k}: the resume ended with {status}: "
                            f"{payload.get('stderr', '')[-200:]}")
        problems += checked(check_dir(target, ref, f"kill before operation {k}"))
        shutil.rmtree(target, ignore_errors=True)
    # chained: one directory killed at every rewrite point in turn, then resumed to the end
    chain = fresh("chain")
    for k in range(1, rewrite + 1, max(1, args.chain_every)):
        status, payload = run_child({"mode": "resume", "run_dir": chain, "kill_at": k,
                                     "stop_at_begin": True}, fork=True)
        kills += status == "killed"
        problems += checked(check_dir(chain, ref, f"chained kill before operation {k}"))
    for j in range(args.random_delays):
        delay = rng.uniform(0.5, 3.0)
        status, payload = run_child({"mode": "resume", "run_dir": chain, "delay": delay},
                                    fork=False)
        kills += status == "killed"
        problems += checked(check_dir(chain, ref, f"chained kill after {delay:.2f} s"))
        if status == 0:
            break
    status, payload = run_child({"mode": "resume", "run_dir": chain}, fork=False)
    if status != 0:
        problems.append(f"chained kills: the final resume ended with {status}: "
                        f"{payload.get('stderr', '')[-300:]}")
    else:
        problems += checked(compare_final(chain, ref, "chained kills"))
    print(json.dumps({"rewrite_operations": rewrite, "kills": kills, "checks": tally["checks"],
                      "failed_checks": tally["failed"], "problems": problems}))
    return 0 if not problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
