"""The two backends as wholes, by behaviour.

* The compiled tier run as Python (``NUMBA_DISABLE_JIT=1``, every compiled function its Python
  source) gives the bits it gives compiled: the inputs of tests/test_tiers.py's rows, the
  fast side only, computed again in a subprocess (:func:`test_compiled_equals_interpreted`).
  Every row of the modules whose twins compile the spec's loops (masks, advantages,
  distributions, losses, optim), and small cases of the network modules (their interpreted
  products are slow), in float64 and float32.
* Three updates of each trainer on the spec backend and on the fast backend (feedforward and
  recurrent, separate and shared networks, Discrete and Box actions, float32 on the fast
  backend, KL stop rules that fire) give the same parameters and metrics within the stated
  tolerances (:func:`test_trainers_agree_across_backends`).
* The golden vectors written by either backend agree
  (:func:`test_golden_vectors_agree_across_backends`).
"""
from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import test_tiers
from early_commands import assert_succeeded, python_call
from ppo_ref.config import PPOConfig
from ppo_ref.tiers import tier_for

# -- compiled == interpreted, on the table's inputs ---------------------------------------------

#: The modules whose every row runs interpreted (their cases are small loops).
LOOP_MODULES = ("masks", "advantages", "distributions", "losses", "optim")

#: Small cases of the network twins, by the table's input generators: ``(module, function,
#: case name, run)``. 50 rows: more than one chunk of the MLP's row blocks; widths of 32: the
#: float32 register panels.
NETWORK_CASES = [
    ("layers", "mlp_forward", "f64 [50] (8, 5)", test_tiers._mlp_case((50,), (8, 5))),
    ("layers", "mlp_forward", "f32 [50] (8, 5) relu",
     test_tiers._mlp_case((50,), (8, 5), "relu", np.float32)),
    ("layers", "mlp_forward", "f32 [12] (32,) panels",
     test_tiers._mlp_case((12,), (32,), dtype=np.float32)),
    ("layers", "mlp_backward", "f64 [50] (8,) relu",
     test_tiers._mlp_case((50,), (8,), "relu", backward=True)),
    ("layers", "mlp_backward", "f32 [50] (8,)",
     test_tiers._mlp_case((50,), (8,), dtype=np.float32, backward=True)),
    ("networks", "actor_critic_forward", "f64 (8,) shared",
     test_tiers._net_case("forward", (8,), True, rows=50)),
    ("networks", "actor_critic_forward", "f32 (8, 8)",
     test_tiers._net_case("forward", (8, 8), dtype=np.float32, rows=50)),
    ("networks", "actor_critic_forward", "f32 (32,) panels",
     test_tiers._net_case("forward", (32,), dtype=np.float32, rows=12)),
    ("networks", "actor_critic_backward", "f64 (8, 8) relu",
     test_tiers._net_case("backward", (8, 8), activation="relu", rows=50)),
    ("networks", "actor_critic_backward", "f32 (8,) shared",
     test_tiers._net_case("backward", (8,), True, dtype=np.float32, rows=50)),
    ("networks", "value_forward", "f64 (8,)", test_tiers._net_case("value", (8,), rows=50)),
    ("lstm", "lstm_forward", "f64", test_tiers._lstm_case("forward", 5, 3, 2, 4)),
    ("lstm", "lstm_backward", "f64", test_tiers._lstm_case("backward", 5, 3, 2, 4)),
    ("lstm", "lstm_backward", "f32", test_tiers._lstm_case("backward", 5, 3, 2, 4, np.float32)),
    ("lstm", "lstm_step", "f64", test_tiers._lstm_case("step", 5, 3, 2, 4)),
    ("recurrent_networks", "recurrent_actor_critic_forward", "f64 separate",
     test_tiers._rnn_case("forward", False, (8,), n_steps=4, n_env=3, hidden=4)),
    ("recurrent_networks", "recurrent_actor_critic_backward", "f64 shared",
     test_tiers._rnn_case("backward", True, (8,), n_steps=4, n_env=3, hidden=4)),
    ("recurrent_networks", "recurrent_actor_critic_backward", "f32 separate",
     test_tiers._rnn_case("backward", False, (8,), n_steps=4, n_env=3, hidden=4,
                          dtype=np.float32)),
    ("recurrent_networks", "recurrent_actor_critic_step", "f64 shared",
     test_tiers._rnn_case("step", True, (8,), n_steps=4, n_env=3, hidden=4)),
    ("recurrent_networks", "recurrent_value_step", "f64 separate",
     test_tiers._rnn_case("value", False, (8,), n_steps=4, n_env=3, hidden=4)),
]

