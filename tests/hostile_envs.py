"""A hostile CartPole for the robustness tests (no tests in this file), steered by an
environment variable, so that async vector-env workers and actor processes (which inherit the
environment) behave as the main process does. Registered as ``hostile_envs:Hostile-v0``.

PPO_REF_HOSTILE = "<what>@<step>": at the <step>-th call of step() of every copy, do <what>:
  reward:<value>   return the reward as the Python literal <value> (e.g. reward:'1.0'), or
                   as JUNK["reward"][i] for <value> = #i
  terminated:<v>   return terminated = <v> (likewise)
  truncated:<v>    return truncated = <v> (likewise)
  obs:#i           return the observation JUNK["obs"][i]
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
import numpy as np

#: Values an env might return, good and bad, per output (validation/fault_campaign.py draws
#: from them; whether each is refused is the trainer's rule, ppo_ref._checks.env_value_problem).
JUNK = {
    "reward": ["1.0", 1 + 2j, None, [1.0], float("nan"), float("inf"), 1e308, np.float32(2.0),
               True, np.array([1.0, 2.0]), b"1", np.int64(3), np.array(1.5), -0.0],
    "terminated": ["yes", "no", "", 0.5, None, 2, -1, np.bool_(True), 1, 0, np.array([True]),
                   np.int64(1), [], 1.0],
    "truncated": ["yes", "no", 0.0, None, 2, np.bool_(False), 1, 0, np.array([False]),
                  np.uint8(1), (), "1"],
    "obs": [np.array([np.nan, 0, 0, 0]), np.full(4, 1e300), np.full(4, 0.5 + 1j),
            np.array(["0.1"] * 4), np.zeros(3), np.zeros((2, 2)), [0.1, 0.2, 0.3, 0.4],
            np.array([0.1, None, 0, 0], dtype=object), np.zeros(4, dtype=np.float32),
            np.zeros(4, dtype=np.int64), np.zeros(4, dtype=bool), np.full(4, -np.inf),
            "0.1 0.2 0.3 0.4", None],
}


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
        if kind in ("obs", "reward", "terminated", "truncated"):
            value = JUNK[kind][int(value[1:])] if value.startswith("#") else ast.literal_eval(value)
            out[("obs", "reward", "terminated", "truncated").index(kind)] = value
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
