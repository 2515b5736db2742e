"""Child processes that never outlive their parent.

:func:`exit_with_parent` is called first thing in a process started by ``multiprocessing``
(an actor of :mod:`ppo_ref.actor_learner`, a sub-env worker of gymnasium's
``AsyncVectorEnv``). Once the parent is gone (killed with SIGKILL, so it could not shut its
children down) the child ends too, even while it is blocked inside ``env.step``:

* on Linux the kernel sends it SIGKILL when the parent dies (``prctl(PR_SET_PDEATHSIG)``);
* everywhere, a daemon watchdog thread compares ``os.getppid()`` with the parent's pid every
  ``poll_seconds`` and calls ``os._exit`` when they differ (the child was re-parented).
  The thread runs while the main thread sleeps or waits on I/O; only an env that holds the GIL
  in a compiled loop can delay it, which the kernel signal covers on Linux.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time

__all__ = ["exit_with_parent"]

_PR_SET_PDEATHSIG = 1
_started = False


def _set_parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no libc.prctl: the watchdog thread remains
        pass


def exit_with_parent(poll_seconds: float = 0.5, exit_code: int = 70) -> None:
    """Make this process end (``os._exit(exit_code)``) when the process that started it dies.
    A no-op in a process not started by ``multiprocessing`` and when already called."""
    global _started
    parent = multiprocessing.parent_process()
    if parent is None or _started:
        return
    _started = True
    parent_pid = parent.pid
    _set_parent_death_signal()
    if os.getppid() != parent_pid:  # died before the signal was armed
        os._exit(exit_code)

    def watch():
        while True:
            time.sleep(poll_seconds)
            if os.getppid() != parent_pid:
                os._exit(exit_code)

    threading.Thread(target=watch, name="ppo_ref-parent-watchdog", daemon=True).start()
