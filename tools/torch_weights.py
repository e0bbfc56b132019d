#!/usr/bin/python3
"""Moves ResNet weights between ringtrain checkpoints and PyTorch state dicts.

  torch_weights.py export CKPT.rtck OUT.pth   a checkpoint's parameters and BN statistics as a
                                              torchvision state dict (loads with strict=True into
                                              torchvision.models.resnetNN(num_classes=...), or the
                                              ResNeXt or wide ResNet it is; an SE-ResNet or
                                              SE-ResNeXt into timm's model of its name); with
                                              --ema, their moving average (train.ema) instead
  torch_weights.py import IN.pth OUT.rtck     a torchvision ResNet state dict (for instance
                                              torchvision's pretrained ImageNet weights) as a ringtrain
                                              weights file, for `trainer --weights` (fine-tuning) and
                                              `trainer --eval --weights` (evaluation); the
                                              model (--model, or torchvision's or timm's by
                                              names and shapes) is recorded with its class count
                                              and width
  torch_weights.py list FILE                  the tensors of either kind of file

import and list take a bare state dict or a training script's checkpoint that holds one
(torchvision's reference train.py: "model", "model_ema"; timm's: "state_dict", "state_dict_ema");
import --ema takes the moving average. PyTorch's weights-only loader reads them (it runs no code
a file may hold), with the scripts' argparse.Namespace of arguments allowed where this PyTorch
can allow it (2.4 and later); --trust-pickle loads anything, for files from a trusted source.

ringtrain names its tensors as torchvision does and keeps them in torchvision's dims order, so
both directions copy values unchanged; the checkpoint's "layout" section says where each lies.
An imported file is a checkpoint without the optimizer's "momentum" section: it cannot be resumed,
only started from or evaluated. PyTorch reads and writes its own file format (torch.load/save).
"""
import argparse
import collections
import contextlib
import io
import math
import os
import re
import stat
import struct
import sys
import tempfile

import numpy as np

MAGIC = b"RTCKPT01"
VERSION = 1
META_WORDS = 20
FNV_OFFSET, FNV_PRIME, MASK64 = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1
# torchvision's ResNets, ResNeXts and wide ResNets by (block, blocks per stage); ringtrain builds
# the same ones. Those of one key differ in their bottlenecks' widths and groups.
ARCHS = {("basic", (2, 2, 2, 2)): ("resnet18",), ("basic", (3, 4, 6, 3)): ("resnet34",),
         ("bottleneck", (3, 4, 6, 3)): ("resnet50", "resnext50_32x4d", "wide_resnet50_2"),
         ("bottleneck", (3, 4, 23, 3)): ("resnet101", "resnext101_32x8d", "resnext101_64x4d",
                                         "wide_resnet101_2"),
         ("bottleneck", (3, 8, 36, 3)): ("resnet152",)}
