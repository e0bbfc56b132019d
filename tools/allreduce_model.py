"""The allreduce cost model of tools/costmodel.py (see its usage text): the ring and single-reducer
formulas in α, β, γ, their least-squares fit to measurements, the measurements' input format, and
the projection of a training step's time and efficiency to many workers (numpy only)."""
import itertools
import json
import math
import sys

import numpy as np

MIB = 1 << 20

# ----------------------------------------------------------------------------------------------
# Model

def formula(impl):
    """Which cost formula describes an implementation label: 'ring' or 'reducer'."""
    name = impl.lower()
    if name.startswith("reducer") or name.startswith("naive"):
        return "reducer"
    return "ring"  # ring, ring@…, mpi, openmpi, openmpi-ring, allreduce…


def terms(kind, n, s):
    """Coefficients of (α, β, γ) in the time of one allreduce."""
    if n <= 1:
        return (0.0, 0.0, 0.0)
    if kind == "ring":
        return (2.0 * (n - 1), 2.0 * (n - 1) / n * s, (n - 1) / n * s)
    if kind == "reducer":
        return (2.0 * (n - 1), 2.0 * (n - 1) * s, (n - 1) * s)
    raise ValueError(f"unknown formula '{kind}'")


def predict(params, kind, n, s):
    a, b, c = terms(kind, n, s)
    return a * params["alpha"] + b * params["beta"] + c * params["gamma"]


def bound(n, s, link_bytes_per_s):
    """The ring's bandwidth bound 2(N-1)/N · S/B."""
    return 2.0 * (n - 1) / n * s / link_bytes_per_s


# ----------------------------------------------------------------------------------------------
# Fitting

def nnls(a, y):
    """min ||a x - y||² with x ≥ 0, by trying every set of free variables (few columns)."""
    k = a.shape[1]
    best, best_err = np.zeros(k), float(np.sum(y * y))
    for r in range(1, k + 1):
        for free in itertools.combinations(range(k), r):
            cols = list(free)
            x_free, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
            if np.any(x_free < 0):
                continue
            x = np.zeros(k)
            x[cols] = x_free
            err = float(np.sum((a @ x - y) ** 2))
            if err < best_err - 1e-18 * max(1.0, best_err):
                best, best_err = x, err
    return best


def fit(points, beta=None):
    """points: [(kind, n, bytes, seconds[, beta_i])]. Returns {'alpha','beta','gamma'} fitted on
    relative error. With beta given (or a beta_i per point: the link measured in that point's
    run), fits α and γ; otherwise fits α and β with γ = 0."""
    if not points:
        raise ValueError("no measurements to fit")
    fixed = beta is not None or any(len(p) > 4 for p in points)
    rows, ys, betas = [], [], []
    for p in points:
        kind, n, s, t = p[:4]
        b_i = p[4] if len(p) > 4 and p[4] else beta
        if t <= 0:
            raise ValueError(f"non-positive time {t} for {kind} N={n} S={s}")
        ta, tb, tc = terms(kind, n, s)
        w = 1.0 / t  # relative least squares
        if fixed:
            if b_i is None:
                raise ValueError(f"no link speed for {kind} N={n} S={s}")
            rows.append([ta * w, tc * w])
            ys.append((t - tb * b_i) * w)
            betas.append(b_i)
        else:
            rows.append([ta * w, tb * w])
            ys.append(t * w)
    # Columns are scaled to unit norm so that seconds and seconds-per-byte are comparable.
    a, y = np.array(rows), np.array(ys)
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    x = nnls(a / scale, y) / scale
    if fixed:
        return {"alpha": float(x[0]), "beta": float(np.mean(betas)), "gamma": float(x[1])}
    return {"alpha": float(x[0]), "beta": float(x[1]), "gamma": 0.0}


# ----------------------------------------------------------------------------------------------
# Input

def parse_results(lines):
    """RESULT lines → [{'impl','np','bytes','us','check','contended'}] (header lines skipped)."""
    out = []
    for line in lines:
        f = line.strip().split(",")
        if len(f) < 12 or f[0] != "RESULT" or f[1] == "impl":
            continue
        try:
            out.append({"impl": f[1], "np": int(f[2]), "bytes": int(f[3]), "us": float(f[6]),
                        "check": f[11], "contended": "CONTENDED" in f[12:]})
        except ValueError:
            continue
    return out


def parse_links(lines):
    """`LINK,N,bytes_per_s` lines (written by tools/cluster/bench.sh) → {N: bytes_per_s}."""
    out = {}
    for line in lines:
        f = line.strip().split(",")
        if len(f) == 3 and f[0] == "LINK":
            try:
                out[int(f[1])] = float(f[2])
            except ValueError:
                continue
    return out


def read_inputs(paths):
    """RESULT rows of all files, each with 'link': the LINK measurement of its own file and N
    (None where the file has none), and all LINK lines as {N: bytes_per_s} (last one wins).
    A file that cannot be read raises OSError."""
    rows, links = [], {}
    for path in paths:
        if path == "-":
            lines = sys.stdin.readlines()
        else:
            # Bytes that are not UTF-8 only spoil their own line, which is then not a RESULT line.
            with open(path, errors="replace") as f:
                lines = f.readlines()
        mine = parse_links(lines)
        for r in parse_results(lines):
            r["link"] = mine.get(r["np"])
            rows.append(r)
        links.update(mine)
    return rows, links


