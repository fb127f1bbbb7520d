"""The seed's table at the target's shapes (bench/scale/target_shapes.py): section target_shapes (docs/results.md)
and target_shapes_summary (README's results paragraph), from bench/results/target_shapes.json. The table itself is
bench.common.target_shapes_table's (bench/scale/target_shapes.py and bench/scale/gpu_check.py print it too)."""
from bench.common.report import load
from bench.common.target_shapes_table import target_shapes_regimes, target_shapes_table


def target_shapes(r):
    """docs/results.md "The seed's table at the target's shapes" (bench/scale/target_shapes.py)."""
    return target_shapes_table(load(r, "target_shapes.json"))


def target_shapes_summary(r):
    """README's results paragraph: the 48-layer peaks derived by bench/scale/target_shapes.py beside the seed's."""
    d = load(r, "target_shapes.json")
    der, seed, n = d["derived"], d["seed"], d["target_layers"]
    off = der["off"]["peak_bytes_derived"]
    errs = [abs(e["loo"]["error_rel"]) for e in der.values() if "loo" in e]
    ours = ", ".join(f"{mode} {e['peak_bytes_derived'] / 2**30:.1f} GiB"
                     + ("" if mode == "off" else f" ({e['peak_bytes_derived'] / off:.2f}×)")
                     for mode, e in der.items())
    theirs = ", ".join(f"{mode} {v['peak_gb']:.2f} G" + ("" if mode == "off" else
                                                        f" ({v['peak_gb'] / seed['off']['peak_gb']:.2f}×)")
                       for mode, v in seed.items())
    counts = "/".join(str(x["layers"]) for x in d["runs"])
    check = (f"; the line fitted without the largest layer count predicts it within {100 * max(errs):.1f} %"
             if errs else "")
    _, by_acts, by_grads = target_shapes_regimes(d)
    regimes = (f"activations set the peak of {', '.join(by_acts) or 'no mode'}, a layer's weight gradients that of "
               f"{', '.join(by_grads) or 'no mode'}")
    return [f"At Qwen3-30B-A3B's layer shapes with {d['experts']} experts per layer and vocabulary {d['vocab']}, "
            f"{d['dtype']} on {d['device']}, AdamW, seq {d['seq']} x batch {d.get('batch', 1)} "
            f"(`bench/scale/target_shapes.py`, measured on {counts} layers{check}; {regimes}), the {n}-layer peak derived "
            f"per mode: {ours}; the seed's {n} layers in bf16 on accelerators with a parallel layout: {theirs}. "
            "docs/results.md, \"The seed's table at the target's shapes\", says what differs."]
