"""``ppo-ref train``: a new run, ``--resume`` of a saved one, ``--list-fields``; the run
directory's lock (:func:`run_dir_lock`) and the driver that saves the last good checkpoint on
any failure (:func:`run_training`). ``--async`` runs :mod:`ppo_ref.cli.async_train`.

A ``--run-dir`` must be new or empty (or hold a run stopped before its first update); ``--resume
DIR`` keeps the saved settings (flags that differ are refused; ``--total-timesteps`` extends the
run) and restarts a directory without a checkpoint from scratch with them. A checkpoint's
``module:EnvId`` env id is imported only with ``--allow-import``.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import importlib.util
import os
import stat
import sys
import traceback
from typing import Any, Callable, Dict, List, Optional

import gymnasium

from ppo_ref._checks import one_line
from ppo_ref.cli.ahead import start_compiling_ahead, stop_compiling_ahead
from ppo_ref.cli.async_train import cli_async_config, cli_restart, cli_resume, cli_train
from ppo_ref.cli.common import (CHECKPOINT_EVERY_DEFAULT, DEFAULT_ENV, DEFAULT_TIMESTEPS,
                                HELD_LOCKS, MAX_NUM_ACTORS, MAX_SEED,
                                MAX_TOTAL_TIMESTEPS, TRAINERS, SigintStopper, Terminated,
                                stopped_how,
                                UsageError, building, check_same_run, close_quickly,
                                nothing_saved, policy_of_trainer, probe_env, read_run_info,
                                rollout_note, saved_config, trainer_class, trainer_class_by_name,
                                user_input)
from ppo_ref.config import MAX_ENVS, PRESETS, PPOConfig, parse_overrides
from ppo_ref.distributed import make_learner
from ppo_ref.distributed.messages import ActorLearnerError
from ppo_ref.io.checkpoint import (TEMPORARY_PREFIX, check_env_import, load_checkpoint,
                                   vet_checkpoint_metadata)
from ppo_ref.io.runlog import RUN_FILES, RunLogger, default_run_dir
from ppo_ref.train.ppo import check_kernel_threads
from ppo_ref.train.rollout import EnvStepError
from ppo_ref.zoo import ZOO, zoo_entry

__all__ = ["configure_train", "cmd_train", "build_config", "preset_names", "default_policy",
           "default_timesteps", "zoo_note", "make_unique_dir", "list_fields", "run_training",
           "run_dir_lock", "LOCK_FILE", "TRAIN_EXAMPLES"]


def preset_names() -> List[str]:
    """Every name ``--preset`` accepts: ``zoo``, ``default`` and the PPOConfig presets."""
    return ["zoo", "default", *PRESETS]


def _resolve_preset(preset: Optional[str], env_id: str) -> str:
    """The preset a run records: the one given, else ``zoo`` for an env of
    :data:`ppo_ref.zoo.ZOO` and ``default`` for any other."""
    if preset is None:
        return "zoo" if zoo_entry(env_id) is not None else "default"
    return preset


def default_policy(env_id: str) -> str:
    """The policy ``train`` uses without ``--policy``: the zoo entry's, else ``mlp``."""
    entry = zoo_entry(env_id)
    return entry.policy if entry is not None else "mlp"


def default_timesteps(env_id: str, preset: Optional[str]) -> int:
    """``--total-timesteps`` when not given: the zoo entry's budget when the run uses the zoo
    settings of ``env_id``, else :data:`DEFAULT_TIMESTEPS`."""
    entry = zoo_entry(env_id)
    if entry is not None and _resolve_preset(preset, env_id) == "zoo":
        return int(entry.n_timesteps)
    return DEFAULT_TIMESTEPS


def zoo_note(env_id: str, preset: Optional[str], policy: str) -> Optional[str]:
    """The line a new run prints about the zoo settings it uses (None when it uses none)."""
    if _resolve_preset(preset, env_id) != "zoo":
        return None
    entry = zoo_entry(env_id)
    if entry is None:
        return (f"ppo-ref: using the zoo settings for {DEFAULT_ENV} (--preset zoo; {env_id} has "
                f"no zoo entry, see ppo_ref/zoo.py)")
    tuned = "" if entry.policy == policy else f", tuned for the {entry.policy} policy"
    sde = ", gSDE exploration (use_sde=True)" if entry.settings.get("use_sde") else ""
    changed = f"; differs from it: {entry.deviations}" if entry.deviations else ""
    return (f"ppo-ref: using the zoo settings for {env_id} ({entry.source}{sde}{tuned}{changed}); "
            f"--set FIELD=VALUE overrides a field, --preset NAME replaces them")


def make_unique_dir(base: str) -> str:
    """Create and return ``base``, or ``base-2``, ``base-3``, ... (the first that does not exist;
    ``os.makedirs(exist_ok=False)``, so two racing processes get different directories)."""
    candidate, n = base, 1
    while True:
        try:
            os.makedirs(candidate, exist_ok=False)
            return candidate
        except FileExistsError:
            n += 1
            candidate = f"{base}-{n}"


