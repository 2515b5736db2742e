"""``ppo-ref train --seeds 0-7``: one run per seed, several at once, and how they vary.

Each seed is an ordinary run (``ppo-ref train --seed S --run-dir DIR/seedS``, its own process,
``--jobs`` of them at a time: one per core by default), so each can be resumed, evaluated and
plotted on its own. When they end, ``DIR/summary.json`` (replaced atomically) and the printed
table give, over the seeds, the mean, sample standard deviation (``ddof=1``; 0 for one seed),
min and max of the final return (the mean of each run's last 20 episode returns, as its closing
line) and of the training speed (env steps per second of rollouts and updates from the second
update on, the first one's compiling left out; from ``timing.csv``). ``ppo-ref plot DIR`` draws
the seeds' mean learning curve and its spread (:func:`seeds_figure`).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List

import numpy as np

from ppo_ref.cli.common import STOP_SIGNALS, Terminated, UsageError

__all__ = ["parse_seeds", "cmd_train_seeds", "read_seed_runs", "seeds_figure", "SUMMARY_FILE",
           "seeds_hint"]

SUMMARY_FILE = "summary.json"
MAX_SEEDS = 256


def seeds_hint(run_dir: str) -> str:
    """For an error about ``run_dir``: what to give instead when it is a ``--seeds`` directory
    (one seed's run, ``DIR/seed<S>``, names the first), else ``""``."""
    try:
        seeds = sorted(d for d in os.listdir(run_dir)
                       if d.startswith("seed") and d[4:].isdigit()
                       and os.path.isdir(os.path.join(run_dir, d)))
    except OSError:
        return ""
    return (f" ({run_dir} holds the runs of --seeds: give one seed's run, e.g. "
            f"{os.path.join(run_dir, seeds[0])})") if seeds else ""


def parse_seeds(text: str) -> List[int]:
    """The seeds of ``--seeds``: comma-separated seeds and inclusive ranges (``0-7``,
    ``0,3,5``, ``0-3,10``), each in [0, 2**63 - 1], no repeats, at most :data:`MAX_SEEDS`.
    Raises :class:`UsageError` naming ``--seeds``."""
    seeds: List[int] = []
    for part in str(text).split(","):
        first, sep, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if sep else low
        except ValueError:
            raise UsageError(f"--seeds takes seeds and ranges like 0-7 or 0,3,5; got "
                             f"{text!r}") from None
        if not 0 <= low <= high <= 2**63 - 1:
            raise UsageError(f"--seeds: {part.strip()!r} is not a seed or an increasing range "
                             f"of seeds in [0, 2**63 - 1]")
        if high - low >= MAX_SEEDS:
            raise UsageError(f"--seeds: at most {MAX_SEEDS} seeds, got {part.strip()!r}")
        seeds.extend(range(low, high + 1))
        if len(seeds) > MAX_SEEDS:
            raise UsageError(f"--seeds must list at most {MAX_SEEDS} seeds, got {text!r}")
    repeated = sorted(seed for seed, n in collections.Counter(seeds).items() if n > 1)
    if repeated:
        raise UsageError(f"--seeds lists seed {repeated[0]} more than once: {text!r}")
    return seeds


def _child_argv(args: argparse.Namespace, seed: int, run_dir: str) -> List[str]:
    """The ``ppo-ref train`` command line of one seed: the settings given to ``--seeds``."""
    argv = [sys.executable, "-m", "ppo_ref", "train", "--seed", str(seed), "--run-dir", run_dir,
            "--quiet", "--threads", str(args.threads),
            "--checkpoint-every", repr(args.checkpoint_every)]
    for flag, value in (("--env", args.env), ("--policy", args.policy),
                        ("--total-timesteps", args.total_timesteps), ("--n-envs", args.n_envs),
                        ("--preset", args.preset), ("--backend", args.backend),
                        ("--vectorization", args.vectorization)):
        if value is not None:
            argv += [flag, str(value)]
    for override in args.overrides:
        argv += ["--set", override]
    return argv


def _seed_result(run_dir: str) -> Dict[str, Any]:
    """Final return, episodes, steps and training speed of one seed's run directory."""
    from ppo_ref.io.runlog import mean_last, read_csv
    result: Dict[str, Any] = {"final_return": None, "episodes": 0, "timesteps": 0,
                              "steps_per_second": None}
    try:
        episodes = read_csv(os.path.join(run_dir, "episodes.csv"))
        timing = read_csv(os.path.join(run_dir, "timing.csv"))
    except (OSError, KeyError, TypeError, ValueError):
        return result
    if episodes:
        result["final_return"] = float(mean_last(episodes["return"], 20))
        result["episodes"] = int(episodes["return"].size)
    if timing:
        steps = timing["timesteps"]
        result["timesteps"] = int(steps[-1])
        seconds = float(np.sum(timing["time_rollout"][1:]) + np.sum(timing["time_update"][1:]))
        if steps.size > 1 and seconds > 0:
            result["steps_per_second"] = float(steps[-1] - steps[0]) / seconds
    return result


def _statistics(values: List[float]) -> Dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    return {"n": int(a.size), "mean": float(a.mean()),
            "std": float(a.std(ddof=1)) if a.size > 1 else 0.0,
            "min": float(a.min()), "max": float(a.max())}


def _raise_terminated(signum, frame):
    raise Terminated(signum)


def _raise_interrupted(signum, frame):
    raise KeyboardInterrupt


def _start(args: argparse.Namespace, seed: int, run_dir: str) -> Dict[str, Any]:
    """Start the run of ``seed`` (its output to ``run_dir/seed<S>.log``)."""
    seed_dir = os.path.join(run_dir, f"seed{seed}")
    with open(os.path.join(run_dir, f"seed{seed}.log"), "wb") as log:  # the child keeps its fd
        # its own process group: a terminal's Ctrl-C reaches the parent only, which passes it
        # on once (:func:`_stop`), as it does a SIGINT sent to the parent alone
        proc = subprocess.Popen(_child_argv(args, seed, seed_dir), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                process_group=0)
    return {"proc": proc, "start": time.perf_counter(), "run_dir": seed_dir}


def _finished(seed: int, child: Dict[str, Any]) -> Dict[str, Any]:
    code = child["proc"].returncode  # killed by signal s (-s): 128 + s, as the shell says
    return dict(seed=seed, run_dir=child["run_dir"], exit_code=code if code >= 0 else 128 - code,
                wall_seconds=time.perf_counter() - child["start"],
                **_seed_result(child["run_dir"]))


def _stop(running: Dict[int, Dict[str, Any]], terminate_now: bool, grace: float = 60.0) -> None:
    """Stop the running seeds as ``ppo-ref train`` stops: after one Ctrl-C (passed on to each
    seed as one SIGINT) each finishes its update and saves; a second Ctrl-C, a SIGTERM
    (``terminate_now``) or ``grace`` seconds without an end send each SIGTERM (it saves its
    last completed update at once); ``grace`` seconds after that, SIGKILL."""
    procs = [child["proc"] for child in running.values()]
    sent = []
    if not terminate_now:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)

    def terminate(signum=None, frame=None):
        if not sent:
            sent.append(True)
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)

    def wait(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)

    previous = {sig: signal.signal(sig, terminate) for sig in (signal.SIGINT, *STOP_SIGNALS)}
    try:
        if terminate_now:
            terminate()
        wait(grace)
        terminate()
        wait(grace)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cmd_train_seeds(args: argparse.Namespace, run_dir: str) -> int:
    """Run every seed of ``args.seeds`` in ``run_dir/seed<S>`` (``args.jobs`` at a time), then
    write and print the summary. Ctrl-C or SIGTERM stops every running seed (:func:`_stop`:
    each saves, as ``ppo-ref train`` does) and still writes the summary of the seeds that
    ran; the seeds not started are named. Exit status: 0 when every seed finished, 130 after
    Ctrl-C, 143 after SIGTERM, else 3 (the failed seeds' logs are named)."""
    from ppo_ref.io.checkpoint import write_atomic
    seeds = parse_seeds(args.seeds)
    jobs = max(1, min(args.jobs or os.cpu_count() or 1, len(seeds)))
    print(f"ppo-ref: {len(seeds)} seeds, {jobs} at a time -> {run_dir}")
    pending, running, runs = list(seeds), {}, {}
    interrupted = None
    # set here, not inherited: a shell's background job starts with Ctrl-C ignored
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, _raise_interrupted),
                **{sig: signal.signal(sig, _raise_terminated) for sig in STOP_SIGNALS}}
    try:
        while pending or running:
            while pending and len(running) < jobs:
                seed = pending.pop(0)
                running[seed] = _start(args, seed, run_dir)
            time.sleep(0.05)
            for seed, child in list(running.items()):
                if child["proc"].poll() is None:
                    continue
                del running[seed]
                runs[seed] = _finished(seed, child)
                ret = runs[seed]["final_return"]
                print(f"  seed {seed}: exit {runs[seed]['exit_code']}, return(last 20) "
                      f"{'-' if ret is None else f'{ret:.2f}'}, "
                      f"{runs[seed]['wall_seconds']:.1f}s")
    except KeyboardInterrupt as stop:
        interrupted = stop.code if isinstance(stop, Terminated) else 130
        _stop(running, terminate_now=isinstance(stop, Terminated))
        runs.update({seed: _finished(seed, child) for seed, child in running.items()})
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    ordered = [runs[s] for s in seeds if s in runs]
    summary: Dict[str, Any] = {"argv": args.argv, "seeds": seeds, "runs": ordered,
                               "not_started": pending}
    for key in ("final_return", "steps_per_second"):
        values = [r[key] for r in ordered if r["exit_code"] == 0 and r[key] is not None]
        summary[key] = _statistics(values) if values else None
    write_atomic(os.path.join(run_dir, SUMMARY_FILE),
                 (json.dumps(summary, indent=2) + "\n").encode("utf-8"))
    for key, label in (("final_return", "return(last 20)"), ("steps_per_second", "steps/s")):
        s = summary[key]
        if s is not None:
            print(f"ppo-ref: {label} over {s['n']} seeds: mean {s['mean']:.2f}, std "
                  f"{s['std']:.2f}, min {s['min']:.2f}, max {s['max']:.2f}")
    failed = [r for r in ordered if r["exit_code"] != 0]
    for r in failed:
        print(f"ppo-ref: seed {r['seed']} ended with exit status {r['exit_code']}: see "
              f"{os.path.join(run_dir, 'seed%d.log' % r['seed'])}", file=sys.stderr)
    if pending:
        print(f"ppo-ref: seeds not started: {', '.join(map(str, pending))} (run them with "
              f"--seeds into another directory)", file=sys.stderr)
    print(f"ppo-ref: summary -> {os.path.join(run_dir, SUMMARY_FILE)}")
    return interrupted or (3 if failed else 0)


