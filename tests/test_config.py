"""PPOConfig: docs/specification.md §5 defaults, validation naming the field, presets vs §8, round trips."""
import dataclasses
import json
import warnings

import numpy as np
import pytest

from ppo_ref.config import (CONVENTION_FIELDS, PRESETS, IneffectiveSettingWarning, PPOConfig,
                            parse_overrides)

# docs/specification.md §5 (SB3 names and defaults) and ppo_ref's extra fields, typed out here
# independently of ppo_ref/config.py.
REFERENCE_DEFAULTS = dict(
    learning_rate=3e-4, n_steps=2048, batch_size=64, n_epochs=10, gamma=0.99, gae_lambda=0.95,
    clip_range=0.2, clip_range_vf=None, normalize_advantage=True, ent_coef=0.0, vf_coef=0.5,
    max_grad_norm=0.5, target_kl=None, adam_eps=1e-5,
)
EXTRA_DEFAULTS = dict(
    n_envs=1, lr_schedule="constant", clip_range_schedule="constant",
    schedule_progress="after_rollout", net_arch=(64, 64), activation="tanh", shared_trunk=False,
    policy_head_gain=0.01, value_head_gain=1.0, ortho_init=True, log_std_init=0.0,
    use_sde=False, sde_sample_freq=-1, full_std=True, use_expln=False,  # SB3's gSDE defaults
    lstm_hidden_size=64,
    lstm_shared=False, normalize_observations=False, normalize_rewards=False,
    truncation="bootstrap", bootstrap_terminal_last_row=False, value_loss_mode="max",
    value_loss_scale=1.0, advantage_norm_scope="minibatch", advantage_norm_ddof=1,
    kl_estimator="k3", kl_stop_rule="sb3",
    clip_observations=None, clip_rewards=None,
    huber_delta=1.0, advantage_norm_eps=1e-8, advantage_norm_eps_placement="add",
    clip_interval="symmetric", clip_range_low=None, clip_range_high=None, dual_clip=None,
    clip_fraction_mode="outside",
    value_clip_boundary_grad=1.0, advantage_norm_single_element="unchanged",
    drop_truncated_steps=False, loss_aggregation="token-mean", loss_aggregation_norm=None,
    compute_dtype="float64",  # PERF: float32 network passes as an option; float64 the default
    backend="fast",  # the compiled tier by default; "spec" runs the readable tier
)

# the fields the library options added, at the values every original preset has
PLAIN = dict(advantage_norm_eps=1e-8, advantage_norm_eps_placement="add",
             clip_interval="symmetric", clip_range_low=None, clip_range_high=None,
             huber_delta=1.0, dual_clip=None, clip_fraction_mode="outside",
             value_clip_boundary_grad=1.0, advantage_norm_single_element="unchanged",
             drop_truncated_steps=False, loss_aggregation="token-mean",
             loss_aggregation_norm=None)
# what a library without the setting gets: no KL stop, no schedule, gain 1, no obs clipping
ABSENT = dict(bootstrap_terminal_last_row=False, kl_estimator="k3", kl_stop_rule="sb3",
              lr_schedule="constant", clip_range_schedule="constant",
              schedule_progress="after_rollout", value_head_gain=1.0, clip_observations=None,
              clip_rewards=None, **PLAIN)

