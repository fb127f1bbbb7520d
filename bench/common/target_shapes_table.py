"""The seed's table at the target's shapes, from any JSON bench.common.target_shapes.run() returns (the one
bench.scale.target_shapes writes, or bench.scale.gpu_check's on a device): the tables bench.scale.target_shapes and
bench.scale.gpu_check print and bench/scale/target_shapes_report.py's section renders. Only the standard library.
"""
from bench.common.report import tunables


def target_shapes_regimes(d):
    """(a layer's weight-gradient bytes, the modes whose peak the kept activations set, those whose peak the gradients
    set) of a target_shapes JSON: a mode's peak above the start grows per layer by the larger of what a layer keeps and
    a layer's gradients (a third of what it holds at rest: weights and AdamW's two moments)."""
    der = d["derived"]
    grad = der["off"]["b_at_rest_bytes_per_layer"] / 3
    by_acts = [mode for mode, e in der.items() if e["b_above_start_bytes_per_layer"] > 1.05 * grad]
    return grad, by_acts, [mode for mode in der if mode not in by_acts]


def measured_on(d):
    """The device a target_shapes JSON was measured on, in words."""
    return (f"{d['device_name']}" if d["device"] != "cpu" else f"CPU ({d['device_name']}, {d['threads']} threads)")


def intro(d):
    """The paragraph over the tables: shapes, machine, what each column means."""
    m = d["model"]
    where = measured_on(d)
    return [f"transformers {d['transformers']} Qwen3MoeForCausalLM at Qwen3-30B-A3B's layer shapes (hidden "
            f"{m['hidden_size']}, {m['num_attention_heads']} / {m['num_key_value_heads']} heads of {m['head_dim']}, "
            f"top-{m['num_experts_per_tok']} of width {m['moe_intermediate_size']}) with {d['experts']} experts per "
            f"layer (the real model: 128) and vocabulary {d['vocab']} (the real: 151936); seq {d['seq']} x batch "
            f"{d['batch']}, {d['dtype']}, {d['optimizer']}; torch {d['torch']} on {where}, GLIBC_TUNABLES="
            f"{tunables(d)}, 1-minute load average {d['load_average_at_start']:.1f} at the start, "
            f"{d['load_average_at_end']:.1f} at the end, {d['wall_s'] / 60:.0f} min in all. One interleaved run per "
            f"layer count: a warm-up round, then {d['steps']} round{'s' * (d['steps'] > 1)} of every mode, the order "
            "rotated per round; step = forward + backward + AdamW; peak = the most bytes allocated during the step "
            "(weights, AdamW state, gradients, activations), above start = the same less the bytes held at the "
            "step's start (weights and AdamW state), before AdamW's step = the same over forward + backward only; "
            "kept = what the forward left for backward; time vs off = the median of per-round ratios."]


