"""The plots of tools/costmodel.py: a dependency-free SVG writer and the same plot by matplotlib."""
import math

def png_plot(path, series, title, xlabel, ylabel, ymax=None, marks=(), hline=None):
    """The same plot as svg_plot, as a PNG (matplotlib, Agg backend)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, pts, *style in series:  # style: optional matplotlib keywords
        ax.plot([x for x, _ in pts], [y for _, y in pts], **dict({"marker": "o"}, **(style[0] if style else {})),
                label=label)
    for x, y, label in marks:
        ax.plot([x], [y], "ks")
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, -12), fontsize=8)
    if hline is not None:
        ax.axhline(hline, color="gray", linestyle=":")
    ax.set_xscale("log", base=2)
    ticks = sorted({x for _, pts, *_ in series for x, _ in pts})
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if ymax is not None:
        ax.set_ylim(0, ymax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110, format="png")  # whatever the name ends in: no extension added
    finally:
        plt.close(fig)


# ----------------------------------------------------------------------------------------------
# SVG (no plotting library needed)

def svg_plot(series, title, xlabel, ylabel, logx=True, ymax=None, marks=()):
    """series: [(label, [(x, y)])] → an SVG document (str). marks: [(x, y, label)] points."""
    w, h, ml, mr, mt, mb = 640, 400, 60, 170, 40, 50
    xs = [x for _, pts in series for x, _ in pts] + [m[0] for m in marks]
    ys = [y for _, pts in series for _, y in pts] + [m[1] for m in marks]
    fx = (lambda v: math.log2(v)) if logx else (lambda v: v)
    x0, x1 = fx(min(xs)), fx(max(xs))
    y1 = ymax if ymax is not None else max(ys) * 1.05
    x1 = x1 if x1 > x0 else x0 + 1
    px = lambda v: ml + (fx(v) - x0) / (x1 - x0) * (w - ml - mr)
    py = lambda v: h - mb - v / y1 * (h - mt - mb)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
         f'<rect width="{w}" height="{h}" fill="white"/>',
         f'<text x="{w / 2 - mr / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>',
         f'<line x1="{ml}" y1="{h - mb}" x2="{w - mr}" y2="{h - mb}" stroke="black"/>',
         f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{h - mb}" stroke="black"/>',
         f'<text x="{(ml + w - mr) / 2}" y="{h - 12}" text-anchor="middle">{xlabel}</text>',
         f'<text x="16" y="{(mt + h - mb) / 2}" text-anchor="middle" transform="rotate(-90 16 {(mt + h - mb) / 2})">{ylabel}</text>']
    ticks = sorted(set(xs))
    for t in ticks:
        o.append(f'<line x1="{px(t):.1f}" y1="{h - mb}" x2="{px(t):.1f}" y2="{h - mb + 5}" stroke="black"/>')
        o.append(f'<text x="{px(t):.1f}" y="{h - mb + 18}" text-anchor="middle">{t:g}</text>')
    for i in range(6):
        v = y1 * i / 5
        o.append(f'<line x1="{ml - 5}" y1="{py(v):.1f}" x2="{w - mr}" y2="{py(v):.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{ml - 8}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>')
    for i, (label, pts) in enumerate(series):
        c = colors[i % len(colors)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        o.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        for x, y in pts:
            o.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{c}"/>')
        o.append(f'<line x1="{w - mr + 10}" y1="{mt + 20 * i + 6}" x2="{w - mr + 30}" y2="{mt + 20 * i + 6}" stroke="{c}" stroke-width="2"/>')
        o.append(f'<text x="{w - mr + 35}" y="{mt + 20 * i + 10}">{label}</text>')
    for x, y, label in marks:
        o.append(f'<rect x="{px(x) - 4:.1f}" y="{py(y) - 4:.1f}" width="8" height="8" fill="black"/>')
        o.append(f'<text x="{px(x) + 8:.1f}" y="{py(y) - 6:.1f}">{label}</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"
