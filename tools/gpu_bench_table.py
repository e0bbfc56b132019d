#!/usr/bin/python3
"""The figures tools/gpu_check.sh writes, from its benchmark runs' outputs (standard library only:
it runs on the GPU machine, where nothing can be installed).

  gpu_bench_table.py trainer METRICS_JSONL   one JSON line: the trainer's img/s median [min, max]
                                             over its steps after the first 5, data wait, compute
  gpu_bench_table.py table OUT GPU BARGS     bench.md: one row per run of OUT/bench-NAME.json (a
                                             run without one shows its log's last line), with
                                             ringtrain / PyTorch per precision
"""
import json
import statistics
import sys
import time

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
WARM_STEPS = 5  # the trainer's first steps choose algorithms and fill the loader's queue


def trainer_summary(metrics_path):
    """The trainer's per-step figures after its warm-up, or None when it has none."""
    steps = []
    with open(metrics_path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:  # the last line of a run killed mid-write
                continue
            if r.get("type") == "step" and r.get("step", 0) > WARM_STEPS:
                steps.append(r)
    if not steps:
        return None
    v = [r["img_s"] for r in steps]
    return {"img_per_s": statistics.median(v), "img_per_s_min": min(v), "img_per_s_max": max(v),
            "data_wait_s": statistics.median(r["data_wait_s"] for r in steps),
            "compute_s": statistics.median(r["compute_s"] for r in steps), "steps": len(v)}


def last_line(lines):
    """The last non-empty line outside the "-----" banners Open MPI closes an aborted job with."""
    last, banner = None, False
    for line in lines:
        line = line.strip()
        if line and set(line) == {"-"}:
            banner = not banner
        elif line and not banner:
            last = line
    return last


def load(out, name):
    """bench-NAME.json's figures; else the last line of bench-NAME.log; else "not run"."""
    try:
        with open(f"{out}/bench-{name}.json") as f:
            return json.loads(f.readline())
    except (OSError, ValueError):
        try:  # a log may hold any bytes (a crash's, a library's)
            with open(f"{out}/bench-{name}.log", errors="replace") as f:
                line = last_line(f)
            return line[:120].replace("|", "/") if line else "no output"
        except OSError:
            return "not run"


def mib(v):  # None: a CPU smoke run of the PyTorch script
    return "–" if v is None else f"{v:.0f}"


def table(out, gpu, bargs, now=None):
    names = [f"{who}-{p}" for who in ("ringtrain", "pytorch") for p in PRECISIONS]
    runs = {n: load(out, n) for n in names}
    trainer = load(out, "ringtrain-trainer-bf16")
    pt = next((r for n, r in runs.items() if n.startswith("pytorch") and isinstance(r, dict)), {})
    net = f"torchvision {pt['torchvision']}" if pt.get("torchvision") else "bench_torch_gpu.py's ResNet-50"
    rt = next((r for n, r in runs.items() if n.startswith("ringtrain") and isinstance(r, dict)), {})
    libs = f"; ringtrain: cuDNN {rt['cudnn']}, CUDA runtime {rt.get('cudart', '?')}" if "cudnn" in rt else ""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(now))
    rows = ["# ResNet-50 training step on one GPU\n",
            f"{when}; {gpu}; {bargs}; PyTorch {pt.get('torch', '?')}, cuDNN {pt.get('cudnn', '?')}, {net}{libs}.\n",
            "| run | img/s median [min–max] | set-up, s | peak memory in use, MiB | allocated in timed steps, MiB "
            "| allocations in timed steps | ringtrain / PyTorch |",
            "|---|---|---|---|---|---|---|"]

    def figures(label, r, ours, peer):
        ratio = f"{r['img_per_s'] / peer['img_per_s']:.2f}" if ours and isinstance(peer, dict) else ""
        alloc = (f"{mib(r['alloc_device_mib'])} (rt::cuda)" if ours
                 else f"{mib(r['max_allocated_mib'])} (max_memory_allocated)")
        # fp16: steps whose update an overflow skipped are cheaper than real ones.
        skipped = f" ({r['skipped_steps']} timed steps skipped on overflow)" if r.get("skipped_steps") else ""
        return (f"| {label} | {r['img_per_s']:.1f} [{r['img_per_s_min']:.1f}–{r['img_per_s_max']:.1f}]{skipped} "
                f"| {r['setup_s']:.1f} | {mib(r['peak_used_mib'])} | {alloc} "
                f"| {r['steady_allocs'] if ours else ''} | {ratio} |")

    def row(label, r, ours, peer):
        if not isinstance(r, dict):
            return f"| {label} | {r} | | | | | |"
        try:
            return figures(label, r, ours, peer)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:  # one bad file costs its row only
            return f"| {label} | malformed figures ({type(e).__name__}: {e}) | | | | | |".replace("\n", " ")

    for name in names:
        who, prec = name.split("-")
        label = f"{'ringtrain' if who == 'ringtrain' else 'PyTorch'} {prec}"
        rows.append(row(label, runs[name], who == "ringtrain", runs[f"pytorch-{prec}"]))
    nofuse = load(out, "ringtrain-bf16-nofuse")
    if nofuse != "not run":  # what fusing each batch norm with its residual add buys
        rows.append(row("ringtrain bf16, batch norm and residual add unfused", nofuse, True,
                        runs["pytorch-bf16"]))
    if isinstance(trainer, dict):
        peer = runs["pytorch-bf16"]
        ratio = f"{trainer['img_per_s'] / peer['img_per_s']:.2f}" if isinstance(peer, dict) else ""
        rows.append(f"| ringtrain bf16, the trainer (loader, upload, step; 1 rank) | {trainer['img_per_s']:.1f} "
                    f"[{trainer['img_per_s_min']:.1f}–{trainer['img_per_s_max']:.1f}] | | | | "
                    f"| {ratio} (data wait {trainer['data_wait_s'] * 1e3:.1f} ms/step) |")
    elif trainer != "not run":
        rows.append(f"| ringtrain bf16, the trainer | {trainer} | | | | | |")
    rows.append("\nSet-up: from building the model to the end of the warm-up steps; ringtrain's include "
                "timing cuDNN's algorithms once per shape (cudnn.benchmark does it in PyTorch's first steps), "
                "except where algos.tsv already held them. Peak memory in use: cudaMemGetInfo's total − free "
                "after the first step (and at the end), minus that before the model was built. Allocated in "
                "the timed steps: ringtrain's, the device memory rt::cuda holds (nothing is allocated or freed "
                "there); PyTorch's, max_memory_allocated over those steps (its peak reset after the warm-up): "
                "tensors and the library workspaces its caching allocator serves. "
                "Logs: bench-*.log; figures: bench-*.json.")
    return "\n".join(rows) + "\n"


def main(argv):
    if len(argv) == 3 and argv[1] == "trainer":
        s = trainer_summary(argv[2])
        if s is None:
            print(f"gpu_bench_table: no steps after the first {WARM_STEPS} in {argv[2]}", file=sys.stderr)
            return 1
        print(json.dumps(s))
        return 0
    if len(argv) == 5 and argv[1] == "table":
        sys.stdout.write(table(*argv[2:5]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