# docs/specification.md §8 (the presets), column by column, as convention-field values.
PRESET_TABLE = {
    # this spec: bootstrap + cut; no bootstrap on last-row terminal; no 0.5, clip off, max form;
    # per minibatch ddof 1; k3 1.5x before step stop all; linear option (off); gain 1.0
    "reference": dict(truncation="bootstrap", bootstrap_terminal_last_row=False,
                      value_loss_mode="max", value_loss_scale=1.0, clip_range_vf=None,
                      advantage_norm_scope="minibatch", advantage_norm_ddof=1, kl_estimator="k3",
                      kl_stop_rule="sb3", lr_schedule="constant", clip_range_schedule="constant",
                      schedule_progress="after_rollout", value_head_gain=1.0,
                      clip_observations=None, clip_rewards=None, **PLAIN),
    # SB3: same truncation; MSE of clipped prediction; same norm; same KL; progress after rollout
    "sb3": dict(truncation="bootstrap", bootstrap_terminal_last_row=False,
                value_loss_mode="sb3", value_loss_scale=1.0, clip_range_vf=None,
                advantage_norm_scope="minibatch", advantage_norm_ddof=1, kl_estimator="k3",
                kl_stop_rule="sb3", lr_schedule="constant", clip_range_schedule="constant",
                schedule_progress="after_rollout", value_head_gain=1.0,
                      clip_observations=None, clip_rewards=None, **PLAIN),
    # CleanRL: truncation terminal; 0.5 * max form, clip on with clip_range; per minibatch ddof 1
    # (torch std of one element: NaN); k3 after each epoch 1x; annealed before rollout; gain 1.0
    "cleanrl": dict(truncation="terminate", bootstrap_terminal_last_row=False,
                    value_loss_mode="max", value_loss_scale=0.5, clip_range_vf=0.2,
                    advantage_norm_scope="minibatch", advantage_norm_ddof=1, kl_estimator="k3",
                    kl_stop_rule="cleanrl", lr_schedule="linear", clip_range_schedule="constant",
                    schedule_progress="before_rollout", value_head_gain=1.0,
                    clip_observations=None, clip_rewards=None,
                    **{**PLAIN, "advantage_norm_single_element": "NaN"}),
    # thrust-rl 0.4: truncation ignored; last-row terminal bootstraps; max form, no 0.5, clip 0.2;
    # ff whole batch ddof 0; k1 after step, current epoch; no schedule; gain 0.01
    "thrust": dict(truncation="ignore", bootstrap_terminal_last_row=True,
                   value_loss_mode="max", value_loss_scale=1.0, clip_range_vf=0.2,
                   advantage_norm_scope="batch", advantage_norm_ddof=0, kl_estimator="k1",
                   kl_stop_rule="thrust", lr_schedule="constant", clip_range_schedule="constant",
                   schedule_progress="after_rollout", value_head_gain=0.01,
                      clip_observations=None, clip_rewards=None, **PLAIN),
    # tianshou 2.0.1: GAE on V(obs_next) masked by terminated, cut at done; plain MSE, max
    # form when value_clip; per-minibatch torch std + 1e-8
    "tianshou": {**ABSENT, **dict(truncation="bootstrap", value_loss_mode="max",
                                  value_loss_scale=1.0, clip_range_vf=None,
                                  advantage_norm_scope="minibatch", advantage_norm_ddof=1)},
    # torchrl 0.14.1 ClipPPOLoss: smooth_l1 critic, k1 kl_approx, std.clamp_min(1e-6)
    "torchrl": {**ABSENT, **dict(truncation="bootstrap", value_loss_mode="huber",
                                 value_loss_scale=1.0, clip_range_vf=None,
                                 advantage_norm_scope="minibatch", advantage_norm_ddof=1,
                                 advantage_norm_eps=1e-6, advantage_norm_eps_placement="clamp",
                                 kl_estimator="k1")},
    # rlax 0.1.9: discount_t = 0 ends an episode; l2_loss has the 0.5
    "rlax": {**ABSENT, **dict(truncation="terminate", value_loss_mode="max",
                              value_loss_scale=0.5, clip_range_vf=None,
                              advantage_norm_scope="minibatch", advantage_norm_ddof=1)},
    # skrl 2.1.1: terminated only; clipped prediction MSE, value_clip 0.2; whole-memory
    # normalization; kl_threshold breaks the epoch before the step
    "skrl": {**ABSENT, **dict(truncation="ignore", value_loss_mode="sb3", value_loss_scale=1.0,
                              clip_range_vf=0.2, advantage_norm_scope="batch",
                              advantage_norm_ddof=1, kl_stop_rule="skrl")},
    # Sample Factory 2.1.1: dones without value_bootstrap; max form, ppo_clip_value 1.0;
    # clamp_min(std, 1e-7); ratio in [1/(1+eps), 1+eps]
    "sample_factory": {**ABSENT, **dict(truncation="terminate", value_loss_mode="max",
                                        value_loss_scale=1.0, clip_range_vf=1.0,
                                        advantage_norm_scope="minibatch", advantage_norm_ddof=1,
                                        advantage_norm_eps=1e-7,
                                        advantage_norm_eps_placement="clamp",
                                        clip_interval="reciprocal")},
    # PureJaxRL: done masks; 0.5 * max form with CLIP_EPS (jnp.maximum of jnp.clip: 0.75 of
    # the gradient on the exact bound); jnp std (ddof 0: one element -> 0); annealed lr
    "purejaxrl": {**ABSENT, **dict(truncation="terminate", value_loss_mode="max",
                                   value_loss_scale=0.5, clip_range_vf=0.2,
                                   advantage_norm_scope="minibatch", advantage_norm_ddof=0,
                                   lr_schedule="linear", schedule_progress="before_rollout",
                                   value_clip_boundary_grad=0.75,
                                   advantage_norm_single_element="zero")},
}

