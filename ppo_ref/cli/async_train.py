"""``ppo-ref train --async``: the actor-learner loop (:mod:`ppo_ref.distributed`) with the
command line's run directory, and ``ppo-ref train --resume DIR`` of such a run."""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, Optional

from ppo_ref.cli.common import (DEFAULT_ENV, DEFAULT_TIMESTEPS, MAX_NUM_ACTORS, UsageError,
                                building, close_quickly, rollout_note, user_input)
from ppo_ref.config import PPOConfig
from ppo_ref.distributed import (AsyncActorLearnerConfig, UpdateInfo, async_config_from_ppo,
                                 learner_loop, make_learner)

__all__ = ["cli_train", "cli_resume", "cli_restart"]


def cli_train(args, ppo: PPOConfig, run_dir: str) -> int:
    """``ppo-ref train --async``: the actor-learner loop with the CLI's run directory.

    Uses ``args.env``, ``args.total_timesteps``, ``args.num_actors``, ``args.vtrace``,
    ``args.broadcast_every``, ``args.seed``, ``args.progress_every``,
    ``args.checkpoint_every``, ``args.quiet``, ``args.actors`` (None: "process") and
    ``args.ray_address`` (when present). Writes ``config.json`` (with the actor-learner settings), ``metrics.csv``,
    ``timing.csv``, ``episodes.csv`` (``env`` = agent id) and ``checkpoint.npz`` (a
    :class:`~ppo_ref.train.ppo.PPOTrainer` checkpoint, so ``ppo-ref eval`` works on it, whose
    metadata adds ``actor_learner``: the loop's settings and the policy version to continue
    from) through :class:`ppo_ref.io.runlog.RunLogger`; the progress line adds the policy lag.
    The run ends as a synchronous one does (:func:`ppo_ref.cli.train.run_training`): first
    Ctrl-C: stop after the current update, checkpoint, exit 130; any failure of an actor, of
    the learner or of the loop: the checkpoint of the last completed update, the traceback in
    ``error.log``, one line, exit 3. ``ppo-ref train --resume DIR`` continues it
    (:func:`cli_resume`).
    """
    env_id = args.env or DEFAULT_ENV
    total = args.total_timesteps if args.total_timesteps is not None else DEFAULT_TIMESTEPS
    with user_input("--async"):  # nothing written yet: the run-directory lock removes the dir
        config = async_config_from_ppo(
            ppo, num_actors=args.num_actors, total_timesteps=total, use_vtrace=args.vtrace,
            broadcast_every=args.broadcast_every, seed=args.seed,
            actors=getattr(args, "actors", None) or "process",
            ray_address=getattr(args, "ray_address", None))
    trainer = make_learner(config, env_id)
    run_info = {"trainer": type(trainer).__name__, "policy": "mlp", "mode": "async",
                "env_id": env_id, "seed": args.seed, "total_timesteps": total,
                "actor_learner": config.to_dict(), "config": trainer.config.to_dict(),
                "argv": getattr(args, "argv", sys.argv[1:])}
    print(f"ppo-ref: training mlp on {env_id} with {config.num_actors} {config.actors} "
          f"actors ({config.n_steps} steps each per update, "
          f"{'V-trace' if config.use_vtrace else 'GAE'}, broadcast every "
          f"{config.broadcast_every}) for {total} steps (seed {args.seed}) -> {run_dir}")
    # the learner's config has n_envs = num_actors and the per-actor n_steps of an update
    rollout_note(trainer.config, 0, total, unit="update", factors="num_actors*n_steps")
    return _run(args, trainer, config, env_id, run_dir, run_info, None, total, 0)


def cli_resume(args, run_dir: str, path: str, meta: Dict[str, Any], total: int) -> int:
    """``ppo-ref train --resume DIR`` of an ``--async`` run: the learner continues exactly from
    the checkpoint (parameters, Adam state, generators, counters, the schedules' horizon) and
    from its policy version; new actors start from that version with advanced seeds
    (:func:`ppo_ref.distributed.resumed_actors_config`). What the actors then collect is new
    experience (fresh episodes; how it interleaves depends on actor timing, as in any --async
    run): docs/specification.md, "Resuming an actor-learner run"."""
    from ppo_ref.train.ppo import PPOTrainer
    saved = meta.get("actor_learner")
    done = int(meta["num_timesteps"])
    source = f"checkpoint {path!r}"
    if not isinstance(saved, dict):  # a checkpoint from before resumable --async runs
        from ppo_ref.cli.train import _read_run_info
        saved = {"config": _read_run_info(run_dir).get("actor_learner")}
    config = _saved_async_config(saved.get("config"), total - done, source)
    version = saved.get("policy_version")
    if version is None:  # the version of the parameters after n_updates updates
        version = -(-int(meta["n_updates"]) // config.broadcast_every)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise UsageError(f"{source}: actor_learner.policy_version must be an integer >= 0, got "
                         f"{version!r}")
    with building(f"--resume {run_dir}"):
        trainer = PPOTrainer.load(path)
    env_id = trainer.env_id
    run_info = {"trainer": meta.get("trainer"), "env_id": env_id, "total_timesteps": total,
                "argv": getattr(args, "argv", sys.argv[1:])}
    resume_from = {"n_updates": trainer.n_updates, "num_timesteps": trainer.num_timesteps}
    print(f"ppo-ref: resuming {run_dir} at {done} steps, target {total}: the learner continues "
          f"from policy version {version}; {config.num_actors} new {config.actors} actors "
          f"start from it with advanced seeds")
    rollout_note(trainer.config, done, total, unit="update", factors="num_actors*n_steps")
    return _run(args, trainer, config, env_id, run_dir, run_info, resume_from, total, version)


