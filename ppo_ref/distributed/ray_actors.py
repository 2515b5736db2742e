"""Ray actors of the actor-learner loop (``actors="ray"``, docs/specification.md §6.1):
:class:`RayActorGroup`, :func:`start_ray_actors` and :func:`init_ray`. Each Ray actor runs
:func:`run_actor` in a thread of its worker; the learner keeps one ``pull`` in flight per actor.
Ray is imported only here, and only when Ray actors start."""
from __future__ import annotations

import contextlib
import logging
import os
import queue as queue_module
import threading
from typing import Any, Dict, Optional

from ppo_ref._checks import one_line
from ppo_ref.distributed.actor import _queue_receiver, _report_actor
from ppo_ref.distributed.config import AsyncActorLearnerConfig
from ppo_ref.distributed.messages import (ActorDiedError, ActorFailed, ActorFinished,
                                          ActorLearnerError, StarvationError)
from ppo_ref.distributed.transport import ActorGroup

__all__ = ["RayActorGroup", "start_ray_actors", "init_ray", "import_ray", "RAY_MISSING"]

RAY_MISSING = "actors='ray' needs Ray, which is not installed: pip install 'ppo_ref[ray]'"
#: Seconds an actor's pull waits for its first message before it returns empty.
PULL_SECONDS = 1.0
#: Seconds shutdown waits for killed actors to be reported dead.
KILL_SECONDS = 2.0


def import_ray():
    """The ``ray`` module, or ImportError(:data:`RAY_MISSING`)."""
    try:
        import ray
    except ImportError:
        raise ImportError(RAY_MISSING) from None
    return ray