#: float32 categoricals: interpreted, ``math.exp``/``math.log`` of a float32 return Python
#: floats (computed in double, rounded once when stored); compiled, they are float32's own
#: ``expf``/``logf``. Not the same operations: within two float32 roundings of the largest
#: entry, not the same bits.
F32_LIBM = dict(rtol=2.0 ** -22, atol=0.0)


def _tolerance(key: str) -> dict:
    if key.startswith("distributions.") and "float32" in key:
        return F32_LIBM
    return dict(rtol=0.0, atol=0.0)


def interpreted_cases():
    """``{id: (module, function, case)}``: what test_compiled_equals_interpreted runs."""
    out = {}
    for (module, name), cases in sorted(test_tiers.ROWS.items()):
        if module in LOOP_MODULES:
            for case in cases:
                out[f"{module}.{name}:{case.name}"] = (module, name, case)
    for module, name, label, run in NETWORK_CASES:
        out[f"{module}.{name}:{label}"] = (module, name, test_tiers.Case(label, run))
    return out


def fast_results() -> dict:
    """``{id: the fast side's result}`` of every case (``{id: "Error: ..."}`` when it raises),
    with the table's seed."""
    out = {}
    for key, (module, _, case) in interpreted_cases().items():
        side = (tier_for("fast") if case.whole_tier
                else importlib.import_module(f"ppo_ref.fast.{module}"))
        try:
            out[key] = case.run(side, np.random.default_rng(20261207))
        except Exception as exc:  # reported by the test of that case
            out[key] = f"{type(exc).__name__}: {exc}"
    return out


def _dump(path: str) -> None:
    """Pickle :func:`fast_results` to ``path`` (the interpreted subprocess calls it)."""
    with open(path, "wb") as f:
        pickle.dump(fast_results(), f)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("interpreted") / "results.pickle")
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys; sys.path.insert(0, {here!r}); import test_backends; "
            f"test_backends._dump({path!r})")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(path, "rb") as f:
        return pickle.load(f)


@pytest.fixture(scope="module")
def compiled():
    return fast_results()


@pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1",
                    reason="this process is interpreted")
@pytest.mark.early_command(python_call(_dump, "{dir}/results.pickle"), timeout=900)
def test_compiled_results_are_the_same_bits_in_another_process(early_command, request):
    """Every case's compiled result in a process of its own has the bits of this process's (no
    result depends on the addresses of its arrays or on what ran before it in a process). The
    other process runs first, at the end of collection, beside the tests before this one: the
    kernels it compiles are cached by the time this process needs them."""
    directory = assert_succeeded(early_command)
    with open(os.path.join(directory, "results.pickle"), "rb") as f:
        other = pickle.load(f)
    compiled = request.getfixturevalue("compiled")  # after the other process: from its cache
    assert list(other) == list(compiled)
    for key in compiled:
        assert not isinstance(compiled[key], str), f"{key}: {compiled[key]}"
        test_tiers._compare(other[key], compiled[key], rtol=0.0, atol=0.0,
                            where=f"{key}: this process != another process")


@pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1",
                    reason="this process is interpreted")
@pytest.mark.parametrize("key", interpreted_cases())
def test_compiled_equals_interpreted(key, compiled, interpreted):
    """The case's fast side compiled and interpreted: no error, the same bits (float32
    categoricals: within :data:`F32_LIBM`)."""
    got, want = compiled[key], interpreted[key]
    assert not isinstance(got, str), f"compiled: {got}"
    assert not isinstance(want, str), f"interpreted: {want}"
    test_tiers._compare(want, got, **_tolerance(key), where=f"{key}: compiled != interpreted")


# -- the trainers on both backends --------------------------------------------------------------

