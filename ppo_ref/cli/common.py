"""What the commands of ``ppo-ref`` share: the one-line user errors, the trainer table, the
stated bounds of counts, the env probe, the Ctrl-C handler and the rollout note."""
from __future__ import annotations

import contextlib
import errno
import importlib
import os
import signal
import sys
import threading
import warnings
from typing import Any, Dict, Optional

import gymnasium

from ppo_ref._checks import one_line
from ppo_ref.config import PPOConfig
from ppo_ref.vectors.codec import read_json_file

__all__ = ["FULL_ERRNOS", "DEFAULT_ENV", "DEFAULT_TIMESTEPS", "MAX_TOTAL_TIMESTEPS",
           "MAX_NUM_ACTORS", "MAX_SEED", "MAX_EPISODES", "TRAINERS", "UsageError", "user_input",
           "building", "import_target", "trainer_class", "trainer_class_by_name",
           "policy_of_trainer", "probe_env", "SigintStopper", "Terminated", "nothing_saved",
           "STOP_SIGNALS", "stopped_how",
           "rollout_note", "saved_config", "close_quickly", "read_run_info",
           "check_same_run"]

DEFAULT_ENV = "CartPole-v1"
DEFAULT_TIMESTEPS = 100_000
# Upper bounds of the counts the command line accepts (refused before anything is created;
# n_envs: ppo_ref.config.MAX_ENVS): step counters are exact in float64 up to 2**53; each actor
# is a process (more would take minutes per rollout); seeds are 63-bit (eval: seed + episode).
MAX_TOTAL_TIMESTEPS = 2 ** 53
MAX_NUM_ACTORS = 256
MAX_SEED = 2 ** 63 - 1
MAX_EPISODES = 10 ** 6
CHECKPOINT_EVERY_DEFAULT = 60.0  # seconds: ppo-ref train --checkpoint-every

# policy kind -> "module:attribute" of a trainer class with the PPOTrainer interface
# (constructor (env_id, config, *, seed, ...), learn(total, callback), save/load, evaluate).
TRAINERS: Dict[str, str] = {
    "mlp": "ppo_ref.train.ppo:PPOTrainer",
    "lstm": "ppo_ref.train.recurrent_ppo:RecurrentPPOTrainer",
}
HELD_LOCKS: set = set()  # the lock files (real paths) this process holds (train.run_dir_lock)


#: The file system ran out of room: a condition of the machine, not of the user's input; the
#: command reports it as one line with exit status 1 (:func:`ppo_ref.cli.main.main`).
FULL_ERRNOS = frozenset(getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EFBIG")
                        if hasattr(errno, name))


class UsageError(Exception):
    """A problem with what the user asked for (flags, files, environment ids). :func:`main`
    prints it as one line ``ppo-ref <command>: error: <message>`` and exits with status 2."""


@contextlib.contextmanager
def user_input(what: str = ""):
    """Around an operation on user input (reading or writing the user's files, parsing flags,
    building a config): ``OSError``/``ValueError`` become :class:`UsageError` (prefixed with
    ``what``). Only wrap such operations, so a genuine bug elsewhere keeps its traceback."""
    try:
        yield
    except OSError as exc:
        if exc.errno in FULL_ERRNOS:
            raise
        if what:
            raise UsageError(f"{what}: {exc.strerror or exc}") from None
        where = f": {exc.filename}" if exc.filename else ""
        raise UsageError(f"{exc.strerror or exc}{where}") from None
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}" if what else str(exc)) from None


