#!/usr/bin/python3
"""tools/torch_weights.py on timm's models (squeeze-and-excitation, ResNet-D, ECA), against PyTorch (exit
77, skipped, without it; timm is not needed: tools/torch_se_models.py writes the modules out as timm
defines them).

  test_torch_weights_se.py TORCH_COMPARE

- timm's seresnet18, seresnext50_32x4d, resnet18d, seresnext26d_32x4d, ecaresnet26t and
  ecaresnetlight, built by hand with random weights, BN statistics and SE layers: import recognises the model by names and shapes and records it with its class count;
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
from torch_se_models import SE, TimmResNet as SeResNet  # noqa: E402


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
        for arch in torch_weights.TIMM:  # resnext101_32x4d, without SE, the ResNet-Ds and ECA-ResNets too
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
        # ResNet-Ds at 72 pixels: layer3 gets 9x9 and layer4 5x5, so the pooled shortcuts' last
        # windows are clipped (ceil_mode, padding not counted) as in PyTorch.
        for arch, classes, size in (("seresnet18", 7, 64), ("seresnext50_32x4d", 4, 64), ("resnet18d", 6, 72),
                                    ("seresnext26d_32x4d", 3, 72), ("ecaresnet26t", 5, 72), ("ecaresnetlight", 3, 64)):
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

    def test_benchmark_peer_runs_its_script_on_timms_models(self):
        # tools/torch_se_models.py as run_torch_best.sh runs it: a peer option before the script.
        script = os.path.join(TMP, "peer.py")
        with open(script, "w") as f:
            f.write("import sys, torchvision\n"
                    "m = torchvision.models.seresnext50_32x4d(weights=None)\n"
                    "print(sum(p.numel() for p in m.parameters()), sys.argv[1:])\n")
        out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "torch_se_models.py"), "--channels-last",
                              script, "--model", "seresnext50_32x4d"], check=True, capture_output=True, text=True,
                             timeout=120).stdout
        self.assertEqual(out, "27559896 ['--channels-last', '--model', 'seresnext50_32x4d']\n")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
