"""Throughput of the advantage kernels at T = 2048, N = 64 (one PPO rollout of 64 envs).

Prints, in one run, million elements (T * N) per second for:

* ``gae`` and ``vtrace`` (the public, validating functions ``ppo_ref.gae``/``ppo_ref.vtrace``,
  and their bare loops: the spec's recursions ``ppo_ref.spec.advantages.gae_recursion`` /
  ``vtrace_recursion`` compiled here as the compiled tier compiles them, on inputs the spec's
  ``prepare_trajectory`` already checked), in float64 and float32;
* a NumPy copy of the same input bytes (``np.copyto`` of every input array): the
  memory-bandwidth reference, the speed of merely reading the inputs once;
* Stable-Baselines3's ``RolloutBuffer.compute_returns_and_advantage`` on the same data (when
  stable-baselines3 is importable), with the truncation bootstrap folded into the reward as SB3
  does, and checked to give the same advantages.

Targets (issue 2): ``gae`` >= 10x SB3 and >= 30% of the copy throughput.

Run:  python validation/bench_kernels.py [--repeats 50]
"""
from __future__ import annotations

import argparse
import time

import numba
import numpy as np

import ppo_ref.fast.advantages  # noqa: F401  (registers the scalar helpers the loops call)
from ppo_ref import gae, vtrace
from ppo_ref.spec import advantages as spec

# the spec's loops compiled as ppo_ref.fast.advantages compiles them (nogil, no fastmath)
gae_recursion = numba.njit(nogil=True)(spec.gae_recursion)
vtrace_recursion = numba.njit(nogil=True)(spec.vtrace_recursion)

T, N = 2048, 64
GAMMA, LAMBDA = 0.99, 0.95


def make_data(dtype, rng):
    shape = (T, N)
    terminated = rng.random(shape) < 0.01
    truncated = rng.random(shape) < 0.005
    behaviour = rng.normal(size=shape) - 1.0
    return dict(
        behaviour_log_probs=behaviour.astype(dtype),
        target_log_probs=(behaviour + 0.1 * rng.normal(size=shape)).astype(dtype),
        rewards=rng.normal(size=shape).astype(dtype),
        values=rng.normal(size=shape).astype(dtype),
        terminated=terminated, truncated=truncated,
        last_values=rng.normal(size=N).astype(dtype),
        final_values=np.where(truncated & ~terminated, rng.normal(size=shape), 0.0).astype(dtype))


GAE_KEYS = ["rewards", "values", "terminated", "truncated", "last_values", "final_values"]
VTRACE_KEYS = ["behaviour_log_probs", "target_log_probs"] + GAE_KEYS


def best_time(fn, repeats):
    """Best of ``repeats`` wall-clock runs (seconds), after one warm-up call."""
    fn()
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def copy_reference(data, keys):
    """A function copying every input array once into preallocated buffers, and its bytes."""
    src = [data[k] for k in keys]
    dst = [np.empty_like(a) for a in src]

    def run():
        for d, s in zip(dst, src):
            np.copyto(d, s)
    return run, sum(a.nbytes for a in src)


def bare_kernels(data):
    """The compiled loops called on already-validated inputs (no wrapper work)."""
    inp = spec.prepare_trajectory({k: data[k] for k in ["behaviour_log_probs",
                                                        "target_log_probs", "rewards",
                                                        "values"]},
                                  data["terminated"], data["truncated"], data["last_values"],
                                  data["final_values"], "bootstrap", False)
    s = inp.dtype.type
    a = inp.arrays
    out1, out2 = np.empty((T, N), inp.dtype), np.empty((T, N), inp.dtype)
    common = (inp.terminated, inp.truncated, inp.last_values, inp.final_values)
    gammas = np.full((T, N), s(GAMMA))
    gamma_lambdas = np.full((T, N), s(GAMMA * LAMBDA))
    lambdas, one_minus = np.full((T, N), s(LAMBDA)), np.full((T, N), s(1.0 - LAMBDA))

    def run_gae():
        gae_recursion(a["rewards"], a["values"], *common, gammas, gamma_lambdas,
                      inp.truncation_mode, False, out1, out2)

    def run_vtrace():  # includes the vectorised exp for the ratios, as in the wrapper
        ratios = np.exp(a["target_log_probs"] - a["behaviour_log_probs"])
        vtrace_recursion(ratios, a["rewards"], a["values"], *common, gammas, s(1.0), s(1.0),
                         s(1.0), lambdas, one_minus, inp.truncation_mode, False, out1, out2)
    return run_gae, run_vtrace


