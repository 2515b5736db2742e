"""``PPOConfig``: every setting of a PPO run, with Stable-Baselines3 names and defaults: the
hyperparameters (docs/specification.md §5), network and environment options, and the
*convention fields* where implementations choose differently (``PPOConfig.preset``, §8). Each
field's help text documents the CLI's ``--set field=value`` (:func:`parse_overrides`).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Optional, Tuple

from ppo_ref._checks import one_line_repr
from ppo_ref.spec.layers import ACTIVATIONS
from ppo_ref.spec.losses import (CLIP_FRACTION_MODES, CLIP_INTERVALS, KL_ESTIMATORS,
                                 NORM_EPS_PLACEMENTS, SINGLE_ELEMENT_RESULTS, VALUE_LOSS_MODES)
from ppo_ref.spec.masks import TRUNCATION_MODES
from ppo_ref.spec.optim import scheduled_value
from ppo_ref.spec.update import KL_STOP_RULES, LOSS_AGGREGATIONS
from ppo_ref.tiers import BACKENDS, COMPUTE_DTYPES

__all__ = ["PPOConfig", "parse_overrides", "PRESETS", "CONVENTION_FIELDS", "CLIP_NEEDS",
           "IneffectiveSettingWarning", "MAX_WIDTH", "MAX_ENVS", "MAX_ROWS"]


def _f(default, help: str, choices: Optional[Tuple] = None):
    meta = {"help": help} if choices is None else {"help": help, "choices": tuple(choices)}
    return field(default=default, metadata=meta)


_SCHEDULES = ("constant", "linear")


def _clip_help(what: str) -> str:
    return (f"clip normalized {what} to [-c, c], c > 0 (needs normalize_{what}; None: no "
            "clipping; SB3 VecNormalize and CleanRL continuous use 10)")


@dataclass(frozen=True)
class PPOConfig:
    """Settings of a PPO run (every trainer); ``PPOConfig()`` is the reference. Rewards and
    values are in the env's reward units; ``n_steps`` counts steps per env, ``batch_size`` rows
    of the ``n_steps * n_envs`` rollout. ``ValueError`` at construction (and in ``replace``,
    ``from_dict``) for an invalid field, the message starting with the field's name."""

    # --- Stable-Baselines3 hyperparameters (docs/specification.md §5) ---------------------------
    learning_rate: float = _f(3e-4, "Adam step size; the initial value when lr_schedule='linear'")
    n_steps: int = _f(2048, "env steps collected per environment per rollout (T)")
    batch_size: int = _f(64, "minibatch size in rows (env steps); at most n_steps * n_envs")
    n_epochs: int = _f(10, "passes over the rollout per update")
    gamma: float = _f(0.99, "discount factor in [0, 1]")
    gae_lambda: float = _f(0.95, "GAE lambda in [0, 1] (bias-variance trade-off of advantages)")
    clip_range: float = _f(
        0.2, "PPO ratio clip eps > 0; initial value when clip_range_schedule='linear'")
    clip_range_vf: Optional[float] = _f(
        None, "value clip c > 0 around the rollout's values (None: no value clipping)")
    normalize_advantage: bool = _f(True, "standardize advantages (see advantage_norm_scope/_ddof)")
    ent_coef: float = _f(0.0, "entropy bonus coefficient >= 0")
    vf_coef: float = _f(0.5, "value loss coefficient >= 0")
    max_grad_norm: float = _f(0.5, "clip the global gradient L2 norm to this value (> 0)")
    target_kl: Optional[float] = _f(
        None, "KL early-stop threshold > 0 (None: never stop early); rule: kl_stop_rule")
    adam_eps: float = _f(1e-5, "Adam epsilon > 0, added after sqrt(v_hat) (torch convention)")

    # --- run, schedules, network ---------------------------------------------------------------
    n_envs: int = _f(1, "parallel environments (N)")
    lr_schedule: str = _f("constant", "learning-rate schedule", _SCHEDULES)
    clip_range_schedule: str = _f("constant", "clip_range schedule", _SCHEDULES)
    schedule_progress: str = _f(
        "after_rollout", "schedule progress counts steps after the rollout (SB3) or before it "
        "(CleanRL)", ("after_rollout", "before_rollout"))
    net_arch: Tuple[int, ...] = _f(
        (64, 64), "hidden layer sizes of each MLP tower, e.g. 64,64; () for none (linear heads)")
    activation: str = _f("tanh", "hidden-layer activation", ACTIVATIONS)
    shared_trunk: bool = _f(False, "share the hidden layers between policy and value heads")
    policy_head_gain: float = _f(0.01, "orthogonal-init gain of the policy output layer (>= 0)")
    value_head_gain: float = _f(1.0, "orthogonal-init gain of the value output layer (>= 0)")
    ortho_init: bool = _f(True, "orthogonal initialization with the gains above (False: torch's "
                                "own nn.Linear / nn.LSTM initialization, SB3's ortho_init=False)")
    log_std_init: float = _f(0.0, "initial log standard deviation of Gaussian policies")
    # gSDE (generalized state-dependent exploration, Box actions; SB3's names and defaults)
    use_sde: bool = _f(False, "gSDE: state-dependent exploration noise phi(s) @ E with E drawn "
                              "from a learned std (Box actions, feedforward policy only)")
    sde_sample_freq: int = _f(-1, "gSDE: draw new exploration matrices every this many steps "
                                  "(a positive int), or -1: once at the start of each rollout")
    full_std: bool = _f(True, "gSDE: one std per (feature, action dimension); False: one per "
                              "feature, shared by the action dimensions")
    use_expln: bool = _f(False, "gSDE: std = expln(log_std) (exp below 0, log1p(x) + 1 above) "
                                "instead of exp(log_std)")
    lstm_hidden_size: int = _f(64, "LSTM hidden size H (recurrent policy)")
    lstm_shared: bool = _f(False, "one LSTM for actor and critic (False: a separate critic LSTM)")
    normalize_observations: bool = _f(False, "running mean/std observation normalization")
    normalize_rewards: bool = _f(False, "running return-std reward scaling")
    clip_observations: Optional[float] = _f(None, _clip_help("observations"))
    clip_rewards: Optional[float] = _f(None, _clip_help("rewards"))
    compute_dtype: str = _f(
        "float64", "arithmetic of the policy's network and head, acting and training: float64 "
        "(reference) or float32 (backend fast only, as torch; parameters, losses and Adam stay "
        "float64)", ("float64", "float32"))
    backend: str = _f(
        "fast", "which tier runs the computation: fast (compiled, declared equal to the readable "
        "tier and tested against it) or spec (the readable NumPy tier of ppo_ref/spec/, float64)",
        BACKENDS)

    # --- convention knobs (docs/specification.md §8) -------------------------------------------
    truncation: str = _f(
        "bootstrap", "truncated steps: bootstrap V(final_obs) and cut the trace (reference, SB3), "
        "treat as terminal (CleanRL, PureJaxRL), or ignore the flag (thrust-rl 0.4)",
        TRUNCATION_MODES)
    bootstrap_terminal_last_row: bool = _f(
        False, "a terminal on the last rollout row still bootstraps last_values (thrust-rl 0.4)")
    value_loss_mode: str = _f(
        "max", "value loss when clipped (clip_range_vf): max of both squared errors (baselines, "
        "CleanRL), the clipped prediction's squared error (SB3's clipped MSE), or the Huber loss "
        "(torchrl's default smooth_l1, delta 1; max form when clipped)", VALUE_LOSS_MODES)
    huber_delta: float = _f(1.0, "Huber threshold > 0 of value_loss_mode='huber' (torchrl: 1)")
    value_loss_scale: float = _f(1.0, "factor >= 0 on the value loss and its gradient before "
                                      "vf_coef (CleanRL's 0.5 * MSE, rlax: 0.5)")
    advantage_norm_scope: str = _f("minibatch", "normalize advantages per minibatch or once "
                                   "over the whole batch", ("minibatch", "batch"))
    advantage_norm_ddof: int = _f(1, "ddof of the advantage std: 1 (torch std: SB3, CleanRL) or 0 "
                                     "(numpy/jnp std: thrust-rl)", (0, 1))
    advantage_norm_eps: float = _f(
        1e-8, "eps > 0 of the advantage normalization (SB3, CleanRL, tianshou, skrl, PureJaxRL: "
        "1e-8; Sample Factory 1e-7; torchrl 1e-6, masked 1e-4)")
    advantage_norm_eps_placement: str = _f(
        "add", "(A - mean) / (std + eps) (SB3, CleanRL), / max(std, eps) (torchrl, Sample Factory) "
        "or / sqrt(var + eps) (TRL's and verl's masked_whiten)", NORM_EPS_PLACEMENTS)
    clip_interval: str = _f("symmetric", "ratio clip interval [1 - eps, 1 + eps] (the paper) or "
                            "Sample Factory's [1 / (1 + eps), 1 + eps]", CLIP_INTERVALS)
    clip_range_low: Optional[float] = _f(
        None, "eps of the lower ratio bound 1 - eps, in (0, 1) (None: clip_range; torchrl's "
              "clip_epsilon=(low, high))")
    clip_range_high: Optional[float] = _f(None, "eps of the upper ratio bound 1 + eps, > 0 "
                                              "(None: clip_range)")
    dual_clip: Optional[float] = _f(
        None, "dual clip c > 1: for A < 0 the surrogate is max(min(...), c * A) (tianshou); "
              "None: off")
    clip_fraction_mode: str = _f(
        "outside", "what clip_fraction counts: the ratio outside the clip interval (SB3, CleanRL) "
        "or where the clip changes the loss (active: verl's pg_clipfrac)", CLIP_FRACTION_MODES)
    kl_estimator: str = _f(
        "k3", "approx_kl estimator (reported by the policy loss, read by the early stop): k3 = "
        "mean(exp(r) - 1 - r) (SB3, CleanRL), k1 = mean(old - new) (thrust-rl, torchrl) or k2 = "
        "mean(r^2 / 2)", KL_ESTIMATORS)
    kl_stop_rule: str = _f(
        "sb3", "early stop: sb3 (before the step, 1.5x, stop all), cleanrl (after each epoch, "
        "1x), thrust (after the step, end the current epoch only), skrl (before the step, 1x, "
        "end the current epoch only)", KL_STOP_RULES)
    value_clip_boundary_grad: float = _f(
        1.0, "fraction in [0, 1] of the unclipped value gradient where |V - V_old| == "
             "clip_range_vf exactly (max forms): 1 torch/TF autodiff, 0.75 JAX (PureJaxRL), "
             "0.5 or 0 a clip that passes nothing at its bound")
    advantage_norm_single_element: str = _f(
        "unchanged", "what advantage normalization makes of one element: unchanged (SB3), zero "
                     "(ddof=0 std: PureJaxRL) or NaN (torch std of one element: CleanRL)",
        SINGLE_ELEMENT_RESULTS)
    drop_truncated_steps: bool = _f(
        False, "give steps that ended by truncation (truncated and not terminated) weight 0 in "
               "every loss mean (they still feed the advantages of earlier steps; no function "
               "quantity takes the flags, only a whole update's trace shows it: identify_trace)")
    loss_aggregation: str = _f(
        "token-mean", "how the minibatch loss reduces per-row (per-token) terms, verl's "
        "loss_agg_mode names: token-mean (TRL), seq-mean-token-mean, token-sum, "
        "seq-mean-token-sum, or the sum over a constant (seq-mean-token-sum-norm: Dr. GRPO); a "
        "sequence is a recurrent minibatch's env column, else the minibatch (ppo_ref.testing "
        "searches it through the row layouts only)", LOSS_AGGREGATIONS)
    loss_aggregation_norm: Optional[float] = _f(
        None, "the constant of loss_aggregation='seq-mean-token-sum-norm', > 0 (None: the row "
              "count of the longest sequence)")

    def __post_init__(self) -> None:
        hints = _type_hints()
        for f in dataclasses.fields(self):
            value = _coerce(f.name, getattr(self, f.name), hints[f.name])
            object.__setattr__(self, f.name, value)
            choices = f.metadata.get("choices")
            if choices is not None and value not in choices:
                raise ValueError(f"{f.name} must be one of {list(choices)}, got {value!r}")

        for names, ok, what in _BOUNDS:
            for name in names:
                if not ok(getattr(self, name)):
                    raise ValueError(f"{name} must be {what}, got {getattr(self, name)}")
        if self.clip_range_low is not None and not self.clip_range_low < 1.0:
            raise ValueError(f"clip_range_low must be < 1 (the ratio bound 1 - clip_range_low "
                             f"must be > 0), got {self.clip_range_low}")
        if self.clip_interval == "reciprocal" and self.clip_range_low is not None:
            raise ValueError("clip_range_low must be None with clip_interval='reciprocal' (the "
                             "lower bound is 1 / (1 + eps))")
        for name, flag in CLIP_NEEDS.items():
            if getattr(self, name) is not None and not getattr(self, flag):
                raise ValueError(f"{name} clips the normalized values: it needs {flag}=True "
                                 f"(or {name}=None), got {name}={getattr(self, name)} with "
                                 f"{flag}=False")
        if self.sde_sample_freq != -1 and not 0 < self.sde_sample_freq < 2 ** 31:
            raise ValueError(f"sde_sample_freq must be -1 (new exploration matrices only at the "
                             f"start of each rollout) or a positive number of steps below 2**31, "
                             f"got {self.sde_sample_freq}")
        for i, width in enumerate(self.net_arch):
            if not 0 < width <= MAX_WIDTH:
                raise ValueError(f"net_arch[{i}] must be a positive integer <= {MAX_WIDTH} "
                                 f"(MAX_WIDTH), got {width}")
        allowed = COMPUTE_DTYPES[self.backend]
        if self.compute_dtype not in allowed:
            raise ValueError(f"compute_dtype must be {' or '.join(map(repr, allowed))} with "
                             f"backend={self.backend!r}, got {self.compute_dtype!r}")
        rows = self.n_steps * self.n_envs
        if rows > MAX_ROWS:
            raise ValueError(f"n_steps * n_envs ({self.n_steps} * {self.n_envs} = {rows}) must be "
                             f"<= {MAX_ROWS} (MAX_ROWS): the rollout would not fit in memory")
        if self.batch_size > rows:
            raise ValueError(f"batch_size ({self.batch_size}) must be <= n_steps * n_envs "
                             f"({self.n_steps} * {self.n_envs} = {rows})")
        one_row = rows == 1 if self.advantage_norm_scope == "batch" else (
            self.batch_size == 1 or rows % self.batch_size == 1)  # the last minibatch
        if self.normalize_advantage and self.advantage_norm_single_element == "NaN" and one_row:
            raise ValueError("advantage_norm_single_element='NaN' with a one-row "
                             f"{self.advantage_norm_scope} (n_steps * n_envs = {rows}, "
                             f"batch_size = {self.batch_size}) makes every update's loss NaN: "
                             "change batch_size or advantage_norm_single_element")
        inert = [f"{name}={getattr(self, name)!r} (it needs {needs})"
                 for name, (active, needs) in _NEEDS.items()
                 if getattr(self, name) != _default(name) and not active(self)]
        if inert:
            warnings.warn(f"PPOConfig: settings that have no effect in this configuration: "
                          f"{'; '.join(inert)}", IneffectiveSettingWarning, stacklevel=3)

    def replace(self, **changes: Any) -> "PPOConfig":
        """A copy with ``changes`` applied and validated (``ValueError`` for unknown fields)."""
        _check_known(changes)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> Dict[str, Any]:
        """JSON-safe ``{field: value}`` (tuples become lists); inverse of :meth:`from_dict`."""
        return {name: list(value) if isinstance(value, tuple) else value
                for name, value in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "PPOConfig":
        """Inverse of :meth:`to_dict`: missing fields take their defaults, unknown keys raise
        ``ValueError`` naming them."""
        if not isinstance(d, dict):
            raise ValueError(f"from_dict expects a dict, got {type(d).__name__}")
        _check_known(d)
        return cls(**d)

    def to_json(self) -> str:
        """``to_dict()`` as indented JSON text, fields in declaration order."""
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def field_help(cls) -> Dict[str, str]:
        """``{field: "help text (default ...; choices ...)"}`` in declaration order, for the CLI."""
        out = {}
        for f in dataclasses.fields(cls):
            text = f"{f.metadata['help']} (default {_format(f.default)}"
            if "choices" in f.metadata:
                text += "; one of " + ", ".join(str(c) for c in f.metadata["choices"])
            out[f.name] = text + ")"
        return out

    def learning_rate_at(self, progress_remaining: float) -> float:
        """Learning rate at ``progress_remaining`` (1 at the start, 0 at the end) under
        ``lr_schedule``: ``learning_rate`` or ``learning_rate * progress_remaining``."""
        return scheduled_value(self.lr_schedule, self.learning_rate, progress_remaining)

    def clip_range_at(self, progress_remaining: float) -> float:
        """Clip range at ``progress_remaining`` under ``clip_range_schedule`` (as
        :meth:`learning_rate_at`). ``clip_range_vf`` is never scheduled."""
        return scheduled_value(self.clip_range_schedule, self.clip_range, progress_remaining)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "PPOConfig":
        """The conventions of one implementation (every field of :data:`CONVENTION_FIELDS`,
        :data:`PRESETS`; the source of every choice: docs/specification.md §8.1), with
        ``overrides`` on top; hyperparameters keep their defaults unless overridden.

        ``"reference"``: ``PPOConfig()``. ``"sb3"``: Stable-Baselines3 / sb3-contrib PPO.
        ``"cleanrl"``: CleanRL ``ppo.py`` / ``ppo_continuous_action.py``. ``"thrust"``:
        thrust-rl 0.4. ``"tianshou"``: tianshou 2.0.1. ``"torchrl"``: torchrl 0.14.1
        (``ClipPPOLoss``). ``"rlax"``: rlax 0.1.9. ``"skrl"``: skrl 2.1.1. ``"sample_factory"``:
        Sample Factory 2.1.1. ``"purejaxrl"``: PureJaxRL ``purejaxrl/ppo.py`` at commit
        31756b19. In the CleanRL and PureJaxRL presets ``clip_range_vf`` follows an overridden
        ``clip_range``; in the SB3 and CleanRL presets ``clip_observations``/``clip_rewards``
        are 10.0 when that normalization is on, else None. ``ValueError`` for an unknown preset
        name or field, or an invalid resulting config."""
        if name not in PRESETS:
            raise ValueError(f"preset name must be one of {list(PRESETS)}, got {name!r}")
        _check_known(overrides)
        values = dict(PRESETS[name])
        if values.get("clip_range_vf") is _SAME_AS_CLIP_RANGE:
            values["clip_range_vf"] = overrides.get("clip_range", _default("clip_range"))
        for clip_name, flag in CLIP_NEEDS.items():
            if values.get(clip_name) is _TEN_WITH_NORMALIZATION:
                values[clip_name] = 10.0 if overrides.get(flag, _default(flag)) else None
        return cls(**{**values, **overrides})

    @classmethod
    def zoo_cartpole(cls, **overrides: Any) -> "PPOConfig":
        """rl-baselines3-zoo's CartPole-v1 PPO settings (``lin_1e-3``, ``lin_0.2``: linear
        schedules) on the reference conventions, ``overrides`` on top."""
        _check_known(overrides)
        return cls(**{**dict(n_envs=8, n_steps=32, batch_size=256, n_epochs=20, gamma=0.98,
                             gae_lambda=0.8, learning_rate=1e-3, lr_schedule="linear",
                             clip_range=0.2, clip_range_schedule="linear", ent_coef=0.0),
                      **overrides})


#: The largest layer width (``net_arch`` entries, ``lstm_hidden_size``; a 4096 x 4096 float64
#: weight matrix takes 128 MiB), number of envs (each a Python object or a process of this
#: machine, stepped in turn) and rollout rows (``n_steps * n_envs``) a config accepts, so that a
#: mistyped size raises instead of allocating until memory runs out.
MAX_WIDTH, MAX_ENVS, MAX_ROWS = 4096, 4096, 2 ** 24

#: ``(fields, test, what the value must be)``: the bounds :class:`PPOConfig` checks (after each
#: field's type, :func:`_coerce`).
_BOUNDS = (
    (("n_steps", "batch_size", "n_epochs"), lambda v: v > 0, "a positive integer"),
    (("n_envs",), lambda v: 0 < v <= MAX_ENVS, f"a positive integer <= {MAX_ENVS} (MAX_ENVS)"),
    (("lstm_hidden_size",), lambda v: 0 < v <= MAX_WIDTH,
     f"a positive integer <= {MAX_WIDTH} (MAX_WIDTH)"),
    (("learning_rate", "clip_range", "max_grad_norm", "adam_eps", "huber_delta",
      "advantage_norm_eps"), lambda v: v > 0, "> 0"),
    (("ent_coef", "vf_coef", "value_loss_scale", "policy_head_gain", "value_head_gain"),
     lambda v: v >= 0, ">= 0"),
    (("gamma", "gae_lambda", "value_clip_boundary_grad"), lambda v: 0 <= v <= 1, "in [0, 1]"),
    (("clip_range_vf", "target_kl", "clip_observations", "clip_rewards", "clip_range_low",
      "clip_range_high", "loss_aggregation_norm"), lambda v: v is None or v > 0, "> 0 or None"),
    (("dual_clip",), lambda v: v is None or v > 1, "> 1 or None"),
)


class _Derived:
    """A preset value resolved by :meth:`PPOConfig.preset` from the other fields."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


_SAME_AS_CLIP_RANGE = _Derived("<clip_range>")
#: 10.0 when the run normalizes that quantity, else None (there is nothing to clip).
_TEN_WITH_NORMALIZATION = _Derived("<10.0 when normalized, else None>")

#: Each clipping field and the normalization it applies after.
CLIP_NEEDS = {"clip_observations": "normalize_observations", "clip_rewards": "normalize_rewards"}


class IneffectiveSettingWarning(UserWarning):
    """A :class:`PPOConfig` field set away from its default where it has no effect (it needs
    another setting, named in the message: :data:`_NEEDS`)."""


#: Fields that act only in some configurations: ``field -> (whether it acts, what it needs)``
#: (:class:`IneffectiveSettingWarning`).
_NEEDS = {
    "sde_sample_freq": (lambda c: c.use_sde, "use_sde=True"),
    "full_std": (lambda c: c.use_sde, "use_sde=True"),
    "use_expln": (lambda c: c.use_sde, "use_sde=True"),
    "huber_delta": (lambda c: c.value_loss_mode == "huber", "value_loss_mode='huber'"),
    "loss_aggregation_norm": (lambda c: c.loss_aggregation == "seq-mean-token-sum-norm",
                              "loss_aggregation='seq-mean-token-sum-norm'"),
}

#: Fields that differ between implementations; every preset sets all of them.
CONVENTION_FIELDS = (
    "truncation", "bootstrap_terminal_last_row", "value_loss_mode", "value_loss_scale",
    "clip_range_vf", "advantage_norm_scope", "advantage_norm_ddof", "kl_estimator", "kl_stop_rule",
    "lr_schedule", "clip_range_schedule", "schedule_progress", "value_head_gain",
    "clip_observations", "clip_rewards", "advantage_norm_eps", "advantage_norm_eps_placement",
    "clip_interval", "clip_range_low", "clip_range_high", "huber_delta", "dual_clip",
    "clip_fraction_mode", "value_clip_boundary_grad", "advantage_norm_single_element",
    "drop_truncated_steps", "loss_aggregation", "loss_aggregation_norm")

#: Every convention field at its reference value, its ``PPOConfig()`` default: the
#: ``"reference"`` preset, and the value of a field a library has no setting for (no KL early
#: stop, no schedule, no value-head init of its own, no observation/reward clipping, no dual
#: clip, a symmetric ratio interval).
_REFERENCE = {name: PPOConfig.__dataclass_fields__[name].default for name in CONVENTION_FIELDS}

#: ``{preset name: {convention field: value}}``: each preset is :data:`_REFERENCE` with the
#: fields its implementation sets otherwise (sources: docs/specification.md §8.1).
PRESETS: Dict[str, Dict[str, Any]] = {
    "reference": dict(_REFERENCE),
    "sb3": dict(_REFERENCE, value_loss_mode="sb3", clip_observations=_TEN_WITH_NORMALIZATION,
                clip_rewards=_TEN_WITH_NORMALIZATION),
    "cleanrl": dict(
        _REFERENCE, truncation="terminate", value_loss_scale=0.5,
        clip_range_vf=_SAME_AS_CLIP_RANGE, kl_stop_rule="cleanrl", lr_schedule="linear",
        schedule_progress="before_rollout", clip_observations=_TEN_WITH_NORMALIZATION,
        clip_rewards=_TEN_WITH_NORMALIZATION, advantage_norm_single_element="NaN"),
    "thrust": dict(
        _REFERENCE, truncation="ignore", bootstrap_terminal_last_row=True, clip_range_vf=0.2,
        advantage_norm_scope="batch", advantage_norm_ddof=0, kl_estimator="k1",
        kl_stop_rule="thrust", value_head_gain=0.01),
    "tianshou": dict(_REFERENCE),
    "torchrl": dict(_REFERENCE, value_loss_mode="huber", advantage_norm_eps=1e-6,
                    advantage_norm_eps_placement="clamp", kl_estimator="k1"),
    "rlax": dict(_REFERENCE, truncation="terminate", value_loss_scale=0.5),
    "skrl": dict(_REFERENCE, truncation="ignore", value_loss_mode="sb3", clip_range_vf=0.2,
                 advantage_norm_scope="batch", kl_stop_rule="skrl"),
    "sample_factory": dict(_REFERENCE, truncation="terminate", clip_range_vf=1.0,
                           advantage_norm_eps=1e-7, advantage_norm_eps_placement="clamp",
                           clip_interval="reciprocal"),
    "purejaxrl": dict(
        _REFERENCE, truncation="terminate", value_loss_scale=0.5,
        clip_range_vf=_SAME_AS_CLIP_RANGE, advantage_norm_ddof=0, lr_schedule="linear",
        schedule_progress="before_rollout", advantage_norm_single_element="zero",
        value_clip_boundary_grad=0.75),
}


@functools.cache
def _type_hints() -> Dict[str, Any]:
    return typing.get_type_hints(PPOConfig)


def _kind(hint) -> str:
    """'float', 'int', 'bool', 'str', 'optional_float' or 'int_tuple'."""
    if hint == Optional[float]:
        return "optional_float"
    if hint == Tuple[int, ...]:
        return "int_tuple"
    return hint.__name__


def _default(name: str):
    return PPOConfig.__dataclass_fields__[name].default


def _check_known(names: Iterable[str]) -> None:
    known = PPOConfig.__dataclass_fields__
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(str(name), list(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown PPOConfig field {name!r}{hint}")


def _numpy_scalar(value, kinds: str) -> bool:
    """A NumPy scalar (or 0-d array) whose dtype kind is one of ``kinds``."""
    return hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0 and value.dtype.kind in kinds


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) or _numpy_scalar(value, "iu")


#: The scalar field kinds: ``kind -> (accepts(value), what the value must be, normalize)``.
_SCALARS = {
    "bool": (lambda v: type(v).__name__ in ("bool", "bool_"), "a bool", bool),
    "int": (_is_int, "an integer", int),
    "float": (lambda v: not isinstance(v, bool) and (isinstance(v, (int, float))
                                                     or _numpy_scalar(v, "iuf")),
              "a real number", float),
    "str": (lambda v: isinstance(v, str), "a string", lambda v: v),
}


def _coerce(name: str, value, hint):
    """Check a field's Python type and normalize it (numpy scalars -> Python, list -> tuple)."""
    kind = _kind(hint)
    if kind == "optional_float":
        return None if value is None else _coerce(name, value, float)
    if kind in _SCALARS:
        accepts, what, convert = _SCALARS[kind]
        if not accepts(value):
            raise ValueError(f"{name} must be {what}, got {one_line_repr(value)}")
        value = convert(value)
        if kind == "float" and not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value}")
        return value
    if kind == "int_tuple":
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
            raise ValueError(f"{name} must be a sequence of integers, got {value!r}")
        items = tuple(value)
        for i, item in enumerate(items):
            if not _is_int(item):
                raise ValueError(f"{name}[{i}] must be an integer, got {item!r}")
        return tuple(int(item) for item in items)
    raise AssertionError(f"unhandled field type {hint!r} for {name}")  # pragma: no cover


