"""The recurrent (LSTM) PPO trainer: whole-env minibatches replayed through the LSTM.

``RecurrentPPOTrainer`` is :class:`ppo_ref.train.ppo.PPOTrainer` with an LSTM policy of
:mod:`ppo_ref.train.recurrent_policies` (:func:`~ppo_ref.train.recurrent_policies.make_recurrent_policy`:
the compiled ``RecurrentPolicy`` for ``config.backend = "fast"``, the readable
``SpecRecurrentPolicy`` for ``"spec"``); everything that is not about memory is inherited
unchanged (rollout collection and its checks, GAE, schedules, the update recipe of
:mod:`ppo_ref.fast.update`, checkpoints, the ``learn`` loop). What memory changes:

Collection
    Each env's LSTM state ``(h, c)`` is carried from step to step and from one rollout to the
    next (never zeroed at a rollout boundary). Before every step the state of an env is
    multiplied by ``1 - episode_starts[t]`` (the LSTM's own reset rule, the same code path as
    training), with ``episode_starts[t] = terminated[t-1] or truncated[t-1]`` and True after
    the first reset. The state *before step 0* of every rollout is stored with it
    (:attr:`RecurrentRollout.initial_lstm_states`). The stored ``log_probs`` and ``values``
    are those of one replay of the whole ``[T, N]`` rollout from that state with the recorded
    ``episode_starts`` (the same quantities as at acting time, computed with the batched
    arithmetic the training minibatches use; see the exactness note). Bootstrap values are
    read without advancing the state: ``last_values = V(obs_T | state_T, episode_starts_T)``
    and, for a truncated step, ``final_values[t] = V(final_obs[t] | state after step t)`` (no
    reset: the final observation continues the episode that was cut), as sb3-contrib does.

Update
    Minibatches are sets of whole envs: each epoch draws a permutation of the ``N`` envs from
    ``minibatch_rng`` and cuts it into ``N / envs_per_minibatch`` groups, with
    ``envs_per_minibatch = max(1, batch_size // n_steps)`` (so ``batch_size`` keeps its meaning
    of rows per minibatch: ``envs_per_minibatch * n_steps``). Each group is replayed over all
    ``T`` steps from its stored start state with the stored ``episode_starts``; the loss of
    :func:`ppo_ref.fast.update.minibatch_loss` (advantages normalized per minibatch over its
    ``T * n`` entries) is backpropagated through the whole rollout (BPTT over T steps, cut only
    at episode starts). CleanRL's ``ppo_atari_lstm.py`` and thrust-rl's ``RecurrentPPOTrainer``
    use the same whole-env scheme; thrust-rl starts every rollout from the zero state, here the
    carried state is replayed (so the first minibatch reproduces the behaviour log-probs
    exactly: ratio 1). sb3-contrib instead cuts sequences at episode starts, pads them and
    stores per-step states.

Exactness note: with the compiled ``RecurrentPolicy`` (whose parameters are the one buffer
the trainer holds) every quantity of an env is computed with arithmetic that does not depend
on which other envs share the call: the LSTM kernels (:mod:`ppo_ref.fast.lstm`), the towers
(row-wise fused multiply-add chains instead of BLAS products, whose rounding can depend on the
number of rows) and the compiled categorical head. Acting (N rows per step), the replay of the
rollout (``T * N`` rows) and a minibatch of any ``n`` envs therefore give the same bits, and
the first minibatch of every update reproduces the stored log-probs exactly (ratio 1),
whatever ``envs_per_minibatch`` is (tested). The stored values are still those of the replay,
as :class:`~ppo_ref.train.rollout.RolloutCollector` does for the MLP. (``SpecRecurrentPolicy``
computes with NumPy products: its first ratio is 1 to rounding.)

Speed: ``train_on`` hands the loss 1-D rows (``[T, n]`` flattened), which take the compiled
minibatch loss of :mod:`ppo_ref.fast.update`; its minibatches are
:func:`ppo_ref.fast.update.recurrent_minibatches` (bit-equal to the spec's: without a
``target_kl`` every epoch's env permutation is drawn at once, the same draws, and each array is
gathered once per update into C-contiguous per-minibatch blocks) of the rollout's
observations, actions, start states and episode starts checked once per update (the
policy's ``_update_passes``, whose minibatch passes give the bits of ``evaluate`` and
``backward`` without checking again what the update itself made); acting checks the
parameters once per rollout (``acting_step_fn`` of the policy). ``config.compute_dtype =
"float32"`` runs the LSTMs, towers and head in float32 (acting, replay and training alike, so
ratio 1 still holds); parameters, gradients, Adam, losses and advantages stay float64.

Checkpoints add the carried LSTM states (``lstm/h``, ``lstm/c``) to PPOTrainer's snapshot, so a
resumed run continues exactly.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import numpy as np

from ppo_ref._checks import as_flag_array
from ppo_ref.fast.update import recurrent_minibatches, run_epochs
from ppo_ref.losses import explained_variance
from ppo_ref.train.ppo import PPOTrainer, kernel_threads
from ppo_ref.train.policies import PolicyEval
from ppo_ref.train.recurrent_policies import LSTMStates, RecurrentPolicy, make_recurrent_policy
from ppo_ref.train.rollout import Rollout
from ppo_ref.spec import update as spec_update
from ppo_ref.spec.update import batch_advantages, env_minibatches

__all__ = ["RecurrentPPOTrainer", "RecurrentRollout", "envs_per_minibatch", "env_minibatches"]


@dataclasses.dataclass
class RecurrentRollout(Rollout):
    """A :class:`~ppo_ref.train.rollout.Rollout` plus the LSTM state every env had before step 0.

    Attributes:
        initial_lstm_states: :class:`~ppo_ref.train.recurrent_policies.LSTMStates` ``[L, N, H]``.
    """
    initial_lstm_states: Optional[LSTMStates] = None


def envs_per_minibatch(n_envs: int, n_steps: int, batch_size: int) -> int:
    """Envs per recurrent minibatch: ``max(1, batch_size // n_steps)``.

    A minibatch is ``envs_per_minibatch`` whole env-sequences of ``n_steps`` rows. A
    ``batch_size`` smaller than ``n_steps`` gives one env per minibatch (a sequence cannot be
    split); a remainder of ``batch_size / n_steps`` is dropped.

    Raises:
        ValueError: ``n_envs`` is not a multiple of it (every minibatch must hold the same
            number of envs), with the numbers and valid choices in the message.
    """
    per = max(1, int(batch_size) // int(n_steps))
    if int(n_envs) % per != 0:
        ok = [d * int(n_steps) for d in range(1, int(n_envs) + 1) if int(n_envs) % d == 0]
        raise ValueError(
            f"n_envs ({n_envs}) must be divisible by the envs per minibatch "
            f"(batch_size // n_steps = {batch_size} // {n_steps} = {per}): recurrent minibatches "
            f"are sets of whole envs. Choose batch_size in {ok} or change n_envs.")
    return per


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """``a`` and ``b`` (float64, the same shape) hold the same bits (``-0.0`` differs from
    ``0.0``; the arrays are finite)."""
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    return a.shape == b.shape and np.array_equal(a.view(np.uint64), b.view(np.uint64))


class _ActedSteps:
    """What one rollout's acting computed, kept for :meth:`_RecurrentActor.evaluate`: the
    parameter buffer and the start state it stepped from (copies), and per step the
    observations, flags and the new hidden states ``h [L, N, H]`` (copies)."""

    def __init__(self, flat: np.ndarray, start: LSTMStates):
        self.flat = flat
        self.start = start
        self.obs = []
        self.starts = []
        self.h = []

    def add(self, obs, episode_starts, h: np.ndarray) -> None:
        """Keep one step (called after the step accepted these arguments)."""
        self.obs.append(np.array(obs, dtype=np.float64))
        self.starts.append(np.array(episode_starts, dtype=bool))
        self.h.append(np.array(h, dtype=np.float64))

    def hidden(self, params, obs, starts: np.ndarray, start: LSTMStates):
        """The kept ``h`` of every step as ``[L, T, N, H]`` if these steps are exactly the
        rollout of ``params``, ``obs`` (``[T N, ...]``, time-major), bool ``starts [T, N]``
        and the start state ``start`` (every value the same bits); else None."""
        T = len(self.h)
        if T == 0 or starts.shape[0] != T:
            return None
        try:
            same_params = _same_bits(params.flat, self.flat)
            x = np.asarray(obs, dtype=np.float64)
        except (AttributeError, TypeError, ValueError):  # not this policy's parameters or obs
            return None
        step_shape = self.obs[0].shape
        if not (same_params and x.size == T * self.obs[0].size
                and np.array_equal(np.stack(self.starts), starts)
                and _same_bits(np.asarray(start.h, dtype=np.float64), self.start.h)
                and _same_bits(np.asarray(start.c, dtype=np.float64), self.start.c)):
            return None
        x = x.reshape((T,) + step_shape)
        if not all(_same_bits(x[t], kept) for t, kept in enumerate(self.obs)):
            return None
        return np.stack(self.h, axis=1)


class _RecurrentActor:
    """The recurrent policy seen through :class:`~ppo_ref.train.rollout.RolloutCollector`'s policy
    interface for policies with memory (``takes_episode_starts``: the collector hands over the
    episode-start flags of every observation), with the LSTM state carried here.

    ``values`` serves the two bootstrap requests the collector makes: right after a step in
    which envs ``env_indices`` truncated, ``V(final_obs)`` from those envs' states after the
    step, no reset (the final observation continues the cut episode); after the last step,
    ``V(obs_T)`` from the carried state with ``episode_starts``. Neither advances the state.
    ``evaluate`` replays the rollout just collected (the collector's recomputation of the
    stored log-probs/values). With the compiled policy (:class:`RecurrentPolicy`) the LSTM
    outputs of every acting step are kept, with the parameters, observations, flags and
    start state they came from; when ``evaluate`` is asked for exactly that rollout (all of
    them equal, bit for bit), it runs the towers and the head on the kept outputs
    (:meth:`RecurrentPolicy.evaluate_hidden`) instead of running the LSTMs again: acting and
    the replay compute the same bits, so the results are the replay's.
    """

    takes_episode_starts = True

    def __init__(self, policy: RecurrentPolicy, n_envs: int, keep_outputs: bool):
        self.policy = policy
        self.state = policy.initial_state(n_envs)
        self.rollout_start = self.state.copy()
        self.replayed = False
        self.obs_dim = policy.obs_dim
        self.obs_shape = policy.obs_shape
        self.head = policy.head
        # keep acting's LSTM outputs for the replay (the fast backend's RecurrentPolicy, which
        # has evaluate_hidden; the trainer says so by its config.backend)
        self.keeps_outputs = bool(keep_outputs)
        self.acted = None  # _ActedSteps of the last policy_out_fn (keep_outputs only)

    def begin_rollout(self) -> LSTMStates:
        """Remember (and return a copy of) the state before step 0 of the next rollout."""
        self.rollout_start = self.state.copy()
        self.replayed = False
        self.acted = None
        return self.rollout_start.copy()

    def policy_out_fn(self, params):
        """``forward(obs [N, obs_dim], episode_starts [N]) -> policy_out [N, P]`` for one
        rollout: each call steps the carried state (reset where an episode starts). Steps go
        through the policy's ``acting_step_fn`` (parameters checked once per rollout; the same
        bits as ``policy_out_step``)."""
        step = self.policy.acting_step_fn(params)
        acted = None
        if self.keeps_outputs:
            acted = self.acted = _ActedSteps(params.flat.copy(), self.state.copy())

        def forward(obs, episode_starts):
            out, self.state = step(obs, self.state, episode_starts)
            if acted is not None:
                acted.add(obs, episode_starts, self.state.h)
            return out
        return forward

    def evaluate(self, params, obs, actions, *, episode_starts):
        """Log-probs, entropies and values of the rollout just collected, recomputed by one
        replay of all ``[T, N]`` steps from the rollout's start state with its
        ``episode_starts`` (bool ``[T, N]``; what the training minibatches recompute, with the
        same arithmetic, so their first ratio is exactly 1). ``obs``/``actions`` are the
        rollout's rows flattened time-major (row ``t * N + n``); results are flattened the
        same way."""
        starts = np.asarray(episode_starts, dtype=bool)
        n = self.state.h.shape[1]
        obs = np.asarray(obs)
        if starts.ndim != 2 or starts.shape[1] != n or obs.shape[0] != starts.size:
            raise RuntimeError(f"evaluate expects the T x {n} rows of the rollout just "
                               f"collected and their [T, {n}] episode_starts, got "
                               f"{obs.shape[0]} rows and flags of shape {starts.shape}")
        T = starts.shape[0]
        actions = np.asarray(actions).reshape((T, n) + self.head.action_shape)
        hidden = None
        if self.acted is not None:
            hidden = self.acted.hidden(params, obs, starts, self.rollout_start)
        if hidden is not None:
            ev = self.policy.evaluate_hidden(params, hidden, actions)
        else:
            ev = self.policy.evaluate(params, obs.reshape((T, n) + obs.shape[1:]), actions,
                                      self.rollout_start, starts)
        self.replayed = True
        return PolicyEval(ev.log_probs.reshape(-1), ev.entropy.reshape(-1),
                          ev.values.reshape(-1), None)

    def values(self, params, obs, *, env_indices=None, episode_starts=None):
        obs = np.asarray(obs)
        n = self.state.h.shape[1]
        if env_indices is not None:
            idx = np.asarray(env_indices)
            if obs.shape[0] != idx.size:
                raise RuntimeError(f"expected final observations of envs {idx.tolist()}, got "
                                   f"{obs.shape[0]} rows")
            return self.policy.values(params, obs, self.state.select(idx),
                                      np.zeros(idx.size, dtype=bool))
        if obs.shape[0] != n or episode_starts is None:
            raise RuntimeError(f"expected the observations of all {n} envs and their "
                               f"episode_starts, got {obs.shape[0]} rows")
        return self.policy.values(params, obs, self.state, np.asarray(episode_starts, dtype=bool))


def checked_passes(policy):
    """``(evaluate, backward)`` for ``run_epochs`` on whole-env minibatches whose ``data`` is
    ``(obs [T, n, ...], actions, state, episode_starts)``: the policy's public, checked
    ``evaluate`` and ``backward``, the ``[T, n]`` rows flattened for the loss (row ``t * n +
    j``) and the gradients reshaped back. What the spec backend's update runs."""
    def evaluate(params, data):
        ev = policy.evaluate(params, *data)
        return (ev.log_probs.reshape(-1), ev.entropy.reshape(-1), ev.values.reshape(-1),
                (ev.cache, ev.values.shape))

    def backward(params, cache, d_log_probs, d_entropy, d_values):
        net_cache, shape = cache
        return policy.backward(params, net_cache, d_log_probs.reshape(shape),
                               None if d_entropy is None else d_entropy.reshape(shape),
                               d_values.reshape(shape))
    return evaluate, backward


