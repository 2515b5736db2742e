"""``ppo-ref diff A B``: the first quantity where two PPO update traces part
(:mod:`ppo_ref.testing.trace`)."""
from __future__ import annotations

import math

from ppo_ref.cli.common import UsageError

__all__ = ["configure_diff", "cmd_diff"]


def configure_diff(p) -> None:
    """Arguments of ``ppo-ref diff`` on an argparse parser."""
    p.description = ("Compare two PPO update traces (format ppo_ref.trace/1, written by "
                     "ppo_ref.testing.trace_update or by another implementation from the same "
                     "inputs) and name the first quantity, in data-flow order, where they part. "
                     "Exit status 1 when they differ.")
    p.add_argument("a", help="trace JSON A (its key order is the data-flow order)")
    p.add_argument("b", help="trace JSON B")
    p.add_argument("--rtol", type=float, default=1e-9, help="relative tolerance (default 1e-9)")
    p.add_argument("--atol", type=float, default=1e-12, help="absolute tolerance (default 1e-12)")
    p.add_argument("--identify", action="store_true",
                   help="when they differ, name the changes of up to two convention options "
                        "under which ppo_ref's update on A's inputs and settings gives B")


def cmd_diff(args) -> int:
    """``ppo-ref diff A B``: 0 when the traces agree, 1 when they differ; :class:`UsageError`
    (exit status 2) on a bad tolerance or unreadable input."""
    for name, tol in (("--rtol", args.rtol), ("--atol", args.atol)):
        if not (math.isfinite(tol) and tol >= 0):
            raise UsageError(f"{name} must be a finite number >= 0, got {tol}")
    from ppo_ref.testing.trace import (diff_traces, format_diff, identify_trace, load_trace,
                                       quantity_count)
    try:
        a, b = load_trace(args.a), load_trace(args.b)
    except OSError as exc:
        raise UsageError(f"cannot read {exc.filename}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    rows = diff_traces(a, b, rtol=args.rtol, atol=args.atol)
    print(format_diff(rows, quantity_count(a)))
    if rows and args.identify:
        try:
            found = identify_trace(b, a, rtol=args.rtol, atol=args.atol)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        print("B is ppo_ref's update on A's inputs with: " + "; or ".join(
            ", ".join(f"{k}={v!r}" for k, v in c.items()) for c in found) if found else
            "no change of up to two convention options gives B")
    return 1 if rows else 0
