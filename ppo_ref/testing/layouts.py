"""Input layouts: how an example in the reference layout is handed to the user's function and
how its results are read back.

A layout is an object with these methods (subclass :class:`Layout` to write your own)::

    arguments(quantity, example) -> (args, kwargs)     # fn(*args, **kwargs) is called
    outputs(quantity, result, example) -> {name: value}  # fn's result, reference names/shapes
    expected(quantity, reference, example) -> {name: value}  # the reference outputs to compare
                                                             # with (default: unchanged)
    prepare(quantity, example) -> example              # optional: the example as this layout
                                                       # states it, before anything else runs

and the attributes ``name``, ``quantities`` (those it applies to), ``seeded`` (True: examples
carry ``_rows``, the seed of a row arrangement) and ``decides`` (convention options whose
choice the layout makes for the function: they keep their reference value).

``example`` is in the reference layout (time-major ``[T, N]`` arrays, ``last_values [N]``;
flat ``[n]`` arrays for the losses; see :mod:`ppo_ref.testing.quantities`). The checks hand
``fn`` fresh copies and compare them afterwards (``fn`` must not write into its inputs).
Results may be NumPy arrays, Python or NumPy scalars, or torch/JAX/TensorFlow arrays (detached
and converted); outputs must be real floats (complex, strings, objects are a mismatch).

The named layouts for GAE and V-trace (the *trajectory block* is ``rewards, values,
terminated, truncated, last_values, final_values, gamma``; V-trace puts ``behaviour_log_probs,
target_log_probs`` in front of it and passes ``rho_bar, c_bar, pg_rho_bar, lambda_`` as
keywords, GAE passes ``gae_lambda``):

``"reference"``
    ``fn`` has the signature of the ppo_ref function and returns what it returns:
    ``gae(rewards, values, terminated, truncated, last_values, final_values, *, gamma,
    gae_lambda) -> (advantages, returns)``; ``vtrace(...) -> (vs, pg_advantages)``;
    ``policy_loss(new_log_probs, old_log_probs, advantages, clip_range) -> (loss,
    d_new_log_probs, info)`` with ``info["clip_fraction"]``, ``info["approx_kl"]``;
    ``value_loss(values, old_values, returns, clip_range_vf) -> (loss, d_values)``;
    ``normalize_advantages(advantages) -> advantages``. Convention options are never passed:
    ``fn`` implements one convention, and ``convention=`` says which one it is checked against.
``"next_values"`` (tianshou, torchrl)
    ``fn(rewards, values, next_values, terminated, truncated, *, gamma, gae_lambda)`` where
    ``next_values[t] = V(s_{t+1})`` of transition t: ``final_values[t]`` where step t ended
    (terminated or truncated; at a terminal step this is the value of the terminal observation,
    junk the reference never reads), ``values[t+1]`` otherwise, ``last_values`` on the last row.
``"episode_starts"`` (CleanRL, Stable-Baselines3)
    ``fn(rewards, values, episode_starts, last_values, last_episode_starts, *, gamma,
    gae_lambda)`` where ``episode_starts[t] = done[t-1]`` (``episode_starts[0]`` is a random
    carry from the previous rollout, never read by GAE) and ``last_episode_starts = done[T-1]``
    (CleanRL's ``next_done``, SB3's ``dones`` argument of ``compute_returns_and_advantage``);
    ``done = terminated or truncated``. The flags cannot tell a truncation from a termination:
    with ``EpisodeStarts(fold_truncation_bootstrap=True)`` the rewards of steps that truncated
    without terminating carry ``+ gamma * final_values[t]`` (SB3 folds the bootstrap into the
    reward during collection); by default they do not (CleanRL).
``"dones"`` (PureJaxRL, Sample Factory, IMPALA)
    ``fn(rewards, values, dones, *, gamma, gae_lambda)`` with ``values`` ``[T+1, N]`` (the
    rollout's values, then ``last_values``) and ``dones[t] = terminated or truncated`` of
    transition t. ``Dones(fold_truncation_bootstrap=True)`` folds the truncation bootstrap into
    the rewards as above.
``"discounts"`` (rlax)
    ``fn(rewards, discounts, values, *, gae_lambda)`` (V-trace: ``lambda_``, ``rho_bar``, ...)
    with ``values`` ``[T+1, N]`` and ``discounts[t] = gamma * (1 - done[t])`` (rlax's
    ``discount_t``). GAE may return the advantages alone: ``returns = advantages + values``.
``"env_major"``
    The reference signature with every ``[T, N]`` array transposed to ``[N, T]``; results are
    ``[N, T]`` and are transposed back.
``"normalized_outputs"`` (skrl)
    The reference signature; ``fn`` returns normalized advantages
    ``(A - mean(A)) / (std(A, ddof=1) + 1e-8)`` over the whole ``[T, N]`` array (and the
    unnormalized returns): the expected advantages are normalized the same way.

Rows of one trajectory each, for GAE, the normalization and the losses:

``"masked_rows"`` (token-level PPO of LLM fine-tuning: TRL, OpenRLHF, verl)
    Batch-major ``[B, L]`` arrays and a 0/1 ``mask`` ``[B, L]`` (1.0 on valid tokens, in the
    float dtype of the data). Padding sits anywhere: before, between and after the valid
    tokens of a row (drawn; the seed 0, which failures shrink towards, is one row per
    trajectory, left-aligned, padded after); padded entries hold junk (``MaskedRows(pad_value=
    0.0)`` for code that expects zeros there). Padded entries of the outputs are not read.

    * GAE: ``fn(rewards, values, mask, *, gamma, gae_lambda) -> advantages`` (or
      ``(advantages, returns)``). Row b is one episode of the example (its valid tokens in time
      order); after its last valid token the value is 0 (the row ends), and the episode's
      bootstrap is folded into the last valid reward: ``r + gamma * final_values[t]`` where the
      episode was truncated, ``r + gamma * last_values[n]`` where the rollout cut it, nothing
      where it terminated. So ``truncation`` and ``bootstrap_terminal_last_row`` are the
      layout's (their reference values), not the function's.
    * normalization: ``fn(advantages, mask) -> advantages``, statistics over the valid
      tokens of the whole batch.
    * policy loss: ``fn(new_log_probs, old_log_probs, advantages, mask, clip_range) -> (loss,
      d_new_log_probs, info)``; value loss: ``fn(values, old_values, returns, mask,
      clip_range_vf) -> (loss, d_values)``. The example's elements are split into 1..4 rows.
      ``MaskedRows(aggregation=...)`` says how ``fn`` reduces the per-token terms ``x``, with
      ``n_b`` valid tokens in row b, ``N`` in all, ``B`` rows (the reference applies the same
      per-token weights, or the same factor, to its loss and gradient; ``clip_fraction`` and
      ``approx_kl`` carry the weights too): ``"token-mean"`` ``sum x / N`` (default);
      ``"seq-mean-token-mean"`` ``mean_b(sum_row x / n_b)`` (weights ``1 / n_b``);
      ``"token-sum"`` ``sum x``; ``"seq-mean-token-sum"`` ``sum x / B``;
      ``"seq-mean-token-sum-norm"`` ``sum x / norm`` (``norm=``; default the row length L).
``"episodes"`` (libraries that store a list of episodes)
    As ``"masked_rows"`` with each row a 1-D array of its valid entries, no mask, no padding:
    GAE ``fn(rewards, values, bootstrap_values, *, gamma, gae_lambda)`` with ``rewards`` and
    ``values`` lists of ``[n_b]`` arrays and ``bootstrap_values`` a list of floats (0.0 where
    the episode terminated; nothing is folded into the rewards), returning a list of
    advantages (or ``(advantages, returns)``); normalization ``fn(advantages)``; losses
    ``fn(new_log_probs, old_log_probs, advantages, clip_range)`` and ``fn(values, old_values,
    returns, clip_range_vf)`` with lists, gradients returned as lists. ``norm`` defaults to the
    longest episode. A function of one episode is checked with a list comprehension around it.

Every named layout but the row layouts applies to ``"gae"`` and ``"vtrace"``
(``"normalized_outputs"`` to ``"gae"`` only); the loss quantities and the normalization take
``"reference"``, ``"masked_rows"`` and ``"episodes"``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

__all__ = ["Layout", "Reference", "NextValues", "EpisodeStarts", "Dones", "Discounts",
           "EnvMajor", "NormalizedOutputs", "MaskedRows", "Episodes", "AGGREGATIONS",
           "LAYOUTS", "get_layout", "as_numpy", "BadOutput"]

_TRAJECTORY = ("gae", "vtrace")
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "token-sum", "seq-mean-token-sum",
                "seq-mean-token-sum-norm")


class BadOutput(str):
    """What is wrong with an output a layout cannot read back (the check reports it)."""


def as_numpy(x):
    """``x`` as NumPy where it is another library's array: torch tensors are detached and moved
    to the CPU, anything with ``numpy()`` (TensorFlow) or ``__array__`` (JAX) is converted;
    everything else is returned as it is."""
    if isinstance(x, (np.ndarray, np.generic, float, int, str, bytes)) or x is None:
        return x
    if callable(getattr(x, "detach", None)):
        x = x.detach()
        if callable(getattr(x, "cpu", None)):
            x = x.cpu()
    if callable(getattr(x, "numpy", None)):
        try:
            return np.asarray(x.numpy())
        except Exception:  # e.g. a dtype NumPy lacks: fall through
            pass
    if hasattr(x, "__array__"):
        try:
            return np.asarray(x)
        except Exception:
            return x
    return x


def _hyper(quantity: str, ex: Mapping[str, Any]) -> Dict[str, Any]:
    if quantity == "gae":
        return {"gae_lambda": ex["gae_lambda"]}
    return {k: ex[k] for k in ("rho_bar", "c_bar", "pg_rho_bar", "lambda_")}


def _front(quantity: str, ex: Mapping[str, Any]) -> list:
    if quantity == "vtrace":
        return [ex["behaviour_log_probs"], ex["target_log_probs"]]
    return []


def _done(ex) -> np.ndarray:
    return np.asarray(ex["terminated"], bool) | np.asarray(ex["truncated"], bool)


def _folded_rewards(ex) -> np.ndarray:
    """rewards + gamma * final_values where a step truncated without terminating."""
    term, trunc = np.asarray(ex["terminated"], bool), np.asarray(ex["truncated"], bool)
    r = ex["rewards"]
    bonus = np.where(trunc & ~term, ex["gamma"] * ex["final_values"].astype(np.float64), 0.0)
    return (r.astype(np.float64) + bonus).astype(r.dtype)


def _values_ext(ex) -> np.ndarray:
    return np.concatenate([ex["values"], ex["last_values"][None]], axis=0)


def _as_tuple(quantity: str, result) -> tuple:
    result = as_numpy(result)
    if isinstance(result, np.ndarray) or np.isscalar(result):
        return (result,)
    try:
        return tuple(result)
    except TypeError:
        raise TypeError(f"fn must return the outputs of {quantity} (a tuple of arrays), got "
                        f"{type(result).__name__}") from None


def _info(got: dict, info) -> dict:
    for key in ("clip_fraction", "approx_kl"):
        if isinstance(info, Mapping) and key in info:
            got[key] = info[key]
    return got


class Layout:
    """Base class; also the ``"reference"`` layout. Subclasses override the methods."""
    name = "reference"
    quantities: Tuple[str, ...] = ("gae", "vtrace", "policy_loss", "value_loss",
                                   "normalize_advantages")
    seeded = False
    decides: Tuple[str, ...] = ()

    def check_quantity(self, quantity: str) -> None:
        if quantity not in self.quantities:
            raise ValueError(f"layout {self.name!r} applies to {list(self.quantities)}, "
                             f"not to {quantity!r}")

    def prepare(self, quantity: str, ex: Mapping[str, Any]) -> Mapping[str, Any]:
        """The example as this layout states it (default: unchanged)."""
        return ex

    def arguments(self, quantity: str, ex: Mapping[str, Any]) -> Tuple[list, dict]:
        """``(args, kwargs)`` of the user's function for one example."""
        if quantity in _TRAJECTORY:
            args = _front(quantity, ex) + [ex["rewards"], ex["values"], ex["terminated"],
                                           ex["truncated"], ex["last_values"], ex["final_values"]]
            return args, {"gamma": ex["gamma"], **_hyper(quantity, ex)}
        if quantity == "policy_loss":
            return [ex["new_log_probs"], ex["old_log_probs"], ex["advantages"],
                    ex["clip_range"]], {}
        if quantity == "value_loss":
            return [ex["values"], ex["old_values"], ex["returns"], ex["clip_range_vf"]], {}
        return [ex["advantages"]], {}

    def outputs(self, quantity: str, result, ex: Mapping[str, Any]) -> Dict[str, Any]:
        """The user's result as ``{output name: value}`` in the reference layout. Outputs the
        function does not produce are left out (the check then reports them as missing unless
        they are skipped)."""
        if quantity == "gae":
            out = _as_tuple(quantity, result)
            adv = as_numpy(out[0])
            if len(out) > 1:
                return {"advantages": adv, "returns": out[1]}
            try:
                ret = np.asarray(adv, np.float64) + np.asarray(ex["values"], np.float64)
            except (TypeError, ValueError):
                ret = adv  # not numbers: reported with the advantages
            return {"advantages": adv, "returns": ret}
        if quantity == "vtrace":
            return dict(zip(("vs", "pg_advantages"), _as_tuple(quantity, result)))
        if quantity == "policy_loss":
            out = _as_tuple(quantity, result)
            got = dict(zip(("loss", "d_new_log_probs"), out[:2]))
            return _info(got, out[2] if len(out) > 2 else {})
        if quantity == "value_loss":
            return dict(zip(("loss", "d_values"), _as_tuple(quantity, result)))
        return {"advantages": result}

    def expected(self, quantity: str, reference: Dict[str, Any],
                 ex: Mapping[str, Any]) -> Dict[str, Any]:
        """The reference outputs as this layout's function should return them (default:
        unchanged)."""
        return reference

    def __repr__(self) -> str:
        return f"<layout {self.name!r}>"


