#!/usr/bin/python3
"""PyTorch's side of tools/bench_optimizer.sh: one torch.optim step (SGD with momentum, AdamW;
their default implementations) over torchvision's ResNet-50 parameters, weight decay off for BN
and biases, median and spread after warm-up, printed as bench_optimizer prints its own."""
import argparse, time

import torch
import torchvision

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--iters", type=int, default=10)
a = ap.parse_args()
torch.set_num_threads(a.threads)
model = torchvision.models.resnet50()
decay = [p for p in model.parameters() if p.ndim > 1]
plain = [p for p in model.parameters() if p.ndim <= 1]
for p in model.parameters():
    p.grad = torch.randn_like(p) * 1e-3
groups = [{"params": decay, "weight_decay": 1e-4}, {"params": plain, "weight_decay": 0.0}]
for kind, opt in [("sgd", torch.optim.SGD(groups, lr=1e-4, momentum=0.9)), ("adamw", torch.optim.AdamW(groups, lr=1e-4))]:
    ms = []
    for i in range(2 + a.iters):
        t0 = time.perf_counter()
        opt.step()
        if i >= 2:
            ms.append((time.perf_counter() - t0) * 1e3)
    ms.sort()
    print(f"RESULT,kind={kind},threads={a.threads},median_ms={ms[len(ms) // 2]:.2f},min_ms={ms[0]:.2f},max_ms={ms[-1]:.2f}")
