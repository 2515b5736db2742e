"""Benchmark: forward + backward of ppo_ref's networks beside the same computation in PyTorch.

Run:  python validation/bench_nn.py [--repeats 100] [--quick]

Cases (one PPO minibatch each):

* ``mlp policy``: the MLP actor-critic at batch 256, obs_dim 4, 2 actions, separate [64, 64]
  tanh towers; forward (logits, values), categorical log-prob and entropy of the logits, then
  backward of ``sum(w_lp * log_prob) + sum(w_h * entropy) + sum(w_v * values)`` to every
  parameter (fixed random upstream weights ``w``: the PPO loss itself belongs to
  ``ppo_ref.spec.losses`` and is not timed). ppo_ref: the readable tier's
  ``ppo_ref.spec.networks`` and ``ppo_ref.spec.distributions`` (NumPy, whose products are
  BLAS's).
  torch: ``nn.Sequential`` towers + ``torch.distributions.Categorical`` + autograd.
* ``lstm``: H = 64, T = 32, N = 8, D = 4, with episode starts inside the sequence; forward over
  the sequence and backward from ``sum(w * h_seq)`` to the input, every parameter and the
  initial state (ppo_ref: the compiled tier's ``ppo_ref.fast.lstm``). torch, two ways: ``nn.LSTM`` over the whole sequence (fused, but it cannot
  reset the state mid-sequence, so it computes less), and the step loop sb3-contrib's
  ``RecurrentPPO`` uses to apply resets (one ``nn.LSTM`` call per step on masked states).

Each timing is the median over ``--repeats`` rounds after warm-up (numba compilation, torch lazy
init); in a round every cell runs once (round-robin), so all cells see the same load on a
shared machine. The script runs twice in subprocesses: "1 thread" (``OPENBLAS_NUM_THREADS=1``
for NumPy, ``NUMBA_NUM_THREADS=1`` for ppo_ref's parallel loops, ``torch.set_num_threads(1)``)
and "default" (the libraries' default thread counts, with a fifth of the rounds: it is the slow
configuration).
torch is timed in float64 (the same arithmetic as ppo_ref) and float32 (what SB3 runs).
"""
from __future__ import annotations

import argparse
import os
import json
import statistics
import subprocess
import sys
import time

import numpy as np

from ppo_ref.spec.distributions import (
    categorical_entropy, categorical_entropy_backward, categorical_log_prob,
    categorical_log_prob_backward,
)
from ppo_ref.spec.networks import actor_critic_backward, actor_critic_forward, actor_critic_init

BATCH, OBS_DIM, N_ACTIONS, NET_ARCH = 256, 4, 2, (64, 64)
H, T, N, D = 64, 32, 8, 4


# --------------------------------------------------------------------------------------------
# ppo_ref

def ppo_ref_mlp_case(rng):
    params = actor_critic_init(rng, OBS_DIM, N_ACTIONS, net_arch=NET_ARCH)
    obs = rng.standard_normal((BATCH, OBS_DIM))
    actions = rng.integers(0, N_ACTIONS, BATCH)
    w_lp, w_h, w_v = (rng.standard_normal(BATCH) for _ in range(3))

    def step():
        logits, values, cache = actor_critic_forward(params, obs)
        categorical_log_prob(logits, actions)
        categorical_entropy(logits)
        d_logits = categorical_log_prob_backward(logits, actions, w_lp)
        d_logits += categorical_entropy_backward(logits, w_h)
        return actor_critic_backward(params, cache, d_logits, w_v)
    return step, (params, obs, actions, w_lp, w_h, w_v)


def ppo_ref_lstm_case(rng):
    from ppo_ref.fast.lstm import lstm_backward, lstm_forward
    from ppo_ref.spec.lstm import lstm_init

    params = lstm_init(rng, D, H)
    x = rng.standard_normal((T, N, D))
    h0, c0 = 0.1 * rng.standard_normal((N, H)), 0.1 * rng.standard_normal((N, H))
    starts = rng.random((T, N)) < 0.05
    w = rng.standard_normal((T, N, H))

    def step():
        h_seq, _, cache = lstm_forward(params, x, h0, c0, starts)
        return lstm_backward(params, cache, w)
    return step, (params, x, h0, c0, starts, w)


