"""Child processes that never outlive their parent.

:func:`exit_with_parent` is called first thing in a process started by ``multiprocessing``
(an actor of :mod:`ppo_ref.distributed.learner`, a sub-env worker of gymnasium's
``AsyncVectorEnv``). Once the parent is gone (killed with SIGKILL, so it could not shut its
children down) the child ends too, even while it is blocked inside ``env.step``: a daemon
watchdog thread compares ``os.getppid()`` with the parent's pid every ``poll_seconds`` and
calls ``os._exit`` when they differ (the child was re-parented). The thread runs while the main
thread sleeps, waits on I/O or runs NumPy code that releases the GIL; an env holding the GIL in
a compiled loop delays it until the loop returns.

(Linux's ``prctl(PR_SET_PDEATHSIG)`` is not used: it fires when the *thread* that started the
child ends, so a trainer created in a short-lived thread would lose its workers.)
"""
from __future__ import annotations

import multiprocessing
import os
import threading
import time

__all__ = ["exit_with_parent"]

_watching_pid = None  # the pid of the process whose watchdog runs (a fork copies the variable)


def exit_with_parent(poll_seconds: float = 0.5, exit_code: int = 70) -> None:
    """Make this process end (``os._exit(exit_code)``) when the process that started it dies.
    A no-op in a process not started by ``multiprocessing`` and when already called."""
    global _watching_pid
    parent = multiprocessing.parent_process()
    if parent is None or _watching_pid == os.getpid():
        return
    _watching_pid = os.getpid()
    parent_pid = parent.pid
    if os.getppid() != parent_pid:  # the parent died before we got here
        os._exit(exit_code)

    def watch():
        while True:
            time.sleep(poll_seconds)
            if os.getppid() != parent_pid:
                os._exit(exit_code)

    threading.Thread(target=watch, name="ppo_ref-parent-watchdog", daemon=True).start()
