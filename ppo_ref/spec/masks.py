"""Episode boundaries: the per-step transition flags and the reset mask.

For the transition taken at step ``t`` of env ``n``: ``terminated[t, n]``, a true terminal state
was reached (nothing is bootstrapped); ``truncated[t, n]``, the episode was cut (time limit:
bootstrap from ``V(final_obs[t, n])``); termination wins when both are set. ``done = terminated
or truncated`` (an internal word): the next row belongs to another episode, so the lambda-trace
is cut after step ``t``. Two masks, deliberately distinct: the bootstrap mask is ``terminated``
alone, the reset mask is :func:`episode_starts` (from either flag).

The loops are written in the subset of Python numba compiles; :mod:`ppo_ref.fast.masks` compiles
these very functions and runs them through :func:`run_transition_masks` /
:func:`run_episode_starts` (the same validation), bit for bit.

Source: Pardo et al., "Time Limits in Reinforcement Learning" (arXiv:1712.00378) for
bootstrapping at truncation; Stable-Baselines3 ``RolloutBuffer.episode_starts``.
"""

from typing import NamedTuple

import numpy as np

from ppo_ref._checks import as_flag_array, check_choice

__all__ = ["episode_starts", "transition_masks", "TransitionMasks", "TRUNCATION_MODES",
           "transition_flags"]

#: Integer codes of the ``truncation`` option, as the loops take it: ``"bootstrap"``
#: (Stable-Baselines3, sb3-contrib; the default), ``"terminate"`` (CleanRL ``ppo.py``),
#: ``"ignore"`` (thrust-rl 0.4). The rule of each: :func:`transition_flags`.
TRUNCATION_MODES = {"bootstrap": 0, "terminate": 1, "ignore": 2}


def transition_flags(terminated, truncated, truncation_mode):
    """The flags of one step: ``(terminal, bootstrap_final, done)``, all bool.

    ``terminal``: the next value is 0 (no bootstrap). ``bootstrap_final``: the next value is
    ``V(final_obs[t])``. ``done``: the lambda-trace is cut after this step. Neither of the first
    two: the next value is ``V(obs[t+1])`` (``values[t+1]``, or ``last_values`` on the last
    row). ``truncation_mode`` (a code of :data:`TRUNCATION_MODES`) reads ``truncated`` as a
    bootstrap from ``final_values`` ("bootstrap"), a termination ("terminate"), or not at all
    ("ignore": bootstrap the next row, the trace runs on). The one place this rule is written.
    """
    if truncation_mode == 0:  # "bootstrap": termination wins over truncation
        return terminated, truncated and not terminated, terminated or truncated
    if truncation_mode == 1:  # "terminate": truncation is a termination
        return terminated or truncated, False, terminated or truncated
    return terminated, False, terminated  # "ignore": truncated is not read


def transition_masks_loop(terminated, truncated, truncation_mode, terminal, bootstrap_final,
                          done):
    """:func:`transition_flags` of every step of ``[T, N]`` bool arrays, written into the bool
    arrays ``terminal``, ``bootstrap_final`` and ``done`` of the same shape."""
    n_steps, n_envs = terminated.shape
    for t in range(n_steps):
        for n in range(n_envs):
            a, b, c = transition_flags(terminated[t, n], truncated[t, n], truncation_mode)
            terminal[t, n] = a
            bootstrap_final[t, n] = b
            done[t, n] = c


def episode_starts_loop(terminated, truncated, initial, episode_starts):
    """The reset mask of ``[T, N]`` bool arrays, written into ``episode_starts`` ``[T, N]``::

        episode_starts[0, n] = initial[n]
        episode_starts[t, n] = terminated[t-1, n] or truncated[t-1, n]      (t >= 1)

    ``initial``: ``[N]`` bool, the carry from the previous rollout. Either flag starts a new
    episode, whatever the ``truncation`` convention of the advantages.
    """
    n_steps, n_envs = terminated.shape
    for n in range(n_envs):
        episode_starts[0, n] = initial[n]
    for t in range(1, n_steps):
        for n in range(n_envs):
            episode_starts[t, n] = terminated[t - 1, n] or truncated[t - 1, n]


