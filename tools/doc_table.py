"""The benchmarks' figures in docs/: the rates their runs print, read back from a log, and a
generated table put between `<!-- NAME:begin -->` and `<!-- NAME:end -->` of a Markdown file,
replacing what was there (a file without the markers gets them appended)."""
import datetime
import os
import re


def run_rates(log):
    """{(WHAT, SETTING): (median, min, max)} from the log's lines
    "RUN WHAT SETTING ... img_per_s_median=M min=A max=B" (what the loader benchmarks print)."""
    res = {}
    for line in open(log):
        m = re.match(r"RUN (\S+) (\S+) .*img_per_s_median=([\d.]+) min=([\d.]+) max=([\d.]+)", line)
        if m:
            res[(m[1], m[2])] = tuple(float(x) for x in m.groups()[2:])
    return res


def measured_on(load_before, load_after):
    """A table's first words: the date, this machine and its load average around the runs."""
    return (f"Measured {datetime.date.today()} on {os.uname().nodename} ({os.cpu_count()} cores), load average "
            f"{load_before} before and {load_after} after")


def rate_cell(rate):
    """A (median, min, max) as a table cell: "median (min–max)"."""
    med, lo, hi = rate
    return f"{med:.0f} ({lo:.0f}–{hi:.0f})"


def put_between_markers(path, name, body):
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = open(path).read() if os.path.exists(path) else ""
    if begin not in text or end not in text:
        text += f"\n{begin}\n{end}\n"
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    body = body if body.endswith("\n") else body + "\n"
    with open(path, "w") as f:
        f.write(f"{head}{begin}\n{body}{end}{tail}")
