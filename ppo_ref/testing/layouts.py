"""Input layouts: how an example in the reference layout is handed to the user's function and
how its results are read back.

A layout is an object with three methods (subclass :class:`Layout` to write your own)::

    arguments(quantity, example) -> (args, kwargs)     # fn(*args, **kwargs) is called
    outputs(quantity, result, example) -> {name: value}  # fn's result, reference names/shapes
    expected(quantity, reference, example) -> {name: value}  # the reference outputs to compare
                                                             # with (default: unchanged)

``example`` is in the reference layout (time-major ``[T, N]`` arrays, ``last_values [N]``;
see :mod:`ppo_ref.testing.quantities`). The named layouts for GAE and V-trace (the
*trajectory block* is ``rewards, values, terminated, truncated, last_values, final_values,
gamma``; V-trace puts ``behaviour_log_probs, target_log_probs`` in front of it and passes
``rho_bar, c_bar, pg_rho_bar, lambda_`` as keywords, GAE passes ``gae_lambda``):

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

Every named layout applies to ``"gae"`` and ``"vtrace"`` (``"normalized_outputs"`` to
``"gae"`` only); the loss quantities take ``"reference"`` only.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple, Union

import numpy as np

__all__ = ["Layout", "Reference", "NextValues", "EpisodeStarts", "Dones", "Discounts",
           "EnvMajor", "NormalizedOutputs", "LAYOUTS", "get_layout"]

_TRAJECTORY = ("gae", "vtrace")


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
    if isinstance(result, np.ndarray) or np.isscalar(result):
        return (result,)
    try:
        return tuple(result)
    except TypeError:
        raise TypeError(f"fn must return the outputs of {quantity} (a tuple of arrays), got "
                        f"{type(result).__name__}") from None


class Layout:
    """Base class; also the ``"reference"`` layout. Subclasses override the three methods.

    ``quantities``: the quantities this layout applies to.
    """
    name = "reference"
    quantities: Tuple[str, ...] = ("gae", "vtrace", "policy_loss", "value_loss",
                                   "normalize_advantages")

    def check_quantity(self, quantity: str) -> None:
        if quantity not in self.quantities:
            raise ValueError(f"layout {self.name!r} applies to {list(self.quantities)}, "
                             f"not to {quantity!r}")

    # -- inputs ------------------------------------------------------------------------------
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

    # -- outputs -----------------------------------------------------------------------------
    def outputs(self, quantity: str, result, ex: Mapping[str, Any]) -> Dict[str, Any]:
        """The user's result as ``{output name: value}`` in the reference layout. Outputs the
        function does not produce are left out (the check then reports them as missing unless
        they are skipped)."""
        if quantity == "gae":
            out = _as_tuple(quantity, result)
            adv = out[0]
            ret = out[1] if len(out) > 1 else np.asarray(adv, np.float64) + np.asarray(
                ex["values"], np.float64)
            return {"advantages": adv, "returns": ret}
        if quantity == "vtrace":
            out = _as_tuple(quantity, result)
            return dict(zip(("vs", "pg_advantages"), out))
        if quantity == "policy_loss":
            out = _as_tuple(quantity, result)
            got = dict(zip(("loss", "d_new_log_probs"), out[:2]))
            info = out[2] if len(out) > 2 else {}
            for key in ("clip_fraction", "approx_kl"):
                if isinstance(info, Mapping) and key in info:
                    got[key] = info[key]
            return got
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
    return x.T if isinstance(x, np.ndarray) and x.ndim == 2 else x


class EnvMajor(Layout):
    name = "env_major"
    quantities = _TRAJECTORY

    def arguments(self, quantity, ex):
        args, kwargs = Layout.arguments(self, quantity, ex)
        return [np.ascontiguousarray(_transpose(a)) if isinstance(a, np.ndarray) else a
                for a in args], kwargs

    def outputs(self, quantity, result, ex):
        out = _as_tuple(quantity, result)
        back = tuple(_transpose(np.asarray(o)) for o in out)
        return Layout.outputs(self, quantity, back, ex)


class NormalizedOutputs(Layout):
    name = "normalized_outputs"
    quantities = ("gae",)

    def __init__(self, ddof: int = 1, eps: float = 1e-8):
        self.ddof = ddof
        self.eps = eps

    def expected(self, quantity, reference, ex):
        from ppo_ref.losses import normalize_advantages
        out = dict(reference)
        out["advantages"] = normalize_advantages(reference["advantages"], ddof=self.ddof,
                                                 eps=self.eps)
        return out


LAYOUTS: Dict[str, Layout] = {
    "reference": Layout(), "next_values": NextValues(), "episode_starts": EpisodeStarts(),
    "dones": Dones(), "discounts": Discounts(), "env_major": EnvMajor(),
    "normalized_outputs": NormalizedOutputs(),
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