# timm's models that torchvision has not (nn/resnet.cc builds them with timm's names): name ->
# (block, blocks per stage, groups, width per group, attention after each branch ("", "se":
# squeeze-and-excitation, "eca": efficient channel attention), stem ("", "deep": 3x3s of 32, 32,
# 64 channels, "tiered": 24, 32, 64), average-pooled shortcuts (ResNet-D's avg_down)).
_D, _T = ("", "deep", True), ("", "tiered", True)
TIMM = {"resnext101_32x4d": ("bottleneck", (3, 4, 23, 3), 32, 4, "", "", False),
        "seresnet18": ("basic", (2, 2, 2, 2), 1, 64, "se", "", False),
        "seresnet34": ("basic", (3, 4, 6, 3), 1, 64, "se", "", False),
        "seresnet50": ("bottleneck", (3, 4, 6, 3), 1, 64, "se", "", False),
        "seresnet101": ("bottleneck", (3, 4, 23, 3), 1, 64, "se", "", False),
        "seresnet152": ("bottleneck", (3, 8, 36, 3), 1, 64, "se", "", False),
        "seresnext50_32x4d": ("bottleneck", (3, 4, 6, 3), 32, 4, "se", "", False),
        "seresnext101_32x4d": ("bottleneck", (3, 4, 23, 3), 32, 4, "se", "", False),
        "seresnext101_32x8d": ("bottleneck", (3, 4, 23, 3), 32, 8, "se", "", False),
        "seresnext101_64x4d": ("bottleneck", (3, 4, 23, 3), 64, 4, "se", "", False),
        "resnet18d": ("basic", (2, 2, 2, 2), 1, 64) + _D,
        "resnet26d": ("bottleneck", (2, 2, 2, 2), 1, 64) + _D,
        "resnet34d": ("basic", (3, 4, 6, 3), 1, 64) + _D,
        "resnet50d": ("bottleneck", (3, 4, 6, 3), 1, 64) + _D,
        "resnet101d": ("bottleneck", (3, 4, 23, 3), 1, 64) + _D,
        "resnet152d": ("bottleneck", (3, 8, 36, 3), 1, 64) + _D,
        "resnext50d_32x4d": ("bottleneck", (3, 4, 6, 3), 32, 4) + _D,
        "seresnext26d_32x4d": ("bottleneck", (2, 2, 2, 2), 32, 4, "se", "deep", True),
        "resnet26t": ("bottleneck", (2, 2, 2, 2), 1, 64) + _T,
        "resnet50t": ("bottleneck", (3, 4, 6, 3), 1, 64) + _T,
        "ecaresnet26t": ("bottleneck", (2, 2, 2, 2), 1, 64, "eca", "tiered", True),
        "ecaresnet50d": ("bottleneck", (3, 4, 6, 3), 1, 64, "eca", "deep", True),
        "ecaresnet50t": ("bottleneck", (3, 4, 6, 3), 1, 64, "eca", "tiered", True),
        "ecaresnet101d": ("bottleneck", (3, 4, 23, 3), 1, 64, "eca", "deep", True),
        "ecaresnetlight": ("bottleneck", (1, 1, 11, 3), 1, 64, "eca", "", True)}
# Every model.name the trainer builds (nn/resnet.cc): the above and the CIFAR ResNets, which
# torchvision has not.
MODELS = tuple(n for names in ARCHS.values() for n in names) + tuple(TIMM) + ("resnet20", "resnet32", "resnet44",
                                                                              "resnet56", "resnet110")
STATS = (".running_mean", ".running_var")
CIFAR = ("resnet20", "resnet32", "resnet44", "resnet56", "resnet110")
BASIC = CIFAR + ("resnet18", "resnet34", "seresnet18", "seresnet34", "resnet18d", "resnet34d")


class Bad(Exception):
    """An input that cannot be converted; the message names the file."""


def fnv1a(payload):
    # The hash is one serial chain, so it runs in Python; iterating a memoryview of native words
    # is about 4x faster than a list of them (a ResNet-50 file in ~0.8 s, not ~3 s).
    words = (memoryview(payload).cast("Q") if sys.byteorder == "little"
             else np.frombuffer(payload, dtype="<u8").tolist())
    h = FNV_OFFSET
    for w in words:
        h = ((h ^ w) * FNV_PRIME) & MASK64
    return h


