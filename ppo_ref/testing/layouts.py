"""Input layouts: how an example (reference layout, :mod:`ppo_ref.testing.quantities`) is handed
to the user's function ``fn`` and how its results are read back (:class:`Layout` says how to
write one). Results may be NumPy arrays or scalars, or torch/JAX/TensorFlow arrays (converted,
:func:`as_numpy`); outputs must be real floats.

GAE and V-trace (the *trajectory block* ``rewards, values, terminated, truncated, last_values,
final_values`` with ``gamma``; V-trace puts ``behaviour_log_probs, target_log_probs`` in front and
takes ``rho_bar, c_bar, pg_rho_bar, lambda_`` as keywords where GAE takes ``gae_lambda``):

``"reference"``
    ``fn`` has the signature of the ppo_ref function and returns what it returns (``gae ->
    (advantages, returns)``, ``vtrace -> (vs, pg_advantages)``, ``policy_loss(new_log_probs,
    old_log_probs, advantages, clip_range) -> (loss, d_new_log_probs, info)`` with
    ``info["clip_fraction"]``, ``info["approx_kl"]``, ``value_loss(values, old_values, returns,
    clip_range_vf) -> (loss, d_values)``, ``normalize_advantages(advantages)``); convention
    options are never passed.
``"next_values"`` (tianshou, torchrl)
    ``fn(rewards, values, next_values, terminated, truncated, *, gamma, gae_lambda)``,
    ``next_values[t]`` = ``final_values[t]`` where step t ended (junk where it terminated),
    ``values[t+1]`` otherwise, ``last_values`` on the last row.
``"episode_starts"`` (CleanRL, Stable-Baselines3)
    ``fn(rewards, values, episode_starts, last_values, last_episode_starts, *, gamma,
    gae_lambda)``, ``episode_starts[t] = done[t-1]`` (``[0]`` a carry GAE never reads),
    ``last_episode_starts = done[T-1]`` (CleanRL's ``next_done``, SB3's ``dones``), ``done =
    terminated or truncated``. ``EpisodeStarts(fold_truncation_bootstrap=True)`` adds ``gamma *
    final_values[t]`` to the reward of a step that truncated without terminating (SB3).
``"dones"`` (PureJaxRL, Sample Factory, IMPALA)
    ``fn(rewards, values, dones, *, gamma, gae_lambda)``, ``values`` ``[T+1, N]`` (then
    ``last_values``), ``dones[t] = done[t]``; ``Dones(fold_truncation_bootstrap=True)`` as above.
``"discounts"`` (rlax)
    ``fn(rewards, discounts, values, *, gae_lambda)`` (V-trace: ``lambda_``, ...), ``values``
    ``[T+1, N]``, ``discounts[t] = gamma * (1 - done[t])``; GAE may return the advantages alone
    (``returns = advantages + values``).
``"env_major"``
    The reference signature with every ``[T, N]`` array as ``[N, T]``, results too.
``"normalized_outputs"`` (skrl; GAE only)
    The reference signature; the advantages come back normalized over the whole array,
    ``(A - mean) / (std(ddof=1) + 1e-8)`` (:func:`ppo_ref.spec.losses.normalize_advantages`).

Rows of one trajectory each (GAE, the normalization, the losses):

``"masked_rows"`` (token-level PPO: TRL, OpenRLHF, verl)
    ``[B, L]`` arrays and a 0/1 ``mask`` (1.0 on valid tokens, in the data's float dtype);
    padding before, between and after a row's valid tokens (seed 0, where failures shrink to:
    left-aligned, padded after) holds junk (``MaskedRows(pad_value=0.0)`` for zeros) and is
    not read back. GAE ``fn(rewards, values, mask, *, gamma, gae_lambda) -> advantages`` (or
    ``(advantages, returns)``): a row is one episode, its bootstrap folded into its last valid
    reward (``gamma * final_values[t]`` if truncated, ``gamma * last_values[n]`` if the rollout
    cut it), so ``truncation`` and ``bootstrap_terminal_last_row`` are the layout's.
    Normalization ``fn(advantages, mask)`` (statistics over every valid token); losses
    ``fn(new_log_probs, old_log_probs, advantages, mask, clip_range)`` and ``fn(values,
    old_values, returns, mask, clip_range_vf)``, the elements split into 1..4 rows.
    ``MaskedRows(aggregation=...)``: how ``fn`` reduces per-token terms, a row being a
    sequence (default ``"token-mean"``; ``norm=``: the constant of
    ``"seq-mean-token-sum-norm"``, default L): the option ``loss_aggregation``, each defined
    by :func:`ppo_ref.spec.update.aggregation_weights`, computed over the example's rows
    (clip_fraction and approx_kl stay means, under the sequence weights for
    ``"seq-mean-token-mean"``); ``aggregation=None`` leaves it to the convention
    (``identify`` then searches it).
``"episodes"``
    As ``"masked_rows"`` with each row a 1-D array of its valid entries (lists, no mask):
    GAE ``fn(rewards, values, bootstrap_values, *, gamma, gae_lambda)`` (``bootstrap_values``
    one float per episode, 0.0 where it terminated; nothing folded) returning a list (or
    ``(advantages, returns)``); ``fn(advantages)``; the losses without ``mask``, gradients
    as lists; ``norm`` defaults to the longest episode.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from ppo_ref.spec.losses import normalize_advantages
from ppo_ref.spec.update import LOSS_AGGREGATIONS

__all__ = ["Layout", "Reference", "NextValues", "EpisodeStarts", "Dones", "Discounts",
           "EnvMajor", "NormalizedOutputs", "MaskedRows", "Episodes", "AGGREGATIONS",
           "LAYOUTS", "get_layout", "as_numpy", "BadOutput"]

_TRAJECTORY = ("gae", "vtrace")
_VTRACE_HYPER = ("rho_bar", "c_bar", "pg_rho_bar", "lambda_")
_TRAJECTORY_BLOCK = ("rewards", "values", "terminated", "truncated", "last_values",
                     "final_values")
#: The positional results of each quantity's reference function.
_RESULTS = {"gae": ("advantages", "returns"), "vtrace": ("vs", "pg_advantages"),
            "policy_loss": ("loss", "d_new_log_probs"), "value_loss": ("loss", "d_values")}
#: The arrays of each row quantity, in argument order (the first gives the outputs' shape), and
#: the scalar after them.
_ROW_INPUTS = {"gae": ("rewards", "values"), "normalize_advantages": ("advantages",),
               "policy_loss": ("new_log_probs", "old_log_probs", "advantages"),
               "value_loss": ("values", "old_values", "returns")}
_SCALAR = {"policy_loss": "clip_range", "value_loss": "clip_range_vf"}
AGGREGATIONS = LOSS_AGGREGATIONS


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


def _trajectory_call(quantity: str, ex: Mapping[str, Any], block: list,
                     gamma: bool = True) -> Tuple[list, dict]:
    """``(args, kwargs)``: V-trace's log-probs, then ``block``; ``gamma`` (unless ``False``: the
    block carries it) and the quantity's hyperparameters as keywords."""
    if quantity == "gae":
        front, keys = [], ("gae_lambda",)
    else:
        front, keys = [ex["behaviour_log_probs"], ex["target_log_probs"]], _VTRACE_HYPER
    return front + block, {k: ex[k] for k in (("gamma",) if gamma else ()) + keys}


