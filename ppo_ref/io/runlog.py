"""Run directories: ``config.json`` (what was run, with a random ``run_id`` that every
checkpoint repeats), ``metrics.csv`` (one row per update, floats by ``repr``), ``timing.csv``
(fps, seconds, wall clock per update), ``episodes.csv`` (one row per finished episode) and
``checkpoint.npz``. Nothing is lost to a crash or a kill -9 at any instant: the CSVs are only
appended to while a run trains and ``fsync``-ed before every checkpoint; every file that is
rewritten (config.json, the CSVs cut back to the checkpoint on resume, the checkpoint) is
replaced atomically (:func:`ppo_ref.io.checkpoint.write_atomic`).
"""
from __future__ import annotations

import csv
import json
import os
import sys
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, TextIO

import numpy as np

from ppo_ref._checks import one_line
from ppo_ref.io.checkpoint import remove_stale_temporaries, write_atomic

__all__ = ["RunLogger", "METRIC_COLUMNS", "TIMING_COLUMNS", "EPISODE_COLUMNS", "RUN_FILES",
           "default_run_dir", "mean_last", "read_csv", "read_run_config", "MAX_CONFIG_BYTES"]

METRIC_COLUMNS = (
    "update", "timesteps", "episodes", "ep_return_mean20", "policy_loss", "value_loss",
    "entropy", "loss", "approx_kl", "clip_fraction", "explained_variance", "grad_norm",
    "learning_rate", "clip_range", "n_epochs_run", "n_gradient_steps", "kl_stopped",
    "first_max_abs_log_ratio", "progress_remaining",
)
TIMING_COLUMNS = ("update", "timesteps", "fps", "time_rollout", "time_update", "wall_time")
EPISODE_COLUMNS = ("episode", "env", "return", "length", "timesteps", "update")
#: The files a run writes in its directory.
RUN_FILES = ("config.json", "metrics.csv", "timing.csv", "episodes.csv", "checkpoint.npz")
_INTEGER_METRICS = frozenset({"n_epochs_run", "n_gradient_steps", "kl_stopped"})


