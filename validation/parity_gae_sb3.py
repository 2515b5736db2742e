"""GAE parity: ppo_ref.gae ("bootstrap" truncation mode) vs Stable-Baselines3's
``RolloutBuffer.compute_returns_and_advantage`` on random rollouts with terminations and
truncations.

Mapping (SB3 2.x ``on_policy_algorithm.collect_rollouts`` and ``buffers.RolloutBuffer``):

* SB3 folds a truncation into the reward before storing it:
  ``rewards[t] += gamma * V(terminal_observation)`` when ``infos["TimeLimit.truncated"]``
  (set by SB3's VecEnv only when truncated and *not* terminated). Here:
  ``sb3_rewards = rewards + gamma * final_values * (truncated & ~terminated)``.
* SB3's ``episode_starts[t]`` is the flag stored with observation t: "obs[t] starts an episode",
  i.e. ``done[t-1]`` -- exactly ppo_ref's ``episode_starts`` (built here with
  ``ppo_ref.episode_starts``). SB3 reads ``1 - episode_starts[t+1]`` as "step t did not end the
  episode" for t < T-1 and the separate ``dones`` argument (= ``done[T-1]``) for the last step.
* After folding, SB3 cuts bootstrap and trace at every done; ppo_ref bootstraps
  ``final_values`` and cuts the trace: the same numbers.

Two SB3 paths are compared: the buffer's real ``add()`` API (float32 storage, SB3's default:
float32 tolerance) and the same buffer with its arrays replaced by float64 ones (tight).
A third row shows the documented difference of ppo_ref's ``"terminate"`` mode (CleanRL).

Run: ``python validation/parity_gae_sb3.py`` (needs torch and stable_baselines3).
"""
from __future__ import annotations

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer

from parity_common import Row, expect_difference, print_table

import ppo_ref


def random_rollout(rng, T, N):
    terminated = rng.random((T, N)) < 0.1
    truncated = rng.random((T, N)) < 0.1
    return dict(rewards=rng.normal(size=(T, N)), values=rng.normal(size=(T, N)),
                terminated=terminated, truncated=truncated, last_values=rng.normal(size=N),
                final_values=np.where(truncated, rng.normal(size=(T, N)), 0.0),
                initial=rng.random(N) < 0.5)


def sb3_inputs(x, gamma):
    """SB3's view of a rollout: folded rewards, episode_starts, last-step dones."""
    fold = x["truncated"] & ~x["terminated"]
    rewards = x["rewards"] + gamma * x["final_values"] * fold
    starts = ppo_ref.episode_starts(x["terminated"], x["truncated"], x["initial"])
    dones = x["terminated"][-1] | x["truncated"][-1]
    return rewards, starts, dones


def sb3_gae(x, gamma, gae_lambda, *, float64: bool):
    """Advantages and returns from SB3's RolloutBuffer (``add()`` path or float64 arrays)."""
    T, N = x["rewards"].shape
    buf = RolloutBuffer(T, spaces.Box(-1.0, 1.0, (1,)), spaces.Discrete(2), device="cpu",
                        gamma=gamma, gae_lambda=gae_lambda, n_envs=N)
    rewards, starts, dones = sb3_inputs(x, gamma)
    if float64:
        buf.rewards = rewards.copy()
        buf.values = x["values"].copy()
        buf.episode_starts = starts.astype(np.float64)
        buf.advantages = np.zeros((T, N))
        last = th.as_tensor(x["last_values"], dtype=th.float64)
    else:
        for t in range(T):
            buf.add(np.zeros((N, 1), np.float32), np.zeros((N, 1)), rewards[t], starts[t],
                    th.as_tensor(x["values"][t], dtype=th.float32), th.zeros(N))
        last = th.as_tensor(x["last_values"], dtype=th.float32)
    buf.compute_returns_and_advantage(last_values=last, dones=dones)
    return np.asarray(buf.advantages, np.float64), np.asarray(buf.returns, np.float64)


def run(n_cases: int = 50, seed: int = 0) -> list[Row]:
    rng = np.random.default_rng(seed)
    worst = {"add() float32": [0.0, 0.0], "float64 arrays": [0.0, 0.0]}
    diff_terminate = 0.0
    n_truncations = 0
    for _ in range(n_cases):
        T, N = int(rng.integers(1, 20)), int(rng.integers(1, 5))
        x = random_rollout(rng, T, N)
        gamma = float(rng.choice([0.0, 0.9, 0.99, 1.0]))
        gae_lambda = float(rng.choice([0.0, 0.8, 0.95, 1.0]))
        args = {k: x[k] for k in ("rewards", "values", "terminated", "truncated", "last_values",
                                  "final_values")}
        adv, ret = ppo_ref.gae(**args, gamma=gamma, gae_lambda=gae_lambda,
                               truncation="bootstrap")
        for label, f64 in (("add() float32", False), ("float64 arrays", True)):
            a_sb3, r_sb3 = sb3_gae(x, gamma, gae_lambda, float64=f64)
            scale = 1.0 + np.abs(a_sb3)   # float32 path: relative-ish error
            worst[label][0] = max(worst[label][0], float(np.max(np.abs(adv - a_sb3) / scale)))
            worst[label][1] = max(worst[label][1],
                                  float(np.max(np.abs(ret - r_sb3) / (1.0 + np.abs(r_sb3)))))
            if label == "float64 arrays":
                a64 = a_sb3
        n_truncations += int((x["truncated"] & ~x["terminated"]).sum())
        if gamma > 0 and (x["truncated"] & ~x["terminated"]).any():
            adv_t, _ = ppo_ref.gae(**args, gamma=gamma, gae_lambda=gae_lambda,
                                   truncation="terminate")
            diff_terminate = max(diff_terminate, float(np.max(np.abs(adv_t - a64))))
    rows = []
    for label, tol in (("add() float32", 1e-5), ("float64 arrays", 1e-12)):
        for q, err in zip(("advantages", "returns"), worst[label]):
            rows.append(Row(f"SB3 RolloutBuffer, {label}", q, err, tol, err <= tol,
                            f"{n_cases} rollouts, {n_truncations} truncations; err/(1+|x|)"))
    rows.append(expect_difference(
        "ppo_ref truncation='terminate' vs SB3", "advantages", [diff_terminate], [0.0], 1e-3,
        "CleanRL mode drops the V(final_obs) bootstrap that SB3 folds into the reward"))
    return rows


def main() -> list[Row]:
    rows = run()
    print_table("GAE: ppo_ref (bootstrap) vs SB3 RolloutBuffer", rows)
    return rows


if __name__ == "__main__":
    main()
