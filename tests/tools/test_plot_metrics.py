#!/usr/bin/python3
"""tools/plot_metrics.py on made-up metrics files: what it reads (the lowest rank's steps, the
newest history where appended runs' steps go back, a plain resume joined, cut-short lines
skipped), the PNG it writes and the name it prints, and its errors (a bad line named by file and
line, a file without records, a missing or binary file, an output it cannot write)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
sys.path.insert(0, TOOLS)
import plot_metrics  # noqa: E402

TOOL = os.path.join(TOOLS, "plot_metrics.py")


def step(n, rank=0, loss=1.0, **extra):
    return dict(type="step", rank=rank, step=n, epoch=0, loss=loss, lr=0.1, img_s=100.0 + n, **extra)


def write(path, records, tail=""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.write(tail)


class PlotMetrics(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def path(self, *parts):
        return os.path.join(self.dir.name, *parts)

    def run_tool(self, *args):
        return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)

    def test_reads_the_lowest_rank_and_the_last_record_of_a_step(self):
        m = self.path("a", "metrics.jsonl")
        records = [step(s, loss=2.0) for s in (1, 2)]
        records += [dict(type="epoch", epoch=1, step=2, train_loss=1.5, val_loss=1.2, val_top1=40.0, val_top5=90.0)]
        records += [step(3, loss=2.0)] + [step(s, rank=1, loss=9.0) for s in (1, 2, 3)]
        records += [dict(type="epoch", epoch=2, step=3, train_loss=1.4, val_loss=1.1, val_top1=41.0, val_top5=91.0)]
        records += [step(3, loss=0.5)]  # run again after a resume from step 2: its epoch 2 is gone too
        write(m, records, tail='{"type":"step","rank":0,"st')  # killed mid-write
        run = plot_metrics.read_run(m)
        self.assertEqual([r["step"] for r in run["steps"]], [1, 2, 3])
        self.assertEqual([r["loss"] for r in run["steps"]], [2.0, 2.0, 0.5])
        self.assertEqual([r["val_top1"] for r in run["epochs"]], [40.0])

    def test_appended_runs_plot_the_newest_history(self):
        # A run of 10 steps, a resume from its checkpoint at step 4 (steps 5-7), then a new run in
        # the same run_dir (steps 1-3): the curve is the new run's, not three runs folded into one.
        m = self.path("forked", "metrics.jsonl")
        epoch = lambda e, s: dict(type="epoch", epoch=e, step=s, train_loss=1.0, val_loss=1.0, val_top1=10.0 * s)
        records = [dict(type="start", rank=0)] + [step(s, loss=3.0) for s in range(1, 11)] + [epoch(1, 4), epoch(2, 8)]
        records += [dict(type="start", rank=0)] + [step(s, loss=2.0) for s in range(5, 8)]
        lines_before_new_run = len(records)
        records += [dict(type="start", rank=0)] + [step(s, loss=1.0) for s in range(1, 4)] + [epoch(1, 3)]
        write(m, records)
        r = self.run_tool(m, "-o", self.path("x.png"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("forked: 3 steps, 1 epochs", r.stdout)
        self.assertEqual(r.stderr.count("go back"), 1, r.stderr)  # said once
        self.assertIn(f"{m}: the steps go back to 1 at line {lines_before_new_run + 2} (a new run or a resume "
                      "from an older checkpoint): the later history is plotted", r.stderr)
        run = plot_metrics.read_run(m)
        self.assertEqual([(s["step"], s["loss"]) for s in run["steps"]], [(1, 1.0), (2, 1.0), (3, 1.0)])
        self.assertEqual([e["step"] for e in run["epochs"]], [3])
        # Without the new run: the resume from step 4 replaces steps 5-10 and epoch 2.
        write(m, records[:lines_before_new_run])
        run = plot_metrics.read_run(m)
        self.assertEqual([(s["step"], s["loss"]) for s in run["steps"]],
                         [(s, 3.0) for s in range(1, 5)] + [(s, 2.0) for s in range(5, 8)])
        self.assertEqual([e["step"] for e in run["epochs"]], [4])

    def test_a_resume_from_the_newest_checkpoint_is_joined_silently(self):
        m = self.path("resumed", "metrics.jsonl")
        write(m, [dict(type="start", rank=0)] + [step(s) for s in range(1, 6)] +
              [dict(type="start", rank=0), dict(type="resume", step=5, path="ckpt")] + [step(s) for s in range(6, 9)])
        r = self.run_tool(m, "-o", self.path("x.png"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        self.assertIn("resumed: 8 steps", r.stdout)

    def test_a_pending_evaluation_joins_its_epoch(self):
        # Stopped at the end of epoch 1 without its evaluation; the resume made it first.
        m = self.path("pending", "metrics.jsonl")
        write(m, [step(1), step(2), dict(type="epoch", epoch=1, step=2, train_loss=1.5, train_top1=30.0),
                  dict(type="stop", step=2), dict(type="resume", step=2, path="ckpt"),
                  dict(type="validation", epoch=1, step=2, val_loss=1.2, val_top1=40.0, val_top5=90.0), step(3)])
        r = self.run_tool(m, "-o", self.path("x.png"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")  # no fork: the validation record's step is its epoch's
        run = plot_metrics.read_run(m)
        self.assertEqual([(e["step"], e["train_loss"], e["val_top1"]) for e in run["epochs"]], [(2, 1.5, 40.0)])
        self.assertEqual([s["step"] for s in run["steps"]], [1, 2, 3])

    def test_validations_within_epochs_join_the_validation_curves(self):
        # eval.every_steps 2 over epochs of 3 steps: validations at steps 2 and 4, epochs at 3 and 6.
        m = self.path("every", "metrics.jsonl")
        val = lambda s, top1: dict(type="validation", epoch=(s - 1) // 3 + 1, step=s, val_loss=1.0, val_top1=top1)
        write(m, [step(1), step(2), val(2, 20.0), step(3), dict(type="epoch", epoch=1, step=3, train_loss=1.5,
                                                                val_loss=1.1, val_top1=30.0), step(4), val(4, 40.0),
                  step(5), step(6), dict(type="epoch", epoch=2, step=6, train_loss=1.2, val_loss=0.9, val_top1=50.0)])
        r = self.run_tool(m, "-o", self.path("x.png"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        run = plot_metrics.read_run(m)
        self.assertEqual(plot_metrics.series(run["epochs"], "val_top1"), ([2, 3, 4, 6], [20.0, 30.0, 40.0, 50.0]))
        self.assertEqual(plot_metrics.series(run["epochs"], "train_loss"), ([3, 6], [1.5, 1.2]))

    def test_lines_cut_short_mid_file_are_skipped_with_one_warning(self):
        # Killed mid-write twice, each time resumed after the half line (one with half a UTF-8
        # character): the half lines are skipped, the records after them read.
        m = self.path("mid", "metrics.jsonl")
        os.makedirs(os.path.dirname(m))
        with open(m, "wb") as f:
            for s in (1, 2):
                f.write((json.dumps(step(s)) + "\n").encode())
            f.write(b'{"type":"resume","path":"r\xc3')  # no newline: the next record joins it
            f.write((json.dumps(dict(type="start", rank=0)) + "\n").encode())
            f.write((json.dumps(step(3)) + "\n").encode())
            f.write(b'{"type":"step","rank":0,"st' + b"\n")
            f.write((json.dumps(step(4)) + "\n").encode())
        r = self.run_tool(m, "-o", self.path("x.png"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("mid: 4 steps", r.stdout)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertIn(f"plot_metrics.py: {m}:3: not JSON, skipped (a line cut short by a kill?)", r.stderr)
        self.assertIn("1 more such line(s) skipped", r.stderr)

    def test_writes_one_png_for_several_runs(self):
        a, b = self.path("a", "metrics.jsonl"), self.path("b", "metrics.jsonl")
        write(a, [step(s, loss=3.0 / s) for s in range(1, 40)] +
              [dict(type="epoch", epoch=e, step=10 * e, train_loss=1.0 / e, val_loss=1.1 / e, val_top1=30.0 * e,
                    val_top5=60.0 + e, ema_val_top1=31.0 * e) for e in (1, 2, 3)])
        write(b, [step(s, grad_norm=0.5 + 0.01 * s, clipped=int(s % 2)) for s in range(1, 40)] +
              [step(40, grad_norm=-1, clipped=0)])  # a non-finite norm, reported as -1: left out
        out = self.path("curves.png")
        r = self.run_tool(a, b, "-o", out, "--smooth", "5", "--title", "two runs")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("2 run(s), a: 39 steps, 3 epochs, b: 40 steps, 0 epochs", r.stdout)
        with open(out, "rb") as f:
            png = f.read()
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")
        self.assertGreater(len(png), 20000)  # five panels of curves, not an empty canvas

    def test_moving_average(self):
        self.assertEqual(plot_metrics.moving_average([1, 2, 3, 4], 2), [1, 1.5, 2.5, 3.5])

    def test_errors_name_the_file_and_line(self):
        m = self.path("bad", "metrics.jsonl")
        write(m, [step(1)], tail='[1, 2]\n{"type":"step","rank":0,"step":2,"loss":1,"lr":0.1}\n')
        r = self.run_tool(m, "-o", self.path("x.png"))
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"{m}:2: not a JSON object: '[1, 2]'", r.stderr)
        empty = self.path("empty", "metrics.jsonl")
        write(empty, [dict(type="start", rank=0)])
        r = self.run_tool(empty, "-o", self.path("x.png"))
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"{empty}: no step or epoch records", r.stderr)
        r = self.run_tool(self.path("none.jsonl"), "-o", self.path("x.png"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("none.jsonl: No such file or directory", r.stderr)
        binary = self.path("binary.jsonl")
        with open(binary, "wb") as f:
            f.write(bytes(range(256)) * 40)
        r = self.run_tool(binary, "-o", self.path("x.png"))
        self.assertEqual((r.returncode, r.stderr),
                         (2, f"plot_metrics.py: {binary}: no step or epoch records (is it a ringtrain metrics file?)\n"))
        self.assertFalse(os.path.exists(self.path("x.png")))

    def test_output_names(self):
        m = self.path("a", "metrics.jsonl")
        write(m, [step(s) for s in range(1, 5)])
        # Without an extension: a PNG, named as written.
        r = self.run_tool(m, "-o", self.path("curves"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith(self.path("curves.png") + ": 1 run(s)"), r.stdout)
        with open(self.path("curves.png"), "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertFalse(os.path.exists(self.path("curves")))
        r = self.run_tool(m, "-o", self.path("curves.svg"))
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.path("curves.svg")) as f:
            self.assertIn("<svg", f.read())
        # Refused before anything is read or drawn, naming the path: exit 2, no traceback.
        os.makedirs(self.path("folder"))
        os.makedirs(self.path("taken.png"))
        for out, msg in ((self.path("x.xyz"), "unknown image format '.xyz' (matplotlib writes eps,"),
                         (self.path("folder"), "is a folder (-o names the file to write)"),
                         (self.path("folder") + os.sep, "is a folder"),
                         (self.path("taken"), "is a folder"),
                         (self.path("no", "such", "x.png"), "cannot write (No such file or directory)")):
            r = self.run_tool(m, "-o", out)
            self.assertEqual(r.returncode, 2, (out, r.stderr))
            self.assertTrue(r.stderr.startswith("plot_metrics.py: "), r.stderr)
            self.assertIn(msg, r.stderr)
            self.assertNotIn("Traceback", r.stderr)
        self.assertEqual(sorted(os.listdir(self.path("folder"))), [])
        self.assertFalse(os.path.exists(self.path("folder.png")))
        self.assertFalse(os.path.exists(self.path("x.xyz")))


if __name__ == "__main__":
    unittest.main()
