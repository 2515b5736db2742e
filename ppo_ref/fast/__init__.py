"""The compiled tier: the twins of :mod:`ppo_ref.spec`.

Each public module here has the name of a module of :mod:`ppo_ref.spec`, and each of its public
functions (its ``__all__``) the name and the parameters of the spec function it equals, bit for
bit or within the tolerance its docstring states. Where the spec's readable form is a loop
(GAE, V-trace, the episode masks, the loss and Adam elements, the LSTM's recursions), the twin
compiles that very function; otherwise it computes the same equations with compiled kernels
whose summation order is fixed by the code (fused multiply-add chains, never BLAS), so a row's
results do not depend on the other rows of a call nor on the machine. Everything else
(products, buffers, packing) is private machinery in ``_``-prefixed modules and names, never
imported outside this package.

The twins do not re-validate their inputs (the spec functions do, and the trainers check what
enters at their boundary); a non-finite result inside a compiled pass raises
:func:`ppo_ref._checks.non_finite_result`. :func:`ppo_ref.tiers.tier_for` selects this tier.
"""