def _after_rows(quantity: str, ex: Mapping[str, Any]) -> Tuple[list, dict]:
    """The arguments after a row quantity's arrays: a loss's clip range, GAE's keywords."""
    if quantity == "gae":
        return [], {"gamma": ex["gamma"], "gae_lambda": ex["gae_lambda"]}
    return ([ex[_SCALAR[quantity]]] if quantity in _SCALAR else []), {}


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


class Layout:
    """Base class of the layouts, and the ``"reference"`` layout.

    A layout (a subclass, or any object with ``arguments``, ``outputs`` and ``expected``) has
    the methods below and the attributes ``name``, ``quantities`` (those it applies to),
    ``seeded`` (examples carry ``_rows``, the seed of a row arrangement) and ``decides``
    (convention options the layout fixes at their reference value; or a method
    ``decided_options() -> {option: value}``). A layout without rows (not ``seeded``) passes a
    loss as one sequence: :func:`~ppo_ref.testing.identify` does not search its
    ``loss_aggregation`` there (a check takes the convention's)."""
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
        """The example as this layout states it (optional; default: unchanged)."""
        return ex

    def arguments(self, quantity: str, ex: Mapping[str, Any]) -> Tuple[list, dict]:
        """``(args, kwargs)`` of the user's function for one example: ``fn(*args, **kwargs)``."""
        if quantity in _TRAJECTORY:
            return _trajectory_call(quantity, ex, [ex[k] for k in _TRAJECTORY_BLOCK])
        return [ex[k] for k in _ROW_INPUTS[quantity]] + _after_rows(quantity, ex)[0], {}

    def outputs(self, quantity: str, result, ex: Mapping[str, Any]) -> Dict[str, Any]:
        """The user's result as ``{output name: value}`` in the reference layout; outputs the
        function does not produce are left out (reported as missing unless skipped)."""
        if quantity == "normalize_advantages":
            return {"advantages": result}
        out = _as_tuple(quantity, result)
        if quantity == "gae" and len(out) < 2:  # the advantages alone
            adv = as_numpy(out[0])
            try:
                ret = np.asarray(adv, np.float64) + np.asarray(ex["values"], np.float64)
            except (TypeError, ValueError):
                ret = adv  # not numbers: reported with the advantages
            return {"advantages": adv, "returns": ret}
        got = dict(zip(_RESULTS[quantity], out))
        info = out[2] if quantity == "policy_loss" and len(out) > 2 else None
        if isinstance(info, Mapping):
            got.update({k: info[k] for k in ("clip_fraction", "approx_kl") if k in info})
        return got

    def expected(self, quantity: str, reference: Dict[str, Any],
                 ex: Mapping[str, Any]) -> Dict[str, Any]:
        """The reference outputs ``{name: value}`` to compare with (default: unchanged)."""
        return reference

    def __repr__(self) -> str:
        return f"<layout {self.name!r}>"