def sb3_runner(data):
    """SB3's GAE loop on the same data, or None when stable-baselines3 is not installed."""
    try:
        import torch
        from gymnasium import spaces
        from stable_baselines3.common.buffers import RolloutBuffer
    except ImportError:
        return None, None
    space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    buf = RolloutBuffer(T, space, space, device="cpu", gae_lambda=LAMBDA, gamma=GAMMA, n_envs=N)
    term, trunc = data["terminated"], data["truncated"]
    done = term | trunc
    # SB3 folds the truncation bootstrap into the reward and then treats the step as done.
    buf.rewards[:] = data["rewards"] + GAMMA * np.where(trunc & ~term, data["final_values"], 0.0)
    buf.values[:] = data["values"]
    buf.episode_starts[0] = 0.0
    buf.episode_starts[1:] = done[:-1]
    last_values = torch.as_tensor(data["last_values"], dtype=torch.float32)
    dones = done[-1].astype(np.float32)

    def run():
        buf.compute_returns_and_advantage(last_values, dones)
    return run, buf


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    elements = T * N
    rows = []  # (name, dtype, seconds)
    copy_times = {}
    for dtype in (np.float64, np.float32):
        data = make_data(dtype, rng)
        name = np.dtype(dtype).name
        for label, keys in (("gae", GAE_KEYS), ("vtrace", VTRACE_KEYS)):
            run, nbytes = copy_reference(data, keys)
            secs = best_time(run, args.repeats)
            copy_times[(label, name)] = secs
            rows.append((f"np.copyto of {label} inputs ({nbytes / 1e6:.1f} MB)", name, secs))
        rows.append(("gae (public wrapper)", name,
                     best_time(lambda: gae(*[data[k] for k in GAE_KEYS], gamma=GAMMA,
                                           gae_lambda=LAMBDA), args.repeats)))
        run_gae, run_vtrace = bare_kernels(data)
        rows.append(("gae (bare loop)", name, best_time(run_gae, args.repeats)))
        rows.append(("vtrace (public wrapper)", name,
                     best_time(lambda: vtrace(*[data[k] for k in VTRACE_KEYS], gamma=GAMMA,
                                              lambda_=LAMBDA), args.repeats)))
        rows.append(("vtrace (bare loop)", name, best_time(run_vtrace, args.repeats)))
        if dtype == np.float32:
            sb3, buf = sb3_runner(data)
            if sb3 is not None:
                rows.append(("SB3 compute_returns_and_advantage", "float32",
                             best_time(sb3, max(3, args.repeats // 10))))
                ours, _ = gae(*[data[k] for k in GAE_KEYS], gamma=GAMMA, gae_lambda=LAMBDA)
                np.testing.assert_allclose(ours, buf.advantages, rtol=1e-4, atol=1e-4)

    sb3_secs = next((s for n, d, s in rows if n.startswith("SB3")), None)
    print(f"T = {T}, N = {N}: {elements} elements; best of {args.repeats} runs")
    header = (f"{'what':44s} {'dtype':8s} {'time [ms]':>10s} {'Melem/s':>9s} {'vs SB3':>8s} "
              f"{'vs copy':>8s}")
    print(header)
    print("-" * len(header))
    for what, dtype_name, secs in rows:
        label = "vtrace" if what.startswith("vtrace") or "vtrace inputs" in what else "gae"
        vs_sb3 = f"{sb3_secs / secs:7.1f}x" if sb3_secs and not what.startswith("SB3") else ""
        vs_copy = ""
        if not what.startswith(("np.copyto", "SB3")):
            vs_copy = f"{100 * copy_times[(label, dtype_name)] / secs:7.0f}%"
        print(f"{what:44s} {dtype_name:8s} {1e3 * secs:10.3f} {elements / secs / 1e6:9.1f} "
              f"{vs_sb3:>8s} {vs_copy:>8s}")
    print("vs SB3: speed-up over SB3's loop; vs copy: throughput as a percentage of copying the "
          "same inputs once (target: gae >= 10x SB3 and >= 30% of copy).")


if __name__ == "__main__":
    main()
