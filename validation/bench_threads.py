"""The thread options of the two trainer benchmarks (``bench_vs_sb3.py``,
``bench_vs_sb3_recurrent.py``): ``--threads`` (ppo_ref's numba threads) and ``--torch-threads``
(torch's intra-op threads for the library compared with)."""
from __future__ import annotations

import argparse

import numba


def add_thread_options(parser: argparse.ArgumentParser, other: str) -> None:
    """Add ``--threads`` (default ``NUMBA_NUM_THREADS``, one per CPU) and ``--torch-threads``
    (default 1) to ``parser``; ``other`` names the library torch runs (for the help text)."""
    parser.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS,
                        help="ppo_ref's numba threads (default: NUMBA_NUM_THREADS, one per CPU)")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help=f"torch's intra-op threads for {other} (default 1)")


def apply_thread_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Check the two options (``parser.error`` on a value out of range); the trainers take
    ``threads=args.threads``, torch ``set_num_threads(args.torch_threads)`` where it runs."""
    if not 1 <= args.threads <= numba.config.NUMBA_NUM_THREADS:
        parser.error(f"--threads must be in [1, {numba.config.NUMBA_NUM_THREADS}] "
                     f"(NUMBA_NUM_THREADS), got {args.threads}")
    if args.torch_threads < 1:
        parser.error(f"--torch-threads must be >= 1, got {args.torch_threads}")