Reference = Layout


class NextValues(Layout):
    name = "next_values"
    quantities = _TRAJECTORY

    def arguments(self, quantity, ex):
        done = _done(ex)
        following = _values_ext(ex)[1:]  # values[t + 1], last_values on the last row
        next_values = np.where(done, ex["final_values"], following).astype(ex["values"].dtype)
        return _trajectory_call(quantity, ex, [ex["rewards"], ex["values"], next_values,
                                               ex["terminated"], ex["truncated"]])


class EpisodeStarts(Layout):
    name = "episode_starts"
    quantities = _TRAJECTORY

    def __init__(self, fold_truncation_bootstrap: bool = False, carry: bool = True):
        self.fold_truncation_bootstrap, self.carry = fold_truncation_bootstrap, carry

    def arguments(self, quantity, ex):
        done = _done(ex)
        starts = np.empty_like(done)
        starts[1:] = done[:-1]
        starts[0] = self.carry
        rewards = _folded_rewards(ex) if self.fold_truncation_bootstrap else ex["rewards"]
        return _trajectory_call(quantity, ex, [rewards, ex["values"], starts, ex["last_values"],
                                               done[-1].copy()])


class Dones(Layout):
    name = "dones"
    quantities = _TRAJECTORY

    def __init__(self, fold_truncation_bootstrap: bool = False):
        self.fold_truncation_bootstrap = fold_truncation_bootstrap

    def arguments(self, quantity, ex):
        rewards = _folded_rewards(ex) if self.fold_truncation_bootstrap else ex["rewards"]
        return _trajectory_call(quantity, ex, [rewards, _values_ext(ex), _done(ex)])