# Without normalization there is nothing to clip: every preset leaves both clips off (above);
# with it, SB3 (VecNormalize clip_obs=10.0, clip_reward=10.0) and CleanRL
# (ppo_continuous_action.py: np.clip(..., -10, 10) after its normalize wrappers) clip at 10.
CLIP_WITH_NORMALIZATION = {"reference": None, "sb3": 10.0, "cleanrl": 10.0, "thrust": None,
                           "tianshou": None, "torchrl": None, "rlax": None, "skrl": None,
                           "sample_factory": None, "purejaxrl": None}


def test_defaults_equal_spec_and_brief():
    config = PPOConfig()
    names = [f.name for f in dataclasses.fields(PPOConfig)]
    assert set(names) == set(REFERENCE_DEFAULTS) | set(EXTRA_DEFAULTS)  # exactly these fields
    for name, value in {**REFERENCE_DEFAULTS, **EXTRA_DEFAULTS}.items():
        got = getattr(config, name)
        assert got == value and type(got) is type(value), name


def test_every_field_has_a_help_string():
    helps = PPOConfig.field_help()
    assert list(helps) == [f.name for f in dataclasses.fields(PPOConfig)]
    for name, text in helps.items():
        assert len(text) > 20 and "\n" not in text, name
    assert "one of tanh, relu" in helps["activation"]
    assert "default 2048" in helps["n_steps"]


def test_frozen():
    config = PPOConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.gamma = 0.5
    assert hash(config) == hash(PPOConfig())


@pytest.mark.parametrize("name, value", [
    ("learning_rate", 0.0), ("learning_rate", -1e-3), ("learning_rate", float("nan")),
    ("learning_rate", "3e-4"),
    ("n_steps", 0), ("n_steps", -5), ("n_steps", 2.0), ("n_steps", True),
    ("batch_size", 0), ("batch_size", 4096), ("n_epochs", 0), ("n_envs", 0),
    ("lstm_hidden_size", 0),
    ("gamma", 1.01), ("gamma", -0.1), ("gae_lambda", 1.5), ("gae_lambda", -1e-9),
    ("clip_range", 0.0), ("clip_range_vf", 0.0), ("clip_range_vf", -0.2),
    ("ent_coef", -0.01), ("vf_coef", -0.5), ("value_loss_scale", -1.0),
    ("policy_head_gain", -0.01), ("value_head_gain", -1.0),
    ("max_grad_norm", 0.0), ("target_kl", 0.0), ("target_kl", -0.01), ("adam_eps", 0.0),
    ("log_std_init", float("inf")),
    ("use_sde", "yes"), ("sde_sample_freq", 0), ("sde_sample_freq", -2),
    ("sde_sample_freq", 2 ** 31),
    ("sde_sample_freq", 1.5), ("full_std", None), ("use_expln", 2),
    ("normalize_advantage", 1), ("shared_trunk", "yes"), ("lstm_shared", None),
    ("normalize_observations", 0), ("normalize_rewards", 1.0),
    ("bootstrap_terminal_last_row", "true"),
    ("net_arch", (64, 0)), ("net_arch", (64, -1)), ("net_arch", "64,64"), ("net_arch", (64.0,)),
    ("activation", "gelu"), ("lr_schedule", "cosine"), ("clip_range_schedule", "exp"),
    ("schedule_progress", "during"), ("truncation", "drop"), ("value_loss_mode", "l1"),
    ("advantage_norm_scope", "epoch"), ("advantage_norm_ddof", 2), ("kl_estimator", "k4"),
    ("kl_stop_rule", "spinningup"), ("huber_delta", 0.0), ("advantage_norm_eps", 0.0),
    ("advantage_norm_eps_placement", "max"), ("clip_interval", "log"),
    ("clip_range_low", 0.0), ("clip_range_low", 1.0), ("clip_range_high", -0.1),
    ("dual_clip", 1.0), ("dual_clip", 0.5),
    ("value_clip_boundary_grad", 1.5), ("value_clip_boundary_grad", -0.25),
    ("advantage_norm_single_element", "nan"), ("drop_truncated_steps", 1),
    ("loss_aggregation", "mean"), ("loss_aggregation_norm", 0.0),
])
def test_every_validation_names_the_field(name, value):
    with pytest.raises(ValueError, match=rf"^{name}"):
        PPOConfig(**{name: value})


