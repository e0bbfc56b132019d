#!/usr/bin/python3
"""tools/torch_weights.py against PyTorch + torchvision themselves (exit 77, skipped, without them).

  test_torch_weights.py TORCH_COMPARE TRAINER

- import: torchvision ResNets with random weights and BN statistics, saved as a DataParallel-style
  checkpoint; ringtrain's eval-mode logits on the imported file (oneDNN and reference backends)
  equal PyTorch's on the same input within fp32 rounding, and export gives back every tensor bit for bit;
- export: a checkpoint the trainer wrote loads into torchvision's model (strict) and gives the
  trainer's logits; imported again, `trainer --eval --weights` reports exactly what
  `trainer --eval --checkpoint` does, for its moving average of the weights (export --ema) too;
- one training step on the imported weights: loss, logits, every gradient and the BN running
  statistics' update equal PyTorch's autograd on the same input (both in double);
- fine-tuning (`trainer --weights`) from an imported state dict of another class count;
- model.width: a trained width-0.25 resnet20, exported and imported with --model, records the
  width its channels give (and shortcut B where its tensors are there), and `--eval --weights`
  without --config scores what the checkpoint does; without the file's shortcut tensors, refused;
- refusals: a damaged file, a weights file given to --resume, --eval of a file that lacks a
  tensor, a state dict holding something other than tensors, one with no tensors or empty ones, a
  --model the trainer does not build, contradicts the tensors, cannot be recorded with a class
  count or fits the channels of no model.width, an output that is a device, folder, pipe or
  symlink, a full disk (no file left behind).
"""
import contextlib
import errno
import io
import os
import re
import stat
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
    import torch
    import torchvision
except ImportError as e:
    print(f"SKIPPED: {e} (tools/setup.sh installs python3-torch and python3-torchvision)")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "torch_weights.py")
COMPARE, TRAINER = sys.argv[1], sys.argv[2]
TMP = tempfile.mkdtemp(prefix="rt_torch_weights_")


sys.path.insert(0, os.path.join(ROOT, "tools"))
import torch_weights  # noqa: E402


