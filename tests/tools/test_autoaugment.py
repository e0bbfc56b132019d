#!/usr/bin/python3
"""data/autoaugment.h against torchvision's own transforms (exit 77, skipped, without them).

  test_autoaugment.py AUGMENT_OPS

- ops: every op at every magnitude the three policies can draw (both signs), through torchvision's
  own _apply_op on uint8 tensors, on images of three sizes given as RGB and as BGR: the pixel ops
  byte for byte; sharpness (a 3x3 convolution summed in an order torch picks) and the geometric ops
  (float32 grid arithmetic, where a pixel centre on a rounding tie may take its neighbour) within a
  small share of differing bytes;
- magnitudes: every bin of every op is torchvision's _augmentation_space value, to the last bit of
  a float32 (which torch's linspace itself rounds by its SIMD width);
- draws: over many images each (op, magnitude) comes up as often as torchvision's policy makes it
  likely (within 5 sigma), AutoAugment's pairs of all three policies included, and nothing else
  comes up;
- random erasing's boxes: the share of images left unerased, the boxes' mean area, aspect ratio and
  position, as torchvision's RandomErasing.get_params draws them (within 5 standard errors).
"""
import math
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
    import torch
    from torchvision.transforms import InterpolationMode, RandomErasing
    from torchvision.transforms import autoaugment as AA
except ImportError as e:
    print(f"SKIPPED: {e} (tools/setup.sh installs python3-torch and python3-torchvision)")
    sys.exit(77)

TOOL = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="rt_autoaugment_")
NAMES = {"Identity": "identity", "ShearX": "shear_x", "ShearY": "shear_y", "TranslateX": "translate_x",
         "TranslateY": "translate_y", "Rotate": "rotate", "Brightness": "brightness", "Color": "color",
         "Contrast": "contrast", "Sharpness": "sharpness", "Posterize": "posterize",
         "Solarize": "solarize", "AutoContrast": "autocontrast", "Equalize": "equalize",
         "Invert": "invert"}
GEOMETRY = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"}
SIGNED = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
          "Contrast", "Sharpness"}


