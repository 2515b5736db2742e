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

=============  ==================================================  ==========================
``truncation``  meaning                                              used by
=============  ==================================================  ==========================
"bootstrap"    bootstrap ``final_values[t]``, cut the trace         this SPEC, SB3, sb3-contrib
"terminate"    treat as terminated: no bootstrap, cut the trace     CleanRL
"ignore"       flag ignored: bootstrap the next row, trace runs on  thrust-rl 0.4
=============  ==================================================  ==========================

:func:`_transition_flags` is the one place where this rule is written; the GAE and V-trace
kernels call it for every step.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ppo_ref._checks import as_flag_array, check_choice
from ppo_ref._numba import njit

__all__ = ["episode_starts", "transition_masks", "TransitionMasks", "TRUNCATION_MODES"]

# Integer codes of the ``truncation`` option, as passed to the numba kernels.
TRUNCATION_MODES = {"bootstrap": 0, "terminate": 1, "ignore": 2}


@njit
def _transition_flags(terminated, truncated, truncation_mode):
    """Flags of one step: ``(terminal, bootstrap_final, done)``, all bool.

    ``terminal``: the next value is 0 (no bootstrap). ``bootstrap_final``: the next value is
    ``final_values[t]``. ``done``: the lambda-trace is cut after this step. Neither of the first
    two set: the next value is ``values[t+1]`` (or ``last_values`` on the last row).
    ``truncation_mode`` is a code of :data:`TRUNCATION_MODES`.
    """
    if truncation_mode == 0:  # "bootstrap" (SPEC): termination wins over truncation
        return terminated, truncated and not terminated, terminated or truncated
    if truncation_mode == 1:  # "terminate" (CleanRL): truncation is a termination
        return terminated or truncated, False, terminated or truncated
    return terminated, False, terminated  # "ignore" (thrust-rl): truncated is not read


@njit
def _transition_masks_kernel(terminated, truncated, truncation_mode,
                             terminal, bootstrap_final, done):
    flat_term = terminated.ravel()
    flat_trunc = truncated.ravel()
    out_term = terminal.ravel()
    out_final = bootstrap_final.ravel()
    out_done = done.ravel()
    for i in range(flat_term.size):
        a, b, c = _transition_flags(flat_term[i], flat_trunc[i], truncation_mode)
        out_term[i] = a
        out_final[i] = b
        out_done[i] = c


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
    """
    check_choice(truncation, "truncation", tuple(TRUNCATION_MODES))
    term = np.ascontiguousarray(as_flag_array(terminated, "terminated"))
    trunc = np.ascontiguousarray(as_flag_array(truncated, "truncated"))
    if trunc.shape != term.shape:
        raise ValueError(f"truncated must have the shape of terminated {term.shape}, got {trunc.shape}")
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
        initial: bool (or 0/1) of shape ``terminated.shape[1:]``: a scalar for ``[T]`` input,
            ``[N]`` for ``[T, N]`` input.

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
        raise ValueError(f"truncated must have the shape of terminated {term.shape}, got {trunc.shape}")
    init = as_flag_array(initial, "initial")
    if init.shape != term.shape[1:]:
        raise ValueError(f"initial must have shape {term.shape[1:]} (terminated.shape[1:]), "
                         f"got {init.shape}")
    out = np.empty(term.shape, dtype=np.bool_)
    if term.shape[0] == 0:
        return out
    out[0] = init
    np.logical_or(term[:-1], trunc[:-1], out=out[1:])
    return out
