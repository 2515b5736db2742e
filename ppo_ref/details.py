"""The implementation details of PPO (:data:`DETAILS`), each mapped to the ppo_ref option or
function that implements it and the test that proves it; rendered as
``docs/implementation_details.md`` (:func:`markdown`) and by ``ppo-ref details``
(:func:`terminal_table`). Source: S. Huang, R. F. J. Dossa, A. Raffin, A. Kanervisto, W. Wang,
"The 37 Implementation Details of Proximal Policy Optimization", ICLR Blog Track 2022 (the 37,
plus 4 auxiliary ones the blog discusses on their own).
"""
from __future__ import annotations

import textwrap
from typing import List, NamedTuple, Tuple

__all__ = ["Detail", "DETAILS", "GROUPS", "markdown", "terminal_table", "MARKDOWN_PATH"]

#: Where the generated table lives in the repository (not shipped in the package).
MARKDOWN_PATH = "docs/implementation_details.md"

#: Group name -> number of details the blog lists in it.
GROUPS = {"core": 13, "atari": 9, "continuous": 9, "lstm": 5, "multidiscrete": 1,
          "auxiliary": 4}


class Detail(NamedTuple):
    """One implementation detail: ``key`` (``<group>-<number>`` in the blog's order),
    ``title`` (the blog's), ``implemented_by`` (``PPOConfig.<field>`` options and importable
    ``ppo_ref.<module>.<name>[.<attr>]``; empty when the detail does not apply), ``default``
    (the behaviour of ``PPOConfig()``), ``presets`` whose value differs (or ``"-"``), ``tests``
    (``tests/<file>.py::<function>``) and ``note`` (how ppo_ref does it, or why it does not
    apply)."""
    key: str
    title: str
    implemented_by: Tuple[str, ...]
    default: str
    presets: str
    tests: Tuple[str, ...]
    note: str

    @property
    def group(self) -> str:
        return self.key.split("-")[0]


_ATARI = ("out of scope: ppo_ref's policies read flat Box observations through an MLP or "
          "LSTM (no CNN, no image pipeline); Atari preprocessing belongs in gymnasium "
          "wrappers around the env")

