"""The readable tier of ppo_ref: every computation, once, in plain NumPy float64.

The functions in this package define what ppo_ref computes. They are written in the notation of
the papers they cite (equations in the docstrings, one code line per equation line where that
reads well, a Python loop where the paper has a recursion) and use no compiled code, no flat
parameter buffers and no speed tricks. Any faster implementation elsewhere in ppo_ref states
which function here it equals, and whether bit for bit or within a stated tolerance.

Parameters are dicts of float64 arrays with the same keys and shapes as the rest of ppo_ref, so
one parameter dict runs on either tier. Each layer is a pair ``*_forward(params, x) -> (y,
cache)`` / ``*_backward(params, cache, dy) -> (dx, grads)`` with NamedTuple caches; a backward
never mutates its inputs. Randomness comes only from an explicit ``np.random.Generator``.

Modules: :mod:`ppo_ref.spec.layers` (orthogonal init, linear, tanh, relu, MLP),
:mod:`ppo_ref.spec.distributions` (categorical with action masks, MultiDiscrete, diagonal
Gaussian), :mod:`ppo_ref.spec.networks` (the MLP actor-critic), :mod:`ppo_ref.spec.lstm` (the LSTM with
episode resets: step pairs, sequence forward, BPTT), :mod:`ppo_ref.spec.recurrent_networks` (the
LSTM actor-critic).
"""