def run_table(run):
    """One layer count's measured table."""
    gib = 2 ** 30
    rows = run["rows"]
    off = rows["off"]
    out = ["", f"**{run['layers']} layer(s)** ({run['parameters'] / 1e6:.0f}M parameters)", "",
           "| mode | peak | vs off | peak above start | vs off | of it before AdamW's step | kept after forward "
           "| vs off | step time (median; min–max) | vs off (paired) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for mode, x in rows.items():
        fb = x.get("peak_above_start_before_optimizer_bytes")
        out.append(f"| {mode} | {x['peak_bytes'] / gib:.2f} GiB | {x['peak_bytes'] / off['peak_bytes']:.2f}x | "
                   f"{x['peak_above_start_bytes'] / gib:.2f} GiB | "
                   f"{x['peak_above_start_bytes'] / off['peak_above_start_bytes']:.2f}x | "
                   + (f"{fb / gib:.2f} GiB | " if fb is not None else "- | ") +
                   f"{x['kept_bytes'] / 2**20:.0f} MiB | {x['kept_bytes'] / off['kept_bytes']:.2f}x | "
                   f"{x['s_median']:.2f} s; {min(x['s_all']):.2f}–{max(x['s_all']):.2f} | "
                   f"{x['time_vs_off_paired']:.2f}x |")
    return out


def derived_table(d):
    """The peak derived per mode at the target's layer count, beside the seed's."""
    gib = 2 ** 30
    der, n = d["derived"], d["target_layers"]
    counts = ", ".join(str(r["layers"]) for r in d["runs"])
    last = d["runs"][-1]
    out = ["", f"**{n} layers, derived** from the {counts}-layer runs: peak(L) = a + b·L per mode (least squares); "
           "b = at rest (weights + AdamW state per layer: the slope of the step's starting bytes) + above the start "
           "(the slope of the peak above the start: what a layer adds at the peak); the check leaves the largest "
           "layer count out, fits the others and predicts it. Step time is not extrapolated (this machine's times "
           f"swing too much for a slope): its column is the paired ratio to off at {last['layers']} layers. The "
           f"seed's columns: the reference design's Qwen3-30B-A3B at seq 1024, {n} layers, bf16 on accelerators "
           "with a parallel layout.", "",
           f"| mode | a | b per layer (at rest + above the start) | kept per layer | derived peak | vs off | check: "
           f"predicted / measured | error | step time vs off ({last['layers']} layers, paired) | the seed's peak / "
           "step | peak vs off | time vs off |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    doff, soff = der["off"], d["seed"]["off"]
    for mode, e in der.items():
        loo = e.get("loo")
        check = (f"{loo['predicted_bytes'] / gib:.3f} / {loo['measured_bytes'] / gib:.3f} GiB ({loo['layers']} "
                 f"layers) | {100 * loo['error_rel']:+.2f} %") if loo else "- | -"
        seed = d["seed"].get(mode)
        seed_col = (f"{seed['peak_gb']:.2f} G / {seed['step_s']:.2f} s | {seed['peak_gb'] / soff['peak_gb']:.2f}x | "
                    f"{seed['step_s'] / soff['step_s']:.2f}x" if seed else "- | - | -")
        out.append(f"| {mode} | {e['a_bytes'] / gib:.2f} GiB | {e['b_bytes_per_layer'] / gib:.3f} GiB "
                   f"({e['b_at_rest_bytes_per_layer'] / gib:.3f} + {e['b_above_start_bytes_per_layer'] / gib:.3f}) | "
                   f"{e['b_kept_bytes_per_layer'] / 2**20:.0f} MiB | {e['peak_bytes_derived'] / gib:.1f} GiB | "
                   f"{e['peak_bytes_derived'] / doff['peak_bytes_derived']:.2f}x | {check} | "
                   f"{last['rows'][mode]['time_vs_off_paired']:.2f}x | {seed_col} |")
    return out


def differences(d):
    """What differs from the seed's run, and what the derived column means."""
    gib = 2 ** 30
    m = d["model"]
    where = measured_on(d)
    der = d["derived"]
    last = d["runs"][-1]
    errs = [abs(e["loo"]["error_rel"]) for e in der.values() if "loo" in e]
    rest = der["off"]["b_at_rest_bytes_per_layer"]
    grad, by_acts, by_grads = target_shapes_regimes(d)
    batch = d.get("batch", 1)
    kept = {mode: e["b_kept_bytes_per_layer"] for mode, e in der.items()}
    above = {mode: e["b_above_start_bytes_per_layer"] for mode, e in der.items()}
    width = 4 if d["dtype"] == "float32" else 2
    grads_128 = grad + (128 - d["experts"]) * 3 * m["hidden_size"] * m["moe_intermediate_size"] * width
    mib = lambda v: f"{v / 2**20:.0f} MiB"  # noqa: E731
    peaks = last["rows"]
    out = ["", "What differs from the seed's run, and what the derived column means:",
           f"- **Where the peak falls**: a layer's weight gradients take {grad / gib:.3f} GiB (a third of its at-rest "
           f"term: weights and AdamW's two moments); what a layer keeps for backward, at {batch} x {d['seq']} "
           "tokens: " + ", ".join(f"{mode} {mib(v)}" for mode, v in kept.items()) + ". Above the start a step's "
           "peak grows per layer by the larger of the two: every layer's kept bytes as backward starts, or every "
           "layer's gradients as it ends. "
           + (f"Activations set it under {', '.join(by_acts)} (per layer above the start: "
              + ", ".join(f"{above[mode] / gib:.3f}" for mode in by_acts) + " GiB)" if by_acts else
              "Activations set it under no mode")
           + (f"; gradients under {', '.join(by_grads)} (" + ", ".join(f"{above[mode] / gib:.3f}" for mode in by_grads)
              + " GiB)." if by_grads else ".")
           + (f" At {last['layers']} layers, above full's {peaks['full']['peak_bytes'] / gib:.2f} GiB: "
              + ", ".join(f"{mode} {(x['peak_bytes'] - peaks['full']['peak_bytes']) / gib:+.2f} GiB"
                          for mode, x in peaks.items() if mode != "full") + "." if "full" in peaks else "")]
    if batch > 1:
        below = [mode for mode in der if kept[mode] / batch < grad]
        out.append(f"- **Batch**: {batch} sequences of {d['seq']} per step (the seed's table names no batch): "
                   "activations grow with the tokens, gradients do not. Per sequence a layer keeps "
                   + ", ".join(f"{mode} {mib(v / batch)}" for mode, v in kept.items())
                   + (f"; at batch 1 {', '.join(below)} keep less per layer than a layer's gradients take, so their "
                      "peaks fall at the end of backward, full's regime." if below else "."))
    out += [f"- **Model**: {d['experts']} experts per layer instead of 128, vocabulary {d['vocab']} instead of "
            f"151936. At rest a layer holds {rest / gib:.3f} GiB here (weights and AdamW's two moments, {d['dtype']}): "
            "it grows with the expert count, what a layer keeps does not. At 128 experts a layer's gradients would "
            f"take about {grads_128 / gib:.2f} GiB here, "
            + ("more than any mode keeps per layer at this batch, so in one process no mode would move the peak."
               if grads_128 > max(kept.values()) else
               "less than " + ", ".join(mode for mode in der if kept[mode] > grads_128) + " keep per layer at this "
               "batch, so those would still set their peaks, the others would share one."),
            f"- **Parallel layout**: one process holds the whole model and every byte of its state; the seed's run "
            "split it over accelerators, sharding weights, gradients and AdamW state (not the activations of each "
            "device's tokens), which is how activations come to set its per-device peak.",
            f"- **Device and dtype**: {d['dtype']} on {where} against bf16 on accelerators: every byte here is twice a "
            "bf16 byte when float32, and the step times are this shared machine's (its load moved them by up to a "
            "factor of several between rounds), not comparable to the seed's seconds; only ratios to off are, and "
            "those loosely.",
            f"- **The fit**: a line per mode; the leave-largest-out check is off by at most {100 * max(errs):.2f} % "
            "over the modes" + (": the per-layer terms are constant from the first layer on." if max(errs) < 0.005
                                else ".") if errs else
            "- **The fit**: fewer than three layer counts, no check."]
    return out


def target_shapes_table(d):
    """The seed's table at the target's shapes (bench/scale/target_shapes.py): one table per layer count, then the
    48-layer peak derived per mode beside the seed's numbers, and what differs. `d` is the benchmark's JSON."""
    out = intro(d)
    for run in d["runs"]:
        out += run_table(run)
    return out + derived_table(d) + differences(d)
