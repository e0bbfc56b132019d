#!/usr/bin/python3
"""Peer for tools/bench_autoaugment.sh: torchvision ImageFolder + DataLoader images/s with an
automatic augmentation policy, as torchvision's ImageNet reference recipe builds its training
transform (references/classification/presets.py): RandomResizedCrop, RandomHorizontalFlip, the
policy on the PIL image, PILToTensor, ConvertImageDtype(float), Normalize.

usage: /usr/bin/python3 torch_autoaugment.py ROOT --policy none|autoaugment|randaugment|trivialaugment
                        [--workers W] [--batch B] [--size S] [--batches N] [--passes P]
Same protocol as the loader benchmark (tools/bench_data.cc): each pass a fresh loader, one batch
untimed, the next N - 1 timed; the first pass warms up. Prints median and min-max images/s.
"""
import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

POLICIES = {
    "none": None,
    "autoaugment": lambda: transforms.AutoAugment(transforms.AutoAugmentPolicy.IMAGENET),
    "randaugment": lambda: transforms.RandAugment(),
    "trivialaugment": lambda: transforms.TrivialAugmentWide(),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--policy", choices=sorted(POLICIES), default="none")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--passes", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    tf = [transforms.RandomResizedCrop(a.size), transforms.RandomHorizontalFlip()]
    if POLICIES[a.policy]:
        tf.append(POLICIES[a.policy]())
    tf += [transforms.PILToTensor(), transforms.ConvertImageDtype(torch.float),
           transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]
    ds = datasets.ImageFolder(a.root, transforms.Compose(tf))
    if len(ds) < a.batch * a.batches:
        raise SystemExit(f"{a.root}: {len(ds)} images, need at least {a.batch * a.batches}")
    rates = []
    for p in range(a.passes + 1):
        dl = DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers, drop_last=True)
        it = iter(dl)
        next(it)
        t0, n = time.perf_counter(), 0
        for _ in range(a.batches - 1):
            x, _ = next(it)
            n += x.shape[0]
        if p:
            rates.append(n / (time.perf_counter() - t0))
        del it, dl
    print(f"RESULT torchvision_autoaugment policy={a.policy} workers={a.workers} batch={a.batch} "
          f"size={a.size} img_per_s_median={statistics.median(rates):.1f} min={min(rates):.1f} "
          f"max={max(rates):.1f}")


if __name__ == "__main__":
    main()