def run(*args, ok=True):
    if args[0] == TOOL:
        # tools/torch_weights.py's main() in this process: its command line's code, without a
        # new interpreter importing PyTorch for each of a dozen calls (two thirds of the time).
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = torch_weights.main([str(a) for a in args[1:]])
        p = subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())
    else:
        p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=240)
    if ok and p.returncode != 0:
        raise AssertionError(f"{args} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def path(name):
    return os.path.join(TMP, name)


def randomized(model, seed):
    """Random BN affine parameters and running statistics: eval-mode BN is then no identity."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.copy_(0.5 + torch.rand(m.weight.shape, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
    return model.eval()


def ringtrain_logits(arch, classes, size, backend, weights, x):
    xf, yf = path("x.f32"), path("y.f32")
    x.numpy().astype("<f4").tofile(xf)
    run(COMPARE, arch, classes, size, backend, weights, xf, yf)
    return torch.from_numpy(np.fromfile(yf, dtype="<f4").reshape(x.shape[0], classes))


class TorchWeights(unittest.TestCase):
    def assert_logits_close(self, ours, theirs, what, tolerance=1e-4):
        # fp32 sums in another order: ~1e-6 of the logits' scale; a wrong weight order is O(1).
        err = float((ours - theirs).abs().max() / theirs.abs().max())
        self.assertLess(err, tolerance, f"{what}: relative difference {err:.2e}")

    def test_import_matches_pytorch_and_round_trips(self):
        # Wide ResNets are resnet50's graph with wider bottlenecks (their shapes are held to
        # torchvision's by test_resnet and the recognition test below): 69M parameters more
        # through both file formats would add nothing but time.
        for arch, classes, size, backends in (("resnet18", 7, 64, ("onednn", "reference")),
                                              ("resnet50", 3, 64, ("onednn",)),
                                              ("resnext50_32x4d", 4, 64, ("onednn",))):
            torch.manual_seed(1)
            model = randomized(getattr(torchvision.models, arch)(num_classes=classes), 2)
            sd = model.state_dict()
            pth, rtck = path(f"{arch}.pth"), path(f"{arch}.rtck")
            # Wrapped as training scripts save it: {"state_dict": {"module.<name>": ...}}.
            torch.save({"epoch": 3, "state_dict": {"module." + k: v for k, v in sd.items()}}, pth)
            out = run(TOOL, "import", pth, rtck).stdout
            self.assertIn(f"({arch}, {classes} classes)", out)
            x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(3))
            with torch.no_grad():
                want = model(x)
            for backend in backends:
                self.assert_logits_close(ringtrain_logits(arch, classes, size, backend, rtck, x), want,
                                         f"{arch} on {backend}")
            back = path(f"{arch}_back.pth")
            self.assertIn(f"loads into torchvision.models.{arch}", run(TOOL, "export", rtck, back).stdout)
            got = torch.load(back)
            self.assertEqual(set(got), set(sd))
            for k, v in sd.items():
                self.assertTrue(torch.equal(got[k], v), k)

    def test_wide_resnets_are_recognised(self):
        # By names and shapes alone (what import records as the model and export names), among
        # the models of the same depth.
        for arch in ("wide_resnet50_2", "wide_resnet101_2"):
            with torch_weights.weights_not_drawn():
                model = getattr(torchvision.models, arch)(num_classes=5)
            shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
            self.assertEqual(torch_weights.torchvision_model(shapes)[0], arch)

    def test_training_step_matches_pytorch(self):
        # The whole training step against an independent implementation: batch-statistics BN,
        # label smoothing, every parameter's gradient and the running statistics' update. Both
        # sides in double (see torch_compare.cc: in float a ReLU input within rounding of 0 may
        # fall either way and move a gradient by 1e-2; the float backends' gradients are held to
        # the reference's by the oneDNN tests).
        torch.manual_seed(5)
        model = randomized(torchvision.models.resnet18(num_classes=6), 6)
        torch.save(model.state_dict(), path("t.pth"))
        run(TOOL, "import", path("t.pth"), path("t.rtck"))
        model = model.double().train()
        g = torch.Generator().manual_seed(7)
        x, y = torch.randn(4, 3, 64, 64, generator=g), torch.randint(0, 6, (4,), generator=g)
        logits = model(x.double())
        loss = torch.nn.functional.cross_entropy(logits, y, label_smoothing=0.1)
        loss.backward()
        want = {k: v.grad for k, v in model.named_parameters()}
        want.update({k: v for k, v in model.state_dict().items() if k.endswith(("running_mean", "running_var"))})
        x.numpy().astype("<f4").tofile(path("x.f32"))
        y.numpy().astype("<i4").tofile(path("y.i32"))
        out = run(COMPARE, "resnet18", 6, 64, "reference-double", path("t.rtck"), path("x.f32"), path("z.f32"),
                  path("y.i32"), 0.1, path("step.rtck")).stdout
        self.assertAlmostEqual(float(out), loss.item(), delta=1e-9 * loss.item())
        z = torch.from_numpy(np.fromfile(path("z.f32"), dtype="<f4").reshape(4, 6)).double()
        self.assert_logits_close(z, logits.detach(), "training logits", 1e-6)
        ours = torch_weights.checkpoint_tensors(path("step.rtck"))[0]
        self.assertEqual(set(ours), set(want))
        # Stored as f32: 6e-8 of rounding.
        worst = max((float((torch.from_numpy(ours[k]).double() - v).abs().max() / v.abs().max()), k)
                    for k, v in want.items())
        self.assertLess(worst[0], 1e-6, f"{worst[1]} differs by {worst[0]:.2e} (relative)")

    def test_trainer_checkpoint_exports_and_evaluates_the_same(self):
        cfg = path("job.yaml")
        with open(cfg, "w") as f:
            f.write("model: {name: resnet18, classes: 5}\n"
                    "data: {synthetic: true, synthetic_samples: 24, synthetic_classes: 5, image_size: 32, threads: 1}\n"
                    "train: {epochs: 1, batch: 4, ema: 0.9}\n"
                    "optimizer: {lr: 0.05}\n"
                    f"log: {{print_config: false}}\nthreads: 1\nrun_dir: {path('run')}\n")
        run(TRAINER, "--config", cfg)
        ckdir = path("run/checkpoints")
        ckpt = os.path.join(ckdir, sorted(os.listdir(ckdir))[-1])
        pth = path("trained.pth")
        self.assertIn("loads into torchvision.models.resnet18(num_classes=5)", run(TOOL, "export", ckpt, pth).stdout)
        model = torchvision.models.resnet18(num_classes=5)
        model.load_state_dict(torch.load(pth), strict=True)
        model.eval()
        x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            want = model(x)
        self.assert_logits_close(ringtrain_logits("resnet18", 5, 32, "onednn", ckpt, x), want, "trained resnet18")

        weights = path("trained.rtck")
        run(TOOL, "import", pth, weights)
        figures = lambda out: re.search(r"top1 .* over \d+ images", out).group(0)
        a = run(TRAINER, "--eval", "--checkpoint", ckpt, "--config", cfg).stdout
        b = run(TRAINER, "--eval", "--weights", weights, "--config", cfg).stdout
        self.assertEqual(figures(a), figures(b))
        self.assertIn("weights from " + weights + ": 102 of 102 tensors", b)
        # Without --config: the model the import recorded; the data come from --set.
        c = run(TRAINER, "--eval", "--weights", weights, "--set", "data.synthetic=true", "--set",
                "data.synthetic_samples=24", "--set", "data.synthetic_classes=5", "--set", "data.image_size=32",
                "--set", "train.batch=4", "--set", "threads=1", "--set", f"run_dir={path('run2')}").stdout
        self.assertEqual(figures(a), figures(c))
        # The moving average (train.ema): exported alone, it scores what --eval of the checkpoint
        # reports for it.
        scores = lambda out: re.search(r"top1 \S+ top5 \S+ loss \S+", out).group(0)
        self.assertIn("(its moving average)", run(TOOL, "export", "--ema", ckpt, path("ema.pth")).stdout)
        run(TOOL, "import", path("ema.pth"), path("ema.rtck"))
        d = run(TRAINER, "--eval", "--weights", path("ema.rtck"), "--config", cfg).stdout
        self.assertEqual(scores(a.split("its moving average of the weights: ")[1]), scores(d))
        self.assertNotEqual(scores(a), scores(d))
        self.assertNotIn("moving average", b)  # a weights file has none
        p = run(TOOL, "export", "--ema", path("trained.rtck"), path("none.pth"), ok=False)
        self.assertIn("no moving average of the weights in it", p.stderr)

        p = run(TRAINER, "--config", cfg, "--resume", weights, ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(f"{weights}: holds weights only, no training state", p.stderr + p.stdout)
        other = path("other.pth")
        torch.save(torchvision.models.resnet18(num_classes=7).state_dict(), other)
        run(TOOL, "import", other, path("other.rtck"))
        p = run(TRAINER, "--eval", "--weights", path("other.rtck"), "--config", cfg, ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--eval needs every tensor of resnet18; 2 of 102 are not in it", p.stderr + p.stdout)
        # ... but fine-tuning starts from it: every tensor but the classifier.
        out = run(TRAINER, "--config", cfg, "--weights", path("other.rtck"), "--set", "train.steps=1", "--set",
                  f"run_dir={path('tune')}").stdout
        self.assertIn("100 of 102 tensors; as initialised: fc.bias ([5]; the checkpoint's is [7])", out)

    def test_refusals_name_the_file(self):
        torch.save(torchvision.models.resnet18(num_classes=2).state_dict(), path("r.pth"))
        run(TOOL, "import", path("r.pth"), path("r.rtck"))
        with open(path("r.rtck"), "rb") as f:
            data = bytearray(f.read())
        data[len(data) // 2] ^= 0x40
        with open(path("bad.rtck"), "wb") as f:
            f.write(bytes(data))
        # The command line itself, once: its exit status and message.
        p = run(sys.executable, TOOL, "export", path("bad.rtck"), path("bad.pth"), ok=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn(f"{path('bad.rtck')}: corrupt: checksum mismatch", p.stderr)
        self.assertFalse(os.path.exists(path("bad.pth")))
        # resnet18's names with a CIFAR-style 3x3 stem: converted both ways, not taken for resnet18.
        wide = torchvision.models.resnet18(num_classes=3).state_dict()
        wide["conv1.weight"] = torch.randn(64, 3, 3, 3)
        torch.save(wide, path("wide.pth"))
        self.assertIn("(not the names and shapes of torchvision's ResNets",
                      run(TOOL, "import", path("wide.pth"), path("wide.rtck")).stdout)
        self.assertIn("(not the names and shapes of torchvision's ResNets",
                      run(TOOL, "export", path("wide.rtck"), path("wide2.pth")).stdout)
        got = torch.load(path("wide2.pth"))
        self.assertTrue(all(torch.equal(got[k], v) for k, v in wide.items()))
        # A file that names no model: --eval's model is the job's own default, and the error says so
        # rather than listing the defaults as the file's.
        p = run(TRAINER, "--eval", "--weights", path("wide.rtck"), "--set", "data.synthetic=true", "--set",
                "data.synthetic_samples=4", "--set", "data.image_size=32", "--set", "threads=1", "--set",
                f"run_dir={path('wide_eval')}", ok=False)
        self.assertIn("--eval needs every tensor of resnet50", p.stderr)
        self.assertIn("the file names no model (resnet50 is this job's", p.stderr)
        self.assertNotIn("in the file", p.stderr)
        # The two kinds of file swapped: each named for what it is.
        p = run(TOOL, "import", path("r.rtck"), path("r2.rtck"), ok=False)
        self.assertIn(f"{path('r.rtck')}: already a ringtrain checkpoint", p.stderr)
        p = run(TRAINER, "--eval", "--weights", path("r.pth"), ok=False)
        self.assertIn(f"{path('r.pth')}: not a ringtrain checkpoint but, by its first bytes, a PyTorch file: "
                      "convert a state dict with tools/torch_weights.py import", p.stderr)
        # torch.compile's wrapper, inside DataParallel's: the names within.
        sd = torchvision.models.resnet18(num_classes=2).state_dict()
        torch.save({"module._orig_mod." + k: v for k, v in sd.items()}, path("compiled.pth"))
        self.assertIn("(resnet18, 2 classes)", run(TOOL, "import", path("compiled.pth"), path("compiled.rtck")).stdout)
        torch.save(torchvision.models.resnet18(num_classes=2), path("whole.pth"))  # runs code when loaded
        p = run(TOOL, "import", path("whole.pth"), path("whole.rtck"), ok=False)
        self.assertIn("a whole pickled model? save its state_dict()", p.stderr)
        torch.save({"fc.weight": torch.zeros(2, 2), "note": "hello"}, path("odd.pth"))
        p = run(TOOL, "import", path("odd.pth"), path("odd.rtck"), ok=False)
        self.assertIn(f"{path('odd.pth')}: 'note' is not a tensor", p.stderr)
        self.assertFalse(os.path.exists(path("odd.rtck")))

    def test_training_scripts_checkpoints_and_their_moving_average(self):
        import argparse
        model, avg = torchvision.models.resnet18(num_classes=3), torchvision.models.resnet18(num_classes=3)
        ema = {"module." + k: v for k, v in avg.state_dict().items()}  # AveragedModel's names and count
        ema["n_averaged"] = torch.tensor(7)
        args = argparse.Namespace(lr=0.5, model="resnet18")  # the script's arguments, saved beside
        # torchvision's reference train.py and timm's train.py, with the weights' moving average.
        torch.save({"model": model.state_dict(), "model_ema": ema, "args": args, "epoch": 3}, path("tv_ref.pth"))
        torch.save({"state_dict": model.state_dict(), "state_dict_ema": avg.state_dict(), "arch": "resnet18",
                    "args": args}, path("timm.pth"))
        safe = hasattr(torch.serialization, "safe_globals")  # where a Namespace loads without trust
        for name in ("tv_ref.pth", "timm.pth"):
            p = run(TOOL, "import", path(name), path(name + ".rtck"), ok=safe)
            if not safe:
                self.assertIn("a whole pickled model? save its state_dict(); or, where you trust the file's "
                              "source (loading it may run code it holds), --trust-pickle", p.stderr)
                self.assertFalse(os.path.exists(path(name + ".rtck")))
            trust = [] if safe else ["--trust-pickle"]
            for ema_flag, want in (([], model), (["--ema"], avg)):
                out = path(name + "".join(ema_flag) + ".rtck")
                run(TOOL, "import", path(name), out, *ema_flag, *trust)
                got = torch_weights.checkpoint_tensors(out)[0]
                sd = want.state_dict()
                self.assertEqual(set(got), {k for k in sd if not k.endswith("num_batches_tracked")}, name)
                for k, a in got.items():
                    self.assertTrue(np.array_equal(a, sd[k].numpy()), f"{name} {ema_flag}: {k}")
        torch.save(model.state_dict(), path("bare.pth"))
        p = run(TOOL, "import", path("bare.pth"), path("bare_ema.rtck"), "--ema", ok=False)
        self.assertIn(f"{path('bare.pth')}: no moving average of the weights in it (a training checkpoint's "
                      "model_ema or state_dict_ema); import it without --ema", p.stderr)

    def test_imports_the_trainer_would_reject_are_refused(self):
        for name, sd, msg in (
                ("counters", {"bn1.num_batches_tracked": torch.tensor(3)},
                 "no tensors to import (only BN counters, num_batches_tracked)"),
                ("empty", {"conv1.weight": torch.zeros(4, 3, 3, 3), "fc.bias": torch.zeros(0)},
                 "'fc.bias' has no values (shape [0])"),
                ("empty2", {"fc.weight": torch.zeros(3, 0)}, "'fc.weight' has no values (shape [3, 0])")):
            pth, rtck = path(f"{name}.pth"), path(f"{name}.rtck")
            torch.save(sd, pth)
            p = run(TOOL, "import", pth, rtck, ok=False)
            self.assertEqual(p.returncode, 1)
            self.assertIn(f"torch_weights: {pth}: {msg}", p.stderr)
            self.assertFalse(os.path.exists(rtck))

    def test_model_is_one_the_trainer_builds_and_is_recorded(self):
        sd = torchvision.models.resnet18(num_classes=3).state_dict()
        torch.save(sd, path("m.pth"))
        # Not a name of the trainer's (a newline would have gone into the recorded YAML as it was).
        for bad in ("resnet99", "resnet18\nclasses: 5"):
            p = run(sys.executable, TOOL, "import", path("m.pth"), path("m.rtck"), "--model", bad, ok=False)
            self.assertEqual(p.returncode, 2)
            self.assertIn("argument --model: invalid choice", p.stderr)
        p = run(TOOL, "import", path("m.pth"), path("m.rtck"), "--model", "resnet50", ok=False)
        self.assertIn(f"{path('m.pth')}: --model resnet50: its tensors are those of torchvision's resnet18", p.stderr)
        # No classifier: the class count to record beside the model is unknown.
        torch.save({k: v for k, v in sd.items() if not k.startswith("fc.")}, path("headless.pth"))
        p = run(TOOL, "import", path("headless.pth"), path("headless.rtck"), "--model", "resnet18", ok=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("--model resnet18: no fc.weight of [classes, features] in it", p.stderr)
        self.assertFalse(os.path.exists(path("headless.rtck")))
        self.assertIn("100 tensors", run(TOOL, "import", path("headless.pth"), path("headless.rtck")).stdout)
        # A CIFAR ResNet (torchvision has none) by the name given, with fc's class count and the
        # width its channels give (a quarter: 4 of 16 in the stem, 16 of 64 into fc).
        cifar = {"conv1.weight": torch.randn(4, 3, 3, 3), "fc.weight": torch.randn(6, 16), "fc.bias": torch.zeros(6)}
        torch.save(cifar, path("c.pth"))
        self.assertIn("(resnet20, 6 classes, width 0.25)", run(TOOL, "import", path("c.pth"), path("c.rtck"),
                                                               "--model", "resnet20").stdout)
        config = torch_weights.read_rtck(path("c.rtck"))[1]["config"].decode()
        self.assertIn("model:\n  name: resnet20\n  classes: 6\n  width: 0.25\n", config)
        # Channels that no one width gives: refused, naming two that disagree.
        torch.save(dict(cifar, **{"fc.weight": torch.randn(6, 4)}), path("c2.pth"))
        p = run(TOOL, "import", path("c2.pth"), path("c2.rtck"), "--model", "resnet20", ok=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("--model resnet20: its channels fit no model.width: conv1.weight has 4 channels (16 at width "
                      "1), but fc.weight has 4 inputs (64 at width 1)", p.stderr)
        self.assertFalse(os.path.exists(path("c2.rtck")))

    def test_width_is_found_and_recorded(self):
        # A trained resnet20 at model.width 0.25, exported and imported back: the import finds the
        # width in the channels and records it (and projection shortcuts, B, from their tensors),
        # so that --eval of the weights without --config builds the same model and scores what
        # --eval of the checkpoint does. The model without the file's shortcut tensors is refused.
        for shortcut in ("A", "B"):
            cfg = path(f"narrow{shortcut}.yaml")
            with open(cfg, "w") as f:
                f.write(f"model: {{name: resnet20, classes: 4, width: 0.25, cifar_shortcut: {shortcut}}}\n"
                        "data: {synthetic: true, synthetic_samples: 16, synthetic_classes: 4, image_size: 32, "
                        "threads: 1}\ntrain: {epochs: 1, batch: 4}\n"
                        f"log: {{print_config: false}}\nthreads: 1\nrun_dir: {path('narrow' + shortcut)}\n")
            run(TRAINER, "--config", cfg)
            ckdir = path(f"narrow{shortcut}/checkpoints")
            ckpt = os.path.join(ckdir, sorted(os.listdir(ckdir))[-1])
            run(TOOL, "export", ckpt, path("narrow.pth"))
            weights = path(f"narrow{shortcut}.rtck")
            extra = ", shortcut B" if shortcut == "B" else ""
            self.assertIn(f"(resnet20, 4 classes, width 0.25{extra})",
                          run(TOOL, "import", path("narrow.pth"), weights, "--model", "resnet20").stdout)
            self.assertIn("model:\n  name: resnet20\n  classes: 4\n  width: 0.25\n" +
                          ("  cifar_shortcut: B\n" if shortcut == "B" else ""),
                          torch_weights.read_rtck(weights)[1]["config"].decode())
            figures = lambda out: re.search(r"top1 .* over \d+ images", out).group(0)
            a = run(TRAINER, "--eval", "--checkpoint", ckpt, "--config", cfg).stdout
            job = ["--set", "data.synthetic=true", "--set", "data.synthetic_samples=16", "--set",
                   "data.synthetic_classes=4", "--set", "data.image_size=32", "--set", "train.batch=4", "--set",
                   "threads=1", "--set", f"run_dir={path('narrow2')}"]
            b = run(TRAINER, "--eval", "--weights", weights, *job).stdout
            self.assertEqual(figures(a), figures(b))
            if shortcut == "B":
                p = run(TRAINER, "--eval", "--weights", weights, *job, "--set", "model.cifar_shortcut=A", ok=False)
                self.assertNotEqual(p.returncode, 0)
                self.assertRegex(p.stderr, r"10 of its tensors are not resnet20's \(first: layer\d\.0\.downsample\.")
                self.assertIn("model.cifar_shortcut: B in the file, A here", p.stderr)
                img = path("one.png")  # --predict alike: not run as another network
                import numpy
                from PIL import Image
                Image.fromarray(numpy.zeros((40, 40, 3), dtype=numpy.uint8)).save(img)
                p = run(TRAINER, "--predict", "--weights", weights, "--set", "model.cifar_shortcut=A", "--set",
                        "data.image_size=32", img, ok=False)
                self.assertRegex(p.stderr, r"10 of its tensors are not resnet20's \(first: layer\d\.0\.downsample\..*"
                                 r"another model than --predict would run")

    def test_outputs_that_are_not_regular_files_are_left_alone(self):
        torch.save({"fc.weight": torch.ones(2, 3)}, path("s.pth"))
        run(TOOL, "import", path("s.pth"), path("s.rtck"))
        os.makedirs(path("folder.rtck"), exist_ok=True)
        target = path("target.rtck")
        with open(target, "w") as f:
            f.write("kept")
        if not os.path.lexists(path("link.rtck")):
            os.symlink(target, path("link.rtck"))
        if not os.path.exists(path("fifo.pth")):
            os.mkfifo(path("fifo.pth"))
        cases = [(("import", path("s.pth"), path("folder.rtck")), "is a folder: not replaced"),
                 (("import", path("s.pth"), path("link.rtck")), "is a symbolic link: not replaced"),
                 (("export", path("s.rtck"), path("fifo.pth")), "is not a regular file (a device, pipe or socket)")]
        if os.path.exists("/dev/full"):
            cases.append((("import", path("s.pth"), "/dev/full"), "is not a regular file"))
        for args, msg in cases:
            p = run(TOOL, *args, ok=False)
            self.assertEqual(p.returncode, 1, args)
            self.assertIn(f"torch_weights: {args[2]}: {msg}", p.stderr)
        self.assertTrue(os.path.islink(path("link.rtck")))
        self.assertTrue(stat.S_ISFIFO(os.lstat(path("fifo.pth")).st_mode))
        with open(target) as f:
            self.assertEqual(f.read(), "kept")
        if os.path.exists("/dev/full"):
            self.assertTrue(stat.S_ISCHR(os.lstat("/dev/full").st_mode))
        # A regular file is replaced, with the permissions a new file gets.
        run(TOOL, "export", path("s.rtck"), target)
        self.assertTrue(torch.equal(torch.load(target)["fc.weight"], torch.ones(2, 3)))
        umask = os.umask(0)
        os.umask(umask)
        self.assertEqual(stat.S_IMODE(os.stat(target).st_mode), 0o666 & ~umask)

    def test_a_failed_write_leaves_no_file(self):
        # What a full disk raises: OSError from a write, RuntimeError from PyTorch's own writer.
        for err, why in ((OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "No space left on device"),
                         (RuntimeError("file write failed\nframe #0 ..."), "file write failed")):
            def fill(f, err=err):
                f.write(b"x" * 100)
                raise err
            out = path("full.pth")
            with self.assertRaises(torch_weights.Bad) as cm:
                torch_weights.atomic_write(out, fill)
            self.assertEqual(str(cm.exception), f"{out}: cannot write ({why})")
            self.assertEqual([f for f in os.listdir(TMP) if f.startswith(".full.pth")], [])
            self.assertFalse(os.path.exists(out))
        # A real full disk where this runs as root: a small tmpfs.
        mnt = path("tmpfs")
        os.makedirs(mnt, exist_ok=True)
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mnt],
                                               capture_output=True).returncode != 0:
            return
        try:
            torch.save(torchvision.models.resnet18(num_classes=2).state_dict(), path("big.pth"))
            for args in (("import", path("big.pth"), os.path.join(mnt, "x.rtck")),):
                p = run(sys.executable, TOOL, *args, ok=False)
                self.assertEqual((p.returncode, p.stderr),
                                 (1, f"torch_weights: {args[2]}: cannot write (No space left on device)\n"))
            run(TOOL, "import", path("big.pth"), path("big.rtck"))
            p = run(sys.executable, TOOL, "export", path("big.rtck"), os.path.join(mnt, "x.pth"), ok=False)
            self.assertEqual((p.returncode, p.stderr),
                             (1, f"torch_weights: {os.path.join(mnt, 'x.pth')}: cannot write (No space left on device)\n"))
            self.assertEqual(os.listdir(mnt), [])
        finally:
            subprocess.run(["umount", mnt])


def tearDownModule():
    shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
