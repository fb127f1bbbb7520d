"""docs/results.md "Under torch.compile" (section compile_compare): hpac eager and compiled beside
torch.compile's activation_memory_budget, from bench/results/compile_compare.json (bench/peers/compile_compare.py)."""
from bench.common.report import load, tunables


def compile_compare(r):
    """hpac eager and compiled beside torch.compile's own activation_memory_budget (bench/peers/compile_compare.py): per
    model one row per method, peak and step time as ratios to eager off, compile time apart."""
    d = load(r, "compile_compare.json")
    out = [f"torch {d['torch']}, {d['threads']} threads on {d['cpus']} CPUs (1-minute load average "
           f"{d['load_average_at_start']:.1f} at the start, {d['load_average_at_end']:.1f} at the end), "
           f"GLIBC_TUNABLES={tunables(d)}, compiler {d['backend']}, median of {d['steps']} "
           "steps per method (forward + backward). Eager methods interleaved; each compiled method alternated with a "
           "fresh eager off model, whose median is its time reference. |dgrad|: the largest gradient difference "
           "from eager off of the same step."]
    for name, m in d["models"].items():
        rows = m["rows"]
        off = next(x for x in rows if x["method"] == "eager:off")
        out += ["", f"**{name}**: {m['shape']}", "",
                "| method | peak | vs eager off | step time (median) | vs eager off | compile | max abs dgrad vs off |",
                "|---|---|---|---|---|---|---|"]
        for x in rows:
            off_ms = x.get("off_ms_median_alongside", off["ms_median"])
            off_peak = x.get("off_peak_alongside", off["peak_bytes"])
            compile_s = f"{x['compile_s']:.0f} s" if "compile_s" in x else "-"
            out.append(f"| {x['method']} | {x['peak_bytes'] / 2**20:.1f} MiB | {x['peak_bytes'] / off_peak:.2f}x | "
                       f"{x['ms_median']:.0f} ms | {x['ms_median'] / off_ms:.2f}x | {compile_s} | "
                       f"{x['max_dgrad_vs_off']:.2g} |")
    return out
