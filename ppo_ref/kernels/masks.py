"""Episode-boundary masks: ``episode_starts`` and the per-step transition flags.

Vocabulary (SPEC §1). For the transition taken at step ``t``:

* ``terminated[t]``: a true terminal state was reached; nothing is bootstrapped.
* ``truncated[t]``: the episode was cut (time limit); bootstrap from ``V(final_obs[t])``.
  When both flags are set on one step, termination wins.
* ``done[t] = terminated[t] or truncated[t]`` (an internal word, never a public argument name):
  the next row belongs to another episode, so the lambda-trace is cut.
* ``episode_starts[t] = done[t-1]`` for ``t >= 1``; ``episode_starts[0]`` is the carry from the
  previous rollout.

Two masks, deliberately distinct: the **bootstrap mask** is ``terminated`` alone (truncation
keeps the bootstrap, from the right state) and the **reset mask** is ``episode_starts`` (from
either flag).

The convention option ``truncation`` selects how ``truncated`` is read, so that other
implementations can be reproduced exactly:

* ``"bootstrap"`` (SPEC, SB3, sb3-contrib): bootstrap ``final_values[t]``, cut the trace.
* ``"terminate"`` (CleanRL): treated as terminated: no bootstrap, cut the trace.
* ``"ignore"`` (thrust-rl 0.4): the flag is not read: bootstrap the next row, the trace runs on.

``_kernels._transition_flags`` is the one place where this rule is written; the GAE and V-trace
kernels call it for every step.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ppo_ref._checks import as_flag_array, check_choice
from ppo_ref.kernels._kernels import TRUNCATION_MODES, _transition_masks_kernel

__all__ = ["episode_starts", "transition_masks", "TransitionMasks", "TRUNCATION_MODES"]


class TransitionMasks(NamedTuple):
    """Per-step masks derived from ``terminated``/``truncated`` (all bool, same shape).

    ``terminal``: next value is 0. ``bootstrap_final``: next value is ``final_values``.
    ``done``: the lambda-trace is cut after the step (``episode_starts`` of the next row).
    """

    terminal: np.ndarray
    bootstrap_final: np.ndarray
    done: np.ndarray


def transition_masks(terminated, truncated, truncation: str = "bootstrap") -> TransitionMasks:
    """The bootstrap masks and the ``done`` (trace-cut) mask of every step.

    Args:
        terminated: ``[T]`` or ``[T, N]`` bool (or 0/1 numbers).
        truncated: same shape as ``terminated``.
        truncation: ``"bootstrap"`` (SPEC), ``"terminate"`` (CleanRL) or ``"ignore"``
            (thrust-rl); see the module docstring.

    Returns:
        :class:`TransitionMasks` of bool arrays with the shape of ``terminated``.

    Raises:
        ValueError: naming the argument, for non-0/1 flags, mismatched shapes or an unknown
            ``truncation``.

    Source: SPEC §1 (termination wins; the lambda-trace is cut at every done); the other
    conventions as in DESIGN.md §4 (CleanRL ``ppo.py``, thrust-rl 0.4).
    """
    check_choice(truncation, "truncation", tuple(TRUNCATION_MODES))
    term = np.ascontiguousarray(as_flag_array(terminated, "terminated"))
    trunc = np.ascontiguousarray(as_flag_array(truncated, "truncated"))
    if trunc.shape != term.shape:
        raise ValueError(f"truncated must have the shape of terminated {term.shape}, "
                         f"got {trunc.shape}")
    out = TransitionMasks(np.empty(term.shape, np.bool_), np.empty(term.shape, np.bool_),
                          np.empty(term.shape, np.bool_))
    _transition_masks_kernel(term, trunc, TRUNCATION_MODES[truncation], *out)
    return out


def episode_starts(terminated, truncated, initial) -> np.ndarray:
    """Reset mask: ``episode_starts[t] = done[t-1]``, ``episode_starts[0] = initial``.

    ``done[t] = terminated[t] or truncated[t]``: row ``t`` is the first step of a new episode
    exactly when the previous step ended one, for either reason. The first row carries over
    from the previous rollout's last step (``True`` at the very first reset). This is the mask
    that zeroes recurrent state and the one SB3 stores as ``RolloutBuffer.episode_starts``.

    Args:
        terminated: ``[T]`` or ``[T, N]`` bool (or 0/1 numbers), time-major.
        truncated: same shape as ``terminated``.
        initial: bool (or 0/1), the carry into row 0: a scalar for ``[T]`` input; ``[N]``
            (one per env) or a scalar (the same for every env) for ``[T, N]`` input.

    Returns:
        bool ndarray with the shape of ``terminated`` (empty when T = 0).

    Raises:
        ValueError: naming the argument, when a flag is not bool/0/1, a rank is not 1 or 2, or
            shapes disagree.

    Source: SPEC §1; Stable-Baselines3 ``RolloutBuffer.episode_starts``.
    """
    term = as_flag_array(terminated, "terminated", ndim=(1, 2))
    trunc = as_flag_array(truncated, "truncated", ndim=(1, 2))
    if trunc.shape != term.shape:
        raise ValueError(f"truncated must have the shape of terminated {term.shape}, "
                         f"got {trunc.shape}")
    init = as_flag_array(initial, "initial")
    if init.shape not in ((), term.shape[1:]):
        raise ValueError(f"initial must be a scalar or have shape {term.shape[1:]} "
                         f"(terminated.shape[1:]), got {init.shape}")
    out = np.empty(term.shape, dtype=np.bool_)
    if term.shape[0] == 0:
        return out
    out[0] = init
    np.logical_or(term[:-1], trunc[:-1], out=out[1:])
    return out