def test_batch_size_bound_uses_all_envs():
    PPOConfig(n_steps=32, n_envs=8, batch_size=256)  # 32 * 8 = 256 rows: allowed
    with pytest.raises(ValueError, match=r"^batch_size \(257\).*32 \* 8 = 256"):
        PPOConfig(n_steps=32, n_envs=8, batch_size=257)


@pytest.mark.parametrize("override, match", [
    ("net_arch=100000000", r"^net_arch\[0\] must be a positive integer <= 4096"),
    ("net_arch=64,5000", r"^net_arch\[1\] must be a positive integer <= 4096"),
    ("lstm_hidden_size=100000", r"^lstm_hidden_size must be a positive integer <= 4096"),
    ("n_envs=1000000", r"^n_envs must be a positive integer <= 4096"),
    ("n_steps=100000000", r"^n_steps \* n_envs \(100000000 \* 1 = 100000000\) must be <= "),
])
def test_sizes_that_cannot_be_allocated_are_refused_naming_the_field(override, match):
    """A mistyped size (``--set net_arch=100000000``) raises at once instead of allocating
    networks or rollout buffers until memory runs out."""
    with pytest.raises(ValueError, match=match):
        PPOConfig(**parse_overrides([override]))
    PPOConfig(net_arch=(4096, 4096), lstm_hidden_size=4096, n_envs=4096, n_steps=4096,
              batch_size=64)  # the largest sizes accepted (4096 * 4096 = 2**24 rows)


def test_nan_single_element_refuses_a_one_row_minibatch():
    """A one-row last minibatch would make every update's loss NaN: refused at the config."""
    nan = dict(advantage_norm_single_element="NaN")
    PPOConfig(n_steps=128, n_envs=1, batch_size=64, **nan)  # 64 + 64 rows: allowed
    PPOConfig(n_steps=129, n_envs=1, batch_size=64, normalize_advantage=False, **nan)
    with pytest.raises(ValueError, match=r"^advantage_norm_single_element='NaN'.*129"):
        PPOConfig.preset("cleanrl", n_envs=1, n_steps=129, batch_size=64)
    with pytest.raises(ValueError, match=r"^advantage_norm_single_element"):
        PPOConfig(n_steps=1, n_envs=1, batch_size=1, advantage_norm_scope="batch", **nan)


def test_boundary_values_are_accepted():
    config = PPOConfig(gamma=1.0, gae_lambda=0.0, ent_coef=0.0, vf_coef=0.0, net_arch=(),
                       policy_head_gain=0.0, batch_size=2048, advantage_norm_ddof=0)
    assert config.net_arch == () and config.gamma == 1.0


def test_numpy_scalars_and_lists_are_normalized():
    config = PPOConfig(n_steps=np.int64(128), gamma=np.float32(0.5), net_arch=[32, np.int32(16)],
                       normalize_advantage=np.bool_(False), learning_rate=1)
    assert type(config.n_steps) is int and type(config.gamma) is float
    assert config.net_arch == (32, 16) and all(type(w) is int for w in config.net_arch)
    assert config.normalize_advantage is False and type(config.learning_rate) is float
    json.dumps(config.to_dict())  # JSON-safe after normalization


def test_replace_validates_and_rejects_unknown_fields():
    config = PPOConfig()
    changed = config.replace(gamma=0.9, net_arch=[32])
    assert changed.gamma == 0.9 and changed.net_arch == (32,) and config.gamma == 0.99
    with pytest.raises(ValueError, match="^gamma"):
        config.replace(gamma=2.0)
    with pytest.raises(ValueError, match="unknown PPOConfig field 'gama'.*'gamma'"):
        config.replace(gama=0.9)


@pytest.mark.parametrize("name", ["reference", "sb3", "cleanrl", "thrust"])
def test_to_dict_from_dict_round_trip_through_json(name):
    config = PPOConfig.preset(name, net_arch=(32, 16), target_kl=0.02)
    text = json.dumps(config.to_dict())
    back = PPOConfig.from_dict(json.loads(text))
    assert back == config
    assert isinstance(back.net_arch, tuple)
    assert json.loads(config.to_json()) == config.to_dict()