Reference = Layout


class NextValues(Layout):
    name = "next_values"
    quantities = _TRAJECTORY

    def arguments(self, quantity, ex):
        done = _done(ex)
        following = np.concatenate([ex["values"][1:], ex["last_values"][None]], axis=0)
        next_values = np.where(done, ex["final_values"], following).astype(ex["values"].dtype)
        args = _front(quantity, ex) + [ex["rewards"], ex["values"], next_values,
                                       ex["terminated"], ex["truncated"]]
        return args, {"gamma": ex["gamma"], **_hyper(quantity, ex)}


class EpisodeStarts(Layout):
    name = "episode_starts"
    quantities = _TRAJECTORY

    def __init__(self, fold_truncation_bootstrap: bool = False, carry: bool = True):
        self.fold_truncation_bootstrap = fold_truncation_bootstrap
        self.carry = carry

    def arguments(self, quantity, ex):
        done = _done(ex)
        starts = np.empty_like(done)
        starts[1:] = done[:-1]
        starts[0] = self.carry
        rewards = _folded_rewards(ex) if self.fold_truncation_bootstrap else ex["rewards"]
        args = _front(quantity, ex) + [rewards, ex["values"], starts, ex["last_values"],
                                       done[-1].copy()]
        return args, {"gamma": ex["gamma"], **_hyper(quantity, ex)}


