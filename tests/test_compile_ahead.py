"""ppo_ref.cli.ahead: the helper process that compiles a first run's update kernels, and
ppo_ref._numba.claim_first, which makes it start once per cache."""
import json
import os
import subprocess
import sys

import pytest

from early_commands import assert_succeeded, python_call

from ppo_ref import _numba
from ppo_ref.cli.ahead import start_compiling_ahead, stop_compiling_ahead
from ppo_ref.config import PPOConfig
from ppo_ref.train.ppo import PPOTrainer

pytestmark = pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1",
                                reason="needs the compiler")

# Runs `body` in a fresh interpreter and prints, as JSON, the functions numba compiled there
# when called from Python (not the functions compiled into them).
_RECORD = """
import json, sys
from numba.core import event
compiled, depth = set(), [0]
class Record(event.Listener):
    def on_start(self, ev):
        depth[0] += 1
        if depth[0] == 1:
            f = ev.data["dispatcher"].py_func
            compiled.add(f.__module__ + "." + f.__qualname__)
    def on_end(self, ev):
        depth[0] -= 1
event.register("numba:compile", Record())
{body}
print(json.dumps(sorted(compiled)))
"""
_HELPER = """
from ppo_ref.cli.ahead import compile_update
from ppo_ref.zoo import zoo_entry
compile_update({policy!r}, {env_id!r},
               zoo_entry({env_id!r}).config(compute_dtype={dtype!r}).to_dict())
"""
_RUN = """
from ppo_ref.cli.main import main
assert main(["train", "--env", {env_id!r}, "--quiet", "--total-timesteps", "256",
             "--set", "compute_dtype={dtype}", "--run-dir", {run_dir!r}]) == 0
"""


def _compiled(body: str, cache: str) -> set:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    done = subprocess.run([sys.executable, "-c", _RECORD.format(body=body)], env=env,
                          capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def helper_then_run(directory):
    """For the MLP (CartPole-v1) in float32 and the LSTM (CartPoleNoVel-v1), each with an empty
    cache: the helper's update compiles kernels, and a first run after it compiles none of them
    again (the helper used the run's argument types), only others (its networks'). For the MLP
    in float64 the helper is the process a run starts: it ends by itself with status 0, and the
    run after it compiles none of the functions the others' helpers compiled."""
    by_helpers = set()
    for policy, env_id, dtype in (("mlp", "CartPole-v1", "float32"),
                                  ("lstm", "ppo_ref/CartPoleNoVel-v1", "float64"),
                                  ("mlp", "CartPole-v1", "float64")):
        cache = os.path.join(directory, policy + dtype, "cache")
        if dtype == "float32" or policy == "lstm":
            by_helper = _compiled(_HELPER.format(policy=policy, env_id=env_id, dtype=dtype),
                                  cache)
        else:
            _numba.config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"] = cache
            trainer = PPOTrainer(env_id, PPOConfig.zoo_cartpole())
            helper = start_compiling_ahead(trainer)
            try:
                assert helper.wait(timeout=300) == 0  # its stdin still open: done by itself
            finally:
                stop_compiling_ahead(helper)
                trainer.close()
            by_helper = by_helpers
        by_helpers |= by_helper
        run_dir = os.path.join(directory, policy + dtype, "run")
        by_run = _compiled(_RUN.format(env_id=env_id, run_dir=run_dir, dtype=dtype), cache)
        assert by_helper and by_run, (by_helper, by_run)
        assert not by_helper & by_run, f"{policy} {dtype}: compiled twice: {by_helper & by_run}"


@pytest.mark.early_command(python_call(helper_then_run, "{dir}"), timeout=600)
def test_a_run_after_the_helper_compiles_none_of_its_kernels_again(early_command):
    """:func:`helper_then_run` in a process of its own, started at the end of collection."""
    assert_succeeded(early_command)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An empty numba cache directory, for this process and its children."""
    cache = tmp_path / "cache"
    monkeypatch.setattr(_numba.config, "CACHE_DIR", str(cache))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(cache))
    return cache


def test_claim_first_is_true_once_per_name_and_cache(cache_dir, tmp_path, monkeypatch):
    assert _numba.claim_first("a") and not _numba.claim_first("a")
    assert _numba.claim_first("b")
    monkeypatch.setattr(_numba.config, "CACHE_DIR", str(tmp_path / "other"))
    assert _numba.claim_first("a")
    monkeypatch.setattr(_numba.config, "DISABLE_JIT", True)
    assert not _numba.claim_first("c")


def test_claim_first_is_false_without_a_writable_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(_numba.config, "CACHE_DIR", str(blocker / "cache"))
    assert not _numba.claim_first("a")


def test_the_helper_starts_once_per_cache_and_ends_with_the_run(cache_dir):
    trainer = PPOTrainer("CartPole-v1", PPOConfig.zoo_cartpole(n_envs=2, batch_size=64))
    try:
        helper = start_compiling_ahead(trainer)
        assert helper is not None
        assert start_compiling_ahead(trainer) is None  # claimed
        stop_compiling_ahead(helper)  # what the run does when it ends
        # it ended on its closed stdin (exit code 0), not killed after waiting
        assert helper.returncode == 0
    finally:
        trainer.close()


def test_the_helper_needs_two_cpus_and_runs_without_sched_getaffinity(cache_dir, monkeypatch):
    """One CPU: no helper and nothing claimed; a platform without ``os.sched_getaffinity``
    (macOS) counts ``os.cpu_count()``."""
    trainer = PPOTrainer("CartPole-v1", PPOConfig.zoo_cartpole(n_envs=2, batch_size=64))
    try:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
        assert start_compiling_ahead(trainer) is None
        monkeypatch.delattr(os, "sched_getaffinity", raising=False)
        monkeypatch.setattr(os, "cpu_count", lambda: 2)
        helper = start_compiling_ahead(trainer)  # (the claim was not spent above)
        assert helper is not None
        stop_compiling_ahead(helper)
    finally:
        trainer.close()
