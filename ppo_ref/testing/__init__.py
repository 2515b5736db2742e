"""``ppo_ref.testing``: check another implementation against the reference, in its own tests.

    from ppo_ref.testing import check_gae

    def test_my_gae():
        check_gae(my_gae, layout="episode_starts", convention="cleanrl")

Each ``check_*`` draws examples with hypothesis (edge patterns on purpose: both flags on one
step, flags on the last row, gamma and lambda 0 and 1, long rollouts, ratios exactly on the
clip bounds, junk wherever the reference does not read), calls the user's function through a
*layout* (how the arguments are arranged: :mod:`ppo_ref.testing.layouts`) and compares with
ppo_ref under a *convention* (a preset name or a dict of :data:`OPTIONS`). A difference raises
:class:`Mismatch` (an ``AssertionError``) carrying the shrunk minimal input, the first
differing output and index, both values, whether the gap is float32-rounding sized, and the
other conventions the function agrees with on that input. :func:`identify` names the
convention a function implements. :func:`trace_update` writes every intermediate of one PPO
minibatch update; ``ppo-ref diff A B`` names the first quantity where two traces part.

Requires hypothesis for the checks and ``identify`` (``pip install ppo_ref[testing]``);
``trace_update`` and the diff do not. Nothing in the rest of ppo_ref imports this package.
"""
from ppo_ref.testing.core import (DEFAULT_DEADLINE, DEFAULT_MAX_EXAMPLES, IdentifyReport,
                                  Mismatch, check, check_gae, check_normalize_advantages,
                                  check_policy_loss, check_value_loss, check_vtrace, identify)
from ppo_ref.testing.layouts import AGGREGATIONS, LAYOUTS, Episodes, Layout, MaskedRows
from ppo_ref.conventions import OPTIONS, Option, resolve_convention
from ppo_ref.testing.trace import TRACE_FORMAT, diff_traces, load_trace, trace_update

__all__ = ["check_gae", "check_vtrace", "check_policy_loss", "check_value_loss",
           "check_normalize_advantages", "check", "identify", "IdentifyReport", "Mismatch",
           "Layout", "LAYOUTS", "MaskedRows", "Episodes", "AGGREGATIONS", "OPTIONS", "Option",
           "resolve_convention", "trace_update", "diff_traces", "load_trace", "TRACE_FORMAT",
           "DEFAULT_MAX_EXAMPLES", "DEFAULT_DEADLINE"]