class Dones(Layout):
    name = "dones"
    quantities = _TRAJECTORY

    def __init__(self, fold_truncation_bootstrap: bool = False):
        self.fold_truncation_bootstrap = fold_truncation_bootstrap

    def arguments(self, quantity, ex):
        rewards = _folded_rewards(ex) if self.fold_truncation_bootstrap else ex["rewards"]
        args = _front(quantity, ex) + [rewards, _values_ext(ex), _done(ex)]
        return args, {"gamma": ex["gamma"], **_hyper(quantity, ex)}


class Discounts(Layout):
    name = "discounts"
    quantities = _TRAJECTORY

    def arguments(self, quantity, ex):
        dtype = ex["rewards"].dtype
        discounts = (ex["gamma"] * (1.0 - _done(ex).astype(np.float64))).astype(dtype)
        args = _front(quantity, ex) + [ex["rewards"], discounts, _values_ext(ex)]
        return args, _hyper(quantity, ex)


def _transpose(x):
    x = as_numpy(x)
    return x.T if isinstance(x, np.ndarray) and x.ndim == 2 else x


class EnvMajor(Layout):
    name = "env_major"
    quantities = _TRAJECTORY

    def arguments(self, quantity, ex):
        args, kwargs = Layout.arguments(self, quantity, ex)
        return [np.ascontiguousarray(_transpose(a)) if isinstance(a, np.ndarray) else a
                for a in args], kwargs

    def outputs(self, quantity, result, ex):
        back = tuple(_transpose(o) for o in _as_tuple(quantity, result))
        return Layout.outputs(self, quantity, back, ex)


