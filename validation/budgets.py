"""Print ppo_ref's budgets: the package's size and the first run's compile time.

    python validation/budgets.py            # line counts only (instant)
    python validation/budgets.py --cold     # plus the first `ppo-ref train` of an MLP and an
                                            # LSTM run with an empty NUMBA_CACHE_DIR (each in a
                                            # fresh process; about half a minute)

Budgets (issue 22): the package at most 14,000 lines and ``ppo_ref/train/`` at most 2,000
(``wc -l`` of every ``.py`` file, docstrings and comments included); with an empty numba cache
the first ``ppo-ref train`` (CartPole-v1, MLP) at most 15 s of wall time on a 2-core machine and
the first LSTM run (``--env ppo_ref/CartPoleNoVel-v1``) at most 20 s. The times are
measurements, printed with the CPU model and the run's CPU seconds (user + system: on a machine
shared with other work the wall time grows, the CPU time much less; the README's figures come
from this script). Exit status 1 when a budget is exceeded.

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
LINE_CEILINGS = {"ppo_ref": 19_547}
COLD_BUDGETS = {"CartPole-v1": 15.0, "ppo_ref/CartPoleNoVel-v1": 20.0}


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cold", action="store_true", help="also time the first runs")
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
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