DETAILS: Tuple[Detail, ...] = (
    # -- core -------------------------------------------------------------------------------
    Detail("core-1", "Vectorized architecture",
           ("PPOConfig.n_envs", "ppo_ref.train.rollout.make_vector_env",
            "ppo_ref.train.rollout.RolloutCollector"),
           "n_envs=1, sync vector env, same-step autoreset", "-",
           ("tests/test_rollout.py::test_layout_and_dtypes",
            "tests/test_rollout.py::test_no_phantom_rows_and_episode_starts_carry"),
           "one vector env of N sub-envs; rollouts are time-major [T, N]"),
    Detail("core-2", "Orthogonal initialization of weights and constant initialization of biases",
           ("ppo_ref.spec.layers.orthogonal", "ppo_ref.spec.networks.actor_critic_init",
            "PPOConfig.policy_head_gain", "PPOConfig.value_head_gain", "PPOConfig.ortho_init"),
           "hidden gain sqrt(2), policy head 0.01, value head 1.0, biases 0 (ortho_init=False: "
           "torch's own init, ppo_ref.spec.layers.torch_linear_init)",
           "thrust: value_head_gain=0.01",
           ("tests/test_mlp.py::test_orthogonal_rows_or_columns_are_orthonormal_times_gain",
            "tests/test_actor_critic.py::"
             "test_separate_towers_init_keys_shapes_gains_and_zero_biases"),
           "torch.nn.init.orthogonal_ convention (sign-corrected QR)"),
    Detail("core-3", "The Adam optimizer's epsilon parameter",
           ("PPOConfig.adam_eps", "ppo_ref.spec.optim.adam_update"),
           "adam_eps=1e-5 (added after sqrt(v_hat), torch convention)", "-",
           ("tests/test_optim.py::test_adam_eps_is_added_after_sqrt_of_v_hat",),
           "the blog's 1e-5 rather than torch's default 1e-8"),
    Detail("core-4", "Adam learning rate annealing",
           ("PPOConfig.lr_schedule", "PPOConfig.schedule_progress",
            "ppo_ref.spec.optim.linear_schedule"),
           "lr_schedule=constant", "cleanrl: lr_schedule=linear, schedule_progress=before_rollout",
           ("tests/test_ppo.py::test_linear_annealing_of_lr_and_clip_range",
            "tests/test_optim.py::test_linear_schedule"),
           "linear to 0 over total_timesteps"),
    Detail("core-5", "Generalized Advantage Estimation",
           ("PPOConfig.gae_lambda", "PPOConfig.truncation",
            "ppo_ref.spec.advantages.gae_recursion"),
           "gae_lambda=0.95, truncation=bootstrap (V(final_obs))",
           "cleanrl: truncation=terminate; thrust: truncation=ignore, "
           "bootstrap_terminal_last_row=True",
           ("tests/test_kernels.py::test_gae_equals_oracle",
            "tests/test_kernels_golden.py::test_gae_golden"),
           "returns = advantages + values (the value target)"),
    Detail("core-6", "Mini-batch updates",
           ("PPOConfig.batch_size", "PPOConfig.n_epochs", "ppo_ref.spec.update.run_epochs",
            "ppo_ref.spec.update.feedforward_minibatches"),
           "batch_size=64 rows, n_epochs=10, a fresh permutation per epoch", "-",
           ("tests/test_ppo.py::test_minibatch_rows_cover_every_row_once_per_epoch",
            "tests/test_ppo.py::test_trainer_epochs_visit_each_rollout_row_exactly_once"),
           "the last minibatch of an epoch may be smaller (SB3)"),
    Detail("core-7", "Normalization of Advantages",
           ("PPOConfig.normalize_advantage", "PPOConfig.advantage_norm_scope",
            "PPOConfig.advantage_norm_ddof", "ppo_ref.spec.losses.normalize_advantages"),
           "on, per minibatch, ddof 1, eps 1e-8",
           "thrust: advantage_norm_scope=batch, advantage_norm_ddof=0",
           ("tests/test_losses.py::test_normalize_by_hand",
            "tests/test_ppo.py::test_advantages_use_the_config_conventions"),
           "a minibatch of one row is left unchanged"),
    Detail("core-8", "Clipped surrogate objective",
           ("PPOConfig.clip_range", "ppo_ref.spec.losses.policy_loss"), "clip_range=0.2", "-",
           ("tests/test_losses.py::test_policy_loss_by_hand",
            "tests/test_losses.py::test_policy_loss_gradcheck"),
           "-mean(min(r A, clip(r, 1-eps, 1+eps) A))"),
    Detail("core-9", "Value Function Loss Clipping",
           ("PPOConfig.clip_range_vf", "PPOConfig.value_loss_mode",
            "PPOConfig.value_loss_scale", "ppo_ref.spec.losses.value_loss"),
           "clip_range_vf=None (off), max form when on, no 0.5",
           "sb3: value_loss_mode=sb3; cleanrl: clip_range_vf=clip_range, value_loss_scale=0.5; "
           "thrust: clip_range_vf=0.2",
           ("tests/test_losses.py::test_value_loss_clipped_by_hand",
            "tests/test_losses.py::test_value_loss_gradcheck"),
           "the blog finds clipping does not help; off by default as in SB3"),
    Detail("core-10", "Overall Loss and Entropy Bonus",
           ("PPOConfig.ent_coef", "PPOConfig.vf_coef", "ppo_ref.spec.losses.entropy_loss",
            "ppo_ref.spec.update.minibatch_loss"), "ent_coef=0.0, vf_coef=0.5", "-",
           ("tests/test_ppo.py::test_minibatch_loss_gradients_scale_with_coefficients",
            "tests/test_losses.py::test_entropy_loss"),
           "loss = policy - ent_coef * entropy + vf_coef * value"),
    Detail("core-11", "Global Gradient Clipping",
           ("PPOConfig.max_grad_norm", "ppo_ref.spec.optim.clip_by_global_norm"),
           "max_grad_norm=0.5", "-",
           ("tests/test_optim.py::test_clip_above_threshold_by_hand",
            "tests/test_optim.py::test_clip_property_norm_bounded_and_direction_kept"),
           "one L2 norm over every parameter's gradient"),
    Detail("core-12", "Debug variables",
           ("ppo_ref.spec.losses.approx_kl", "ppo_ref.spec.losses.explained_variance",
            "PPOConfig.kl_estimator"),
           "approx_kl (k3), clip_fraction, explained_variance, entropy, losses per update",
           "thrust: kl_estimator=k1",
           ("tests/test_losses.py::test_approx_kl_by_hand",
            "tests/test_losses.py::test_explained_variance",
            "tests/test_ppo.py::test_stats_are_reported_and_finite"),
           "reported in every update's stats and in metrics.csv"),
    Detail("core-13", "Shared and separate MLP networks for policy and value functions",
           ("PPOConfig.shared_trunk", "PPOConfig.net_arch",
            "ppo_ref.spec.networks.actor_critic_forward"),
           "shared_trunk=False, net_arch=64,64, tanh", "-",
           ("tests/test_actor_critic.py::test_shared_trunk_init_keys_shapes_and_gains",
            "tests/test_actor_critic.py::test_shared_forward_equals_trunk_then_heads"),
           "separate towers by default; shared_trunk=True shares the hidden layers"),
    # -- Atari ------------------------------------------------------------------------------
    *(Detail(f"atari-{i}", title, (), "-", "-", (), _ATARI) for i, title in enumerate((
        "NoopResetEnv", "MaxAndSkipEnv", "EpisodicLifeEnv", "FireResetEnv",
        "WarpFrame (Image transformation)", "ClipRewardEnv", "FrameStack",
        "Shared Nature-CNN network", "Scaling the Images to Range [0, 1]"), start=1)),
    # -- continuous actions -----------------------------------------------------------------
    Detail("continuous-1", "Continuous actions via normal distributions",
           ("ppo_ref.train.policies.GaussianHead", "ppo_ref.spec.distributions.gaussian_log_prob"),
           "diagonal Gaussian for 1-d Box actions", "-",
           ("tests/test_distributions.py::test_gaussian_log_prob_entropy_values_and_gradients",
            "tests/test_ppo.py::test_pendulum_continuous_actions_smoke"),
           "the mean is the policy tower's output"),
    Detail("continuous-2", "State-independent log standard deviation",
           ("PPOConfig.log_std_init", "ppo_ref.train.policies.GaussianHead.init_params"),
           "log_std_init=0.0, one trained log_std per action dimension", "-",
           ("tests/test_distributions.py::test_gaussian_log_prob_entropy_values_and_gradients",),
           "parameter key log_std"),
    Detail("continuous-3", "Independent action components",
           ("ppo_ref.spec.distributions.gaussian_log_prob",
            "ppo_ref.spec.distributions.gaussian_entropy"),
           "log-probs and entropies summed over action dimensions", "-",
           ("tests/test_distributions.py::test_gaussian_log_prob_entropy_values_and_gradients",),
           "diagonal covariance"),
    Detail("continuous-4", "Separate MLP networks for policy and value functions",
           ("PPOConfig.shared_trunk",), "shared_trunk=False", "-",
           ("tests/test_actor_critic.py::"
             "test_separate_towers_init_keys_shapes_gains_and_zero_biases",),
           "as core-13"),
    Detail("continuous-5", "Handling of action clipping to valid range and storage",
           ("ppo_ref.train.policies.GaussianHead.to_env",),
           "env gets clip(sample, low, high); buffer and log-prob keep the raw sample", "-",
           ("tests/test_rollout.py::test_box_actions_env_gets_clipped_buffer_keeps_raw",),
           "SB3's convention"),
    Detail("continuous-6", "Normalization of Observation",
           ("PPOConfig.normalize_observations",
            "ppo_ref.train.rollout.RolloutCollector.normalize_obs"),
           "off; when on: running mean/var of every batch of raw observations, eps 1e-8", "-",
           ("tests/test_rollout.py::test_observation_statistics_equal_gymnasium_running_mean_std",
            "tests/test_checkpoint.py::test_exact_resume_with_normalization_and_gaussian_policy"),
           "statistics are checkpointed; frozen during evaluation"),
    Detail("continuous-7", "Observation Clipping",
           ("PPOConfig.clip_observations", "ppo_ref.train.rollout.RolloutCollector.normalize_obs"),
           "None (off); needs normalize_observations",
           "sb3, cleanrl: 10.0 when normalize_observations=True",
           ("tests/test_rollout.py::test_clipping_stores_clipped_values_and_keeps_statistics_raw",
            "tests/test_rollout.py::test_clipping_resume_is_exact",
            "tests/test_config.py::test_preset_clips_follow_normalization"),
           "clips the normalized observation; statistics stay those of the raw values"),
    Detail("continuous-8", "Reward Scaling",
           ("PPOConfig.normalize_rewards", "ppo_ref.train.rollout.RolloutCollector"),
           "off; when on: divide by the running std of the discounted return", "-",
           ("tests/test_rollout.py::"
             "test_reward_normalization_logs_raw_returns_and_obs_stats_freeze",),
           "gymnasium's vector NormalizeReward; episode returns are logged raw"),
    Detail("continuous-9", "Reward Clipping",
           ("PPOConfig.clip_rewards", "ppo_ref.train.rollout.RolloutCollector.collect"),
           "None (off); needs normalize_rewards", "sb3, cleanrl: 10.0 when normalize_rewards=True",
           ("tests/test_rollout.py::test_clipping_stores_clipped_values_and_keeps_statistics_raw",
            "tests/test_config.py::test_clip_fields_validated"),
           "clips the scaled reward the buffer stores; the return statistics use raw rewards"),
    # -- LSTM -------------------------------------------------------------------------------
    Detail("lstm-1", "Layer initialization for LSTM layers",
           ("ppo_ref.spec.lstm.lstm_init",), "orthogonal weights (gain 1), zero biases", "-",
           ("tests/test_lstm.py::test_init_is_orthogonal_with_zero_bias",),
           "PPOConfig.lstm_hidden_size sets the size (sb3-contrib uses 256)"),
    Detail("lstm-2", "Initialize the LSTM states to be zeros",
           ("ppo_ref.train.policies.RecurrentPolicy.initial_state",),
           "zeros at the first reset", "-",
           ("tests/test_recurrent_policies.py::test_keys_and_state_layout",),
           "h and c both zero"),
    Detail("lstm-3", "Reset LSTM states at the end of the episode",
           ("ppo_ref.spec.lstm.lstm_forward", "ppo_ref.spec.masks.episode_starts_loop"),
           "state multiplied by (1 - episode_starts[t]) before step t", "-",
           ("tests/test_spec_lstm.py::"
             "test_one_trace_with_a_reset_equals_the_two_episodes_run_separately",
            "tests/test_recurrent_policies.py::test_episode_start_resets_both_lstms"),
           "the gradient stops at the same points"),
    Detail("lstm-4", "Prepare sequential rollouts in mini-batches",
           ("ppo_ref.spec.update.recurrent_minibatches",
            "ppo_ref.train.recurrent_ppo.envs_per_minibatch"),
           "whole environments, full T steps, per minibatch", "-",
           ("tests/test_recurrent_ppo.py::"
             "test_recurrent_minibatches_are_whole_envs_from_their_start_state",
            "tests/test_recurrent_ppo.py::"
             "test_train_on_replays_each_env_once_per_epoch_as_whole_sequences"),
           "CleanRL's scheme (sb3-contrib cuts sequences at episode starts instead)"),
    Detail("lstm-5", "Reconstruct LSTM states during training",
           ("ppo_ref.train.policies.RecurrentPolicy.evaluate",),
           "replay from the stored rollout-start state", "-",
           ("tests/test_recurrent_ppo.py::"
             "test_first_minibatch_ratio_is_exactly_one_across_boundaries",),
           "thrust-rl replays from a zero state instead (not a preset option)"),
    # -- MultiDiscrete ----------------------------------------------------------------------
    Detail("multidiscrete-1", "Independent action components (MultiDiscrete)",
           ("ppo_ref.train.policies.MultiCategoricalHead",
            "ppo_ref.spec.distributions.multi_categorical_log_prob",
            "ppo_ref.spec.distributions.multi_categorical_entropy"),
           "log-prob and entropy summed over independent categoricals", "-",
           ("tests/test_multidiscrete.py::test_sum_over_components_of_the_categorical_functions",
            "tests/test_multidiscrete.py::test_mlp_policy_gradients",
            "tests/test_multidiscrete.py::test_mlp_learns_multichoice"),
           "consecutive logit slices of nvec[k] entries; env ppo_ref/MultiChoice-v0"),
    # -- auxiliary --------------------------------------------------------------------------
    Detail("auxiliary-1", "Clip Range Annealing",
           ("PPOConfig.clip_range_schedule", "PPOConfig.clip_range"),
           "clip_range_schedule=constant", "-",
           ("tests/test_ppo.py::test_linear_annealing_of_lr_and_clip_range",),
           "linear to 0 like the learning rate (the zoo CartPole settings use it)"),
    Detail("auxiliary-2", "Parallellized Gradient Update", (), "-", "-", (),
           "not applicable: ppo_ref is a single-process reference; averaging gradients over "
           "data-parallel workers with equal minibatches gives the gradient of the combined "
           "minibatch, which one process computes directly"),
    Detail("auxiliary-3", "Early Stopping of the policy optimizations",
           ("PPOConfig.target_kl", "PPOConfig.kl_stop_rule", "PPOConfig.kl_estimator"),
           "target_kl=None (off); rule sb3: 1.5 x target before the step, stops every epoch",
           "cleanrl: kl_stop_rule=cleanrl; thrust: kl_stop_rule=thrust, kl_estimator=k1",
           ("tests/test_ppo.py::test_sb3_rule_skips_the_step_and_stops_all_epochs",
            "tests/test_ppo.py::test_cleanrl_rule_uses_last_minibatch_kl_of_the_epoch"),
           "the rule of each library, by preset"),
    Detail("auxiliary-4", "Invalid Action Masking",
           ("ppo_ref.spec.distributions.categorical_log_prob",
            "ppo_ref.spec.distributions.categorical_sample"),
           "-inf logits mark invalid actions (probability 0, never sampled, gradient 0)", "-",
           ("tests/test_distributions.py::"
             "test_masked_logits_have_zero_probability_and_finite_entropy",
            "tests/test_distributions.py::"
             "test_sampling_frequencies_match_probabilities_and_masked_never_drawn"),
           "at the distribution level; the trainers do not read masks from the env"),
)

