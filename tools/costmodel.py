#!/usr/bin/python3
"""Allreduce cost model: fit α, β, γ to allreduce_bench results, report the error at every point,
and project data-parallel training efficiency to many workers (python3 + numpy only).

Model (S bytes per rank, N ranks, one full-duplex link of 1/β bytes/s per rank):

  ring     T = 2(N-1)·α + 2(N-1)/N·S·β + (N-1)/N·S·γ
  reducer  T = 2(N-1)·α + 2(N-1)·S·β   + (N-1)·S·γ     (rank 0's link carries everything)

α: time per message (latency and per-message software cost), β: time per byte on a link,
γ: time per byte of reduction that is not hidden behind the transfer. β and γ appear in both
formulas only as 2β + γ, so they cannot be told apart from allreduce times alone: β is taken from
the measured TCP throughput of one link (--link-bytes-per-s, printed by tools/cluster/check.sh)
and α, γ are fitted; without it, β is fitted with γ = 0. The fit is least squares on relative
errors (each point weighted by 1/T) with α, β, γ ≥ 0. OpenMPI's MPI_Allreduce is described by
the ring formula with parameters of its own.

  costmodel.py fit RESULTS.csv... [--link-bytes-per-s B] [--min-bytes 1M] [--json params.json]
  costmodel.py predict --params params.json --np 8 --bytes 64M
  costmodel.py project --params params.json --compute-ms 200 --grad-mb 98 [--bucket-mb 25]
                       [--overlap 1] [--link-gbit 10] [--workers 8,16,...,256] [--svg out.svg]
  costmodel.py baidu [--params params.json] [--svg out.svg]
  costmodel.py ddl [--link-gbit 10,25,100] [--compute-ms 100,250,500] [--gpus-per-node 1]
                   [--alpha 10e-6] [--png out.png]     (ResNet-50 at 8..256 workers; 95 % target)

Input lines are the CSV `RESULT,impl,np,bytes,count,reps,median_us,...` lines of allreduce_bench
and of the peer benchmark mpi_allreduce; other lines are ignored. Bad arguments, files that
cannot be read or written and --params files that hold no parameters stop it with a message that
names the option or file (exit status 2).
"""
import argparse
import json
import math
import os
import sys

from allreduce_model import (MIB, bound, calibrate_compute, ddl_compute_for, ddl_efficiency, fit,
                             formula, load_links, load_params, parse_bytes, predict, project, read_inputs)
from costmodel_plot import png_plot, svg_plot


# ----------------------------------------------------------------------------------------------
# Arguments: argparse type functions, so that a bad value is reported as the option's

def number(low, high=math.inf, low_open=False, what=None):
    """A finite float in [low, high] ((low, high] with low_open)."""
    what = what or f"a number {'>' if low_open else '>='} {low:g}"

    def parse(text):
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and (v > low if low_open else v >= low) and v <= high):
            raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'")
        return v
    return parse


def positive_int(text):
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return v


def listed(parse):
    """A comma-separated list of values that `parse` takes."""
    def parse_list(text):
        vals = [v for v in text.split(",") if v.strip()]
        if not vals:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got '{text}'")
        return [parse(v.strip()) for v in vals]
    return parse_list


def byte_count(minimum):
    """The text of a byte count (parse_bytes: 4096, 64K, 1M ...) of at least `minimum`, kept as
    written for the reports."""
    def parse(text):
        try:
            v = parse_bytes(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e))
        if v < minimum:
            raise argparse.ArgumentTypeError(f"expected at least {minimum} byte(s), got '{text}'")
        return text.strip()
    return parse


POSITIVE = number(0, low_open=True)
NON_NEGATIVE = number(0)


def usage_error(a, msg):
    """Exits as argparse does for a bad argument (status 2), from the command's parser."""
    a.parser.error(msg)


def write_text(a, path, text):
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        usage_error(a, f"{path}: cannot write ({e.strerror})")


def write_png(a, path, *args, **kwargs):
    try:
        png_plot(path, *args, **kwargs)
    except OSError as e:
        usage_error(a, f"{path}: cannot write ({e.strerror})")


