"""ppo_ref.testing never passes what it did not compare: a function writing into its inputs,
outputs that are not real floats, a results file that skips everything; and the call itself:
torch outputs, the per-call deadline, short tracebacks."""
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ppo_ref
from ppo_ref import cli, vectors
from ppo_ref import gae
from ppo_ref.spec.losses import normalize_advantages, policy_loss, value_loss
from ppo_ref.testing import (Mismatch, check_gae, check_normalize_advantages,
                             check_policy_loss, check_value_loss, identify)

FEW = 20


# -- a function that writes inf into an input (issue 24: it passed, identify called it a match)

def _wrong_gae_writing_inf(rewards, values, terminated, truncated, last_values, final_values, *,
                           gamma, gae_lambda):
    adv, ret = gae(rewards, values, terminated, truncated, last_values, final_values,
                   gamma=gamma, gae_lambda=gae_lambda)
    rewards[...] = np.inf  # the tolerance, if read from here, becomes inf
    return adv + 1.0, ret + 1.0


def _wrong_policy_loss_writing_inf(new, old, adv, clip_range):
    loss, d, info = policy_loss(new, old, adv, clip_range)
    adv[0] = np.inf
    return loss + 1.0, d, info


def _wrong_value_loss_writing_inf(values, old_values, returns, clip_range_vf):
    loss, d = value_loss(values, old_values, returns, clip_range_vf)
    returns[-1] = -np.inf
    return loss * 3.0, d


@pytest.mark.parametrize("check, fn, name", [
    (check_gae, _wrong_gae_writing_inf, "rewards"),
    (check_policy_loss, _wrong_policy_loss_writing_inf, "adv"),
    (check_value_loss, _wrong_value_loss_writing_inf, "returns"),
])
def test_writing_inf_into_an_input_is_a_mismatch_naming_it(check, fn, name):
    with pytest.raises(Mismatch) as info:
        check(fn, max_examples=FEW)
    m = info.value
    assert m.mutated == name and m.output is None
    assert f"wrote into its input {name!r}" in str(m).splitlines()[0]
    assert "became inf" in str(m) or "became -inf" in str(m)


def test_identify_does_not_call_an_input_writer_a_match():
    with pytest.raises(Mismatch, match="wrote into its input 'rewards'"):
        identify(_wrong_gae_writing_inf, "gae", max_examples=FEW)


def test_a_correct_function_that_writes_into_an_input_still_fails():
    def normalize_in_place(advantages):
        a = advantages
        if a.size > 1:
            a -= a.mean()
            a /= a.std(ddof=1) + 1e-8
        return a
    with pytest.raises(Mismatch) as info:
        check_normalize_advantages(normalize_in_place, max_examples=FEW)
    assert info.value.mutated == "advantages"


# -- outputs that are not real floats ---------------------------------------------------------

def test_complex_output_is_a_mismatch():
    def complex_gae(*args, **kwargs):
        adv, ret = gae(*args, **kwargs)
        return adv + 1e6j, ret
    with pytest.raises(Mismatch) as info:
        check_gae(complex_gae, max_examples=5)
    m = info.value
    assert m.output == "advantages" and m.index is None
    assert "complex array (complex128), not real floats" in str(m).splitlines()[0]


@pytest.mark.parametrize("bad, what", [
    (lambda loss: str(loss), "string value"),
    (lambda loss: np.array([loss], dtype=object), "object array"),
    (lambda loss: True, "boolean value"),
    (lambda loss: np.array([loss]), "shape (1,), expected ()"),
])
def test_strings_objects_bools_and_shapes_are_mismatches(bad, what):
    def fn(values, old_values, returns, clip_range_vf):
        loss, d = value_loss(values, old_values, returns, clip_range_vf)
        return bad(loss), d
    with pytest.raises(Mismatch, match="loss of fn: " + what.replace("(", r"\(").replace(
            ")", r"\)")):
        check_value_loss(fn, max_examples=5)


def test_an_unreadable_result_is_a_mismatch_not_a_crash():
    with pytest.raises(Mismatch, match="cannot be read through layout"):
        check_value_loss(lambda *a: object(), max_examples=5)


# -- torch outputs, the deadline, short tracebacks -------------------------------------------