_COLUMNS = ("key", "detail", "implemented by", "default", "presets that differ", "tests", "note")


def _code(items) -> str:
    return " ".join(f"`{item}`" for item in items) if items else "n/a"


def markdown() -> str:
    """The text of ``docs/implementation_details.md``: a header and one table row per
    detail; the cells ``implemented by`` and ``tests`` hold backticked names separated by
    spaces (``n/a`` when the detail does not apply)."""
    lines = [
        "# PPO implementation details in ppo_ref",
        "",
        "One row per detail of Huang et al., \"The 37 Implementation Details of Proximal Policy",
        "Optimization\" (ICLR Blog Track 2022): 13 core, 9 Atari, 9 continuous-action, 5 LSTM,",
        "1 MultiDiscrete, plus the blog's 4 auxiliary details. `PPOConfig.<field>` is an option",
        "of `ppo_ref.config.PPOConfig`, a dotted `ppo_ref.` path a function or class, presets",
        "are those of `PPOConfig.preset`, tests are `file::function`.",
        "",
        "Generated from `ppo_ref/details.py` (edit it there; `ppo-ref details` prints the same",
        "table; `tests/test_implementation_details.py` checks that this file is up to date and",
        "that every name in it exists).",
        "",
        "| " + " | ".join(_COLUMNS) + " |",
        "|" + "|".join("---" for _ in _COLUMNS) + "|",
    ]
    for d in DETAILS:
        cells = (d.key, d.title, _code(d.implemented_by), d.default, d.presets, _code(d.tests),
                 d.note)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def terminal_table(width: int = 100) -> str:
    """The table for a terminal: one block per detail (key and title, then the indented
    fields wrapped to ``width`` columns), the same content as :func:`markdown`."""
    out: List[str] = []
    group = None
    for d in DETAILS:
        if d.group != group:
            group = d.group
            out.append(f"== {group} ({GROUPS[group]}) ==")
        out.append(f"{d.key}  {d.title}")
        for label, text in (("implemented by", _code(d.implemented_by)),
                            ("default", d.default), ("presets", d.presets),
                            ("tests", _code(d.tests)), ("note", d.note)):
            out.extend(textwrap.wrap(text, width=width, initial_indent=f"    {label}: ",
                                     subsequent_indent=" " * 8, break_long_words=False,
                                     break_on_hyphens=False))
    return "\n".join(out) + "\n"