# ----------------------------------------------------------------------------------------------
# Commands

def inputs(a):
    try:
        return read_inputs(a.results)
    except OSError as e:
        usage_error(a, f"{e.filename}: cannot read ({e.strerror})")


def cmd_fit(a):
    rows, links = inputs(a)
    for r in rows:  # --link-bytes-per-s overrides; else each run's own measured link
        r["link"] = a.link_bytes_per_s or r["link"]
    bad = [r for r in rows if r["check"] != "OK"]
    if bad:
        print(f"# ignoring {len(bad)} result(s) that failed their check", file=sys.stderr)
    rows = [r for r in rows if r["check"] == "OK" and r["np"] > 1]
    min_bytes = parse_bytes(a.min_bytes)
    measured = all(r["link"] for r in rows)
    joint_impls = set(a.joint.split(","))
    fit_rows = [r for r in rows if r["bytes"] >= min_bytes]
    impls = sorted({r["impl"] for r in fit_rows})
    if not impls:
        sys.exit(f"costmodel: no results of at least {a.min_bytes} bytes in {', '.join(a.results)}")
    pts = lambda rs: [(formula(r["impl"]), r["np"], r["bytes"], r["us"] * 1e-6)
                      + ((1.0 / r["link"],) if measured else ()) for r in rs]
    joint_rows = [r for r in fit_rows if r["impl"] in joint_impls]
    if not joint_rows:  # the saved parameters are the joint fit's: never another implementation's
        sys.exit(f"costmodel: no results of --joint {a.joint} of at least {a.min_bytes} bytes in "
                 f"{', '.join(a.results)} (they hold {', '.join(impls)}): name those to fit together with --joint")
    fits = {}
    try:
        fits["joint"] = fit(pts(joint_rows))
        for impl in impls:
            fits[impl] = fit(pts([r for r in fit_rows if r["impl"] == impl]))
    except ValueError as e:  # a result of no time
        sys.exit(f"costmodel: {', '.join(a.results)}: {e}")

    print(f"# fit on results >= {a.min_bytes} bytes; beta "
          + (f"= 1/--link-bytes-per-s {a.link_bytes_per_s:g}" if a.link_bytes_per_s
             else "= 1/(measured TCP throughput of one link in the same run)" if measured
             else "fitted, gamma = 0 (no link measurement given)"))
    print("params,alpha_us,beta_ns_per_byte,gamma_ns_per_byte,link_equiv_MBps,points")
    for name, p in fits.items():
        n_pts = len(joint_rows) if name == "joint" else sum(r["impl"] == name for r in fit_rows)
        print(f"{name},{p['alpha'] * 1e6:.2f},{p['beta'] * 1e9:.4f},{p['gamma'] * 1e9:.4f},"
              f"{1e-6 / p['beta'] if p['beta'] else float('inf'):.1f},{n_pts}")

    print("point,impl,formula,np,link_MBps,bytes,measured_us,joint_us,joint_err_pct,own_us,own_err_pct"
          + (",bound_us,pct_of_bound" if measured else ""))
    worst = {"joint": 0.0, "own": 0.0}
    for r in sorted(rows, key=lambda r: (r["impl"], r["np"], r["bytes"])):
        kind = formula(r["impl"])
        t = r["us"] * 1e-6
        own = fits.get(r["impl"])
        joint = fits.get("joint") if r["impl"] in joint_impls else None
        cells = []
        for name, p in (("joint", joint), ("own", own)):
            if p is None:
                cells += ["", ""]
                continue
            if measured:
                p = dict(p, beta=1.0 / r["link"])
            pred = predict(p, kind, r["np"], r["bytes"])
            err = (pred - t) / t * 100
            cells += [f"{pred * 1e6:.1f}", f"{err:+.1f}"]
            if r["bytes"] >= min_bytes:
                worst[name] = max(worst[name], abs(err))
        extra = ""
        if measured:
            bnd = bound(r["np"], r["bytes"], r["link"])
            extra = f",{bnd * 1e6:.1f},{bnd / t * 100:.1f}"
        link = f"{r['link'] / 1e6:.1f}" if r.get("link") else ""
        print(f"point,{r['impl']},{kind},{r['np']},{link},{r['bytes']},{r['us']:.1f},{','.join(cells)}{extra}")
    print(f"# largest |error| at >= {a.min_bytes} bytes: joint fit {worst['joint']:.1f}%, "
          f"per-implementation fits {worst['own']:.1f}% (target 15%)")
    if a.json:
        # The links the fit used: --link-bytes-per-s stands for every run's measured one.
        used = {r["np"]: a.link_bytes_per_s for r in rows} if a.link_bytes_per_s else links
        write_text(a, a.json, json.dumps({"params": fits["joint"], "fits": fits,
                                          "min_bytes": min_bytes, "links": used,
                                          "worst_err_pct": worst}, indent=1))
    return 0