def build_config(env_id: str, preset: Optional[str], overrides: List[str], n_envs: Optional[int],
                 backend: Optional[str] = None):
    """The PPOConfig for ``train``: the zoo entry of ``env_id`` (without ``--preset`` and with
    ``--preset zoo``; ``PPOConfig()`` for an env without one, or ``zoo_cartpole()`` with
    ``--preset zoo``), ``PPOConfig.preset(name)``, or ``PPOConfig()`` for ``default``; then
    ``--n-envs``, ``--backend`` and every ``--set field=value``
    (:func:`ppo_ref.config.parse_overrides`)."""
    try:
        changes = parse_overrides(overrides or [])
    except ValueError as exc:
        raise ValueError(f"--set: {exc}") from None
    flags = {}  # field -> the flag that gave it
    for flag, field, value in (("--n-envs", "n_envs", n_envs), ("--backend", "backend", backend)):
        if value is not None and field in changes:
            raise ValueError(f"{flag} and --set {field}= both given: keep one")
        if value is not None:
            changes[field] = int(value) if field == "n_envs" else value
            flags[field] = flag
    if preset is not None and preset not in preset_names():
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(preset_names())}")
    preset = _resolve_preset(preset, env_id)
    entry = zoo_entry(env_id)
    try:
        if preset == "zoo":
            return PPOConfig.zoo_cartpole(**changes) if entry is None else entry.config(**changes)
        return PPOConfig(**changes) if preset == "default" else PPOConfig.preset(preset, **changes)
    except ValueError as exc:  # PPOConfig's errors start with the field: name the flag given
        field = str(exc).split(" ", 1)[0]
        if field in flags:
            raise ValueError(f"{flags[field]}: {exc}") from None
        raise


def configure_train(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", default=None, help=f"gymnasium id (default {DEFAULT_ENV})")
    p.add_argument("--policy", default=None, choices=sorted(TRAINERS),
                   help="mlp or lstm (default: the zoo entry of --env, else mlp)")
    p.add_argument("--total-timesteps", type=int, default=None,
                   help=f"train until this many env steps, at most 2**53 (default: the zoo "
                        f"budget of --env when the zoo settings are used, else "
                        f"{DEFAULT_TIMESTEPS}; with --resume: the checkpoint's target)")
    p.add_argument("--n-envs", type=int, default=None,
                   help=f"parallel envs, at most {MAX_ENVS} (overrides the config)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the run, 0 to 2**63 - 1 (default 0)")
    p.add_argument("--seeds", default=None, metavar="SEEDS",
                   help="train one run per seed (e.g. 0-7 or 0,3,5), --jobs at a time, each in "
                        "--run-dir/seed<S>, then print and write summary.json: mean, std, min "
                        "and max of the final return and of steps/s over the seeds")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="with --seeds: runs at a time (default: one per core)")
    p.add_argument("--run-dir", default=None,
                   help="output directory, new or empty (default runs/<env>-<policy>-seed<S>-"
                        "<timestamp>, with -2, -3, ... appended if taken)")
    p.add_argument("--preset", default=None,
                   help="config base: zoo (the default: the zoo settings of --env), default "
                        "(SB3's defaults), or one of " + ", ".join(preset_names()[2:]))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a PPOConfig field (repeatable), e.g. --set n_epochs=10")
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the run in DIR from its checkpoint.npz (exactly), with its saved "
                        "settings; only --total-timesteps may change (to extend the run)")
    p.add_argument("--backend", default=None, choices=["fast", "spec"],
                   help="fast (default: the compiled tier) or spec (the readable NumPy tier of "
                        "ppo_ref/spec/, slower, float64); same as --set backend=...")
    p.add_argument("--vectorization", default=None, choices=["sync", "async", "envpool"],
                   help="gymnasium SyncVectorEnv (default), AsyncVectorEnv, or envpool's C++ "
                        "vector env (needs ppo_ref[envpool]; a run cannot be resumed exactly)")
    p.add_argument("--allow-import", action="store_true",
                   help="with --resume: let the saved env id of the form module:EnvId import "
                        "(run) its Python module; without it such a run is refused")
    p.add_argument("--checkpoint-every", type=float, default=CHECKPOINT_EVERY_DEFAULT,
                   metavar="SECONDS", help="write checkpoint.npz at least this often (and at the "
                                           "end); 0: after every update")
    p.add_argument("--progress-every", type=float, default=2.0, metavar="SECONDS",
                   help="print a progress line at least this often (default 2)")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="numba threads of the compiled kernels' parallel loops, 1 to "
                        "NUMBA_NUM_THREADS (default 1: more pays only on cores nothing else "
                        "uses; the same results for any N; not saved: give it again with "
                        "--resume)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress lines (the closing summary line is still printed)")
    p.add_argument("--list-fields", action="store_true",
                   help="print every --set field with its default and help (and the value the "
                        "zoo settings of --env give it, when they change it), then exit")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = _train_epilog()
    g = p.add_argument_group("asynchronous actor-learner (--async)")
    g.add_argument("--async", dest="use_async", action="store_true",
                   help="train with the actor-learner loop (ppo_ref.distributed.learner)")
    g.add_argument("--num-actors", type=int, default=None,
                   help=f"actors, at most {MAX_NUM_ACTORS} (default 4)")
    g.add_argument("--actors", default=None, choices=["process", "thread", "ray"],
                   help="where the actors run: processes of this machine (default), threads, or "
                        "Ray actors (needs ppo_ref[ray])")
    g.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="with --actors ray: join the Ray cluster at ADDR (e.g. HEAD_IP:6379 or "
                        "auto); without it a local Ray is started on 127.0.0.1 only")
    g.add_argument("--vtrace", action="store_true", help="V-trace off-policy correction")
    g.add_argument("--broadcast-every", type=int, default=None,
                   help="updates between policy broadcasts (default 1)")