def default_run_dir(env_id: str, policy: str, seed: int, root: str = "runs") -> str:
    """``runs/<env>-<policy>-seed<S>-<YYYYmmdd-HHMMSS>`` (``/`` in env ids becomes ``_``)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = str(env_id).replace("/", "_").replace(":", "_")
    return os.path.join(root, f"{safe}-{policy}-seed{seed}-{stamp}")


def mean_last(values, n: int = 20) -> float:
    """Mean of the last ``n`` values (nan when there are none)."""
    vals = list(values)[-n:]
    return float(np.mean(vals)) if vals else float("nan")


def _fmt(value) -> str:
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    return str(value)


def read_csv(path: str) -> Dict[str, np.ndarray]:
    """Columns of a run-directory CSV as float64 arrays (``{}`` when empty); a last row cut
    short is ignored, a malformed complete row raises ``ValueError``."""
    with open(path, newline="", encoding="utf-8", errors="replace") as fh:
        lines = fh.read().split("\n")[:-1]  # complete lines only
    rows = list(csv.reader(line + "\n" for line in lines))
    if len(rows) < 2:
        return {}
    header, body = rows[0], rows[1:]
    for i, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise ValueError(f"line {i} has {len(row)} fields, the header {len(header)}")
    return {k: np.array([float(r[j]) if r[j] not in ("", "None") else np.nan for r in body])
            for j, k in enumerate(header)}


def _truncate_csv(path: str, column: str, limit: float) -> Optional[float]:
    """Keep the complete, readable rows whose ``column`` is a number <= ``limit`` (later rows
    would appear twice after a resume), bytes unchanged; the file is replaced atomically when a
    line goes, removed without a complete header. Returns the largest value kept (or None)."""
    if not os.path.exists(path):
        return None
    with open(path, "rb") as fh:
        data = fh.read()
    lines = data.split(b"\n")[:-1]  # complete lines only
    header = _parse_line(lines[0]) if lines else None
    if header is None or column not in header:
        os.remove(path)
        return None
    idx = header.index(column)
    kept, last = [lines[0]], None
    for line in lines[1:]:
        row = _parse_line(line)
        if row is None or len(row) != len(header):
            continue
        try:
            value = float(row[idx])
        except ValueError:
            continue
        if value <= limit:
            kept.append(line)
            last = value if last is None else max(last, value)
    text = b"".join(line + b"\n" for line in kept)
    if text != data:
        write_atomic(path, text)
    return last


def _parse_line(line: bytes) -> Optional[List[str]]:
    """The fields of one CSV line, or None for one with NUL bytes or not UTF-8."""
    if b"\x00" in line:
        return None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None
    rows = list(csv.reader([text + "\n"]))
    return rows[0] if rows else []


#: The largest config.json a resume reads (bytes): far above any run's (a few kB).
MAX_CONFIG_BYTES = 16 * 2 ** 20


def read_run_config(path: str) -> Dict[str, Any]:
    """The JSON object of a run's ``config.json`` (at most :data:`MAX_CONFIG_BYTES` are read).
    ``ValueError`` naming the file when it is larger, not UTF-8, not JSON, nested too deep or
    not an object; ``OSError`` when it cannot be read."""
    with open(path, "rb") as fh:
        data = fh.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ValueError(f"{path} is larger than the limit of {MAX_CONFIG_BYTES} bytes")
    try:
        info = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError(f"{path} nests deeper than the JSON parser allows") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path} is not valid JSON ({one_line(exc, 200)})") from None
    if not isinstance(info, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return info


class RunLogger:
    """Writes a run directory and prints progress; pass :meth:`callback` to a trainer's
    ``learn`` (any trainer with PPOTrainer's counters and checkpoint methods).

    ``run_info``: JSON-safe dict for ``config.json`` (on resume the first run's is kept, with
    ``resumed_at`` and ``resume_argv`` appended); ``resume_from``: the resumed state's
    ``n_updates`` and ``num_timesteps`` (CSV rows after it are dropped), or None;
    ``progress_every``/``checkpoint_every``: seconds between progress lines / checkpoints;
    ``stream``: where progress goes (stdout).
    """
    def __init__(self, run_dir: str, run_info: Dict[str, Any], *,
                 resume_from: Optional[Dict[str, int]] = None, progress_every: float = 2.0,
                 checkpoint_every: float = 60.0, stream: Optional[TextIO] = None,
                 quiet: bool = False):
        self.run_dir = run_dir
        os.makedirs(run_dir, exist_ok=True)
        self.config_path = os.path.join(run_dir, "config.json")
        self.metrics_path = os.path.join(run_dir, "metrics.csv")
        self.timing_path = os.path.join(run_dir, "timing.csv")
        self.episodes_path = os.path.join(run_dir, "episodes.csv")
        self.checkpoint_path = os.path.join(run_dir, "checkpoint.npz")
        self.progress_every = float(progress_every)
        self.checkpoint_every = float(checkpoint_every)
        self.stream = stream if stream is not None else sys.stdout
        self.quiet = quiet
        self.stop_requested = False
        self.snapshot: Optional[Dict[str, np.ndarray]] = None
        self.snapshot_timesteps = -1
        #: one-line warnings found on resume (the caller prints them)
        self.notes: List[str] = []
        #: extra JSON-safe checkpoint metadata (the policy version), captured with each snapshot
        self.extra_metadata: Optional[Callable[[], Dict[str, Any]]] = None
        #: text appended to each progress line (the actor-learner's policy lag)
        self.progress_suffix: Optional[Callable[[], str]] = None
        self.snapshot_metadata: Dict[str, Any] = {}
        # a writer killed mid-replace leaves its temporary file: the lock is held, clear them
        remove_stale_temporaries(run_dir, RUN_FILES)
        if resume_from is None:
            info = dict(run_info)
            for p in (self.metrics_path, self.timing_path, self.episodes_path,
                      os.path.join(run_dir, "error.log")):  # a failed earlier attempt's
                if os.path.exists(p):
                    os.remove(p)
        else:
            info = read_run_config(self.config_path) if os.path.exists(self.config_path) else {}
            info.setdefault("resumed_at", []).append(int(resume_from["num_timesteps"]))
            resume_info = dict(run_info)
            if "argv" in resume_info:
                info.setdefault("resume_argv", []).append(resume_info.pop("argv"))
            if "total_timesteps" in resume_info:
                info["total_timesteps"] = resume_info.pop("total_timesteps")
            for k, v in resume_info.items():
                info.setdefault(k, v)
            updates = int(resume_from["n_updates"])
            last = _truncate_csv(self.metrics_path, "update", updates)
            for path in (self.timing_path, self.episodes_path):
                _truncate_csv(path, "update", updates)
            if updates and (last or 0) < updates:
                self.notes.append(
                    f"metrics.csv holds updates up to {int(last or 0)}, the checkpoint is at "
                    f"update {updates}: the rows between were lost before this resume (the run "
                    "continues exactly; those rows stay missing)")
        self.run_id = str(info.setdefault("run_id", uuid.uuid4().hex))
        write_atomic(self.config_path,
                     (json.dumps(info, indent=2, sort_keys=True) + "\n").encode("utf-8"))
        self._metrics = self._open(self.metrics_path, METRIC_COLUMNS)
        self._timing = self._open(self.timing_path, TIMING_COLUMNS)
        self._episodes = self._open(self.episodes_path, EPISODE_COLUMNS)
        self._start = self._last_progress = self._last_checkpoint = time.perf_counter()
        self._start_timesteps: Optional[int] = None
        # (clock, timesteps) after this process's first update (compiling): the fps/ETA origin
        self._rate_mark: Optional[tuple] = None

    @staticmethod
    def _open(path: str, columns) -> tuple:
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        fh = open(path, "a", newline="")
        w = csv.writer(fh)
        if new:
            w.writerow(columns)
            fh.flush()
        return (fh, w)

    def begin(self, trainer) -> None:
        """Start the clocks (call right before ``learn``; fps/ETA count steps from here)."""
        now = time.perf_counter()
        self._start = self._last_progress = self._last_checkpoint = now
        self._start_timesteps = int(trainer.num_timesteps)
        self._rate_mark = None

    def request_stop(self) -> None:
        """Stop at the next rollout boundary (the callback returns False)."""
        self.stop_requested = True

    def callback(self, trainer, stats: Dict[str, float]) -> bool:
        """Log one update; refresh the last-good snapshot; print/checkpoint when due."""
        if self._start_timesteps is None:
            self._start_timesteps = 0
        update = int(trainer.n_updates)
        row = {**stats, "update": update, "timesteps": int(trainer.num_timesteps),
               "episodes": int(trainer.n_episodes),
               "ep_return_mean20": mean_last(trainer.recent_returns, 20)}
        for key in _INTEGER_METRICS & row.keys():
            value = row[key]
            if isinstance(value, (int, float, np.integer, np.floating)) \
                    and float(value).is_integer():
                row[key] = int(value)
        self._metrics[1].writerow([_fmt(row.get(c, float("nan"))) for c in METRIC_COLUMNS])
        now = time.perf_counter()
        timing = {"update": update, "timesteps": int(trainer.num_timesteps),
                  "wall_time": now - self._start}
        self._timing[1].writerow([_fmt(timing.get(c, stats.get(c, float("nan"))))
                                  for c in TIMING_COLUMNS])
        first = int(trainer.n_episodes) - len(trainer.last_episodes)
        for j, (env_index, ret, length) in enumerate(trainer.last_episodes):
            self._episodes[1].writerow([first + j, int(env_index), _fmt(float(ret)), int(length),
                                        int(trainer.num_timesteps), update])
        self.snapshot = trainer.state_arrays()
        self.snapshot_metadata = self._extra_metadata()
        self.snapshot_timesteps = int(trainer.num_timesteps)
        done = trainer.num_timesteps >= trainer.total_timesteps
        if done or now - self._last_progress >= self.progress_every:
            self.progress(trainer, stats)
            self._last_progress = now
        if self._rate_mark is None:
            self._rate_mark = (time.perf_counter(), int(trainer.num_timesteps))
        if now - self._last_checkpoint >= self.checkpoint_every:
            self.save(trainer)
            self._last_checkpoint = now
        return not self.stop_requested

    def progress(self, trainer, stats: Optional[Dict[str, float]] = None) -> None:
        """Print steps, updates, episodes, mean return of the last 20, fps, elapsed, ETA (rate
        since this process's first update; before it, the rate so far and no ETA)."""
        if self.quiet:
            return
        now = time.perf_counter()
        elapsed = now - self._start
        steps = int(trainer.num_timesteps)
        mark = self._rate_mark
        if mark is not None and steps > mark[1] and now > mark[0]:
            fps = (steps - mark[1]) / (now - mark[0])
        else:
            done_here = steps - int(self._start_timesteps or 0)
            fps = done_here / elapsed if elapsed > 0 else float("nan")
        left = max(int(trainer.total_timesteps) - steps, 0)
        if left == 0:
            eta_text = f"{0.0:6.1f}s"
        elif mark is not None and fps > 0:
            eta_text = f"{left / fps:6.1f}s"
        else:
            eta_text = f"{'-':>7}"
        ret = mean_last(trainer.recent_returns, 20)
        width = len(str(int(trainer.total_timesteps)))
        line = (f"steps {steps:>{width}}/{int(trainer.total_timesteps)} | "
                f"updates {int(trainer.n_updates)} | episodes {int(trainer.n_episodes)} | "
                f"return(last 20) {ret:8.2f} | fps {fps:7.0f} | elapsed {elapsed:6.1f}s | "
                f"ETA {eta_text}")
        if self.progress_suffix is not None:
            line += self.progress_suffix()
        print(line, file=self.stream, flush=True)

    def closing_line(self, trainer, extra: str = "") -> str:
        """``ppo-ref: done: <steps> steps, <updates> updates, <episodes> episodes, return(last
        20) <mean>, <wall>s -> <run_dir>`` (wall time of this process's training), then
        `` | extra``."""
        wall = time.perf_counter() - self._start
        ret = mean_last(trainer.recent_returns, 20)
        line = (f"ppo-ref: done: {int(trainer.num_timesteps)} steps, {int(trainer.n_updates)} "
                f"updates, {int(trainer.n_episodes)} episodes, return(last 20) {ret:.2f}, "
                f"{wall:.1f}s -> {self.run_dir}")
        return f"{line} | {extra}" if extra else line

    def finish(self, trainer, extra: str = "") -> None:
        """Print :meth:`closing_line` to the progress stream (also when ``quiet``)."""
        print(self.closing_line(trainer, extra), file=self.stream, flush=True)

    def flush(self, sync: bool = False) -> None:
        """Flush the CSV files; with ``sync`` also ``fsync`` them."""
        for fh, _ in (self._metrics, self._timing, self._episodes):
            fh.flush()
            if sync:
                os.fsync(fh.fileno())

    def _extra_metadata(self) -> Dict[str, Any]:
        extra = {"run_id": self.run_id}
        if self.extra_metadata is not None:
            extra.update(self.extra_metadata())
        return extra

    def save(self, trainer, arrays: Optional[Dict[str, np.ndarray]] = None,
             extra: Optional[Dict[str, Any]] = None) -> str:
        """Write ``checkpoint.npz`` (``arrays``, else the trainer's state) atomically after the
        CSV rows it covers are ``fsync``-ed; metadata: the trainer's, the run id and
        :attr:`extra_metadata` (``extra``: those captured with the snapshot)."""
        self.flush(sync=True)
        if arrays is None:
            arrays, extra = trainer.state_arrays(), None
        metadata = dict(trainer.checkpoint_metadata(arrays))
        metadata.update(self._extra_metadata() if extra is None else extra)
        return trainer.save(self.checkpoint_path, arrays, metadata)

    def save_last_good(self, trainer) -> Optional[str]:
        """Write the snapshot of the last completed update; None when there is none."""
        if self.snapshot is None:
            return None
        return self.save(trainer, self.snapshot, self.snapshot_metadata)

    def close(self) -> None:
        for fh, _ in (self._metrics, self._timing, self._episodes):
            fh.close()