def test_from_dict_partial_and_unknown():
    assert PPOConfig.from_dict({"gamma": 0.9}) == PPOConfig(gamma=0.9)
    with pytest.raises(ValueError, match="unknown PPOConfig field 'foo'"):
        PPOConfig.from_dict({"foo": 1})
    with pytest.raises(ValueError, match="dict"):
        PPOConfig.from_dict([("gamma", 0.9)])


@pytest.mark.parametrize("name", list(PRESET_TABLE))
def test_presets_match_design_table_field_by_field(name):
    config = PPOConfig.preset(name)
    expected = PRESET_TABLE[name]
    assert set(expected) == set(CONVENTION_FIELDS)
    for field_name, value in expected.items():
        assert getattr(config, field_name) == value, f"{name}.{field_name}"
    # presets change conventions only: every other field keeps its default
    default = PPOConfig()
    for f in dataclasses.fields(PPOConfig):
        if f.name not in CONVENTION_FIELDS:
            assert getattr(config, f.name) == getattr(default, f.name), f"{name}.{f.name}"


def test_reference_preset_is_the_default():
    assert PPOConfig.preset("reference") == PPOConfig()


def test_preset_overrides():
    config = PPOConfig.preset("thrust", n_steps=128, advantage_norm_scope="minibatch")
    assert config.n_steps == 128 and config.advantage_norm_scope == "minibatch"
    assert config.kl_estimator == "k1"
    # CleanRL ties the value clip to clip_range (clip_vloss uses clip_coef) ...
    assert PPOConfig.preset("cleanrl", clip_range=0.1).clip_range_vf == 0.1
    # ... unless the value clip is overridden explicitly
    assert PPOConfig.preset("cleanrl", clip_range=0.1, clip_range_vf=None).clip_range_vf is None
    with pytest.raises(ValueError, match="preset name.*'spinningup'"):
        PPOConfig.preset("spinningup")
    with pytest.raises(ValueError, match="unknown PPOConfig field 'lr'"):
        PPOConfig.preset("sb3", lr=1e-3)
    with pytest.raises(ValueError, match="^gamma"):
        PPOConfig.preset("sb3", gamma=-1.0)


def test_zoo_cartpole():
    config = PPOConfig.zoo_cartpole()
    expected = dict(n_envs=8, n_steps=32, batch_size=256, n_epochs=20, gamma=0.98,
                    gae_lambda=0.8, learning_rate=1e-3, lr_schedule="linear", clip_range=0.2,
                    clip_range_schedule="linear", ent_coef=0.0)
    for name, value in expected.items():
        assert getattr(config, name) == value, name
    assert config.replace(**{k: getattr(PPOConfig(), k) for k in expected}) == PPOConfig()
    assert PPOConfig.zoo_cartpole(n_envs=4, batch_size=128).n_envs == 4


def test_schedules():
    config = PPOConfig.zoo_cartpole()
    assert config.learning_rate_at(1.0) == 1e-3
    assert config.learning_rate_at(0.5) == 5e-4
    assert config.clip_range_at(0.25) == 0.05
    constant = PPOConfig()
    assert constant.learning_rate_at(0.1) == 3e-4 and constant.clip_range_at(0.1) == 0.2
    with pytest.raises(ValueError, match="progress_remaining"):
        config.learning_rate_at(1.5)


# ----------------------------------------------------------------------------------------------
# parse_overrides
# ----------------------------------------------------------------------------------------------

def test_parse_overrides_types():
    parsed = parse_overrides([
        "gamma=0.98", "n_steps=128", "target_kl=none", "clip_range_vf=0.1", "shared_trunk=true",
        "normalize_advantage=0", "net_arch=[128, 64]", "activation=relu", "learning_rate=1e-3",
        "kl_stop_rule = thrust"])
    assert parsed == dict(gamma=0.98, n_steps=128, target_kl=None, clip_range_vf=0.1,
                          shared_trunk=True, normalize_advantage=False, net_arch=(128, 64),
                          activation="relu", learning_rate=1e-3, kl_stop_rule="thrust")
    assert type(parsed["n_steps"]) is int and type(parsed["gamma"]) is float
    assert parse_overrides(["net_arch=64,64"])["net_arch"] == (64, 64)
    assert parse_overrides(["net_arch=()"])["net_arch"] == ()
    assert PPOConfig().replace(**parsed).net_arch == (128, 64)


