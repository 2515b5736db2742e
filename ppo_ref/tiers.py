"""The one place a backend string becomes code: :func:`tier_for`.

A *tier* is the set of leaf computations the trainers call (:data:`TIER_MODULES`) from either
:mod:`ppo_ref.spec` (the readable definitions, NumPy float64) or :mod:`ppo_ref.fast` (compiled
twins with the same names and parameters, equal bit for bit or within their stated
tolerance). Policies, trainers, rollout and actor-learner are written once against a
:class:`Tier`; the algorithm's steps (:mod:`ppo_ref.spec.update`) are the spec's under both.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import NamedTuple

__all__ = ["Tier", "TIER_MODULES", "BACKENDS", "COMPUTE_DTYPES", "tier_for"]

#: The modules a tier supplies, in the order the data flows through them.
TIER_MODULES = ("masks", "advantages", "distributions", "lstm", "networks",
                "recurrent_networks", "losses", "optim")
BACKENDS = ("fast", "spec")
#: The dtypes each tier computes its networks and heads in: the compiled tier runs the spec's
#: computation in float32 too; the readable tier computes in float64.
COMPUTE_DTYPES = {"fast": ("float64", "float32"), "spec": ("float64",)}


class Tier(NamedTuple):
    """The modules of one tier (``name`` is ``"spec"`` or ``"fast"``)."""
    name: str
    masks: ModuleType
    advantages: ModuleType
    distributions: ModuleType
    lstm: ModuleType
    networks: ModuleType
    recurrent_networks: ModuleType
    losses: ModuleType
    optim: ModuleType


def tier_for(backend: str) -> Tier:
    """The :class:`Tier` of ``backend``: ``"spec"`` (:mod:`ppo_ref.spec`) or ``"fast"``
    (:mod:`ppo_ref.fast`). Raises ``ValueError`` naming ``backend`` for anything else."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    return Tier(backend, *(importlib.import_module(f"ppo_ref.{backend}.{name}")
                           for name in TIER_MODULES))
