"""The equality contract between the two tiers, in one table.

Every function of the compiled tier (``ppo_ref.fast``, listed in ``ppo_ref.fast.FAST_FUNCTIONS``)
is exercised by at least one row of :data:`TWINS`. A row pairs it with the readable function
of ``ppo_ref.spec`` it is declared equal to, a generator of random inputs (hypothesis draws the
seed, and the seed draws the sizes and the values) and the tolerance it is held to:

* ``BITS``: the same bits (the fast tier compiles the very function the spec tier interprets, or
  repeats its operations in the same order);
* ``Tol(rtol, atol)``: ``|fast - spec| <= atol + rtol * max|spec|`` per result array (the fast
  tier sums in its own fixed order, the spec tier uses NumPy's products).

Three tests read the table: every pair agrees (:func:`test_twins_agree`); every fast function is
covered (:func:`test_every_fast_function_has_a_twin`); and every row's fast side gives the same
bits compiled and interpreted (:func:`test_compiled_equals_interpreted`: the same rows run again
in a subprocess with ``NUMBA_DISABLE_JIT=1``, so every kernel a fast function reaches, however
deep, is checked without a hand-kept list of kernel names).

Then the trainers: several updates of each trainer on both backends (feedforward and recurrent,
separate and shared networks, Discrete and Box actions, float64 and float32 for the fast tier)
give the same parameters and metrics within the stated tolerances
(:func:`test_trainers_agree_across_backends`).
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable, Dict, List, NamedTuple, Tuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gymnasium as gym

import ppo_ref
from ppo_ref.config import PPOConfig
from ppo_ref.fast import FAST_FUNCTIONS, NO_TWIN
from ppo_ref.fast import distributions as fast_dist
from ppo_ref.fast import lstm as fast_lstm
from ppo_ref.fast import optim as fast_optim
from ppo_ref.fast import update as fast_update
from ppo_ref.fast.flat import flatten_arrays
from ppo_ref.policies import MLPPolicy, SpecMLPPolicy
from ppo_ref.recurrent_policies import LSTMStates, RecurrentPolicy, SpecRecurrentPolicy
from ppo_ref.spec import distributions as spec_dist
from ppo_ref.spec import lstm as spec_lstm
from ppo_ref.spec import optim as spec_optim
from ppo_ref.spec import update as spec_update


class Tol(NamedTuple):
    """``|fast - spec| <= atol + rtol * max|spec|`` for each result array."""
    rtol: float
    atol: float


BITS = Tol(0.0, 0.0)


class Twin(NamedTuple):
    """One row of the table. ``covers``: the dotted names of the fast functions the row runs;
    ``spec``: the readable function they equal; ``case(rng) -> inputs``; ``run_fast(inputs)`` and
    ``run_spec(inputs)`` return the results to compare (a list of arrays)."""
    covers: Tuple[str, ...]
    spec: str
    case: Callable[[np.random.Generator], dict]
    run_fast: Callable[[dict], List[np.ndarray]]
    run_spec: Callable[[dict], List[np.ndarray]]
    tol: Tol


def _arrays(*values) -> List[np.ndarray]:
    out = []
    for v in values:
        if isinstance(v, dict):
            out.extend(np.asarray(v[k], dtype=np.float64) for k in sorted(v))
        elif isinstance(v, (tuple, list)):
            out.extend(_arrays(*v))
        else:
            out.append(np.asarray(v))
    return out


# -- advantages and masks: the fast tier compiles the spec loops ---------------------------------

def _per_step(rng, T, N, choices):
    """A scalar from ``choices``, or per-step ``[T, N]`` / ``[T]`` arrays drawn from them."""
    kind = int(rng.integers(0, 3))
    if kind == 0:
        return float(rng.choice(choices))
    return rng.choice(choices, size=(T, N) if kind == 1 else T)


def _trajectory(rng):
    T, N = int(rng.integers(1, 9)), int(rng.integers(1, 4))
    terminated = rng.random((T, N)) < 0.2
    truncated = rng.random((T, N)) < 0.2
    return dict(rewards=rng.normal(size=(T, N)), values=rng.normal(size=(T, N)),
                terminated=terminated, truncated=truncated, last_values=rng.normal(size=N),
                final_values=rng.normal(size=(T, N)), behaviour=rng.normal(size=(T, N)) - 1.0,
                target=rng.normal(size=(T, N)) - 1.0, initial=rng.random(N) < 0.5,
                gamma=_per_step(rng, T, N, [0.0, 0.5, 0.99, 1.0]),
                lam=_per_step(rng, T, N, [0.0, 0.9, 1.0]),
                truncation=str(rng.choice(["bootstrap", "terminate", "ignore"])),
                last_row=bool(rng.random() < 0.3))


def _gae(backend):
    def run(c):
        return _arrays(ppo_ref.gae(c["rewards"], c["values"], c["terminated"], c["truncated"],
                                   c["last_values"], c["final_values"], gamma=c["gamma"],
                                   gae_lambda=c["lam"], truncation=c["truncation"],
                                   bootstrap_terminal_last_row=c["last_row"], backend=backend))
    return run


def _vtrace(backend):
    def run(c):
        return _arrays(ppo_ref.vtrace(c["behaviour"], c["target"], c["rewards"], c["values"],
                                      c["terminated"], c["truncated"], c["last_values"],
                                      c["final_values"], gamma=c["gamma"], rho_bar=1.0,
                                      c_bar=0.9, pg_rho_bar=1.2, lambda_=c["lam"],
                                      truncation=c["truncation"],
                                      bootstrap_terminal_last_row=c["last_row"],
                                      backend=backend))
    return run


def _masks(backend):
    from ppo_ref.kernels import transition_masks

    def run(c):
        starts = ppo_ref.episode_starts(c["terminated"], c["truncated"], c["initial"],
                                        backend=backend)
        masks = transition_masks(c["terminated"], c["truncated"], c["truncation"],
                                 backend=backend)
        return _arrays(starts, tuple(masks))
    return run


# -- the minibatch loss, the optimizer step, the update loop ------------------------------------

def _loss_case(rng):
    n = int(rng.integers(2, 40))
    old = rng.normal(size=n) - 1.0
    interval = str(rng.choice(["symmetric", "reciprocal", "asymmetric"]))
    config = PPOConfig(ent_coef=float(rng.choice([0.0, 0.01])),
                       clip_range_vf=None if rng.random() < 0.5 else 0.2,
                       value_loss_mode=str(rng.choice(["max", "sb3", "huber"])),
                       huber_delta=float(rng.choice([1.0, 0.3])),
                       normalize_advantage=bool(rng.random() < 0.8),
                       advantage_norm_eps=float(rng.choice([1e-8, 1e-6, 2.0])),
                       advantage_norm_eps_placement=str(rng.choice(["add", "clamp"])),
                       clip_interval="reciprocal" if interval == "reciprocal" else "symmetric",
                       clip_range_low=0.1 if interval == "asymmetric" else None,
                       clip_range_high=0.3 if interval == "asymmetric" else None,
                       dual_clip=None if rng.random() < 0.5 else 1.5,
                       kl_estimator=str(rng.choice(["k3", "k1"])))
    weights = None if rng.random() < 0.5 else (rng.random(n) < 0.7) * rng.choice([1.0, 0.5], n)
    if weights is not None:
        weights[0] = 1.0  # a positive sum
    return dict(new=old + 0.3 * rng.normal(size=n), entropy=rng.uniform(0.1, 1.0, n),
                values=rng.normal(size=n), old=old, adv=rng.normal(size=n),
                returns=rng.normal(size=n), old_values=rng.normal(size=n), config=config,
                weights=weights)


def _loss(fn):
    def run(c):
        out = fn(c["new"], c["entropy"], c["values"], c["old"], c["adv"], c["returns"],
                 c["old_values"], config=c["config"], clip_range=0.2, weights=c["weights"])
        d_ent = out.d_entropy if out.d_entropy is not None else np.zeros(0)
        return _arrays(out.loss, out.policy_loss, out.value_loss, out.entropy, out.approx_kl,
                       out.clip_fraction, out.max_abs_log_ratio, out.d_log_probs, d_ent,
                       out.d_values)
    return run


def _advantages_case(rng):
    n = int(rng.integers(2, 600))
    scale = float(rng.choice([1e-6, 1.0, 1e3, 1e100]))
    adv = rng.normal(size=n) * scale + float(rng.choice([0.0, 3.0 * scale]))
    if rng.random() < 0.1:
        adv[:] = adv[0]  # constant: (near) zeros
    return dict(adv=adv, ddof=int(rng.integers(0, 2)), eps=float(rng.choice([1e-8, 1e-4])),
                placement=str(rng.choice(["add", "clamp"])))


def _normalize_fast(c):
    from ppo_ref.fast.losses import _normalize_advantages_kernel
    out = np.empty_like(c["adv"])
    assert _normalize_advantages_kernel(c["adv"], c["ddof"], c["eps"], c["placement"] == "clamp",
                                        out)
    return [out]


def _normalize_spec(c):
    from ppo_ref.spec.losses import normalize_advantages
    return [normalize_advantages(c["adv"], ddof=c["ddof"], eps=c["eps"],
                                 placement=c["placement"])]


def _adam_case(rng):
    shapes = {"a": (int(rng.integers(1, 6)), 3), "b": (int(rng.integers(1, 9)),)}
    params = {k: rng.normal(size=s) for k, s in shapes.items()}
    grads = {k: rng.normal(size=s) * float(rng.choice([0.01, 1.0, 10.0])) for k, s in shapes.items()}
    state = spec_optim.adam_init(params)
    state["t"] = int(rng.integers(0, 5))
    state["m"] = {k: 0.1 * rng.normal(size=s) for k, s in shapes.items()}
    state["v"] = {k: rng.uniform(0.0, 0.1, size=s) for k, s in shapes.items()}
    return dict(params=params, grads=grads, state=state, max_norm=0.5, lr=3e-4)


def _adam_case_no_clip(rng):
    """A step whose gradient norm is far below ``max_norm``: nothing clips."""
    return dict(_adam_case(rng), max_norm=1e6)


def _without_norm(run):
    """The results of ``run`` but the last (the global norm, summed in another order)."""
    return lambda c: run(c)[:-1]


def _adam_fast(c):
    layout_params = flatten_arrays(c["params"])
    layout = layout_params.layout
    state = {"t": c["state"]["t"], "m": flatten_arrays(c["state"]["m"], layout),
             "v": flatten_arrays(c["state"]["v"], layout)}
    params, state, norm = fast_optim.clipped_adam_step(
        layout_params, flatten_arrays(c["grads"], layout), state, max_norm=c["max_norm"],
        lr=c["lr"])
    return _arrays(dict(params), dict(state["m"]), dict(state["v"]), norm)


def _adam_spec(c):
    grads, norm = spec_optim.clip_by_global_norm(c["grads"], c["max_norm"])
    params, state = spec_optim.adam_update(c["params"], grads, c["state"], lr=c["lr"])
    return _arrays(params, state["m"], state["v"], norm)


def _epochs_case(rng, max_grad_norm=0.3):
    return dict(seed=int(rng.integers(0, 2 ** 31)), target_kl=rng.choice([None, 0.02]),
                max_grad_norm=max_grad_norm)


def _epochs(tier):
    from test_spec_update import N_ROWS, BATCH, linear_problem

    def run(c):
        config = PPOConfig(n_steps=N_ROWS, batch_size=BATCH, n_epochs=3, ent_coef=0.01,
                           target_kl=c["target_kl"], max_grad_norm=c["max_grad_norm"])
        params, evaluate, backward, flat_backward, minibatches = linear_problem(c["seed"] % 100)
        if tier == "fast":
            params = flatten_arrays(params)
            fn, back = fast_update.run_epochs, flat_backward
        else:
            fn, back = spec_update.run_epochs, backward
        params, state, stats = fn(params, spec_optim.adam_init(params), config=config, lr=0.05,
                                  clip_range=0.2, minibatches=minibatches(
                                      np.random.default_rng(c["seed"])),
                                  evaluate=evaluate, backward=back)
        return _arrays(dict(params), dict(state["m"]), dict(state["v"]),
                       [stats[k] for k in spec_update.STATS_KEYS if k != "grad_norm"],
                       stats["grad_norm"])
    return run


# -- the trainers' minibatches: the same rows in the same order, the same Generator state ------

def _minibatch_case(rng, recurrent):
    T, N = int(rng.integers(1, 7)), int(rng.integers(1, 7))
    box = bool(rng.random() < 0.5)
    lead = (T, N) if recurrent else (T * N,)
    actions = (rng.normal(size=lead + (2,)) if box else rng.integers(0, 4, size=lead))
    L, H = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    divisors = [d for d in range(1, N + 1) if N % d == 0]
    return dict(seed=int(rng.integers(0, 2 ** 31)), n_epochs=int(rng.integers(1, 5)),
                target_kl=None if rng.random() < 0.5 else 0.02,
                batch_size=int(rng.integers(1, T * N + 2)), per=int(rng.choice(divisors)),
                old_log_probs=rng.normal(size=lead), advantages=rng.normal(size=lead),
                returns=rng.normal(size=lead), old_values=rng.normal(size=lead),
                observations=rng.normal(size=lead + (3,)), actions=actions,
                states=LSTMStates(rng.normal(size=(L, N, H)), rng.normal(size=(L, N, H))),
                episode_starts=rng.random((T, N)) < 0.3)


def _minibatches(fn, recurrent, fast):
    """Every minibatch array of every epoch, then the Generator's state (as text)."""
    def run(c):
        rng = np.random.default_rng(c["seed"])
        arrays = [c[k] for k in ("old_log_probs", "advantages", "returns", "old_values",
                                 "observations", "actions")]
        if recurrent:
            args = (rng, c["per"], *arrays, c["states"], c["episode_starts"])
        else:
            args = (rng, c["batch_size"], *arrays)
        extra = dict(n_epochs=c["n_epochs"], target_kl=c["target_kl"]) if fast else {}
        minibatches = fn(*args, **extra)
        out = []
        for epoch in range(c["n_epochs"]):
            for mb in minibatches(epoch):
                out.extend(_arrays(mb.old_log_probs, mb.advantages, mb.returns, mb.old_values,
                                   tuple(mb.data)))
                assert mb.weights is None
        return out + [np.array(repr(rng.bit_generator.state))]
    return run