TRAIN_EXAMPLES = (
    ("ppo-ref train", "CartPole-v1, its zoo settings, 100k steps"),
    ("ppo-ref train --env Pendulum-v1", "the zoo settings for Pendulum-v1"),
    ("ppo-ref train --env ppo_ref/MemoryCue-v0", "a bundled env (LSTM policy)"),
    ("ppo-ref train --env Acrobot-v1 --set n_epochs=10", "zoo settings, one field changed"),
    ("ppo-ref train --env Acrobot-v1 --preset cleanrl", "CleanRL's conventions instead"),
    ("ppo-ref train --list-fields", "every --set field: default, help"),
    ("ppo-ref train --resume DIR --total-timesteps 200000", "continue and extend a run"),
    ("ppo-ref train --async --num-actors 4 --vtrace", "the actor-learner, V-trace"),
    ("ppo-ref train --async --actors ray --num-actors 8", "actors on Ray (a local one)"),
    ("ppo-ref train --env mypkg.envs:MyEnv-v0", "your env (import registers it)"),
)


def _train_epilog() -> str:
    """The examples, the zoo table and the bundled env ids (registered by :mod:`ppo_ref.envs`)."""
    width = max(len(cmd) for cmd, _ in TRAIN_EXAMPLES)
    lines = ["examples:"]
    lines += [f"  {cmd:<{width}}  # {what}" for cmd, what in TRAIN_EXAMPLES]
    lines += ["", "zoo settings (the default of each env without --preset; table in "
                  "ppo_ref/zoo.py):"]
    env_width = max(len(env_id) for env_id in ZOO)
    for env_id, entry in ZOO.items():
        lines.append(f"  {env_id:<{env_width}}  {entry.policy:<4}  {entry.n_timesteps:>7} steps  "
                     f"{entry.source}")
    bundled = sorted(env_id for env_id in gymnasium.registry if env_id.startswith("ppo_ref/"))
    lines += ["", "bundled envs (ppo_ref/envs.py, registered by import ppo_ref): "
              + ", ".join(bundled)]
    return "\n".join(lines)


def _format_value(value) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value) if value else "()"
    return str(value)


def list_fields(args: argparse.Namespace, stream=None) -> int:
    """``train --list-fields``: every PPOConfig field with its default, help and choices, and the
    value this command's ``--env``/``--preset``/``--set`` give it where that differs; 0."""
    stream = stream if stream is not None else sys.stdout
    env_id = args.env or DEFAULT_ENV
    if args.env:
        probe_env(env_id)
    with user_input():
        chosen = build_config(env_id, args.preset, args.overrides, args.n_envs, args.backend)
    base = PPOConfig()
    label = f"--env {env_id}" + (f" --preset {args.preset}" if args.preset else "") + \
        (" with --set" if args.overrides else "")
    print(f"PPOConfig fields (ppo-ref train --set FIELD=VALUE); 'default' is PPOConfig()'s, "
          f"'{label}' the value this command would use where it differs:", file=stream)
    for f in dataclasses.fields(PPOConfig):
        default = _format_value(getattr(base, f.name))
        here = _format_value(getattr(chosen, f.name))
        used = f"  [{label}: {here}]" if here != default else ""
        print(f"  {f.name} (default {default}){used}", file=stream)
        help_text = f.metadata.get("help", "")
        if "choices" in f.metadata:
            help_text += "; one of " + ", ".join(str(c) for c in f.metadata["choices"])
        print(f"      {help_text}", file=stream)
    return 0


def run_training(trainer, logger, total_timesteps: int, *,
                 learn: Optional[Callable[[], Optional[str]]] = None) -> int:
    """Drive ``trainer.learn(total_timesteps, callback=logger.callback)`` (or ``learn()``, the
    actor-learner's loop, which may return text for the summary line) and return the exit code:
    0 with :meth:`~ppo_ref.io.runlog.RunLogger.finish`'s line; 130 after Ctrl-C; 143 after
    SIGTERM, 129 after SIGHUP (:class:`~ppo_ref.cli.common.SigintStopper`); 3 after any
    failure (an env raising anything, ``SystemExit`` included; a non-finite update; an actor or
    the learner failing; a bug). Then the last good state (the snapshot of the last completed
    update, whose counters and CSV rows agree) is saved and one line printed; a failure's
    traceback goes to ``<run_dir>/error.log``."""
    logger.begin(trainer)
    extra = None
    try:
        with SigintStopper(logger):
            if learn is None:
                trainer.learn(total_timesteps, callback=logger.callback)
            else:
                extra = learn()
        logger.save(trainer)
    except BaseException as exc:  # noqa: BLE001 -- every failure keeps the finished work
        # a signal's exception raised while a compiled kernel runs reaches here as its cause
        stop = exc if isinstance(exc, KeyboardInterrupt) else exc.__cause__
        if not isinstance(stop, KeyboardInterrupt):
            return _training_failed(trainer, logger, exc)
        code = stop.code if isinstance(stop, Terminated) else 130
        print(f"\nppo-ref: {stopped_how(code - 128)}; {_save_last_good(logger, trainer)}",
              file=sys.stderr)
        logger.close()
        return code
    code = 0
    if logger.stop_requested:
        code = 130
        print(f"ppo-ref: stopped at {trainer.num_timesteps} steps; resume with "
              f"ppo-ref train --resume {logger.run_dir}", file=sys.stderr)
    else:
        logger.finish(trainer, extra or "")
    logger.close()
    return code


