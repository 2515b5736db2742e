"""Lazy import of hypothesis (an optional dependency: ``pip install ppo_ref[testing]``)."""
from __future__ import annotations

_MESSAGE = ("ppo_ref.testing needs the hypothesis package to draw examples: "
            "pip install ppo_ref[testing]  (or: pip install hypothesis)")


def require_hypothesis():
    """The ``hypothesis`` module, or ``ImportError`` saying how to install it."""
    try:
        import hypothesis
        import hypothesis.strategies  # noqa: F401
    except ImportError as exc:
        raise ImportError(_MESSAGE) from exc
    return hypothesis