class RecurrentPPOTrainer(PPOTrainer):
    """PPO with an LSTM actor-critic (module docstring). Same constructor and methods as
    :class:`~ppo_ref.train.ppo.PPOTrainer`; the policy follows ``config.lstm_hidden_size``,
    ``config.lstm_shared``, ``config.net_arch`` (towers after the LSTM) and ``config.activation``.

    Extra attributes: ``lstm_states`` (the carried :class:`LSTMStates`, ``[L, N, H]``),
    ``envs_per_minibatch``.

    Raises:
        ValueError: everything PPOTrainer raises, and ``n_envs`` not divisible by
            ``max(1, batch_size // n_steps)`` (see :func:`envs_per_minibatch`).
    """

    policy_kind = "lstm"

    def __init__(self, env, config=None, *, seed: int = 0, **kwargs):
        if config is not None and hasattr(config, "n_envs"):
            envs_per_minibatch(config.n_envs, config.n_steps, config.batch_size)  # fail early
        super().__init__(env, config, seed=seed, **kwargs)  # vectorization, env_kwargs, ...
        c = self.config
        self.envs_per_minibatch = envs_per_minibatch(c.n_envs, c.n_steps, c.batch_size)

    def _make_policy(self, observation_space, action_space):
        """The LSTM policy of ``config.backend`` (PPOTrainer's hook; its parameters are drawn
        from the same stream, the first of the five SeedSequence children, so a seed means the
        same for both trainers and both backends)."""
        return make_recurrent_policy(observation_space, action_space, self.config)

    def _acting_policy(self) -> "_RecurrentActor":
        """The collector acts through an actor carrying each env's LSTM state."""
        self._actor = _RecurrentActor(self.policy, self.config.n_envs,
                                      keep_outputs=self.config.backend == "fast")
        return self._actor

    # -- state carried across rollouts ----------------------------------------------------------
    @property
    def lstm_states(self) -> LSTMStates:
        """The carried LSTM states ``[L, N, H]`` (those the next rollout starts from)."""
        return self._actor.state

    # -- the three steps of an update -------------------------------------------------------------
    def collect_rollout(self) -> RecurrentRollout:
        """PPOTrainer's collection with the LSTM state carried; returns a
        :class:`RecurrentRollout` holding the state every env had before step 0, with
        ``log_probs`` and ``values`` from one replay of the rollout (module docstring)."""
        start = self._actor.begin_rollout()
        rollout = super().collect_rollout()
        if not self._actor.replayed:
            # a collector that keeps the acting-time values: recompute them by the replay
            T, N = rollout.rewards.shape
            ev = self._actor.evaluate(self.params, rollout.observations.reshape(T * N, -1),
                                      rollout.actions.reshape((T * N,) + rollout.actions.shape[2:]),
                                      episode_starts=rollout.episode_starts)
            rollout.log_probs = ev.log_probs.reshape(T, N)
            rollout.values = ev.values.reshape(T, N)
        fields = {f.name: getattr(rollout, f.name) for f in dataclasses.fields(Rollout)}
        return RecurrentRollout(**fields, initial_lstm_states=start)

    def train_on(self, rollout: RecurrentRollout, advantages: np.ndarray,
                 returns: np.ndarray) -> Dict[str, float]:
        """The epochs of one PPO update on whole-env minibatches (module docstring).

        Updates ``params`` and ``adam_state`` and returns the stats of
        :func:`ppo_ref.fast.update.run_epochs` plus ``explained_variance``.

        Raises:
            ValueError: the rollout carries no ``initial_lstm_states``.
        """
        c = self.config
        start = getattr(rollout, "initial_lstm_states", None)
        if start is None:
            raise ValueError("rollout has no initial_lstm_states: collect it with "
                             "RecurrentPPOTrainer.collect_rollout")
        T, N = rollout.rewards.shape
        adv = batch_advantages(np.asarray(advantages, dtype=np.float64), c)
        ret = np.asarray(returns, dtype=np.float64)
        rng = self.minibatch_rng
        per = self.envs_per_minibatch
        policy = self.policy

        if c.backend == "spec":
            evaluate, backward = checked_passes(policy)  # the readable tier: spec.update.recurrent_minibatches
            self.params, self.adam_state, stats = spec_update.run_epochs(
                self.params, self.adam_state, config=c, lr=self.current_learning_rate(),
                clip_range=self.current_clip_range(),
                minibatches=spec_update.recurrent_minibatches(
                    rng, per, rollout.log_probs, adv, ret, rollout.values, rollout.observations,
                    rollout.actions, start, rollout.episode_starts),
                evaluate=evaluate, backward=backward)
            stats["explained_variance"] = explained_variance(rollout.values.ravel(), ret.ravel())
            return stats

        # The fast tier: the same minibatches (each group's [T, n] loss rows flattened, which
        # the compiled minibatch loss takes), gathered for all epochs at once when no KL stop
        # can end the update early (ppo_ref.fast.update.recurrent_minibatches), from the
        # rollout checked once (RecurrentPolicy._update_passes: the same numbers evaluate
        # would take, and its ValueError, naming the argument, for a rollout it refuses: raised
        # before any step, whichever minibatches a KL stop would have run).
        *data, evaluate, backward = policy._update_passes(
            rollout.observations, rollout.actions, start, rollout.episode_starts)
        minibatches = recurrent_minibatches(
            rng, per, rollout.log_probs, adv, ret, rollout.values, *data, n_epochs=c.n_epochs,
            target_kl=c.target_kl)
        self.params, self.adam_state, stats = run_epochs(
            self.params, self.adam_state, config=c, lr=self.current_learning_rate(),
            clip_range=self.current_clip_range(), minibatches=minibatches, evaluate=evaluate,
            backward=backward)
        stats["explained_variance"] = explained_variance(rollout.values.ravel(), ret.ravel())
        return stats

    # -- acting -----------------------------------------------------------------------------------
    def initial_state(self, n_envs: int = 1) -> LSTMStates:
        """Zero LSTM states for acting in ``n_envs`` envs with :meth:`predict`."""
        return self.policy.initial_state(n_envs)

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
            ``(actions, new_state)``: actions as the env receives them (Gaussian: clipped);
            unlike :meth:`PPOTrainer.predict`, the new state is returned too: pass it back.

        Raises:
            ValueError: naming the argument: ``episode_starts`` not 0/1 or not one per env;
                ``obs`` or ``state`` as the policy's ``predict`` raises.
        """
        with kernel_threads(self.threads):
            batch, single = self._obs_batch(obs)
            n = batch.shape[0]
            if state is None:
                state = self.policy.initial_state(n)
                default_start = True
            else:
                default_start = False
            if episode_starts is None:
                starts = np.full(n, default_start)
            else:
                starts = as_flag_array(episode_starts, "episode_starts", ndim=(0, 1))
                if starts.size != n:
                    raise ValueError(f"episode_starts must hold one flag per env ({n}), got shape "
                                     f"{starts.shape}")
                starts = starts.reshape(n)
            actions, new_state = self.policy.predict(self.params, batch, state, starts,
                                                     self.predict_rng, deterministic)
            return (actions[0] if single else actions), new_state

    def _episode_actor(self, deterministic: bool):
        """``act(obs)`` for one evaluation episode of :meth:`PPOTrainer.evaluate`: the memory
        starts from a reset (``episode_starts`` True on the first observation) and is carried
        through the episode."""
        state, first = None, True

        def act(obs):
            nonlocal state, first
            action, state = self.predict(obs, deterministic, state, episode_starts=first)
            first = False
            return action
        return act

    # -- checkpoints ------------------------------------------------------------------------------
    def state_arrays(self) -> Dict[str, np.ndarray]:
        """PPOTrainer's snapshot plus the carried LSTM states ``lstm/h`` and ``lstm/c``."""
        arrays = super().state_arrays()
        arrays["lstm/h"] = self._actor.state.h.copy()
        arrays["lstm/c"] = self._actor.state.c.copy()
        return arrays

    def load_state_arrays(self, arrays: Dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`state_arrays`; raises ``ValueError`` when an entry is missing or
        does not fit (the LSTM states are vetted with the rest: ``float64 [layers, n_envs,
        hidden]``, finite; see :meth:`PPOTrainer.load_state_arrays`)."""
        super().load_state_arrays(arrays)
        h = np.array(arrays["lstm/h"], dtype=np.float64)
        c = np.array(arrays["lstm/c"], dtype=np.float64)
        self._actor.state = LSTMStates(h, c)