@contextlib.contextmanager
def building(what: str):
    """Around building a trainer (which makes and resets the envs) or loading one: what
    :func:`user_input` converts, and any other exception too (an env raising in ``reset``),
    become one :class:`UsageError` line ``<what>: <Type>: <message>``."""
    try:
        with user_input(what):
            yield
    except (UsageError, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001 -- an env's own failure (SystemExit too)
        raise UsageError(f"{what}: {type(exc).__name__}: {one_line(exc)}") from None


def saved_config(config_dict, source: str):
    """The :class:`~ppo_ref.config.PPOConfig` a checkpoint or config.json records (its bounds
    checked before anything is built from it); :class:`UsageError` naming ``source``
    otherwise."""
    with user_input(f"{source}: bad config"):
        if not isinstance(config_dict, dict):
            raise ValueError("not a JSON object")
        return PPOConfig.from_dict(config_dict)


def _abandon(env, workers) -> None:
    """Finish a vector env whose ``close`` failed: kill its workers, close its pipes and mark it
    closed (so that its ``__del__`` does not try again and print the failure at exit)."""
    for worker in workers:
        with contextlib.suppress(Exception):  # noqa: BLE001
            if worker.is_alive():
                worker.kill()
            worker.join(1.0)
    for pipe in getattr(env, "parent_pipes", None) or []:
        with contextlib.suppress(Exception):  # noqa: BLE001
            if pipe is not None:
                pipe.close()
    if env is not None and hasattr(env, "closed"):
        env.closed = True


def close_quickly(trainer, seconds: float) -> None:
    """Close ``trainer`` (its envs), giving them ``seconds``: env worker processes that have
    not closed by then (an env hung in ``step`` or ``close``, a dead worker's pipe) are killed,
    so the command always ends; what closing raises is not reported (the run's outcome was
    reported already)."""
    close = getattr(trainer, "close", None)
    if close is None:
        return
    # a PPOTrainer's or RecurrentPPOTrainer's vector env (the actor-learner's actors stop alone)
    env = getattr(getattr(trainer, "collector", None), "base_env", None)
    workers = list(getattr(env, "processes", None) or [])  # gymnasium's AsyncVectorEnv
    done = threading.Event()

    def run():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "calling close while waiting for step"
                close()
        except BaseException:  # noqa: BLE001  (a dead or killed worker's pipe: EOFError)
            _abandon(env, workers)
        finally:
            done.set()
    thread = threading.Thread(target=run, name="ppo_ref-close", daemon=True)
    thread.start()
    if done.wait(seconds):
        return
    for worker in workers:
        with contextlib.suppress(Exception):  # noqa: BLE001  (already gone)
            worker.kill()
    done.wait(1.0)


def import_target(target: str):
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"ppo-ref: cannot import {module_name} ({exc})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SystemExit(f"ppo-ref: {module_name} has no {attr}") from None


def trainer_class(policy: str):
    """The trainer class for a policy kind (imported on first use)."""
    if policy not in TRAINERS:
        raise SystemExit(f"ppo-ref: unknown policy {policy!r}; choose from {sorted(TRAINERS)}")
    return import_target(TRAINERS[policy])


def trainer_class_by_name(name: str):
    for target in TRAINERS.values():
        if target.endswith(":" + name):
            return import_target(target)
    raise UsageError(f"the checkpoint holds an unknown trainer {name!r}")


def policy_of_trainer(name: Optional[str]) -> Optional[str]:
    return next((policy for policy, target in TRAINERS.items()
                 if name and target.endswith(":" + name)), None)


def read_run_info(run_dir: str) -> Dict[str, Any]:
    """The JSON object of ``<run_dir>/config.json`` ({} when it is absent or not an object);
    :class:`UsageError` when it cannot be read."""
    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path):
        return {}
    with user_input(f"cannot read {path}"):
        info = read_json_file(path, "run file")
    return info if isinstance(info, dict) else {}


def check_same_run(run_dir: str, info: Dict[str, Any], meta: Dict[str, Any],
                   command: Optional[str] = None, advice: Optional[str] = None) -> None:
    """Raise :class:`UsageError` unless the checkpoint metadata ``meta`` belongs to the run
    ``info`` (config.json) describes: the same run id (a run from before run ids has none), env,
    policy and seed. A checkpoint copied in from another run would otherwise continue that run
    into this directory's CSV files (``--resume``) or be reported as this run's (``eval``)."""
    command = command or f"--resume {run_dir}"
    advice = advice or "or start that run in a directory of its own"

    def refuse(what: str):
        raise UsageError(f"{command}: checkpoint.npz is not this run's ({what}): a checkpoint "
                         f"copied in from another run? Put the run's own checkpoint back, "
                         f"{advice}")
    ids = info.get("run_id"), meta.get("run_id")
    if all(isinstance(i, str) for i in ids) and ids[0] != ids[1]:
        refuse(f"run id {ids[1]}, config.json's {ids[0]}")
    if "env_id" in info and info.get("env_id") != meta.get("env_id"):
        refuse(f"env {meta.get('env_id')!r}, config.json's {info.get('env_id')!r}")
    if "seed" in info and info.get("seed") != meta.get("seed"):
        refuse(f"seed {meta.get('seed')!r}, config.json's {info.get('seed')!r}")
    policy = meta.get("policy") or policy_of_trainer(meta.get("trainer"))
    if isinstance(info.get("policy"), str) and info.get("policy") != policy:
        refuse(f"policy {policy!r}, config.json's {info.get('policy')!r}")


