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

Every function here is written in the subset of Python that numba compiles: the compiled tier
(``ppo_ref.fast.advantages``) compiles these very functions, and the public, validating
wrappers (``ppo_ref.episode_starts``, ``ppo_ref.kernels.transition_masks``) run either the
compiled function (``backend="fast"``) or the function below as plain Python
(``backend="spec"``).

Source: Pardo et al., "Time Limits in Reinforcement Learning" (arXiv:1712.00378) for
bootstrapping at truncation; Stable-Baselines3 ``RolloutBuffer.episode_starts``.
"""

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
