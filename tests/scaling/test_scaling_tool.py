#!/usr/bin/python3
"""tools/scaling end to end on this machine: weak scaling at N = 1, 2 of a tiny model with emulated
compute (CSV, markdown, PNGs, sane efficiencies), train.accumulate's global batch, a sweep without
N = 1 said to be relative to its smallest N, a failed and a refused run reported as rows, the median throughput that of the median step, and
argument errors (exit 2 before anything runs: a bad --timeout, an --out that cannot be made). Usage: test_scaling_tool.py TRAINER (the built build/bin/trainer)."""
import csv
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, "tools", "scaling")
TRAINER = os.environ.get("RT_TRAINER", os.path.join(REPO, "build", "bin", "trainer"))
TINY = ["--config", os.path.join(REPO, "configs", "quickstart.yaml"), "--synthetic", "--steps", "8",
        "--warmup", "2", "--set", "model.name=resnet20", "--set", "model.width=0.25",
        "--set", "data.image_size=16", "--set", "data.synthetic_classes=10", "--set", "threads=1"]


def run(args, out):
    p = subprocess.run([TOOL, "--trainer", TRAINER, "--out", out] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    rows = []
    if os.path.exists(os.path.join(out, "scaling.csv")):
        with open(os.path.join(out, "scaling.csv")) as f:
            rows = list(csv.DictReader(f))
    return p.returncode, p.stdout, rows


class TestScalingTool(unittest.TestCase):
    def test_weak_scaling_on_two_ranks(self):
        with tempfile.TemporaryDirectory() as out:
            rc, text, rows = run(["--np", "1,2", "--batch", "4", "--set", "emulate.compute_ms=30"] + TINY, out)
            self.assertEqual(rc, 0, text)
            self.assertEqual([(r["np"], r["status"]) for r in rows], [("1", "ok"), ("2", "ok")], text)
            for r in rows:
                self.assertEqual(r["steps"], "6")  # 8 steps, 2 dropped
                self.assertGreaterEqual(float(r["step_ms_median"]), 30.0)  # the emulated compute
                self.assertGreaterEqual(float(r["compute_ms"]), 29.0)
                eff = float(r["efficiency"])
                self.assertTrue(0 <= eff <= 1.1, eff)
                self.assertAlmostEqual(float(r["img_s_median"]) * float(r["step_ms_median"]) / 1e3,
                                       float(r["global_batch"]), delta=0.05 * float(r["global_batch"]))
            self.assertEqual(float(rows[0]["efficiency"]), 1.0)
            self.assertEqual(rows[1]["global_batch"], "8")
            for png in ("scaling.png", "split.png"):
                with open(os.path.join(out, png), "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n", png)
            with open(os.path.join(out, "scaling.md")) as f:
                self.assertIn("| weak | ring | 2 | 4 | 8 |", f.read())

    def test_accumulation_and_a_sweep_without_one_rank(self):
        # The global batch is the trainer's (train.accumulate passes a step), the speed-up is said
        # to be relative to N = 2, and an earlier sweep's plots do not stay beside this one's table.
        with tempfile.TemporaryDirectory() as out:
            with open(os.path.join(out, "scaling.png"), "wb") as f:
                f.write(b"stale")
            rc, text, rows = run(["--np", "2", "--batch", "4", "--no-plots", "--set", "train.accumulate=2"] + TINY,
                                 out)
            self.assertEqual(rc, 0, text)
            self.assertEqual([(r["np"], r["status"], r["global_batch"]) for r in rows], [("2", "ok", "16")], text)
            self.assertAlmostEqual(float(rows[0]["img_s_median"]) * float(rows[0]["step_ms_median"]) / 1e3, 16,
                                   delta=0.8)
            with open(os.path.join(out, "scaling.md")) as f:
                self.assertIn("| 2.00 (vs N = 2) | 1.000 |", f.read())  # speed-up N/N0 by assumption
            self.assertFalse(os.path.exists(os.path.join(out, "scaling.png")))

    def test_median_throughput_is_the_median_steps(self):
        # Six steps whose two middle ones differ 2x (a loaded machine): the median rate is the
        # global batch over the median step time, not the mean of the two middle rates (10% off).
        loader = importlib.machinery.SourceFileLoader("scaling_tool", TOOL)
        spec = importlib.util.spec_from_loader("scaling_tool", loader)
        tool = importlib.util.module_from_spec(spec)
        loader.exec_module(tool)
        parts = {k: 0.001 for k in tool.PARTS + ("total_comm_s",)}
        times = [0.030, 0.031, 0.032, 0.060, 0.061, 0.062]
        steps = {i + 1: [dict(parts, step_s=t)] for i, t in enumerate(times)}
        row = {}
        tool.summarize(row, steps, 1, 16, 0)
        self.assertEqual(row["steps"], 6)
        self.assertAlmostEqual(row["step_ms_median"], 46.0)
        self.assertAlmostEqual(row["img_s_median"] * row["step_ms_median"] / 1e3, 16)

    def test_failed_and_refused_runs_are_rows(self):
        with tempfile.TemporaryDirectory() as out:
            rc, text, rows = run(TINY + ["--np", "1,4", "--mode", "strong", "--global-batch", "6",
                                         "--set", "model.name=resnet99"], out)
            self.assertEqual(rc, 1, text)
            self.assertEqual([(r["np"], r["status"]) for r in rows], [("1", "failed"), ("4", "refused")], text)
            self.assertIn("model.name", rows[0]["reason"])
            self.assertIn("not divisible by 4", rows[1]["reason"])
            self.assertIn("failed: exit 1: ringtrain: rank 0 of 1", text)
            # A refused row alone fails the sweep too: the rank counts asked for were not all run.
            rc, text, rows = run(TINY + ["--np", "4", "--mode", "strong", "--global-batch", "6"], out)
            self.assertEqual((rc, [r["status"] for r in rows]), (1, ["refused"]), text)

    def test_bad_arguments(self):
        with tempfile.TemporaryDirectory() as out:
            for args, msg in ((["--np", "0"], "--np"), (["--np", "1,two"], "--np"),
                              (["--mode", "sideways"], "--mode"), (["--warmup", "9", "--steps", "8"], "--warmup"),
                              (["--set", "novalue"], "--set"), (["--bogus"], "bad arguments"),
                              (["--timeout", "0"], "--timeout"), (["--timeout", "-1"], "--timeout"),
                              (["--timeout", "nan"], "--timeout"),
                              # The tool's own keys would be overridden: said, not run as something else.
                              (["--set", "comm.algorithm=hierarchical"], "comm.algorithm is the tool's to set (use --algorithms)"),
                              (["--set", "train.batch=8"], "train.batch is the tool's to set"),
                              (["--set", "run_dir=x"], "run_dir is the tool's to set (use --out)"),
                              (["--set", "train={batch: 8}"], "train.batch is the tool's to set")):
                rc, text, rows = run(args, out)
                self.assertEqual(rc, 2, (args, text))
                self.assertIn(msg, text)
                self.assertEqual(rows, [])
            # A fixed emulated compute under strong scaling is warned about (the run stops at the
            # empty launcher after it).
            rc, text, _ = run(["--mode", "strong", "--set", "emulate.compute_ms=10", "--launcher", ""], out)
            self.assertEqual(rc, 2, text)
            self.assertIn("warning: --set emulate.compute_ms=10 is the same compute for every rank count", text)
            # An output folder that cannot be made: said before any run, not a traceback.
            with open(os.path.join(out, "file"), "w"):
                pass
            for bad, why in (("/proc/scaling_out", "No such file or directory"),
                             (os.path.join(out, "file"), "not a folder")):
                rc, text, _ = run(["--np", "1"] + TINY, bad)
                self.assertEqual(rc, 2, text)
                self.assertEqual(text, f"scaling: --out {bad}: cannot create or write the folder ({why})\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        TRAINER = sys.argv.pop(1)
    unittest.main()
