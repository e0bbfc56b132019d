#!/usr/bin/python3
"""tools/gpu_bench_table.py, which writes tools/gpu_check.sh's figures on the GPU machine: checked
here on made-up run outputs, so that the one GPU run does not find its bugs (python3 -m unittest)."""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import gpu_bench_table as gbt  # noqa: E402


def ours(img, setup=12.5):
    return {"img_per_s": img, "img_per_s_min": img - 10, "img_per_s_max": img + 5, "setup_s": setup,
            "peak_used_mib": 30000.4, "alloc_device_mib": 20000, "steady_allocs": 0,
            "skipped_steps": 0, "cudnn": 91900, "cudart": 13000}


def theirs(img, peak=31000.0):
    return {"img_per_s": img, "img_per_s_min": img - 1, "img_per_s_max": img + 1, "setup_s": 4.0,
            "peak_used_mib": peak, "max_allocated_mib": peak, "torch": "2.9.0", "cudnn": 91000,
            "torchvision": "0.24.0"}


class TrainerSummary(unittest.TestCase):
    def write(self, records):
        f = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
        self.addCleanup(os.unlink, f.name)
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.close()
        return f.name

    def test_steps_after_the_warm_up(self):
        records = [{"type": "start", "rank": 0}]
        records += [{"type": "step", "step": s, "img_s": 100.0 * s, "data_wait_s": 0.001 * s,
                     "compute_s": 0.1} for s in range(1, 11)]
        records.append({"type": "eval", "step": 10})
        s = gbt.trainer_summary(self.write(records))
        self.assertEqual(s["steps"], 5)  # steps 6..10
        self.assertEqual(s["img_per_s"], 800.0)
        self.assertEqual((s["img_per_s_min"], s["img_per_s_max"]), (600.0, 1000.0))
        self.assertAlmostEqual(s["data_wait_s"], 0.008)

    def test_no_steps_is_an_error(self):
        path = self.write([{"type": "start"}] + [{"type": "step", "step": s, "img_s": 1.0,
                                                  "data_wait_s": 0, "compute_s": 0} for s in range(1, 6)])
        self.assertIsNone(gbt.trainer_summary(path))
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(gbt.main(["x", "trainer", path]), 1)
        self.assertIn("no steps after the first 5", err.getvalue())

    def test_a_line_cut_by_a_kill_is_skipped(self):
        path = self.write([{"type": "step", "step": s, "img_s": 10.0 * s, "data_wait_s": 0,
                            "compute_s": 0} for s in range(1, 9)])
        with open(path, "a") as f:
            f.write('{"type": "step", "step": 9, "img_')
        self.assertEqual(gbt.trainer_summary(path)["steps"], 3)


class LastLine(unittest.TestCase):
    def test_open_mpis_abort_banner_is_passed_over(self):
        log = ["starting", "error: layer conv1: out of memory", "-" * 60,
               "MPI_ABORT was invoked on rank 0", "with errorcode 1.", "-" * 60, ""]
        self.assertEqual(gbt.last_line(log), "error: layer conv1: out of memory")
        self.assertEqual(gbt.last_line(["a", "b", ""]), "b")
        self.assertIsNone(gbt.last_line(["", "  "]))


