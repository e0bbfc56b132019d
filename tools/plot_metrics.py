#!/usr/bin/python3
"""Training curves from the trainer's metrics files, as one PNG (matplotlib, headless).

  plot_metrics.py RUN/metrics.jsonl [MORE.jsonl ...] -o curves.png [--smooth 20] [--title TEXT]

Panels, all against the optimizer step: the loss (each step's, as a moving average of --smooth
steps, and each epoch's training and validation loss), validation top-1 and top-5 (and the moving
average's top-1 with train.ema), the learning rate, global images/s (moving average), and the
gradient's norm where step records carry one (train.clip_grad_norm or log.grad_norm; clipped steps
marked). Several files give one line each per panel, labelled by their run folder.

Per-rank files (log.jsonl with {rank}) hold each rank's step records: those of the lowest rank in
a file are plotted. A run resumed from an earlier checkpoint appends the steps it runs again: the
last record of a step wins. A last line cut short (a run killed while writing) is skipped; any
other line that is not a JSON object stops the tool with its file and line number (exit status 2).
"""
import argparse
import json
import os
import sys


def fail(msg):
    print(f"plot_metrics.py: {msg}", file=sys.stderr)
    sys.exit(2)


def read_run(path):
    """{"steps": [step records by step], "epochs": [epoch records by step]} of one metrics file."""
    try:
        with open(path) as f:
            lines = f.read().split("\n")
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    if lines and lines[-1] == "":
        lines.pop()
    steps, epochs = {}, {}
    for n, line in enumerate(lines, 1):
        try:
            r = json.loads(line)
            if not isinstance(r, dict):
                raise ValueError
        except ValueError:
            if n == len(lines):  # a killed run's last write
                continue
            fail(f"{path}:{n}: not a JSON object: {line[:60]!r}")
        kind = r.get("type")
        if kind == "step" and "step" in r:
            steps.setdefault(r.get("rank", 0), {})[r["step"]] = r
        elif kind == "epoch" and "step" in r:
            epochs[r["step"]] = r
    if not steps and not epochs:
        fail(f"{path}: no step or epoch records (is it a ringtrain metrics file?)")
    own = steps[min(steps)] if steps else {}
    return {"steps": [own[s] for s in sorted(own)], "epochs": [epochs[s] for s in sorted(epochs)]}


def moving_average(values, n):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= n:
            total -= values[i - n]
        out.append(total / min(i + 1, n))
    return out


def label_of(path, paths):
    """The run folder's name, or the path itself where two files share one."""
    name = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
    folders = [os.path.basename(os.path.dirname(os.path.abspath(p))) for p in paths]
    return name if folders.count(name) == 1 else path


def series(records, key):
    """(steps, values) of the records with a number >= 0 under key (-1 stands for none)."""
    kept = [r for r in records if isinstance(r.get(key), (int, float)) and r[key] >= 0]
    return [r["step"] for r in kept], [r[key] for r in kept]


def plot(runs, out, smooth, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_norm = any(series(run["steps"], "grad_norm")[0] for _, run in runs)
    panels = ["loss", "top1", "lr", "img_s"] + (["grad_norm"] if has_norm else [])
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels)), sharex=True)
    ax = dict(zip(panels, axes))
    for i, (label, run) in enumerate(runs):
        color = f"C{i % 10}"
        s, e = run["steps"], run["epochs"]
        x, y = series(s, "loss")
        if x:
            ax["loss"].plot(x, moving_average(y, smooth), color=color, lw=1, label=f"{label} (step, avg {smooth})")
        x, y = series(e, "train_loss")
        ax["loss"].plot(x, y, "o-", color=color, ms=3, lw=0.8, alpha=0.6, label=f"{label} train (epoch)")
        x, y = series(e, "val_loss")
        ax["loss"].plot(x, y, "s--", color=color, ms=3, lw=0.8, label=f"{label} validation")
        for key, style, name in (("val_top1", "s-", "top-1"), ("val_top5", "^:", "top-5"),
                                 ("ema_val_top1", "d-.", "moving average top-1")):
            x, y = series(e, key)
            if x:
                ax["top1"].plot(x, y, style, color=color, ms=3, lw=1, label=f"{label} {name}")
        x, y = series(s, "lr")
        ax["lr"].plot(x, y, color=color, lw=1, label=label)
        x, y = series(s, "img_s")
        if x:
            ax["img_s"].plot(x, moving_average(y, smooth), color=color, lw=1, label=label)
        if has_norm:
            x, y = series(s, "grad_norm")
            ax["grad_norm"].plot(x, y, color=color, lw=0.8, label=label)
            clipped = [r for r in s if r.get("clipped") == 1 and r.get("grad_norm", -1) >= 0]
            if clipped:
                ax["grad_norm"].plot([r["step"] for r in clipped], [r["grad_norm"] for r in clipped], "x",
                                     color=color, ms=3, label=f"{label} clipped")
    names = {"loss": "loss", "top1": "validation %", "lr": "learning rate", "img_s": "images/s",
             "grad_norm": "gradient norm"}
    for key, a in ax.items():
        a.set_ylabel(names[key])
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7, loc="best")
    axes[-1].set_xlabel("optimizer step")
    if title:
        axes[0].set_title(title)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=110)
    except OSError as e:
        fail(f"{out}: {e.strerror}")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("metrics", nargs="+", help="metrics.jsonl files (the trainer's log.jsonl)")
    p.add_argument("-o", "--out", required=True, help="the PNG to write")
    p.add_argument("--smooth", type=int, default=20, help="steps in the moving averages (default 20)")
    p.add_argument("--title", default="", help="a title over the first panel")
    a = p.parse_args(argv)
    if a.smooth < 1:
        fail("--smooth must be >= 1")
    runs = [(label_of(path, a.metrics), read_run(path)) for path in a.metrics]
    plot(runs, a.out, a.smooth, a.title)
    print(f"{a.out}: {len(runs)} run(s), " +
          ", ".join(f"{label}: {len(r['steps'])} steps, {len(r['epochs'])} epochs" for label, r in runs))


if __name__ == "__main__":
    main(sys.argv[1:])
