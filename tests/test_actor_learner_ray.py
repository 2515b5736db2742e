"""Actor-learner loop with Ray actors (``actors="ray"``), on a real Ray that ppo_ref starts on
127.0.0.1 only (once for the module: Ray's start-up takes seconds). Every test that runs Ray
checks the sockets of the whole process tree: loopback addresses only.

The same contract as threads and processes (one FIFO per actor, the budget, versions, the
learner's advantages): thread and Ray actors given the same seeds in lockstep make bit-identical
updates; failures (an actor's exception, a killed worker process, a silent actor, an exception
in the learner) are reported fast and leave no actor process alive. Nodes on several machines
cannot run here (docs/specification.md §6, "Actors on Ray").
"""
import functools
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ppo_ref.config import PPOConfig  # noqa: E402
from ppo_ref.distributed import (ActorDiedError, AsyncActorLearnerConfig,  # noqa: E402
                                 ExperienceBatch, StarvationError, learner_loop, make_learner,
                                 start_actors)
from ppo_ref.distributed.ray_actors import init_ray  # noqa: E402

from test_actor_learner import (LEARN_BAR, LEARN_PPO, crashing_env,  # noqa: E402
                                until_learned)

TESTS = os.path.dirname(os.path.abspath(__file__))
# ACTOR_DEATH_SECONDS plus slack for a loaded machine (as tests/test_actor_learner_liveness.py)
BOUND_SECONDS = 2.5


# -- the sockets of a process tree -------------------------------------------------------------

def _tree(root: int) -> set:
    """``root`` and every process descending from it (from /proc)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    pids, todo = set(), [root]
    while todo:
        pid = todo.pop()
        pids.add(pid)
        todo.extend(children.get(pid, []))
    return pids


def _address(hex_address: str) -> str:
    """An address of /proc/net/{tcp,udp}[6] as text."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words)


def tree_sockets(root: int) -> list:
    """``(process name, protocol, local address, remote address)`` of every TCP and UDP socket
    held by ``root``'s process tree."""
    table = {}
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        with open(f"/proc/net/{proto}") as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                local, remote, inode = fields[1], fields[2], fields[9]
                table[inode] = (proto, _address(local.split(":")[0]),
                                _address(remote.split(":")[0]))
    found = []
    for pid in _tree(root):
        try:
            with open(f"/proc/{pid}/comm") as fh:
                name = fh.read().strip()
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        for link in links:
            if link.startswith("socket:["):
                entry = table.get(link[8:-1])
                if entry is not None:
                    found.append((name,) + entry)
    return found


def _loopback(address: str) -> bool:
    return (address.startswith("127.") or address == "::1"
            or address.startswith("::ffff:127."))


def off_loopback(sockets) -> list:
    """The sockets bound to or connected to an address that is not loopback (a wildcard bind,
    0.0.0.0 or ::, listens on every interface, so it counts; an unconnected remote does not)."""
    unconnected = ("0.0.0.0", "::")
    return [s for s in sockets
            if not _loopback(s[2]) or not (_loopback(s[3]) or s[3] in unconnected)]


# -- Ray for the module ------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One Ray for the module, started by ppo_ref (loopback only); its workers can import this
    directory's helpers (the misbehaving envs)."""
    if ray.is_initialized():
        ray.shutdown()
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, saved) if p)
    try:
        init_ray(num_cpus=8)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = saved
    yield
    ray.shutdown()


def ray_config(**changes):
    base = dict(num_actors=2, n_steps=32, total_timesteps=20 * 64, actors="ray",
                ppo=PPOConfig(n_epochs=1, batch_size=64), starvation_timeout=120.0)
    base.update(changes)
    return AsyncActorLearnerConfig(**base)


def gone(pids, within: float = BOUND_SECONDS) -> bool:
    """True once no process of ``pids`` runs any more (a zombie does not run)."""
    deadline = time.monotonic() + within
    while True:
        running = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    state = fh.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state not in ("Z", "X"):
                running.append(pid)
        if not running or time.monotonic() > deadline:
            return not running
        time.sleep(0.05)


# -- the tests ---------------------------------------------------------------------------------