class Table(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def put(self, name, figures=None, log=None):
        if figures is not None:
            with open(f"{self.dir.name}/bench-{name}.json", "w") as f:
                f.write(json.dumps(figures) + "\n")
        if log is not None:
            with open(f"{self.dir.name}/bench-{name}.log", "w") as f:
                f.write(log)

    def rows(self):
        text = gbt.table(self.dir.name, "NVIDIA H200, 580.65", "--batch 256 --size 224", now=0)
        return text, {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}

    def test_ratios_failures_and_the_trainer(self):
        self.put("ringtrain-bf16", ours(3300.0))
        self.put("pytorch-bf16", theirs(3000.0))
        self.put("ringtrain-fp32", ours(1000.0))
        self.put("pytorch-fp32", log="pytorch fp32: RuntimeError | CUDA out of memory\n\n")
        self.put("ringtrain-tf32", log="RESULT...\ntimed out after 150 s\n")
        self.put("ringtrain-trainer-bf16", {"img_per_s": 3150.0, "img_per_s_min": 3100.0,
                                            "img_per_s_max": 3200.0, "data_wait_s": 0.0004})
        text, rows = self.rows()
        self.assertIn("1970-01-01 00:00 UTC; NVIDIA H200, 580.65; --batch 256 --size 224; "
                      "PyTorch 2.9.0, cuDNN 91000, torchvision 0.24.0; ringtrain: cuDNN 91900, "
                      "CUDA runtime 13000.", text)
        self.assertEqual(rows["ringtrain bf16"], "| ringtrain bf16 | 3300.0 [3290.0–3305.0] | 12.5 | 30000 "
                                                 "| 20000 (rt::cuda) | 0 | 1.10 |")
        self.assertEqual(rows["PyTorch bf16"], "| PyTorch bf16 | 3000.0 [2999.0–3001.0] | 4.0 | 31000 "
                                               "| 31000 (max_memory_allocated) |  |  |")
        # Without the peer's figures, no ratio; a failed run shows its log's last line, '|'-safe.
        self.assertTrue(rows["ringtrain fp32"].endswith("| 0 |  |"))
        self.assertEqual(rows["PyTorch fp32"], "| PyTorch fp32 | pytorch fp32: RuntimeError / CUDA out of memory | | | | | |")
        self.assertEqual(rows["ringtrain tf32"], "| ringtrain tf32 | timed out after 150 s | | | | | |")
        self.assertEqual(rows["ringtrain fp16"], "| ringtrain fp16 | not run | | | | | |")
        trainer = rows["ringtrain bf16, the trainer (loader, upload, step; 1 rank)"]
        self.assertIn("| 3150.0 [3100.0–3200.0] |", trainer)
        self.assertTrue(trainer.endswith("| 1.05 (data wait 0.4 ms/step) |"))
        self.assertNotIn("ringtrain bf16, batch norm and residual add unfused", rows)  # not run
        self.put("ringtrain-bf16-nofuse", ours(3000.0))
        _, rows = self.rows()
        self.assertTrue(rows["ringtrain bf16, batch norm and residual add unfused"].endswith("| 0 | 1.00 |"))
        for line in text.splitlines():  # every row has the header's 7 columns
            if line.startswith("|"):
                self.assertEqual(line.count("|"), 8, line)

    def test_a_cpu_smoke_run_and_no_trainer(self):
        self.put("pytorch-fp32", theirs(5.0, peak=None))
        text, rows = self.rows()
        self.assertIn("| PyTorch fp32 | 5.0 [4.0–6.0] | 4.0 | – | – (max_memory_allocated) |", text)
        self.assertNotIn("the trainer", text)  # not run: no row
        self.put("ringtrain-trainer-bf16", log="")
        text, rows = self.rows()
        self.assertIn("| ringtrain bf16, the trainer | no output | | | | | |", text)

    def test_skipped_steps_a_malformed_file_and_a_log_of_any_bytes(self):
        fp16 = ours(4000.0)
        fp16["skipped_steps"] = 2
        self.put("ringtrain-fp16", fp16)
        broken = theirs(3000.0)
        del broken["max_allocated_mib"]
        self.put("pytorch-fp16", broken)
        with open(f"{self.dir.name}/bench-pytorch-tf32.log", "wb") as f:
            f.write(b"Segmentation fault \xff\xfe in libfoo\n")
        text, rows = self.rows()
        self.assertTrue(rows["ringtrain fp16"].startswith(
            "| ringtrain fp16 | 4000.0 [3990.0–4005.0] (2 timed steps skipped on overflow) | 12.5 |"))
        self.assertEqual(rows["PyTorch fp16"],
                         "| PyTorch fp16 | malformed figures (KeyError: 'max_allocated_mib') | | | | | |")
        self.assertIn("| PyTorch tf32 | Segmentation fault \ufffd\ufffd in libfoo |", text)
        self.assertIn("| ringtrain bf16 | not run |", text)  # the other rows are still there

    def test_command_line(self):
        self.put("ringtrain-bf16", ours(10.0))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(gbt.main(["x", "table", self.dir.name, "gpu", "args"]), 0)
        self.assertIn("| ringtrain bf16 | 10.0", out.getvalue())
        with contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(gbt.main(["x", "tables"]), 2)


if __name__ == "__main__":
    unittest.main()
