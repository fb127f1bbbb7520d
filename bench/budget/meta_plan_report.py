"""docs/results.md "Plan for the machine you will train on" (sections meta_plan and meta_plan_scale), from
bench/results/meta_plan_*.json (bench/budget/meta_plan.py)."""
import os
import re

from bench.common.report import load, tunables


def _mib(b):
    return f"{b / 2**20:.2f} MiB"


def _gib(b):
    return f"{b / 2**30:.2f} GiB"


def _layers(layers):
    """A plan as the table shows it: per layer the budget's bytes in MiB, or off (left unwrapped)."""
    return " ".join(f"{b / 2**20:.2f}" if on else "off" for on, b in layers)


def _check(d, name):
    c = d["check"]
    if d["shapes"] == "30b":
        shapes = (f"Qwen3-30B-A3B's layer shapes, {d['layers']} layers, batch {d['batch']} x seq {d['seq']}, "
                  "float32 (the model of python -m bench.budget.memory_target --shapes 30b)")
    else:
        shapes = f"`{c['config']}`"
    out = [f"`bench/results/{name}`: measured by `python -m bench.budget.meta_plan --check` at commit {d['commit']} (torch "
           f"{d['torch']}, {d['cpus']} CPUs, GLIBC_TUNABLES={tunables(d)}; {shapes}; device "
           f"spec {d['device_spec']}; each real run {d['warmup']} warm-up and {d['steps']} measured steps). Meta "
           f"step: full {_mib(c['meta_full_bytes'])}, the plan's floor {_mib(c.get('meta_floor_bytes', c['meta_full_bytes']))}, "
           f"off {_mib(c['meta_off_bytes'])}.", "",
           "| target | meta plan (MiB per layer, off: unwrapped) | planned in | predicted peak (event) | real run "
           "applying it: measured peak | prediction error | over the target | real profile's own plan | same plan | "
           "recompute time, meta / real |",
           "|---:|---|---:|---:|---:|---:|---|---|---|---:|"]
    for r in c["rows"]:
        if "error" in r:
            out.append(f"| {_mib(r['target_bytes'])} | refused: {r['error'].split(': ', 1)[-1][:120]} | "
                       f"{r['plan_wall_s']:.1f} s | | | | | | | |")
            continue
        measured = (f"{_mib(r['measured_bytes'])} | {100 * r['prediction_error']:+.2f}% | "
                    f"{'YES' if r['over_target'] else 'no'}") if "measured_bytes" in r else \
            f"failed: {r.get('apply_error', '?')[:80]} | | "
        own = (f"{_layers(r['real_layers'])} | {'yes' if r['same_plan'] else 'no'} | "
               + (f"{r['recompute_time_ratio']:.4f}" if r.get("recompute_time_ratio") is not None else "n/a")) \
            if "real_layers" in r else f"failed: {str(r.get('target_error'))[:80]} | | "
        out.append(f"| {_mib(r['target_bytes'])} | {_layers(r['meta_layers'])} | {r['plan_wall_s']:.1f} s | "
                   f"{_mib(r['predicted_bytes'])} ({r['predicted_event']}) | {measured} | {own} |")
    ran = [r for r in c["rows"] if "measured_bytes" in r]
    if ran:
        worst = max(ran, key=lambda r: abs(r["prediction_error"]))
        same = sum(bool(r.get("same_plan")) for r in ran)
        out += ["", f"{sum(r['over_target'] for r in ran)} of {len(ran)} applied plans measured over their target; "
                f"the largest prediction error {100 * worst['prediction_error']:+.2f}%; {same} of {len(ran)} meta "
                "plans are the plan the real run made from its own profile."]
    return out


def meta_plan(r):
    """Meta plans applied by real CPU runs: the main job and Qwen3-30B-A3B's layer shapes."""
    out = []
    for name in ("meta_plan_main.json", "meta_plan_30b_2.json", "meta_plan_30b_4.json"):
        if os.path.exists(os.path.join(r, name)):
            out += _check(load(r, name), name) + [""]
    return out[:-1]


def _modes(plan):
    return ", ".join(f"{m} {_gib(v['peak_bytes'])} ({v['event']})" for m, v in plan.get("modes", {}).items())


