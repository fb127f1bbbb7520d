"""docs/results.md "Per-op overhead" (section overhead), from bench/results/overhead.json: the Google Benchmark
output of bench/cpp/overhead_benchmark.cpp (hpac_bench_overhead), median of 7 repetitions per variant."""
from bench.common.report import load, medians


def overhead(r):
    med = medians(load(r, "overhead.json"))
    a = med["BM_Add_NotLoaded"]
    out = ["| variant | ns/op (median of 7) | vs (a) |", "|---|---:|---:|"]
    for key, label in [("BM_Add_NotLoaded", "(a) hpac not loaded"), ("BM_Add_LoadedNoRegion", "(b) loaded, no region"),
                       ("BM_Add_RegionForward", "(c) in a region, forward"),
                       ("BM_Add_RegionServe", "(d) in a region, recompute, served")]:
        out.append(f"| {label} | {med[key]:.0f} | {med[key] / a:.3f} ({med[key] - a:+.0f} ns) |")
    return out
