#!/usr/bin/python3
"""tools/torch_weights.py on squeeze-and-excitation models, against PyTorch (exit 77, skipped,
without it; timm is not needed: the modules are written out here as timm defines them).

  test_torch_weights_se.py TORCH_COMPARE

- timm's seresnet18 and seresnext50_32x4d, built by hand with random weights, BN statistics and SE
  layers: import recognises the model by names and shapes and records it with its class count;
  ringtrain's eval-mode logits on the imported file equal PyTorch's within fp32 rounding; export
  gives back every tensor bit for bit and names timm's model;
- the recognition's shapes are timm's for every SE model, at any class count, and a state dict
  with one SE layer's width changed is recognised as none.
"""
import contextlib
import io
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
    import torch
    import torch.nn as nn
except ImportError as e:
    print(f"SKIPPED: {e} (tools/setup.sh installs python3-torch)")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPARE = sys.argv[1] if len(sys.argv) > 1 else None
TMP = tempfile.mkdtemp(prefix="rt_torch_weights_se_")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import torch_weights  # noqa: E402


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


class Block(nn.Module):
    """timm's BasicBlock or Bottleneck with attn_layer='se': the gate after the last BN."""
    def __init__(self, bottleneck, inp, planes, stride, groups, per_group):
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
        self.se = SE(out)
        self.downsample = (nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                           if stride != 1 or inp != out else None)

    def forward(self, x):
        y = x
        for i in range(1, self.n + 1):
            y = getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(y))
            if i < self.n:
                y = torch.relu(y)
        y = self.se(y)
        return torch.relu(y + (self.downsample(x) if self.downsample is not None else x))


class SeResNet(nn.Module):
    def __init__(self, arch, classes):
        super().__init__()
        kind, blocks, groups, per_group, _ = torch_weights.TIMM[arch]
        self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)
        inp = 64
        for stage, (count, planes) in enumerate(zip(blocks, (64, 128, 256, 512)), 1):
            layer = []
            for b in range(count):
                layer.append(Block(kind == "bottleneck", inp, planes, 2 if stage > 1 and b == 0 else 1, groups,
                                   per_group))
                inp = planes * (4 if kind == "bottleneck" else 1)
            setattr(self, f"layer{stage}", nn.Sequential(*layer))
        self.fc = nn.Linear(inp, classes)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        for stage in range(1, 5):
            x = getattr(self, f"layer{stage}")(x)
        return self.fc(torch.flatten(x.mean((2, 3)), 1))


def randomized(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(0.5 + torch.rand(m.weight.shape, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
            elif isinstance(m, SE):  # gates away from 1/2, so that a wrong gate shows
                m.fc2.bias.copy_(torch.randn(m.fc2.bias.shape, generator=g))
    return model.eval()


def tool(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = torch_weights.main([str(a) for a in args])
    if rc != 0:
        raise AssertionError(f"{args} failed ({rc}):\n{out.getvalue()}\n{err.getvalue()}")
    return out.getvalue()


class TorchWeightsSe(unittest.TestCase):
    def test_shapes_are_timms(self):
        for arch in torch_weights.TIMM:
            if not torch_weights.TIMM[arch][4]:
                continue
            for classes in (1000, 7):
                want = {k: tuple(v.shape) for k, v in SeResNet(arch, classes).state_dict().items()
                        if not k.endswith(".num_batches_tracked")}
                self.assertEqual(torch_weights.timm_shapes(arch, classes), want, arch)
                self.assertEqual(torch_weights.timm_model(want), arch)
        shapes = torch_weights.timm_shapes("seresnext50_32x4d", 10)
        shapes["layer2.1.se.fc1.weight"] = (64, 512, 1, 1)
        self.assertIsNone(torch_weights.timm_model(shapes))
        self.assertEqual(torch_weights.torchvision_model(shapes), (None, None))

    @unittest.skipIf(COMPARE is None, "no torch_compare program given")
    def test_import_matches_pytorch_and_round_trips(self):
        for arch, classes, size in (("seresnet18", 7, 64), ("seresnext50_32x4d", 4, 64)):
            torch.manual_seed(1)
            model = randomized(SeResNet(arch, classes), 2)
            sd = model.state_dict()
            pth, rtck = os.path.join(TMP, f"{arch}.pth"), os.path.join(TMP, f"{arch}.rtck")
            torch.save(sd, pth)
            self.assertIn(f"({arch}, {classes} classes)", tool("import", pth, rtck))
            x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(3))
            with torch.no_grad():
                want = model(x)
            xf, yf = os.path.join(TMP, "x.f32"), os.path.join(TMP, "y.f32")
            x.numpy().astype("<f4").tofile(xf)
            for backend in ("onednn", "reference"):
                subprocess.run([COMPARE, arch, str(classes), str(size), backend, rtck, xf, yf], check=True,
                               capture_output=True, timeout=240)
                got = torch.from_numpy(np.fromfile(yf, dtype="<f4").reshape(2, classes))
                err = float((got - want).abs().max() / want.abs().max())
                self.assertLess(err, 1e-4, f"{arch} on {backend}: relative difference {err:.2e}")
            back = os.path.join(TMP, f"{arch}_back.pth")
            self.assertIn(f"timm's {arch}(num_classes={classes})", tool("export", rtck, back))
            got = torch.load(back)
            self.assertEqual(set(got), set(sd))
            for k, v in sd.items():
                self.assertTrue(torch.equal(got[k], v), k)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
