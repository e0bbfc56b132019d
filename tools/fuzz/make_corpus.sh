#!/usr/bin/env bash
# Regenerates the seed corpora in tools/fuzz/corpus/<target>/ (small valid inputs of each reader),
# from the project's own tools (JPEGs, a shard set) and a few lines of Python (PNGs, a checkpoint).
#   tools/fuzz/make_corpus.sh [BUILD_DIR (default build)]
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build}/bin
out=tools/fuzz/corpus
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf "$out"
mkdir -p "$out"/{config,list,shard,image,checkpoint}

# config: a shipped recipe, a flow-style file with overrides (NUL-separated after the YAML).
cp configs/quickstart.yaml "$out/config/quickstart.yaml"
printf 'model: {name: resnet18, classes: 100}\ndata: {synthetic: true, image_size: 64}\ntrain: {epochs: 2, batch: 8}\nschedule: {kind: multistep, milestones: [1, 2]}\n\0train.batch=16\0optimizer.lr=0.05\0data.mean=[0.5, 0.5, 0.5]' \
  > "$out/config/flow_with_overrides"
printf 'backend: reference\nseed: 7\ndata: {synthetic: true}\n\0schedule.kind=poly\0comm.algorithm=mpi' > "$out/config/small"

# list: relative, absolute and spaced paths, comments, blank lines.
printf '# images\na/0.jpg 0\nb/1.jpg 2\n\n/abs/path/x.png 1   # trailing comment\nname with spaces.jpg\t3\n' \
  > "$out/list/list"

# image: tiny JPEGs from the generator (3 bytes of harness parameters in front of each).
"$bin/make_imagenet_like" --out "$tmp/ds" --classes 2 --train-per-class 2 --val-per-class 1 \
  --width 12 --height 10 --quality 50 --threads 1 >/dev/null
n=0
for f in $(find "$tmp/ds/train" -name '*.jpg' | sort | head -2); do
  { printf '\x01\x07\x05'; cat "$f"; } > "$out/image/jpeg$n"   # train, flip off, size 8
  { printf '\x06\x03\x09'; cat "$f"; } > "$out/image/jpeg_eval$n"  # eval, HWC bytes too, size 4
  n=$((n + 1))
done
python3 - "$out/image" <<'PY'
import struct, sys, zlib
def png(w, h, color, rows):
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0)
    raw = b"".join(b"\0" + r for r in rows)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
d = sys.argv[1]
open(d + "/png_rgb", "wb").write(b"\x03\x05\x01" + png(6, 5, 2, [b"".join(bytes((x * 40, y * 50, 90)) for x in range(6)) for y in range(5)]))
open(d + "/png_gray", "wb").write(b"\x00\x02\x02" + png(7, 3, 0, [bytes(range(y, y + 7)) for y in range(3)]))
PY

# shard: a packed set of the generator's val split (mode byte 0: the harness fixes CRCs).
"$bin/pack_dataset" --root "$tmp/ds" --split val --out "$tmp/fz" >/dev/null
{ printf '\x00'; cat "$tmp/fz.index"; printf '\n%%%%%%%%\n'; cat "$tmp/fz-00000.shard"; } > "$out/shard/val_set"

# checkpoint: the format of trainer/checkpoint.h with a 6-float model (mode byte 0 in front), with
# and without the 2 ranks' own BN statistics, with a moving average of the weights, with a tensor
# layout, and as a weights file (no momentum).
python3 - "$out/checkpoint" <<'PY'
import struct, sys
def section(tag, data):
    pad = (-len(data)) % 8
    return tag.ljust(8, b"\0") + struct.pack("<Q", len(data)) + data + b"\0" * pad
meta = [12, 1, 1, 2, 12, 2, 4, 5, 6, 0x1234, 2, 0x99, 0, 7] + [0] * 6
config = b"model:\n  name: resnet20\n  classes: 10\ntrain:\n  batch: 4\n"
payload = (section(b"meta", struct.pack("<20q", *meta)) + section(b"config", config)
           + section(b"params", struct.pack("<6f", *range(6))) + section(b"state", struct.pack("<2f", 1, 2))
           + section(b"momentum", struct.pack("<6f", *[0.5] * 6)))
def file(payload, sections):
    h = 0xcbf29ce484222325
    for i in range(0, len(payload), 8):
        h = ((h ^ struct.unpack_from("<Q", payload, i)[0]) * 0x100000001b3) & (2**64 - 1)
    return b"RTCKPT01" + struct.pack("<IIQQ", 1, sections, len(payload), h) + payload
open(sys.argv[1] + "/tiny", "wb").write(b"\x00" + file(payload, 5))
open(sys.argv[1] + "/tiny_raw", "wb").write(b"\x01" + file(payload, 5))
ranks = payload + section(b"bn_ranks", struct.pack("<4f", 0.5, 1.5, 1.5, 2.5))
open(sys.argv[1] + "/tiny_ranks", "wb").write(b"\x00" + file(ranks, 6))
ema = ranks + section(b"ema", struct.pack("<8f", *range(8))) + section(b"ema_bnr", struct.pack("<4f", 1, 2, 3, 4))
open(sys.argv[1] + "/tiny_ema", "wb").write(b"\x00" + file(ema, 8))
layout = payload + section(b"layout", b"p\tfc.weight\t0\t4\t2,2\np\tfc.bias\t4\t2\t2\ns\tbn.running_mean\t0\t2\t2\n")
open(sys.argv[1] + "/tiny_layout", "wb").write(b"\x00" + file(layout, 6))
weights = payload[:payload.index(b"momentum")] + layout[len(payload):]  # tools/torch_weights.py import's kind
open(sys.argv[1] + "/tiny_weights", "wb").write(b"\x00" + file(weights, 5))
PY
du -sh "$out"; find "$out" -type f | sort
