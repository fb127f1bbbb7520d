"""What every report section shares (python3 -m bench.report is the command; bench/<area>/*_report.py the sections):
reading bench/results/*.json, Google Benchmark rows and medians, number formatting, the generated regions of
docs/*.md and README.md, the --write/--check machinery and the check that no measured figure stands outside a region.

A section is a function of the results directory that returns the region's lines; bench.report.SECTIONS maps
each region name to its section. Only the Python standard library.
"""
import json
import os
import re
import sys

from bench.common import ROOT


REGION = re.compile(r"<!-- BEGIN generated (\S+) -->\n(.*?)<!-- END generated \1 -->\n", re.S)
# A figure inside the document's own prose: <!-- fig NAME.KEY -->value<!-- /fig -->, the value from figure set NAME
# (bench.report.FIGURES: a function of the results directory returning {KEY: text}). One line, never nested.
INLINE = re.compile(r"<!-- fig (\w+)\.(\w+) -->(.*?)<!-- /fig -->")
QUOTED = re.compile(r"<!-- BEGIN quoted [^>]*-->\n.*?<!-- END quoted -->\n", re.S)
# A measured figure: a ratio (1.5×), a percentage, or a quantity in ms, ns or MiB.
FIGURE = re.compile(r"\d+\.\d+\s?×|\b\d+(?:\.\d+)?\s?%|\b\d+(?:\.\d+)?\s?(?:ms|ns|MiB)\b")


def load(results, name):
    with open(os.path.join(results, name)) as f:
        return json.load(f)


def rows(data, pattern):
    """(match, benchmark) of a Google Benchmark JSON's entries whose name matches pattern, aggregates left out."""
    out = []
    for b in data["benchmarks"]:
        m = re.match(pattern, b["name"])
        if m and b.get("run_type") != "aggregate":
            out.append((m, b))
    return out


def medians(data):
    """{benchmark: ns_per_op} of a Google Benchmark JSON's median aggregates (each name's "_median" taken off)."""
    return {b["name"].replace("_median", ""): b["ns_per_op"] for b in data["benchmarks"]
            if b["name"].endswith("_median")}


def span(values, fmt="{:.2f}"):
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}–{hi}"


def tunables(d):
    """The header's GLIBC_TUNABLES, one spelling for unset (older JSONs wrote None, "" or "(unset)")."""
    return d.get("glibc_tunables") or "(unset)"


def machine(d):
    """Where a benchmark ran: torch, threads, CPUs, the load at the end, GLIBC_TUNABLES."""
    return (f"torch {d['torch']}, {d['threads'] or 'default'} threads on {d['cpus']} CPUs (1-minute load average "
            f"{d['load_average_at_end']:.1f} at the end), GLIBC_TUNABLES={tunables(d)}")


def render(text, results, sections, figures=None):
    """(new text, problems): every generated region replaced by its section, every inline figure by its value."""
    problems = []
    text = render_inline(text, results, figures or {}, problems)

    def sub(m):
        name = m.group(1)
        if name not in sections:
            problems.append(f"unknown generated section '{name}' (known: {', '.join(sorted(sections))})")
            return m.group(0)
        try:
            body = "\n".join(sections[name](results))
        except FileNotFoundError as e:
            problems.append(f"section '{name}' needs {e.filename}, which is missing: run the benchmark that writes it")
            return m.group(0)
        return f"<!-- BEGIN generated {name} -->\n{body}\n<!-- END generated {name} -->\n"

    return REGION.sub(sub, text), problems


def render_inline(text, results, figures, problems):
    """`text` with every inline figure's value taken from its figure set; problems appended to `problems`."""
    values = {}

    def sub(m):
        name, key = m.group(1), m.group(2)
        if name not in figures:
            problems.append(f"unknown figure set '{name}' (known: {', '.join(sorted(figures))})")
            return m.group(0)
        if name not in values:
            try:
                values[name] = figures[name](results)
            except FileNotFoundError as e:
                problems.append(f"figure set '{name}' needs {e.filename}, which is missing: run the benchmark that "
                                "writes it")
                values[name] = {}
        if key not in values[name]:
            if values[name]:
                problems.append(f"figure set '{name}' has no figure '{key}' (it has: {', '.join(values[name])})")
            return m.group(0)
        return f"<!-- fig {name}.{key} -->{values[name][key]}<!-- /fig -->"

    return INLINE.sub(sub, text)


def stray_figures(text):
    """Lines outside generated and quoted regions and inline figures that quote a measured figure."""
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    rest = INLINE.sub("", QUOTED.sub(blank, REGION.sub(blank, text)))
    return [(n, line) for n, line in enumerate(rest.split("\n"), 1) if FIGURE.search(line)]


def print_sections(sections, results, figures=None):
    """Every section and figure set on stdout, a missing JSON named instead of its section."""
    for name, fn in list(sections.items()) + list((figures or {}).items()):
        try:
            out = fn(results)
            body = "\n".join(f"{k}: {v}" for k, v in out.items()) if isinstance(out, dict) else "\n".join(out)
            print(f"<!-- {name} -->\n{body}\n")
        except FileNotFoundError as e:
            print(f"<!-- {name} -->\n(not measured here: {os.path.relpath(e.filename, ROOT)} is missing)\n")


def first_difference(path, text, new):
    """The --check problem for a document whose regions differ from the JSON: its first differing line."""
    old_lines, new_lines = text.split("\n"), new.split("\n")
    n = next((i for i, (x, y) in enumerate(zip(old_lines, new_lines)) if x != y), min(len(old_lines), len(new_lines)))
    return (f"line {n + 1} differs from the JSON:\n  document: {old_lines[n] if n < len(old_lines) else ''}"
            f"\n  JSON:     {new_lines[n] if n < len(new_lines) else ''}\n  "
            f"(python3 -m bench.report --write {path})")


def write_or_check(write, check, results, sections, figures=None):
    """--write DOC... (write) rewrites the generated regions in place; --check DOC... (check) fails on a region that
    differs from the JSON. Both fail on an unknown or unmeasured section and on a figure outside the regions.
    Returns the exit status."""
    failed = False
    for path in write or check:
        with open(path) as f:
            text = f.read()
        new, problems = render(text, results, sections, figures)
        for n, line in stray_figures(text):
            problems.append(f"line {n} quotes a figure outside a generated region or an inline figure: {line.strip()}")
        if write and new != text:
            with open(path, "w") as f:
                f.write(new)
            print(f"{path}: regions rewritten from {results}")
        elif check and new != text:
            problems.append(first_difference(path, text, new))
        for p in problems:
            print(f"{path}: {p}", file=sys.stderr)
        failed = failed or bool(problems)
    if check and not failed:
        print(f"every figure in {len(check)} document(s) matches {results}")
    return 1 if failed else 0