def _save_last_good(logger, trainer) -> str:
    """Save the last good snapshot; the one-line note of what was kept."""
    try:
        path = logger.save_last_good(trainer)
    except Exception as exc:  # noqa: BLE001 -- e.g. the disk is full
        return (f"could not save the last good state ({type(exc).__name__}: {one_line(exc)}); "
                f"the previous checkpoint, if any, is unchanged")
    if path is not None:
        return (f"saved the last good checkpoint ({logger.snapshot_timesteps} steps) to "
                f"{path}; continue with ppo-ref train --resume {logger.run_dir}")
    return nothing_saved(logger)


def _training_failed(trainer, logger, exc: BaseException) -> int:
    """The one-line report of a training failure after saving the last good state; exit 3."""
    log_path = os.path.join(logger.run_dir, "error.log")
    log_note = ""
    with contextlib.suppress(OSError):
        with open(log_path, "a", encoding="utf-8") as fh:
            fh.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
            if actor_traceback := getattr(exc, "actor_traceback", ""):
                fh.write(f"--- the traceback actor {getattr(exc, 'agent_id', '?')} sent ---\n"
                         f"{actor_traceback.rstrip()}\n")
        log_note = f" (traceback in {log_path})"
    note = _save_last_good(logger, trainer)
    if isinstance(exc, EnvStepError):
        what = f"environment error: {one_line(exc)}"
    elif isinstance(exc, ActorLearnerError):
        what = f"actor-learner error: {one_line(exc)}"
    else:
        what = f"training failed: {type(exc).__name__}: {one_line(exc)}"
    print(f"ppo-ref train: error: {what}; {note}{log_note}", file=sys.stderr)
    with contextlib.suppress(OSError):
        logger.close()
    return 3