class NormalizedOutputs(Layout):
    name = "normalized_outputs"
    quantities = ("gae",)

    def __init__(self, ddof: int = 1, eps: float = 1e-8):
        self.ddof = ddof
        self.eps = eps

    def expected(self, quantity, reference, ex):
        from ppo_ref.spec.losses import normalize_advantages
        out = dict(reference)
        out["advantages"] = normalize_advantages(reference["advantages"], ddof=self.ddof,
                                                 eps=self.eps)
        return out


#: The flat inputs of each row quantity, in argument order.
_ROW_INPUTS = {"normalize_advantages": ("advantages",),
               "policy_loss": ("new_log_probs", "old_log_probs", "advantages"),
               "value_loss": ("values", "old_values", "returns")}
_SCALAR = {"policy_loss": "clip_range", "value_loss": "clip_range_vf"}


def _episodes(ex) -> List[Tuple[int, int, int, float]]:
    """``(env, first row, end row, bootstrap)`` of every episode, env by env in time order;
    the bootstrap is 0 where it terminated, ``final_values`` where it truncated, and
    ``last_values`` where the rollout cut it (the reference convention's reading)."""
    term, trunc = np.asarray(ex["terminated"], bool), np.asarray(ex["truncated"], bool)
    ends = term | trunc
    ends[-1] = True
    out = []
    for n in range(term.shape[1]):
        start = 0
        for t in np.flatnonzero(ends[:, n]).tolist():
            b = (0.0 if term[t, n] else float(ex["final_values"][t, n]) if trunc[t, n]
                 else float(ex["last_values"][n]))
            out.append((n, start, t + 1, b))
            start = t + 1
    return out


