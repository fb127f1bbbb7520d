"""Prints the markdown tables of docs/results.md from the suite's JSON (bench/results/*.json).

    .venv/bin/python bench/report_results.py bench/results > /tmp/tables.md
"""
import json
import os
import re
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def rows(data, pattern):
    out = []
    for b in data["benchmarks"]:
        m = re.match(pattern, b["name"])
        if m and b.get("run_type") != "aggregate":
            out.append((m, b))
    return out


def overhead(d):
    med = {b["name"].replace("_median", ""): b["ns_per_op"] for b in d["benchmarks"] if b["name"].endswith("_median")}
    a = med["BM_Add_NotLoaded"]
    print("| variant | ns/op (median of 7) | vs (a) |\n|---|---:|---:|")
    for key, label in [("BM_Add_NotLoaded", "(a) hpac not loaded"), ("BM_Add_LoadedNoRegion", "(b) loaded, no region"),
                       ("BM_Add_RegionForward", "(c) in a region, forward"),
                       ("BM_Add_RegionServe", "(d) in a region, recompute, served")]:
        print(f"| {label} | {med[key]:.0f} | {med[key] / a:.3f} ({med[key] - a:+.0f} ns) |")


def step_table(d, pattern, label):
    print(f"| {label} | off ms | full ms | selective ms | full/off time | sel/off time | off peak MiB | full peak MiB "
          "| sel peak MiB | full/off peak | sel/off peak | sel served | sel recomputed |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m, b in rows(d, pattern):
        print(f"| {m.group(0).split('/', 1)[1]} | {b['off_ms']:.1f} | {b['full_ms']:.1f} | {b['selective_ms']:.1f} | "
              f"{b['full_vs_off_time']:.2f} | {b['selective_vs_off_time']:.2f} | {b['off_peak_MiB']:.1f} | "
              f"{b['full_peak_MiB']:.1f} | {b['selective_peak_MiB']:.1f} | {b['full_vs_off_peak']:.2f} | "
              f"{b['selective_vs_off_peak']:.2f} | {b['selective_served']:.0f} | {b['selective_recomputed']:.0f} |")


def peer(d):
    print(f"torch {d['torch']}, {d['threads']} thread(s), GLIBC_TUNABLES={d['glibc_tunables']}\n")
    print("| seq | off ms | torch_full ms | py_sac ms | hpac ms | off peak MiB | torch_full | py_sac | hpac | "
          "hpac/py_sac time | hpac/torch_full time | hpac/off time |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in d["results"]:
        print(f"| {r['seq']} | {r['off']['ms']:.1f} | {r['torch_full']['ms']:.1f} | {r['py_sac']['ms']:.1f} | "
              f"{r['hpac']['ms']:.1f} | {r['off']['peak_MiB']:.1f} | {r['torch_full']['peak_MiB']:.1f} | "
              f"{r['py_sac']['peak_MiB']:.1f} | {r['hpac']['peak_MiB']:.1f} | {r['hpac_vs_py_sac_time']:.3f} | "
              f"{r['hpac_vs_torch_full_time']:.3f} | {r['hpac_vs_off_time']:.3f} |")


def sac_peer(d):
    mib = 2 ** 20
    print(f"torch {d['torch']}, {d['threads']} thread(s), key {d['hpac_dispatch_key']}, "
          f"GLIBC_TUNABLES={d['glibc_tunables']}\n")
    print("| attention | seq | reps | off ms | hpac ms | PyTorch SAC ms | hpac/SAC time, median of per-rep ratios "
          "[min, max] |\n|---|---:|---:|---:|---:|---:|---:|")
    for r in d["steps"]:
        t = r["time_ratio_hpac_over_pytorch_sac"]
        print(f"| {r['attention']} | {r['seq']} | {r['reps']} | {r['off']['ms_median']:.1f} | "
              f"{r['hpac']['ms_median']:.1f} | {r['pytorch_sac']['ms_median']:.1f} | "
              f"{t['median']:.3f} [{t['min']:.2f}, {t['max']:.2f}] |")
    print("\n| attention | seq | off peak MiB | hpac peak | SAC peak | off kept MiB | hpac kept | SAC kept | "
          "grads bitwise = off (hpac, SAC) |\n|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in d["steps"]:
        o, h, p = r["off"], r["hpac"], r["pytorch_sac"]
        print(f"| {r['attention']} | {r['seq']} | {o['peak_bytes'] / mib:.2f} | {h['peak_bytes'] / mib:.2f} | "
              f"{p['peak_bytes'] / mib:.2f} | {o['kept_bytes'] / mib:.2f} | {h['kept_bytes'] / mib:.2f} | "
              f"{p['kept_bytes'] / mib:.2f} | {h['grads_bitwise_equal_off']}, {p['grads_bitwise_equal_off']} |")
    per_op = d["per_op"]
    print(f"\n| per op: {per_op['ops_per_round']} × {per_op['op']}, {per_op['rounds']} rounds | median ns/op | "
          "extra over plain |\n|---|---:|---:|")
    for k, v in per_op["ns_per_op_median"].items():
        extra = per_op["extra_ns_per_op_over_plain"].get(k)
        print(f"| {k} | {v:.0f} | {'' if extra is None else f'{extra:+.0f}'} |")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "bench/results"
    print("### Per-op overhead (hpac_bench_overhead)\n")
    overhead(load(os.path.join(root, "overhead.json")))
    print("\n### Block step per mode (hpac_bench_step: Qwen3-MoE-shaped blocks, hidden 128, batch 1)\n")
    step_table(load(os.path.join(root, "step.json")), r"BM_Step/seq:(\d+)/layers:(\d+)", "seq / layers")
    path = os.path.join(root, "train_step.json")
    if os.path.exists(path):
        print("\n### Trainer step per mode (hpac_bench_train_step: zoo models with AdamW, batch 1; model 0 = "
              "qwen3_moe_tiny, 1 = gpt2_tiny)\n")
        step_table(load(path), r"BM_TrainStep/model:(\d+)/seq:(\d+)/layers:(\d+)", "model / seq / layers")
    print("\n### Peer harness (bench/peer_harness.py: 4 Python Qwen3-MoE-style blocks, hidden 128, batch 1)\n")
    peer(load(os.path.join(root, "peer.json")))
    path = os.path.join(root, "sac_peer.json")
    if os.path.exists(path):
        print("\n### hpac vs PyTorch's own SAC (bench/sac_peer.py)\n")
        sac_peer(load(path))


if __name__ == "__main__":
    main()