def init_ray(address: Optional[str] = None, num_cpus: Optional[int] = None) -> None:
    """Connect this process to Ray: join the cluster at ``address`` (``HOST:PORT`` or
    ``"auto"``; its port is tried for 5 s first), or (None) start a Ray of this machine whose
    processes all listen on 127.0.0.1 only, with ``num_cpus`` (None: ``os.cpu_count()``).

    Ray binds every interface unless it runs in its single-machine mode
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read when Ray is imported): for a local start or a
    loopback address this switches that mode on (the variable for Ray's processes, the flag for
    this one), restores both after ``ray.init`` and checks every node is 127.0.0.1. A local Ray
    has no dashboard, reports no usage statistics, and its workers import ``ppo_ref`` from where
    this process does.

    Raises:
        ImportError: Ray is not installed. ConnectionError: nothing listens at ``address``.
        RuntimeError: Ray is already initialized here, or a loopback Ray has a node elsewhere.
    """
    ray = import_ray()
    from ray._private import ray_constants
    import ppo_ref
    if ray.is_initialized():
        raise RuntimeError("init_ray: Ray is already initialized in this process")
    host, _, port = (address or "").split("://")[-1].rpartition(":")
    if address is not None and port.isdigit():
        import socket
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=5.0).close()
        except OSError as exc:
            raise ConnectionError(f"no Ray cluster at {address}: {exc}") from None
    loopback = address is None or host in ("localhost", "::1", "[::1]") or host.startswith("127.")
    root = os.path.dirname(os.path.dirname(os.path.abspath(ppo_ref.__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    environ = {"PYTHONPATH": path}
    if loopback:
        environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if address is None:
        environ["RAY_USAGE_STATS_ENABLED"] = "0"     # Ray would report usage to its servers
    # restored afterwards: only these variables (what Ray sets in os.environ stays)
    saved_environ = {key: os.environ.get(key) for key in environ}
    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = saved and not loopback
    os.environ.update(environ)
    try:
        if address is None:
            # "local": a new Ray even when `ray start` runs one on this machine
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1,
                     include_dashboard=False, _node_ip_address="127.0.0.1",
                     logging_level=logging.WARNING)
        else:
            try:
                ray.init(address=address, logging_level=logging.WARNING)
            except ConnectionError as exc:
                if "RAY_AUTH_MODE" in os.environ:
                    raise
                raise ConnectionError(f"{exc} (a cluster with token authentication, Ray's "
                                      f"default, is joined with RAY_AUTH_MODE=token and its "
                                      f"token: RAY_AUTH_TOKEN or ~/.ray/auth_token)") from None
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
        for key, value in saved_environ.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    nodes = sorted({node["NodeManagerAddress"] for node in ray.nodes()})
    if loopback and nodes != ["127.0.0.1"]:
        ray.shutdown()
        raise RuntimeError(f"the Ray on this machine has nodes at {nodes}, not at 127.0.0.1 "
                           f"only: refused (this Ray version ignores its single-machine mode)")


class _RayActorHost:
    """The body of one Ray actor: ``_report_actor`` in a thread, a queue of its messages for
    :meth:`pull` and one of the learner's filled by :meth:`receive`."""

    def __init__(self, actor_fn, agent_id, env, config, chunk_size):
        from ppo_ref.train.ppo import limit_blas_threads
        limit_blas_threads(1)
        self.outbox: queue_module.Queue = queue_module.Queue()
        self.inbox: queue_module.Queue = queue_module.Queue()
        # the learner cannot vanish unnoticed: Ray kills the actors of a driver that died
        self.thread = threading.Thread(
            target=_report_actor, daemon=True, name=f"ppo_ref-actor-{agent_id}",
            args=(actor_fn, agent_id, env, config, self.outbox.put,
                  _queue_receiver(self.inbox), lambda: False, chunk_size))
        self.thread.start()

    def where(self):
        """``(pid, node address, ppo_ref version)`` of this actor."""
        import ray
        import ppo_ref
        return os.getpid(), ray.util.get_node_ip_address(), ppo_ref.__version__

    def receive(self, message) -> None:
        self.inbox.put(message)

    def pull(self, wait: float) -> list:
        """Every message sent since the last pull, in order; waits up to ``wait`` seconds for
        the first (an empty list when none came)."""
        receive = _queue_receiver(self.outbox)
        first = receive(wait)
        return [] if first is None else [first, *iter(lambda: receive(0.0), None)]


class RayActorGroup(ActorGroup):
    """The running Ray actors (``workers``: handles; ``pids``, ``nodes``: where each runs) and
    their pulls."""

    def __init__(self, ray, handles: list):
        super().__init__("ray", handles, queue_module.Queue(), [])
        self._ray = ray
        self._pulls: Dict[Any, int] = {}          # ObjectRef of the pull in flight -> agent id
        self._dead: Dict[int, str] = {}           # agent id -> Ray's error text
        self._ended: set = set()                  # agents whose last word is in the inbox
        self.pids = [None] * len(handles)
        self.nodes = [None] * len(handles)

    def wait_started(self, timeout: float) -> None:
        """Wait until every actor runs (then start pulling): raise ActorDiedError for one that
        failed to start, StarvationError when some were not placed within ``timeout``."""
        ray = self._ray
        import ppo_ref
        refs = [h.where.remote() for h in self.workers]
        ready, missing = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        for agent_id, ref in enumerate(refs):
            if ref not in ready:
                continue
            try:
                self.pids[agent_id], self.nodes[agent_id], version = ray.get(ref)
            except ray.exceptions.RayError as exc:
                raise ActorDiedError(agent_id, f"Ray actor failed to start: {one_line(exc, 2000)}")
            if version != ppo_ref.__version__:
                raise ActorLearnerError(
                    f"Ray actor {agent_id} on {self.nodes[agent_id]} runs ppo_ref {version}, the "
                    f"learner {ppo_ref.__version__}: install the same ppo_ref on every node")
        if missing:
            cpus = ray.cluster_resources().get("CPU", 0)
            raise StarvationError(
                f"{len(missing)} of {len(refs)} Ray actors did not start within {timeout:g} s "
                f"(starvation_timeout); each asks for 1 CPU and the Ray cluster has {cpus:g}")
        for agent_id in range(self.num_actors):
            self._pull(agent_id)

    def _pull(self, agent_id: int) -> None:
        self._pulls[self.workers[agent_id].pull.remote(PULL_SECONDS)] = agent_id

    def _poll(self, timeout: float) -> None:
        """Move the messages of every finished pull to the inbox and pull again; a failed pull
        marks its actor dead."""
        ray = self._ray
        ready, _ = ray.wait(list(self._pulls), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(list(self._pulls), num_returns=len(self._pulls), timeout=0)
        for ref in ready:
            agent_id = self._pulls.pop(ref)
            try:
                messages = ray.get(ref)
            except ray.exceptions.RayError as exc:
                self._dead[agent_id] = one_line(exc, 2000)
                continue
            for msg in messages:
                self.inbox.put(msg)
                if isinstance(msg, (ActorFinished, ActorFailed)):
                    self._ended.add(agent_id)
            if agent_id not in self._ended:
                self._pull(agent_id)

    def get(self, timeout: float):
        msg = super().get(0.0)
        if msg is not None or not self._pulls:
            return msg if msg is not None else super().get(timeout)
        self._poll(timeout)
        return super().get(0.0)

    def channel_finished(self, agent_id: int) -> bool:
        return agent_id in self._dead or agent_id in self._ended

    def is_alive(self, agent_id: int) -> bool:
        return not self.channel_finished(agent_id)

    def send(self, agent_id: int, message) -> None:
        self.workers[agent_id].receive.remote(message)

    def broadcast(self, message) -> None:
        """Put ``message`` in the object store once; every live actor receives its reference."""
        ref = self._ray.put(message)
        for agent_id in range(self.num_actors):
            if self.is_alive(agent_id):
                self.workers[agent_id].receive.remote(ref)

    def exit_description(self, agent_id: int) -> str:
        where = f"Ray actor (pid {self.pids[agent_id]} on {self.nodes[agent_id]})"
        if agent_id in self._dead:
            return f"{where} died: {self._dead[agent_id]}"
        return f"{where} ended"

    def _stop(self, deadline: float) -> None:
        """Read what is left, kill every actor and wait (at most :data:`KILL_SECONDS`) until Ray
        reports them dead."""
        ray = self._ray
        self._drain()
        for handle in self.workers:
            ray.kill(handle, no_restart=True)
        # every call in flight fails once Ray knows the actor is dead
        refs = list(self._pulls) + [h.where.remote() for h in self.workers]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=KILL_SECONDS)
        for ref in ready:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(ref)


def start_ray_actors(config: AsyncActorLearnerConfig, env, actor_fn, chunk_size: int
                     ) -> RayActorGroup:
    """Start ``config.num_actors`` Ray actors (on the connected Ray, else :func:`init_ray` with
    ``config.ray_address``) and wait at most ``config.starvation_timeout`` s until they run. A
    Ray that cannot be joined or started is an :class:`ActorLearnerError`."""
    ray = import_ray()
    if not ray.is_initialized():
        try:
            init_ray(config.ray_address, max(os.cpu_count() or 1, config.num_actors))
        except (ConnectionError, RuntimeError) as exc:
            raise ActorLearnerError(f"cannot start Ray actors: {exc}") from exc
    host = ray.remote(_RayActorHost).options(num_cpus=1, max_restarts=0, max_concurrency=2,
                                             scheduling_strategy="SPREAD")
    group = RayActorGroup(ray, [host.remote(actor_fn, agent_id, env, config, chunk_size)
                                for agent_id in range(config.num_actors)])
    try:
        group.wait_started(config.starvation_timeout)
    except BaseException:
        group.shutdown(0.0)
        raise
    return group
