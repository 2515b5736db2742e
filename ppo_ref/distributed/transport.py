"""Thread and process plumbing of the actor-learner loop: :class:`ActorGroup` (the running
actors and the channels to and from them) and :func:`start_actors` (Ray actors through
:mod:`ppo_ref.distributed.ray_actors`)."""
from __future__ import annotations

import contextlib
import multiprocessing
import queue as queue_module
import signal
import threading
import time
from multiprocessing.process import BaseProcess
from typing import Any, Callable, Dict, Optional, Sequence

from ppo_ref._checks import check_choice, check_count
from ppo_ref.distributed.actor import (POLL_SECONDS, _process_actor_main, _queue_receiver,
                                       _report_actor, run_actor)
from ppo_ref.distributed.config import AsyncActorLearnerConfig
from ppo_ref.distributed.messages import ActorFailed, ActorFinished, Shutdown

__all__ = ["ActorGroup", "start_actors"]


class ActorGroup:
    """Running actors (threads or processes; Ray: the subclass
    :class:`~ppo_ref.distributed.ray_actors.RayActorGroup`) and their channels, made by
    :func:`start_actors`. Actor threads put on one ``queue.Queue`` (the inbox); actor processes
    each write their own pipe, which a reader thread drains into the inbox (a pipe never fills
    up while the learner trains). One queue per actor carries the learner's messages."""

    def __init__(self, kind: str, workers: list, inbox: "queue_module.Queue",
                 broadcast_queues: list, stop_event: Optional[threading.Event] = None,
                 readers: Sequence = ()):
        self.kind = kind
        self.workers = workers
        self.inbox = inbox
        self.broadcast_queues = broadcast_queues
        self.readers = list(readers)
        self._stop_event = stop_event
        self._receive = _queue_receiver(inbox)
        self._closed = False
        self._reader_done = [False] * len(self.readers)
        self._pump_stop = threading.Event()
        self._pump: Optional[threading.Thread] = None
        self.final_messages: Dict[int, Any] = {}
        if self.readers:
            self._pump = threading.Thread(target=self._read_pipes, name="ppo_ref-learner-inbox",
                                          daemon=True)
            self._pump.start()

    @property
    def num_actors(self) -> int:
        return len(self.workers)

    def get(self, timeout: float):
        """Next message for the learner, or ``None`` after ``timeout`` seconds (0: no wait)."""
        return self._receive(timeout)

    def _read_pipes(self) -> None:
        """Reader thread: move the actors' pipe messages to the inbox (in order per actor)
        until every pipe reached end-of-file or shutdown."""
        from multiprocessing.connection import wait
        index = {id(conn): i for i, conn in enumerate(self.readers)}
        while not self._pump_stop.is_set():
            open_readers = [c for i, c in enumerate(self.readers) if not self._reader_done[i]]
            if not open_readers:
                return
            for conn in wait(open_readers, POLL_SECONDS):
                try:
                    self.inbox.put(conn.recv())
                except (EOFError, OSError):
                    self._reader_done[index[id(conn)]] = True   # closed its end or died

    def channel_finished(self, agent_id: int) -> bool:
        """True when everything the actor sent is in the inbox (its pipe reached end-of-file);
        always False for threads."""
        return bool(self.readers) and self._reader_done[agent_id]

    def send(self, agent_id: int, message) -> None:
        self.broadcast_queues[agent_id].put(message)

    def broadcast(self, message) -> None:
        """Send ``message`` to every actor that is still alive."""
        for agent_id in range(self.num_actors):
            if self.is_alive(agent_id):
                self.send(agent_id, message)

    def is_alive(self, agent_id: int) -> bool:
        return self.workers[agent_id].is_alive()

    def exit_description(self, agent_id: int) -> str:
        worker = self.workers[agent_id]
        if self.kind != "process":
            return f"thread {worker.name} ended"
        text = f"process {worker.pid} exited with code {worker.exitcode}"
        if worker.exitcode == 1:
            text += (" (code 1 before the actor could report anything: usually its imports or "
                     "the unpickling of its arguments failed; its traceback went to stderr. "
                     "Process actors start with 'spawn', which re-imports the main script: a "
                     "script must start the learner under `if __name__ == \"__main__\":`)")
        return text

    def _drain(self) -> None:
        """Keep the last words of every message already in the inbox."""
        for msg in iter(lambda: self._receive(0.0), None):
            self._keep_final(msg)

    def _keep_final(self, msg) -> None:
        if isinstance(msg, (ActorFinished, ActorFailed)):
            self.final_messages[msg.agent_id] = msg

    def shutdown(self, timeout: float = 10.0) -> Dict[int, Any]:
        """Send :class:`Shutdown` to every live actor, keep reading while they exit, stop
        whatever still runs after ``timeout`` seconds (:meth:`_stop`). Idempotent; returns each
        actor's last :class:`ActorFinished` or :class:`ActorFailed` by id."""
        if self._closed:
            return self.final_messages
        self._closed = True
        for agent_id in range(self.num_actors):
            if self.is_alive(agent_id):
                # a closed queue: the actor is gone anyway
                with contextlib.suppress(Exception):  # noqa: BLE001
                    self.send(agent_id, Shutdown())
        deadline = time.monotonic() + timeout
        while any(map(self.is_alive, range(self.num_actors))) and time.monotonic() < deadline:
            self._keep_final(self.get(0.02))
        self._stop(deadline)
        return self.final_messages

    def _stop(self, deadline: float) -> None:
        """Terminate (then kill) the processes still running, join, read what is left and close
        the channels; a thread stuck inside env.step cannot be killed: after ``deadline`` (and
        0.5 s) it stays behind as a daemon."""
        if self._stop_event is not None:
            self._stop_event.set()
        started = [w for w in self.workers if w.ident is not None]
        if self.kind == "process":
            # all at once: the time to stop N stuck actors does not grow with N
            for stop in (BaseProcess.terminate, BaseProcess.kill):
                for worker in started:
                    if worker.is_alive():
                        stop(worker)
                joined_by = time.monotonic() + 1.0
                for worker in started:
                    worker.join(max(0.0, joined_by - time.monotonic()))
        else:
            for worker in started:
                worker.join(max(0.0, deadline - time.monotonic()) + 0.5)
        self._drain()
        if self._pump is not None:
            self._pump_stop.set()
            self._pump.join(2.0)
        self._drain()
        if self.kind == "process":
            for q in self.broadcast_queues:
                q.cancel_join_thread()      # an actor that died cannot drain its queue
                q.close()
            for conn in self.readers:
                conn.close()


