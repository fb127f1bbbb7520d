"""docs/results.md "Fit a step into N bytes" (section memory_target), from bench/results/memory_target.json
(bench/memory_target.py)."""
from report_common import load


def _mib(b):
    return f"{b / 2**20:.2f} MiB"


def _plan(layers):
    return " ".join(f"{l['kept_bytes'] / 2**20:.2f}" if l["checkpointed"] else "off" for l in layers)


def memory_target(r):
    """The target sweep on the main job: per target the plan, predicted and measured peak, slack, step time beside
    the fastest fixed mode that fits."""
    d = load(r, "memory_target.json")
    load_avg = f", 1-minute load average {d['load_average_at_end']:.1f} at the end" if "load_average_at_end" in d else ""
    fixed = d["fixed"]
    out = [f"Measured by `bench/memory_target.py` (torch {d['torch']}, {d['threads']} thread on {d['cpus']} CPUs"
           f"{load_avg}, GLIBC_TUNABLES={d['glibc_tunables'] or '(unset)'}; `{d['config']}`, AdamW; "
           f"{d['warmup']} warm-up and {d['steps']} measured steps per run, one run after another in one process; "
           "peak: the process's live CPU tensor bytes over forward, backward and optimizer step; time: median thread "
           "CPU time of the same).", "",
           "Fixed modes: " + ", ".join(f"{m} {_mib(f['peak_bytes'])} / {f['median_thread_s'] * 1e3:.0f} ms"
                                      for m, f in fixed.items()) + ".", "",
           "| target | plan (MiB kept per layer, off: unwrapped) | predicted peak (event) | measured peak (event) | "
           "slack | prediction error | step time | fastest fixed mode that fits | its time | ratio | loss = off |",
           "|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for s in d["sweep"]:
        best = s["fastest_fixed"]
        ratio = f"{s['median_thread_s'] / s['fastest_fixed_thread_s']:.2f}×" if best else "n/a"
        out.append(f"| {_mib(s['target_bytes'])} | {_plan(s['layers'])} | {_mib(s['predicted_bytes'])} "
                   f"({s['predicted_event']}) | {_mib(s['measured_bytes'])} ({s['measured_event']}) | "
                   f"{100 * s['slack']:.1f}% | {100 * s['prediction_error']:+.2f}% | "
                   f"{s['median_thread_s'] * 1e3:.0f} ms | {best or 'none'} | "
                   f"{s['fastest_fixed_thread_s'] * 1e3 if best else 0:.0f} ms | {ratio} | "
                   f"{'yes' if s['losses_equal_off'] else 'NO'} |")
    over = sum(s["measured_bytes"] > s["target_bytes"] for s in d["sweep"])
    worst = max(abs(s["prediction_error"]) for s in d["sweep"])
    out += ["", f"{over} of {len(d['sweep'])} targets measured over the target; slack "
            f"{100 * min(s['slack'] for s in d['sweep']):.1f}–{100 * max(s['slack'] for s in d['sweep']):.1f}%; "
            f"largest prediction error {100 * worst:.2f}% of the measured peak."]
    return out
