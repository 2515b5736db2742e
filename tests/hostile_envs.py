"""A hostile CartPole for the robustness tests (no tests in this file), steered by an
environment variable, so that async vector-env workers and actor processes (which inherit the
environment) behave as the main process does. Registered as ``hostile_envs:Hostile-v0``.

PPO_REF_HOSTILE = "<what>@<step>": at the <step>-th call of step() of every copy, do <what>:
  reward:<value>   return the reward as the Python literal <value> (e.g. reward:'1.0')
  terminated:<v>   return terminated = <v>
  truncated:<v>    return truncated = <v>
  raise            raise RuntimeError
  exit             raise SystemExit(5)
  base             raise a BaseException subclass
  die              os._exit(7) (a dead worker)
  hang             sleep for an hour
  hang_close       the env's close() sleeps for an hour (step is normal)
"""
import ast
import os
import time

import gymnasium as gym


class HostileBase(BaseException):
    """Not an Exception: what a careless env might raise."""


class Hostile(gym.Wrapper):
    def __init__(self, **kwargs):
        super().__init__(gym.make("CartPole-v1", disable_env_checker=True))
        self.calls = 0
        spec = os.environ.get("PPO_REF_HOSTILE", "")
        what, _, at = spec.partition("@")
        self.what = what
        self.at = int(at) if at else 1

    def step(self, action):
        out = list(self.env.step(action))
        self.calls += 1
        if self.calls != self.at or not self.what:
            return tuple(out)
        kind, _, value = self.what.partition(":")
        if kind in ("reward", "terminated", "truncated"):
            out[("", "reward", "terminated", "truncated").index(kind)] = ast.literal_eval(value)
        elif kind == "raise":
            raise RuntimeError("the env failed on purpose")
        elif kind == "exit":
            raise SystemExit(5)
        elif kind == "base":
            raise HostileBase("a BaseException from the env")
        elif kind == "die":
            os._exit(7)
        elif kind == "hang":
            time.sleep(3600)
        return tuple(out)

    def close(self):
        if self.what == "hang_close":
            time.sleep(3600)
        super().close()


gym.register(id="Hostile-v0", entry_point=Hostile, max_episode_steps=500)