def meta_plan_scale(r):
    """The planner at the target model's real size: 48 layers, 128 experts, vocabulary 151936, bfloat16."""
    d = load(r, "meta_plan_scale.json")
    s = d["scale"]
    out = [f"`bench/results/meta_plan_scale.json`: `python -m bench.budget.meta_plan --scale --layers-line` at commit {d['commit']} "
           f"(torch {d['torch']}, {d['cpus']} CPUs; device spec {d['device_spec']}; nothing runs but the meta step: "
           "wall time and peak RSS are the whole `python -m hpac plan` process, the fixed modes' steps included).", "",
           "| layout | world size | target | planned in | peak RSS | predicted peak per rank (event) | layers "
           "checkpointed | predicted recompute time | fixed modes per rank (event) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    rows = [(f"48 layers, micro-batch {b} x seq 4096", 8, "80GiB", s[f"batch_{b}"]) for b in (1, 2)
            if f"batch_{b}" in s]
    for world, targets in s.get("seed_table", {}).items():
        rows += [("the seed's: 48 layers, micro-batch 1 x seq 1024", world, t, v) for t, v in targets.items()]
    for layout, world, target, v in rows:
        p = v["plan"]
        if "error" in p:
            floor = re.search(r"below this step's floor (\S+ \S+) .*?set by (.*?): live", p["error"])
            why = f"below the floor, {floor.group(1)} ({floor.group(2)})" if floor else p["error"][-160:]
            out.append(f"| {layout} | {world} | {target.replace('GiB', '.00 GiB')} | {v['wall_s']:.0f} s | | "
                       f"refused: {why} | | | |")
            continue
        on = sum(1 for x in p["layers"] if x["checkpointed"])
        rss = _gib(v["rss_bytes"]) if v.get("rss_bytes") else "n/a"
        target = p.get("target_bytes", p.get("memory_target_bytes"))  # plans of format 1 name it memory_target_bytes
        out.append(f"| {layout} | {p['world_size']} | {_gib(target)} | {v['wall_s']:.0f} s | {rss} "
                   f"| {_gib(p['predicted_bytes'])} ({p['predicted_event']}) | {on} of {len(p['layers'])} | "
                   f"{p['recompute_micros'] / 1e3:.1f} ms | {_modes(p) or '(not asked)'} |")
    seed = s.get("seed_table")
    if seed:
        ref = load(r, "target_shapes.json")["seed"]
        out += ["", "Beside the seed's table (the reference design's 48 layers at seq 1024 in bfloat16 on accelerators; "
                "its parallel layout is not given): each mode's peak per rank as hpac's meta step holds it, by "
                "FSDP2 world size, and the ratios to off.", "",
                "| | off | full | selective | full / off | selective / off |", "|---|---:|---:|---:|---:|---:|",
                f"| the seed's table | {ref['off']['peak_gb']:.2f} G | {ref['full']['peak_gb']:.2f} G | "
                f"{ref['selective']['peak_gb']:.2f} G | {ref['full']['peak_gb'] / ref['off']['peak_gb']:.2f} | "
                f"{ref['selective']['peak_gb'] / ref['off']['peak_gb']:.2f} |"]
        for world, targets in seed.items():
            modes = next((v["plan"]["modes"] for v in targets.values() if "modes" in v["plan"]), None)
            if modes:
                off = modes["off"]["peak_bytes"]
                out.append(f"| hpac, meta, {world} ranks | {_gib(off)} | {_gib(modes['full']['peak_bytes'])} | "
                           f"{_gib(modes['selective']['peak_bytes'])} | {modes['full']['peak_bytes'] / off:.2f} | "
                           f"{modes['selective']['peak_bytes'] / off:.2f} |")
    line = d.get("layers_line")
    if line:
        sh = line["shapes"]
        out += ["", f"The meta step against real runs across layer counts (bench/scale/target_shapes.py's shapes: batch "
                f"{sh['batch']} x seq {sh['seq']}, {sh['experts']} experts, vocabulary {sh['vocab']}, {sh['dtype']}, "
                "one process; its measured peaks in `bench/results/target_shapes.json`, and at 48 layers the line it "
                "derives from them):", "",
                "| layers | mode | meta step's peak (event) | measured or derived | difference |",
                "|---:|---|---:|---:|---:|"]
        for row in line["rows"]:
            for mode, m in row["modes"].items():
                ref = m.get("measured_bytes", m.get("derived_bytes"))
                kind = "measured" if "measured_bytes" in m else "derived"
                diff = f"{100 * (m['meta_bytes'] - ref) / ref:+.2f}%" if ref else "n/a"
                out.append(f"| {row['layers']} | {mode} | {_gib(m['meta_bytes'])} ({m['meta_event']}) | "
                           f"{_gib(ref) + ' ' + kind if ref else 'n/a'} | {diff} |")
    return out