def read_rtck(path):
    """(meta words, {tag: bytes}) of a checkpoint, checked as the trainer checks it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise Bad(f"{path}: cannot read ({e.strerror})")
    if data[:8] != MAGIC:
        raise Bad(f"{path}: not a ringtrain checkpoint (bad magic)")
    if len(data) < 32:
        raise Bad(f"{path}: truncated to {len(data)} bytes")
    version, nsec, nbytes, checksum = struct.unpack_from("<IIQQ", data, 8)
    if version != VERSION:
        raise Bad(f"{path}: format version {version} (this tool reads {VERSION})")
    if len(data) - 32 != nbytes:
        raise Bad(f"{path}: {len(data)} bytes, the header promises {32 + nbytes} (truncated or damaged)")
    payload = memoryview(data)[32:]
    if nbytes % 8 or fnv1a(payload) != checksum:
        raise Bad(f"{path}: corrupt: checksum mismatch")
    sections, at = {}, 0
    for _ in range(nsec):
        if nbytes - at < 16:
            raise Bad(f"{path}: corrupt: section table runs past the end")
        tag = bytes(payload[at:at + 8]).rstrip(b"\0").decode("ascii", "replace")
        (length,) = struct.unpack_from("<Q", payload, at + 8)
        at += 16
        if length > nbytes - at:
            raise Bad(f"{path}: corrupt: section '{tag}' runs past the end")
        sections[tag] = bytes(payload[at:at + length])
        at += (length + 7) & ~7
    for tag in ("meta", "config", "params", "state"):
        if tag not in sections:
            raise Bad(f"{path}: corrupt: no '{tag}' section")
    if len(sections["meta"]) != META_WORDS * 8:
        raise Bad(f"{path}: corrupt: meta section of the wrong size")
    return list(struct.unpack(f"<{META_WORDS}q", sections["meta"])), sections


def checkpoint_tensors(path, ema=False):
    """{name: float32 array in its dims} of a checkpoint, parameters and BN statistics (ema: their
    moving average, the "ema" section: parameters then statistics), and its step."""
    meta, sec = read_rtck(path)
    if "layout" not in sec:
        raise Bad(f"{path}: has no 'layout' section (written by a trainer from before checkpoints listed their "
                  "tensors), so its tensors cannot be named; the checkpoints of a resumed run have it")
    params = np.frombuffer(sec["params"], dtype="<f4")
    state = np.frombuffer(sec["state"], dtype="<f4")
    if ema:
        if "ema" not in sec:
            raise Bad(f"{path}: no moving average of the weights in it (the run had no train.ema)")
        avg = np.frombuffer(sec["ema"], dtype="<f4")
        if avg.size != params.size + state.size:
            raise Bad(f"{path}: corrupt: section 'ema' holds {avg.size} values, not {params.size} + {state.size}")
        params, state = avg[:params.size], avg[params.size:]
    out = collections.OrderedDict()
    for n, line in enumerate(sec["layout"].decode("utf-8").splitlines(), 1):
        f = line.split("\t")
        try:
            kind, name, offset, count, dims = f[0], f[1], int(f[2]), int(f[3]), [int(d) for d in f[4].split(",")]
        except (IndexError, ValueError):
            raise Bad(f"{path}: corrupt: layout line {n}: {line!r}")
        src = state if kind == "s" else params
        if (kind not in ("p", "s") or len(f) != 5 or min(dims) < 1 or int(np.prod(dims)) != count or offset < 0
                or offset + count > src.size or name in out):
            raise Bad(f"{path}: corrupt: layout line {n}: {line!r}")
        out[name] = src[offset:offset + count].reshape(dims).copy()
    return out, meta[0]


@contextlib.contextmanager
def weights_not_drawn():
    """Model construction without drawing initial weights: they are loaded, or only the shapes
    matter. torchvision's initialisation of a 127M-parameter model takes seconds; the tensors
    themselves are allocated, untouched."""
    import torch
    names = ("kaiming_normal_", "kaiming_uniform_", "uniform_", "normal_", "constant_", "zeros_", "ones_")
    saved = {n: getattr(torch.nn.init, n) for n in names}
    try:
        for n in names:
            setattr(torch.nn.init, n, lambda t, *args, **kwargs: t)
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.nn.init, n, f)


def se_channels(c):
    """An SE block's hidden width on c channels: timm's make_divisible(c / 16, 8, round_limit=0),
    as nn/resnet.cc's se_channels()."""
    return max(8, int(c / 16 + 4) // 8 * 8)


def eca_kernel(c):
    """timm's EcaModule kernel on c channels, as nn/resnet.cc's eca_kernel(): t = int(|log2(c) + 1| / 2),
    the odd one of t and t + 1, at least 3."""
    t = int(abs(math.log2(c) + 1) / 2)
    return max(3, t if t % 2 else t + 1)


def timm_shapes(arch, classes):
    """{name: shape} of the state dict of timm's `arch` (a TIMM model), BN counters aside, written
    out as nn/resnet.cc builds it: timm (not installed here) is not needed to recognise one."""
    kind, blocks, groups, per_group, attn, stem, avg_down = TIMM[arch]
    s = {}

    def bn(name, c):
        s.update({f"{name}.{t}": (c,) for t in ("weight", "bias", "running_mean", "running_var")})
    if stem:  # the deep stem: conv1 a sequence of three 3x3 convolutions, BNs and ReLUs between them
        first = 24 if stem == "tiered" else 32
        s["conv1.0.weight"] = (first, 3, 3, 3)
        bn("conv1.1", first)
        s["conv1.3.weight"] = (32, first, 3, 3)
        bn("conv1.4", 32)
        s["conv1.6.weight"] = (64, 32, 3, 3)
    else:
        s["conv1.weight"] = (64, 3, 7, 7)
    bn("bn1", 64)
    inp = 64
    for stage, (count, planes) in enumerate(zip(blocks, (64, 128, 256, 512)), 1):
        for b in range(count):
            p, stride = f"layer{stage}.{b}", 2 if stage > 1 and b == 0 else 1
            if kind == "bottleneck":
                width, out = planes * per_group // 64 * groups, planes * 4
                convs = ((width, inp, 1), (width, width // groups, 3), (out, width, 1))
            else:
                out = planes
                convs = ((out, inp, 3), (out, out, 3))
            for i, (o, i_c, k) in enumerate(convs, 1):
                s[f"{p}.conv{i}.weight"] = (o, i_c, k, k)
                bn(f"{p}.bn{i}", o)
            if attn == "se":
                r = se_channels(out)
                s.update({f"{p}.se.fc1.weight": (r, out, 1, 1), f"{p}.se.fc1.bias": (r,),
                          f"{p}.se.fc2.weight": (out, r, 1, 1), f"{p}.se.fc2.bias": (out,)})
            elif attn == "eca":
                s[f"{p}.se.conv.weight"] = (1, 1, eca_kernel(out))
            if stride != 1 or inp != out:  # ResNet-D's downsample.0 is the pool, without tensors
                s[f"{p}.downsample.{int(avg_down)}.weight"] = (out, inp, 1, 1)
                bn(f"{p}.downsample.{int(avg_down) + 1}", out)
            inp = out
    s.update({"fc.weight": (classes, inp), "fc.bias": (classes,)})
    return s


def timm_model(shapes):
    """The TIMM model whose state dict has exactly these names and shapes (BN counters aside), or
    None."""
    fc = shapes.get("fc.weight", ())
    if len(fc) != 2:
        return None
    have = {k: tuple(v) for k, v in shapes.items() if not k.endswith(".num_batches_tracked")}
    return next((arch for arch in TIMM if timm_shapes(arch, fc[0]) == have), None)


def torchvision_model(shapes):
    """(name, model) of the torchvision ResNet, ResNeXt or wide ResNet whose state dict has exactly
    these names and shapes ({name: shape}; BN counters aside), or (None, None): a CIFAR ResNet,
    another model.width, a timm model (timm_model) ..."""
    if any(".se." in k for k in shapes):  # squeeze-and-excitation: none of torchvision's
        return None, None
    blocks = []
    for stage in range(1, 5):
        ids = {int(m.group(1)) for k in shapes for m in [re.match(rf"layer{stage}\.(\d+)\.", k)] if m}
        blocks.append(len(ids))
    kind = "bottleneck" if any(k.endswith(".conv3.weight") for k in shapes) else "basic"
    archs = ARCHS.get((kind, tuple(blocks)), ())
    if not archs or len(shapes.get("fc.weight", ())) != 2:
        return None, None
    import torchvision
    counter = ".num_batches_tracked"
    have = {k: tuple(v) for k, v in shapes.items() if not k.endswith(counter)}
    for arch in archs:
        make = getattr(torchvision.models, arch, None)
        if make is None:  # an older torchvision (resnext101_64x4d came in 0.13)
            continue
        with weights_not_drawn():
            model = make(num_classes=shapes["fc.weight"][0])
        want = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.endswith(counter)}
        if want == have:
            return arch, model
    return None, None


def scaled(c, width):
    """A channel count at model.width, as nn/resnet.cc's scaled() computes it: lround, at least 1."""
    return max(1, math.floor(c * width + 0.5))


def model_width(sd, arch, pth):
    """The model.width that gives `arch` the channels of state dict `sd`, as the shortest decimal
    text (the trainer reads it back to the same double); "1" for torchvision's own widths. The
    stem's, each stage's and the classifier's input channels, against their counts at width 1
    (16, 32, 64 for the CIFAR ResNets, 64 ... 512 else; a bottleneck's output 4 times its stage's):
    lround(base * width) = c bounds the width to [(c - 1/2) / base, (c + 1/2) / base), and all of
    them together to one interval, or to none."""
    expand = 1 if arch in BASIC else 4
    stages = (16, 32, 64) if arch in CIFAR else (64, 128, 256, 512)
    seen = []  # (tensor, its channels, its stage's count at width 1, the block's expansion)
    if "conv1.weight" in sd and sd["conv1.weight"].dim() == 4:
        seen.append(("conv1.weight", sd["conv1.weight"].shape[0], stages[0], 1))
    for name, t in sd.items():
        m = re.fullmatch(r"layer(\d+)\.\d+\.conv(\d)\.weight", name)
        if not m or not 1 <= int(m.group(1)) <= len(stages) or t.dim() != 4:
            continue
        # Basic blocks: conv1 and conv2 have the stage's channels; bottlenecks: conv3 4 times them
        # (their conv1 and conv2 follow from groups and width_per_group).
        if expand == 1 and m.group(2) in "12" or expand == 4 and m.group(2) == "3":
            seen.append((name, t.shape[0], stages[int(m.group(1)) - 1], expand))
    if "fc.weight" in sd and sd["fc.weight"].dim() == 2:
        seen.append(("fc.weight", sd["fc.weight"].shape[1], stages[-1], expand))
    lo, hi, lo_by, hi_by = 0.0, math.inf, None, None
    for name, c, base, e in seen:
        what = f"{name} has {c} {'inputs' if name == 'fc.weight' else 'channels'} ({base * e} at width 1)"
        if c % e:
            raise Bad(f"{pth}: --model {arch}: {what}: not a multiple of {e}, so no model.width gives them")
        # lround(base * w) = c for w in [(c - 0.5) / base, (c + 0.5) / base); 1 also for any smaller w > 0.
        a, b = (0.0 if c == e else (c // e - 0.5) / base), (c // e + 0.5) / base
        if a > lo:
            lo, lo_by = a, what
        if b < hi:
            hi, hi_by = b, what
        if lo >= hi:
            raise Bad(f"{pth}: --model {arch}: its channels fit no model.width: {lo_by}, but {hi_by}")
    if not seen:
        return "1"
    # The shortest decimal above 0 in [lo, hi), checked as the trainer will compute every count with it.
    for digits in range(1, 18):
        w = f"{max(1, math.ceil(lo * 10 ** digits)) / 10 ** digits:.{digits}f}".rstrip("0").rstrip(".")
        if float(w) < hi and all(scaled(base, float(w)) * e == c for _, c, base, e in seen):
            return w
    raise Bad(f"{pth}: --model {arch}: its channels fit no model.width")


def torch_load(path, trust=False):
    """torch.load on the CPU: tensors and containers only (a .pth file from elsewhere runs no code),
    and a training script's argparse.Namespace where this PyTorch can allow one; with `trust`,
    whatever the file pickles."""
    import torch
    try:
        if trust:
            return torch.load(path, map_location="cpu", weights_only=False)
        allow = getattr(torch.serialization, "safe_globals", None)  # PyTorch 2.4 and later
        with allow([argparse.Namespace]) if allow else contextlib.nullcontext():
            return torch.load(path, map_location="cpu", weights_only=True)
    except TypeError:  # a PyTorch without weights_only
        return torch.load(path, map_location="cpu")


def torch_state_dict(path, ema=False, trust=False):
    """A state dict of plain tensors from a .pth file: unwraps a training script's checkpoint
    ({"model": ...} and "model_ema" of torchvision's reference scripts, {"state_dict": ...} and
    "state_dict_ema" of timm's; `ema`: the moving average), DataParallel's and AveragedModel's
    "module." and torch.compile's "_orig_mod." prefixes."""
    import torch
    try:
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) == MAGIC:
                raise Bad(f"{path}: already a ringtrain checkpoint: the trainer takes it as it is (--weights, "
                          "--eval); `export` makes a state dict of it")
    except OSError as e:
        raise Bad(f"{path}: cannot read ({e.strerror})")
    try:
        obj = torch_load(path, trust)
    except OSError as e:
        raise Bad(f"{path}: cannot read ({e.strerror})")
    except Exception as e:
        raise Bad(f"{path}: cannot load with torch.load ({e}); a whole pickled model? save its state_dict(); "
                  "or, where you trust the file's source (loading it may run code it holds), --trust-pickle")
    keys = ("model_ema", "state_dict_ema") if ema else ("state_dict", "model")
    for key in keys:
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    else:
        if ema:
            raise Bad(f"{path}: no moving average of the weights in it (a training checkpoint's "
                      f"{' or '.join(keys)}); import it without --ema")
    if ema:  # AveragedModel's count of averaged models, beside the weights
        obj = {k: v for k, v in obj.items() if k not in ("n_averaged", "module.n_averaged")}
    if not isinstance(obj, dict) or not obj:
        raise Bad(f"{path}: not a state dict (a dict of tensors)")
    for prefix in ("module.", "_orig_mod.", "module."):  # either wrapping the other
        if all(isinstance(k, str) and k.startswith(prefix) for k in obj):
            obj = {k[len(prefix):]: v for k, v in obj.items()}
    for k, v in obj.items():
        if not isinstance(v, torch.Tensor):
            raise Bad(f"{path}: '{k}' is not a tensor ({type(v).__name__})")
    return obj


def export(ckpt, out, ema=False):
    check_output(out)
    import torch
    tensors, step = checkpoint_tensors(ckpt, ema)
    sd = collections.OrderedDict()
    for name, a in tensors.items():
        sd[name] = torch.from_numpy(a)
        if name.endswith(".running_var"):  # torchvision's BN keeps a counter ringtrain has no use for
            sd[name[:-len("running_var")] + "num_batches_tracked"] = torch.tensor(step, dtype=torch.long)
    # timm's models first: recognising them needs neither timm nor torchvision.
    timm = timm_model({k: v.shape for k, v in sd.items()})
    arch, model = (None, None) if timm else torchvision_model({k: v.shape for k, v in sd.items()})
    classes = sd["fc.weight"].shape[0] if arch or timm else 0
    if arch:  # proves the file loads where it is meant to
        try:
            model.load_state_dict(sd, strict=True)
        except RuntimeError as e:
            raise Bad(f"{ckpt}: does not load into torchvision's {arch}: {e}")
    # Serialised in memory, then written: torch.save's own writer, failing on a full disk, throws
    # again from its destructor and aborts the process, leaving the temporary file behind.
    buf = io.BytesIO()
    torch.save(sd, buf)
    atomic_write(out, lambda f: f.write(buf.getbuffer()))
    print(f"{out}: {len(tensors)} tensors of {ckpt}" + (" (its moving average)" if ema else "") +
          (f" (loads into torchvision.models.{arch}(num_classes={classes}))" if arch else
           f" (the names and shapes of timm's {timm}(num_classes={classes}))" if timm else
           " (not the names and shapes of torchvision's ResNets, ResNeXts or wide ResNets: a CIFAR ResNet or another width)"))


def import_(pth, out, model=None, ema=False, trust=False):
    check_output(out)
    sd = torch_state_dict(pth, ema, trust)
    params, state, layout = [], [], []
    sizes = {"p": 0, "s": 0}
    for name, t in sd.items():
        if name.endswith(".num_batches_tracked"):
            continue
        if not t.is_floating_point():
            raise Bad(f"{pth}: '{name}' is {t.dtype}, not a floating-point tensor")
        if t.numel() == 0:  # the trainer and `list` refuse a tensor without values as corrupt
            raise Bad(f"{pth}: '{name}' has no values (shape {list(t.shape)})")
        kind = "s" if name.endswith(STATS) else "p"
        a = t.detach().float().contiguous().numpy().astype("<f4", copy=False).reshape(-1)
        dims = [a.size] if kind == "s" else list(t.shape) or [1]
        (state if kind == "s" else params).append(a)
        layout.append(f"{kind}\t{name}\t{sizes[kind]}\t{a.size}\t{','.join(map(str, dims))}")
        sizes[kind] += a.size
    if not layout:
        raise Bad(f"{pth}: no tensors to import (only BN counters, num_batches_tracked)")
    shapes = {k: v.shape for k, v in sd.items()}
    known = timm_model(shapes) or torchvision_model(shapes)[0]
    fc = sd.get("fc.weight")
    classes = fc.shape[0] if fc is not None and fc.dim() == 2 else None
    if model and known and model != known:
        raise Bad(f"{pth}: --model {model}: its tensors are those of {'timm' if known in TIMM else 'torchvision'}'s "
                  f"{known}")
    if model and not classes:
        # model.name without model.classes would be taken with the trainer's default class count.
        raise Bad(f"{pth}: --model {model}: no fc.weight of [classes, features] in it, so the class count to "
                  "record with the model is unknown (import it without --model; a job's --config then names both)")
    arch = model or known
    # model.width too: a job that takes the model from this file builds it with these channels.
    width = model_width(sd, arch, pth) if arch and classes else "1"
    config = f"# imported from {pth} by tools/torch_weights.py\n"
    # A CIFAR ResNet's projection shortcuts (B) are tensors of their own; shortcut A has none.
    shortcut_b = arch in CIFAR and any(".downsample." in k for k in sd)
    if arch and classes:
        config += f"model:\n  name: {arch}\n  classes: {classes}\n"
        if width != "1":
            config += f"  width: {width}\n"
        if shortcut_b:
            config += "  cifar_shortcut: B\n"
    # Weights only: step 0, one rank, no batch, a fingerprint of sizes alone (a trainer takes the
    # tensors by name, never the file as its own checkpoint), no momentum section.
    meta = [0] * META_WORDS
    meta[5] = 1
    meta[7], meta[8], meta[10] = sizes["p"], sizes["p"], sizes["s"]
    meta[16] = 1
    sections = [("meta", struct.pack(f"<{META_WORDS}q", *meta)), ("config", config.encode()),
                ("params", np.concatenate(params).tobytes() if params else b""),
                ("state", np.concatenate(state).tobytes() if state else b""),
                ("layout", ("\n".join(layout) + "\n").encode())]
    write_rtck(out, sections)
    recorded = (f" ({arch}, {classes} classes" + (f", width {width}" if width != "1" else "") +
                (", shortcut B)" if shortcut_b else ")"))
    print(f"{out}: {len(layout)} tensors of {pth}" + (recorded if arch and classes else
          " (not the names and shapes of torchvision's ResNets, ResNeXts or wide ResNets: --eval needs --config, or --model to record one)"))


def write_rtck(path, sections):
    payload = bytearray()
    for tag, data in sections:
        payload += tag.encode().ljust(8, b"\0") + struct.pack("<Q", len(data)) + data
        payload += b"\0" * (-len(data) % 8)
    header = MAGIC + struct.pack("<IIQQ", VERSION, len(sections), len(payload), fnv1a(bytes(payload)))
    atomic_write(path, lambda f: (f.write(header), f.write(payload)))


def check_output(path):
    """Refuses an output path that is there and is not a regular file: os.replace would put the new
    file in place of a device, a folder's entry or a symlink (not where it points)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise Bad(f"{path}: cannot write ({e.strerror})")
    if stat.S_ISLNK(st.st_mode):
        raise Bad(f"{path}: is a symbolic link: not replaced (name the file itself)")
    if not stat.S_ISREG(st.st_mode):
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, pipe or socket)"
        raise Bad(f"{path}: is {what}: not replaced")


def atomic_write(path, fill):
    """Writes through a temporary file in the same folder: no half-written file under `path`."""
    check_output(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        # A new file of its own (mkstemp: never one that is there, nor a symlink's target), with
        # the permissions a plain open() would give it.
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise Bad(f"{path}: cannot write ({e.strerror})")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # PyTorch reports a failed write as RuntimeError
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        why = getattr(e, "strerror", None) or (str(e).splitlines() or [type(e).__name__])[0]
        raise Bad(f"{path}: cannot write ({why})")
    except BaseException:  # an interrupt: no temporary file left behind either
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def list_(path, trust=False):
    try:
        with open(path, "rb") as f:
            rtck = f.read(8) == MAGIC
    except OSError as e:
        raise Bad(f"{path}: cannot read ({e.strerror})")
    if rtck:
        tensors = checkpoint_tensors(path)[0]
        shapes = {k: list(v.shape) for k, v in tensors.items()}
    else:
        shapes = {k: list(v.shape) for k, v in torch_state_dict(path, trust=trust).items()}
    for k, s in shapes.items():
        print(f"{k}\t{s}")
    timm = timm_model(shapes)
    arch = None if timm else torchvision_model(shapes)[0]
    print(f"{len(shapes)} tensors; " + (f"timm's {timm}" if timm else f"torchvision's {arch}" if arch else
                                        "not a torchvision ResNet's, ResNeXt's or wide ResNet's names and shapes"))


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="ringtrain checkpoint -> PyTorch state dict")
    e.add_argument("ckpt"), e.add_argument("out")
    e.add_argument("--ema", action="store_true", help="the weights' moving average (train.ema) instead")
    i = sub.add_parser("import", help="PyTorch state dict -> ringtrain weights file")
    i.add_argument("pth"), i.add_argument("out")
    i.add_argument("--model", choices=MODELS, metavar="NAME",
                   help="model.name to record with the class count of fc.weight and the model.width of the channels "
                        "(default: recognised from the tensors' names and shapes): " + ", ".join(MODELS))
    i.add_argument("--ema", action="store_true",
                   help="a training checkpoint's moving average of the weights (model_ema, state_dict_ema)")
    trust_help = "load whatever the file pickles (may run code it holds): only for files from a trusted source"
    i.add_argument("--trust-pickle", action="store_true", help=trust_help)
    ls = sub.add_parser("list", help="the tensors of a checkpoint or a state dict")
    ls.add_argument("file")
    ls.add_argument("--trust-pickle", action="store_true", help=trust_help)
    a = p.parse_args(argv)
    try:
        if a.cmd == "export":
            export(a.ckpt, a.out, a.ema)
        elif a.cmd == "import":
            import_(a.pth, a.out, a.model, a.ema, a.trust_pickle)
        else:
            list_(a.file, a.trust_pickle)
    except Bad as err:
        print(f"torch_weights: {err}", file=sys.stderr)
        return 1
    except ImportError as err:
        print(f"torch_weights: {err} (tools/setup.sh installs PyTorch and torchvision)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
