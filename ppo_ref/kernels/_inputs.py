"""Old home of the GAE/V-trace argument checks, now in :mod:`ppo_ref.spec.advantages` (kept
importable until the switch; to delete)."""
from ppo_ref.spec.advantages import (FINAL_VALUES_REQUIRED, TrajectoryInputs,  # noqa: F401
                                     explain_not_finite, per_step_unit_interval,
                                     prepare_trajectory)
from ppo_ref._checks import check_choice

BACKENDS = ("fast", "spec")


def tier_module(backend, name):
    """``ppo_ref.<backend>.<name>``; ``ValueError`` for a backend other than fast/spec."""
    import importlib
    check_choice(backend, "backend", BACKENDS)
    return importlib.import_module(f"ppo_ref.{backend}.{name}")