# -- the MLP towers on a flat buffer ----------------------------------------------------------

def _mlp_case(rng):
    sizes = [int(w) for w in rng.integers(1, 7, size=int(rng.integers(2, 5)))]
    params = {}
    for i in range(len(sizes) - 1):
        params[f"w{i}"] = rng.normal(size=(sizes[i + 1], sizes[i]))
        params[f"b{i}"] = 0.5 * rng.normal(size=sizes[i + 1])
    rows = int(rng.integers(1, 12))
    return dict(params=params, x=rng.normal(size=(rows, sizes[0])),
                dy=rng.normal(size=(rows, sizes[-1])),
                activation=str(rng.choice(["tanh", "relu"])))


def _mlp_fast(c):
    from ppo_ref.fast.mlp import layer_table, mlp_backward_flat, mlp_forward_flat
    flat = flatten_arrays(c["params"])
    table = layer_table(flat.layout, flat, "", len(c["params"]) // 2)
    relu = c["activation"] == "relu"
    rows = c["x"].shape[0]
    acts = np.empty(rows * int(table[:, 2].sum()))
    mlp_forward_flat(c["x"], flat.flat, table, relu, acts)
    y = acts[acts.size - rows * int(table[-1, 2]):].reshape(rows, -1)
    grads, dx = np.zeros(flat.flat.size), np.zeros(c["x"].shape)
    mlp_backward_flat(c["x"], acts, flat.flat, table, relu, c["dy"], grads, dx)
    return _arrays(y, dict(type(flat).from_buffer(grads, flat.layout)), dx)


def _mlp_spec(c):
    from ppo_ref.spec.layers import mlp_backward, mlp_forward
    y, cache = mlp_forward(c["params"], c["x"], c["activation"])
    dx, grads = mlp_backward(c["params"], cache, c["dy"])
    return _arrays(y, grads, dx)


def _mlp_pair_case(rng):
    """Two towers of :func:`_mlp_case` (one activation) under the keys ``a.*`` and ``b.*`` of
    one parameter dict."""
    one, two = _mlp_case(rng), _mlp_case(rng)
    return dict(towers=(one, two), activation=one["activation"],
                params={f"{k}.{name}": v for k, c in zip("ab", (one, two))
                        for name, v in c["params"].items()})


def _mlp_pair_fast(c):
    from ppo_ref.fast.mlp import layer_table, mlp_backward_pair, mlp_forward_pair
    flat = flatten_arrays(c["params"])
    relu = c["activation"] == "relu"
    args = []
    for key, tower in zip("ab", c["towers"]):
        table = layer_table(flat.layout, flat, key + ".", len(tower["params"]) // 2)
        acts = np.empty(tower["x"].shape[0] * int(table[:, 2].sum()))
        args.append((tower["x"], acts, table, tower["dy"], np.zeros(tower["x"].shape)))
    mlp_forward_pair(flat.flat, relu, *(a[i] for a in args for i in (0, 2, 1)))
    ys = [acts[acts.size - x.shape[0] * int(table[-1, 2]):].reshape(x.shape[0], -1)
          for x, acts, table, _, _ in args]
    grads = np.zeros(flat.flat.size)
    mlp_backward_pair(flat.flat, relu, grads, *args[0], *args[1])
    return _arrays(ys, dict(type(flat).from_buffer(grads, flat.layout)), args[0][4], args[1][4])


def _mlp_pair_spec(c):
    from ppo_ref.spec.layers import mlp_backward, mlp_forward
    ys, grads, dxs = [], {}, []
    for key, tower in zip("ab", c["towers"]):
        y, cache = mlp_forward(tower["params"], tower["x"], c["activation"])
        dx, g = mlp_backward(tower["params"], cache, tower["dy"])
        ys.append(y)
        grads.update({f"{key}.{name}": v for name, v in g.items()})
        dxs.append(dx)
    return _arrays(ys, grads, *dxs)


# -- distributions --------------------------------------------------------------------------------

def _logits_case(rng, masked=True):
    """Logits ``[B, A]``; with ``masked`` some entries are -inf (action masks: the samplers take
    them; the evaluation kernels of the fast policies read network outputs, always finite)."""
    B, A = int(rng.integers(1, 12)), int(rng.integers(1, 6))
    logits = rng.normal(size=(B, A)) * float(rng.choice([0.1, 1.0, 20.0]))
    if masked and A > 1:
        logits[rng.random((B, A)) < 0.2] = -np.inf
        logits[np.all(logits == -np.inf, axis=1), 0] = 0.0
    valid = [np.flatnonzero(row > -np.inf) for row in logits]
    actions = np.array([rng.choice(v) for v in valid], dtype=np.int64)
    return dict(logits=logits, actions=actions, d_lp=rng.normal(size=B), d_ent=rng.normal(size=B),
                seed=int(rng.integers(0, 2 ** 31)))


def _categorical_fast(c):
    z = np.ascontiguousarray(c["logits"])
    B = z.shape[0]
    log_probs, entropy, probs = np.empty(B), np.empty(B), np.empty(z.shape)
    assert fast_dist.categorical_eval_kernel(z, c["actions"], log_probs, entropy, probs)
    d_out = np.empty(z.shape)
    fast_dist.categorical_backward_kernel(probs, c["actions"], entropy, c["d_lp"], c["d_ent"],
                                           True, d_out)
    return _arrays(log_probs, entropy, d_out)


def _categorical_spec(c):
    z, a = c["logits"], c["actions"]
    return _arrays(spec_dist.categorical_log_prob(z, a), spec_dist.categorical_entropy(z),
                   spec_dist.categorical_log_prob_backward(z, a, c["d_lp"])
                   + spec_dist.categorical_entropy_backward(z, c["d_ent"]))


def _sample(module):
    def run(c):
        return _arrays(module.categorical_sample(np.random.default_rng(c["seed"]), c["logits"]))
    return run


NVEC = (3, 1, 4)


def _multi_case(rng):
    B = int(rng.integers(1, 8))
    logits = rng.normal(size=(B, sum(NVEC)))
    actions = np.stack([rng.integers(n, size=B) for n in NVEC], axis=-1)
    return dict(logits=logits, actions=actions, d_lp=rng.normal(size=B), d_ent=rng.normal(size=B),
                seed=int(rng.integers(0, 2 ** 31)))


def _multi(module):
    def run(c):
        z, a = c["logits"], c["actions"]
        return _arrays(module.multi_categorical_log_prob(z, a, NVEC),
                       module.multi_categorical_entropy(z, NVEC),
                       module.multi_categorical_log_prob_backward(z, a, NVEC, c["d_lp"]),
                       module.multi_categorical_entropy_backward(z, NVEC, c["d_ent"]))
    return run


# -- the LSTM -------------------------------------------------------------------------------------

def _lstm_case(rng):
    # up to 10 envs and 4H up to 24: the compiled products' 8-row x 16-column register blocks
    # and their leftover rows and columns are all reached
    T, N, D, H = (int(rng.integers(1, 6)), int(rng.integers(1, 11)), int(rng.integers(1, 4)),
                  int(rng.integers(1, 7)))
    params = spec_lstm.lstm_init(rng, D, H)
    params["b"] = 0.1 * rng.normal(size=4 * H)
    return dict(params=params, x=rng.normal(size=(T, N, D)), h0=rng.normal(size=(N, H)),
                c0=rng.normal(size=(N, H)), starts=rng.random((T, N)) < 0.3,
                dh=rng.normal(size=(T, N, H)), dh_T=rng.normal(size=(N, H)),
                dc_T=rng.normal(size=(N, H)))


def _lstm(module):
    def run(c):
        p = c["params"]
        h_seq, (h_T, c_T), cache = module.lstm_forward(p, c["x"], c["h0"], c["c0"], c["starts"])
        dx, grads, (dh0, dc0) = module.lstm_backward(p, cache, c["dh"], c["dh_T"], c["dc_T"])
        h1, c1 = module.lstm_step(p, c["x"][0], c["h0"], c["c0"], c["starts"][0])
        return _arrays(h_seq, h_T, c_T, dx, grads, dh0, dc0, h1, c1)
    return run


# -- the policies (networks + heads): MLPPolicy vs SpecMLPPolicy, RecurrentPolicy vs spec -------

def _spaces(kind, obs_dim=3):
    obs = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float64)
    if kind == "discrete":
        return obs, gym.spaces.Discrete(3)
    if kind == "multi":
        return obs, gym.spaces.MultiDiscrete([2, 3])
    return obs, gym.spaces.Box(-1.0, 1.0, (2,), np.float64)


def _random_actions(rng, policy, rows):
    space = policy.head
    if space.kind == "categorical":
        return rng.integers(space.n_actions, size=rows)
    if space.kind == "gaussian":
        return rng.normal(size=(rows, space.action_dim))
    return np.stack([rng.integers(n, size=rows) for n in space.nvec], axis=-1)


def _mlp_policy_case(rng, kinds=("discrete", "box", "multi")):
    kind = str(rng.choice(list(kinds)))
    config = PPOConfig(net_arch=tuple(int(w) for w in rng.integers(1, 21, size=rng.integers(0, 3))),
                       activation=str(rng.choice(["tanh", "relu"])),
                       shared_trunk=bool(rng.random() < 0.4), policy_head_gain=1.0,
                       log_std_init=-0.5)
    if config.shared_trunk and not config.net_arch:
        config = config.replace(net_arch=(4,))
    spec = SpecMLPPolicy(*_spaces(kind), config)
    params = spec.init_params(np.random.default_rng(int(rng.integers(0, 2 ** 31))))
    params = {k: v + 0.05 * rng.normal(size=v.shape) for k, v in params.items()}  # biases != 0
    B = int(rng.integers(1, 20))
    return dict(kind=kind, config=config, params=params, obs=rng.normal(size=(B, 3)),
                actions=_random_actions(rng, spec, B), d=rng.normal(size=(3, B)),
                seed=int(rng.integers(0, 2 ** 31)))


def _mlp_policy(cls, dtype="float64"):
    def run(c):
        policy = cls(*_spaces(c["kind"]), c["config"].replace(compute_dtype=dtype))
        params = policy.as_flat(c["params"])
        ev = policy.evaluate(params, c["obs"], c["actions"])
        grads = policy.backward(params, ev.cache, *c["d"])
        acted = policy.act(params, c["obs"], np.random.default_rng(c["seed"]))
        return _arrays(ev.log_probs, ev.entropy, ev.values, dict(grads), acted[1], acted[2],
                       policy.values(params, c["obs"]), policy.policy_out_fn(params)(c["obs"]))
    return run


def _recurrent_case(rng):
    kind = str(rng.choice(["discrete", "box"]))
    config = PPOConfig(net_arch=tuple(int(w) for w in rng.integers(1, 7, size=rng.integers(0, 2))),
                       activation=str(rng.choice(["tanh", "relu"])),
                       lstm_shared=bool(rng.random() < 0.5), policy_head_gain=1.0,
                       lstm_hidden_size=int(rng.integers(1, 7)))
    spec = SpecRecurrentPolicy(*_spaces(kind), config)
    params = spec.init_params(np.random.default_rng(int(rng.integers(0, 2 ** 31))))
    params = {k: v + 0.05 * rng.normal(size=v.shape) for k, v in params.items()}
    T, n = int(rng.integers(1, 6)), int(rng.integers(1, 11))
    L, H = (1 if config.lstm_shared else 2), config.lstm_hidden_size
    actions = _random_actions(rng, spec, T * n).reshape((T, n) + spec.head.action_shape)
    return dict(kind=kind, config=config, params=params, obs=rng.normal(size=(T, n, 3)),
                actions=actions, state=(rng.normal(size=(L, n, H)), rng.normal(size=(L, n, H))),
                starts=rng.random((T, n)) < 0.3, d=rng.normal(size=(3, T, n)))


def _recurrent_policy(cls, dtype="float64"):
    def run(c):
        policy = cls(*_spaces(c["kind"]), c["config"].replace(compute_dtype=dtype))
        params = policy.as_flat(c["params"])
        state = LSTMStates(*c["state"])
        ev = policy.evaluate(params, c["obs"], c["actions"], state, c["starts"])
        grads = policy.backward(params, ev.cache, *c["d"])
        values = policy.values(params, c["obs"][0], state, c["starts"][0])
        return _arrays(ev.log_probs, ev.entropy, ev.values, dict(grads), values)
    return run


def _fast_name(module, name):
    return f"ppo_ref.fast.{module}.{name}"


TWINS: Dict[str, Twin] = {
    "gae": Twin((_fast_name("advantages", "gae_recursion"),), "ppo_ref.spec.advantages.gae_recursion",
                _trajectory, _gae("fast"), _gae("spec"), BITS),
    "vtrace": Twin((_fast_name("advantages", "vtrace_recursion"),
                    _fast_name("advantages", "log_ratios")),
                   "ppo_ref.spec.advantages.vtrace_recursion", _trajectory, _vtrace("fast"),
                   _vtrace("spec"), BITS),
    "masks": Twin((_fast_name("advantages", "transition_masks_loop"),
                   _fast_name("advantages", "episode_starts_loop")),
                  "ppo_ref.spec.masks.transition_masks_loop", _trajectory, _masks("fast"),
                  _masks("spec"), BITS),
    "minibatch_loss": Twin((_fast_name("update", "minibatch_loss"),
                            _fast_name("update", "_loss_pass")),
                           "ppo_ref.spec.update.minibatch_loss", _loss_case,
                           _loss(fast_update.minibatch_loss), _loss(spec_update.minibatch_loss),
                           BITS),
    "normalize_advantages": Twin((_fast_name("losses", "_normalize_advantages_kernel"),),
                                 "ppo_ref.spec.losses.normalize_advantages", _advantages_case,
                                 _normalize_fast, _normalize_spec, BITS),
    "clipped_adam_step": Twin((_fast_name("optim", "clipped_adam_step"),),
                              "ppo_ref.spec.optim.adam_update", _adam_case, _adam_fast,
                              _adam_spec, Tol(1e-14, 1e-300)),
    # no step clips: the same bits but for the global norm, whose sum has another order (it is
    # compared in the rows above)
    "clipped_adam_step_no_clip": Twin((_fast_name("optim", "clipped_adam_step"),),
                                      "ppo_ref.spec.optim.adam_update", _adam_case_no_clip,
                                      _without_norm(_adam_fast), _without_norm(_adam_spec), BITS),
    "run_epochs": Twin((_fast_name("update", "run_epochs"),), "ppo_ref.spec.update.run_epochs",
                       _epochs_case, _epochs("fast"), _epochs("spec"), Tol(1e-10, 1e-14)),
    "run_epochs_no_clip": Twin((_fast_name("update", "run_epochs"),),
                               "ppo_ref.spec.update.run_epochs",
                               lambda rng: _epochs_case(rng, max_grad_norm=1e6),
                               _without_norm(_epochs("fast")), _without_norm(_epochs("spec")),
                               BITS),
    "mlp": Twin((_fast_name("mlp", "mlp_forward_flat"), _fast_name("mlp", "mlp_backward_flat"),
                 _fast_name("mlp", "layer_table")),
                "ppo_ref.spec.layers.mlp_forward", _mlp_case, _mlp_fast, _mlp_spec,
                Tol(1e-12, 1e-14)),
    "mlp_pair": Twin((_fast_name("mlp", "mlp_forward_pair"),
                      _fast_name("mlp", "mlp_backward_pair")),
                     "ppo_ref.spec.layers.mlp_backward", _mlp_pair_case, _mlp_pair_fast,
                     _mlp_pair_spec, Tol(1e-12, 1e-14)),
    "feedforward_minibatches": Twin(
        (_fast_name("update", "feedforward_minibatches"), _fast_name("update", "epoch_permutations")),
        "ppo_ref.spec.update.feedforward_minibatches", lambda rng: _minibatch_case(rng, False),
        _minibatches(fast_update.feedforward_minibatches, False, True),
        _minibatches(spec_update.feedforward_minibatches, False, False), BITS),
    "recurrent_minibatches": Twin(
        (_fast_name("update", "recurrent_minibatches"), _fast_name("update", "epoch_permutations")),
        "ppo_ref.spec.update.recurrent_minibatches", lambda rng: _minibatch_case(rng, True),
        _minibatches(fast_update.recurrent_minibatches, True, True),
        _minibatches(spec_update.recurrent_minibatches, True, False), BITS),
    "categorical": Twin((_fast_name("distributions", "categorical_eval_kernel"),
                         _fast_name("distributions", "categorical_backward_kernel")),
                        "ppo_ref.spec.distributions.categorical_log_prob",
                        lambda rng: _logits_case(rng, masked=False),
                        _categorical_fast, _categorical_spec, Tol(1e-12, 1e-15)),
    "categorical_sample": Twin((_fast_name("distributions", "categorical_sample"),
                                _fast_name("distributions", "inverse_cdf_actions")),
                               "ppo_ref.spec.distributions.categorical_sample", _logits_case,
                               _sample(fast_dist), _sample(spec_dist), BITS),
    "multi_categorical": Twin(tuple(_fast_name("distributions", f"multi_categorical_{s}")
                                    for s in ("log_prob", "entropy", "log_prob_backward",
                                              "entropy_backward")),
                              "ppo_ref.spec.distributions.multi_categorical_log_prob",
                              _multi_case, _multi(fast_dist), _multi(spec_dist), Tol(1e-12, 1e-15)),
    "lstm": Twin(tuple(_fast_name("lstm", n) for n in ("lstm_forward", "lstm_backward",
                                                       "lstm_step")),
                 "ppo_ref.spec.lstm.lstm_forward", _lstm_case, _lstm(fast_lstm), _lstm(spec_lstm),
                 Tol(1e-12, 1e-14)),
    # the network alone in one compiled call (flat_*_into) with the Gaussian and
    # MultiDiscrete heads; with the categorical head, network and head in one call each
    "mlp_policy": Twin(tuple(_fast_name("actor_critic", n) for n in ("flat_net", "flat_forward",
                                                                     "flat_backward",
                                                                     "flat_forward_into",
                                                                     "flat_backward_into",
                                                                     "acting_weights",
                                                                     "acting_forward")),
                       "ppo_ref.spec.networks.actor_critic_forward",
                       lambda rng: _mlp_policy_case(rng, ("box", "multi")),
                       _mlp_policy(MLPPolicy), _mlp_policy(SpecMLPPolicy), Tol(1e-11, 1e-14)),
    "mlp_policy_categorical": Twin(tuple(_fast_name("actor_critic", n)
                                         for n in ("categorical_forward_into",
                                                   "categorical_backward_into",
                                                   "acting_forward")),
                                   "ppo_ref.spec.networks.actor_critic_forward",
                                   lambda rng: _mlp_policy_case(rng, ("discrete",)),
                                   _mlp_policy(MLPPolicy), _mlp_policy(SpecMLPPolicy),
                                   Tol(1e-11, 1e-14)),
    "mlp_policy_float32": Twin(("ppo_ref.fast.actor_critic.flat_forward",),
                               "ppo_ref.spec.networks.actor_critic_forward", _mlp_policy_case,
                               _mlp_policy(MLPPolicy, "float32"), _mlp_policy(SpecMLPPolicy),
                               Tol(2e-4, 1e-5)),
    "recurrent_policy_float32": Twin((_fast_name("lstm", "forward_stacked"),),
                                     "ppo_ref.spec.recurrent_networks.recurrent_actor_critic_forward",
                                     _recurrent_case, _recurrent_policy(RecurrentPolicy, "float32"),
                                     _recurrent_policy(SpecRecurrentPolicy), Tol(2e-4, 1e-5)),
    "recurrent_policy": Twin((_fast_name("lstm", "forward_stacked"),
                              _fast_name("lstm", "backward_stacked"),
                              _fast_name("lstm", "step_stacked")),
                             "ppo_ref.spec.recurrent_networks.recurrent_actor_critic_forward",
                             _recurrent_case, _recurrent_policy(RecurrentPolicy),
                             _recurrent_policy(SpecRecurrentPolicy), Tol(1e-11, 1e-13)),
}


def _compare(fast, spec, tol: Tol, what: str) -> None:
    assert len(fast) == len(spec), what
    for i, (a, b) in enumerate(zip(fast, spec)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, f"{what}: result {i} shapes {a.shape} vs {b.shape}"
        if tol == BITS or a.dtype.kind in "biu":
            np.testing.assert_array_equal(a, b, err_msg=f"{what}: result {i}")
            continue
        finite = np.isfinite(b)
        np.testing.assert_array_equal(np.isfinite(a), finite, err_msg=f"{what}: result {i}")
        np.testing.assert_array_equal(a[~finite], b[~finite], err_msg=f"{what}: result {i}")
        scale = float(np.max(np.abs(b[finite]), initial=0.0))
        err = float(np.max(np.abs(a[finite] - b[finite]), initial=0.0))
        assert err <= tol.atol + tol.rtol * scale, (
            f"{what}: result {i} differs by {err:.3g} (scale {scale:.3g}, allowed "
            f"{tol.atol:.3g} + {tol.rtol:.3g} * scale)")


@pytest.mark.parametrize("name", sorted(TWINS))
@settings(max_examples=15)
@given(seed=st.integers(0, 2 ** 32 - 1))
def test_twins_agree(name, seed):
    twin = TWINS[name]
    case = twin.case(np.random.default_rng(seed))
    _compare(twin.run_fast(case), twin.run_spec(case), twin.tol, f"{name} (seed {seed})")
    _assert_compiled_functions_ran(name, twin)


def _assert_compiled_functions_ran(name: str, twin: Twin) -> None:
    """Each covered function that is a numba dispatcher has a compiled signature once the row
    ran: the row really exercised it (compiled), rather than naming it."""
    if os.environ.get("NUMBA_DISABLE_JIT") == "1":
        return  # interpreted: no dispatchers
    import importlib
    from numba.core.dispatcher import Dispatcher
    for dotted in twin.covers:
        module, attr = dotted.rsplit(".", 1)
        fn = getattr(importlib.import_module(module), attr)
        if isinstance(fn, Dispatcher):
            assert fn.signatures, f"{name}: the row never ran {dotted} (no compiled signature)"


def test_every_fast_function_has_a_twin():
    covered = {n for twin in TWINS.values() for n in twin.covers}
    missing = sorted(set(FAST_FUNCTIONS) - set(NO_TWIN) - covered)
    assert not missing, f"fast functions with no row in TWINS: {missing}"
    import importlib
    for name in covered | {t.spec for t in TWINS.values()}:
        module, attr = name.rsplit(".", 1)
        assert callable(getattr(importlib.import_module(module), attr)), name


# -- compiled == interpreted, derived from the table -------------------------------------------

INTERPRETED_SEEDS = (1, 2, 3, 4)


def _fast_results(seed: int) -> Dict[str, List[np.ndarray]]:
    return {name: twin.run_fast(twin.case(np.random.default_rng(seed)))
            for name, twin in sorted(TWINS.items())}


def _dump(path: str) -> None:
    """Write every row's fast results for :data:`INTERPRETED_SEEDS` to ``path`` (.npz)."""
    arrays = {}
    for seed in INTERPRETED_SEEDS:
        for name, results in _fast_results(seed).items():
            for i, a in enumerate(results):
                arrays[f"{seed}/{name}/{i}"] = np.asarray(a)
    np.savez(path, **arrays)


@pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1", reason="this process is interpreted")
def test_compiled_equals_interpreted(tmp_path):
    """Every row's fast side, run by a subprocess with ``NUMBA_DISABLE_JIT=1`` (every compiled
    function is then its Python source), gives the bits it gives compiled."""
    path = str(tmp_path / "interpreted.npz")
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    here = os.path.dirname(__file__)
    code = f"import sys; sys.path.insert(0, {here!r}); import test_tiers; test_tiers._dump({path!r})"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    interpreted = np.load(path)
    for seed in INTERPRETED_SEEDS:
        for name, results in _fast_results(seed).items():
            for i, a in enumerate(results):
                np.testing.assert_array_equal(
                    np.asarray(a), interpreted[f"{seed}/{name}/{i}"],
                    err_msg=f"{name}, result {i}, seed {seed}: compiled != interpreted")


# -- the trainers on both backends --------------------------------------------------------------

TRAINER_CASES = {
    # name: (trainer, env id, config changes, fast compute dtype, parameter tolerance)
    "mlp-discrete-separate": ("ff", "CartPole-v1", dict(), "float64", 1e-12),
    "mlp-discrete-shared": ("ff", "CartPole-v1", dict(shared_trunk=True, activation="relu"),
                            "float64", 1e-12),
    "mlp-box": ("ff", "Pendulum-v1", dict(normalize_observations=True), "float64", 1e-12),
    "mlp-discrete-float32": ("ff", "CartPole-v1", dict(), "float32", 1e-5),
    "lstm-discrete-separate": ("lstm", "ppo_ref/MemoryCue-v0", dict(), "float64", 1e-12),
    "lstm-discrete-shared": ("lstm", "ppo_ref/MemoryCue-v0", dict(lstm_shared=True),
                             "float64", 1e-12),
    "lstm-box": ("lstm", "Pendulum-v1", dict(), "float64", 1e-12),
    "lstm-float32": ("lstm", "ppo_ref/MemoryCue-v0", dict(), "float32", 1e-5),
    # a KL stop configured (it fires in these runs): the fast minibatches take their per-epoch path
    "mlp-discrete-target-kl-sb3": ("ff", "CartPole-v1", dict(target_kl=1e-4, kl_stop_rule="sb3"),
                                   "float64", 1e-12),
    "lstm-discrete-target-kl-cleanrl": ("lstm", "ppo_ref/MemoryCue-v0",
                                        dict(target_kl=2e-5, kl_stop_rule="cleanrl"),
                                        "float64", 1e-12),
}

METRICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm",
           "explained_variance", "n_gradient_steps", "n_epochs_run")


def _train(kind, env_id, changes, backend, dtype, updates=3):
    from ppo_ref.ppo import PPOTrainer
    from ppo_ref.recurrent_ppo import RecurrentPPOTrainer
    base = dict(n_steps=32, n_envs=4, batch_size=32, n_epochs=3, learning_rate=1e-3,
                net_arch=(16,), lstm_hidden_size=8, ent_coef=0.01)
    config = PPOConfig(**{**base, **changes}, backend=backend, compute_dtype=dtype)
    cls = RecurrentPPOTrainer if kind == "lstm" else PPOTrainer
    trainer = cls(env_id, config, seed=3)
    stats = []
    trainer.learn(updates * 32 * 4, callback=lambda t, s: stats.append(dict(s)))
    params = {k: np.array(v) for k, v in trainer.params.items()}
    trainer.close()
    return params, stats


@pytest.mark.parametrize("name", sorted(TRAINER_CASES))
def test_trainers_agree_across_backends(name):
    """Three updates of the same run (same seed) on the spec backend and on the fast backend
    give the same parameters within the row's tolerance (relative to each array's largest
    entry; float64 fast: 1e-12, float32 fast: 1e-5; measured: about 3e-15 and 6e-7) and the
    same metrics within 1000 times that; the first minibatch of every update reproduces the
    behaviour log-probs (ratio exactly 1 on the fast tier, within 1e-12 on the spec tier,
    whose NumPy products may round a row differently in a batch of another size)."""
    kind, env_id, changes, dtype, tol = TRAINER_CASES[name]
    spec_params, spec_stats = _train(kind, env_id, changes, "spec", "float64")
    fast_params, fast_stats = _train(kind, env_id, changes, "fast", dtype)
    assert len(spec_stats) == len(fast_stats) == 3
    for k in spec_params:
        _compare([fast_params[k]], [spec_params[k]], Tol(tol, 1e-12), f"{name}: params[{k!r}]")
    for s, f in zip(spec_stats, fast_stats):
        for key in METRICS:
            assert f[key] == pytest.approx(s[key], rel=tol * 1000, abs=tol), key
        assert f["first_max_abs_log_ratio"] == 0.0
        assert s["first_max_abs_log_ratio"] < 1e-12


# -- the golden vectors on both backends -------------------------------------------------------

def test_golden_vectors_agree_across_backends(tmp_path):
    """``ppo-ref vectors --backend spec`` and ``--backend fast`` write the same cases, and the
    fast tier's results pass ``check`` against the spec tier's vectors (each case's own
    tolerance): the published reference numbers do not depend on the tier."""
    from ppo_ref import vectors
    spec_dir, fast_dir = str(tmp_path / "spec"), str(tmp_path / "fast")
    names = vectors.write_vectors(spec_dir, backend="spec")
    assert vectors.write_vectors(fast_dir, backend="fast") == names
    results = {"format": vectors.RESULTS_FORMAT, "implementation": "ppo_ref fast", "cases": {}}
    for case in vectors.load_cases(spec_dir):
        outputs = vectors.compute_outputs(case, backend="fast")
        results["cases"][case["name"]] = {"outputs": vectors.encode(outputs)}
    path = tmp_path / "results.json"
    path.write_text(vectors.dumps(results))
    rows = vectors.check_results(spec_dir, str(path))
    assert len(rows) == len(names) > 10
    failed = [r for r in rows if r.get("status") != "PASS"]
    assert not failed, failed
    with pytest.raises(ValueError, match="backend"):
        vectors.compute_outputs(vectors.load_cases(spec_dir)[0], backend="numba")
