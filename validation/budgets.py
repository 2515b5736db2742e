"""Print ppo_ref's budgets: the package's size and the first run's compile time.

    python validation/budgets.py            # line counts only (instant)
    python validation/budgets.py --cold     # plus the first `ppo-ref train` of an MLP and an
                                            # LSTM run with an empty NUMBA_CACHE_DIR (each in a
                                            # fresh process; about half a minute)
    python validation/budgets.py --suite    # plus the README's test command with an empty
                                            # NUMBA_CACHE_DIR (the whole suite: minutes)

Budgets (issue 22): the package at most 14,000 lines and ``ppo_ref/train/`` at most 2,000
(``wc -l`` of every ``.py`` file, docstrings and comments included); with an empty numba cache
the first ``ppo-ref train`` (CartPole-v1, MLP) at most 15 s of wall time on a 2-core machine and
the first LSTM run (``--env ppo_ref/CartPoleNoVel-v1``) at most 20 s; the README's test command
(``python -m pytest -q`` in the repository root, every optional extra installed as CI installs
them, an empty NUMBA_CACHE_DIR) at most 5 minutes on an idle 2-core machine. The times are
measurements, printed with the CPU model, the load and the CPU seconds (user + system of the
command and of the processes it waited for: on a machine shared with other work the wall time
grows, the CPU time much less; Ray's daemons are not counted; the README's figures come from
this script). Exit status 1 when a budget is exceeded.

``tests/test_budgets.py`` keeps each line count within its budget, or, while a count is still
over its budget, within its :data:`LINE_CEILINGS` entry: the size reached so far (lower it when
the package shrinks; raise it only when features an issue asks for outgrow the cuts, the commit
saying which; delete the entry once the budget holds).
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Tuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ppo_ref"
LINE_BUDGETS = {"ppo_ref": 14_000, "ppo_ref/train": 2_000}
#: Line counts not yet within their budget: the most they may be (module docstring).
LINE_CEILINGS = {"ppo_ref": 19_081}
COLD_BUDGETS = {"CartPole-v1": 15.0, "ppo_ref/CartPoleNoVel-v1": 20.0}
#: Seconds of wall time of the README's test command on an idle 2-core machine.
SUITE_BUDGET = 300.0


def lines(path: Path) -> int:
    """Lines of every ``.py`` file under ``path`` (as ``wc -l`` counts them)."""
    return sum(p.read_bytes().count(b"\n") for p in path.rglob("*.py")
               if "__pycache__" not in p.parts)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        match = re.search(r"Model name:\s*(.+)", out)
        if match:
            return match.group(1).strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cold_start(env_id: str) -> Tuple[float, float]:
    """Wall and CPU (user + system) seconds of ``python -m ppo_ref train --env env_id --quiet``
    with an empty ``NUMBA_CACHE_DIR`` (a fresh directory), the zoo's settings and timesteps."""
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as runs:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache,
                   PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([sys.executable, "-m", "ppo_ref", "train", "--env", env_id,
                              "--quiet", "--run-dir", os.path.join(runs, "run")],
                             capture_output=True, text=True, env=env, cwd=runs)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode != 0:
        raise SystemExit(f"ppo-ref train --env {env_id} failed:\n{out.stderr[-2000:]}")
    print(f"  {out.stdout.strip().splitlines()[-1]}")
    return wall, cpu


def suite_time() -> Tuple[float, float, str]:
    """Wall and CPU (user + system) seconds of the README's test command, ``python -m pytest
    -q`` in the repository root, with an empty ``NUMBA_CACHE_DIR`` (a fresh directory), and
    pytest's closing line. Raises ``SystemExit`` when a test fails."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([sys.executable, "-m", "pytest", "-q"], capture_output=True,
                             text=True, env=env, cwd=ROOT)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = out.stdout.strip().splitlines() or [""]
    if out.returncode != 0:
        raise SystemExit(f"python -m pytest -q failed (exit {out.returncode}):\n"
                         f"{out.stdout[-3000:]}{out.stderr[-2000:]}")
    return wall, cpu, lines[-1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cold", action="store_true", help="also time the first runs")
    parser.add_argument("--suite", action="store_true",
                        help="also time the README's test command (the whole suite)")
    args = parser.parse_args(argv)
    over = False
    for rel, budget in LINE_BUDGETS.items():
        n = lines(ROOT / rel)
        over |= n > budget
        ceiling = f", ceiling {LINE_CEILINGS[rel]:,}" if rel in LINE_CEILINGS else ""
        print(f"{rel + '/':16s} {n:6d} lines (budget {budget:,}{ceiling})")
    if args.cold:
        print(f"first runs with an empty numba cache, {cpu_model()}, "
              f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}:")
        for env_id, budget in COLD_BUDGETS.items():
            wall, cpu = cold_start(env_id)
            over |= wall > budget
            print(f"{env_id:28s} {wall:6.1f} s wall (budget {budget:.0f} s), {cpu:6.1f} s CPU")
    if args.suite:
        print(f"the README's test command with an empty numba cache, {cpu_model()}, "
              f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}:")
        wall, cpu, summary = suite_time()
        over |= wall > SUITE_BUDGET
        print(f"  {summary}")
        print(f"{'python -m pytest -q':28s} {wall:6.1f} s wall (budget {SUITE_BUDGET:.0f} s), "
              f"{cpu:6.1f} s CPU")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
