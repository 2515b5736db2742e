"""The public advantage functions of the spec (ppo_ref.spec.advantages.gae, .vtrace, whose
checks the compiled twins share): argument validation naming the argument, dtypes (float32
really computed in float32), T = 0, non-finite inputs and results. (The twins' results are
tests/test_tiers.py's; the GAE and V-trace values against their oracles are
tests/test_kernels.py's.)"""
import os

import numba
import numpy as np
import pytest

from ppo_ref.spec import advantages
from ppo_ref.spec.advantages import gae, vtrace

T, N = 3, 2


def base_gae():
    rng = np.random.default_rng(0)
    return dict(rewards=rng.normal(size=(T, N)), values=rng.normal(size=(T, N)),
                terminated=np.array([[0, 1], [0, 0], [0, 0]], bool),
                truncated=np.array([[0, 0], [1, 0], [0, 0]], bool),
                last_values=rng.normal(size=N), final_values=rng.normal(size=(T, N)),
                gamma=0.99, gae_lambda=0.95)


def base_vtrace():
    kw = base_gae()
    del kw["gae_lambda"]
    rng = np.random.default_rng(1)
    kw.update(behaviour_log_probs=rng.normal(size=(T, N)) - 1,
              target_log_probs=rng.normal(size=(T, N)) - 1,
              rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0, lambda_=0.9)
    return kw


def bad_entry(x, value):
    x = np.array(x, dtype=np.result_type(np.asarray(x).dtype, type(value)))
    x.flat[-1] = value
    return x


SEQUENCES = ["rewards", "values", "final_values"]
LOG_PROBS = ["behaviour_log_probs", "target_log_probs"]
FLAGS = ["terminated", "truncated"]


def array_failures(name, flag=False):
    """(case id, function making the bad value from the good one) for an array argument."""
    cases = [
        ("rank3", lambda x: np.zeros((T, N, 2))),
        ("rank0", lambda x: np.float64(0.0)),
        ("short", lambda x: np.asarray(x)[:-1]),
        ("narrow", lambda x: np.asarray(x)[:, :1]),
    ]
    if flag:
        cases += [("two", lambda x: bad_entry(np.asarray(x, np.int64), 2)),
                  ("half", lambda x: bad_entry(np.asarray(x, np.float64), 0.5)),
                  ("nan", lambda x: bad_entry(np.asarray(x, np.float64), np.nan)),
                  ("strings", lambda x: np.full(np.shape(x), "a"))]
    else:
        cases += [("nan", lambda x: bad_entry(x, np.nan)),
                  ("inf", lambda x: bad_entry(x, np.inf)),
                  ("-inf", lambda x: bad_entry(x, -np.inf)),
                  ("complex", lambda x: np.asarray(x) + 1j),
                  ("strings", lambda x: np.full(np.shape(x), "a"))]
    return [(f"{name}-{cid}", name, f) for cid, f in cases]


LAST_VALUES_FAILURES = [
    ("last_values-scalar", "last_values", lambda x: 1.0),
    ("last_values-long", "last_values", lambda x: np.zeros(N + 1)),
    ("last_values-2d", "last_values", lambda x: np.zeros((1, N))),
    ("last_values-nan", "last_values", lambda x: bad_entry(x, np.nan)),
    ("last_values-strings", "last_values", lambda x: np.array(["a"] * N)),
]


def scalar_failures(name, bad_values):
    return [(f"{name}={v!r}", name, (lambda v: lambda x: v)(v)) for v in bad_values]


UNIT = [-0.1, 1.01, np.nan, np.inf, "a", None, True, np.array([0.5, 0.5])]
POSITIVE = [0.0, -1.0, np.nan, np.inf, "a", True, np.array([1.0, 1.0])]
OPTIONS = (scalar_failures("truncation", ["cut", None, 0])
           + scalar_failures("bootstrap_terminal_last_row", [1, "yes", None]))

GAE_FAILURES = (sum((array_failures(n) for n in SEQUENCES), [])
                + sum((array_failures(n, flag=True) for n in FLAGS), [])
                + LAST_VALUES_FAILURES
                + scalar_failures("gamma", UNIT) + scalar_failures("gae_lambda", UNIT) + OPTIONS)
VTRACE_FAILURES = (sum((array_failures(n) for n in SEQUENCES + LOG_PROBS), [])
                   + sum((array_failures(n, flag=True) for n in FLAGS), [])
                   + LAST_VALUES_FAILURES
                   + scalar_failures("gamma", UNIT) + scalar_failures("lambda_", UNIT)
                   + scalar_failures("rho_bar", POSITIVE) + scalar_failures("c_bar", POSITIVE)
                   + scalar_failures("pg_rho_bar", POSITIVE)  # (None is valid: it means rho_bar)
                   + scalar_failures("rho_bar", [None]) + scalar_failures("c_bar", [None])
                   + OPTIONS)


def _expected_name(name, case_id):
    # A shorter or narrower `rewards` is detected as the other arrays disagreeing with it.
    if name == "rewards" and case_id.endswith(("short", "narrow")):
        return "(values|behaviour_log_probs)"
    return name