class Discounts(Layout):
    name = "discounts"
    quantities = _TRAJECTORY

    def arguments(self, quantity, ex):
        dtype = ex["rewards"].dtype
        discounts = (ex["gamma"] * (1.0 - _done(ex).astype(np.float64))).astype(dtype)
        return _trajectory_call(quantity, ex, [ex["rewards"], discounts, _values_ext(ex)],
                                gamma=False)


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
        self.ddof, self.eps = ddof, eps

    def expected(self, quantity, reference, ex):
        return {**reference, "advantages": normalize_advantages(reference["advantages"],
                                                                ddof=self.ddof, eps=self.eps)}


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

    def __init__(self, aggregation: Optional[str] = "token-mean", norm: Optional[float] = None,
                 pad_value: Optional[float] = None):
        if aggregation is not None and aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {list(AGGREGATIONS)} or None, got "
                             f"{aggregation!r}")
        if norm is not None and not norm > 0:
            raise ValueError(f"norm must be > 0, got {norm!r}")
        self.aggregation, self.norm, self.pad_value = aggregation, norm, pad_value

    def decided_options(self) -> Dict[str, Any]:
        """The options this layout fixes (module docstring, ``"masked_rows"``)."""
        out: Dict[str, Any] = {"truncation": "bootstrap", "bootstrap_terminal_last_row": False}
        if self.aggregation is not None:
            out["loss_aggregation"] = self.aggregation
        return out

    # -- the arrangement -------------------------------------------------------------------
    def rows(self, quantity: str, ex) -> Tuple[list, Optional[list]]:
        """``(indices, bootstraps)``: per row, the index of its entries in the reference
        arrays (``arr[index]``), and for GAE each row's bootstrap value."""
        if quantity == "gae":
            eps = _episodes(ex)
            return [(np.arange(t0, t1), n) for n, t0, t1, _ in eps], [b for *_, b in eps]
        size = np.asarray(ex[_ROW_INPUTS[quantity][0]]).size
        return [(idx,) for idx in _split(size, int(ex.get("_rows", 0)))], None

    def _grid(self, rows, ex):
        return _columns([len(r[0]) for r in rows], int(ex.get("_rows", 0)))

    def _default_norm(self, rows, ex) -> float:
        return float(self._grid(rows, ex)[1])

    def prepare(self, quantity, ex):
        """A loss example with its rows for the reference's aggregation: ``_sequences`` (the row
        of every element) and ``_norm`` (``norm=``, default the row length ``L``)."""
        if quantity not in _SCALAR:
            return ex
        rows, _ = self.rows(quantity, ex)
        sequences = np.empty(np.asarray(ex[_ROW_INPUTS[quantity][0]]).size, np.int64)
        for b, r in enumerate(rows):
            sequences[r[0]] = b
        return {**ex, "_sequences": sequences,
                "_norm": float(self.norm or self._default_norm(rows, ex))}

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
        args = [self._pack(ex[k], rows, cols, L, seed) for k in _ROW_INPUTS[quantity]]
        mask = np.zeros_like(args[0])
        for b, c in enumerate(cols):
            mask[b, c] = 1.0
            if boot is not None:  # GAE: the bootstrap, folded into the last valid reward
                args[0][b, c[-1]] = float(args[0][b, c[-1]]) + float(ex["gamma"]) * boot[b]
        tail, keywords = _after_rows(quantity, ex)
        return args + [mask] + tail, keywords

    # -- outputs ---------------------------------------------------------------------------
    def _read(self, quantity, value, ex, rows):
        """A ``[B, L]`` result read back into the reference layout."""
        cols, L = self._grid(rows, ex)
        arr = as_numpy(value)
        try:
            arr = np.asarray(arr)
        except Exception:
            return BadOutput(f"not an array ({type(value).__name__})")
        if arr.shape != (len(rows), L):
            return BadOutput(f"shape {arr.shape}, expected the mask's {(len(rows), L)}")
        out = np.empty(np.shape(ex[_ROW_INPUTS[quantity][0]]), arr.dtype)
        for b, (r, c) in enumerate(zip(rows, cols)):
            out[r] = arr[b, c]
        return out

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
        args = [[np.asarray(ex[k])[r].copy() for r in rows] for k in _ROW_INPUTS[quantity]]
        tail, keywords = _after_rows(quantity, ex)
        return args + ([list(boot)] if boot is not None else []) + tail, keywords

    def outputs(self, quantity, result, ex):
        if quantity == "gae" and not isinstance(result, tuple):
            result = (result,)  # a list of advantages
        return MaskedRows.outputs(self, quantity, result, ex)

    def _read(self, quantity, value, ex, rows):
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
        out = np.empty(np.shape(ex[_ROW_INPUTS[quantity][0]]), np.result_type(*parts))
        for r, p in zip(rows, parts):
            out[r] = p
        return out


LAYOUTS: Dict[str, Layout] = {
    "reference": Layout(), "next_values": NextValues(), "episode_starts": EpisodeStarts(),
    "dones": Dones(), "discounts": Discounts(), "env_major": EnvMajor(),
    "normalized_outputs": NormalizedOutputs(), "masked_rows": MaskedRows(), "episodes": Episodes()}


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