def cli_restart(args, run_dir: str, info: Dict[str, Any], total: int) -> int:
    """``ppo-ref train --resume DIR`` of an ``--async`` run without a checkpoint (it failed or
    was killed before its first one): the run again from step 0 with its saved settings."""
    source = f"--resume {run_dir}: config.json"
    config = _saved_async_config(info.get("actor_learner"), total, source)
    with building(f"cannot train mlp on {info['env_id']}"):
        trainer = make_learner(config, info["env_id"])
    run_info = {key: info[key] for key in ("trainer", "policy", "mode", "env_id", "seed",
                                           "actor_learner", "config", "argv", "run_id")
                if key in info}
    run_info.update(total_timesteps=total, restart_argv=[getattr(args, "argv", None)])
    print(f"ppo-ref: {run_dir} has no checkpoint (no update was saved): starting its "
          f"actor-learner run from scratch with its saved settings for {total} steps")
    rollout_note(trainer.config, 0, total, unit="update", factors="num_actors*n_steps")
    return _run(args, trainer, config, info["env_id"], run_dir, run_info, None, total, 0)


def _saved_async_config(saved: Any, total: int, source: str) -> AsyncActorLearnerConfig:
    """The saved actor-learner settings (``AsyncActorLearnerConfig.to_dict()``) with
    ``total_timesteps`` set to what is left to train; one :class:`UsageError` line otherwise."""
    if not isinstance(saved, dict):
        raise UsageError(f"{source}: the actor-learner settings are not recorded")
    d = json.loads(json.dumps(saved))
    d["total_timesteps"] = max(int(total), 1)
    with user_input(f"{source}: bad actor-learner settings"):
        config = AsyncActorLearnerConfig.from_dict(d)
    if config.num_actors > MAX_NUM_ACTORS:
        raise UsageError(f"{source}: num_actors must be in [1, {MAX_NUM_ACTORS}], got "
                         f"{config.num_actors}")
    return config


def _run(args, trainer, config: AsyncActorLearnerConfig, env_id: str, run_dir: str,
         run_info: Dict[str, Any], resume_from: Optional[Dict[str, int]], total: int,
         start_version: int) -> int:
    """Train with :func:`ppo_ref.distributed.learner_loop` under
    :func:`ppo_ref.cli.train.run_training` (its checkpoints, failures and Ctrl-C handling);
    each checkpoint records the policy version a resume continues from."""
    from ppo_ref.cli.train import run_training
    trainer.threads = getattr(args, "threads", 1)
    code = 3
    try:
        with user_input(f"cannot write the run directory {run_dir}"):
            logger = _async_run_logger(run_dir, json.loads(json.dumps(run_info)),
                                       resume_from=resume_from,
                                       progress_every=args.progress_every,
                                       checkpoint_every=args.checkpoint_every, quiet=args.quiet)
        for note in logger.notes:
            print(f"ppo-ref: warning: {note}", file=sys.stderr)
        # the version of the learner's current parameters: what a resume broadcasts first
        version = {"current": start_version}
        saved_config = config.to_dict()
        logger.extra_metadata = lambda: {"actor_learner": {"policy_version": version["current"],
                                                           "config": saved_config}}

        def on_update(info: UpdateInfo):
            stats = dict(info.stats)
            stats.update({"fps": info.env_steps / max(info.wall_seconds, 1e-12),
                          "progress_remaining": trainer.progress_remaining})
            # after this update: broadcast as info.version + 1, or newer than info.version
            version["current"] = info.version + 1
            logger.lag = (info.policy_lag_mean, info.policy_lag_max)
            return logger.callback(trainer, stats)

        def learn() -> str:
            _, report = learner_loop(config, trainer, env_id, callback=on_update,
                                     start_version=start_version)
            lags = report.policy_lag_mean
            return (f"{report.steps_per_second:.0f} steps/s, policy lag mean "
                    f"{(sum(lags) / len(lags)) if lags else float('nan'):.2f} max "
                    f"{max(report.policy_lag_max, default=0)}, {report.broadcasts} broadcasts")

        code = run_training(trainer, logger, total, learn=learn)
        return code
    finally:
        close_quickly(trainer, 10.0 if code == 0 else 0.5)


def _async_run_logger(*args, **kwargs):
    """A :class:`ppo_ref.io.runlog.RunLogger` whose progress line ends with the policy lag of the
    last update (``logger.lag = (mean, max)``, set by the caller before each callback)."""
    from ppo_ref.io.runlog import RunLogger

    class AsyncRunLogger(RunLogger):
        """RunLogger whose progress line also shows the policy lag of the last update."""

        lag = (float("nan"), 0)

        def progress(self, trainer, stats=None) -> None:
            if self.quiet:
                return
            import io
            buffer = io.StringIO()
            stream, self.stream = self.stream, buffer
            try:
                super().progress(trainer, stats)
            finally:
                self.stream = stream
            print(f"{buffer.getvalue().rstrip()} | policy lag mean {self.lag[0]:.2f} max "
                  f"{self.lag[1]}", file=self.stream, flush=True)

    return AsyncRunLogger(*args, **kwargs)