@pytest.mark.parametrize("case_id, name, make_bad", GAE_FAILURES, ids=[c[0] for c in GAE_FAILURES])
def test_gae_errors_name_the_argument(case_id, name, make_bad):
    kw = base_gae()
    kw[name] = make_bad(kw.get(name))
    with pytest.raises(ValueError, match=f"^{_expected_name(name, case_id)}"):
        gae(**kw)


@pytest.mark.parametrize("case_id, name, make_bad", VTRACE_FAILURES,
                         ids=[c[0] for c in VTRACE_FAILURES])
def test_vtrace_errors_name_the_argument(case_id, name, make_bad):
    kw = base_vtrace()
    kw[name] = make_bad(kw.get(name))
    with pytest.raises(ValueError, match=f"^{_expected_name(name, case_id)}"):
        vtrace(**kw)


@pytest.mark.parametrize("fn, base", [(gae, base_gae), (vtrace, base_vtrace)])
def test_final_values_required_only_when_truncation_bootstraps(fn, base):
    kw = base()
    kw["final_values"] = None
    with pytest.raises(ValueError, match="^final_values is required: truncated has True entries$"):
        fn(**kw)
    fn(**kw, truncation="terminate")  # not read under the other conventions
    fn(**kw, truncation="ignore")
    kw["truncated"] = kw["terminated"]  # truncated only where also terminated: never read
    fn(**kw)


@pytest.mark.parametrize("shape", [(0,), (0, 4)])
def test_empty_rollout(shape):
    z = np.zeros(shape, np.float32)
    last = np.float32(0) if len(shape) == 1 else np.zeros(shape[1:], np.float32)
    adv, ret = gae(z, z, z, z, last, gamma=0.9, gae_lambda=0.9)
    vs, pg = vtrace(z, z, z, z, z, z, last, gamma=0.9)
    for out in (adv, ret, vs, pg):
        assert out.shape == shape and out.dtype == np.float32


# --- dtypes ---------------------------------------------------------------------------------