# --------------------------------------------------------------------------------------------
# torch

def torch_mlp_case(torch, data, dtype):
    params, obs, actions, w_lp, w_h, w_v = data
    nn = torch.nn

    def tower(prefix):
        layers = []
        for i in range(len(NET_ARCH) + 1):
            w = params[f"{prefix}w{i}"]
            lin = nn.Linear(w.shape[1], w.shape[0], dtype=dtype)
            with torch.no_grad():
                lin.weight.copy_(torch.as_tensor(w))
                lin.bias.copy_(torch.as_tensor(params[f"{prefix}b{i}"]))
            layers += [lin, nn.Tanh()]
        return nn.Sequential(*layers[:-1])
    pi, vf = tower("pi."), tower("vf.")
    module_params = list(pi.parameters()) + list(vf.parameters())
    t_obs = torch.as_tensor(obs, dtype=dtype)
    t_actions = torch.as_tensor(actions)
    t_w = [torch.as_tensor(a, dtype=dtype) for a in (w_lp, w_h, w_v)]

    def step():
        for p in module_params:
            p.grad = None
        dist = torch.distributions.Categorical(logits=pi(t_obs))
        values = vf(t_obs)[:, 0]
        loss = ((dist.log_prob(t_actions) * t_w[0]).sum() + (dist.entropy() * t_w[1]).sum()
                + (values * t_w[2]).sum())
        loss.backward()
    return step


def torch_lstm_cases(torch, data, dtype):
    params, x, h0, c0, starts, w = data
    lstm = torch.nn.LSTM(D, H, dtype=dtype)
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(torch.as_tensor(params["w_ih"]))
        lstm.weight_hh_l0.copy_(torch.as_tensor(params["w_hh"]))
        lstm.bias_ih_l0.copy_(torch.as_tensor(params["b"]))
        lstm.bias_hh_l0.zero_()
    t_x = torch.as_tensor(x, dtype=dtype)
    t_h0 = torch.as_tensor(h0, dtype=dtype).requires_grad_(True)
    t_c0 = torch.as_tensor(c0, dtype=dtype).requires_grad_(True)
    t_keep = torch.as_tensor(1.0 - starts, dtype=dtype)[:, :, None]
    t_w = torch.as_tensor(w, dtype=dtype)
    leaves = list(lstm.parameters()) + [t_h0, t_c0]
    t_x.requires_grad_(True)
    leaves.append(t_x)

    def fused():  # no resets: torch's one-call LSTM cannot reset mid-sequence
        for p in leaves:
            p.grad = None
        out, _ = lstm(t_x, (t_h0[None], t_c0[None]))
        (out * t_w).sum().backward()

    def stepped():  # sb3-contrib RecurrentPPO._process_sequence: one call per step, masked state
        for p in leaves:
            p.grad = None
        h, c = t_h0[None], t_c0[None]
        outs = []
        for t in range(T):
            out, (h, c) = lstm(t_x[t:t + 1], (t_keep[t][None] * h, t_keep[t][None] * c))
            outs.append(out)
        (torch.cat(outs) * t_w).sum().backward()
    return fused, stepped


# --------------------------------------------------------------------------------------------