def link_bound(impl, n, s, link, per_host=1, round_robin=False):
    """The bandwidth bound of impl with per_host ranks on each of n/per_host hosts (one link
    each): the hierarchical allreduce's 2(H-1)/H · S/B; a ring in rank order with ranks placed
    round-robin crosses the network at every hop, per_host streams per link; otherwise (a ring in
    node order, and the reference for the others) the flat ring's 2(N-1)/N · S/B."""
    hosts = max(1, n // per_host)
    if impl.startswith("hierarchical"):
        return 2 * (hosts - 1) / hosts * s / link
    if round_robin and impl.startswith("ring/rank"):
        return per_host * bound(n, s, link)
    return bound(n, s, link)


def table_compact(rows, link_override=None, per_host=1, round_robin=False, versus="ring"):
    """Markdown, one table per (N, measured link): a cell per implementation with time, busbw and
    % of its bandwidth bound (link_bound); then the speed-up of `versus` over the others."""
    order = ["ring", "ring/rank", "hierarchical", "reducer", "openmpi", "openmpi-ring"]
    groups = {}
    for r in rows:
        link = link_override or r["link"]
        groups.setdefault((r["np"], link), []).append(r)
    for (n, link), rs in sorted(groups.items(), key=lambda g: (g[0][0], -(g[0][1] or 0))):
        at = {(r["impl"], r["bytes"]): r for r in rs}
        impls = [i for i in order if any(k[0] == i for k in at)]
        impls += sorted({k[0] for k in at} - set(impls))
        ratios = [i for i in impls if i != versus and versus in impls]
        what = ("the ring bound 2(N−1)/N·S/B" if per_host == 1 else
                f"its bound with {per_host} ranks per host{', placed round-robin' if round_robin else ''}"
                " (hierarchical 2(H−1)/H·S/B, else 2(N−1)/N·S/B"
                + (", ×" + str(per_host) + " for ring/rank)" if round_robin else ")"))
        print(f"\n**N = {n}**" + (f", one link {link / 1e6:.1f} MB/s (TCP, measured)" if link else "")
              + f"; cells: time ms · busbw GB/s · % of {what}; "
              f"{versus} / X: the {versus}'s speed-up over X (X's time ÷ the {versus}'s)\n")
        print("| size | " + " | ".join(impls) + " | " + " | ".join(f"{versus} / {i}" for i in ratios) + " |")
        print("|---:|" + "---:|" * (len(impls) + len(ratios)))
        for size in sorted({k[1] for k in at}):
            cells = []
            for i in impls:
                r = at.get((i, size))
                if r is None:
                    cells.append("–")
                    continue
                t = r["us"] * 1e-6
                c = f"{t * 1e3:.1f} · {size / t * 2 * (n - 1) / n / 1e9:.3f}"
                if link:
                    c += f" · {link_bound(i, n, size, link, per_host, round_robin) / t * 100:.0f}%"
                cells.append(c + ("" if r["check"] == "OK" else " FAIL"))
            ring = at.get((versus, size))
            for i in ratios:
                o = at.get((i, size))
                cells.append(f"{o['us'] / ring['us']:.2f}×" if o and ring else "–")
            label = (f"{size // MIB} MiB" if size % MIB == 0 else
                     f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} B")
            print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


def cmd_table(a):
    """One markdown table per N: time (ms), busbw (GB/s) and % of the ring's bandwidth bound for
    each implementation, and the ring's speed-ups over the others."""
    rows, links = inputs(a)
    min_bytes = parse_bytes(a.min_bytes)
    rows = [r for r in rows if r["bytes"] >= min_bytes and r["np"] > 1]
    if a.compact:
        return table_compact(rows, a.link_bytes_per_s, a.per_host, a.round_robin, a.versus)
    order = ["ring", "reducer", "openmpi", "openmpi-ring", "mpi"]
    # One table per N and run link: runs of one N at two link rates are two tables, each against
    # its own bound, not one whose cells mix them.
    for n, run_link in sorted({(r["np"], r.get("link") or 0) for r in rows}):
        link = a.link_bytes_per_s or run_link or links.get(n)
        at = {(r["impl"], r["bytes"]): r for r in rows if r["np"] == n and (r.get("link") or 0) == run_link}
        impls = [i for i in order if any(k[0] == i for k in at)]
        impls += sorted({k[0] for k in at} - set(impls))
        print(f"\n**N = {n}**" + (f" (link: {link / 1e6:.1f} MB/s TCP)" if link else "") + "\n")
        head = "| size |" + "".join(f" {i} ms | {i} busbw GB/s |" + (f" {i} % of bound |" if link else "")
                                    for i in impls)
        extra = [f"ring / {i}" for i in impls if i != "ring"] if "ring" in impls else []
        print(head + "".join(f" {e} |" for e in extra))
        print("|---:|" + "---:|" * (len(impls) * (3 if link else 2) + len(extra)))
        for size in sorted({k[1] for k in at}):
            cells = []
            for i in impls:
                r = at.get((i, size))
                if r is None:
                    cells += ["–"] * (3 if link else 2)
                    continue
                t = r["us"] * 1e-6
                mark = "" if r["check"] == "OK" else " FAIL"
                mark += "*" if r["contended"] else ""
                cells.append(f"{t * 1e3:.2f}{mark}")
                cells.append(f"{size / t * 2 * (n - 1) / n / 1e9:.4f}")
                if link:
                    cells.append(f"{bound(n, size, link) / t * 100:.1f}")
            ring = at.get(("ring", size))
            for i in impls:
                if i == "ring" or not extra:
                    continue
                o = at.get((i, size))
                cells.append(f"{o['us'] / ring['us']:.2f}×" if o and ring else "–")
            label = (f"{size // MIB} MiB" if size % MIB == 0 else
                     f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} B")
            print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


def params_from(a, n=None):
    """The model's parameters: --params FILE's, then --alpha/--beta/--gamma/--link-gbit. A fit on
    links of several speeds (results of runs at several rates) has no one beta: the link measured
    at rank count n is taken where the file has one, else a link speed must be given."""
    links = {}
    if a.params:
        try:
            p = load_params(a.params)
            links = load_links(a.params)
        except OSError as e:
            usage_error(a, f"--params {a.params}: cannot read ({e.strerror})")
        except ValueError as e:
            usage_error(a, f"--params {a.params}: {e}")
        if len(set(links.values())) > 1 and getattr(a, "beta", None) is None and not getattr(a, "link_gbit", None):
            if n not in links:
                speeds = ", ".join(f"N={k}: {v / 1e6:.1f} MB/s" for k, v in sorted(links.items()))
                sys.exit(f"costmodel: --params {a.params} was fitted on links of several speeds ({speeds}): "
                         "give the link to model with --link-gbit G")
            p = dict(p, beta=1.0 / links[n])
    else:
        p = {"alpha": 0.0, "beta": 0.0, "gamma": 0.0}
    for k in ("alpha", "beta", "gamma"):
        v = getattr(a, k, None)
        if v is not None:
            p[k] = v
    if getattr(a, "link_gbit", None):
        p = dict(p, beta=8.0 / (a.link_gbit * 1e9))
    if p["beta"] <= 0:
        sys.exit("costmodel: need a link speed: --params FILE, --beta S_PER_BYTE or --link-gbit G")
    return p


def cmd_predict(a):
    p = params_from(a, a.np)
    s = parse_bytes(a.bytes)
    for kind in ("ring", "reducer"):
        t = predict(p, kind, a.np, s)
        print(f"{kind},np={a.np},bytes={s},time_us={t * 1e6:.1f},busbw_GBps={s / t * 2 * (a.np - 1) / a.np / 1e9 if t else 0:.3f}")
    return 0


def cmd_project(a):
    p = params_from(a)
    workers = a.workers
    res = project(p, ["ring", "reducer"], workers, a.compute_ms * 1e-3, a.grad_mb * MIB,
                  a.bucket_mb * MIB, bool(a.overlap), a.backward_fraction)
    print(f"# alpha {p['alpha'] * 1e6:.2f} us, link {1 / p['beta'] / 1e9:.3f} GB/s, gamma "
          f"{p['gamma'] * 1e9:.4f} ns/B; compute {a.compute_ms} ms/step, gradients {a.grad_mb} MiB, "
          f"buckets {a.bucket_mb} MiB, overlap {'on' if a.overlap else 'off'}")
    print("workers,ring_step_ms,ring_efficiency,ring_speedup,reducer_step_ms,reducer_efficiency,reducer_speedup")
    for (n, tr, er, sr), (_, tp, ep, sp) in zip(res["ring"], res["reducer"]):
        print(f"{n},{tr * 1e3:.2f},{er:.3f},{sr:.1f},{tp * 1e3:.2f},{ep:.3f},{sp:.1f}")
    series = [("ring", [(n, e) for n, _, e, _ in res["ring"]]),
              ("single reducer", [(n, e) for n, _, e, _ in res["reducer"]])]
    if a.svg:
        write_text(a, a.svg, svg_plot(series, "Projected scaling efficiency", "workers", "efficiency", ymax=1.0))
    if a.png:
        write_png(a, a.png, series, "Projected scaling efficiency", "workers", "efficiency", ymax=1.0)
    return 0


def cmd_baidu(a):
    """Ring vs single reducer as N grows, calibrated so that the ring gives the published 31x at
    40 GPUs. The compute time per step is what the calibration sets; the reducer's speed-up then
    follows from the model alone."""
    # Baidu's setting (56 Gbit/s InfiniBand, 5 us), each part replaced by what is given.
    p = params_from(a) if a.params else {"alpha": 5e-6, "beta": 8.0 / 56e9, "gamma": 0.0}
    for k in ("alpha", "beta", "gamma"):
        if getattr(a, k, None) is not None:
            p[k] = getattr(a, k)
    if a.link_gbit:
        p["beta"] = 8.0 / (a.link_gbit * 1e9)
    grad = a.grad_mb * MIB
    compute = calibrate_compute(p, "ring", 40, 31.0, grad, a.bucket_mb * MIB, bool(a.overlap))
    workers = [1, 2, 4, 8, 16, 24, 32, 40, 64, 128, 256]
    res = project(p, ["ring", "reducer"], workers, compute, grad, a.bucket_mb * MIB, bool(a.overlap))
    t40_ring = predict(p, "ring", 40, grad)
    t40_red = predict(p, "reducer", 40, grad)
    print(f"# link {1 / p['beta'] / 1e9:.2f} GB/s, alpha {p['alpha'] * 1e6:.1f} us, gradients "
          f"{a.grad_mb} MiB, buckets {a.bucket_mb} MiB, overlap {'on' if a.overlap else 'off'}; "
          f"compute per step calibrated to the ring's 31x at 40: {compute * 1e3:.1f} ms")
    print(f"# one allreduce of the gradients at N = 40: ring {t40_ring * 1e3:.1f} ms, "
          f"reducer {t40_red * 1e3:.1f} ms ({t40_red / t40_ring:.1f}x)")
    print("workers,ring_speedup,ring_efficiency,reducer_speedup,reducer_efficiency")
    for (n, _, er, sr), (_, _, ep, sp) in zip(res["ring"], res["reducer"]):
        print(f"{n},{sr:.1f},{er:.3f},{sp:.1f},{ep:.3f}")
    series = [("ring (model)", [(n, s) for n, _, _, s in res["ring"]]),
              ("single reducer (model)", [(n, s) for n, _, _, s in res["reducer"]]),
              ("linear", [(n, float(n)) for n in workers])]
    marks = [(40, 31.0, "published 31x")]
    if a.svg:
        write_text(a, a.svg, svg_plot(series, "Speed-up over one worker", "workers", "speed-up", marks=marks))
    if a.png:
        write_png(a, a.png, series, "Speed-up over one worker", "workers", "speed-up", marks=marks)
    return 0


def cmd_ddl(a):
    """ResNet-50 weak scaling at 8..256 workers under a grid of link speeds and compute times per
    step, the question IBM DDL (95 % at 256 GPUs) and Goyal et al. (about 90 % from 8 to 256 GPUs)
    answered by measurement: which assumptions reach the target efficiency at 256?"""
    links, computes, workers = a.link_gbit, a.compute_ms, a.workers
    grad, bucket, g = a.grad_mb * MIB, a.bucket_mb * MIB, a.gpus_per_node
    par = lambda link: {"alpha": a.alpha, "beta": 8.0 / (link * 1e9), "gamma": a.gamma}
    big = max(workers)
    print(f"# gradients {a.grad_mb:.2f} MiB ({grad / 1e6:.1f} MB), buckets {a.bucket_mb} MiB, overlap "
          f"{'on' if a.overlap else 'off'}, alpha {a.alpha * 1e6:g} us, gamma {a.gamma * 1e9:g} ns/B, "
          f"{g} worker(s) per node (free inside a node), one link per node; backward 2/3 of compute")
    print(f"# efficiency at {big} workers (compute / step time); * = reaches {a.target:g}")
    print("link_gbit," + ",".join(f"compute_{c:g}ms" for c in computes) + f",compute_ms_for_{a.target:g}")
    for link in links:
        cells = []
        for c in computes:
            e = ddl_efficiency(par(link), big, c * 1e-3, grad, bucket, bool(a.overlap), g)
            cells.append(f"{e:.3f}" + ("*" if e >= a.target else ""))
        need = ddl_compute_for(par(link), big, a.target, grad, bucket, bool(a.overlap), g)
        print(f"{link:g}," + ",".join(cells) + (f",{need * 1e3:.1f}" if math.isfinite(need) else ",unreachable"))
    print("# efficiency against workers")
    print("link_gbit,compute_ms," + ",".join(str(w) for w in workers))
    series = []
    for i, link in enumerate(links):
        for j, c in enumerate(computes):
            effs = [ddl_efficiency(par(link), n, c * 1e-3, grad, bucket, bool(a.overlap), g) for n in workers]
            print(f"{link:g},{c:g}," + ",".join(f"{e:.3f}" for e in effs))
            style = {"color": f"C{i}", "linestyle": ("-", "--", "-.", ":")[j % 4]}
            series.append((f"{link:g} Gbit/s, {c:g} ms", list(zip(workers, effs)), style))
    if a.png:
        write_png(a, a.png, series, f"ResNet-50 weak scaling (model), {g} worker(s)/node", "workers",
                  "efficiency", ymax=1.02, hline=a.target)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="fit alpha, beta, gamma; print the error at every point")
    f.add_argument("results", nargs="+", help="files with RESULT lines ('-' = stdin)")
    f.add_argument("--link-bytes-per-s", type=POSITIVE, help="measured TCP throughput of one link (fixes beta)")
    f.add_argument("--min-bytes", type=byte_count(0), default="1M", help="fit and judge only sizes >= this (1M)")
    f.add_argument("--joint", default="ring,reducer", help="implementations fitted together (ring,reducer)")
    f.add_argument("--json", help="write the parameters here")
    t = sub.add_parser("table", help="markdown table of measured results against the bound")
    t.add_argument("results", nargs="+")
    t.add_argument("--link-bytes-per-s", type=POSITIVE, help="default: the LINK lines of the input")
    t.add_argument("--min-bytes", type=byte_count(0), default="1M")
    t.add_argument("--compact", action="store_true", help="one cell per implementation")
    t.add_argument("--per-host", type=positive_int, default=1, help="--compact: ranks per host (the bounds)")
    t.add_argument("--round-robin", action="store_true", help="--compact: ranks were placed --map-by node")
    t.add_argument("--versus", default="ring", help="--compact: whose speed-up over the others (ring)")
    subs = [f, t]
    for name in ("predict", "project", "baidu"):
        s = sub.add_parser(name)
        subs.append(s)
        s.add_argument("--params", help="JSON written by fit")
        s.add_argument("--alpha", type=NON_NEGATIVE)
        s.add_argument("--beta", type=NON_NEGATIVE)
        s.add_argument("--gamma", type=NON_NEGATIVE)
        s.add_argument("--link-gbit", type=POSITIVE, help="link rate in Gbit/s (sets beta)")
        if name == "predict":
            s.add_argument("--np", type=positive_int, required=True)
            s.add_argument("--bytes", type=byte_count(1), required=True)
        else:
            s.add_argument("--grad-mb", type=POSITIVE, default=98.0 if name == "project" else 381.5,
                           help="gradient MiB (resnet50 fp32: 98; baidu: 100M params = 381.5)")
            s.add_argument("--bucket-mb", type=POSITIVE, default=25.0)
            s.add_argument("--overlap", type=int, choices=(0, 1), default=1 if name == "project" else 0)
            s.add_argument("--svg", help="write a plot here")
            s.add_argument("--png", help="write the plot as PNG here (matplotlib)")
        if name == "project":
            s.add_argument("--compute-ms", type=POSITIVE, required=True, help="forward+backward per step")
            s.add_argument("--workers", type=listed(positive_int), default="8,16,32,64,128,256")
            s.add_argument("--backward-fraction", type=number(0, 1, what="a fraction from 0 to 1"), default=2.0 / 3.0)
    d = sub.add_parser("ddl", help="ResNet-50 weak scaling to 256 workers over link speeds and compute times")
    subs.append(d)
    d.add_argument("--link-gbit", type=listed(POSITIVE), default="10,25,100", help="link rates, Gbit/s (10,25,100)")
    d.add_argument("--compute-ms", type=listed(POSITIVE), default="100,250,500",
                   help="forward+backward per step (100,250,500)")
    d.add_argument("--workers", type=listed(positive_int), default="8,16,32,64,128,256")
    d.add_argument("--gpus-per-node", type=positive_int, default=1, help="workers sharing one node link (1)")
    d.add_argument("--alpha", type=NON_NEGATIVE, default=10e-6, help="seconds per message (10e-6)")
    d.add_argument("--gamma", type=NON_NEGATIVE, default=0.0, help="reduction seconds per byte (0)")
    d.add_argument("--grad-mb", type=POSITIVE, default=25.6e6 * 4 / MIB, help="ResNet-50: 25.6M x 4 B")
    d.add_argument("--bucket-mb", type=POSITIVE, default=25.0)
    d.add_argument("--overlap", type=int, choices=(0, 1), default=1)
    d.add_argument("--target", type=number(0, 1, low_open=True, what="a fraction > 0 and <= 1"), default=0.95)
    d.add_argument("--png", help="write the plot here (matplotlib)")
    for s in subs:
        s.set_defaults(parser=s)
    a = ap.parse_args(argv)
    for opt in ("json", "svg", "png"):  # before the work: a folder that is not there, say
        out = getattr(a, opt, None)
        if out and (os.path.isdir(out) or not os.path.isdir(os.path.dirname(out) or ".")):
            usage_error(a, f"--{opt} {out}: " + ("is a folder" if os.path.isdir(out) else "no such folder"))
    return {"ddl": cmd_ddl, "fit": cmd_fit, "table": cmd_table, "predict": cmd_predict, "project": cmd_project, "baidu": cmd_baidu}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
