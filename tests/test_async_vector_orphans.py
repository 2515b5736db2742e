"""Killing a trainer that uses --vectorization async (gymnasium AsyncVectorEnv) leaves no worker."""
import os
import signal
import subprocess
import sys
import textwrap
import time

from test_actor_learner_liveness import _alive, _survivors


def _children(pid):
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                out += [int(p) for p in fh.read().split()]
        except OSError:
            pass
    return out


def test_killed_trainer_takes_its_async_env_workers_with_it():
    # the sub-envs block inside env.step (as a hung env would) when the trainer is killed
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import gymnasium as gym
        from ppo_ref.config import PPOConfig
        from ppo_ref.train.ppo import PPOTrainer
        gym.register("ppo_ref_test/Hanging-v0",
                     entry_point="test_actor_learner_liveness_helpers:hanging_env")
        if __name__ == "__main__":
            t = PPOTrainer("ppo_ref_test/Hanging-v0", PPOConfig(n_envs=2, n_steps=64,
                           batch_size=128), seed=0, vectorization="async")
            print("ready", flush=True)
            t.learn(10 ** 8)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        workers = [p for p in _children(proc.pid) if _alive(p)]
        assert len(workers) >= 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        alive = _survivors(workers, 5.0)
        assert alive == [], f"async env workers {alive} outlived the killed trainer"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_close_quickly_kills_async_env_workers_whose_close_hangs():
    # each sub-env's close() blocks in its worker: close_quickly must kill the workers and return
    from ppo_ref.cli.common import close_quickly
    from ppo_ref.config import PPOConfig
    from ppo_ref.train.ppo import PPOTrainer
    trainer = PPOTrainer("test_actor_learner_liveness_helpers:ppo_ref_test/HangingClose-v0",
                         PPOConfig(n_envs=2, n_steps=16, batch_size=32), seed=0,
                         vectorization="async")
    # the vector env's own workers (pytest's other children, e.g. early commands, are not)
    workers = [p.pid for p in trainer.collector.base_env.processes if _alive(p.pid)]
    try:
        assert len(workers) >= 2
        start = time.monotonic()
        close_quickly(trainer, 0.5)
        assert time.monotonic() - start < 5.0
        alive = _survivors(workers, 5.0)
        assert alive == [], f"async env workers {alive} outlived close_quickly"
    finally:
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