def test_torch_outputs_with_requires_grad_are_accepted():
    torch = pytest.importorskip("torch")

    def torch_value_loss(values, old_values, returns, clip_range_vf):
        v = torch.tensor(values, dtype=torch.float64, requires_grad=True)
        r = torch.as_tensor(returns, dtype=torch.float64)
        loss = ((v - r) ** 2).mean()
        (grad,) = torch.autograd.grad(loss, v)
        return loss, grad  # loss still requires grad
    check_value_loss(torch_value_loss, exclude=("value_clipping",), max_examples=FEW)


class _JaxLike:
    """Offers only ``__array__``, as a ``jax.Array`` does (JAX is not imported)."""

    def __init__(self, a):
        self._a = np.asarray(a)

    def __array__(self, dtype=None, copy=None):
        return self._a if dtype is None else self._a.astype(dtype)


def test_arrays_with_only___array___are_converted():
    check_normalize_advantages(lambda a: _JaxLike(normalize_advantages(a)), max_examples=FEW)
    with pytest.raises(Mismatch, match="complex"):
        check_normalize_advantages(lambda a: _JaxLike(a + 1j), max_examples=5)


def test_a_call_over_the_deadline_stops_the_check():
    import time

    def slow(advantages):
        time.sleep(0.3)
        return normalize_advantages(advantages)
    with pytest.raises(Mismatch) as info:
        check_normalize_advantages(slow, deadline=0.1, max_examples=100)
    m = info.value
    assert m.seconds > 0.1 and m.output is None
    assert str(m).startswith("normalize_advantages: one call of slow took 0.3 s")
    assert "deadline=None" in str(m)
    with pytest.raises(ValueError, match="deadline"):
        check_normalize_advantages(slow, deadline=0)


def test_pytest_shows_the_message_not_the_checker_source(tmp_path):
    test = tmp_path / "test_user.py"
    test.write_text(textwrap.dedent("""
        from ppo_ref.testing import check_normalize_advantages

        def test_mine():
            check_normalize_advantages(lambda a: a * 2.0, max_examples=5)
    """))
    root = os.path.dirname(os.path.dirname(os.path.abspath(ppo_ref.__file__)))  # this tree
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(test)], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": root}).stdout
    report = out[out.index("def test_mine"):out.index("short test summary")]
    assert "Mismatch: normalize_advantages: advantages[" in report
    # no frame of the package's checker is shown (its source lines, or its file:line)
    assert "ppo_ref/testing/" not in report and "ppo_ref" + os.sep + "testing" not in report
    frames = [line for line in report.splitlines() if re.match(r"\S+\.py:\d+: ", line)]
    assert len(frames) == 1 and frames[0].startswith("test_user.py:"), report
    assert len(report.splitlines()) < 25, report


# -- ppo-ref check: nothing compared is no pass ----------------------------------------------

def test_check_fails_when_every_output_is_skipped(tmp_path, capsys):
    vec = tmp_path / "vec"
    vectors.write_vectors(str(vec), backend="spec")
    cases = {c["name"]: c for c in vectors.load_cases(str(vec))}
    doc = {"format": vectors.RESULTS_FORMAT, "implementation": "skips everything",
           "cases": {name: {"outputs": {}, "skip": list(vectors.check.flatten(c["expected"]))}
                     for name, c in cases.items()}}
    path = tmp_path / "skips.json"
    path.write_text(json.dumps(doc))
    rows = vectors.check_results(str(vec), str(path))
    assert len(rows) == len(cases) and {r["status"] for r in rows} == {"SKIP"}
    assert all("nothing compared" in r["detail"] for r in rows)
    assert cli.main(["check", str(vec), "--results", str(path)]) == 1
    captured = capsys.readouterr()
    assert f"0 passed, {len(cases)} skipped" in captured.out
    assert "nothing was compared" in captured.err
    # one case compared is enough for a pass (the others explicitly skipped)
    doc["cases"]["adam"] = {"outputs": vectors.encode(vectors.compute_outputs(
        cases["adam"], backend="spec"))}
    path.write_text(json.dumps(doc))
    assert cli.main(["check", str(vec), "--results", str(path)]) == 0
