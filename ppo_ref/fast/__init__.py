"""The compiled tier: the twins of :mod:`ppo_ref.spec`, selected by
:func:`ppo_ref.tiers.tier_for`. Each public module has the name of a spec module, and each of its
public functions the name and parameters of the spec function it equals, bit for bit or within
the tolerance its docstring states; everything else is private machinery (``_``-prefixed).
What is compiled from the spec and what is added: docs/fast_tier_notes.md.
"""