TRAINER_CASES = {
    # name: (trainer, env id, config changes, fast compute dtype, parameter tolerance)
    "mlp-discrete-separate": ("ff", "CartPole-v1", dict(), "float64", 1e-12),
    "mlp-discrete-shared": ("ff", "CartPole-v1", dict(shared_trunk=True, activation="relu"),
                            "float64", 1e-12),
    "mlp-box": ("ff", "Pendulum-v1", dict(normalize_observations=True), "float64", 1e-12),
    "mlp-discrete-float32": ("ff", "CartPole-v1", dict(), "float32", 1e-5),
    "lstm-discrete-separate": ("lstm", "ppo_ref/MemoryCue-v0", dict(), "float64", 1e-12),
    "lstm-discrete-shared": ("lstm", "ppo_ref/MemoryCue-v0", dict(lstm_shared=True),
                             "float64", 1e-12),
    "lstm-box": ("lstm", "Pendulum-v1", dict(), "float64", 1e-12),
    "lstm-float32": ("lstm", "ppo_ref/MemoryCue-v0", dict(), "float32", 1e-5),
    # KL stop rules configured so that they fire in these runs
    "mlp-discrete-target-kl-sb3": ("ff", "CartPole-v1", dict(target_kl=1e-4, kl_stop_rule="sb3"),
                                   "float64", 1e-12),
    "lstm-discrete-target-kl-cleanrl": ("lstm", "ppo_ref/MemoryCue-v0",
                                        dict(target_kl=2e-5, kl_stop_rule="cleanrl"),
                                        "float64", 1e-12),
}

METRICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm",
           "explained_variance", "n_gradient_steps", "n_epochs_run")


def _train(kind, env_id, changes, backend, dtype, updates=3):
    from ppo_ref import PPOTrainer, RecurrentPPOTrainer
    base = dict(n_steps=32, n_envs=4, batch_size=32, n_epochs=3, learning_rate=1e-3,
                net_arch=(16,), lstm_hidden_size=8, ent_coef=0.01)
    config = PPOConfig(**{**base, **changes}, backend=backend, compute_dtype=dtype)
    cls = RecurrentPPOTrainer if kind == "lstm" else PPOTrainer
    trainer = cls(env_id, config, seed=3)
    stats = []
    try:
        trainer.learn(updates * 32 * 4, callback=lambda t, s: stats.append(dict(s)))
        params = {k: np.array(v) for k, v in trainer.params.items()}
    finally:
        trainer.close()
    return params, stats


@pytest.mark.parametrize("name", sorted(TRAINER_CASES))
def test_trainers_agree_across_backends(name):
    """Three updates of the same run (same seed) on the spec backend and on the fast backend
    give the same parameters within the row's tolerance (relative to each array's largest
    entry; float64 fast: 1e-12, float32 fast: 1e-5) and the same metrics within 1000 times
    that; the first minibatch of every update reproduces the behaviour log-probs (ratio
    exactly 1 on the fast tier, within 1e-12 on the spec tier, whose NumPy products may round
    a row differently in a batch of another size)."""
    kind, env_id, changes, dtype, tol = TRAINER_CASES[name]
    spec_params, spec_stats = _train(kind, env_id, changes, "spec", "float64")
    fast_params, fast_stats = _train(kind, env_id, changes, "fast", dtype)
    assert len(spec_stats) == len(fast_stats) == 3
    assert list(fast_params) == list(spec_params)
    test_tiers._compare(spec_params, fast_params, tol, 1e-12, f"{name}: params")
    for s, f in zip(spec_stats, fast_stats):
        for key in METRICS:
            assert f[key] == pytest.approx(s[key], rel=tol * 1000, abs=tol), key
        assert f["first_max_abs_log_ratio"] == 0.0
        assert s["first_max_abs_log_ratio"] < 1e-12
    if "target_kl" in changes:
        assert all(s["kl_stopped"] == 1.0 for s in spec_stats + fast_stats)


# -- the golden vectors on both backends -------------------------------------------------------

def test_golden_vectors_agree_across_backends(tmp_path):
    """``ppo-ref vectors --backend spec`` and ``--backend fast`` write the same cases, and the
    fast tier's results pass ``check`` against the spec tier's vectors (each case's own
    tolerance): the published reference numbers do not depend on the tier."""
    from ppo_ref import vectors
    spec_dir, fast_dir = str(tmp_path / "spec"), str(tmp_path / "fast")
    names = vectors.write_vectors(spec_dir, backend="spec")
    assert vectors.write_vectors(fast_dir, backend="fast") == names
    results = {"format": vectors.RESULTS_FORMAT, "implementation": "ppo_ref fast", "cases": {}}
    for case in vectors.load_cases(spec_dir):
        outputs = vectors.compute_outputs(case, backend="fast")
        results["cases"][case["name"]] = {"outputs": vectors.encode(outputs)}
    path = tmp_path / "results.json"
    path.write_text(vectors.dumps(results))
    rows = vectors.check_results(spec_dir, str(path))
    assert len(rows) == len(names) > 10
    failed = [r for r in rows if r.get("status") != "PASS"]
    assert not failed, failed
    with pytest.raises(ValueError, match="backend"):
        vectors.compute_outputs(vectors.load_cases(spec_dir)[0], backend="numba")
