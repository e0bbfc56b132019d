#!/usr/bin/python3
"""tools/bench_torch_gpu.py, the GPU check's PyTorch peer, on the CPU: a tiny fp32 and bf16 run
(with the profile) whose readable lines, JSON lines and --json file are what tools/gpu_check.sh
greps and tools/gpu_bench_table.py reads, so that the one run on a GPU machine does not fail on
the script itself. Needs PyTorch (Debian's python3-torch); exits 77 (skipped) without it."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def main():
    try:
        import torch  # noqa: F401  (only whether it imports)
    except Exception as e:
        print(f"skipped: PyTorch does not import here ({type(e).__name__}: {e})")
        sys.exit(77)
    import gpu_bench_table

    with tempfile.TemporaryDirectory() as out:
        jsonl = os.path.join(out, "runs.jsonl")
        cmd = [sys.executable, os.path.join(ROOT, "tools", "bench_torch_gpu.py"), "--device", "cpu",
               "--batch", "2", "--size", "32", "--warmup", "1", "--steps", "1", "--repeats", "2",
               "--modes", "fp32,bf16", "--profile", "1", "--json", jsonl]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            fail(f"exit {p.returncode}:\n{p.stdout}\n{p.stderr}")
        lines = p.stdout.splitlines()
        runs = [json.loads(l) for l in lines if l.startswith("{")]
        readable = [l for l in lines if l.startswith("pytorch ")]
        if [r["precision"] for r in runs] != ["fp32", "bf16"] or len(readable) != 2:
            fail(f"expected an fp32 and a bf16 run, one readable and one JSON line each:\n{p.stdout}")
        for r in runs:
            for key in ("img_per_s", "img_per_s_min", "img_per_s_max", "setup_s", "torch"):
                if key not in r:
                    fail(f"{r['precision']}: no {key} in {r}")
            if not (0 < r["img_per_s_min"] <= r["img_per_s"] <= r["img_per_s_max"]):
                fail(f"{r['precision']}: rates out of order: {r}")
            if r["loss_finite"] is not True or r["skipped_steps"] != 0:
                fail(f"{r['precision']}: {r}")
            # What PyTorch applied, read back: fp32 is strict fp32; the others allow TF32.
            strict = r["precision"] == "fp32"
            if r.get("tf32") != {"matmul": not strict, "cudnn": not strict}:
                fail(f"{r['precision']}: TF32 as applied: {r.get('tf32')!r}")
        if not any(l.startswith("PROFILE_KIND,conv,") for l in lines):
            fail(f"no PROFILE_KIND conv line:\n{p.stdout}")
        with open(jsonl) as f:
            if [json.loads(l)["precision"] for l in f] != ["fp32", "bf16"]:
                fail("--json file does not hold the two runs")
        # As gpu_check.sh files them: one run per bench-NAME.json, read back by the table.
        with open(os.path.join(out, "bench-pytorch-bf16.json"), "w") as f:
            f.write(json.dumps(runs[1]) + "\n")
        got = gpu_bench_table.load(out, "pytorch-bf16")
        if not isinstance(got, dict) or got.get("img_per_s") != runs[1]["img_per_s"]:
            fail(f"gpu_bench_table.load read {got!r}")
    print("ok: fp32 and bf16 runs, their JSON, the profile and the table's reading")


if __name__ == "__main__":
    main()
