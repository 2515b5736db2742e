"""The one seam between the tiers, as the code runs: traces of whole trainer iterations.

A profile hook (``sys.setprofile``) records every Python function call of one default iteration
of each trainer (feedforward on CartPole-v1, LSTM on ppo_ref/CartPoleNoVel-v1, their zoo
settings). The rule it checks: code outside ``ppo_ref.fast`` calls into ``ppo_ref.fast`` only
through public twins (a name of ``ppo_ref.fast.<m>.__all__`` that ``ppo_ref.spec.<m>`` defines
too), and the readable backend never enters ``ppo_ref.fast`` at all. Compiled functions do not
run Python frames; that no private fast name is imported outside ``ppo_ref/fast/`` at all is
``tests/test_architecture.py``'s check.

The second test runs the same iterations with ``NUMBA_DISABLE_JIT=1`` (so the spec functions
that the compiled tier compiles run as Python and show in the trace) on both backends, and
returns the spec functions each backend executed: the README's map must name only functions
that run under both (``tests/test_readme_map.py`` uses it).
"""
from __future__ import annotations

import functools
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Small but default-shaped runs: the zoo settings of each env with fewer steps.
RUNS = {
    "mlp": ("CartPole-v1", "PPOTrainer", {}),
    "lstm": ("ppo_ref/CartPoleNoVel-v1", "RecurrentPPOTrainer", {}),
}

_TRACE_SCRIPT = r"""
import json, sys
import ppo_ref
from ppo_ref.config import PPOConfig
from ppo_ref.zoo import zoo_entry


def trace(env_id, trainer_name, backend, overrides):
    settings = dict(zoo_entry(env_id).settings, backend=backend, **overrides)
    config = PPOConfig(**settings)
    trainer = getattr(ppo_ref, trainer_name)(env_id, config, seed=0)
    trainer.iteration()            # compile (when compiled), fill the caches
    calls = []

    def hook(frame, event, arg):
        if event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        if not name.startswith("ppo_ref."):
            return
        caller = frame.f_back
        calls.append((name, frame.f_code.co_name,
                      caller.f_globals.get("__name__", "") if caller is not None else ""))

    sys.setprofile(hook)
    trainer.total_timesteps = 10 ** 6   # a learning rate > 0 (learn() sets it)
    trainer.iteration()
    sys.setprofile(None)
    trainer.close()
    return sorted(set(map(tuple, calls)))


print(json.dumps([trace(*run) for run in json.loads(sys.argv[1])]))
"""


def _traces(runs, disable_jit: bool = False):
    """The calls of one traced iteration of each run ``(kind, backend, overrides)``, all in one
    fresh process (each run builds its own trainer and runs one iteration before its traced
    one, as a process of its own would): ``[[(module, function, caller module), ...], ...]``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if disable_jit:
        env["NUMBA_DISABLE_JIT"] = "1"
    args = [(RUNS[kind][0], RUNS[kind][1], backend, dict(RUNS[kind][2], **(overrides or {})))
            for kind, backend, overrides in runs]
    out = subprocess.run([sys.executable, "-c", _TRACE_SCRIPT, json.dumps(args)],
                         capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return [[tuple(c) for c in calls] for calls in json.loads(out.stdout.strip().splitlines()[-1])]


@functools.cache
def _compiled_traces():
    """``{(kind, backend): calls}`` of every trainer kind on both backends, compiled."""
    keys = [(kind, backend) for kind in sorted(RUNS) for backend in ("fast", "spec")]
    return dict(zip(keys, _traces([(kind, backend, None) for kind, backend in keys])))


def _trace(kind: str, backend: str):
    return _compiled_traces()[kind, backend]


def _is_public_twin(module: str, function: str) -> bool:
    """``ppo_ref.fast.<m>.<function>`` is in that module's ``__all__`` and
    ``ppo_ref.spec.<m>`` defines a function of the same name."""
    fast_module = importlib.import_module(module)
    spec_module = importlib.import_module(module.replace("ppo_ref.fast.", "ppo_ref.spec.", 1))
    return (function in getattr(fast_module, "__all__", ())
            and callable(getattr(spec_module, function, None)))


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_default_iteration_crosses_the_seam_only_through_public_twins(kind):
    calls = _trace(kind, "fast")
    entered = {(m, f) for m, f, caller in calls
               if m.startswith("ppo_ref.fast.") and not caller.startswith("ppo_ref.fast")}
    assert entered, "the fast backend never called the compiled tier"
    wrong = sorted(f"{caller} -> {m}.{f}" for m, f, caller in calls
                   if m.startswith("ppo_ref.fast.") and not caller.startswith("ppo_ref.fast")
                   and not _is_public_twin(m, f))
    assert not wrong, "calls into ppo_ref.fast that are not public twins: " + "; ".join(wrong)
    # the steps of the algorithm ran as the spec's own code
    ran = {(m, f) for m, f, _ in calls}
    for step in ("run_epochs", "minibatch_loss"):
        assert ("ppo_ref.spec.update", step) in ran
    minibatching = "recurrent_minibatches" if kind == "lstm" else "feedforward_minibatches"
    assert ("ppo_ref.spec.update", "per_epoch") in ran, minibatching


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_readable_backend_never_enters_the_compiled_tier(kind):
    calls = _trace(kind, "spec")
    assert not [c for c in calls if c[0].startswith("ppo_ref.fast")]


def spec_functions_run_by_both_backends(kind: str):
    """The ``(module, function)`` of ``ppo_ref.spec`` executed by one iteration under both
    backends, with compiled code run as Python (``NUMBA_DISABLE_JIT=1``; a tiny network keeps
    the interpreted products quick)."""
    sets = [{(m, f) for m, f, _ in _interpreted_traces()[kind, backend]
             if m.startswith("ppo_ref.spec.")} for backend in ("fast", "spec")]
    return sets[0] & sets[1]


@functools.cache
def _interpreted_traces():
    """``{(kind, backend): calls}`` of every trainer kind on both backends, run as Python."""
    keys = [(kind, backend) for kind in sorted(RUNS) for backend in ("fast", "spec")]
    runs = []
    for kind, backend in keys:
        tiny = {"n_steps": 8, "batch_size": 64, "n_epochs": 2, "net_arch": [8]}
        if kind == "lstm":
            tiny["lstm_hidden_size"] = 4
        runs.append((kind, backend, tiny))
    return dict(zip(keys, _traces(runs, disable_jit=True)))