@pytest.mark.parametrize("items, match", [
    (["gama=0.9"], "unknown PPOConfig field 'gama'.*did you mean 'gamma'"),
    (["gamma"], "expected 'field=value', got 'gamma'"),
    (["gamma=0.9", "gamma=0.8"], "^gamma is given more than once"),
    (["gamma=high"], "^gamma: cannot parse 'high'"),
    (["n_steps=2.5"], "^n_steps: cannot parse '2.5' as an integer"),
    (["shared_trunk=maybe"], "^shared_trunk: cannot parse 'maybe'"),
    (["net_arch=64,x"], "^net_arch: cannot parse"),
    (["target_kl=off"], "^target_kl: cannot parse"),
    ("gamma=0.9", "list"),
])
def test_parse_overrides_errors(items, match):
    with pytest.raises(ValueError, match=match):
        parse_overrides(items)


def test_backend_is_explicit_and_spec_requires_float64():
    assert PPOConfig().backend == "fast"
    assert PPOConfig(backend="spec").backend == "spec"
    with pytest.raises(ValueError, match="^backend"):
        PPOConfig(backend="numba")
    with pytest.raises(ValueError, match="compute_dtype must be 'float64' with backend='spec'"):
        PPOConfig(backend="spec", compute_dtype="float32")


@pytest.mark.parametrize("name", list(CLIP_WITH_NORMALIZATION))
def test_preset_clips_follow_normalization(name):
    expected = CLIP_WITH_NORMALIZATION[name]
    both = PPOConfig.preset(name, normalize_observations=True, normalize_rewards=True)
    assert both.clip_observations == expected and both.clip_rewards == expected
    obs_only = PPOConfig.preset(name, normalize_observations=True)
    assert obs_only.clip_observations == expected and obs_only.clip_rewards is None
    rew_only = PPOConfig.preset(name, normalize_rewards=True)
    assert rew_only.clip_observations is None and rew_only.clip_rewards == expected
    # an explicit value wins over the preset's
    own = PPOConfig.preset(name, normalize_observations=True, clip_observations=5.0,
                           normalize_rewards=True, clip_rewards=None)
    assert own.clip_observations == 5.0 and own.clip_rewards is None


@pytest.mark.parametrize("name,flag", [("clip_observations", "normalize_observations"),
                                       ("clip_rewards", "normalize_rewards")])
def test_clip_fields_validated(name, flag):
    assert getattr(PPOConfig(**{flag: True, name: 3}), name) == 3.0
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=f"^{name} must be > 0 or None"):
            PPOConfig(**{flag: True, name: bad})
    with pytest.raises(ValueError, match=f"^{name} must be a real number"):
        PPOConfig(**{flag: True, name: "ten"})
    with pytest.raises(ValueError, match=f"^{name} must be finite"):
        PPOConfig(**{flag: True, name: float("inf")})
    # clipping acts on the normalized values: without the normalization it is an error
    with pytest.raises(ValueError, match=f"^{name} clips the normalized values: it needs {flag}"):
        PPOConfig(**{name: 10.0})
    assert parse_overrides([f"{name}=none"]) == {name: None}
    assert parse_overrides([f"{name}=10"]) == {name: 10.0}


@pytest.mark.parametrize("name,value,needs", [
    ("sde_sample_freq", 4, {"use_sde": True}),
    ("full_std", False, {"use_sde": True}),
    ("use_expln", True, {"use_sde": True}),
    ("huber_delta", 2.0, {"value_loss_mode": "huber"}),
    ("loss_aggregation_norm", 3.0, {"loss_aggregation": "seq-mean-token-sum-norm"}),
])
def test_a_setting_without_effect_warns_naming_it(name, value, needs):
    (needed, setting), = needs.items()
    with pytest.warns(IneffectiveSettingWarning, match=f"no effect .*{name}={value!r} \\(it needs {needed}"):
        PPOConfig(**{name: value})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(PPOConfig(**{name: value, needed: setting}), name) == value
        PPOConfig(**{name: PPOConfig.__dataclass_fields__[name].default})  # the default: quiet


def test_presets_and_zoo_rows_set_nothing_without_effect():
    from ppo_ref.zoo import ZOO
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in PRESETS:
            PPOConfig.preset(name)
        for row in ZOO.values():
            row.config()
