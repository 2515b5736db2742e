"""``ppo-ref train --async``: the actor-learner loop (:mod:`ppo_ref.distributed`) with the
command line's run directory."""

from __future__ import annotations


from ppo_ref.cli.common import (DEFAULT_ENV, DEFAULT_TIMESTEPS, SigintStopper, UsageError,
                                rollout_note, user_input)
from ppo_ref.config import PPOConfig
from ppo_ref.distributed import (ActorLearnerError, UpdateInfo, async_config_from_ppo, learner_loop,
                                 make_learner)

__all__ = ["cli_train"]


def cli_train(args, ppo: PPOConfig, run_dir: str) -> int:
    """``ppo-ref train --async``: the actor-learner loop with the CLI's run directory.

    Uses ``args.env``, ``args.total_timesteps``, ``args.num_actors``, ``args.vtrace``,
    ``args.broadcast_every``, ``args.seed``, ``args.progress_every``,
    ``args.checkpoint_every``, ``args.quiet``, ``args.actors`` (None: "process") and
    ``args.ray_address`` (when present). Writes ``config.json`` (with the actor-learner
    settings), ``metrics.csv``, ``timing.csv``, ``episodes.csv`` (``env`` = agent id) and
    ``checkpoint.npz`` (a :class:`~ppo_ref.train.ppo.PPOTrainer` checkpoint: ``ppo-ref eval``
    works on it) through :class:`ppo_ref.io.runlog.RunLogger`; the progress line adds the
    policy lag. First Ctrl-C: stop after the current update, checkpoint, exit 130. An actor
    failure or starvation (or a Ray that cannot be started or joined): checkpoint of the last
    completed update, exit 3.
    """
    import json
    import sys


    env_id = args.env or DEFAULT_ENV
    total = args.total_timesteps if args.total_timesteps is not None else DEFAULT_TIMESTEPS
    try:
        with user_input("--async"):
            config = async_config_from_ppo(
                ppo, num_actors=args.num_actors, total_timesteps=total, use_vtrace=args.vtrace,
                broadcast_every=args.broadcast_every, seed=args.seed,
                actors=getattr(args, "actors", None) or "process",
                ray_address=getattr(args, "ray_address", None))
    except UsageError:  # nothing was written: the run-directory lock removes what it made
        raise
    trainer = make_learner(config, env_id)
    trainer.threads = getattr(args, "threads", 1)
    run_info = {"trainer": type(trainer).__name__, "policy": "mlp", "mode": "async",
                "env_id": env_id, "seed": args.seed, "total_timesteps": total,
                "actor_learner": config.to_dict(), "config": trainer.config.to_dict(),
                "argv": getattr(args, "argv", sys.argv[1:])}
    logger = _async_run_logger(run_dir, json.loads(json.dumps(run_info)),
                               progress_every=args.progress_every,
                               checkpoint_every=args.checkpoint_every, quiet=args.quiet)
    print(f"ppo-ref: training mlp on {env_id} with {config.num_actors} {config.actors} actors "
          f"({config.n_steps} steps each per update, "
          f"{'V-trace' if config.use_vtrace else 'GAE'}, broadcast every "
          f"{config.broadcast_every}) for {total} steps (seed {args.seed}) -> {run_dir}")
    # the learner's config has n_envs = num_actors and the per-actor n_steps of an update
    rollout_note(trainer.config, 0, total, unit="update", factors="num_actors*n_steps")

    def on_update(info: UpdateInfo):
        stats = dict(info.stats)
        stats.update({"fps": info.env_steps / max(info.wall_seconds, 1e-12),
                      "progress_remaining": trainer.progress_remaining})
        logger.lag = (info.policy_lag_mean, info.policy_lag_max)
        return logger.callback(trainer, stats)

    try:
        logger.begin(trainer)
        try:
            with SigintStopper(logger):
                _, report = learner_loop(config, trainer, env_id, callback=on_update)
        except ActorLearnerError as exc:
            path = logger.save_last_good(trainer)
            where = f"saved the last good checkpoint to {path}" if path else "nothing saved"
            print(f"ppo-ref: actor-learner error: {exc}\nppo-ref: {where}", file=sys.stderr)
            return 3
        except KeyboardInterrupt:
            path = logger.save_last_good(trainer)
            print(f"\nppo-ref: interrupted; checkpoint of the last completed update: {path}",
                  file=sys.stderr)
            return 130
        logger.save(trainer)
        if report.stopped_early:
            print(f"ppo-ref: stopped at {trainer.num_timesteps} steps", file=sys.stderr)
            return 130
        lags = report.policy_lag_mean
        logger.finish(trainer, f"{report.steps_per_second:.0f} steps/s, policy lag mean "
                               f"{(sum(lags) / len(lags)) if lags else float('nan'):.2f} max "
                               f"{max(report.policy_lag_max, default=0)}, {report.broadcasts} "
                               f"broadcasts")
        return 0
    finally:
        logger.close()
        trainer.close()


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