def read_seed_runs(run_dir: str) -> Dict[int, Dict[str, np.ndarray]]:
    """``{seed: episodes.csv columns}`` of a ``--seeds`` directory (from its summary), or ``{}``
    when ``run_dir`` is not one. Raises ``ValueError`` for a summary that is not one this
    module writes."""
    from ppo_ref.io.runlog import read_csv
    from ppo_ref.vectors.codec import read_json_file
    path = os.path.join(run_dir, SUMMARY_FILE)
    if not os.path.isfile(path):
        return {}
    summary = read_json_file(path, "--seeds summary")
    seeds = summary.get("seeds") if isinstance(summary, dict) else None
    if not (isinstance(seeds, list) and all(type(s) is int and s >= 0 for s in seeds)):
        raise ValueError(f"{path} has no list of seeds: not a ppo-ref train --seeds summary")
    curves = {}
    for seed in seeds:
        episodes = os.path.join(run_dir, f"seed{seed}", "episodes.csv")
        if os.path.isfile(episodes):
            table = read_csv(episodes)
            if table:
                curves[seed] = table
    return curves


def seeds_figure(plt, curves: Dict[int, Dict[str, np.ndarray]], title: str, points: int = 200):
    """The learning curves of several seeds: each seed's mean of its last 20 episode returns
    against env steps (thin lines), their mean over seeds (thick) and the band of one standard
    deviation (``ddof=1``, as the summary's) around it, on a common grid of ``points`` env
    steps up to the shortest run (linear interpolation; a seed counts from its first finished
    episode on)."""
    fig, ax = plt.subplots(figsize=(8, 5))
    end = min(float(c["timesteps"][-1]) for c in curves.values())
    start = max(float(c["timesteps"][0]) for c in curves.values())
    grid = np.linspace(start, end, points)
    rows = []
    for seed, c in sorted(curves.items()):
        r = c["return"]
        rolling = np.array([r[max(0, i - 19):i + 1].mean() for i in range(r.size)])
        ax.plot(c["timesteps"], rolling, linewidth=0.6, alpha=0.5, label=f"seed {seed}")
        rows.append(np.interp(grid, c["timesteps"], rolling))
    rows = np.array(rows)
    mean = rows.mean(axis=0)
    std = rows.std(axis=0, ddof=1) if len(rows) > 1 else np.zeros_like(mean)
    ax.plot(grid, mean, color="black", linewidth=2, label=f"mean of {len(rows)} seeds")
    ax.fill_between(grid, mean - std, mean + std, color="gray", alpha=0.3, label="+- 1 std")
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return (mean of last 20)")
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig
