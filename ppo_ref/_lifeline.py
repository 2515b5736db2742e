"""Child processes that never outlive their parent.

:func:`exit_with_parent` is called first thing in a process started by ``multiprocessing``
(an actor, an ``AsyncVectorEnv`` worker): when the parent dies (even by SIGKILL) the child
ends too, even inside ``env.step``, because a daemon thread calls ``os._exit`` once the parent
is gone: ``multiprocessing``'s parent sentinel reports it closed, or ``os.getppid()`` is no
longer the process that started this one (the parent with ``spawn``, the fork server with
``forkserver``) (an env holding the GIL delays it). Linux's ``PR_SET_PDEATHSIG`` is not used:
it fires when the parent's starting *thread* ends.
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
    starter = os.getppid()   # the parent (spawn) or the fork server (forkserver)
    if not parent.is_alive():  # the parent died before we got here
        os._exit(exit_code)

    def watch():
        while True:
            time.sleep(poll_seconds)
            if os.getppid() != starter or not parent.is_alive():
                os._exit(exit_code)

    threading.Thread(target=watch, name="ppo_ref-parent-watchdog", daemon=True).start()