def _split(n: int, seed: int) -> List[np.ndarray]:
    """Consecutive runs of ``range(n)``: one for seed 0, else 1..4 drawn from the seed."""
    if seed == 0 or n == 1:
        return [np.arange(n)]
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, n), int(rng.integers(0, min(n, 4))), replace=False))
    return np.split(np.arange(n), cuts)


def _columns(lengths: List[int], seed: int) -> Tuple[List[np.ndarray], int]:
    """The columns of each row's valid tokens and the row length L: left-aligned for seed 0,
    else 0..2 padding entries before each token and 0..2 after the longest row."""
    if seed == 0:
        return [np.arange(m) for m in lengths], max(lengths)
    rng = np.random.default_rng([seed, 1])
    cols = [np.cumsum(rng.choice([0, 0, 1, 2], size=m) + 1) - 1 for m in lengths]
    return cols, max(int(c[-1]) + 1 for c in cols) + int(rng.integers(0, 3))


class MaskedRows(Layout):
    name = "masked_rows"
    quantities = ("gae", "normalize_advantages", "policy_loss", "value_loss")
    seeded = True
    decides = ("truncation", "bootstrap_terminal_last_row")

    def __init__(self, aggregation: str = "token-mean", norm: Optional[float] = None,
                 pad_value: Optional[float] = None):
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {list(AGGREGATIONS)}, got "
                             f"{aggregation!r}")
        if norm is not None and not norm > 0:
            raise ValueError(f"norm must be > 0, got {norm!r}")
        self.aggregation, self.norm, self.pad_value = aggregation, norm, pad_value

    # -- the arrangement -------------------------------------------------------------------
    def rows(self, quantity: str, ex) -> Tuple[list, Optional[list]]:
        """``(indices, bootstraps)``: per row, the index of its entries in the reference
        arrays (``arr[index]``), and for GAE each row's bootstrap value."""
        if quantity == "gae":
            eps = _episodes(ex)
            return [(np.arange(t0, t1), n) for n, t0, t1, _ in eps], [b for *_, b in eps]
        size = int(np.asarray(ex[_ROW_INPUTS[quantity][0]]).size)
        return [(idx,) for idx in _split(size, int(ex.get("_rows", 0)))], None

    def _grid(self, rows, ex):
        return _columns([len(r[0]) for r in rows], int(ex.get("_rows", 0)))

    def _default_norm(self, rows, ex) -> float:
        return float(self._grid(rows, ex)[1])

    def prepare(self, quantity, ex):
        if quantity not in _SCALAR or self.aggregation == "token-mean":
            return ex
        rows, _ = self.rows(quantity, ex)
        n, B = sum(len(r[0]) for r in rows), len(rows)
        if self.aggregation == "seq-mean-token-mean":
            first = np.asarray(ex[_ROW_INPUTS[quantity][0]])
            w = np.empty(first.shape, first.dtype)
            for r in rows:
                w[r] = 1.0 / len(r[0])
            return {**ex, "weights": w}
        norm = self.norm or self._default_norm(rows, ex)
        scale = {"token-sum": n, "seq-mean-token-sum": n / B,
                 "seq-mean-token-sum-norm": n / norm}[self.aggregation]
        return {**ex, "loss_scale": float(scale)}

    # -- inputs ----------------------------------------------------------------------------
    def _pack(self, arr, rows, cols, L, seed):
        arr = np.asarray(arr)
        if self.pad_value is None:
            out = np.random.default_rng([seed, 2]).choice([7.0, -3.0, 5.0, -2.0],
                                                         (len(rows), L)).astype(arr.dtype)
        else:
            out = np.full((len(rows), L), self.pad_value, dtype=arr.dtype)
        for b, (r, c) in enumerate(zip(rows, cols)):
            out[b, c] = arr[r]
        return out

    def arguments(self, quantity, ex):
        rows, boot = self.rows(quantity, ex)
        cols, L = self._grid(rows, ex)
        seed = int(ex.get("_rows", 0))
        first = "rewards" if quantity == "gae" else _ROW_INPUTS[quantity][0]
        mask = np.zeros((len(rows), L), np.asarray(ex[first]).dtype)
        for b, c in enumerate(cols):
            mask[b, c] = 1.0
        if quantity == "gae":
            rewards = self._pack(ex["rewards"], rows, cols, L, seed)
            for b, c in enumerate(cols):  # the bootstrap, folded into the last valid reward
                rewards[b, c[-1]] = float(rewards[b, c[-1]]) + float(ex["gamma"]) * boot[b]
            return [rewards, self._pack(ex["values"], rows, cols, L, seed), mask], {
                "gamma": ex["gamma"], "gae_lambda": ex["gae_lambda"]}
        args = [self._pack(ex[k], rows, cols, L, seed) for k in _ROW_INPUTS[quantity]]
        return args + [mask] + ([ex[_SCALAR[quantity]]] if quantity in _SCALAR else []), {}

    # -- outputs ---------------------------------------------------------------------------
    def _unpack(self, value, rows, cols, L, shape):
        """A ``[B, L]`` result read back into the reference layout ``shape``."""
        arr = as_numpy(value)
        try:
            arr = np.asarray(arr)
        except Exception:
            return BadOutput(f"not an array ({type(value).__name__})")
        if arr.shape != (len(rows), L):
            return BadOutput(f"shape {arr.shape}, expected the mask's {(len(rows), L)}")
        out = np.empty(shape, arr.dtype)
        for b, (r, c) in enumerate(zip(rows, cols)):
            out[r] = arr[b, c]
        return out

    def _read(self, quantity, value, ex, rows):
        cols, L = self._grid(rows, ex)
        key = "rewards" if quantity == "gae" else _ROW_INPUTS[quantity][0]
        return self._unpack(value, rows, cols, L, np.shape(ex[key]))

    def outputs(self, quantity, result, ex):
        rows, _ = self.rows(quantity, ex)
        if quantity == "normalize_advantages":
            return {"advantages": self._read(quantity, result, ex, rows)}
        out = list(_as_tuple(quantity, result))
        for i in (0, 1) if quantity == "gae" else (1,):  # the per-token outputs
            if i < len(out):
                out[i] = self._read(quantity, out[i], ex, rows)
        return Layout.outputs(self, quantity, tuple(out), ex)