def probe_env(env_id: str) -> None:
    """Make (and close) ``env_id`` once so a missing, deprecated or uninstalled env is reported
    as one line before anything is created (gymnasium's own error text is kept)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            env = gymnasium.make(env_id)
        except (gymnasium.error.Error, ImportError) as exc:
            # gymnasium warns before raising (e.g. "Taxi-v3 is out of date"): the error says it
            raise UsageError(f"cannot make env {env_id!r}: {one_line(exc)}") from None
        except Exception as exc:  # noqa: BLE001 -- its module or constructor raised
            raise UsageError(f"cannot make env {env_id!r}: {type(exc).__name__}: "
                             f"{one_line(exc)}") from None
        env.close()
    for w in caught:  # the env works: pass its warnings on
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


#: The signals that stop a run at once, saving its last completed update (:class:`Terminated`):
#: a job scheduler's SIGTERM, the closed terminal's SIGHUP.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def stopped_how(signum: int) -> str:
    """``interrupted`` (SIGINT) or ``terminated (<name>)``: how a stop is reported."""
    return "interrupted" if signum == signal.SIGINT else \
        f"terminated ({signal.Signals(signum).name})"


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (the terminal closed) during training: the last good state is saved and
    the exit status is 128 + the signal's number (143, 129); ``name`` the signal's name."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.code, self.name = 128 + signum, signal.Signals(signum).name


class SigintStopper:
    """Ctrl-C: stop at the next rollout boundary (exact checkpoint); a second, or the first
    before any update of this process completed (nothing to save), stops now (the last
    boundary's snapshot saved). SIGTERM, SIGHUP: as a second Ctrl-C, raising
    :class:`Terminated`."""

    def __init__(self, logger):
        self.logger = logger
        self.previous = {}

    def __enter__(self):
        for signum, handler in ((signal.SIGINT, self._handle),
                                *((sig, self._terminate) for sig in STOP_SIGNALS)):
            try:
                self.previous[signum] = signal.signal(signum, handler)
            except ValueError:  # not in the main thread
                pass
        return self

    def _nothing_saved(self, code: int) -> None:
        """No update has completed in this process (the first compiles the kernels): exit now
        with :func:`nothing_saved`'s line, the lock file removed first (``os._exit`` skips its
        ``finally``; raising could land inside the compiler, making it another error)."""
        if getattr(self.logger, "snapshot", None) is None:
            what = stopped_how(code - 128)
            with contextlib.suppress(OSError, ValueError):  # the lines printed so far
                sys.stdout.flush()
            print(f"\nppo-ref: {what}; {nothing_saved(self.logger)}", file=sys.stderr, flush=True)
            for path in HELD_LOCKS:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            os._exit(code)

    def _handle(self, signum, frame):
        self._nothing_saved(130)
        if self.logger.stop_requested:
            raise KeyboardInterrupt
        self.logger.request_stop()
        print("\nppo-ref: stopping at the end of this update (Ctrl-C again to stop now)",
              file=sys.stderr, flush=True)

    def _terminate(self, signum, frame):
        self._nothing_saved(128 + signum)
        raise Terminated(signum)

    def __exit__(self, *exc):
        for signum, previous in self.previous.items():
            if previous is not None:
                signal.signal(signum, previous)
        return False


def nothing_saved(logger) -> str:
    """The note of a stop before the first update of this process completed: nothing saved,
    and how to go on (``logger``: a :class:`~ppo_ref.io.runlog.RunLogger`)."""
    if os.path.exists(logger.checkpoint_path):
        return (f"no update completed in this process: the checkpoint {logger.checkpoint_path} "
                f"is unchanged; continue with ppo-ref train --resume {logger.run_dir}")
    return (f"no update had completed: nothing saved; start it again with ppo-ref train --resume "
            f"{logger.run_dir} (from scratch, same settings) or reuse --run-dir {logger.run_dir}")


def rollout_note(config, start: int, total: int, *, unit: str = "rollout",
                  factors: str = "n_steps*n_envs") -> None:
    """Training stops at the first rollout (``unit``) boundary at or past ``total``: say so
    when that overshoots the target. A unit is ``config.n_steps * config.n_envs`` steps, named
    ``factors`` in the message (the actor-learner: ``num_actors*n_steps`` per update)."""
    batch = int(config.n_steps) * int(config.n_envs)
    count = -(-(total - start) // batch)
    if start + count * batch != total:
        sizes = f"{config.n_steps}*{config.n_envs}" if factors == "n_steps*n_envs" \
            else f"{config.n_envs}*{config.n_steps}"
        print(f"ppo-ref: note: training runs whole {unit}s of {factors} = {sizes} = {batch} "
              f"steps: {count} {unit}{'s' if count != 1 else ''} to reach --total-timesteps "
              f"{total}, {start + count * batch} steps in all", file=sys.stderr)
