"""Fault campaign: hostile inputs against ppo_ref, counted per area.

    python validation/fault_campaign.py [--scale 1.0] [--seed 0] [--case-timeout 60]
                                        [--area-seconds 120] [--areas api,envs,...]

Every case runs in a separate worker process (``multiprocessing``, spawn), so a case that
crashes the interpreter (an abort, a segfault) or hangs is recorded as such and the worker is
replaced. A case is

* **clean** when it succeeds, or fails with one of the exception types its API documents
  (``ValueError`` and its subclasses ``CheckpointError`` / ``ExperienceError``, ``TypeError``
  for a wrong kind of object, ``EnvStepError``, ``ActorDiedError`` / ``StarvationError``) and
  a one-line message; on the command line: an exit status with at most one line on stderr and
  no traceback;
* a **problem** otherwise: another exception type, a multi-line error or a traceback, a result
  that is silently wrong (a corrupted checkpoint that loads different numbers), a hang past
  ``--case-timeout``, or a crash of the worker.

Areas (``--scale`` multiplies every count; each area also stops after ``--area-seconds``):

* ``api``: public functions (advantage kernels, losses, distributions, layers, init, checks,
  config, trainer ``predict``/``evaluate``) called with random junk arguments;
* ``envs``: rollouts from envs whose step returns junk (NaN, huge, complex, strings, wrong
  shapes, arrays, non-bool flags) at a random step;
* ``checkpoints``: a saved checkpoint with random bit flips (1 to 8 bits), loaded;
* ``cli``: ``ppo-ref`` command lines with junk flag values;
* ``json``: hostile JSON (deep nesting, huge integers, strings for numbers, wrong types,
  endless or oversized files, paths leaving the directory) for ``check`` and ``--resume``;
* ``actors``: kill -9 of one actor of a running actor-learner loop (process backend), timed
  from the kill to the learner's error (clean: ``ActorDiedError`` within 2.5 s, no process
  left behind);
* ``rewrites``: kills aimed at the rewrites of a run directory (tests/resume_kill_driver.py):
  ``train --resume`` killed with SIGKILL before each of its file operations, at random later
  points and after random delays; each directory must hold every row and checkpoint it held
  and still resume; a chain of such kills, resumed to the end, must give the uninterrupted
  run's files (one case per check);
* ``env_values``: a junk value (tests/hostile_envs.py ``JUNK``: strings, complex, None,
  arrays, NaN, wrong shapes, and values that are fine) returned by every env at a random step
  under each vectorization (sync, sync with reward normalization, ``--vectorization async``,
  ``--async`` actors): a value the trainer's rule refuses must end the run with exit 3 and one
  line naming it, one it accepts must train on;
* ``streams``: commands whose stdout or stderr is a pipe closed before or after the first
  line, or a closed descriptor: they must do their work (``train`` reaches its target) with no
  traceback;
* ``hostile_files``: hostile lock files (symlinks, hard links, FIFOs, directories, junk) and
  checkpoint files (another run's, a FIFO, ``/dev/zero``, truncated, a number as env id,
  ``n_envs`` 1e5 and 1e6, contradicting counters, changed episode limits, a foreign run id)
  under ``eval`` and ``train --resume``: one line within 20 s, nothing outside the run
  directory touched;
* ``learner``: faults of the learner of an ``--async`` run (``vf_coef=1e300``,
  ``learning_rate=1e30``, an exception injected into a random update: FloatingPointError,
  MemoryError, RuntimeError, SystemExit; an actor killed), then ``train --resume``: exit 3,
  one line, ``error.log``, a checkpoint with the actor-learner state, and a resume that ends
  with exit 0 or the same clean failure, no process left behind.

Prints one table: area, cases tried, clean, problems, then the first few problem descriptions.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback

# the checkout this script belongs to, not an installed ppo_ref elsewhere
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BASE_COUNTS = {"api": 2000, "envs": 200, "checkpoints": 300, "cli": 120, "json": 300, "actors": 4,
               "rewrites": 2, "env_values": 80, "streams": 30, "hostile_files": 60, "learner": 10}
AREAS = tuple(BASE_COUNTS)
#: areas whose one case is a batch of cases (each reported on its own)
BATCH_AREAS = frozenset({"rewrites"})
TESTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
HOSTILE = "hostile_envs:Hostile-v0"  # tests/hostile_envs.py, steered by PPO_REF_HOSTILE
SMALL = ["--set", "n_envs=2", "--set", "n_steps=16", "--set", "batch_size=32", "--set",
         "n_epochs=1"]


# ---------------------------------------------------------------------------------------------
# outcome classification (inside the worker)
# ---------------------------------------------------------------------------------------------

def _documented_types():
    from ppo_ref.distributed import ActorLearnerError
    from ppo_ref.train.rollout import EnvStepError
    return (ValueError, TypeError, EnvStepError, ActorLearnerError)


def _classify_exception(exc) -> tuple:
    if isinstance(exc, _documented_types()):
        text = str(exc)
        if "\n" in text.strip() or not text.strip():
            return "problem", f"{type(exc).__name__} with a message that is not one line: {text[:120]!r}"
        return "clean", ""
    return "problem", f"{type(exc).__name__}: {str(exc)[:160]}"


# ---------------------------------------------------------------------------------------------
# junk generators
# ---------------------------------------------------------------------------------------------

def _junk(rng: random.Random):
    import numpy as np
    choices = [
        None, "abc", "", "1.5", 1.5, -1, 0, 2 ** 70, True, float("nan"), float("inf"), -1e308,
        [], [[1.0, 2.0], [3.0]], b"bytes", object(), {"a": 1}, (2.5, 3),
        np.array([1 + 2j, 3j]), np.zeros((0,)), np.zeros((2, 3)), np.full((4, 2), 1e308),
        np.array(["1", "2"]), np.zeros(3, dtype=">f8"), np.ones((4, 2), dtype=np.float32),
        np.array([np.nan, 1.0]), np.arange(6).reshape(2, 3), np.ones((3, 2), dtype=bool),
        np.full((5, 2), -709.0), np.full((5, 2), 1e300), np.array(1e154),
    ]
    return rng.choice(choices)


def _valid_or_junk(rng: random.Random, valid):
    return valid if rng.random() < 0.6 else _junk(rng)


def _api_case(seed: int):
    """Call one public function with random junk and valid-looking arguments."""
    import numpy as np
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    from ppo_ref import gae, vtrace
    from ppo_ref.spec import distributions as dist
    from ppo_ref.spec import layers as mlp
    from ppo_ref.spec import losses
    from ppo_ref.spec.layers import orthogonal
    from ppo_ref._checks import as_float_array, check_count
    from ppo_ref.config import PPOConfig
    T, N = 5, 2
    v = lambda *shape: nrng.standard_normal(shape)  # noqa: E731
    flags = lambda: nrng.random((T, N)) < 0.2  # noqa: E731
    j = lambda valid: _valid_or_junk(rng, valid)  # noqa: E731
    calls = [
        ("gae", lambda: gae(j(v(T, N)), j(v(T, N)), j(flags()), j(flags()), j(v(N)))),
        ("vtrace", lambda: vtrace(j(v(T, N)), j(v(T, N)), j(v(T, N)), j(v(T, N)), j(flags()),
                                  j(flags()), j(v(N)))),
        ("policy_loss", lambda: losses.policy_loss(j(v(8)), j(v(8)), j(v(8)), j(0.2))),
        ("value_loss", lambda: losses.value_loss(j(v(8)), j(v(8)), j(v(8)))),
        ("entropy_loss", lambda: losses.entropy_loss(j(v(8)))),
        ("approx_kl", lambda: losses.approx_kl(j(v(8)), j(v(8)))),
        ("explained_variance", lambda: losses.explained_variance(j(v(8)), j(v(8)))),
        ("normalize_advantages", lambda: losses.normalize_advantages(j(v(8)))),
        ("log_softmax", lambda: dist.log_softmax(j(v(4, 3)))),
        ("categorical_entropy", lambda: dist.categorical_entropy(j(v(4, 3)))),
        ("categorical_log_prob", lambda: dist.categorical_log_prob(j(v(4, 3)),
                                                                   j(nrng.integers(0, 3, 4)))),
        ("linear_forward", lambda: mlp.linear_forward(
            j(mlp.linear_init(np.random.default_rng(0), 3, 2, 1.0)), j(v(4, 3)))),
        ("mlp_forward", lambda: mlp.mlp_forward(
            j(mlp.mlp_init(np.random.default_rng(0), 3, [4], 2)), j(v(4, 3)))),
        ("orthogonal", lambda: orthogonal(np.random.default_rng(0), j((3, 2)), j(1.0))),
        ("as_float_array", lambda: as_float_array(_junk(rng), "x")),
        ("check_count", lambda: check_count(_junk(rng), "n", 1)),
        ("PPOConfig", lambda: PPOConfig(**{rng.choice(["n_steps", "batch_size", "gamma",
                                                       "clip_range", "learning_rate", "n_envs",
                                                       "ent_coef", "max_grad_norm"]): _junk(rng)})),
    ]
    name, call = calls[seed % len(calls)]
    with _quiet_warnings():
        try:
            call()
        except BaseException as exc:  # noqa: BLE001
            status, detail = _classify_exception(exc)
            return status, f"{name}: {detail}" if detail else ""
    return "clean", ""


@contextlib.contextmanager
def _quiet_warnings():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


_TRAINER = {}


def _trainer():
    if "t" not in _TRAINER:
        from ppo_ref.config import PPOConfig
        from ppo_ref.train.ppo import PPOTrainer
        _TRAINER["t"] = PPOTrainer("CartPole-v1", PPOConfig(n_envs=2, n_steps=16, batch_size=32),
                                   seed=0)
    return _TRAINER["t"]


def _trainer_api_case(seed: int):
    rng = random.Random(seed)
    t = _trainer()
    which = rng.choice(["predict", "evaluate"])
    try:
        if which == "predict":
            t.predict(_junk(rng))
        else:
            value = rng.choice([1.5, True, "2", None, -1, 0, 1])
            seed_value = 0 if value != 1 else rng.choice([-1, "x", None, 1.5, 2 ** 70, 3])
            t.evaluate(value, seed=seed_value)
    except BaseException as exc:  # noqa: BLE001
        status, detail = _classify_exception(exc)
        return status, f"trainer.{which}: {detail}" if detail else ""
    return "clean", ""


def _env_case(seed: int):
    """A rollout from two CartPoles, one of which returns junk at a random step."""
    import gymnasium as gym
    import numpy as np
    from gymnasium.vector import AutoresetMode, SyncVectorEnv
    from ppo_ref.config import PPOConfig
    from ppo_ref.train.ppo import PPOTrainer
    rng = random.Random(seed)
    field = rng.choice(["obs", "reward", "terminated", "truncated"])
    junk = {
        "obs": [np.array([np.nan, 0, 0, 0]), np.full(4, 1e200), np.full(4, 1e300),
                np.full(4, 0.5 + 1j), np.array(["0.1"] * 4), np.zeros(3), np.zeros((2, 2)),
                [0.1, 0.2, 0.3, 0.4], np.full(4, -1e160), np.array([0.1, None, 0, 0], dtype=object)],
        "reward": [float("nan"), float("inf"), "1.5", 1 + 2j, np.array([1.0, 2.0]), None, 1e308,
                   np.float32(2.0), True],
        "terminated": ["no", 0.5, None, np.array([True]), 2, np.bool_(True), 1],
        "truncated": ["yes", 0.0, None, [], 1],
    }[field]
    value = rng.choice(junk)
    at = rng.randint(1, 40)
    normalize = rng.random() < 0.5
    vector_path = rng.random() < 0.3

    class Junk(gym.Wrapper):
        def __init__(self):
            super().__init__(gym.make("CartPole-v1", disable_env_checker=True))
            self.steps = 0

        def step(self, action):
            out = list(self.env.step(action))
            self.steps += 1
            if self.steps == at:
                out[("obs", "reward", "terminated", "truncated").index(field)] = value
            return tuple(out)

    good = lambda: gym.make("CartPole-v1", disable_env_checker=True)  # noqa: E731
    env = SyncVectorEnv([good, Junk], autoreset_mode=AutoresetMode.SAME_STEP)
    if vector_path:
        env = gym.vector.VectorWrapper(env)  # the collector then calls env.step
    try:
        with _quiet_warnings():
            t = PPOTrainer(env, PPOConfig(n_envs=2, n_steps=32, batch_size=64,
                                          normalize_observations=normalize), seed=seed)
            r = t.collect_rollout()
            t.collect_rollout()
        if not np.isfinite(r.observations).all() or not np.isfinite(r.rewards).all():
            return "problem", f"{field}={value!r}: non-finite numbers stored silently"
    except BaseException as exc:  # noqa: BLE001
        status, detail = _classify_exception(exc)
        return status, f"{field}={value!r}: {detail}" if detail else ""
    return "clean", ""


_CHECKPOINT = {}


def _checkpoint_case(seed: int, workdir: str):
    """Flip 1-8 random bits of a saved checkpoint and load it."""
    import numpy as np
    from ppo_ref.train.ppo import PPOTrainer
    if "bytes" not in _CHECKPOINT:
        t = _trainer()
        t.learn(64)
        path = os.path.join(workdir, "base.npz")
        t.save(path)
        with open(path, "rb") as fh:
            _CHECKPOINT["bytes"] = fh.read()
        _CHECKPOINT["state"] = {k: np.array(v) for k, v in t.state_arrays().items()}
    rng = random.Random(seed)
    data = bytearray(_CHECKPOINT["bytes"])
    for _ in range(rng.randint(1, 8)):
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
    path = os.path.join(workdir, f"flip-{os.getpid()}.npz")
    with open(path, "wb") as fh:
        fh.write(bytes(data))
    try:
        with _quiet_warnings():
            loaded = PPOTrainer.load(path)
        try:
            got = loaded.state_arrays()
        finally:
            loaded.close()
        want = _CHECKPOINT["state"]
        for key, value in want.items():
            if key == "state_json":
                continue
            other = got.get(key)
            if other is None or other.shape != value.shape or not np.array_equal(
                    other, value, equal_nan=True):
                return "problem", f"bit flips loaded different data without an error ({key})"
    except BaseException as exc:  # noqa: BLE001
        status, detail = _classify_exception(exc)
        return status, f"load: {detail}" if detail else ""
    return "clean", ""


def _run_cli(argv, workdir):
    """``ppo_ref.cli.main(argv)`` with its output captured: (status, detail)."""
    from ppo_ref import cli
    err, out = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(workdir)  # a default run directory lands in the scratch directory
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), _quiet_warnings():
            try:
                code = cli.main(list(argv))
            except SystemExit as exc:  # argparse
                code = exc.code
            except BaseException as exc:  # noqa: BLE001
                return "problem", f"{argv!r}: traceback {type(exc).__name__}: {str(exc)[:120]}"
    finally:
        os.chdir(cwd)
    lines = [line for line in err.getvalue().splitlines()
             if line.strip() and "warn" not in line.lower()]
    if "Traceback" in err.getvalue():
        return "problem", f"{argv!r}: traceback on stderr"
    if code not in (0, 1, 2, 3, 130, None):
        return "problem", f"{argv!r}: exit status {code!r}"
    error_lines = [line for line in lines if "error" in line]
    if len(error_lines) > 1:
        return "problem", f"{argv!r}: {len(error_lines)} error lines"
    return "clean", ""


def _fixtures(workdir):
    """A finished small run and a vectors directory (made once per worker)."""
    from ppo_ref import cli
    from ppo_ref.vectors import reference_results, write_vectors
    if "run" not in _CHECKPOINT:
        run = os.path.join(workdir, "run")
        if not os.path.exists(os.path.join(run, "checkpoint.npz")):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                cli.main(["train", "--run-dir", run, "--total-timesteps", "256", "--quiet"])
        vec = os.path.join(workdir, "vectors")
        if not os.path.exists(os.path.join(vec, "index.json")):
            write_vectors(vec)
        _CHECKPOINT["run"] = run
        _CHECKPOINT["vectors"] = vec
        _CHECKPOINT["results"] = reference_results(vec)
    return _CHECKPOINT["run"], _CHECKPOINT["vectors"], _CHECKPOINT["results"]


def _cli_case(seed: int, workdir: str):
    rng = random.Random(seed)
    run, vec, _ = _fixtures(workdir)
    junk = ["-1", "0", "nan", "inf", "1e5", "abc", "", str(2 ** 53 + 1), str(2 ** 64), "1.5",
            "/dev/zero", "/nonexistent", "-0", "99999999999999999999999"]
    scratch = os.path.join(workdir, f"cli-{seed}")
    command = rng.choice(["train", "eval", "check", "plot", "train-resume"])
    if command == "train":
        flags = ["--n-envs", "--seed", "--total-timesteps", "--checkpoint-every",
                 "--progress-every", "--num-actors", "--broadcast-every", "--env", "--preset",
                 "--set", "--policy", "--vectorization"]
        argv = ["train", "--run-dir", scratch, "--quiet", "--total-timesteps", "64"]
        for flag in rng.sample(flags, rng.randint(1, 3)):
            value = rng.choice(junk + ["n_steps=0", "gamma=2", "batch_size=abc", "lstm", "async"])
            argv += [flag, value]
        if rng.random() < 0.3:
            argv.append("--async")
    elif command == "train-resume":
        argv = ["train", "--resume", rng.choice([run, scratch, "/dev/null", "/"]),
                "--total-timesteps", rng.choice(junk + ["128"])]
    elif command == "eval":
        argv = ["eval", rng.choice([run, scratch, "/dev/zero", run + "/config.json"]),
                "--episodes", rng.choice(junk + ["1"]), "--seed", rng.choice(junk + ["3"])]
    elif command == "check":
        argv = ["check", rng.choice([vec, scratch, run]), "--results",
                rng.choice(["/dev/zero", "/nonexistent", run + "/config.json", vec + "/index.json"])]
        if rng.random() < 0.5:
            argv += [rng.choice(["--atol", "--rtol"]), rng.choice(junk)]
        if rng.random() < 0.5:
            argv.append("--allow-missing")
    else:
        argv = ["plot", rng.choice([run, scratch, "/dev/null"]), "--output",
                rng.choice([os.path.join(scratch, "x.png"), "/proc/nope.png"])]
    try:
        return _run_cli(argv, workdir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _json_text(rng: random.Random, results: dict) -> str:
    doc = json.loads(json.dumps(results))
    kind = rng.choice(["deep", "bigint", "string_numbers", "wrong_types", "extra", "truncated",
                       "unknown_case", "huge_exp", "not_utf8"])
    if kind == "deep":
        depth = rng.choice([100, 1000, 100_000])
        return "[" * depth + "]" * depth
    if kind == "bigint":
        return json.dumps(doc)[:-1] + ', "n": ' + "9" * rng.choice([25, 400, 5000]) + "}"
    if kind == "huge_exp":
        return json.dumps(doc).replace("0.", "1e999999", 1)
    if kind == "not_utf8":
        return "\udcff"
    name = rng.choice(list(doc["cases"]))
    if kind == "string_numbers":
        doc["cases"][name]["outputs"] = json.loads(json.dumps(doc["cases"][name]["outputs"]),
                                                   parse_float=str)
    elif kind == "wrong_types":
        doc["cases"][name] = rng.choice([[], "x", None, 3, {"outputs": []}, {"outputs": "x"}])
    elif kind == "extra":
        doc["cases"][name]["outputs"]["extra"] = [1.0]
        doc["cases"][name]["more"] = 1
    elif kind == "unknown_case":
        doc["cases"]["nope"] = {"outputs": {}}
    else:
        text = json.dumps(doc)
        return text[:rng.randrange(1, len(text))]
    return json.dumps(doc)


def _json_case(seed: int, workdir: str):
    rng = random.Random(seed)
    run, vec, results = _fixtures(workdir)
    scratch = os.path.join(workdir, f"json-{seed}")
    os.makedirs(scratch)
    try:
        target = rng.choice(["results", "config", "case", "index"])
        text = _json_text(rng, results)
        if target == "results":
            path = os.path.join(scratch, "r.json")
            with open(path, "w", encoding="utf-8", errors="surrogateescape") as fh:
                fh.write(text)
            return _run_cli(["check", vec, "--results", path], workdir)
        if target == "config":
            copy = os.path.join(scratch, "run")
            shutil.copytree(run, copy)
            with open(os.path.join(copy, "config.json"), "w", encoding="utf-8",
                      errors="surrogateescape") as fh:
                fh.write(text)
            return _run_cli(["train", "--resume", copy, "--total-timesteps", "256", "--quiet"],
                            workdir)
        copy = os.path.join(scratch, "vec")
        shutil.copytree(vec, copy)
        index_path = os.path.join(copy, "index.json")
        with open(index_path) as fh:
            index = json.load(fh)
        if target == "index":
            index["cases"][rng.randrange(len(index["cases"]))]["file"] = rng.choice(
                ["../run/config.json", "/etc/hostname", "x/../../y.json", "", 3, None])
            with open(index_path, "w") as fh:
                json.dump(index, fh)
        else:
            case_file = os.path.join(copy, index["cases"][rng.randrange(len(index["cases"]))]["file"])
            with open(case_file) as fh:
                case = json.load(fh)
            key = rng.choice(["inputs", "expected", "settings", "name", "tolerance", "kind"])
            case[key] = rng.choice([None, [], "x", 7, {"a": "b"}, {"atol": "1", "rtol": 0}])
            with open(case_file, "w") as fh:
                json.dump(case, fh)
        path = os.path.join(scratch, "r.json")
        with open(path, "w") as fh:
            json.dump(results, fh)
        return _run_cli(["check", copy, "--results", path], workdir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _actor_case(seed: int, workdir: str):
    """Kill -9 one actor of a running loop; clean when ActorDiedError comes within 2.5 s."""
    from ppo_ref.distributed import (ActorDiedError, AsyncActorLearnerConfig, learner_loop,
                                     make_learner)
    from ppo_ref.config import PPOConfig
    rng = random.Random(seed)
    n = rng.choice([2, 4, 8, 16])
    config = AsyncActorLearnerConfig(num_actors=n, n_steps=16, total_timesteps=10 ** 7,
                                     actors="process", ppo=PPOConfig(n_epochs=1, batch_size=16 * n))
    trainer = make_learner(config, "CartPole-v1")
    kill_at = rng.randint(2, 6)
    killed = {}

    def callback(info):
        if info.update == kill_at and not killed:
            victim = rng.choice(multiprocessing.active_children())
            killed["t"] = time.monotonic()
            os.kill(victim.pid, signal.SIGKILL)

    try:
        learner_loop(config, trainer, "CartPole-v1", callback=callback)
    except ActorDiedError:
        elapsed = time.monotonic() - killed.get("t", time.monotonic())
        left = multiprocessing.active_children()
        if elapsed > 2.5:
            return "problem", f"{n} actors: the error came {elapsed:.2f} s after the kill"
        if left:
            return "problem", f"{n} actors: {len(left)} processes left behind"
        return "clean", f"{n} actors: {elapsed:.2f} s"
    except BaseException as exc:  # noqa: BLE001
        return "problem", f"{n} actors: {type(exc).__name__}: {exc}"
    return "problem", f"{n} actors: the loop finished despite the kill"


# ---------------------------------------------------------------------------------------------
# issue 25's categories: kills aimed at the rewrites, hostile env values under each
# vectorization, closed streams, hostile lock and checkpoint files, learner faults in --async
# ---------------------------------------------------------------------------------------------

def _subprocess_env(**extra):
    env = dict(os.environ)
    root = os.path.dirname(TESTS_DIR)
    env["PYTHONPATH"] = os.pathsep.join([root, TESTS_DIR] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(extra)
    return env


def _rewrite_case(seed: int, workdir: str):
    """tests/resume_kill_driver.py: a resume killed (SIGKILL) before every file operation of its
    rewrite of the run directory, at random later points and after random delays, each
    directory checked; then a chain of kills resumed to the end and compared with the
    uninterrupted run. Each check is one case."""
    import subprocess
    target = os.path.join(workdir, f"rewrites-{seed}")
    try:
        proc = subprocess.run([sys.executable, os.path.join(TESTS_DIR, "resume_kill_driver.py"),
                               target, "--points", "12", "--random-delays", "6", "--seed",
                               str(seed)], capture_output=True, text=True, timeout=1800,
                              env=_subprocess_env())
    except subprocess.TimeoutExpired:
        return [("problem", "the kill driver hung")]
    finally:
        shutil.rmtree(target, ignore_errors=True)
    lines = proc.stdout.strip().splitlines()
    if not lines:
        return [("problem", f"the kill driver printed nothing: {proc.stderr[-300:]}")]
    report = json.loads(lines[-1])
    failed = report.get("failed_checks", len(report["problems"]))
    results = [("clean", "")] * (report.get("checks", 0) - failed)
    results += [("problem", text) for text in report["problems"][:max(failed, 1)]] if failed \
        else []
    if report["problems"] and not failed:
        results.append(("problem", report["problems"][0]))
    return results


def _run_cli_lines(argv, workdir):
    """``ppo_ref.cli.main(argv)`` in this process: ``(code, stderr lines, traceback?)``."""
    from ppo_ref import cli
    err, out = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), _quiet_warnings():
            try:
                code = cli.main(list(argv))
            except SystemExit as exc:
                code = exc.code
            except BaseException as exc:  # noqa: BLE001
                return None, [f"escaped {type(exc).__name__}: {str(exc)[:120]}"], True
    finally:
        os.chdir(cwd)
    text = err.getvalue()
    lines = [line for line in text.splitlines() if line.strip()]
    return code, lines, "Traceback" in text


def _env_value_case(seed: int, workdir: str):
    """One junk value (tests/hostile_envs.py JUNK) returned by every env at a random step,
    under a random vectorization (sync, sync with reward normalization, async, --async
    actors): clean when a value the trainer's rule refuses ends the run with exit 3 and one
    line naming it, and a value it accepts trains on (or ends in a one-line failure that is
    not about the value); never a traceback, never a silent conversion."""
    import numpy as np
    if TESTS_DIR not in sys.path:
        sys.path.insert(0, TESTS_DIR)
    import hostile_envs
    from ppo_ref._checks import env_value_problem
    rng = random.Random(seed)
    mode = rng.choice(["sync", "normalized", "async", "actors"])
    field = rng.choice(["obs", "reward", "terminated", "truncated"])
    index = rng.randrange(len(hostile_envs.JUNK[field]))
    value = hostile_envs.JUNK[field][index]
    at = rng.randint(1, 60)
    if field == "obs":
        a = np.asarray(value)
        bad = a.dtype.kind not in "biuf" or a.shape != (4,) or not np.isfinite(
            a.astype(np.float64)).all()
        words = ["observation"]
    else:
        bad = env_value_problem(value, field) is not None or (
            field == "reward" and not np.isfinite(float(np.asarray(value))))
        words = [field]
    os.environ["PPO_REF_HOSTILE"] = f"{field}:#{index}@{at}"
    scratch = os.path.join(workdir, f"values-{seed}")
    extra = {"sync": [], "normalized": ["--set", "normalize_rewards=True"],
             "async": ["--vectorization", "async"],
             "actors": ["--async", "--num-actors", "2"]}[mode]
    label = f"{mode} {field}={value!r} at step {at}"
    try:
        code, lines, traceback_seen = _run_cli_lines(
            ["train", "--env", HOSTILE, "--run-dir", scratch, "--total-timesteps", "256",
             "--quiet"] + SMALL + extra, workdir)
    finally:
        os.environ.pop("PPO_REF_HOSTILE", None)
        shutil.rmtree(scratch, ignore_errors=True)
    left = multiprocessing.active_children()
    if traceback_seen or code is None:
        return "problem", f"{label}: traceback {lines[:1]}"
    if left:
        return "problem", f"{label}: {len(left)} processes left behind"
    errors = [line for line in lines if "error" in line]
    if len(errors) > 1:
        return "problem", f"{label}: {len(errors)} error lines"
    if bad:
        if code != 3 or not errors or not any(w in errors[0] for w in words):
            return "problem", f"{label}: refused value not reported (exit {code}: {errors[:1]})"
        return "clean", ""
    if code == 0 or (code == 3 and errors and not any(f"returned {w}" in errors[0]
                                                        for w in words)):
        return "clean", ""
    return "problem", f"{label}: an accepted value was refused (exit {code}: {errors[:1]})"


def _stream_case(seed: int, workdir: str):
    """A command whose stdout or stderr goes away (a pipe closed before it writes, a pipe closed
    after its first line, a closed descriptor): clean when the command does its work (train
    reaches its target and checkpoints; the others their usual exit code) with no traceback."""
    import subprocess
    rng = random.Random(seed)
    run, vec, results = _fixtures(workdir)
    results_path = os.path.join(workdir, "results.json")
    if not os.path.exists(results_path):
        with open(results_path, "w") as fh:
            json.dump(results, fh)
    scratch = os.path.join(workdir, f"streams-{seed}")
    commands = {
        "train": (["train", "--run-dir", scratch, "--total-timesteps", "512",
                   "--progress-every", "0"] + SMALL, 0),
        "details": (["details"], 0),
        "eval": (["eval", run, "--episodes", "2"], 0),
        "check": (["check", vec, "--results", results_path], 0),
        "vectors": (["vectors", "--out", scratch], 0),
        "bad-flag": (["train", "--n-envs", "-3"], 2),
    }
    name = rng.choice(sorted(commands))
    argv, want = commands[name]
    stream = rng.choice(["stdout", "stderr"])
    mode = rng.choice(["closed-pipe", "after-first-line", "closed-fd"])
    fd = 1 if stream == "stdout" else 2
    kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    if mode == "closed-fd":
        kwargs["preexec_fn"] = lambda: os.close(fd)
    label = f"{name} with {stream} {mode}"
    try:
        proc = subprocess.Popen([sys.executable, "-m", "ppo_ref"] + argv, env=_subprocess_env(),
                                cwd=workdir, **kwargs)
        watched = proc.stdout if stream == "stdout" else proc.stderr
        other = proc.stderr if stream == "stdout" else proc.stdout
        if mode == "closed-pipe":
            watched.close()
        elif mode == "after-first-line":
            watched.readline()
            watched.close()
        other_text = other.read().decode("utf-8", "replace")
        if not watched.closed:
            watched.read()
        code = proc.wait(300)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "problem", f"{label}: hung"
    try:
        if stream == "stdout" and ("Traceback" in other_text or "BrokenPipe" in other_text):
            return "problem", f"{label}: traceback on stderr"
        if code != want and not (name == "check" and code == 1):
            return "problem", f"{label}: exit {code}, expected {want}"
        if name == "train":
            from ppo_ref.io.checkpoint import load_checkpoint
            _, meta = load_checkpoint(os.path.join(scratch, "checkpoint.npz"))
            if meta["num_timesteps"] != 512:
                return "problem", f"{label}: training stopped at {meta['num_timesteps']} steps"
    except Exception as exc:  # noqa: BLE001
        return "problem", f"{label}: {type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return "clean", ""


def _hostile_file_case(seed: int, workdir: str):
    """A hostile .lock or checkpoint.npz in a copy of a finished run, then ``eval`` or
    ``train --resume``: clean when the command refuses with one line (or does its work when the
    file is harmless) within the case timeout, no file outside the run directory is touched,
    and nothing the refusal did not need to read was built."""
    import numpy as np
    from ppo_ref.io.checkpoint import (array_to_json, json_to_array, load_checkpoint,
                                       save_checkpoint)
    rng = random.Random(seed)
    run, _, _ = _fixtures(workdir)
    other = _other_run(workdir)
    scratch = os.path.join(workdir, f"files-{seed}")
    shutil.copytree(run, scratch)
    precious = os.path.join(workdir, f"precious-{seed}.txt")
    with open(precious, "w") as fh:
        fh.write("keep me\n")
    lock = os.path.join(scratch, ".lock")
    ckpt = os.path.join(scratch, "checkpoint.npz")

    def rewrite(meta_changes=None, state_change=None):
        arrays, meta = load_checkpoint(ckpt)
        meta.update(meta_changes or {})
        meta.pop("format_version", None)
        if state_change is not None:
            state = array_to_json(arrays["state_json"])
            state_change(state)
            arrays["state_json"] = json_to_array(state)
        save_checkpoint(ckpt, arrays, meta)

    def sub_envs(layer, name, value):
        def change(state):
            for sub in state["collector"]["sub_envs"]:
                for entry in sub["layers"]:
                    if entry["class"] == layer:
                        entry["attrs"][name] = value
        return change

    kinds = {
        "lock-symlink": lambda: os.symlink(precious, lock),
        "lock-symlink-dev-null": lambda: os.symlink("/dev/null", lock),
        "lock-dangling-symlink": lambda: os.symlink(os.path.join(workdir, "nowhere"), lock),
        "lock-hardlink": lambda: os.link(precious, lock),
        "lock-fifo": lambda: os.mkfifo(lock),
        "lock-directory": lambda: os.mkdir(lock),
        "lock-garbage": lambda: open(lock, "wb").write(os.urandom(64)),
        "ckpt-symlink-other-run": lambda: (os.remove(ckpt), os.symlink(
            os.path.join(other, "checkpoint.npz"), ckpt)),
        "ckpt-copy-other-run": lambda: shutil.copy2(os.path.join(other, "checkpoint.npz"), ckpt),
        "ckpt-fifo": lambda: (os.remove(ckpt), os.mkfifo(ckpt)),
        "ckpt-directory": lambda: (os.remove(ckpt), os.mkdir(ckpt)),
        "ckpt-dev-zero": lambda: (os.remove(ckpt), os.symlink("/dev/zero", ckpt)),
        "ckpt-truncated": lambda: open(ckpt, "r+b").truncate(rng.randrange(1, 4000)),
        "ckpt-env-id-number": lambda: rewrite({"env_id": 42}),
        "ckpt-env-id-list": lambda: rewrite({"env_id": ["CartPole-v1"]}),
        "ckpt-n-envs-1e5": lambda: rewrite({"config": dict(load_checkpoint(ckpt)[1]["config"],
                                                            n_envs=100_000)}),
        "ckpt-n-envs-1e6": lambda: rewrite({"config": dict(load_checkpoint(ckpt)[1]["config"],
                                                            n_envs=10 ** 6)}),
        "ckpt-n-updates-1e6": lambda: rewrite({"n_updates": 10 ** 6},
                                              lambda st: st.update(n_updates=10 ** 6)),
        "ckpt-timesteps-odd": lambda: rewrite({"num_timesteps": 257},
                                              lambda st: st.update(num_timesteps=257)),
        "ckpt-max-episode-steps": lambda: rewrite(state_change=sub_envs(
            "TimeLimit", "_max_episode_steps", rng.choice([1, 10 ** 9, -5, "500", None]))),
        "ckpt-elapsed-steps": lambda: rewrite(state_change=sub_envs(
            "TimeLimit", "_elapsed_steps", rng.choice([-1, 10 ** 9, 2.5]))),
        "ckpt-run-id": lambda: rewrite({"run_id": "0" * 32}),
        "ckpt-seed-string": lambda: rewrite({"seed": "0"}),
        "ckpt-trainer-unknown": lambda: rewrite({"trainer": "os.system"}),
    }
    kind = rng.choice(sorted(kinds))
    command = rng.choice(["eval", "resume"])
    label = f"{kind}, {command}"
    try:
        kinds[kind]()
        argv = (["eval", scratch, "--episodes", "1"] if command == "eval"
                else ["train", "--resume", scratch, "--total-timesteps", "512", "--quiet"])
        t0 = time.monotonic()
        code, lines, traceback_seen = _run_cli_lines(argv, workdir)
        seconds = time.monotonic() - t0
        with open(precious) as fh:
            if fh.read() != "keep me\n":
                return "problem", f"{label}: a file outside the run directory was changed"
        if traceback_seen or code is None:
            return "problem", f"{label}: traceback {lines[:1]}"
        errors = [line for line in lines if "error" in line]
        if len(errors) > 1:
            return "problem", f"{label}: {len(errors)} error lines"
        # eval only reads a run (it takes no lock); a lock file holding junk is a lock file
        harmless = kind == "lock-garbage" or command == "eval" and kind.startswith("lock-")
        if code not in (0, 2) or (code == 2 and harmless):
            return "problem", f"{label}: exit {code} {errors[:1]}"
        if code == 0 and not harmless:
            return "problem", f"{label}: accepted silently"
        if seconds > 20:
            return "problem", f"{label}: {seconds:.0f} s before the answer"
    except Exception as exc:  # noqa: BLE001
        return "problem", f"{label}: campaign error {type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        os.remove(precious)
    del np
    return "clean", ""


def _other_run(workdir):
    """A second finished run (another seed) whose checkpoint hostile cases copy in."""
    from ppo_ref import cli
    other = os.path.join(workdir, "other-run")
    if not os.path.exists(os.path.join(other, "checkpoint.npz")):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cli.main(["train", "--run-dir", other, "--total-timesteps", "256", "--seed", "7",
                      "--quiet"])
    return other


def _learner_case(seed: int, workdir: str):
    """A fault of the learner of an ``--async`` run (a real overflow from a hostile setting, or
    an exception injected into its update at a random update, or an actor killed), then
    ``train --resume`` of the directory: clean when the failure is exit 3 with one line, an
    ``error.log`` and a loadable checkpoint of the last good update, and the resume ends with
    exit 0 (or fails again the same clean way), with no process left behind."""
    from ppo_ref.io.checkpoint import load_checkpoint
    from ppo_ref.io.runlog import RunLogger
    from ppo_ref.train.ppo import PPOTrainer
    rng = random.Random(seed)
    fault = rng.choice(["vf_coef=1e300", "learning_rate=1e30", "FloatingPointError",
                        "MemoryError", "RuntimeError", "SystemExit", "kill-actor"])
    at = rng.randint(1, 5)
    scratch = os.path.join(workdir, f"learner-{seed}")
    argv = ["train", "--async", "--num-actors", "2", "--run-dir", scratch, "--total-timesteps",
            "320", "--quiet", "--checkpoint-every", "1e9"] + SMALL
    label = f"{fault} at update {at}"
    real_train_on, real_callback = PPOTrainer.train_on, RunLogger.callback
    calls = []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == at:
            raise {"FloatingPointError": FloatingPointError("overflow (injected)"),
                   "MemoryError": MemoryError("out of memory (injected)"),
                   "RuntimeError": RuntimeError("a bug (injected)"),
                   "SystemExit": SystemExit(4)}[fault]
        return real_train_on(self, *args, **kwargs)

    def killing(self, trainer, stats):
        keep = real_callback(self, trainer, stats)
        if trainer.n_updates == at and not calls:
            calls.append(1)
            children = multiprocessing.active_children()
            if children:
                os.kill(rng.choice(children).pid, signal.SIGKILL)
        return keep
    try:
        if fault in ("vf_coef=1e300", "learning_rate=1e30"):
            argv += ["--set", fault]
        elif fault == "kill-actor":
            RunLogger.callback = killing
        else:
            PPOTrainer.train_on = failing
        code, lines, traceback_seen = _run_cli_lines(argv, workdir)
        PPOTrainer.train_on, RunLogger.callback = real_train_on, real_callback
        if traceback_seen or code is None:
            return "problem", f"{label}: traceback {lines[:1]}"
        if multiprocessing.active_children():
            return "problem", f"{label}: processes left behind"
        if code == 0:
            if fault in ("vf_coef=1e300", "learning_rate=1e30"):
                return "clean", ""   # the setting trained on without overflowing
            return "problem", f"{label}: the run ended with exit 0 despite the fault"
        errors = [line for line in lines if "error" in line]
        if code != 3 or len(errors) != 1:
            return "problem", f"{label}: exit {code} with {len(errors)} error lines {errors[:2]}"
        if not os.path.exists(os.path.join(scratch, "error.log")):
            return "problem", f"{label}: no error.log"
        if os.path.exists(os.path.join(scratch, "checkpoint.npz")):
            _, meta = load_checkpoint(os.path.join(scratch, "checkpoint.npz"))
            if "actor_learner" not in meta:
                return "problem", f"{label}: the checkpoint has no actor-learner state"
        code, lines, traceback_seen = _run_cli_lines(["train", "--resume", scratch, "--quiet"],
                                                     workdir)
        if traceback_seen or code not in (0, 3):
            return "problem", f"{label}: the resume ended with {code} {lines[:2]}"
        if multiprocessing.active_children():
            return "problem", f"{label}: the resume left processes behind"
        if code == 0:
            _, meta = load_checkpoint(os.path.join(scratch, "checkpoint.npz"))
            if meta["num_timesteps"] < 320:
                return "problem", f"{label}: the resume stopped at {meta['num_timesteps']}"
    except Exception as exc:  # noqa: BLE001
        return "problem", f"{label}: campaign error {type(exc).__name__}: {exc}"
    finally:
        PPOTrainer.train_on, RunLogger.callback = real_train_on, real_callback
        shutil.rmtree(scratch, ignore_errors=True)
    return "clean", ""


def _run_case(area: str, seed: int, workdir: str):
    if area == "api":
        return _trainer_api_case(seed) if seed % 10 == 0 else _api_case(seed)
    if area == "envs":
        return _env_case(seed)
    if area == "checkpoints":
        return _checkpoint_case(seed, workdir)
    if area == "cli":
        return _cli_case(seed, workdir)
    if area == "json":
        return _json_case(seed, workdir)
    if area == "rewrites":
        return _rewrite_case(seed, workdir)
    if area == "env_values":
        return _env_value_case(seed, workdir)
    if area == "streams":
        return _stream_case(seed, workdir)
    if area == "hostile_files":
        return _hostile_file_case(seed, workdir)
    if area == "learner":
        return _learner_case(seed, workdir)
    return _actor_case(seed, workdir)


def _worker(conn, workdir):
    """Worker process: run the cases it is sent, answer (status, detail) for each."""
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        area, seed = request
        try:
            answer = _run_case(area, seed, workdir)
        except BaseException as exc:  # noqa: BLE001  (a failure of the campaign's own setup)
            answer = ("problem", f"case setup: {type(exc).__name__}: {exc} "
                                 f"{traceback.format_exc(limit=2)[-200:]}")
        conn.send(answer)


class _Sandbox:
    """One worker process at a time; replaced after a crash or a hang."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.ctx = multiprocessing.get_context("spawn")
        self.proc = None
        self.conn = None

    def _start(self):
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child, self.workdir), daemon=False)
        self.proc.start()
        child.close()
        self.conn = parent

    def run(self, area, seed, timeout):
        if self.proc is None or not self.proc.is_alive():
            self._start()
        self.conn.send((area, seed))
        if self.conn.poll(timeout):
            try:
                return self.conn.recv()
            except EOFError:
                pass
            self.proc.join(1.0)
            code = self.proc.exitcode
            self.proc = None
            return "problem", f"worker crashed (exit code {code})"
        alive = self.proc.is_alive()
        self._kill()
        return "problem", (f"{area} case {seed}: hang past the case timeout" if alive
                           else "worker crashed")

    def _kill(self):
        if self.proc is not None:
            for child in _descendants(self.proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            self.proc.kill()
            self.proc.join(2.0)
        self.proc = None

    def close(self):
        if self.proc is not None and self.proc.is_alive():
            with contextlib.suppress(OSError):
                self.conn.send(None)
            self.proc.join(5.0)
            self._kill()


def _descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    kids = [int(k) for k in fh.read().split()]
                    out += kids
                    todo += kids
        except OSError:
            pass
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiplies every area's case count (base: " + ", ".join(
                            f"{a} {n}" for a, n in BASE_COUNTS.items()) + ")")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case-timeout", type=float, default=60.0,
                        help="seconds before a case counts as a hang")
    parser.add_argument("--area-seconds", type=float, default=120.0,
                        help="stop an area after this many seconds (cases tried are reported)")
    parser.add_argument("--areas", default=",".join(AREAS),
                        help="comma-separated subset of " + ",".join(AREAS))
    parser.add_argument("--problems", type=int, default=3, help="problem lines shown per area")
    args = parser.parse_args(argv)
    areas = [a for a in args.areas.split(",") if a]
    unknown = [a for a in areas if a not in AREAS]
    if unknown or not args.scale > 0:
        parser.error(f"unknown areas {unknown}" if unknown else "--scale must be > 0")
    workdir = tempfile.mkdtemp(prefix="ppo_ref-fault-campaign-")
    rows, problems = [], {}
    t_all = time.monotonic()
    try:
        for area in areas:
            count = max(1, round(BASE_COUNTS[area] * args.scale))
            sandbox = _Sandbox(workdir)
            tried = clean = 0
            problems[area] = []
            t0 = time.monotonic()
            try:
                for k in range(count):
                    if time.monotonic() - t0 > args.area_seconds:
                        break
                    timeout = args.case_timeout * (30 if area in BATCH_AREAS else 1)
                    answer = sandbox.run(area, args.seed * 1_000_003 + k, timeout)
                    for status, detail in (answer if isinstance(answer, list) else [answer]):
                        tried += 1
                        if status == "clean":
                            clean += 1
                        else:
                            problems[area].append(detail)
            finally:
                sandbox.close()
            rows.append((area, tried, clean, tried - clean, time.monotonic() - t0))
            print(f"  {area}: {tried} cases in {time.monotonic() - t0:.0f} s", file=sys.stderr,
                  flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{'area':<12} {'tried':>6} {'clean':>6} {'problems':>9} {'seconds':>8}")
    for area, tried, clean, bad, seconds in rows:
        print(f"{area:<12} {tried:>6} {clean:>6} {bad:>9} {seconds:>8.0f}")
    total = [sum(r[i] for r in rows) for i in (1, 2, 3)]
    print(f"{'total':<12} {total[0]:>6} {total[1]:>6} {total[2]:>9} "
          f"{time.monotonic() - t_all:>8.0f}")
    for area in areas:
        shown = {}
        for detail in problems[area]:
            shown[detail] = shown.get(detail, 0) + 1
        for detail, n in list(shown.items())[:args.problems]:
            print(f"  {area}: {n} x {detail[:200]}")
    return 0 if total[2] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
