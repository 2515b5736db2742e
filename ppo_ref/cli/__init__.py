"""The ``ppo-ref`` command line (also ``python -m ppo_ref``): one module per command.

Subcommands (each a ``configure_<name>(parser)`` and a ``cmd_<name>(args) -> int`` registered
in :data:`SUBCOMMANDS` by :mod:`ppo_ref.cli.main`; more can be added with
:func:`register_subcommand`)::

    ppo-ref train [--env ID] [--policy mlp|lstm] [--total-timesteps N] [--n-envs N] [--seed S]
                  [--run-dir DIR] [--preset NAME] [--set field=value ...] [--resume DIR]
                  [--vectorization sync|async]                  train.py
                  [--async --num-actors N --vtrace --broadcast-every K
                   --actors process|thread|ray --ray-address ADDR]              async_train.py
    ppo-ref eval DIR [--episodes N] [--deterministic] [--seed S] [--allow-import]   eval.py
    ppo-ref plot DIR [--output PATH]                                                plot.py
    ppo-ref vectors --out DIR | ppo-ref check DIR --results FILE                    vectors.py
    ppo-ref diff TRACE_A TRACE_B [--rtol R --atol A]                                diff.py
    ppo-ref details [--markdown] [--group G]                                        details.py
    ppo-ref --version                                                               main.py

:mod:`ppo_ref.cli.common` holds what the commands share (the one-line :class:`UsageError`,
the trainer table :data:`TRAINERS`, the stated bounds of counts). Mistakes in user input
(flags, files, env ids) are reported as one line ``ppo-ref <command>: error: ...`` with exit
status 2. Trainers are looked up lazily in :data:`TRAINERS` (policy kind -> "module:Class") so
``ppo_ref.train.recurrent_ppo`` and ``ppo_ref.distributed`` are imported only when used. The
command line calls the library; nothing in the library imports it.
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
