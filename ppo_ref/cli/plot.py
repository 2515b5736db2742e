"""``ppo-ref plot DIR``: the learning curves of a run as one PNG."""
from __future__ import annotations

import argparse
import os
import sys

from ppo_ref.cli.common import UsageError, user_input

__all__ = ["configure_plot", "cmd_plot", "learning_curve_figure", "EV_RANGE"]


def configure_plot(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="DIR",
                   help="a run directory, or a --seeds directory (then: every seed's curve, "
                        "their mean and +- 1 std)")
    p.add_argument("--output", default=None,
                   help="PNG path (default DIR/learning_curve.png; a --seeds directory: "
                        "DIR/learning_curves.png)")
    p.epilog = ("panels: episode returns (and the mean of the last 20); approx_kl and "
                "clip_fraction; entropy; explained variance on its own panel with its y axis "
                "fixed to [-1, 1] (it is at most 1 and unbounded below: values under -1, common "
                "in early updates, are drawn on the lower edge as red triangles and counted)")


#: The y range of the explained-variance panel (at most 1, unbounded below: values under it are
#: drawn on its lower edge and counted, so an outlier never rescales the panel).
EV_RANGE = (-1.0, 1.0)


def learning_curve_figure(plt, episodes, metrics, title: str):
    """The figure of ``ppo-ref plot`` (the panels of its epilog, x axis: env steps; explained
    variance in :data:`EV_RANGE`) from :func:`ppo_ref.io.runlog.read_csv` columns ``episodes``
    and ``metrics`` (``{}`` for an empty file). Returns the matplotlib figure."""
    import numpy as np
    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    ax = axes[0]
    if episodes:
        ax.plot(episodes["timesteps"], episodes["return"], ".", alpha=0.25, markersize=3,
                label="episode")
        r = episodes["return"]
        rolling = np.array([r[max(0, i - 19):i + 1].mean() for i in range(len(r))])
        ax.plot(episodes["timesteps"], rolling, label="mean of last 20")
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no episode has ended yet", ha="center", transform=ax.transAxes)
    ax.set_ylabel("episode return")
    ax.set_title("learning curve")
    if metrics:
        steps = metrics["timesteps"]
        axes[1].plot(steps, metrics["approx_kl"], label="approx_kl")
        axes[1].plot(steps, metrics["clip_fraction"], label="clip_fraction")
        axes[1].legend()
        axes[2].plot(steps, metrics["entropy"], label="entropy")
        axes[2].legend()
        ev = metrics["explained_variance"]
        low, high = EV_RANGE
        below = ev < low
        axes[3].plot(steps, np.clip(ev, low, high), label="explained_variance")
        if below.any():
            axes[3].plot(steps[below], np.full(int(below.sum()), low), "v", color="tab:red",
                         label=f"{int(below.sum())} update(s) below {low:g}")
        axes[3].legend()
    else:
        for a in axes[1:]:
            a.text(0.5, 0.5, "no update has completed yet", ha="center", transform=a.transAxes)
    axes[3].set_ylim(*EV_RANGE)
    axes[3].set_title(f"explained variance (axis fixed to [{EV_RANGE[0]:g}, {EV_RANGE[1]:g}])")
    for a in axes:
        a.set_xlabel("env steps")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def cmd_plot(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.run_dir):
        raise UsageError(f"{args.run_dir} is not a run directory ("
                         f"{'a file' if os.path.exists(args.run_dir) else 'it does not exist'})")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("needs matplotlib: install the plot extra (pip install -e '.[plot]' in a "
                         "checkout, or pip install matplotlib)") from None
    from ppo_ref.io.runlog import read_csv
    from ppo_ref.cli.seeds import read_seed_runs, seeds_figure
    with user_input(f"cannot read the seeds of {args.run_dir}"):
        curves = read_seed_runs(args.run_dir)
    if curves:
        title = os.path.basename(os.path.normpath(args.run_dir))
        return _save_figure(plt, seeds_figure(plt, curves, title),
                            args.output or os.path.join(args.run_dir, "learning_curves.png"))
    episodes_path = os.path.join(args.run_dir, "episodes.csv")
    metrics_path = os.path.join(args.run_dir, "metrics.csv")
    missing = [os.path.basename(p) for p in (episodes_path, metrics_path)
               if not os.path.exists(p)]
    if missing:
        raise UsageError(f"{args.run_dir} has no {' and no '.join(missing)}")
    columns = {}
    for path, needed in ((episodes_path, ("timesteps", "return")),
                         (metrics_path, ("timesteps", "approx_kl", "clip_fraction",
                                         "explained_variance", "entropy"))):
        with user_input(f"cannot read {path}"):
            try:
                table = read_csv(path)
            except (KeyError, TypeError):  # short or ragged rows
                raise ValueError("malformed CSV") from None
        if table and any(name not in table for name in needed):
            raise UsageError(f"cannot read {path}: missing columns "
                             f"{[name for name in needed if name not in table]}")
        columns[path] = table
    if not columns[metrics_path]:
        drawn = "only episode returns are drawn" if columns[episodes_path] else "it is empty"
        print(f"ppo-ref plot: note: {args.run_dir} has no completed update yet: {drawn}",
              file=sys.stderr)
    fig = learning_curve_figure(plt, columns[episodes_path], columns[metrics_path],
                                os.path.basename(os.path.normpath(args.run_dir)))
    return _save_figure(plt, fig, args.output or os.path.join(args.run_dir, "learning_curve.png"))


def _save_figure(plt, fig, out: str) -> int:
    """Write ``fig`` to ``out`` atomically (the format from its extension) and close it."""
    try:
        with user_input(f"cannot write {out}"):
            import io
            from ppo_ref.io.checkpoint import write_atomic
            if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
                raise FileNotFoundError(2, "No such file or directory", out)
            image = io.BytesIO()  # the whole image first, then replaced at once
            fig.savefig(image, dpi=100, format=os.path.splitext(out)[1][1:].lower() or "png")
            write_atomic(out, image.getvalue())
    finally:
        plt.close(fig)
    print(f"wrote {out}")
    return 0