def run_cells(cells, repeats: int, warmup: int = 10):
    """Median seconds per cell, timed round-robin (one run of every cell per round), so that
    every cell sees the same machine load on a shared machine."""
    for _ in range(warmup):
        for cell in cells:
            cell[-1]()
    times = [[] for _ in cells]
    for _ in range(repeats):
        for i, cell in enumerate(cells):
            t0 = time.perf_counter()
            cell[-1]()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def child(threads: str, repeats: int) -> None:
    """Time every cell in this process; ``threads`` is "1" or "default" (already applied to
    OpenBLAS through the environment by the parent); print JSON rows."""
    rng = np.random.default_rng(0)
    mlp_step, mlp_data = ppo_ref_mlp_case(rng)
    cells = [("mlp policy", "ppo_ref", "float64", mlp_step)]
    try:
        lstm_step, lstm_data = ppo_ref_lstm_case(rng)
        cells.append(("lstm", "ppo_ref (resets)", "float64", lstm_step))
    except ImportError:
        lstm_data = None
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        if threads == "1":
            torch.set_num_threads(1)
        for dtype in (torch.float64, torch.float32):
            name = str(dtype).replace("torch.", "")
            cells.append(("mlp policy", "torch", name, torch_mlp_case(torch, mlp_data, dtype)))
            if lstm_data is not None:
                fused, stepped = torch_lstm_cases(torch, lstm_data, dtype)
                cells.append(("lstm", "torch nn.LSTM fused (no resets)", name, fused))
                cells.append(("lstm", "torch step loop (resets, sb3-contrib)", name, stepped))
    medians = run_cells(cells, repeats, warmup=10 if threads == "1" else 3)
    info = {"numpy": np.__version__, "torch": None if torch is None else torch.__version__,
            "torch_threads": None if torch is None else torch.get_num_threads(),
            "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default")}
    rows = [list(c[:3]) + [m] for c, m in zip(cells, medians)]
    print(json.dumps({"info": info, "rows": rows}))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=100, help="timed rounds (median)")
    parser.add_argument("--quick", action="store_true", help="10 rounds (smoke test)")
    parser.add_argument("--child", choices=["1", "default"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    repeats = 10 if args.quick else args.repeats
    if args.child:
        child(args.child, repeats)
        return 0

    # Multithreaded BLAS on these small matrices is slow, and very slow on a busy machine, so
    # the "default" pass gets a fifth of the rounds to keep the run short.
    rounds = {"1": repeats, "default": max(10, repeats // 5)}
    results = {}
    for threads in ("1", "default"):
        env = dict(os.environ)
        if threads == "1":
            env["OPENBLAS_NUM_THREADS"] = "1"  # read by OpenBLAS when numpy loads it
            env["NUMBA_NUM_THREADS"] = "1"     # ppo_ref's parallel loops on one thread
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", threads,
                              "--repeats", str(rounds[threads])], env=env, check=True,
                             capture_output=True, text=True).stdout
        results[threads] = json.loads(out.strip().splitlines()[-1])
    info1, infod = results["1"]["info"], results["default"]["info"]
    print(f"# forward+backward per minibatch, median of {rounds['1']} (1 thread) and "
          f"{rounds['default']} (default) round-robin rounds; "
          f"numpy {info1['numpy']}, torch {info1['torch']}, {os.cpu_count()} CPUs")
    print(f"# mlp policy: batch {BATCH}, obs {OBS_DIM}, {N_ACTIONS} actions, towers "
          f"{list(NET_ARCH)} tanh + categorical log-prob/entropy backward; "
          f"lstm: H={H}, T={T}, N={N}, D={D}")
    print(f"# '1 thread': OPENBLAS_NUM_THREADS=1, NUMBA_NUM_THREADS=1 and "
          f"torch.set_num_threads(1); 'default': OpenBLAS and numba default, torch "
          f"{infod['torch_threads']} threads")
    print("| case | implementation | dtype | 1 thread ms | vs ppo_ref | default ms | vs ppo_ref |")
    print("|---|---|---|---:|---:|---:|---:|")
    base = {t: {r[0]: r[3] for r in results[t]["rows"] if r[1].startswith("ppo_ref")}
            for t in results}
    for r1, rd in zip(results["1"]["rows"], results["default"]["rows"]):
        case, impl, dtype = r1[:3]
        print(f"| {case} | {impl} | {dtype} | {1e3 * r1[3]:.3f} | {r1[3] / base['1'][case]:.2f}x "
              f"| {1e3 * rd[3]:.3f} | {rd[3] / base['default'][case]:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