def parse_bytes(s):
    """A byte count: 4096, 64K, 1.5M, 2G (binary multiples); ValueError for anything else."""
    s = s.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
    try:
        v = float(s[:-1] if mult > 1 else s) * mult
    except ValueError:
        v = float("nan")
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"expected a byte count such as 4096, 64K, 1M or 2G, got '{s}'")
    return int(v)


def load_links(path):
    """{n: bytes/s} of the links a `costmodel.py fit` file was fitted on, measured per rank count
    ({} where it records none)."""
    with open(path, "rb") as f:
        p = json.loads(f.read())
    links = p.get("links") if isinstance(p, dict) else None
    if not isinstance(links, dict):
        return {}
    return {int(n): float(v) for n, v in links.items()
            if str(n).isdigit() and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0}


def load_params(path):
    """{'alpha','beta','gamma'} of a file written by `costmodel.py fit` (or that object alone).
    OSError where the file cannot be read, ValueError where it holds something else."""
    with open(path, "rb") as f:
        text = f.read()
    try:
        p = json.loads(text)
    except ValueError as e:  # UnicodeDecodeError too
        raise ValueError(f"not JSON ({e})")
    if isinstance(p, dict) and "params" in p:
        p = p["params"]
    if not isinstance(p, dict):
        raise ValueError("not the parameters written by costmodel.py fit (a JSON object with alpha, beta, gamma)")
    for k in ("alpha", "beta", "gamma"):
        v = p.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"'{k}' is {v!r}, not a number >= 0 (the parameters written by costmodel.py fit)")
    return {k: float(p[k]) for k in ("alpha", "beta", "gamma")}


# ----------------------------------------------------------------------------------------------
# Projection of training efficiency

def step_time(comm_time, n, compute_s, grad_bytes, bucket_bytes, overlap, backward_fraction):
    """Time of one training step: forward, then backward producing buckets at an even rate (in
    buffer order), each bucket allreduced as soon as it is complete and the previous one is done
    (one communication thread). Without overlap all buckets go after backward."""
    if not (grad_bytes > 0 and bucket_bytes > 0):
        raise ValueError(f"gradient and bucket sizes must be > 0 bytes (got {grad_bytes} and {bucket_bytes})")
    n_buckets = max(1, math.ceil(grad_bytes / bucket_bytes))
    sizes = [bucket_bytes] * (n_buckets - 1) + [grad_bytes - bucket_bytes * (n_buckets - 1)]
    fwd = compute_s * (1.0 - backward_fraction)
    bwd = compute_s * backward_fraction
    done_bytes, t_comm = 0, 0.0
    for size in sizes:
        done_bytes += size
        ready = fwd + bwd * done_bytes / grad_bytes if overlap else compute_s
        t_comm = max(t_comm, ready) + comm_time(n, size)
    return max(compute_s, t_comm)


def project(params, kinds, workers, compute_s, grad_bytes, bucket_bytes, overlap,
            backward_fraction=2.0 / 3.0):
    """{kind: [(N, step_s, efficiency, speedup)]}; efficiency = compute / step, speedup = N·eff."""
    out = {}
    for kind in kinds:
        rows = []
        for n in workers:
            t = step_time(lambda nn, s: predict(params, kind, nn, s), n, compute_s, grad_bytes,
                          bucket_bytes, overlap, backward_fraction)
            eff = compute_s / t
            rows.append((n, t, eff, n * eff))
        out[kind] = rows
    return out


def calibrate_compute(params, kind, n, target_speedup, grad_bytes, bucket_bytes, overlap,
                      backward_fraction=2.0 / 3.0):
    """The compute time per step at which `kind` reaches target_speedup with n workers
    (bisection on a log scale; speed-up grows with compute time)."""
    lo, hi = 1e-9, 1e9
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        t = step_time(lambda nn, s: predict(params, kind, nn, s), n, mid, grad_bytes,
                      bucket_bytes, overlap, backward_fraction)
        if n * mid / t < target_speedup:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def node_ring_time(params, n, s, per_node):
    """One allreduce of s bytes over n workers, per_node of them on each node: reduce inside the
    node, ring across the n/per_node nodes over one link each, broadcast inside the node. The
    transfers inside a node (NVLink, shared memory) are taken as free."""
    return predict(params, "ring", max(1, n // per_node), s)


def ddl_efficiency(params, n, compute_s, grad_bytes, bucket_bytes, overlap, per_node=1,
                   backward_fraction=2.0 / 3.0):
    """Weak-scaling efficiency (compute / step time) of n workers."""
    t = step_time(lambda nn, s: node_ring_time(params, nn, s, per_node), n, compute_s, grad_bytes,
                  bucket_bytes, overlap, backward_fraction)
    return compute_s / t


def ddl_compute_for(params, n, target, grad_bytes, bucket_bytes, overlap, per_node=1):
    """The least compute time per step at which n workers reach `target` efficiency (bisection;
    efficiency grows with compute time); infinity where no compute time up to 10^4 s reaches it
    (a target of 1 with any communication left exposed)."""
    lo, hi = 1e-6, 1e4
    if ddl_efficiency(params, n, hi, grad_bytes, bucket_bytes, overlap, per_node) < target:
        return math.inf
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if ddl_efficiency(params, n, mid, grad_bytes, bucket_bytes, overlap, per_node) < target:
            lo = mid
        else:
            hi = mid
    return hi
