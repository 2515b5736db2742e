"""``ppo_ref.testing``: check another implementation against the reference, in its own tests.

    from ppo_ref.testing import check_gae

    def test_my_gae():
        check_gae(my_gae, layout="episode_starts", convention="cleanrl")

The checks and :func:`identify` (:mod:`ppo_ref.testing.core`) draw examples with hypothesis
(:mod:`ppo_ref.testing.quantities`) and call the function through a layout
(:mod:`ppo_ref.testing.layouts`); :func:`trace_update`, ``ppo-ref diff`` and
:func:`identify_trace` compare whole updates (:mod:`ppo_ref.testing.trace`). The checks and
``identify`` need hypothesis (``pip install ppo_ref[testing]``). Nothing in the rest of ppo_ref
imports this package.
"""
from ppo_ref.testing.core import (DEFAULT_DEADLINE, DEFAULT_MAX_EXAMPLES, IdentifyReport,
                                  Mismatch, check, check_gae, check_normalize_advantages,
                                  check_policy_loss, check_value_loss, check_vtrace, identify)
from ppo_ref.testing.layouts import AGGREGATIONS, LAYOUTS, Episodes, Layout, MaskedRows
from ppo_ref.conventions import OPTIONS, Option, resolve_convention
from ppo_ref.testing.trace import (TRACE_FORMAT, diff_traces, identify_trace, load_trace,
                                   trace_update)

__all__ = ["check_gae", "check_vtrace", "check_policy_loss", "check_value_loss",
           "check_normalize_advantages", "check", "identify", "IdentifyReport", "Mismatch",
           "Layout", "LAYOUTS", "MaskedRows", "Episodes", "AGGREGATIONS", "OPTIONS", "Option",
           "resolve_convention", "trace_update", "diff_traces", "identify_trace", "load_trace",
           "TRACE_FORMAT", "DEFAULT_MAX_EXAMPLES", "DEFAULT_DEADLINE"]
