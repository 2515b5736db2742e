"""Picklable env factories for tests/test_actor_learner_liveness.py (no tests in this file)."""
import multiprocessing
import os
import time

import gymnasium as gym


class HangingEnv(gym.Wrapper):
    """CartPole whose step number ``after`` blocks (sleeps for an hour)."""

    def __init__(self, after, pid_file=None):
        super().__init__(gym.make("CartPole-v1", disable_env_checker=True))
        self.after, self.steps = after, 0
        if pid_file and multiprocessing.parent_process() is not None:  # actors only
            with open(pid_file, "a") as fh:
                fh.write(f"{os.getpid()}\n")

    def step(self, action):
        self.steps += 1
        if self.steps == self.after:
            time.sleep(3600)
        return self.env.step(action)


def hanging_env(after=40, pid_file=None):
    return HangingEnv(after, pid_file)


class HangingCloseEnv(gym.Wrapper):
    """CartPole whose ``close`` blocks (sleeps for an hour) in a worker process only (the
    main process's probe copy closes normally)."""

    def __init__(self):
        super().__init__(gym.make("CartPole-v1", disable_env_checker=True))

    def close(self):
        if multiprocessing.parent_process() is not None:
            time.sleep(3600)
        super().close()


gym.register("ppo_ref_test/HangingClose-v0", entry_point=HangingCloseEnv, max_episode_steps=500)