@contextlib.contextmanager
def _sigint_held():
    """SIGINT held back while actor processes start: they start with it blocked (the mask
    survives ``exec``), so a terminal's Ctrl-C, the learner's to handle, never interrupts their
    imports; the learner's own (main thread) is raised again once they have started."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = []
    main = (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is not None)
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum)) \
        if main else None
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if held:
            signal.raise_signal(signal.SIGINT)


def start_actors(config: AsyncActorLearnerConfig, env, *, actor_fn: Callable = run_actor,
                 chunk_size: Optional[int] = None, start_method: str = "spawn") -> ActorGroup:
    """The :class:`ActorGroup` of ``config.num_actors`` actors of kind ``config.actors``, each
    running ``actor_fn(agent_id, env, config, send, receive, learner_gone, chunk_size=...)``
    (default :func:`run_actor`). ``env``: gymnasium id or zero-argument factory (picklable for
    process and Ray actors); ``chunk_size``: experiences per message (None: 32, for Ray
    ``n_steps``); ``start_method``: "spawn" or "forkserver" (fork would copy the learner's
    threads and locks)."""
    check_choice(start_method, "start_method", ("spawn", "forkserver"))
    default_size = config.n_steps if config.actors == "ray" else 32
    chunk_size = check_count(default_size if chunk_size is None else chunk_size, "chunk_size", 1)
    if config.actors == "ray":
        from ppo_ref.distributed.ray_actors import start_ray_actors
        return start_ray_actors(config, env, actor_fn, chunk_size)
    inbox: queue_module.Queue = queue_module.Queue()
    if config.actors == "process":
        ctx = multiprocessing.get_context(start_method)
        pipes = [ctx.Pipe(duplex=False) for _ in range(config.num_actors)]
        broadcast_queues = [ctx.Queue() for _ in range(config.num_actors)]
        workers = [ctx.Process(target=_process_actor_main, name=f"ppo_ref-actor-{i}",
                               args=(actor_fn, i, env, config, pipes[i][1],
                                     broadcast_queues[i], chunk_size), daemon=True)
                   for i in range(config.num_actors)]
        stop_event = None
    else:
        pipes = []
        broadcast_queues = [queue_module.Queue() for _ in range(config.num_actors)]
        stop_event = threading.Event()
        main_thread = threading.main_thread()

        def learner_gone() -> bool:
            return stop_event.is_set() or not main_thread.is_alive()

        workers = [threading.Thread(target=_report_actor, name=f"ppo_ref-actor-{i}",
                                    args=(actor_fn, i, env, config, inbox.put,
                                          _queue_receiver(broadcast_queues[i]), learner_gone,
                                          chunk_size), daemon=True)
                   for i in range(config.num_actors)]
    group = ActorGroup(config.actors, workers, inbox, broadcast_queues, stop_event,
                       readers=[reader for reader, _ in pipes])
    try:
        with _sigint_held():
            for worker in workers:
                worker.start()
    except BaseException:
        group.shutdown(timeout=1.0)
        raise
    finally:
        # the children hold the write ends: closing ours lets a dead actor's pipe end
        for _, writer in pipes:
            writer.close()
    return group
