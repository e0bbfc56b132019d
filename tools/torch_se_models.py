#!/usr/bin/python3
"""timm's ResNets that torchvision has not (the squeeze-and-excitation ResNets and ResNeXts, the
ResNet-Ds and -Ts, the ECA-ResNets, resnext101_32x4d), written out in PyTorch: timm is not packaged for Debian, and these are what
tools/torch_weights.py's SE tests compare with and what the benchmarks measure PyTorch on.

As a script, the PyTorch peer of the training-step benchmark on them: the models registered in
torchvision.models under timm's names, then the peer's own script run unchanged (its timing,
its clean-iteration rule):
  tools/torch_se_models.py [--channels-last] PEER_SCRIPT.py ARGS...   (e.g. torch_train.py --model seresnext50_32x4d)
"""
import os
import runpy
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_weights  # noqa: E402  (its TIMM table: block, blocks, groups, width per group, attention, stem, avg_down)

ARCHS = tuple(torch_weights.TIMM)


def rd_channels(c):
    # timm's SEModule: make_divisible(c / 16, 8, round_limit=0), written out.
    return max(8, int(c / 16 + 8 / 2) // 8 * 8)


class SE(nn.Module):
    def __init__(self, c):
        super().__init__()
        r = rd_channels(c)
        self.fc1, self.fc2 = nn.Conv2d(c, r, 1), nn.Conv2d(r, c, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.fc2(torch.relu(self.fc1(x.mean((2, 3), keepdim=True)))))


class ECA(nn.Module):
    """timm's EcaModule: a Conv1d across the channel means, its kernel from the channel count."""
    def __init__(self, c):
        super().__init__()
        k = torch_weights.eca_kernel(c)
        self.conv = nn.Conv1d(1, 1, k, padding=(k - 1) // 2, bias=False)

    def forward(self, x):
        y = self.conv(x.mean((2, 3)).view(x.shape[0], 1, -1))
        return x * torch.sigmoid(y).view(x.shape[0], -1, 1, 1)


class Block(nn.Module):
    """timm's BasicBlock or Bottleneck, with attn_layer 'se' or 'eca' the attention after the last
    BN; with avg_down ResNet-D's shortcut (timm's downsample_avg)."""
    def __init__(self, bottleneck, inp, planes, stride, groups, per_group, attn, avg_down):
        super().__init__()
        if bottleneck:
            w, out = planes * per_group // 64 * groups, planes * 4
            convs = [(inp, w, 1, 1, 1), (w, w, 3, stride, groups), (w, out, 1, 1, 1)]
        else:
            out = planes
            convs = [(inp, out, 3, stride, 1), (out, out, 3, 1, 1)]
        for i, (a, b, k, s, g) in enumerate(convs, 1):
            setattr(self, f"conv{i}", nn.Conv2d(a, b, k, s, k // 2, groups=g, bias=False))
            setattr(self, f"bn{i}", nn.BatchNorm2d(b))
        self.n = len(convs)
        self.se = SE(out) if attn == "se" else ECA(out) if attn == "eca" else None
        self.downsample = None
        if (stride != 1 or inp != out) and avg_down:
            pool = (nn.AvgPool2d(2, stride, ceil_mode=True, count_include_pad=False) if stride != 1 else
                    nn.Identity())
            self.downsample = nn.Sequential(pool, nn.Conv2d(inp, out, 1, 1, bias=False), nn.BatchNorm2d(out))
        elif stride != 1 or inp != out:
            self.downsample = nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        y = x
        for i in range(1, self.n + 1):
            y = getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(y))
            if i < self.n:
                y = torch.relu(y)
        if self.se is not None:
            y = self.se(y)
        return torch.relu(y + (self.downsample(x) if self.downsample is not None else x))


class TimmResNet(nn.Module):
    """One of ARCHS with `classes` outputs, timm's tensor names (layerX.Y.se.fc1, ...)."""
    def __init__(self, arch, classes):
        super().__init__()
        kind, blocks, groups, per_group, attn, stem, avg_down = torch_weights.TIMM[arch]
        if stem:  # timm's stem_type 'deep' or 'deep_tiered', stem_width=32
            a = 24 if stem == "tiered" else 32
            self.conv1 = nn.Sequential(nn.Conv2d(3, a, 3, 2, 1, bias=False), nn.BatchNorm2d(a), nn.ReLU(),
                                       nn.Conv2d(a, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                                       nn.Conv2d(32, 64, 3, 1, 1, bias=False))
        else:
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        inp = 64
        for stage, (count, planes) in enumerate(zip(blocks, (64, 128, 256, 512)), 1):
            layer = []
            for b in range(count):
                layer.append(Block(kind == "bottleneck", inp, planes, 2 if stage > 1 and b == 0 else 1, groups,
                                   per_group, attn, avg_down))
                inp = planes * (4 if kind == "bottleneck" else 1)
            setattr(self, f"layer{stage}", nn.Sequential(*layer))
        self.fc = nn.Linear(inp, classes)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        for stage in range(1, 5):
            x = getattr(self, f"layer{stage}")(x)
        return self.fc(torch.flatten(x.mean((2, 3)), 1))


def main(argv):
    import torchvision
    for arch in ARCHS:
        # As torchvision's builders are called: weights=None (random), num_classes.
        setattr(torchvision.models, arch,
                lambda weights=None, num_classes=1000, arch=arch: TimmResNet(arch, num_classes))
    scripts = [i for i, a in enumerate(argv) if a.endswith(".py")]
    if not scripts:
        sys.exit("usage: torch_se_models.py [peer options] PEER_SCRIPT.py [ARGS...]")
    # The peer's options may come before its script (run_torch_best.sh puts --channels-last first).
    i = scripts[0]
    sys.argv = [argv[i]] + argv[:i] + argv[i + 1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[i])))  # as `python3 script` would have it
    runpy.run_path(argv[i], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
