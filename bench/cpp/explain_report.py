"""docs/explain.md's example (section explain): hpac-explain's per-op table, one JSON row and the peak per mode,
from bench/results/explain.json (written by build/tools/explain/hpac-explain --json)."""
import json

from bench.common.report import load


def explain(r):
    """hpac-explain's report (docs/explain.md): the head of its per-op table in the CLI's layout, one JSON row, the peak
    per mode; all from the JSON the CLI wrote."""
    d = load(r, "explain.json")
    out = [f"From `bench/results/explain.json` ({d['source']}; region {d['region']}, mode {d['mode']}), the first "
           "rows of each phase in `hpac-explain`'s layout:", "", "```",
           f"{'phase':<10}{'op':<30}{'occ':>5}  {'decision':<10}{'out bytes':>12}{'kept bytes':>12}{'us':>10}  rule"]
    for phase in ("forward", "recompute"):
        for row in [o for o in d["ops"] if o["phase"] == phase][:8]:
            out.append(f"{phase:<10}{row['op']:<30}{row['occurrence']:>5}  {row['decision']:<10}{row['output_bytes']:>12}"
                       f"{row['kept_bytes']:>12}{row['micros']:>10.1f}  {row['rule']}")
    s = d["stats"]
    out += ["```", "", f"{len(d['ops'])} rows in all (forward and recompute, ignored ops included); the invocation saved "
                       f"{s['saved']} outputs, served {s['served']}, recomputed {s['recomputed']}"
                       + (f", skipped {s['skipped']} (nothing backward needed depended on them)" if s.get("skipped") else "")
                       + ".", "",
            "One row of the JSON as written (`ops[2]`):", "", "```json", json.dumps(d["ops"][2]), "```", "",
            "| mode | peak tensor bytes above the step's start | allocator events |", "|---|---:|---:|"]
    for t in d["timeline"]:
        out.append(f"| {t['mode']} | {t['peak_bytes'] / 2**20:.2f} MiB | {len(t['bytes'])} |")
    return out
