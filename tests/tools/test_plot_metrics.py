#!/usr/bin/python3
"""tools/plot_metrics.py on made-up metrics files: what it reads (the lowest rank's steps, the
last record of a step run again, a cut-short last line skipped), the PNG it writes, and its
errors (a bad line named by file and line, a file without records, a missing file)."""
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
        records = [step(s, loss=2.0) for s in (1, 2, 3)] + [step(s, rank=1, loss=9.0) for s in (1, 2, 3)]
        records += [dict(type="epoch", epoch=1, step=3, train_loss=1.5, val_loss=1.2, val_top1=40.0, val_top5=90.0)]
        records += [step(3, loss=0.5)]  # run again after a resume from step 2
        write(m, records, tail='{"type":"step","rank":0,"st')  # killed mid-write
        run = plot_metrics.read_run(m)
        self.assertEqual([r["step"] for r in run["steps"]], [1, 2, 3])
        self.assertEqual([r["loss"] for r in run["steps"]], [2.0, 2.0, 0.5])
        self.assertEqual(run["epochs"][0]["val_top1"], 40.0)

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
        write(m, [step(1)], tail='not json\n{"type":"step","rank":0,"step":2,"loss":1,"lr":0.1}\n')
        r = self.run_tool(m, "-o", self.path("x.png"))
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"{m}:2: not a JSON object: 'not json'", r.stderr)
        empty = self.path("empty", "metrics.jsonl")
        write(empty, [dict(type="start", rank=0)])
        r = self.run_tool(empty, "-o", self.path("x.png"))
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"{empty}: no step or epoch records", r.stderr)
        r = self.run_tool(self.path("none.jsonl"), "-o", self.path("x.png"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("none.jsonl: No such file or directory", r.stderr)
        self.assertFalse(os.path.exists(self.path("x.png")))


if __name__ == "__main__":
    unittest.main()