def test_lockstep_runs_are_identical_with_thread_and_ray_actors(monkeypatch):
    """Lockstep fixes every actor's steps and versions by the seeds alone, so the learner gets
    the same transitions from thread and Ray actors and must make the same updates, bit for
    bit. On the Ray side: one object-store put per broadcast (not one per actor), experiences
    in messages of n_steps rows, and only loopback sockets in the whole process tree."""
    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value: puts.append(1) or real_put(value))
    runs = {}
    for kind in ("thread", "ray"):
        config = ray_config(actors=kind, num_actors=3, max_lead_steps=32, total_timesteps=5 * 96,
                            seed=3, ppo=PPOConfig(n_epochs=2, batch_size=48))
        group = start_actors(config, "CartPole-v1")
        rows, updates, sockets = [], [], []
        real_inbox_put = group.inbox.put
        group.inbox.put = lambda m: (rows.append(len(m)) if isinstance(m, ExperienceBatch)
                                     else None) or real_inbox_put(m)

        def callback(info):
            updates.append((info.advantages.copy(), info.returns.copy(),
                            {k: v for k, v in info.stats.items()
                             if not k.startswith("time_") and k != "fps"}))
            if info.update == 2:
                sockets.extend(tree_sockets(os.getpid()))

        trainer, report = learner_loop(config, make_learner(config, "CartPole-v1"), group,
                                       callback=callback)
        assert report.policy_lag_max == [0] * 5
        runs[kind] = (trainer.params, report, updates, rows, sockets, group)
    p_thread, r_thread, u_thread, _, _, _ = runs["thread"]
    p_ray, r_ray, u_ray, ray_rows, ray_sockets, group = runs["ray"]
    assert r_thread.episode_returns == r_ray.episode_returns
    for (a1, ret1, s1), (a2, ret2, s2) in zip(u_thread, u_ray, strict=True):
        np.testing.assert_array_equal(a1, a2)
        np.testing.assert_array_equal(ret1, ret2)
        assert s1 == s2
    for key in p_thread:
        np.testing.assert_array_equal(p_thread[key], p_ray[key])
    assert len(puts) == r_ray.broadcasts == 6          # versions 0 to 5
    # a flush per n_steps (in lockstep also a wait), and the steps after the last broadcast
    assert ray_rows.count(32) >= 5 * 3 and len(ray_rows) <= 6 * 3 and max(ray_rows) == 32
    assert all(5 * 32 <= s.steps_sent <= 6 * 32 for s in r_ray.actor_stats)
    assert any(s[0] == "raylet" for s in ray_sockets) and off_loopback(ray_sockets) == []
    assert gone(group.pids)


@pytest.mark.slow
@pytest.mark.parametrize("num_actors", [2, 4])
def test_ray_actors_learn_cartpole(num_actors):
    config = AsyncActorLearnerConfig(num_actors=num_actors, n_steps=256 // num_actors,
                                     total_timesteps=40_000, gamma=0.98, gae_lambda=0.8,
                                     actors="ray", ppo=LEARN_PPO, starvation_timeout=120.0)
    group = start_actors(config, "CartPole-v1")
    trainer, report = learner_loop(config, make_learner(config, "CartPole-v1"), group,
                                   callback=until_learned())
    assert report.env_steps <= 50_000
    assert np.mean(report.episode_returns[-30:]) >= LEARN_BAR
    assert all(s is not None and s.steps_sent >= report.env_steps // num_actors
               for s in report.actor_stats)
    assert set(group.nodes) == {"127.0.0.1"} and gone(group.pids)


def test_killed_ray_actor_worker_is_reported_fast_and_no_actor_is_left():
    config = ray_config(num_actors=3, total_timesteps=10 ** 7)
    group = start_actors(config, "CartPole-v1")
    killed = {}

    def callback(info):
        if info.update == 3:
            killed["t"] = time.monotonic()
            os.kill(group.pids[1], signal.SIGKILL)

    with pytest.raises(ActorDiedError) as excinfo:
        learner_loop(config, make_learner(config, "CartPole-v1"), group, callback=callback)
    elapsed = time.monotonic() - killed["t"]
    assert elapsed < BOUND_SECONDS, elapsed
    assert excinfo.value.agent_id == 1
    assert f"pid {group.pids[1]} on 127.0.0.1" in str(excinfo.value)
    assert "died" in str(excinfo.value)            # Ray's own text follows
    assert gone(group.pids)
    for handle in group.workers:                   # Ray knows every actor is dead
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(handle.where.remote(), timeout=10)


