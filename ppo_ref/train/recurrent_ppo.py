"""The recurrent (LSTM) PPO trainer: :class:`~ppo_ref.train.ppo.PPOTrainer` with a
:class:`~ppo_ref.train.policies.RecurrentPolicy`.

Each env's LSTM state is carried across steps and rollouts (reset only by ``episode_starts``);
the state before step 0 is ``Rollout.initial_state``, from which minibatches of whole envs are
replayed over all ``T`` steps (:func:`ppo_ref.spec.update.recurrent_minibatches`: BPTT cut only
at episode starts, as CleanRL's ``ppo_atari_lstm.py``; sb3-contrib pads sequences instead).
Bootstrap values read the state without advancing it, as sb3-contrib.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ppo_ref._checks import as_flag_array, check_count
from ppo_ref.spec.recurrent_networks import LSTMStates
from ppo_ref.spec.update import recurrent_minibatches, truncation_weights
from ppo_ref.train.ppo import PPOTrainer, kernel_threads
from ppo_ref.train.rollout import Rollout

__all__ = ["RecurrentPPOTrainer", "envs_per_minibatch"]


def envs_per_minibatch(n_envs: int, n_steps: int, batch_size: int) -> int:
    """Envs per recurrent minibatch: ``max(1, batch_size // n_steps)`` whole env-sequences of
    ``n_steps`` rows (a ``batch_size`` below ``n_steps`` gives one env; a remainder of
    ``batch_size / n_steps`` is dropped).

    Raises:
        ValueError: ``n_envs`` is not a multiple of it, with the valid choices in the message.
    """
    per = max(1, int(batch_size) // int(n_steps))
    if int(n_envs) % per != 0:
        ok = [d * int(n_steps) for d in range(1, int(n_envs) + 1) if int(n_envs) % d == 0]
        raise ValueError(
            f"n_envs ({n_envs}) must be divisible by the envs per minibatch "
            f"(batch_size // n_steps = {batch_size} // {n_steps} = {per}): recurrent minibatches "
            f"are sets of whole envs. Choose batch_size in {ok} or change n_envs.")
    return per


class RecurrentPPOTrainer(PPOTrainer):
    """PPO with an LSTM actor-critic: :class:`~ppo_ref.train.ppo.PPOTrainer`'s constructor and
    methods; the policy follows ``config.lstm_hidden_size``, ``lstm_shared``, ``net_arch``
    (towers after the LSTM) and ``activation``. Extra attributes: ``lstm_states``,
    ``envs_per_minibatch``. Raises ``ValueError`` as PPOTrainer, and for ``n_envs`` not
    divisible by :func:`envs_per_minibatch`.
    """

    policy_kind = "lstm"
    recurrent = True

    def _check_config(self, config) -> None:
        self.envs_per_minibatch = envs_per_minibatch(config.n_envs, config.n_steps,
                                                     config.batch_size)

    @property
    def lstm_states(self) -> LSTMStates:
        """The carried LSTM states ``[L, N, H]`` (those the next rollout starts from)."""
        return self.collector.state

    def _whole_rollout(self, rollout: Rollout):
        """The policy's ``evaluate`` data: the whole rollout replayed from its start state."""
        return (rollout.observations, rollout.actions, rollout.initial_state,
                rollout.episode_starts)

    def _minibatches(self, rollout: Rollout, advantages: np.ndarray, returns: np.ndarray):
        """Whole-env minibatches (:func:`ppo_ref.spec.update.recurrent_minibatches`)."""
        if rollout.initial_state is None:
            raise ValueError("rollout has no initial_state: collect it with a recurrent policy")
        return recurrent_minibatches(self.minibatch_rng, self.envs_per_minibatch,
                                     rollout.log_probs, advantages, returns, rollout.values,
                                     rollout.observations, rollout.actions,
                                     rollout.initial_state, rollout.episode_starts,
                                     truncation_weights(rollout.terminated, rollout.truncated,
                                                        self.config.drop_truncated_steps))

    # -- acting -----------------------------------------------------------------------------------
    def initial_state(self, n_envs: int = 1) -> LSTMStates:
        """Zero LSTM states for acting in ``n_envs`` envs with :meth:`predict`. Raises
        ``ValueError`` naming ``n_envs`` unless it is an integer >= 1."""
        return self.policy.initial_state(check_count(n_envs, "n_envs", 1))

    def predict(self, obs, deterministic: bool = False, state: Optional[LSTMStates] = None,
                episode_starts=None):
        """Actions for raw observations, carrying the memory explicitly (as sb3-contrib's
        ``RecurrentPPO.predict``).

        Args:
            obs: ``[obs_shape]`` (one env) or ``[B, *obs_shape]``.
            deterministic: take the mode instead of sampling (``predict_rng``).
            state: the :class:`LSTMStates` returned by the previous call, or ``None`` (zeros).
            episode_starts: bools or 0/1 numbers ``[B]`` (or one for one env): True where
                ``obs`` starts an episode; ``None`` means True for every env when ``state`` is
                None, else False.

        Returns:
            ``(actions, new_state)``: actions as the env receives them (Gaussian: clipped).

        Raises:
            ValueError: naming the argument: ``obs``, ``episode_starts`` not 0/1 or not one per
                env, ``state`` not ``[L, B, H]`` finite.
        """
        with kernel_threads(self.threads):
            batch, single = self._obs_batch(obs)
            n = batch.shape[0]
            if state is None:
                state, default_start = self.policy.initial_state(n), True
            else:
                default_start = False
                want = (self.policy.n_lstm, n, self.policy.hidden_size)
                h, c = (np.asarray(a) for a in state)
                if h.shape != want or c.shape != want or not (np.isfinite(h).all()
                                                             and np.isfinite(c).all()):
                    raise ValueError(f"state must be LSTMStates of finite arrays of shape {want}")
                state = LSTMStates(h.astype(self.policy.dtype), c.astype(self.policy.dtype))
            if episode_starts is None:
                starts = np.full(n, default_start)
            else:
                starts = as_flag_array(episode_starts, "episode_starts", ndim=(0, 1))
                if starts.size != n:
                    raise ValueError(f"episode_starts must hold one flag per env ({n}), got "
                                     f"shape {starts.shape}")
                starts = starts.reshape(n)
            actions, new_state = self.policy.predict(self.params, batch, state, starts,
                                                     self.predict_rng, deterministic)
            return (actions[0] if single else actions), new_state

    def _episode_actor(self, deterministic: bool):
        """``act(obs)`` for one evaluation episode, its memory reset at the start."""
        state, first = None, True

        def act(obs):
            nonlocal state, first
            action, state = self.predict(obs, deterministic, state, episode_starts=first)
            first = False
            return action
        return act
