"""The benchmarks' figures in docs/: a generated table goes between `<!-- NAME:begin -->` and
`<!-- NAME:end -->` of a Markdown file, replacing what was there; a file without the markers gets
them appended."""
import os


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