def test_image(w, h, seed):
    """Gradients, noise, a flat patch and a narrow-range channel: every op has something to do."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), 100 + (x + y) % 41], -1)
    img = np.clip(img + rng.integers(-30, 31, size=(h, w, 3)), 0, 255).astype(np.uint8)
    img[: h // 4, : w // 4] = (200, 30, 90)
    return img


def spaces(w, h):
    """{policy: (torchvision's space {op: (magnitudes, signed)}, bins)}."""
    return {
        "randaugment": (AA.RandAugment()._augmentation_space(31, (h, w)), 31),
        "trivialaugment": (AA.TrivialAugmentWide()._augmentation_space(31), 31),
        "autoaugment": (AA.AutoAugment()._augmentation_space(10, (h, w)), 10),
        "autoaugment_cifar10": (AA.AutoAugment()._augmentation_space(10, (h, w)), 10),
        "autoaugment_svhn": (AA.AutoAugment()._augmentation_space(10, (h, w)), 10),
    }
POLICIES = {"autoaugment": AA.AutoAugmentPolicy.IMAGENET, "autoaugment_cifar10": AA.AutoAugmentPolicy.CIFAR10,
            "autoaugment_svhn": AA.AutoAugmentPolicy.SVHN}


def all_steps(w, h):
    steps = set()
    for space, _ in spaces(w, h).values():
        for op, (mags, signed) in space.items():
            values = [float(v) for v in mags.tolist()] if mags.ndim > 0 else [0.0]
            for v in values:
                steps.add((op, v))
                if signed:
                    steps.add((op, -v))
    return sorted(steps)


def run_tool(img, red, commands):
    h, w, _ = img.shape
    src, dst = os.path.join(TMP, "in.u8"), os.path.join(TMP, "out.u8")
    (img if red == 0 else img[..., ::-1]).tofile(src)
    p = subprocess.run([TOOL, src, str(w), str(h), str(red), dst], input="\n".join(commands) + "\n",
                       capture_output=True, text=True, check=True)
    out = np.fromfile(dst, dtype=np.uint8).reshape(-1, h, w, 3) if os.path.exists(dst) else None
    if out is not None and red != 0:
        out = out[..., ::-1]
    return p.stdout, out


class Ops(unittest.TestCase):
    def check_size(self, w, h, seed):
        img = test_image(w, h, seed)
        steps = all_steps(w, h)
        chw = torch.from_numpy(img.copy()).permute(2, 0, 1).contiguous()
        want = np.stack([AA._apply_op(chw, op, m, InterpolationMode.NEAREST, None).permute(1, 2, 0).numpy()
                         for op, m in steps])
        worst = {}
        for red in (0, 2):
            _, got = run_tool(img, red, [f"apply {NAMES[op]} {m!r}" for op, m in steps])
            self.assertEqual(got.shape, want.shape)
            for i, (op, m) in enumerate(steps):
                diff = np.abs(got[i].astype(int) - want[i].astype(int))
                share = np.count_nonzero(diff) / diff.size
                what = f"{op}({m!r}) on {w}x{h}, red at {red}"
                if op in GEOMETRY:
                    self.assertLessEqual(share, 0.01, what)  # pixels on rounding ties
                elif op == "Sharpness":
                    self.assertLessEqual(diff.max(), 1, what)
                    self.assertLessEqual(share, 0.002, what)
                else:
                    self.assertEqual(share, 0, what)
                worst[op] = max(worst.get(op, 0), share)
        # Nearly all of it is exact: a systematic error would show at many magnitudes.
        for op in GEOMETRY | {"Sharpness"}:
            self.assertLess(worst[op], 0.01, op)
        print(f"{w}x{h}: {len(steps)} steps x 2 layouts; largest share of bytes differing: "
              + ", ".join(f"{op} {share:.2%}" for op, share in sorted(worst.items()) if share), file=sys.stderr)

    def test_small(self):
        self.check_size(64, 48, 1)

    def test_odd(self):
        self.check_size(31, 17, 2)

    def test_imagenet_size(self):
        self.check_size(224, 224, 3)


class Magnitudes(unittest.TestCase):
    def test_every_bin(self):
        for w, h in ((224, 224), (64, 48)):
            for policy, (space, bins) in spaces(w, h).items():
                cmds, want = [], []
                for op, (mags, _) in space.items():
                    if mags.ndim == 0:
                        continue
                    for b, v in enumerate(mags.tolist()):
                        cmds.append(f"magnitude {policy} {NAMES[op]} {b} {bins} {w} {h}")
                        want.append((op, b, float(v)))
                out, _ = run_tool(test_image(8, 8, 0), 0, cmds)
                got = out.split()
                self.assertEqual(len(got), len(want))
                for (op, b, v), line in zip(want, got):
                    ulp = abs(float(np.spacing(np.float32(v))))
                    self.assertLessEqual(abs(float(line) - v), ulp, f"{policy} {op} bin {b} at {w}x{h}")


class Draws(unittest.TestCase):
    N = 200000

    def expected(self, policy, ops, magnitude, w, h):
        """{(op, magnitude): probability per image} as torchvision's forward draws them."""
        space, bins = spaces(w, h)[policy]
        p = {}

        def add(op, m, q):
            p[(NAMES[op], m)] = p.get((NAMES[op], m), 0) + q

        def add_signed(op, m, q):
            if space[op][1]:
                add(op, m, q / 2)
                add(op, -m, q / 2)
            else:
                add(op, m, q)

        if policy in POLICIES:
            pairs = AA.AutoAugment()._get_policies(POLICIES[policy])
            for pair in pairs:
                for op, prob, b in pair:
                    m = float(space[op][0][b].item()) if b is not None else 0.0
                    add_signed(op, m, prob / len(pairs))
            return p
        for op, (mags, _) in space.items():
            q = (ops if policy == "randaugment" else 1) / len(space)
            if mags.ndim == 0:
                add(op, 0.0, q)
            elif policy == "randaugment":
                add_signed(op, float(mags[magnitude].item()), q)
            else:
                for v in mags.tolist():
                    add_signed(op, float(v), q / len(mags))
        return p

    def check(self, policy, ops=2, magnitude=9, w=224, h=224):
        out, _ = run_tool(test_image(8, 8, 0), 0, [f"draw {policy} {ops} {magnitude} {w} {h} {self.N} 7"])
        want = self.expected(policy, ops, magnitude, w, h)
        # A policy's own zero-probability entries (AutoAugment's Equalize at 0.0) are never drawn.
        want = {k: q for k, q in want.items() if q > 0}
        got = {}
        for line in out.splitlines():
            op, m, c = line.split()
            m = float(m)
            # torchvision's magnitude within a float32's last bit (see Magnitudes), else as drawn.
            key = next((k for k in want if k[0] == op and abs(k[1] - m) <= abs(float(np.spacing(np.float32(m))))),
                       (op, m))
            got[key] = got.get(key, 0) + int(c)
        self.assertEqual(set(got) - set(want), set(), f"{policy}: drawn but not in torchvision's policy")
        for k, q in want.items():
            mean = self.N * q
            sigma = math.sqrt(self.N * q * (1 - min(q, 1)) + 1e-9)
            self.assertLessEqual(abs(got.get(k, 0) - mean), 5 * sigma + 1, f"{policy} {k}: {got.get(k, 0)} vs {mean:.0f}")

    def test_randaugment(self):
        self.check("randaugment")
        self.check("randaugment", ops=3, magnitude=15, w=160, h=160)

    def test_trivialaugment(self):
        self.check("trivialaugment")

    def test_autoaugment(self):
        for policy in POLICIES:
            self.check(policy, w=32, h=32)
        self.check("autoaugment")


class Erasing(unittest.TestCase):
    N = 20000

    def stats(self, boxes, w, h):
        """Per box: unerased (0/1), area share, log(h / w), centre x and y as shares of the image."""
        rows = []
        for x, y, bw, bh in boxes:
            if bw * bh == 0:
                rows.append((1, 0.0, 0.0, 0.5, 0.5))
            else:
                rows.append((0, bw * bh / (w * h), math.log(bh / bw), (x + bw / 2) / w, (y + bh / 2) / h))
        return np.array(rows)

    def test_boxes(self):
        for w, h in ((224, 224), (64, 48)):
            out, _ = run_tool(test_image(8, 8, 0), 0, [f"erase {w} {h} {self.N} 5"])
            ours = self.stats([tuple(map(int, l.split())) for l in out.splitlines()], w, h)
            torch.manual_seed(0)
            img = torch.zeros(3, h, w)
            theirs = []
            for _ in range(self.N):
                i, j, bh, bw, _ = RandomErasing.get_params(img, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=[0])
                theirs.append((j, i, bw, bh) if (bh, bw) != (h, w) else (0, 0, 0, 0))
            theirs = self.stats(theirs, w, h)
            self.assertEqual(len(ours), self.N)
            for k, name in enumerate(("unerased", "area", "log ratio", "centre x", "centre y")):
                a, b = ours[:, k], theirs[:, k]
                se = math.sqrt(a.var() / len(a) + b.var() / len(b)) + 1e-9
                self.assertLessEqual(abs(a.mean() - b.mean()), 5 * se, f"{name} at {w}x{h}: {a.mean()} vs {b.mean()}")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
