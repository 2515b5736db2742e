"""Learning parity with Stable-Baselines3 on every zoo row: ppo_ref and SB3 (sb3-contrib
``RecurrentPPO`` for the ``lstm`` rows) trained with identical settings and seeds.

For each row of :data:`ppo_ref.zoo.ZOO` (or the ``--rows`` chosen) and each seed, ppo_ref trains
what ``ppo-ref train --env ROW --seed S`` trains (the row's policy, ``ZooEntry.config()``, the
row's ``n_timesteps``), and SB3 trains the same :class:`~ppo_ref.config.PPOConfig` turned into
SB3 arguments field by field by :func:`sb3_settings`:

==========================================  ===============================================
PPOConfig                                   SB3 / sb3-contrib
==========================================  ===============================================
n_envs                                      ``make_vec_env(n_envs=...)`` (Monitor, DummyVecEnv)
n_steps, batch_size, n_epochs, gamma,       the same-named ``PPO`` / ``RecurrentPPO`` arguments
gae_lambda, ent_coef, max_grad_norm,
normalize_advantage, target_kl,
clip_range_vf
learning_rate + lr_schedule                 ``learning_rate``: the number, or ``lr * p`` with
                                            ``p`` = progress remaining (``"linear"``)
clip_range + clip_range_schedule            ``clip_range``: likewise
vf_coef * value_loss_scale                  ``vf_coef``
adam_eps                                    ``policy_kwargs.optimizer_kwargs.eps``
net_arch, activation                        ``policy_kwargs.net_arch=dict(pi=, vf=)``,
                                            ``activation_fn`` (Tanh, ReLU)
ortho_init, log_std_init                    ``policy_kwargs`` of the same names; for the LSTM
                                            rows with ``ortho_init`` the LSTM weights are then
                                            re-drawn orthogonal (gain 1) with zero biases, as
                                            :func:`ppo_ref.spec.lstm.lstm_init` (sb3-contrib
                                            keeps torch's init for its LSTMs)
lstm_hidden_size, lstm_shared=False         ``lstm_hidden_size``, ``enable_critic_lstm=True``,
                                            ``shared_lstm=False``
normalize_observations, normalize_rewards,  ``VecNormalize(norm_obs, norm_reward, clip_obs,
clip_observations, clip_rewards, gamma      clip_reward, gamma)`` (a clip of None: inf)
use_sde, sde_sample_freq (when PPOConfig    the same-named ``PPO`` arguments
has them)
full_std, use_expln (when PPOConfig has     the same-named ``policy_kwargs``
them)
==========================================  ===============================================

Fields SB3 has no argument for must hold SB3's fixed behaviour (``truncation="bootstrap"``,
``schedule_progress="after_rollout"``, separate towers, head gains 0.01 and 1, the advantage
normalization per minibatch with ddof 1 and ``+ 1e-8``, the symmetric ratio clip, no dual clip,
``value_loss_mode`` ``"sb3"`` (or ``"max"`` without a value clip, the same MSE), the k3 KL and
SB3's stop rule when ``target_kl`` is set, an unshared LSTM). ``backend``, ``compute_dtype``
(SB3 computes in float32) and ``clip_fraction_mode`` (a logged statistic) do not change what is
learned. Any other value, and any field this script does not know that differs from its
PPOConfig default, raises :class:`UnmappableSettings` naming the fields: SB3 never trains with
settings other than ppo_ref's.

Final return: the mean of the last :data:`LAST_N` = 20 finished *training* episodes at the end
of the run (what ``ppo-ref train`` reports; ppo_ref ``trainer.recent_returns``, SB3
``model.ep_info_buffer``, the Monitor's raw returns), recorded after every update for the
learning curves. Beside it, a deterministic evaluation of ``--eval-episodes`` episodes on fresh
env seeds (rl-baselines3-zoo's ``benchmark.md`` figure, the zoo's published column, is such an
evaluation). A row PASSES when ppo_ref's mean final return lies within [min, max] of SB3's
final returns over the seeds, or else when Welch's t-test does not reject equal means
(:func:`row_passes`).

Every run is cached as ``OUT/runs/<row>__<lib>__seed<S>.json`` with its settings and budget; a
rerun reuses a cached run whose settings and budget are unchanged, so a long run can be
interrupted and resumed, extended with rows or seeds, and the table rebuilt with
``--table-only``. Outputs: ``OUT/zoo_parity.md`` (the table, also printed), ``OUT/zoo_parity.json``
(every seed's final return, evaluation and learning curve) and ``OUT/zoo_parity.png`` (one panel
per row: the mean of each library's learning curves over the seeds, +-1 std band).

Usage (from the repository root; ``pip install -e ".[validation,plot]"``)::

    python validation/zoo_parity.py                          # every row, seeds 0-2, both libs
    python validation/zoo_parity.py --rows CartPole-v1 ppo_ref/MemoryCue-v0 --jobs 2
    python validation/zoo_parity.py --rows Acrobot-v1 --timesteps Acrobot-v1=200000
    python validation/zoo_parity.py --libs ppo_ref           # ppo_ref alone (no SB3 needed)
    python validation/zoo_parity.py --table-only             # table + plot from the cache

A ``--timesteps`` budget is marked in the table as not the zoo's. Exit status 0 (also with
failing rows: the table is the result); 2 for bad arguments or unmappable settings.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

#: Final return: the mean of the last LAST_N finished training episodes (``ppo-ref train``'s).
LAST_N = 20
#: The deterministic evaluation's env seeds start here (far from the training seeds).
EVAL_SEED = 10_000
LIBS = ("ppo_ref", "sb3")
#: Welch's test level of the second criterion of :func:`row_passes`.
ALPHA = 0.05
RULE = ("a row passes when ppo_ref's mean final return lies within [min, max] of SB3's final "
        "returns over the seeds, or else when Welch's two-sided t-test over the seeds (each "
        f"side >= 3) does not reject equal means at {ALPHA} (final return: mean of the last "
        f"{LAST_N} training episodes)")

# -- PPOConfig -> SB3 ----------------------------------------------------------------------------

#: Fields passed to SB3 (the module docstring's table).
MAPPED = ("n_envs", "n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "ent_coef",
          "max_grad_norm", "normalize_advantage", "target_kl", "clip_range_vf", "learning_rate",
          "lr_schedule", "clip_range", "clip_range_schedule", "vf_coef", "value_loss_scale",
          "adam_eps", "net_arch", "activation", "ortho_init", "log_std_init", "lstm_hidden_size",
          "normalize_observations", "normalize_rewards", "clip_observations", "clip_rewards")
#: gSDE fields, passed when PPOConfig has them: PPO arguments, then policy_kwargs.
SDE_ARGS = ("use_sde", "sde_sample_freq")
SDE_POLICY_KWARGS = ("full_std", "use_expln")
#: Fields SB3 has no argument for, with the value SB3 always behaves as.
SB3_FIXED = dict(
    shared_trunk=False, policy_head_gain=0.01, value_head_gain=1.0, lstm_shared=False,
    schedule_progress="after_rollout", truncation="bootstrap", bootstrap_terminal_last_row=False,
    advantage_norm_scope="minibatch", advantage_norm_ddof=1, advantage_norm_eps=1e-8,
    advantage_norm_eps_placement="add", clip_interval="symmetric", clip_range_low=None,
    clip_range_high=None, dual_clip=None)
#: Fields that do not change what is learned (the tier, its float width, a logged statistic).
NO_EFFECT = ("backend", "compute_dtype", "clip_fraction_mode")
#: Fields checked together with another field in :func:`sb3_settings`.
CONDITIONAL = ("value_loss_mode", "huber_delta", "kl_estimator", "kl_stop_rule")
_ACTIVATIONS = {"tanh": "Tanh", "relu": "ReLU"}


class UnmappableSettings(ValueError):
    """A PPOConfig that SB3 cannot be given: the message names every such field."""


class LinearSchedule:
    """SB3 schedule ``value * progress_remaining`` (ppo_ref's ``"linear"``; a named class, not
    a lambda, so that it pickles and shows its value)."""

    def __init__(self, value: float):
        self.value = float(value)

    def __call__(self, progress_remaining: float) -> float:
        return self.value * progress_remaining

    def __repr__(self) -> str:
        return f"linear({self.value})"


def _schedule(value: float, kind: str):
    return LinearSchedule(value) if kind == "linear" else float(value)


def sb3_settings(config, policy: str) -> Dict[str, Any]:
    """SB3's arguments for ``config`` (a PPOConfig) and ``policy`` (``"mlp"`` or ``"lstm"``):
    ``{"algo": "PPO" | "RecurrentPPO", "policy": "MlpPolicy" | "MlpLstmPolicy", "n_envs",
    "vec_normalize": VecNormalize kwargs or None, "kwargs": the algorithm's kwargs (with
    ``policy_kwargs``; ``activation_fn`` as its torch.nn class name), "orthogonal_lstm": bool}``.

    Raises :class:`UnmappableSettings` naming every field SB3 cannot be given (module
    docstring), ``ValueError`` for an unknown ``policy``."""
    if policy not in ("mlp", "lstm"):
        raise ValueError(f"policy must be 'mlp' or 'lstm', got {policy!r}")
    c = config
    problems: List[str] = []
    known = set(MAPPED) | set(SDE_ARGS) | set(SDE_POLICY_KWARGS) | set(SB3_FIXED) \
        | set(NO_EFFECT) | set(CONDITIONAL)
    for f in dataclasses.fields(c):
        if f.name not in known and getattr(c, f.name) != f.default:
            problems.append(f"{f.name}={getattr(c, f.name)!r}: no SB3 mapping is known for this "
                            f"field (default {f.default!r})")
    for name, sb3_value in SB3_FIXED.items():
        if name in ("lstm_shared",) and policy != "lstm":
            continue
        if getattr(c, name) != sb3_value:
            problems.append(f"{name}={getattr(c, name)!r}: SB3 always uses {sb3_value!r}")
    if c.value_loss_mode not in ("sb3", "max") or (
            c.value_loss_mode == "max" and c.clip_range_vf is not None):
        problems.append(f"value_loss_mode={c.value_loss_mode!r} with clip_range_vf="
                        f"{c.clip_range_vf!r}: SB3's value loss is MSE to the clipped value "
                        f"(value_loss_mode='sb3')")
    if c.target_kl is not None and (c.kl_estimator, c.kl_stop_rule) != ("k3", "sb3"):
        problems.append(f"kl_estimator={c.kl_estimator!r}, kl_stop_rule={c.kl_stop_rule!r} "
                        f"with target_kl={c.target_kl}: SB3 stops on k3 > 1.5 * target_kl "
                        f"before the step (kl_estimator='k3', kl_stop_rule='sb3')")
    if c.activation not in _ACTIVATIONS:
        problems.append(f"activation={c.activation!r}: no SB3 activation_fn for it")
    if problems:
        raise UnmappableSettings("SB3 cannot be given these PPOConfig settings:\n  "
                                 + "\n  ".join(problems))

    arch = list(c.net_arch)
    policy_kwargs: Dict[str, Any] = dict(
        net_arch=dict(pi=arch, vf=list(arch)), activation_fn=_ACTIVATIONS[c.activation],
        ortho_init=c.ortho_init, log_std_init=c.log_std_init,
        optimizer_kwargs=dict(eps=c.adam_eps))
    kwargs: Dict[str, Any] = dict(
        learning_rate=_schedule(c.learning_rate, c.lr_schedule), n_steps=c.n_steps,
        batch_size=c.batch_size, n_epochs=c.n_epochs, gamma=c.gamma, gae_lambda=c.gae_lambda,
        clip_range=_schedule(c.clip_range, c.clip_range_schedule),
        clip_range_vf=c.clip_range_vf, normalize_advantage=c.normalize_advantage,
        ent_coef=c.ent_coef, vf_coef=c.vf_coef * c.value_loss_scale,
        max_grad_norm=c.max_grad_norm, target_kl=c.target_kl)
    for name in SDE_ARGS:
        if hasattr(c, name):
            kwargs[name] = getattr(c, name)
    for name in SDE_POLICY_KWARGS:
        if hasattr(c, name):
            policy_kwargs[name] = getattr(c, name)
    if policy == "lstm":
        policy_kwargs.update(lstm_hidden_size=c.lstm_hidden_size, n_lstm_layers=1,
                             enable_critic_lstm=True, shared_lstm=False)
    kwargs["policy_kwargs"] = policy_kwargs
    vec_normalize = None
    if c.normalize_observations or c.normalize_rewards:
        inf = math.inf
        vec_normalize = dict(
            norm_obs=c.normalize_observations, norm_reward=c.normalize_rewards,
            clip_obs=inf if c.clip_observations is None else c.clip_observations,
            clip_reward=inf if c.clip_rewards is None else c.clip_rewards, gamma=c.gamma,
            epsilon=1e-8)
    return {"algo": "RecurrentPPO" if policy == "lstm" else "PPO",
            "policy": "MlpLstmPolicy" if policy == "lstm" else "MlpPolicy",
            "n_envs": c.n_envs, "vec_normalize": vec_normalize, "kwargs": kwargs,
            "orthogonal_lstm": policy == "lstm" and c.ortho_init}


def make_sb3_model(env_id: str, config, policy: str, seed: int):
    """The SB3 model of :func:`sb3_settings` on ``env_id`` (``make_vec_env`` with ``seed``,
    Monitor-wrapped, under VecNormalize when the config normalizes), CPU, torch on one thread.
    Returns ``(model, settings)``. Raises :class:`UnmappableSettings` (:func:`sb3_settings`)."""
    import torch as th
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize
    import ppo_ref.envs  # noqa: F401  (registers the ppo_ref/ env ids)

    settings = sb3_settings(config, policy)
    kwargs = dict(settings["kwargs"])
    policy_kwargs = dict(kwargs.pop("policy_kwargs"))
    policy_kwargs["activation_fn"] = getattr(th.nn, policy_kwargs["activation_fn"])
    th.set_num_threads(1)
    # render_mode None: make_vec_env asks for "rgb_array", which ppo_ref's envs refuse
    env = make_vec_env(env_id, n_envs=settings["n_envs"], seed=seed,
                       env_kwargs=dict(render_mode=None))
    if settings["vec_normalize"] is not None:
        env = VecNormalize(env, **settings["vec_normalize"])
    if settings["algo"] == "RecurrentPPO":
        from sb3_contrib import RecurrentPPO as Algo
    else:
        from stable_baselines3 import PPO as Algo
    model = Algo(settings["policy"], env, policy_kwargs=policy_kwargs, seed=seed, device="cpu",
                 verbose=0, **kwargs)
    if settings["orthogonal_lstm"]:
        with th.no_grad():
            for lstm in (model.policy.lstm_actor, model.policy.lstm_critic):
                for name, weight in lstm.named_parameters():
                    if name.startswith("weight"):
                        th.nn.init.orthogonal_(weight, gain=1.0)
                    else:
                        weight.zero_()
    return model, settings


# -- training runs -------------------------------------------------------------------------------

def _mean_last(returns: Sequence[float]) -> float:
    values = list(returns)[-LAST_N:]
    return float(np.mean(values)) if values else float("nan")


def run_ppo_ref(env_id: str, config, policy: str, seed: int, timesteps: int,
                eval_episodes: int) -> Dict[str, Any]:
    """One ppo_ref run (the trainer ``ppo-ref train`` builds): the learning curve (``steps``,
    ``returns``: mean of the last LAST_N episodes after every update), ``final_return``,
    ``timesteps``, ``seconds`` (of ``learn``) and ``eval_returns`` (deterministic)."""
    import ppo_ref.envs  # noqa: F401
    from ppo_ref.cli.common import trainer_class
    trainer = trainer_class(policy)(env_id, config, seed=seed)
    steps: List[int] = []
    returns: List[float] = []

    def record(tr, stats):
        if tr.recent_returns:
            steps.append(int(tr.num_timesteps))
            returns.append(_mean_last(tr.recent_returns))

    try:
        start = time.perf_counter()
        trainer.learn(timesteps, callback=record)
        seconds = time.perf_counter() - start
        result = {"steps": steps, "returns": returns,
                  "final_return": _mean_last(trainer.recent_returns),
                  "timesteps": int(trainer.num_timesteps), "seconds": seconds,
                  "eval_returns": []}
        if eval_episodes:
            result["eval_returns"] = [float(r) for r in trainer.evaluate(
                eval_episodes, deterministic=True, seed=EVAL_SEED)]
    finally:
        trainer.close()
    return result


def run_sb3(env_id: str, config, policy: str, seed: int, timesteps: int,
            eval_episodes: int) -> Dict[str, Any]:
    """One SB3 run at :func:`sb3_settings` (the same record as :func:`run_ppo_ref`; the
    evaluation env shares the training VecNormalize statistics, frozen, rewards raw)."""
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    model, settings = make_sb3_model(env_id, config, policy, seed)
    steps: List[int] = []
    returns: List[float] = []

    class Record(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            if self.model.ep_info_buffer:
                steps.append(int(self.model.num_timesteps))
                returns.append(_mean_last([ep["r"] for ep in self.model.ep_info_buffer]))

    start = time.perf_counter()
    model.learn(timesteps, callback=Record())
    seconds = time.perf_counter() - start
    result = {"steps": steps, "returns": returns,
              "final_return": _mean_last([ep["r"] for ep in model.ep_info_buffer]),
              "timesteps": int(model.num_timesteps), "seconds": seconds, "eval_returns": []}
    if eval_episodes:
        eval_env = make_vec_env(env_id, n_envs=1, seed=EVAL_SEED,
                                env_kwargs=dict(render_mode=None))
        if settings["vec_normalize"] is not None:
            eval_env = VecNormalize(eval_env, training=False, norm_reward=False,
                                    **{k: v for k, v in settings["vec_normalize"].items()
                                       if k != "norm_reward"})
            eval_env.obs_rms = model.get_env().obs_rms
        episode_returns, _ = evaluate_policy(model, eval_env, n_eval_episodes=eval_episodes,
                                             deterministic=True, return_episode_rewards=True)
        result["eval_returns"] = [float(r) for r in episode_returns]
        eval_env.close()
    model.get_env().close()
    return result


# -- the cache -----------------------------------------------------------------------------------

def _slug(row: str) -> str:
    return row.replace("/", "_")


def cache_path(out: str, row: str, lib: str, seed: int) -> str:
    return os.path.join(out, "runs", f"{_slug(row)}__{lib}__seed{seed}.json")


def _settings_record(row: str, lib: str, seed: int, timesteps: int,
                     eval_episodes: int) -> Dict[str, Any]:
    """What a cached run must match to be reused: row, library, seed, budget, evaluation and
    every PPOConfig field (SB3's arguments follow from them)."""
    from ppo_ref.zoo import ZOO
    entry = ZOO[row]
    return {"row": row, "lib": lib, "seed": int(seed), "policy": entry.policy,
            "timesteps_target": int(timesteps), "eval_episodes": int(eval_episodes),
            "config": entry.config().to_dict()}


def run_one(job: Dict[str, Any]) -> Dict[str, Any]:
    """Train one ``(row, lib, seed)`` job and write its cache file; returns the record."""
    from ppo_ref.zoo import ZOO
    row, lib, seed = job["row"], job["lib"], job["seed"]
    entry = ZOO[row]
    record = _settings_record(row, lib, seed, job["timesteps"], job["eval_episodes"])
    config = entry.config()
    run = run_ppo_ref if lib == "ppo_ref" else run_sb3
    result = run(row, config, entry.policy, seed, job["timesteps"], job["eval_episodes"])
    if lib == "sb3":
        record["sb3"] = json.loads(json.dumps(sb3_settings(config, entry.policy), default=repr))
    record.update(result)
    path = cache_path(job["out"], row, lib, seed)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(record, fh)
    os.replace(tmp, path)
    return record


def load_cached(out: str, row: str, lib: str, seed: int, timesteps: int,
                eval_episodes: int) -> Optional[Dict[str, Any]]:
    """The cached run of ``(row, lib, seed)`` when its settings and budget equal today's, else
    None (absent, unreadable or stale). The configs are compared as PPOConfigs: a field the
    cached record lacks (one added to PPOConfig since) counts at its default, the only value
    it could have had; a field PPOConfig no longer has makes the record stale."""
    from ppo_ref.config import PPOConfig
    path = cache_path(out, row, lib, seed)
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return None
    wanted = _settings_record(row, lib, seed, timesteps, eval_episodes)
    config = wanted.pop("config")
    if any(record.get(key) != value for key, value in wanted.items()):
        return None
    try:
        if PPOConfig.from_dict(record.get("config")) != PPOConfig.from_dict(config):
            return None
    except ValueError:
        return None
    return record


# -- the table, the JSON and the plot ------------------------------------------------------------

def statistics(values: Sequence[float]) -> Dict[str, float]:
    """``{"n", "mean", "std" (ddof 1; 0 for one value), "min", "max"}`` of ``values``."""
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return {"n": 0, "mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan}
    return {"n": int(a.size), "mean": float(a.mean()),
            "std": float(a.std(ddof=1)) if a.size > 1 else 0.0,
            "min": float(a.min()), "max": float(a.max())}


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)``, by its continued fraction
    (modified Lentz), evaluated on the side where it converges (``x < (a + 1) / (a + b + 2)``)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _incomplete_beta(1.0 - x, b, a)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-14:
            break
    return front * (f - 1.0)


def welch_p_value(x: Sequence[float], y: Sequence[float]) -> float:
    """Two-sided p-value of Welch's t-test of equal means (Welch 1947): ``t = (mean_x -
    mean_y) / sqrt(s_x^2 / n_x + s_y^2 / n_y)`` (``s``: ddof-1 std) with the
    Welch-Satterthwaite degrees of freedom ``nu``; ``p = I_{nu / (nu + t^2)}(nu / 2, 1 / 2)``.
    Both samples constant: 1 when the means are equal, else 0. Needs >= 2 values per side."""
    a, b = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if a.size < 2 or b.size < 2:
        raise ValueError("welch_p_value needs at least 2 values per sample")
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    diff = float(a.mean() - b.mean())
    if va + vb == 0.0:
        return 1.0 if diff == 0.0 else 0.0
    t = diff / math.sqrt(va + vb)
    nu = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    return _incomplete_beta(nu / (nu + t * t), nu / 2.0, 0.5)


def row_passes(ppo_ref_finals: Sequence[float], sb3_finals: Sequence[float]) -> Optional[str]:
    """The parity rule (:data:`RULE`): ``"range"`` when ``min(sb3) <= mean(ppo_ref) <=
    max(sb3)``, else ``"welch"`` when both sides have >= 3 seeds and :func:`welch_p_value` >=
    :data:`ALPHA`, else ``""`` (fails); None when a side has no run."""
    if len(ppo_ref_finals) == 0 or len(sb3_finals) == 0:
        return None
    mean = float(np.mean(ppo_ref_finals))
    if min(sb3_finals) <= mean <= max(sb3_finals):
        return "range"
    if min(len(ppo_ref_finals), len(sb3_finals)) >= 3 and \
            welch_p_value(ppo_ref_finals, sb3_finals) >= ALPHA:
        return "welch"
    return ""


def summarize(rows: Dict[str, Dict[str, List[Dict[str, Any]]]],
              budgets: Dict[str, int]) -> Dict[str, Any]:
    """The JSON document: per row its budget (and whether it is the zoo's), the published
    figure, per library the per-seed runs and the statistics of their final returns and
    evaluations, and the rule's verdict."""
    from ppo_ref.zoo import ZOO
    doc: Dict[str, Any] = {"rule": RULE, "last_n": LAST_N, "eval_seed": EVAL_SEED, "rows": {}}
    for row, libs in rows.items():
        entry = ZOO[row]
        item: Dict[str, Any] = {
            "policy": entry.policy, "timesteps": budgets[row], "zoo_timesteps": entry.n_timesteps,
            "zoo_budget": budgets[row] == entry.n_timesteps, "published": entry.published,
            "published_source": entry.published_source, "libs": {}}
        for lib, runs in libs.items():
            item["libs"][lib] = {
                "seeds": [r["seed"] for r in runs],
                "final": statistics([r["final_return"] for r in runs]),
                "eval": statistics([float(np.mean(r["eval_returns"])) for r in runs
                                    if r["eval_returns"]]),
                "seconds_per_run": statistics([r["seconds"] for r in runs]),
                "runs": runs}
        finals = {lib: [r["final_return"] for r in libs.get(lib, [])] for lib in LIBS}
        item["passes"] = row_passes(finals["ppo_ref"], finals["sb3"])
        item["welch_p"] = (welch_p_value(finals["ppo_ref"], finals["sb3"])
                           if min(len(finals["ppo_ref"]), len(finals["sb3"])) >= 2 else None)
        doc["rows"][row] = item
    return doc


def _num(x: float, digits: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def table(doc: Dict[str, Any]) -> str:
    """The Markdown table of :func:`summarize`'s document, with the rule under it."""
    head = ("| row | policy | steps per run | seeds | ppo_ref mean | std | min | max | "
            "SB3 mean | std | min | max | verdict | det. eval ppo_ref / SB3 | "
            "published | s per run ppo_ref / SB3 |")
    lines = [head, "|---|---|---|---|" + "---:|" * 8 + "---|---|---|---|"]
    for row, item in doc["rows"].items():
        libs = item["libs"]
        blank = {"final": statistics([]), "eval": statistics([]),
                 "seconds_per_run": statistics([]), "seeds": []}
        p, s = libs.get("ppo_ref", blank), libs.get("sb3", blank)
        steps = str(item["timesteps"]) if item["zoo_budget"] else \
            f"{item['timesteps']} (not the zoo's {item['zoo_timesteps']})"
        seeds = sorted(set(p["seeds"]) | set(s["seeds"]))
        welch = "" if item.get("welch_p") is None else f"; Welch p {item['welch_p']:.2f}"
        verdict = {None: "n/a", "": "FAIL", "range": "PASS (range)",
                   "welch": "PASS (Welch)"}[item["passes"]] + welch
        if item["passes"] is not None and s["final"]["n"] < 3:
            verdict += f" ({s['final']['n']} SB3 seed(s): not a spread)"
        published = item["published_source"] if item["published"] is None else \
            f"{item['published']:.1f}"
        cells = [row, item["policy"], steps, ",".join(map(str, seeds))]
        for stats in (p["final"], s["final"]):
            cells += [_num(stats[k]) for k in ("mean", "std", "min", "max")]
        cells += [verdict, f"{_num(p['eval']['mean'])} / {_num(s['eval']['mean'])}", published,
                  f"{_num(p['seconds_per_run']['mean'], 0)} / "
                  f"{_num(s['seconds_per_run']['mean'], 0)}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Rule: {RULE}. SB3: stable-baselines3 PPO (mlp rows), sb3-contrib "
                 f"RecurrentPPO (lstm rows). std: ddof 1 over the seeds. det. eval: mean over "
                 f"the seeds of each run's deterministic evaluation.")
    return "\n".join(lines)


def plot(doc: Dict[str, Any], path: str) -> None:
    """One panel per row: each library's learning curves on a common step grid (no
    extrapolation before a seed's first or after its last record), mean and +-1 std band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = list(doc["rows"].items())
    ncols = min(3, max(1, len(rows)))
    nrows = (len(rows) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.6 * nrows), squeeze=False)
    for ax in axes.flat[len(rows):]:
        ax.set_visible(False)
    for ax, (row, item) in zip(axes.flat, rows):
        for lib, data in item["libs"].items():
            runs = [r for r in data["runs"] if r["steps"]]
            if not runs:
                continue
            grid = np.linspace(max(r["steps"][0] for r in runs),
                               min(r["steps"][-1] for r in runs), 200)
            curves = np.array([np.interp(grid, r["steps"], r["returns"]) for r in runs])
            mean, std = curves.mean(axis=0), curves.std(axis=0, ddof=1) if len(runs) > 1 \
                else np.zeros(len(grid))
            label = "ppo_ref" if lib == "ppo_ref" else (
                "sb3-contrib RecurrentPPO" if item["policy"] == "lstm" else "SB3 PPO")
            line, = ax.plot(grid, mean, label=f"{label} ({len(runs)} seeds)")
            ax.fill_between(grid, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        if item["published"] is not None:
            ax.axhline(item["published"], color="grey", ls=":", lw=1, label="zoo published")
        budget = "" if item["zoo_budget"] else " (budget not the zoo's)"
        ax.set_title(f"{row}{budget}", fontsize=9)
        ax.set_xlabel("environment steps", fontsize=8)
        ax.set_ylabel(f"return, last {LAST_N} training episodes", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# -- the command line ----------------------------------------------------------------------------

def _parse_budgets(items: Sequence[str], rows: Sequence[str], parser) -> Dict[str, int]:
    from ppo_ref.zoo import ZOO
    budgets = {row: ZOO[row].n_timesteps for row in rows}
    for item in items:
        row, sep, text = item.rpartition("=")
        if not sep or row not in ZOO:
            parser.error(f"--timesteps takes ROW=N with ROW a zoo row ({list(ZOO)}), "
                         f"got {item!r}")
        if row not in rows:
            parser.error(f"--timesteps {item!r}: {row} is not one of the --rows {list(rows)}")
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n <= 0:
            parser.error(f"--timesteps {item!r}: N must be a positive integer")
        budgets[row] = n
    return budgets


def main(argv: Optional[Sequence[str]] = None) -> int:
    from ppo_ref.cli.common import UsageError
    from ppo_ref.cli.seeds import parse_seeds
    from ppo_ref.zoo import ZOO
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", default=list(ZOO), metavar="ROW",
                        help="zoo rows (env ids of ppo_ref/zoo.py; default: every row)")
    parser.add_argument("--seeds", default="0-2", help="seeds and ranges, e.g. 0-2 or 0,3,5")
    parser.add_argument("--libs", default=",".join(LIBS),
                        help="comma list of ppo_ref, sb3 (default both)")
    parser.add_argument("--timesteps", nargs="*", default=[], metavar="ROW=N",
                        help="a budget other than the row's n_timesteps (marked in the table)")
    parser.add_argument("--eval-episodes", type=int, default=10,
                        help="deterministic evaluation episodes per run (0: none; default 10)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs in parallel processes (default 1)")
    parser.add_argument("--out", default="zoo_parity", help="output and cache directory")
    parser.add_argument("--table-only", action="store_true",
                        help="train nothing: the table, JSON and plot from the cached runs")
    parser.add_argument("--no-plot", action="store_true", help="skip the matplotlib plot")
    args = parser.parse_args(argv)

    unknown = [row for row in args.rows if row not in ZOO]
    if unknown:
        parser.error(f"--rows: no zoo row {unknown}; rows: {list(ZOO)}")
    try:
        seeds = parse_seeds(args.seeds)
    except UsageError as exc:
        parser.error(str(exc))
    libs = [lib.strip() for lib in args.libs.split(",") if lib.strip()]
    if not libs or any(lib not in LIBS for lib in libs):
        parser.error(f"--libs takes a comma list of {list(LIBS)}, got {args.libs!r}")
    if args.jobs < 1 or args.eval_episodes < 0:
        parser.error("--jobs must be >= 1 and --eval-episodes >= 0")
    budgets = _parse_budgets(args.timesteps, args.rows, parser)
    needed = [] if args.no_plot else [("matplotlib", "plot", " (or --no-plot)")]
    if "sb3" in libs and not args.table_only:
        needed += [("stable_baselines3", "validation", "")]
        if any(ZOO[row].policy == "lstm" for row in args.rows):
            needed += [("sb3_contrib", "validation", "")]
    for module, extra, alternative in needed:  # refuse before any training
        if importlib.util.find_spec(module) is None:
            parser.error(f"{module} is not installed: pip install -e '.[{extra}]'{alternative}")
    if "sb3" in libs:
        for row in args.rows:       # refuse before any training, naming the row
            try:
                sb3_settings(ZOO[row].config(), ZOO[row].policy)
            except UnmappableSettings as exc:
                print(f"zoo_parity: row {row}: {exc}", file=sys.stderr)
                return 2

    results: Dict[str, Dict[str, List[Dict[str, Any]]]] = {row: {} for row in args.rows}
    jobs = []
    for row in args.rows:
        for lib in libs:
            for seed in seeds:
                cached = load_cached(args.out, row, lib, seed, budgets[row], args.eval_episodes)
                if cached is not None:
                    results[row].setdefault(lib, []).append(cached)
                elif not args.table_only:
                    jobs.append(dict(row=row, lib=lib, seed=seed, timesteps=budgets[row],
                                     eval_episodes=args.eval_episodes, out=args.out))
    if args.table_only:
        missing = sum(len(seeds) * len(libs) for _ in args.rows) - sum(
            len(runs) for libs_ in results.values() for runs in libs_.values())
        if missing:
            print(f"zoo_parity: {missing} run(s) not in the cache at today's settings "
                  f"(absent or stale); the table shows the cached ones", file=sys.stderr)
    for record in _run_jobs(jobs, args.jobs):
        results[record["row"]].setdefault(record["lib"], []).append(record)
    for libs_ in results.values():
        for runs in libs_.values():
            runs.sort(key=lambda r: r["seed"])

    doc = summarize(results, budgets)
    md = table(doc)
    print()
    print(md)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "zoo_parity.md"), "w", encoding="utf-8") as fh:
        fh.write(md + "\n")
    with open(os.path.join(args.out, "zoo_parity.json"), "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    written = ["zoo_parity.md", "zoo_parity.json"]
    if not args.no_plot:
        plot(doc, os.path.join(args.out, "zoo_parity.png"))
        written.append("zoo_parity.png")
    print(f"\nwrote {', '.join(os.path.join(args.out, w) for w in written)}")
    return 0


def _describe(record: Dict[str, Any]) -> str:
    evaluation = f", det. eval {np.mean(record['eval_returns']):.1f}" \
        if record["eval_returns"] else ""
    return (f"{record['row']:<26} {record['lib']:<7} seed {record['seed']}: final "
            f"{record['final_return']:8.2f}{evaluation}, {record['timesteps']} steps in "
            f"{record['seconds']:.0f} s")


def _run_jobs(jobs: List[Dict[str, Any]], n_jobs: int):
    """Run the jobs (in this process for ``n_jobs`` 1, else in a pool of spawned processes),
    yielding each record as it finishes."""
    if n_jobs == 1:
        for job in jobs:
            record = run_one(job)
            print(_describe(record), flush=True)
            yield record
        return
    import concurrent.futures
    import multiprocessing
    with concurrent.futures.ProcessPoolExecutor(
            n_jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for future in concurrent.futures.as_completed([pool.submit(run_one, j) for j in jobs]):
            record = future.result()
            print(_describe(record), flush=True)
            yield record


if __name__ == "__main__":
    sys.exit(main())