def test_actor_exception_is_reported_with_its_text():
    config = ray_config()
    group = start_actors(config, functools.partial(crashing_env, crash_seed=config.seed + 2,
                                                   after=50, how="raise"))
    with pytest.raises(ActorDiedError, match="RuntimeError: env exploded") as excinfo:
        learner_loop(config, make_learner(config, "CartPole-v1"), group)
    assert excinfo.value.agent_id == 1
    assert 'in step\n    raise RuntimeError("env exploded")' in excinfo.value.actor_traceback
    assert gone(group.pids)


def test_silent_actor_is_reported_and_killed():
    """An env hung inside env.step (a thread cannot be stopped there): reported after
    env_step_timeout, and its process is killed with the others."""
    from test_actor_learner_liveness_helpers import hanging_env
    config = ray_config(env_step_timeout=2.0)
    group = start_actors(config, functools.partial(hanging_env, after=40))
    t0 = time.monotonic()
    with pytest.raises(StarvationError, match="env_step_timeout"):
        learner_loop(config, make_learner(config, "CartPole-v1"), group)
    assert time.monotonic() - t0 < 2.0 + BOUND_SECONDS + 2.0   # the wait, detection, shutdown
    assert gone(group.pids)


def test_learner_exception_stops_every_actor():
    config = ray_config(num_actors=3, total_timesteps=10 ** 7)
    group = start_actors(config, "CartPole-v1")

    def callback(info):
        if info.update == 2:
            raise KeyError("learner bug")

    t0 = time.monotonic()
    with pytest.raises(KeyError, match="learner bug"):
        learner_loop(config, make_learner(config, "CartPole-v1"), group, callback=callback)
    assert gone(group.pids)
    assert time.monotonic() - t0 < 30.0


def _poll_sockets(proc, seen: list) -> int:
    """Collect the sockets of ``proc``'s tree every 0.2 s until it exits; its exit code."""
    while proc.poll() is None:
        seen.extend(tree_sockets(proc.pid))
        time.sleep(0.2)
    return proc.returncode


def test_cli_trains_with_ray_actors_on_loopback_only(tmp_path):
    """``ppo-ref train --async --actors ray`` starts its own Ray (not the module's): every
    socket of its process tree, sampled during the run, is on loopback."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppo_ref", "train", "--async", "--actors", "ray",
         "--num-actors", "2", "--total-timesteps", "3000", "--run-dir", str(run_dir), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list = []
    code = _poll_sockets(proc, seen)
    out = proc.stdout.read()
    assert code == 0, out
    assert "2 ray actors" in out and (run_dir / "checkpoint.npz").exists()
    assert {"gcs_server", "raylet"} <= {s[0] for s in seen}, sorted({s[0] for s in seen})
    assert off_loopback(seen) == [], sorted(set(off_loopback(seen)))


def test_cli_joins_a_ray_cluster_at_an_address(tmp_path):
    """``--ray-address`` joins a running Ray: the module's, a cluster of this machine on
    loopback (joining nodes of other machines cannot run here; Ray's start-up is paid once).
    The run's actors are the cluster's, its driver disconnects at the end and the cluster keeps
    running; every socket of the cluster's and the run's process trees is on loopback."""
    address = ray.get_runtime_context().gcs_address
    assert address.startswith("127.0.0.1:")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppo_ref", "train", "--async", "--actors", "ray",
         "--ray-address", address, "--num-actors", "2",
         "--total-timesteps", "2000", "--run-dir", str(run_dir), "--quiet"],
        env=dict(os.environ, RAY_AUTH_MODE="token"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    seen: list = []
    code = _poll_sockets(proc, seen)
    out = proc.stdout.read()
    assert code == 0, out
    assert (run_dir / "checkpoint.npz").exists()
    # the run joined: its own process tree started no Ray of its own
    assert not {"gcs_server", "raylet"} & {s[0] for s in seen}, sorted({s[0] for s in seen})
    # the cluster outlives the run: its node is alive and it still runs work
    assert [node["Alive"] for node in ray.nodes()] == [True]
    assert ray.get(ray.remote(lambda: 7).remote(), timeout=60) == 7
    seen.extend(tree_sockets(os.getpid()))
    assert {"gcs_server", "raylet"} <= {s[0] for s in seen}
    assert off_loopback(seen) == [], sorted(set(off_loopback(seen)))
