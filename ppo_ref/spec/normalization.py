"""Running observation statistics and the normalization that reads them.

The convention of gymnasium's ``RunningMeanStd`` and Stable-Baselines3's ``VecNormalize`` (the
same operations in the same order; gymnasium's vector ``NormalizeObservation`` wrapper refuses
the same-step autoreset the rollout uses). The statistics are updated with every batch of raw
observations the environment returns (resets included, final observations excluded), before
the batch is normalized (Huang et al., "The 37 Implementation Details of PPO", 2022,
observation normalization and clipping). Reward scaling is gymnasium's vector
``NormalizeReward``, used as it is by :mod:`ppo_ref.train.rollout`.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import numpy as np

__all__ = ["RunningMoments", "OBS_NORM_EPS", "initial_moments", "update_moments",
           "normalize_observations"]

OBS_NORM_EPS = 1e-8


class RunningMoments(NamedTuple):
    """Running statistics of observation components: ``mean`` and ``var`` float64 ``[D]`` (the
    flattened observation), ``count`` the (fractional) number of samples merged."""
    mean: np.ndarray
    var: np.ndarray
    count: float


def initial_moments(shape: Sequence[int]) -> RunningMoments:
    """``mean = 0``, ``var = 1``, ``count = 1e-4`` of ``shape`` (gymnasium's and SB3's start)."""
    return RunningMoments(np.zeros(shape), np.ones(shape), 1e-4)


def update_moments(moments: RunningMoments, batch: np.ndarray) -> RunningMoments:
    """The statistics after merging ``batch`` (float64 ``[n, D]``, finite) by the parallel
    algorithm of Chan, Golub & LeVeque (1979), with the batch's mean ``m_b`` and population
    variance ``v_b`` over axis 0 and ``N = count + n``::

        delta = m_b - mean
        mean' = mean + delta * n / N
        var'  = (var * count + v_b * n + delta^2 * count * n / N) / N
        count' = N

    New arrays (``moments`` is not modified); a non-finite result means the squares of the
    batch overflow float64 (components above ~1.3e154), which the caller reports."""
    mean, var, count = moments
    batch_mean = np.mean(batch, axis=0)
    batch_var = np.var(batch, axis=0)
    n = batch.shape[0]
    delta = batch_mean - mean
    total = count + n
    new_mean = mean + delta * n / total
    m2 = var * count + batch_var * n + np.square(delta) * count * n / total
    return RunningMoments(new_mean, m2 / total, total)


def normalize_observations(obs: np.ndarray, moments: RunningMoments,
                           clip: Optional[float] = None) -> np.ndarray:
    """``clip((obs - mean) / sqrt(var + 1e-8), -clip, clip)`` for float64 ``obs [B, D]`` (no
    clipping when ``clip`` is None); a new float64 array."""
    out = (obs - moments.mean) / np.sqrt(moments.var + OBS_NORM_EPS)
    if clip is not None:
        np.clip(out, -clip, clip, out=out)
    return out
