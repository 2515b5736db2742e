"""Episode boundaries: the per-step transition flags and the reset mask, as plain loops.

Vocabulary. For the transition taken at step ``t`` of env ``n``:

* ``terminated[t, n]``: a true terminal state was reached; nothing is bootstrapped.
* ``truncated[t, n]``: the episode was cut (time limit); bootstrap from ``V(final_obs[t, n])``.
  When both flags are set on one step, termination wins.
* ``done[t, n] = terminated[t, n] or truncated[t, n]`` (an internal word): the next row belongs
  to another episode, so the lambda-trace is cut after step ``t``.
* ``episode_starts[t, n] = done[t-1, n]`` for ``t >= 1``; ``episode_starts[0, n]`` is the
  carry from the previous rollout.

The convention option ``truncation`` (passed to the loops as a code of
:data:`TRUNCATION_MODES`) selects how ``truncated`` is read:

* ``"bootstrap"`` (Stable-Baselines3, sb3-contrib; the default): bootstrap
  ``final_values[t]``, cut the trace.
* ``"terminate"`` (CleanRL ``ppo.py``): treated as terminated: no bootstrap, cut the trace.
* ``"ignore"`` (thrust-rl 0.4): the flag is not read: bootstrap the next row, the trace runs on.

:func:`transition_flags` is the one place where this rule is written; the GAE and V-trace
recursions (:mod:`ppo_ref.spec.advantages`) call it for every step.

The loops (:func:`transition_flags`, :func:`transition_masks_loop`, :func:`episode_starts_loop`)
are written in the subset of Python that numba compiles: the compiled tier
(:mod:`ppo_ref.fast.masks`) compiles these very functions. The public functions
:func:`episode_starts` and :func:`transition_masks` validate their arguments and run the loops
as plain Python; their twins in :mod:`ppo_ref.fast.masks` run the same validation
(:func:`run_episode_starts`, :func:`run_transition_masks`) and the compiled loops, bit for bit.

Two masks, deliberately distinct: the **bootstrap mask** is ``terminated`` alone (truncation
keeps the bootstrap, from the right state) and the **reset mask** is ``episode_starts`` (from
either flag).

Source: Pardo et al., "Time Limits in Reinforcement Learning" (arXiv:1712.00378) for
bootstrapping at truncation; Stable-Baselines3 ``RolloutBuffer.episode_starts``.
"""

from typing import NamedTuple

import numpy as np

from ppo_ref._checks import as_flag_array, check_choice

__all__ = ["episode_starts", "transition_masks", "TransitionMasks", "TRUNCATION_MODES",
           "transition_flags"]

#: Integer codes of the ``truncation`` option, as the loops take it.
TRUNCATION_MODES = {"bootstrap": 0, "terminate": 1, "ignore": 2}


def transition_flags(terminated, truncated, truncation_mode):
    """The flags of one step: ``(terminal, bootstrap_final, done)``, all bool.

    ``terminal``: the next value is 0 (no bootstrap). ``bootstrap_final``: the next value is
    ``V(final_obs[t])``. ``done``: the lambda-trace is cut after this step. Neither of the first
    two: the next value is ``V(obs[t+1])`` (``values[t+1]``, or ``last_values`` on the last
    row). ``truncation_mode`` is a code of :data:`TRUNCATION_MODES`.
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

    ``initial``: ``[N]`` bool, the carry from the previous rollout (True at the first reset).
    A step that ended an episode for either reason (whatever the ``truncation`` convention of
    the advantages) makes the next row the first step of a new one.
    """
    n_steps, n_envs = terminated.shape
    for n in range(n_envs):
        episode_starts[0, n] = initial[n]
    for t in range(1, n_steps):
        for n in range(n_envs):
            episode_starts[t, n] = terminated[t - 1, n] or truncated[t - 1, n]


# --------------------------------------------------------------------------------------------
# the public, validating functions


class TransitionMasks(NamedTuple):
    """Per-step masks derived from ``terminated``/``truncated`` (all bool, same shape).

    ``terminal``: next value is 0. ``bootstrap_final``: next value is ``final_values``.
    ``done``: the lambda-trace is cut after the step (``episode_starts`` of the next row).
    """

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
    """:func:`transition_masks` with its loop given: :func:`transition_masks_loop` itself, or
    its compiled twin (:func:`ppo_ref.fast.masks.transition_masks`). Validates every argument,
    then runs ``loop`` once over the flags as one column."""
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
        terminated: ``[T]`` or ``[T, N]`` (any shape) bool, or 0/1 numbers.
        truncated: same shape as ``terminated``.
        truncation: ``"bootstrap"`` (SB3, the default), ``"terminate"`` (CleanRL) or
            ``"ignore"`` (thrust-rl); see the module docstring.

    Returns:
        :class:`TransitionMasks` of bool arrays with the shape of ``terminated``.

    Raises:
        ValueError: naming the argument, for non-0/1 flags, mismatched shapes or an unknown
            ``truncation``.

    Source: termination wins and the lambda-trace is cut at every done (Stable-Baselines3);
    the other conventions as CleanRL ``ppo.py`` and thrust-rl 0.4.
    """
    return run_transition_masks(transition_masks_loop, terminated, truncated, truncation)


def run_episode_starts(loop, terminated, truncated, initial) -> np.ndarray:
    """:func:`episode_starts` with its loop given: :func:`episode_starts_loop` itself, or its
    compiled twin (:func:`ppo_ref.fast.masks.episode_starts`). Validates every argument, then
    runs ``loop`` on ``[T, N]`` views."""
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
    """Reset mask: ``episode_starts[t] = done[t-1]``, ``episode_starts[0] = initial``
    (:func:`episode_starts_loop`).

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

    Source: Stable-Baselines3 ``RolloutBuffer.episode_starts``.
    """
    return run_episode_starts(episode_starts_loop, terminated, truncated, initial)
