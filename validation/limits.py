"""Where ppo_ref's training time goes, next to the limit this machine allows.

For the zoo CartPole-v1 settings (8 envs x 32 steps, one minibatch of 256, 20 epochs, networks
[64, 64] for the policy and for the value; ``PPOConfig.zoo_cartpole``) this prints, for one core:

1. **The work.** Floating-point operations of one update, counted from the parameter shapes: a
   dense layer with an ``[n_in, n_out]`` weight costs ``2 n_in n_out`` per row forward and twice
   that backward (the input's gradient and the weight's), so each row of a minibatch costs
   ``6 sum_W |W|`` per epoch and each acting step ``2 sum_W |W|`` (biases, activations and the
   losses are left out: they are O(width), not O(width^2)).
2. **The machine's rate.** The best single-thread matrix product rate NumPy's BLAS reaches here
   (``n = 1024``, the core's practical peak), and the rate it reaches on the update's own shapes
   (``[256, 64] @ [64, 64]``).
3. **The env.** Seconds per env step of gymnasium's ``SyncVectorEnv`` and, when installed,
   envpool's (one thread), stepped with random actions.
4. **ppo_ref.** Seconds of rollout collection and of updates per run (``--timesteps``), and the
   update split by the tier functions it calls (exclusive time of each public function of
   ``tier.networks``, ``tier.distributions``, ``tier.losses``, ``tier.optim`` and
   ``tier.advantages``) and the rest (the spec's loss assembly, minibatching and bookkeeping).

The limit is the work at the practical peak plus envpool's stepping (gymnasium's when envpool is
absent); the distance to it is measured time / limit.

Usage::

    python validation/limits.py [--timesteps 100000] [--dtype float64] [--vectorization sync]
"""
from __future__ import annotations

import argparse
import functools
import time
from collections import defaultdict

import numpy as np

from budgets import cpu_model

MODULES = ("networks", "distributions", "losses", "optim", "advantages")


