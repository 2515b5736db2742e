"""Actor failures surface fast at any actor count; a hung env is reported; nothing outlives the
learner. Process actors (spawn): each test starts fresh actor processes, so they are few."""
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ppo_ref.distributed import (ActorDiedError, AsyncActorLearnerConfig, StarvationError,
                                   learner_loop, make_learner)
from ppo_ref.config import PPOConfig

# The bound the learner promises (ACTOR_DEATH_SECONDS) plus slack for a loaded CI machine:
# the measured time includes the scheduling of the learner among num_actors busy processes.
BOUND_SECONDS = 2.0 + 0.5


def _config(num_actors, **changes):
    base = dict(num_actors=num_actors, n_steps=16, total_timesteps=10 ** 7, actors="process",
                ppo=PPOConfig(n_epochs=1, batch_size=16 * num_actors), starvation_timeout=60.0)
    base.update(changes)
    return AsyncActorLearnerConfig(**base)


@pytest.mark.parametrize("num_actors", [2, 16])
def test_kill_9_of_one_actor_is_reported_within_two_seconds(num_actors):
    config = _config(num_actors)
    trainer = make_learner(config, "CartPole-v1")
    killed = {}

    def callback(info):
        if info.update == 3 and not killed:
            victim = multiprocessing.active_children()[0]
            killed["t"] = time.monotonic()
            os.kill(victim.pid, signal.SIGKILL)

    with pytest.raises(ActorDiedError) as excinfo:
        learner_loop(config, trainer, "CartPole-v1", callback=callback)
    elapsed = time.monotonic() - killed["t"]
    assert "exited" in str(excinfo.value) or "killed" in str(excinfo.value)
    assert elapsed < BOUND_SECONDS, elapsed
    assert multiprocessing.active_children() == []


def test_hung_env_is_reported_within_the_configured_time():
    from test_actor_learner_liveness_helpers import hanging_env  # noqa: F401  (picklable)
    import functools
    import test_actor_learner_liveness_helpers as helpers
    config = _config(2, env_step_timeout=3.0)
    trainer = make_learner(config, "CartPole-v1")
    env = functools.partial(helpers.hanging_env, after=40)
    t0 = time.monotonic()
    with pytest.raises(StarvationError, match="env_step_timeout") as excinfo:
        learner_loop(config, trainer, env)
    assert time.monotonic() - t0 < 3.0 + 15.0  # startup (spawn, imports) + the configured 3 s
    assert "inside env.step" in str(excinfo.value)
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_actor_hung_in_env_step_does_not_outlive_a_killed_learner(tmp_path, start_method):
    # (the actors run 40 steps, write their pids and hang: with forkserver their OS parent is
    # the fork server, not the learner, and they must still run, then end with the learner)
    pids = tmp_path / "pids"
    script = textwrap.dedent(f"""
        import functools, os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import test_actor_learner_liveness_helpers as helpers
        from ppo_ref.distributed import (AsyncActorLearnerConfig, learner_loop, make_learner,
                                         start_actors)
        from ppo_ref.config import PPOConfig
        if __name__ == "__main__":
            config = AsyncActorLearnerConfig(num_actors=2, n_steps=16, total_timesteps=10**6,
                actors="process", ppo=PPOConfig(n_epochs=1, batch_size=32))
            trainer = make_learner(config, "CartPole-v1")
            env = functools.partial(helpers.hanging_env, after=40, pid_file={str(pids)!r})
            group = start_actors(config, env, start_method={start_method!r})
            learner_loop(config, trainer, group)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=os.getcwd())
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if pids.exists() and len(pids.read_text().split()) >= 2:
                break
            time.sleep(0.2)
        actor_pids = [int(p) for p in pids.read_text().split()]
        time.sleep(0.5)  # the actors are inside the hanging step now
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        alive = _survivors(actor_pids, 5.0)
        assert alive == [], f"actor processes {alive} outlived the killed learner"
    finally:
        if proc.poll() is None:
            proc.kill()


def _survivors(pids, seconds):
    """The processes of ``pids`` still alive after waiting up to ``seconds`` for them to end."""
    deadline = time.monotonic() + seconds
    alive = [p for p in pids if _alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if _alive(p)]
    return alive


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (reaped by init later) counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False