def _check_train_flags(args: argparse.Namespace) -> None:
    """Reject out-of-range values and flag combinations that would be ignored silently."""
    if args.total_timesteps is not None and not 1 <= args.total_timesteps <= MAX_TOTAL_TIMESTEPS:
        raise UsageError(f"--total-timesteps must be in [1, 2**53], got {args.total_timesteps}")
    for flag, value in (("--checkpoint-every", args.checkpoint_every),
                        ("--progress-every", args.progress_every)):
        if not value >= 0:  # also rejects nan
            raise UsageError(f"{flag} must be >= 0 seconds, got {value}")
    with user_input():
        check_kernel_threads(args.threads, "--threads", none_ok=False)
    if args.seed is not None and not 0 <= args.seed <= MAX_SEED:
        raise UsageError(f"--seed must be in [0, 2**63 - 1], got {args.seed}")
    if args.num_actors is not None and args.num_actors > MAX_NUM_ACTORS:
        raise UsageError(f"--num-actors must be in [1, {MAX_NUM_ACTORS}], got {args.num_actors}")
    if args.preset is not None and args.preset not in preset_names():
        raise UsageError(f"unknown --preset {args.preset!r}; choose from "
                         f"{', '.join(preset_names())}")
    if args.seeds is not None:
        clash = [flag for flag, given in (("--seed", args.seed is not None),
                                          ("--resume", bool(args.resume)),
                                          ("--async", args.use_async)) if given]
        if clash:
            hint = (" (resume one seed's run with ppo-ref train --resume DIR/seed<S>)"
                    if args.resume else "")
            raise UsageError(f"--seeds cannot be combined with {', '.join(clash)}{hint}")
        from ppo_ref.cli.seeds import parse_seeds
        parse_seeds(args.seeds)
    if args.jobs is not None and args.seeds is None:
        raise UsageError("--jobs only applies with --seeds")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    if args.allow_import and not args.resume:
        raise UsageError("--allow-import only applies with --resume (an --env module:EnvId you "
                         "type yourself is imported without it)")
    if args.resume and args.use_async:
        raise UsageError("--async cannot be combined with --resume: --resume continues the run "
                         "with the trainer it was started with")
    if not args.use_async:
        async_only = [flag for flag, value in (("--num-actors", args.num_actors),
                                               ("--vtrace", args.vtrace or None),
                                               ("--broadcast-every", args.broadcast_every),
                                               ("--actors", args.actors),
                                               ("--ray-address", args.ray_address))
                      if value is not None]
        if async_only and args.resume:
            raise UsageError(f"{', '.join(async_only)}: --resume continues a run with its saved "
                             "settings (drop the flag)")
        if async_only:
            verb = "applies" if len(async_only) == 1 else "apply"
            raise UsageError(f"{', '.join(async_only)} only {verb} to the actor-learner: add "
                             "--async (or drop the flag)")
        return
    if args.policy == "lstm":
        raise UsageError("--async --policy lstm is not supported: the actor-learner trains the MLP "
                         "policy only (drop --async to train the LSTM policy)")
    if args.vectorization is not None:
        raise UsageError("--vectorization does not apply with --async (each actor process steps "
                         "its own envs)")
    for flag, value in (("--num-actors", args.num_actors),
                        ("--broadcast-every", args.broadcast_every)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if args.ray_address is not None and args.actors != "ray":
        raise UsageError("--ray-address only applies with --actors ray")
    if args.actors == "ray" and importlib.util.find_spec("ray") is None:
        raise UsageError("--actors ray needs Ray, which is not installed: "
                         "pip install 'ppo_ref[ray]'")


LOCK_FILE = ".lock"


def _open_lock_file(run_dir: str, path: str) -> int:
    """Open (create) the lock file, only as a plain file of its own (no symlink followed, no
    FIFO, device, directory or hard link): its pid is written and must reach no other file."""
    refuse = (f"{run_dir}: its lock file {LOCK_FILE} is not a plain file of its own (a symlink, "
              f"hard link, FIFO, device or directory): refusing to write it; remove {path} if "
              "no ppo-ref process uses the directory")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if os.path.islink(path) or os.path.isdir(path):
            raise UsageError(refuse) from None
        raise UsageError(f"cannot lock the run directory {run_dir}: "
                         f"{exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:  # 0: its holder just removed it
        os.close(fd)
        raise UsageError(refuse)
    return fd


@contextlib.contextmanager
def run_dir_lock(run_dir: str, created: bool = False):
    """Hold ``run_dir`` (created if needed) for one writer: an exclusive ``fcntl.flock`` on
    ``<run_dir>/.lock`` (holding the writer's pid) for the block. :class:`UsageError` at once,
    touching nothing else, when another process (or another open in this one) holds it. On exit
    the lock file is removed, and the directory too if it is empty and this call (or the caller:
    ``created``) made it; a writer that opened the file just before its removal sees another
    inode and locks the new file, so two writers never both hold the directory."""
    created = created or not os.path.isdir(run_dir)
    with user_input(f"cannot lock the run directory {run_dir}"):
        os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, LOCK_FILE)
    while True:
        fd = _open_lock_file(run_dir, path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            except OSError:
                holder = "unknown"
            os.close(fd)
            raise UsageError(f"{run_dir} is in use by another ppo-ref process (pid {holder}): one "
                             "process writes a run directory at a time; wait for it to end or "
                             "stop it first") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file between our open and our lock: retry
    key = os.path.realpath(path)
    HELD_LOCKS.add(key)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        yield path
    finally:
        HELD_LOCKS.discard(key)
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)
        if created:  # made here and nothing written (the run was refused): leave no trace
            with contextlib.suppress(OSError):
                os.rmdir(run_dir)


def _check_fresh_run_dir(run_dir: str) -> None:
    """``--run-dir`` must be new, empty, or hold only a run stopped before its first update
    (header-only CSVs, no checkpoint: reused); a run, or files that are no run's, are refused."""
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise UsageError(f"--run-dir {run_dir} exists and is not a directory")
    if os.path.exists(os.path.join(run_dir, "checkpoint.npz")):
        raise UsageError(f"{run_dir} already holds a run (checkpoint.npz): continue it with "
                         f"--resume {run_dir}, or choose another --run-dir")
    metrics = os.path.join(run_dir, "metrics.csv")
    if os.path.exists(metrics):
        with open(metrics, "rb") as fh:
            has_rows = sum(1 for line in fh if line.strip()) > 1
        if has_rows:
            raise UsageError(f"{run_dir} already holds a run (metrics.csv has updates but there "
                             f"is no checkpoint): restart it from scratch with --resume {run_dir}, "
                             "or choose another --run-dir")
    temporaries = tuple(f"{TEMPORARY_PREFIX}{name}-" for name in RUN_FILES)  # a killed write's
    ours = (*RUN_FILES, "error.log", LOCK_FILE, "learning_curve.png", ".gitkeep")
    with user_input(f"cannot read the run directory {run_dir}"):
        others = sorted(name for name in (os.listdir(run_dir) if os.path.isdir(run_dir) else ())
                        if name not in ours and not name.startswith(temporaries))
    if others:
        raise UsageError(f"--run-dir {run_dir} is not empty and holds no run ("
                         f"{', '.join(others[:3])}{', ...' if len(others) > 3 else ''}): choose "
                         "a new or empty directory")


def _saved_preset(info: Dict[str, Any], env_id: str) -> Optional[str]:
    """The preset a run was started with: config.json's ``preset``, else read from its recorded
    command line; None when neither says."""
    if isinstance(info.get("preset"), str):
        return info["preset"]
    argv = info.get("argv")
    if not isinstance(argv, list) or "train" not in argv:
        return None
    preset = None
    for i, item in enumerate(argv):
        if item == "--preset" and i + 1 < len(argv):
            preset = argv[i + 1]
        elif isinstance(item, str) and item.startswith("--preset="):
            preset = item.split("=", 1)[1]
    return _resolve_preset(preset, env_id)


def _check_resume_flags(args: argparse.Namespace, run_dir: str, meta: Dict[str, Any],
                        info: Dict[str, Any]) -> None:
    """Flags given with ``--resume`` must agree with the saved run (they cannot change it)."""

    def conflict(flag: str, saved: str):
        raise UsageError(f"{flag} conflicts with the run being resumed ({saved}); --resume "
                         f"{run_dir} continues with its saved settings (only --total-timesteps "
                         f"may change)")
    env_id = meta.get("env_id")
    with user_input(f"checkpoint of {run_dir}: bad config"):
        saved = PPOConfig.from_dict(meta.get("config", {}))
    for flag, given, name, value in (
            ("--env", args.env, "env", env_id),
            ("--policy", args.policy, "policy",
             meta.get("policy") or policy_of_trainer(meta.get("trainer"))),
            ("--seed", args.seed, "seed", meta.get("seed")),
            ("--vectorization", args.vectorization, "vectorization",
             meta.get("vectorization", "sync")),
            ("--n-envs", args.n_envs, "n_envs", saved.n_envs),
            ("--backend", args.backend, "backend", saved.backend)):
        if given is not None and given != value:
            conflict(f"{flag} {given}", f"{name} {value}")
    if args.run_dir is not None and os.path.realpath(args.run_dir) != os.path.realpath(run_dir):
        conflict(f"--run-dir {args.run_dir}", f"its directory is {run_dir}")
    if args.preset is not None:
        preset = _saved_preset(info, env_id)
        if preset is None:
            conflict(f"--preset {args.preset}", "its preset is not recorded")
        if args.preset != preset:
            conflict(f"--preset {args.preset}", f"preset {preset}")
    for item in args.overrides or []:
        with user_input(f"--set {item}"):
            changes = parse_overrides([item])
            changed = saved.replace(**changes)
        for field in changes:
            if getattr(changed, field) != getattr(saved, field):
                conflict(f"--set {item}", f"{field}={getattr(saved, field)!r}")


def _make_trainer(policy: str, env_id: str, config, seed: int, vectorization: str):
    """The trainer of a new or restarted run (it validates the config against the env)."""
    kwargs = {"seed": seed}
    if vectorization != "sync":
        kwargs["vectorization"] = vectorization
    with building(f"cannot train {policy} on {env_id}"):
        return trainer_class(policy)(env_id, config, **kwargs)


def _schedule_note(trainer, saved_total: int, total: int) -> None:
    """Say that annealed schedules restart over a target a resume changed."""
    annealed = [name for name, kind in (("learning rate", trainer.config.lr_schedule),
                                        ("clip range", trainer.config.clip_range_schedule))
                if kind != "constant"]
    if total == saved_total or not annealed:
        return
    many = len(annealed) > 1
    print(f"ppo-ref: note: the target changed from {saved_total} to {total} steps; the "
          f"{' and '.join(annealed)} schedule{'s' if many else ''} now "
          f"anneal{'' if many else 's'} over the new horizon (progress = 1 - "
          f"steps / {total}), so {'they restart' if many else 'it restarts'} "
          f"from {'their' if many else 'its'} value at {trainer.num_timesteps} "
          f"of {total} steps", file=sys.stderr)


def _train_resume(args: argparse.Namespace, hold: contextlib.ExitStack):
    """``(trainer, run_dir, run_info, resume_from, total)`` for ``--resume``, or an exit code.
    The run directory is locked (on ``hold``) before anything in it is read or written."""
    run_dir = args.resume
    path = os.path.join(run_dir, "checkpoint.npz")
    if not os.path.isdir(run_dir) or not (os.path.isfile(path) or
                                          os.path.isfile(os.path.join(run_dir, "config.json"))):
        from ppo_ref.cli.seeds import seeds_hint
        raise UsageError(f"--resume {run_dir}: no checkpoint.npz there (nothing to resume)"
                         f"{seeds_hint(run_dir) if os.path.isdir(run_dir) else ''}")
    hold.enter_context(run_dir_lock(run_dir))
    info = read_run_info(run_dir)
    if os.path.lexists(path) and not os.path.isfile(path):
        # never taken for "no checkpoint": restarting would replace the run's CSV files
        raise UsageError(f"--resume {run_dir}: its checkpoint.npz is not a regular file (a "
                         "FIFO, device, directory or dangling symlink): refusing to touch the "
                         "run; put the run's checkpoint back")
    if not os.path.isfile(path):
        return _train_restart(args, run_dir, info)
    with user_input(f"--resume {run_dir}"):
        _, meta = load_checkpoint(path)
        vet_checkpoint_metadata(meta, f"checkpoint {path!r}")
        check_env_import(meta.get("env_id"), args.allow_import, f"checkpoint {path!r}")
    saved_config(meta["config"], f"checkpoint {path!r}")
    check_same_run(run_dir, info, meta)
    _check_resume_flags(args, run_dir, meta, info)
    done = int(meta.get("num_timesteps", 0))
    saved_total = int(meta["total_timesteps"])
    total = saved_total if args.total_timesteps is None else args.total_timesteps
    if done >= total:
        print(f"ppo-ref: {run_dir} has already reached its target ({done} steps >= {total}); to "
              f"train further, extend it: ppo-ref train --resume {run_dir} --total-timesteps N "
              f"(N > {done})")
        return 0
    if isinstance(meta.get("actor_learner"), dict) or info.get("mode") == "async":
        return int(cli_resume(args, run_dir, path, meta, total))
    cls = trainer_class_by_name(meta.get("trainer", ""))
    if meta.get("env_id") is not None:
        probe_env(meta["env_id"])
    with building(f"--resume {run_dir}"):
        trainer = cls.load(path, allow_import=args.allow_import)
    if meta.get("exact_resume_limits"):
        print(f"ppo-ref: warning: env state not fully restorable ({meta['exact_resume_limits']}); "
              "the resumed run is not bit-identical to an uninterrupted one", file=sys.stderr)
    run_info = {"trainer": meta.get("trainer"), "env_id": meta.get("env_id"),
                "total_timesteps": total, "argv": args.argv}
    resume_from = {"n_updates": trainer.n_updates, "num_timesteps": trainer.num_timesteps}
    print(f"ppo-ref: resuming {run_dir} at {trainer.num_timesteps} steps, target {total}")
    _schedule_note(trainer, saved_total, total)
    rollout_note(trainer.config, trainer.num_timesteps, total)
    return trainer, run_dir, run_info, resume_from, total


def _train_restart(args: argparse.Namespace, run_dir: str, info: Dict[str, Any]):
    """``--resume DIR`` of a run without a checkpoint: the run again from step 0 with the
    settings its ``config.json`` records (its CSV rows are dropped: nothing was saved)."""
    needed = ("env_id", "policy", "seed", "config", "total_timesteps")
    if not all(key in info for key in needed) or info.get("policy") not in TRAINERS:
        raise UsageError(f"--resume {run_dir}: no checkpoint.npz there and its config.json does "
                         "not record the run's settings (nothing to resume)")
    env_id, policy, seed = info["env_id"], info["policy"], info["seed"]
    with user_input(f"--resume {run_dir}: config.json"):
        if not isinstance(env_id, str) or not env_id:
            raise ValueError(f"env_id must be a gymnasium id, got {env_id!r}")
        check_env_import(env_id, args.allow_import, f"{os.path.join(run_dir, 'config.json')!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"bad seed {seed!r}")
    config = saved_config(info["config"], f"--resume {run_dir}: config.json")
    _check_resume_flags(args, run_dir, info, info)
    total = int(info["total_timesteps"]) if args.total_timesteps is None else args.total_timesteps
    probe_env(env_id)
    if info.get("mode") == "async":
        return int(cli_restart(args, run_dir, info, total))
    trainer = _make_trainer(policy, env_id, config, seed, info.get("vectorization", "sync"))
    run_info = {key: info[key] for key in ("trainer", "policy", "env_id", "seed", "vectorization",
                                           "preset", "config", "argv") if key in info}
    run_info.update(total_timesteps=total, restart_argv=[args.argv])
    print(f"ppo-ref: {run_dir} has no checkpoint (no update was saved): starting its run from "
          f"scratch with its saved settings ({policy} on {env_id}, seed {seed}) for {total} steps")
    rollout_note(config, 0, total)
    return trainer, run_dir, run_info, None, total


def _train_new(args: argparse.Namespace, hold: contextlib.ExitStack):
    """``(trainer, run_dir, run_info, None, total)`` for a new run, or the --async exit code.
    The run directory is locked (on ``hold``) as it is created and checked again under the
    lock (another process may have started a run there meanwhile)."""
    env_id = args.env or DEFAULT_ENV
    if args.use_async and args.policy is None and default_policy(env_id) == "lstm":
        raise UsageError(f"--async trains the MLP policy only and {env_id}'s zoo row is for the "
                         f"LSTM policy: add --policy mlp to train an MLP on it, or drop --async")
    policy = "mlp" if args.use_async else (args.policy or default_policy(env_id))
    seed = 0 if args.seed is None else args.seed
    total = args.total_timesteps if args.total_timesteps is not None \
        else default_timesteps(env_id, args.preset)
    with user_input():
        config = build_config(env_id, args.preset, args.overrides, args.n_envs, args.backend)
    if args.use_async:  # refused before anything is printed or created
        args.seed, args.env, args.total_timesteps = seed, env_id, total
        args.num_actors = 4 if args.num_actors is None else args.num_actors
        args.broadcast_every = 1 if args.broadcast_every is None else args.broadcast_every
        async_config = cli_async_config(args, config)
    if args.run_dir is not None:
        if os.path.isdir(args.run_dir):  # lock it now: a busy directory is reported as such
            hold.enter_context(run_dir_lock(args.run_dir))
        _check_fresh_run_dir(args.run_dir)
    probe_env(env_id)

    def new_run_dir(kind: str) -> str:
        with user_input("cannot create the run directory"):
            run_dir = args.run_dir or make_unique_dir(default_run_dir(env_id, kind, seed))
        if os.path.realpath(os.path.join(run_dir, LOCK_FILE)) not in HELD_LOCKS:
            hold.enter_context(run_dir_lock(run_dir, created=args.run_dir is None))
        if args.run_dir is not None:
            _check_fresh_run_dir(run_dir)
        if (note := zoo_note(env_id, args.preset, policy)) is not None:
            print(note)
        return run_dir

    vectorization = args.vectorization or "sync"
    if args.use_async:  # the trainers refuse before any output
        with building(f"cannot train mlp on {env_id}"):
            trainer = make_learner(async_config, env_id)
    else:
        trainer = _make_trainer(policy, env_id, config, seed, vectorization)
    try:
        run_dir = new_run_dir("async" if args.use_async else policy)
    except BaseException:
        close_quickly(trainer, 10.0)
        raise
    if args.use_async:
        return int(cli_train(args, async_config, trainer, run_dir))
    run_info = {"trainer": type(trainer).__name__, "policy": policy, "env_id": env_id,
                "seed": seed, "total_timesteps": total, "vectorization": vectorization,
                "preset": _resolve_preset(args.preset, env_id), "config": config.to_dict(),
                "argv": args.argv}
    print(f"ppo-ref: training {policy} on {env_id} for {total} steps (seed {seed}) -> {run_dir}")
    rollout_note(config, 0, total)
    return trainer, run_dir, run_info, None, total


def train_in_run_dir(args: argparse.Namespace, trainer, run_dir: str, run_info: Dict[str, Any],
                     resume_from: Optional[Dict[str, int]], total: int, *,
                     prepare: Optional[Callable] = None) -> int:
    """:func:`run_training` with a :class:`~ppo_ref.io.runlog.RunLogger` of ``run_dir``;
    ``prepare(logger)`` (the actor-learner's) returns the ``learn`` to run. The trainer's envs
    are closed at the end: 10 s for a finished run's, 0.5 s after a failure or an interrupt
    (they may be stuck), then their workers are killed."""
    trainer.threads = args.threads
    helper = start_compiling_ahead(trainer) if prepare is None else None
    code = 3
    try:
        with user_input(f"cannot write the run directory {run_dir}"):
            logger = RunLogger(run_dir, run_info, resume_from=resume_from,
                               progress_every=args.progress_every,
                               checkpoint_every=args.checkpoint_every, quiet=args.quiet)
        for note in logger.notes:
            print(f"ppo-ref: warning: {note}", file=sys.stderr)
        learn = prepare(logger) if prepare is not None else None
        code = run_training(trainer, logger, total, learn=learn)
        return code
    finally:
        stop_compiling_ahead(helper)
        close_quickly(trainer, 10.0 if code == 0 else 0.5)


def cmd_train(args: argparse.Namespace) -> int:
    if args.env is not None and not args.env.strip():  # not taken for "no --env"
        raise UsageError(f"--env must be a gymnasium id such as {DEFAULT_ENV} (leave it out for "
                         f"{DEFAULT_ENV}), got {args.env!r}")
    if args.run_dir is not None and not args.run_dir.strip():
        raise UsageError("--run-dir must name a directory (leave it out for one under runs/), "
                         "got ''")
    if args.list_fields:
        return list_fields(args)
    _check_train_flags(args)
    if args.seeds is not None:
        return _train_seeds(args)
    with contextlib.ExitStack() as hold:  # the run directory's lock, held for the whole run
        started = _train_resume(args, hold) if args.resume else _train_new(args, hold)
        return started if isinstance(started, int) else train_in_run_dir(args, *started)


def _train_seeds(args: argparse.Namespace) -> int:
    """``--seeds``: the settings checked once here, then one run per seed
    (:func:`ppo_ref.cli.seeds.cmd_train_seeds`) in a new (or empty) directory, locked meanwhile."""
    from ppo_ref.cli.seeds import cmd_train_seeds
    env_id = args.env or DEFAULT_ENV
    with user_input():
        config = build_config(env_id, args.preset, args.overrides, args.n_envs, args.backend)
    probe_env(env_id)
    policy = args.policy or default_policy(env_id)
    vectorization = "sync" if args.vectorization in (None, "async") else args.vectorization
    # what the trainer refuses: one line here, not one failure per seed
    close_quickly(_make_trainer(policy, env_id, config, 0, vectorization), 10.0)
    run_dir = args.run_dir
    if run_dir is None:
        tag = "s" + "".join(args.seeds.split()).replace(",", "_")
        with user_input("cannot create the run directory"):
            run_dir = make_unique_dir(default_run_dir(env_id, policy, tag))
    with run_dir_lock(run_dir, created=args.run_dir is None):  # a file there: a one-line error
        with user_input(f"cannot read the run directory {run_dir}"):
            if set(os.listdir(run_dir)) - {LOCK_FILE}:  # checked under the lock
                raise UsageError(f"--run-dir {run_dir} must be a new or empty directory "
                                 "with --seeds")
        return cmd_train_seeds(args, run_dir)
