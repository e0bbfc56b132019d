#!/usr/bin/python3
"""Training curves from the trainer's metrics files, as one PNG (matplotlib, headless).

  plot_metrics.py RUN/metrics.jsonl [MORE.jsonl ...] -o curves.png [--smooth 20] [--title TEXT]

Panels, all against the optimizer step: the loss (each step's, as a moving average of --smooth
steps, and each epoch's training and validation loss), validation top-1 and top-5 (and the moving
average's top-1 with train.ema; evaluations within epochs, eval.every_steps, among them), the learning rate, global images/s (moving average), and the
gradient's norm where step records carry one (train.clip_grad_norm or log.grad_norm; clipped steps
marked). Several files give one line each per panel, labelled by their run folder.

Per-rank files (log.jsonl with {rank}) hold each rank's step records: those of the lowest rank in
a file are plotted. The trainer appends: a new run in the same run_dir, or a resume from an earlier
checkpoint, adds records whose steps go back. Where they do, the history forked: the records of
the steps from there on that came before are dropped (a note on stderr says where), so the newest
history is plotted; a resume that continues upward joins its run's curves. A line cut short (a run
killed while writing, perhaps with a resume appending after it) is skipped, with a warning unless
it is the last; a line of JSON that is not an object stops the tool with its file and line number
(exit status 2). -o takes the formats matplotlib writes by their extension (PNG without one).
"""
import argparse
import json
import os
import sys


def fail(msg):
    print(f"plot_metrics.py: {msg}", file=sys.stderr)
    sys.exit(2)


def read_run(path):
    """{"steps": [step records by step], "epochs": [epoch records, and validations within epochs, by
    step]} of one metrics file."""
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    if lines and lines[-1] == b"":
        lines.pop()
    steps, epochs = {}, {}
    last = {}  # the last step of each rank's records, and of the epochs' ("epoch")
    forks = {}  # rank (or "epoch") -> [(line, step)] where its steps went back
    bad = []
    for n, raw in enumerate(lines, 1):
        try:
            # Decoded line by line: a write cut short may end inside a character.
            line = raw.decode("utf-8")
            r = json.loads(line)
        except ValueError:  # UnicodeDecodeError too
            if n < len(lines):  # a killed run's last write, then a resume's lines after it
                bad.append((n, raw))
            continue
        if not isinstance(r, dict):
            fail(f"{path}:{n}: not a JSON object: {line[:60]!r}")
        kind = r.get("type")
        if kind not in ("step", "epoch", "validation") or not isinstance(r.get("step"), (int, float)):
            continue
        s = r["step"]
        if kind == "validation":
            if s in epochs:  # an epoch's evaluation, made by the resume after a stop skipped it
                epochs[s] = {**epochs[s], **{k: v for k, v in r.items() if k.startswith(("val_", "ema_val_"))}}
            else:  # one within an epoch (eval.every_steps): validation figures alone
                epochs[s] = r
            continue
        key = r.get("rank", 0) if kind == "step" else "epoch"
        if key in last and s <= last[key]:
            # A new run, or a resume from an older checkpoint: what was written from step s on
            # belongs to the abandoned history.
            forks.setdefault(key, []).append((n, s))
            if kind == "step":
                steps[key] = {k: v for k, v in steps[key].items() if k < s}
            epochs = {k: v for k, v in epochs.items() if k < s}
            if kind == "step" and last.get("epoch", s) >= s:
                last.pop("epoch", None)  # the new history's epochs are no fork of the dropped ones'
        last[key] = s
        if kind == "step":
            steps.setdefault(key, {})[s] = r
        else:
            epochs[s] = r
    if not steps and not epochs:
        fail(f"{path}: no step or epoch records (is it a ringtrain metrics file?)")
    if bad:
        n, raw = bad[0]
        more = f"; {len(bad) - 1} more such line(s) skipped" if len(bad) > 1 else ""
        print(f"plot_metrics.py: {path}:{n}: not JSON, skipped (a line cut short by a kill?): "
              f"{raw[:60].decode('utf-8', 'replace')!r}{more}", file=sys.stderr)
    rank = min(steps) if steps else None
    seen = forks.get(rank if steps else "epoch")
    if seen:
        (n, s), times = seen[-1], len(seen)
        print(f"plot_metrics.py: {path}: the steps go back to {s:g} at line {n} (a new run or a resume from "
              f"an older checkpoint): the later history is plotted"
              + (f" ({times} such points; the last is named)" if times > 1 else ""), file=sys.stderr)
    own = steps[rank] if steps else {}
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


def output_path(out):
    """(the file to write, its format): matplotlib's format by the extension, PNG without one (with
    .png added, as matplotlib would); checked before any plotting."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    if out.endswith(os.sep) or os.path.basename(out) in ("", ".", "..") or os.path.isdir(out):
        fail(f"{out}: is a folder (-o names the file to write)")
    ext = os.path.splitext(out)[1][1:].lower()
    if not ext:
        out, ext = out + ".png", "png"
    formats = FigureCanvasAgg.get_supported_filetypes()
    if ext not in formats:
        fail(f"{out}: unknown image format '.{ext}' (matplotlib writes {', '.join(sorted(formats))})")
    if os.path.isdir(out):
        fail(f"{out}: is a folder (-o names the file to write)")
    return out, ext


def plot(runs, out, fmt, smooth, title):
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
        fig.savefig(out, dpi=110, format=fmt)
    except OSError as e:
        fail(f"{out}: cannot write ({e.strerror})")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("metrics", nargs="+", help="metrics.jsonl files (the trainer's log.jsonl)")
    p.add_argument("-o", "--out", required=True,
                   help="the PNG to write (or .pdf, .svg ...: matplotlib's formats; .png added without one)")
    p.add_argument("--smooth", type=int, default=20, help="steps in the moving averages (default 20)")
    p.add_argument("--title", default="", help="a title over the first panel")
    a = p.parse_args(argv)
    if a.smooth < 1:
        fail("--smooth must be >= 1")
    out, fmt = output_path(a.out)
    runs = [(label_of(path, a.metrics), read_run(path)) for path in a.metrics]
    plot(runs, out, fmt, a.smooth, a.title)
    print(f"{out}: {len(runs)} run(s), " +
          ", ".join(f"{label}: {len(r['steps'])} steps, {len(r['epochs'])} epochs" for label, r in runs))


if __name__ == "__main__":
    main(sys.argv[1:])