class TransitionMasks(NamedTuple):
    """:func:`transition_flags` of every step: bool arrays of the flags' shape."""

    terminal: np.ndarray
    bootstrap_final: np.ndarray
    done: np.ndarray


def _same_shape_flags(terminated, truncated, ndim=None):
    term = as_flag_array(terminated, "terminated", ndim=ndim)
    trunc = as_flag_array(truncated, "truncated", ndim=ndim)
    if trunc.shape != term.shape:
        raise ValueError(f"truncated must have the shape of terminated {term.shape}, "
                         f"got {trunc.shape}")
    return np.ascontiguousarray(term), np.ascontiguousarray(trunc)


def run_transition_masks(loop, terminated, truncated, truncation) -> TransitionMasks:
    """:func:`transition_masks` with its loop given (:func:`transition_masks_loop` or its
    compiled twin): validates, then runs ``loop`` once over the flags as one column."""
    check_choice(truncation, "truncation", tuple(TRUNCATION_MODES))
    term, trunc = _same_shape_flags(terminated, truncated)
    two_d = (term.size, 1)  # the flags are element-wise: any shape, as one column
    out = TransitionMasks(np.empty(term.shape, np.bool_), np.empty(term.shape, np.bool_),
                          np.empty(term.shape, np.bool_))
    loop(term.reshape(two_d), trunc.reshape(two_d), TRUNCATION_MODES[truncation],
         *(o.reshape(two_d) for o in out))
    return out


def transition_masks(terminated, truncated, truncation: str = "bootstrap") -> TransitionMasks:
    """The bootstrap masks and the ``done`` (trace-cut) mask of every step:
    :func:`transition_flags` of each entry.

    Args:
        terminated: bool or 0/1 numbers, any shape (``[T]``, ``[T, N]``).
        truncated: same shape as ``terminated``.
        truncation: a key of :data:`TRUNCATION_MODES` (default ``"bootstrap"``).

    Returns :class:`TransitionMasks` of bool arrays with the shape of ``terminated``. Raises
    ``ValueError`` naming the argument for non-0/1 flags, mismatched shapes or an unknown
    ``truncation``.
    """
    return run_transition_masks(transition_masks_loop, terminated, truncated, truncation)


def run_episode_starts(loop, terminated, truncated, initial) -> np.ndarray:
    """:func:`episode_starts` with its loop given (:func:`episode_starts_loop` or its compiled
    twin): validates, then runs ``loop`` on ``[T, N]`` views."""
    term, trunc = _same_shape_flags(terminated, truncated, ndim=(1, 2))
    init = as_flag_array(initial, "initial")
    if init.shape not in ((), term.shape[1:]):
        raise ValueError(f"initial must be a scalar or have shape {term.shape[1:]} "
                         f"(terminated.shape[1:]), got {init.shape}")
    out = np.empty(term.shape, dtype=np.bool_)
    if term.shape[0] == 0:
        return out
    two_d = term.shape if term.ndim == 2 else (term.shape[0], 1)  # the loop takes [T, N]
    carry = np.ascontiguousarray(np.broadcast_to(init, two_d[1:]))
    loop(term.reshape(two_d), trunc.reshape(two_d), carry, out.reshape(two_d))
    return out


def episode_starts(terminated, truncated, initial) -> np.ndarray:
    """Reset mask: row ``t`` starts a new episode when step ``t-1`` ended one, for either reason
    (:func:`episode_starts_loop`); the mask that zeroes recurrent state.

    Args:
        terminated: ``[T]`` or ``[T, N]`` bool (or 0/1 numbers), time-major.
        truncated: same shape as ``terminated``.
        initial: bool (or 0/1), the carry into row 0 (True at the very first reset): a scalar,
            or ``[N]`` (one per env) for ``[T, N]`` input.

    Returns a bool array with the shape of ``terminated`` (empty when T = 0). Raises
    ``ValueError`` naming the argument when a flag is not bool/0/1, a rank is not 1 or 2, or
    shapes disagree.
    """
    return run_episode_starts(episode_starts_loop, terminated, truncated, initial)
