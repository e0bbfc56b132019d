#!/usr/bin/python3
"""PyTorch peer of bench_gpu_step: ResNet training-step throughput on one GPU (synthetic data).

Step = forward + CrossEntropy loss + backward + SGD(momentum=0.9, weight_decay=1e-4) step, with
optimizer.zero_grad(set_to_none=True); channels_last; one random batch made on the device once;
torch.backends.cudnn.benchmark = True. Modes:
  fp32  TF32 off for convolutions and matmuls (full fp32 products)
  tf32  torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
  bf16  torch.autocast(dtype=torch.bfloat16) around forward and loss, TF32 on for the rest
  fp16  torch.autocast(dtype=torch.float16) likewise, with GradScaler's dynamic loss scaling
After --warmup steps, --repeats repeats of --steps steps, each ended by torch.cuda.synchronize():
images/s per repeat, reported as median [min, max]. Memory: torch.cuda.max_memory_allocated
(what the caching allocator handed out) and the device memory in use (cudaMemGetInfo) above the
bare context, after the first step and at the end, as bench_gpu_step measures it.

Prints one readable line and one JSON line (starting with '{') per mode; --json FILE appends the
JSON lines to FILE. A non-finite loss still prints them (loss_finite false), then exits non-zero;
fp16's JSON counts the timed steps GradScaler skipped on overflow (skipped_steps). Run one mode
per process for clean memory figures (a later mode's baseline would include the earlier one's
library handles and cached blocks).

  tools/bench_torch_gpu.py --modes fp32,tf32,bf16,fp16 [--batch 256] [--size 224] [--json out.jsonl]
  tools/bench_torch_gpu.py --device cpu --batch 2 --size 64 --steps 2      (smoke test, no GPU)
--profile N: after the timed repeats, N steps under torch.profiler, printed as PROFILE_OP lines
(the ops taking the most device time of their own per step) and PROFILE_KIND lines (that time
summed by the kind of layer, as bench_gpu_step --profile prints its own).
Uses torchvision.models.resnet50 when torchvision is importable (or unless --no-torchvision),
else the same network defined below.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn

try:
    import torchvision
except Exception:  # absent on the GPU machine, or built for another torch
    torchvision = None


class Bottleneck(nn.Module):
    """torchvision's ResNet v1.5 bottleneck: the stride is on the 3x3 convolution."""

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet50(nn.Module):
    """torchvision.models.resnet50(weights=None): same modules, names, parameters and init."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = 64
        for i, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)]):
            layer = []
            for j in range(blocks):
                layer.append(Bottleneck(cin, width, 2 if i > 0 and j == 0 else 1))
                cin = width * 4
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def set_tf32(on):
    """The TF32 switches the issue names (PyTorch 2.9+ warns that they are deprecated and still
    honours them; each sets conv and rnn alike); where they are gone, fp32_precision, with cuDNN's
    conv and rnn set alike (PyTorch refuses to read cuDNN's flag while the two differ)."""
    import warnings
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            torch.backends.cuda.matmul.allow_tf32 = on
            torch.backends.cudnn.allow_tf32 = on  # default True: must be cleared for fp32
    except (AttributeError, RuntimeError):
        prec = "tf32" if on else "ieee"
        torch.backends.cuda.matmul.fp32_precision = prec
        torch.backends.cudnn.conv.fp32_precision = prec
        torch.backends.cudnn.rnn.fp32_precision = prec


def tf32_in_effect():
    """Whether matmuls and cuDNN convolutions may use TF32, read back from PyTorch: a run
    records what applied, and an fp32 run where setting it did nothing fails rather than report
    TF32 figures as fp32."""
    import warnings
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return {"matmul": bool(torch.backends.cuda.matmul.allow_tf32),
                    "cudnn": bool(torch.backends.cudnn.allow_tf32)}
    except (AttributeError, RuntimeError):
        return {"matmul": torch.backends.cuda.matmul.fp32_precision == "tf32",
                "cudnn": torch.backends.cudnn.conv.fp32_precision == "tf32"}


def used_mib(dev):
    """Device memory in use by anyone (total - free), as nvidia-smi counts it."""
    free, total = torch.cuda.mem_get_info(dev)
    return (total - free) / 2**20


# An op's kind of layer by words in its name, checked in this order (addmm is fc, not add;
# _foreach_add_ is the optimizer's).
KINDS = [("conv", ("conv",)), ("bn", ("batch_norm", "batchnorm")), ("relu", ("relu", "threshold", "clamp_min")),
         ("fc", ("addmm", "mm", "linear")), ("optimizer", ("foreach", "sgd")),
         ("loss", ("cross_entropy", "softmax", "nll")), ("pool", ("pool", "mean")), ("add", ("add",)),
         ("cast", ("aten::to", "aten::_to_copy", "aten::copy_"))]


def print_profile(step, sync, n, cuda):
    """Self device time per op per step (CPU time without a GPU), top ops and sums by kind."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(n):
            step()
        sync()

    def own_us(e):
        if not cuda:
            return e.self_cpu_time_total
        for attr in ("self_device_time_total", "self_cuda_time_total"):  # newer, older PyTorch
            v = getattr(e, attr, None)
            if v is not None:
                return v
        return 0.0

    try:
        from torch.autograd import DeviceType
    except ImportError:
        DeviceType = None

    def counted(e):
        # key_averages() carries each kernel's time twice: in the self device time of the op that
        # launched it and in the kernel's own row (device_type CUDA); GPU-side user annotations
        # (Optimizer.step#SGD.step, ...) carry their whole span once more. Count the ops' rows only.
        if getattr(e, "is_user_annotation", False):
            return False
        dt = getattr(e, "device_type", None)
        return not cuda or DeviceType is None or dt is None or dt == DeviceType.CPU

    ops = sorted(((own_us(e) / n / 1e3, e.key) for e in prof.key_averages() if counted(e)), reverse=True)
    kinds, total = {}, sum(ms for ms, _ in ops)
    for ms, name in ops:
        low = name.lower()
        kind = next((k for k, words in KINDS if any(w in low for w in words)), "other")
        kinds[kind] = kinds.get(kind, 0.0) + ms
    if cuda and total <= 0:  # a profiler that could not reach the device (CUPTI) records nothing
        print("PROFILE_ERROR,no device time recorded (CUPTI unavailable?)", flush=True)
        return
    for ms, name in ops[:30]:
        if ms > 0:
            print(f"PROFILE_OP,{name},ms={ms:.3f}")
    for kind, ms in sorted(kinds.items()):
        print(f"PROFILE_KIND,{kind},ms={ms:.1f},share={100 * ms / max(total, 1e-9):.1f}%")
    print(f"PROFILE_TOTAL,ops_ms={total:.1f}", flush=True)


def run(mode, a, dev):
    cuda = dev.type == "cuda"
    set_tf32(mode != "fp32")
    tf32 = tf32_in_effect()
    if mode == "fp32" and any(tf32.values()):
        raise SystemExit(f"bench_torch_gpu: TF32 still allowed after turning it off ({tf32}): "
                         "this PyTorch's switches are not the ones set_tf32 knows")
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        base = used_mib(dev)
    t_setup = time.perf_counter()
    tv = torchvision is not None and not a.no_torchvision
    try:
        model = getattr(torchvision.models, a.model)(weights=None) if tv else ResNet50()
    except Exception as e:  # a torchvision that imports but does not fit this torch
        print(f"bench_torch_gpu: torchvision {torchvision.__version__} failed ({type(e).__name__}: {e}); "
              "using the ResNet-50 defined here", file=sys.stderr)
        tv, model = False, ResNet50()
    model = model.to(dev, memory_format=torch.channels_last).train()
    x = torch.randn(a.batch, 3, a.size, a.size, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (a.batch,), device=dev)
    crit = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)

    lowp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
    # Disabled, the scaler passes the loss through and calls opt.step() itself.
    if hasattr(torch.amp, "GradScaler"):
        scaler = torch.amp.GradScaler(dev.type, enabled=mode == "fp16")
    else:  # PyTorch before 2.3
        scaler = torch.cuda.amp.GradScaler(enabled=mode == "fp16")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=lowp or torch.bfloat16, enabled=lowp is not None):
            loss = crit(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    step()
    sync()
    # Nothing grows after the first step in the steady state; sampled again at the end anyway.
    peak = used_mib(dev) - base if cuda else None
    for _ in range(a.warmup - 1):
        step()
    sync()
    setup_s = time.perf_counter() - t_setup
    if cuda:  # max_memory_allocated below: the timed steps' (cudnn.benchmark's trials are behind)
        torch.cuda.reset_peak_memory_stats(dev)
    # fp16: an overflow halves the scale and skips the step (a cheaper one); with a growth interval
    # of 2000 the scale cannot grow back within the timed steps, so the halvings count the skips.
    scale_before = scaler.get_scale() if mode == "fp16" else 1.0
    rates = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        for _ in range(a.steps):
            loss = step()
        sync()
        rates.append(a.batch * a.steps / (time.perf_counter() - t0))
    skipped = round(math.log2(scale_before / scaler.get_scale())) if mode == "fp16" else 0
    if a.profile > 0:  # after the timed repeats: profiling slows the steps
        try:
            print_profile(step, sync, a.profile, cuda)
        except Exception as e:  # a profiler that fails costs the profile, not the figures
            first = (str(e).splitlines() or [""])[0]
            print(f"PROFILE_ERROR,{type(e).__name__}: {first}", flush=True)
    loss = loss.item()
    r = {
        "name": "pytorch", "model": a.model, "precision": mode, "batch": a.batch, "size": a.size,
        "device": dev.type, "gpu": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "warmup": a.warmup, "steps": a.steps, "repeats": a.repeats,
        "img_per_s": statistics.median(rates), "img_per_s_min": min(rates), "img_per_s_max": max(rates),
        "peak_used_mib": max(peak, used_mib(dev) - base) if cuda else None,
        "max_allocated_mib": torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else None,
        "max_reserved_mib": torch.cuda.max_memory_reserved(dev) / 2**20 if cuda else None,
        "setup_s": setup_s, "loss": loss, "loss_finite": math.isfinite(loss), "skipped_steps": skipped,
        "torch": torch.__version__, "tf32": tf32,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "torchvision": torchvision.__version__ if tv else None,
    }
    mem = (f"; peak {r['max_allocated_mib']:.0f} MiB allocated (max_memory_allocated), "
           f"{r['peak_used_mib']:.0f} MiB in use on the device" if cuda else "")
    print(f"pytorch {a.model} {mode} batch {a.batch} size {a.size} on {r['gpu']}: "
          f"{r['img_per_s']:.1f} img/s median [{min(rates):.1f}-{max(rates):.1f}] over {a.repeats} "
          f"repeats of {a.steps} steps{mem}; setup {setup_s:.1f} s; per repeat "
          + " ".join(f"{v:.1f}" for v in rates)
          + (f"; {skipped} step(s) skipped on overflow" if skipped else ""), flush=True)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet50", choices=["resnet50"])
    ap.add_argument("--modes", default="fp32,tf32,bf16", help="comma-separated: fp32, tf32, bf16, fp16")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps, the first included")
    ap.add_argument("--steps", type=int, default=10, help="steps per timed repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (smoke test)")
    ap.add_argument("--no-torchvision", action="store_true", help="use the ResNet-50 defined here")
    ap.add_argument("--json", help="append one JSON line per mode to this file")
    ap.add_argument("--profile", type=int, default=0, help="steps to profile after the timed ones")
    a = ap.parse_args()
    modes = a.modes.split(",")
    if any(m not in ("fp32", "tf32", "bf16", "fp16") for m in modes) or min(a.warmup, a.steps, a.repeats) < 1:
        ap.error("modes are fp32, tf32, bf16, fp16; --warmup, --steps and --repeats must be >= 1")
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"bench_torch_gpu: no CUDA device for torch {torch.__version__} "
                 f"(built with CUDA {torch.version.cuda})")
    if dev.type == "cuda" and dev.index is None:  # mem_get_info before PyTorch 2.5 needs the index
        dev = torch.device("cuda", torch.cuda.current_device())
    bad = []
    for mode in modes:
        r = run(mode, a, dev)
        line = json.dumps(r)
        print(line, flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(line + "\n")
        if not r["loss_finite"]:  # the figures are printed; the run still fails
            bad.append(f"{mode}: non-finite loss {r['loss']}")
    if bad:
        sys.exit("bench_torch_gpu: " + "; ".join(bad))


if __name__ == "__main__":
    main()