def matmul_rate(n: int, m: int, k: int, dtype, seconds: float = 0.5) -> float:
    """Best FLOP/s of ``[n, k] @ [k, m]`` in ``dtype`` over repeated products (one thread)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, k)).astype(dtype)
    b = rng.standard_normal((k, m)).astype(dtype)
    out = np.empty((n, m), dtype=dtype)
    reps = max(1, int(2e8 / (2 * n * m * k)))
    best = 0.0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        for _ in range(reps):
            np.matmul(a, b, out=out)
        best = max(best, 2.0 * n * m * k * reps / (time.perf_counter() - start))
    return best


def env_step_seconds(vectorization: str, steps: int = 3000) -> float:
    """Median seconds per env step (one vector step / n_envs) of 8 CartPole-v1 envs."""
    from ppo_ref.train.rollout import make_vector_env
    env = make_vector_env("CartPole-v1", 8, vectorization=vectorization)
    env.reset(seed=0)
    actions = np.random.default_rng(0).integers(0, 2, size=(steps, 8))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for a in actions:
            env.step(a)
        times.append((time.perf_counter() - start) / (steps * 8))
    env.close()
    return float(np.median(times))


class PartTimer:
    """Exclusive wall time of each public function of the tier's modules while installed."""

    def __init__(self, tier):
        self.tier, self.totals, self.stack, self.saved = tier, defaultdict(float), [], []

    def _wrap(self, name, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self.stack.append(0.0)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                children = self.stack.pop()
                self.totals[name] += spent - children
                if self.stack:
                    self.stack[-1] += spent
        return timed

    def __enter__(self):
        for module_name in MODULES:
            module = getattr(self.tier, module_name)
            for fn_name in getattr(module, "__all__", []):
                fn = getattr(module, fn_name)
                if callable(fn) and not isinstance(fn, type):
                    self.saved.append((module, fn_name, fn))
                    setattr(module, fn_name, self._wrap(f"{module_name}.{fn_name}", fn))
        return self

    def __exit__(self, *exc):
        for module, fn_name, fn in self.saved:
            setattr(module, fn_name, fn)


def measure_ppo_ref(timesteps: int, dtype: str, vectorization: str):
    """(collection seconds, update seconds, {part: seconds}, updates, the trainer) of one run
    (the first update, which compiles, left out)."""
    from ppo_ref import PPOConfig, PPOTrainer
    trainer = PPOTrainer("CartPole-v1", PPOConfig.zoo_cartpole(compute_dtype=dtype), seed=0,
                         vectorization=vectorization)
    trainer.total_timesteps = timesteps
    trainer.update(trainer.collect_rollout())  # compile (or load) every kernel first
    collect = update = 0.0
    updates = 0
    with PartTimer(trainer.tier) as parts:
        while trainer.num_timesteps < timesteps:
            start = time.perf_counter()
            rollout = trainer.collect_rollout()
            middle = time.perf_counter()
            trainer.progress_remaining = max(0.0, 1.0 - trainer.num_timesteps / timesteps)
            trainer.update(rollout)
            collect += middle - start
            update += time.perf_counter() - middle
            updates += 1
    return collect, update, dict(parts.totals), updates, trainer


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timesteps", type=int, default=100_000)
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    parser.add_argument("--vectorization", default="sync", choices=["sync", "envpool"])
    args = parser.parse_args(argv)
    from threadpoolctl import threadpool_limits
    threadpool_limits(1)
    dtype = np.dtype(args.dtype)
    print(f"CPU: {cpu_model()}; one thread; {args.dtype}; CartPole-v1 zoo settings; "
          f"{args.timesteps} steps; vectorization {args.vectorization}")

    collect, update, parts, updates, trainer = measure_ppo_ref(args.timesteps, args.dtype,
                                                     args.vectorization)
    c = trainer.config
    weights = sum(v.size for v in trainer.params.values() if v.ndim == 2)
    rows = c.n_envs * c.n_steps
    steps = updates * rows
    flops_update = 6.0 * weights * rows * c.n_epochs
    flops_acting = 2.0 * weights * rows
    flops = (flops_update + flops_acting) * updates
    print(f"\nwork: {weights} weights; {flops_update / 1e6:.1f} MFLOP per update "
          f"({c.n_epochs} epochs x {rows} rows), {flops_acting / 1e6:.2f} MFLOP acting per "
          f"rollout; {flops / 1e9:.1f} GFLOP for {steps} steps")

    peak = matmul_rate(1024, 1024, 1024, dtype)
    shaped = matmul_rate(256, 64, 64, dtype)
    print(f"rate: {peak / 1e9:.1f} GFLOP/s practical peak (BLAS n=1024), "
          f"{shaped / 1e9:.1f} GFLOP/s on [256, 64] @ [64, 64]")

    env_costs = {"sync": env_step_seconds("sync")}
    try:
        env_costs["envpool"] = env_step_seconds("envpool")
    except ValueError:
        pass
    for name, cost in env_costs.items():
        print(f"env: {name} {cost * 1e6:.2f} us per env step = {cost * steps:.2f} s per "
              f"{steps} steps")

    total = collect + update
    print(f"\nppo_ref: {total:.2f} s for {steps} steps ({steps / total:,.0f} steps/s): "
          f"collection {collect:.2f} s, updates {update:.2f} s")
    for name, seconds in sorted(parts.items(), key=lambda kv: -kv[1]):
        if seconds >= 0.005 * total:
            print(f"  {name:<44} {seconds:7.2f} s")
    inside = sum(parts.values())
    print(f"  {'the rest (spec glue, rollout, bookkeeping)':<44} {total - inside:7.2f} s")

    env_floor = min(env_costs.values()) * steps
    limit = flops / peak + env_floor
    print(f"\nlimit: {flops / peak:.2f} s of arithmetic at the practical peak + "
          f"{env_floor:.2f} s of env stepping = {limit:.2f} s ({steps / limit:,.0f} steps/s); "
          f"ppo_ref is {total / limit:.1f}x the limit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
