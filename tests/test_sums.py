"""ppo_ref.fast.sums.pairwise_sum: NumPy's pairwise order written out, checked against a Python
oracle of the documented recursion (not against NumPy, whose internals may change)."""
import numpy as np
import pytest

from ppo_ref.fast.sums import pairwise_sum


def pairwise_sum_oracle(terms):
    """The pairwise order the kernel documents, written as the recursion it describes."""
    n = len(terms)
    if n < 8:
        total = 0.0
        for t in terms:
            total += t
        return total
    if n <= 128:
        a = [float(terms[j]) for j in range(8)]
        for i in range(8, n - n % 8):
            a[i % 8] += terms[i]
        total = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
        for i in range(n - n % 8, n):
            total += terms[i]
        return total
    half = n // 2 - (n // 2) % 8
    return pairwise_sum_oracle(terms[:half]) + pairwise_sum_oracle(terms[half:])


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 100, 128, 129, 136, 255, 256, 1000, 1037, 16384,
                               20011])
def test_pairwise_sum_is_the_documented_order(rng, n):
    """Bit for bit the recursion written in the docstring, of the terms and of their squares,
    on a view at an offset into a buffer; terms of mixed magnitudes so that another order
    rounds differently."""
    x = rng.standard_normal(n + 5) * 10.0 ** rng.integers(-8, 8, n + 5)
    for start in (0, 3):
        view = x[start:start + n]
        assert pairwise_sum(view, False) == pairwise_sum_oracle(list(view))
        assert pairwise_sum(view, True) == pairwise_sum_oracle(list(view * view))
    if n >= 1000:  # the order matters: a sum left to right is not the same number here
        terms = x[:n] * x[:n]
        sequential = 0.0
        for t in terms:
            sequential += t
        assert sequential != pairwise_sum_oracle(list(terms))


def test_pairwise_sum_overflows_to_inf_and_sums_nothing_to_zero():
    assert pairwise_sum(np.full(300, 1e308), False) == np.inf
    assert pairwise_sum(np.full(3, 1e200), True) == np.inf
    assert pairwise_sum(np.empty(0), False) == 0.0
