"""The LSTM with episode resets (public names): the readable definitions of
:mod:`ppo_ref.spec.lstm`, re-exported.

Two tiers: :mod:`ppo_ref.spec.lstm` defines the computation (a loop over steps of
:func:`step_forward`, BPTT by :func:`step_backward`); :mod:`ppo_ref.fast.lstm` holds the
compiled twins of ``lstm_forward``, ``lstm_backward`` and ``lstm_step`` (equal within rtol
1e-10) that the recurrent policy's fast path runs.
"""
from ppo_ref.spec.lstm import (LSTMCache, lstm_backward, lstm_forward, lstm_init, lstm_step,
                               step_backward, step_forward)

__all__ = ["LSTMCache", "lstm_init", "lstm_forward", "lstm_backward", "lstm_step",
           "step_forward", "step_backward"]
