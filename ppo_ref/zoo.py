"""Per-environment default settings of ``ppo-ref train --env ID``, in the tradition of
rl-baselines3-zoo (``hyperparams/ppo.yml``, ``hyperparams/ppo_lstm.yml`` and the returns of
``benchmark.md``): one :class:`ZooEntry` per env, in :class:`~ppo_ref.config.PPOConfig` fields
on the reference conventions (zoo ``normalize: true`` is both normalizations clipped at 10;
``lin_X`` is ``X`` with a ``linear`` schedule; a ``batch_size`` left out keeps SB3's 64).
``validation/zoo_parity.py`` trains every entry beside SB3 with the same settings and seeds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

__all__ = ["ZooEntry", "ZOO", "zoo_entry"]


@dataclass(frozen=True)
class ZooEntry:
    """The default settings of one environment: ``settings`` (``{PPOConfig field: value}`` on top of
    ``PPOConfig()``) for the ``policy`` ``"mlp"`` or ``"lstm"``; ``n_timesteps``, the source's
    training budget (the default ``--total-timesteps``); ``source`` (rl-baselines3-zoo file and key,
    or the test that checks ppo_ref's own tuning); ``deviations`` from it; ``published``, the
    source's final mean deterministic return (None: none), and ``published_source``."""

    env_id: str
    policy: str
    settings: Mapping[str, Any]
    n_timesteps: int
    source: str
    deviations: str = ""
    published: Optional[float] = None
    published_source: str = field(default="n/a")

    def config(self, **overrides: Any):
        """``PPOConfig(**settings)`` with ``overrides`` on top (validated by PPOConfig: a
        ``ValueError`` names a bad field)."""
        from ppo_ref.config import PPOConfig
        return PPOConfig(**{**self.settings, **overrides})


_NORMALIZE = dict(normalize_observations=True, normalize_rewards=True, clip_observations=10.0,
                  clip_rewards=10.0)
_ZOO_PPO = "rl-baselines3-zoo hyperparams/ppo.yml"
_ZOO_LSTM = "rl-baselines3-zoo hyperparams/ppo_lstm.yml"
_BENCHMARK = "rl-baselines3-zoo benchmark.md"
_CARTPOLE = dict(n_envs=8, n_steps=32, batch_size=256, n_epochs=20, gamma=0.98, gae_lambda=0.8,
                 learning_rate=1e-3, lr_schedule="linear", clip_range=0.2,
                 clip_range_schedule="linear", ent_coef=0.0)

#: ``{env id: ZooEntry}``: the default settings of ``ppo-ref train --env ID``.
ZOO: Dict[str, ZooEntry] = {e.env_id: e for e in (
    ZooEntry("CartPole-v1", "mlp", _CARTPOLE,
             100_000, f"{_ZOO_PPO}: CartPole-v1 (= PPOConfig.zoo_cartpole())",
             published=500.0, published_source=f"{_BENCHMARK}: ppo CartPole-v1"),
    ZooEntry("Acrobot-v1", "mlp",
             dict(n_envs=16, n_steps=256, gamma=0.99, gae_lambda=0.94, n_epochs=4, ent_coef=0.0,
                  **_NORMALIZE),
             1_000_000, f"{_ZOO_PPO}: Acrobot-v1",
             published=-73.506, published_source=f"{_BENCHMARK}: ppo Acrobot-v1"),
    ZooEntry("Pendulum-v1", "mlp",
             dict(n_envs=4, n_steps=1024, gamma=0.9, gae_lambda=0.95, n_epochs=10, ent_coef=0.0,
                  learning_rate=1e-3, clip_range=0.2, use_sde=True, sde_sample_freq=4),
             100_000, f"{_ZOO_PPO}: Pendulum-v1",
             published=-172.225, published_source=f"{_BENCHMARK}: ppo Pendulum-v1"),
    ZooEntry("MountainCarContinuous-v0", "mlp",
             dict(n_envs=1, n_steps=8, batch_size=8, gamma=0.9999, learning_rate=7.77e-5,
                  ent_coef=0.00429, clip_range=0.1, n_epochs=10, gae_lambda=0.9, max_grad_norm=5.0,
                  vf_coef=0.19, log_std_init=-3.29, ortho_init=False, use_sde=True, **_NORMALIZE),
             20_000, f"{_ZOO_PPO}: MountainCarContinuous-v0",
             deviations="batch_size 8 = n_steps * n_envs where the zoo writes 256 (SB3 then takes "
                        "the whole 8-row rollout as one minibatch)",
             published=88.343, published_source=f"{_BENCHMARK}: ppo MountainCarContinuous-v0"),
    ZooEntry("ppo_ref/CartPoleNoVel-v1", "lstm",
             dict(_CARTPOLE, activation="relu", lstm_hidden_size=64, lstm_shared=False,
                  net_arch=(64,), ortho_init=False, **_NORMALIZE),
             100_000, f"{_ZOO_LSTM}: CartPoleNoVel-v1",
             published=500.0, published_source=f"{_BENCHMARK}: ppo_lstm CartPoleNoVel-v1"),
    ZooEntry("ppo_ref/MemoryCue-v0", "lstm",
             dict(n_envs=16, n_steps=32, batch_size=128, n_epochs=4, learning_rate=1e-3, gamma=0.99,
                  gae_lambda=0.95, lstm_hidden_size=32, net_arch=()),
             40_000, "ppo_ref's own tuning (tests/test_recurrent_learning.py, "
                     "tests/test_cli_usability.py)",
             published_source="n/a (ppo_ref's env; a memoryless policy scores 0, a perfect one 1)"),
    ZooEntry("ppo_ref/MultiChoice-v0", "mlp",
             dict(n_envs=4, n_steps=64, batch_size=64, n_epochs=4, learning_rate=3e-3,
                  net_arch=(32,)),
             8_192, "ppo_ref's own tuning (tests/test_multidiscrete.py, "
                    "tests/test_cli_usability.py)",
             published_source="n/a (ppo_ref's env; random play scores 9.33, a perfect policy 32)"),
)}


def zoo_entry(env_id: str) -> Optional[ZooEntry]:
    """The :data:`ZOO` entry of ``env_id``, or None when the table has none."""
    return ZOO.get(env_id)
