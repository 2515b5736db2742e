"""The ``ppo-ref`` command line (also ``python -m ppo_ref``): one module per command
(``train``, ``--async`` in ``async_train``, ``eval``, ``plot``, ``vectors``/``check``,
``diff``, ``details``), each a ``configure_<name>(parser)`` and a ``cmd_<name>(args) -> int``
registered in :data:`SUBCOMMANDS` by :mod:`ppo_ref.cli.main` (:func:`register_subcommand` adds
more). :mod:`ppo_ref.cli.common` holds what they share: the one-line :class:`UsageError` (exit
status 2), the lazily imported trainer table :data:`TRAINERS`, the stated bounds of counts.
The command line calls the library; nothing in the library imports it.
"""
from ppo_ref.cli.common import (DEFAULT_ENV, DEFAULT_TIMESTEPS, TRAINERS, UsageError,
                                trainer_class, user_input)
from ppo_ref.cli.main import SUBCOMMANDS, build_parser, main, register_subcommand
from ppo_ref.cli.plot import EV_RANGE, learning_curve_figure
from ppo_ref.cli.train import (build_config, default_policy, default_timesteps,
                               make_unique_dir, preset_names, run_dir_lock, run_training)

__all__ = ["main", "build_parser", "SUBCOMMANDS", "TRAINERS", "UsageError",
           "user_input", "register_subcommand", "trainer_class", "build_config", "make_unique_dir",
           "preset_names", "run_dir_lock", "run_training", "default_policy", "default_timesteps",
           "DEFAULT_ENV", "DEFAULT_TIMESTEPS", "learning_curve_figure", "EV_RANGE"]
