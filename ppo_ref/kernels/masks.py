"""Episode-boundary masks: ``episode_starts`` and the per-step transition flags.

The vocabulary (terminated, truncated, done, episode_starts), the ``truncation`` conventions and
the loops that compute the masks are in :mod:`ppo_ref.spec.masks`; the functions here validate
their arguments and run those loops compiled (``backend="fast"``) or as plain Python
(``backend="spec"``), with the same results.

Two masks, deliberately distinct: the **bootstrap mask** is ``terminated`` alone (truncation
keeps the bootstrap, from the right state) and the **reset mask** is ``episode_starts`` (from
either flag).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ppo_ref._checks import as_flag_array, check_choice
from ppo_ref.fast import advantages as _kernels
from ppo_ref.kernels._inputs import check_backend
from ppo_ref.spec.masks import TRUNCATION_MODES

__all__ = ["episode_starts", "transition_masks", "TransitionMasks", "TRUNCATION_MODES"]


class TransitionMasks(NamedTuple):
    """Per-step masks derived from ``terminated``/``truncated`` (all bool, same shape).

    ``terminal``: next value is 0. ``bootstrap_final``: next value is ``final_values``.
    ``done``: the lambda-trace is cut after the step (``episode_starts`` of the next row).
    """

    terminal: np.ndarray
    bootstrap_final: np.ndarray
    done: np.ndarray


def transition_masks(terminated, truncated, truncation: str = "bootstrap", *,
                     backend: str = "fast") -> TransitionMasks:
    """The bootstrap masks and the ``done`` (trace-cut) mask of every step.

    Args:
        terminated: ``[T]`` or ``[T, N]`` bool (or 0/1 numbers).
        truncated: same shape as ``terminated``.
        truncation: ``"bootstrap"`` (SB3, the default), ``"terminate"`` (CleanRL) or
            ``"ignore"`` (thrust-rl); see :mod:`ppo_ref.spec.masks`.
        backend: ``"fast"`` (compiled) or ``"spec"``
            (:func:`ppo_ref.spec.masks.transition_masks_loop` run as plain Python).

    Returns:
        :class:`TransitionMasks` of bool arrays with the shape of ``terminated``.

    Raises:
        ValueError: naming the argument, for non-0/1 flags, mismatched shapes or an unknown
            ``truncation`` or ``backend``.

    Source: termination wins and the lambda-trace is cut at every done (Stable-Baselines3);
    the other conventions as CleanRL ``ppo.py`` and thrust-rl 0.4.
    """
    loop = check_backend(backend, _kernels.transition_masks_loop)
    check_choice(truncation, "truncation", tuple(TRUNCATION_MODES))
    term = np.ascontiguousarray(as_flag_array(terminated, "terminated"))
    trunc = np.ascontiguousarray(as_flag_array(truncated, "truncated"))
    if trunc.shape != term.shape:
        raise ValueError(f"truncated must have the shape of terminated {term.shape}, "
                         f"got {trunc.shape}")
    two_d = (term.size, 1)  # the flags are element-wise: any shape, as one column
    out = TransitionMasks(np.empty(term.shape, np.bool_), np.empty(term.shape, np.bool_),
                          np.empty(term.shape, np.bool_))
    loop(term.reshape(two_d), trunc.reshape(two_d), TRUNCATION_MODES[truncation],
         *(o.reshape(two_d) for o in out))
    return out


def episode_starts(terminated, truncated, initial, *, backend: str = "fast") -> np.ndarray:
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
        backend: ``"fast"`` (compiled) or ``"spec"``
            (:func:`ppo_ref.spec.masks.episode_starts_loop` run as plain Python).

    Returns:
        bool ndarray with the shape of ``terminated`` (empty when T = 0).

    Raises:
        ValueError: naming the argument, when a flag is not bool/0/1, a rank is not 1 or 2, or
            shapes disagree, or ``backend`` is unknown.

    Source: Stable-Baselines3 ``RolloutBuffer.episode_starts``.
    """
    loop = check_backend(backend, _kernels.episode_starts_loop)
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
    two_d = term.shape if term.ndim == 2 else (term.shape[0], 1)  # the loop takes [T, N]
    carry = np.ascontiguousarray(np.broadcast_to(init, two_d[1:]))
    loop(np.ascontiguousarray(term).reshape(two_d), np.ascontiguousarray(trunc).reshape(two_d),
         carry, out.reshape(two_d))
    return out