class Episodes(MaskedRows):
    name = "episodes"

    def _default_norm(self, rows, ex) -> float:
        return float(max(len(r[0]) for r in rows))

    def arguments(self, quantity, ex):
        rows, boot = self.rows(quantity, ex)
        if quantity == "gae":
            return [[np.asarray(ex["rewards"])[r].copy() for r in rows],
                    [np.asarray(ex["values"])[r].copy() for r in rows], list(boot)], {
                "gamma": ex["gamma"], "gae_lambda": ex["gae_lambda"]}
        args = [[np.asarray(ex[k])[r].copy() for r in rows] for k in _ROW_INPUTS[quantity]]
        return args + ([ex[_SCALAR[quantity]]] if quantity in _SCALAR else []), {}

    def outputs(self, quantity, result, ex):
        if quantity == "gae" and not isinstance(result, tuple):
            result = (result,)  # a list of advantages
        return MaskedRows.outputs(self, quantity, result, ex)

    def _read(self, quantity, value, ex, rows):
        key = "rewards" if quantity == "gae" else _ROW_INPUTS[quantity][0]
        value = as_numpy(value)
        if isinstance(value, np.ndarray) and value.dtype != object and value.ndim < 2:
            return BadOutput(f"a {value.ndim}-d array, expected a list of {len(rows)} arrays")
        try:
            parts = [np.asarray(as_numpy(p)) for p in value]
        except Exception:
            return BadOutput(f"not a list of arrays ({type(value).__name__})")
        if [p.shape for p in parts] != [(len(r[0]),) for r in rows]:
            return BadOutput(f"shapes {[p.shape for p in parts]}, expected "
                             f"{[(len(r[0]),) for r in rows]}")
        out = np.empty(np.shape(ex[key]), np.result_type(*parts))
        for r, p in zip(rows, parts):
            out[r] = p
        return out


LAYOUTS: Dict[str, Layout] = {
    "reference": Layout(), "next_values": NextValues(), "episode_starts": EpisodeStarts(),
    "dones": Dones(), "discounts": Discounts(), "env_major": EnvMajor(),
    "normalized_outputs": NormalizedOutputs(), "masked_rows": MaskedRows(),
    "episodes": Episodes(),
}


def get_layout(layout: Union[str, Layout], quantity: str) -> Layout:
    """The layout object for a name (or ``layout`` itself), checked against ``quantity``."""
    if isinstance(layout, str):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {list(LAYOUTS)} or a Layout object, got "
                             f"{layout!r}")
        layout = LAYOUTS[layout]
    elif not all(hasattr(layout, m) for m in ("arguments", "outputs", "expected")):
        raise ValueError("layout must be a name or an object with arguments(), outputs() and "
                         f"expected() methods, got {type(layout).__name__}")
    check = getattr(layout, "check_quantity", None)
    if check is not None:
        check(quantity)
    return layout