def _cast(kw, dtype):
    return {k: (v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
            for k, v in kw.items()}


@pytest.mark.parametrize("fn, base", [(gae, base_gae), (vtrace, base_vtrace)])
def test_float32_in_float32_out_close_to_float64(fn, base):
    kw64 = base()
    out64 = fn(**kw64)
    out32 = fn(**_cast(kw64, np.float32))
    for a32, a64 in zip(out32, out64):
        assert a64.dtype == np.float64 and a32.dtype == np.float32
        np.testing.assert_allclose(a32, a64, rtol=1e-5, atol=1e-5)


def test_result_dtype_rule():
    kw = _cast(base_gae(), np.float32)
    assert gae(**kw)[0].dtype == np.float32
    assert gae(**{**kw, "last_values": kw["last_values"].astype(np.float64)})[0].dtype == np.float64
    final64 = kw["final_values"].astype(np.float64)
    assert gae(**{**kw, "final_values": final64})[0].dtype == np.float64
    # integer rewards, 0/1 float64 flags and Python scalars do not count
    flags64 = {"terminated": kw["terminated"].astype(np.float64),
               "truncated": kw["truncated"].astype(np.float64)}
    assert gae(**{**kw, **flags64, "rewards": np.ones((T, N), np.int64)})[0].dtype == np.float32
    one = {k: (v[:, 0] if np.ndim(v) == 2 else v) for k, v in kw.items()}
    assert gae(**{**one, "last_values": 0.5})[0].dtype == np.float32
    assert gae(**{**one, "last_values": np.float64(0.5)})[0].dtype == np.float64
    lists = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    assert gae(**lists)[0].dtype == np.float64


def _compiled_float32(base):
    """The recursions of the spec (and its log-ratio loop), compiled afresh by numba, run by
    the spec's own drivers on float32 inputs: ``[(name, the float32 compile result)]``."""
    import ppo_ref.fast.advantages  # noqa: F401  (registers the scalar helpers the loops call)
    kw = _cast(base(), np.float32)
    fresh = {"gae_recursion": numba.njit(advantages.gae_recursion),
             "vtrace_recursion": numba.njit(advantages.vtrace_recursion),
             "log_ratios": numba.njit(advantages.log_ratios)}
    if "gae_lambda" in kw:
        advantages.run_gae(fresh["gae_recursion"], kw["rewards"], kw["values"],
                           kw["terminated"], kw["truncated"], kw["last_values"],
                           kw["final_values"], kw["gamma"], kw["gae_lambda"], "bootstrap", False)
        del fresh["vtrace_recursion"], fresh["log_ratios"]
    else:
        advantages.run_vtrace(fresh["vtrace_recursion"], fresh["log_ratios"],
                              kw["behaviour_log_probs"], kw["target_log_probs"], kw["rewards"],
                              kw["values"], kw["terminated"], kw["truncated"],
                              kw["last_values"], kw["final_values"], kw["gamma"],
                              kw["rho_bar"], kw["c_bar"], kw["pg_rho_bar"], kw["lambda_"],
                              "bootstrap", False)
        del fresh["gae_recursion"]
    out = []
    for name, dispatcher in fresh.items():
        (cres,) = dispatcher.overloads.values()
        out.append((name, cres))
    return out


@pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1", reason="needs the compiler")
@pytest.mark.parametrize("base", [base_gae, base_vtrace], ids=["gae", "vtrace"])
def test_compiled_float32_recursions_hold_no_float64_value(base):
    """The spec's loops compiled for float32 inputs (as the compiled tier compiles them): the
    arrays they read and write are float32 and no value inside is float64."""
    for name, cres in _compiled_float32(base):
        arrays = [t for t in cres.signature.args if isinstance(t, numba.types.Array)
                  and t.dtype in (numba.float32, numba.float64)]
        assert arrays and all(t.dtype == numba.float32 for t in arrays), (name, arrays)
        wide = {var: str(ty) for var, ty in cres.type_annotation.typemap.items()
                if "float64" in str(ty)}
        assert not wide, f"{name}: float64 values in the float32 loop: {wide}"


# --- finiteness: checked on the results, explained on the inputs ---------------------------

@pytest.mark.parametrize("fn, base", [(gae, base_gae), (vtrace, base_vtrace)])
@pytest.mark.parametrize("name", ["rewards", "values", "final_values"])
def test_non_finite_entry_inside_the_arrays_is_named_with_its_index(fn, base, name):
    kw = base()
    kw[name] = np.array(kw[name])
    kw[name][1, 0] = np.nan  # read by the kernel mid-loop (row 1 of 3), not at the edges
    with pytest.raises(ValueError, match=rf"^{name} must be finite: found nan at index \(1, 0\)$"):
        fn(**kw)


@pytest.mark.parametrize("dtype, big", [(np.float64, 1e308), (np.float32, 3e38)])
def test_overflowing_results_raise_instead_of_returning_inf(dtype, big):
    """Finite inputs whose results do not fit in the dtype: a ValueError, never inf or nan."""
    r, v = np.full(3, big, dtype), np.full(3, -big, dtype)  # r - v overflows
    z = np.zeros(3, bool)
    with pytest.raises(ValueError, match=f"^advantages overflow {np.dtype(dtype).name}"):
        gae(r, v, z, z, dtype(0), gamma=0.9, gae_lambda=0.9)
    with pytest.raises(ValueError, match=f"^vs overflow {np.dtype(dtype).name}"):
        vtrace(np.zeros(3, dtype), np.zeros(3, dtype), r, v, z, z, dtype(0), gamma=0.9)


def test_huge_finite_results_are_returned():
    # reward 1e308 on a terminal step: A = 1e308 - 0 and the return 1e308 fit in float64 (the
    # kernel's in-loop check sums reward + return, overflows, and the wrapper clears the alarm)
    adv, ret = gae([1e308], [0.0], [1], [0], 0.0, gamma=0.9, gae_lambda=0.9)
    assert adv[0] == 1e308 and ret[0] == 1e308
    vs, pg = vtrace([0.0], [0.0], [1e308], [0.0], [1], [0], 0.0, gamma=0.9)
    assert vs[0] == 1e308 and pg[0] == 1e308


def test_python_float_last_values_overflowing_float32_is_named():
    # A Python float does not count for the dtype: 1e300 is cast to float32, where it is inf.
    f, z = np.zeros(3, np.float32), np.zeros(3, bool)
    with pytest.raises(ValueError, match="^last_values must be finite in float32"):
        gae(f, f, z, z, 1e300, gamma=0.9, gae_lambda=0.9)
    with pytest.raises(ValueError, match="^last_values must be finite in float32"):
        vtrace(f, f, f, f, z, z, 1e300, gamma=0.9)


def test_log_probs_whose_difference_overflows_are_clipped_not_rejected():
    # finite log-probs: exp(1e308 - (-1e308)) = exp(inf) = inf, clipped by the bars exactly like
    # the overflow exp(1000) = inf
    args = ([1.0, 1.0], [0.0, 0.5], [0, 0], [0, 0], 2.0)
    huge = vtrace([-1e308, 0.0], [1e308, 0.0], *args, gamma=0.5)
    large = vtrace([0.0, 0.0], [1000.0, 0.0], *args, gamma=0.5)
    np.testing.assert_array_equal(huge.vs, large.vs)
    np.testing.assert_array_equal(huge.pg_advantages, large.pg_advantages)
    assert np.isfinite(huge.vs).all() and np.isfinite(huge.pg_advantages).all()


def test_time_deltas_are_neither_flags_nor_numbers():
    """NumPy counts ``timedelta64`` as an integer type (``np.issubdtype(m8, np.integer)``); a
    duration is not an episode flag nor a reward: both checks refuse it, naming the argument."""
    from ppo_ref._checks import as_flag_array, as_float_array
    durations = np.array([0, 1], dtype="m8[s]")
    with pytest.raises(ValueError, match="terminated must hold booleans"):
        as_flag_array(durations, "terminated")
    with pytest.raises(ValueError, match="rewards must be a real float array"):
        as_float_array(durations, "rewards")