def _format(value) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value) if value else "()"
    return str(value)


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _parse_value(name: str, text: str):
    kind = _kind(_type_hints()[name])
    raw = text.strip()
    if kind == "optional_float" and raw.lower() in ("none", "null"):
        return None
    if kind in ("float", "optional_float", "int"):
        parse, what = (int, "an integer") if kind == "int" else (float, "a number")
        try:
            return parse(raw)
        except ValueError:
            raise ValueError(f"{name}: cannot parse {text!r} as {what}") from None
    if kind == "bool":
        if raw.lower() in _TRUE + _FALSE:
            return raw.lower() in _TRUE
        raise ValueError(f"{name}: cannot parse {text!r} as a bool (true/false, 1/0, yes/no)")
    if kind == "int_tuple":
        # "()" or "[]" is the empty tuple (no hidden layers: linear heads); an empty value or
        # an empty item ("64,,64") is refused rather than read as a shorter architecture
        if raw in ("()", "[]"):
            return ()
        parts = raw.strip("[]()").strip().removesuffix(",").split(",")  # "64," is "64"
        try:  # int("") raises: an empty value or item ("64,,64") is refused, not dropped
            return tuple(int(part) for part in parts)
        except ValueError:
            raise ValueError(f"{name}: cannot parse {text!r} as integers like 64,64 (use () "
                             f"for no hidden layers)") from None
    return raw  # str: choices are checked by PPOConfig


def parse_overrides(items: Iterable[str]) -> Dict[str, Any]:
    """``{field: value}`` (in the order given) of CLI ``field=value`` strings, typed by the
    field annotations: numbers, bools (``true``/``false``, ``1``/``0``, ``yes``/``no``),
    ``none``/``null`` for optional numbers, comma-separated integers for ``net_arch`` (``64,64``,
    ``[64, 64]``, ``()`` for none), plain text for choice fields (checked by ``PPOConfig``).
    ``ValueError`` naming the field or item for an item without ``=``, an unknown field (with a
    suggestion), a field given twice, or a value that does not parse as the field's type."""
    if isinstance(items, str):
        raise ValueError("items must be a list of 'field=value' strings, not a single string")
    out: Dict[str, Any] = {}
    for item in items:
        if not isinstance(item, str) or "=" not in item:
            raise ValueError(f"expected 'field=value', got {item!r}")
        name, _, text = item.partition("=")
        name = name.strip()
        _check_known([name])
        if name in out:
            raise ValueError(f"{name} is given more than once")
        out[name] = _parse_value(name, text)
    return out
