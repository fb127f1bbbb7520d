"""hpac eager and compiled, beside torch.compile's own memory budget, measured in one process.

Models (the transformers Qwen3MoeForCausalLM that hpac.hf prepares; experts 'grouped_mm', transformers' default,
which compiles without a graph break):
  qwen3_moe        the main job's model and batch (examples/training_demo/train.yaml)
  qwen3_moe_wide   the same family at a kernel-bound shape: hidden 512, 8 heads of 64 (2 KV heads), 8 experts top-2
                   of width 512, 2 layers, seq 512 x batch 2 (matmuls, not Python, set the step time)
Methods, each on its own copy of the model (same seed), through hpac.hf.prepare:
  eager:off|full|selective|budget:0.5   no compile (the budget: one hpac.budget(0.5) region per layer)
  compiled:off|full|selective           train.compile: true: the reference rules, then each layer compiled
                                        (module.compile(), inductor); under compile hpac's C++ policy tags the graph
  torch_budget:<f>                      mode off, each layer compiled with
                                        torch._functorch.config.activation_memory_budget = f (torch's own planner)
One step is forward + backward (no optimizer). The eager methods run interleaved, the order rotated every step,
after one warm-up step (the budget's profile). Each compiled method is compiled on its own (torch._dynamo.reset()
first; compile time = its first step, reported separately), then its steps alternate with steps of a fresh eager off
model, so every compiled row has an eager-off reference from the same minutes. Peak = tensor bytes above the step's
start (hpac's tracking CPU allocator, every method alike); ratios are to eager off (time: to the off steps measured
alongside). The largest |dgrad| of each method against eager off of the same step is recorded (NaN is never equal).

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 \\
    .venv/bin/python -m bench.peers.compile_compare [--models qwen3_moe,qwen3_moe_wide] [--steps 4]
"""
import argparse
import os
import statistics
import sys
import time
import warnings

import torch

import hpac
import hpac.harness.compare as hc
from hpac.harness.parity import compare

from bench.common import CONFIG, RESULTS, environment, torch_at_least, write_json
from bench.common.timing import measure

MODELS = ("qwen3_moe", "qwen3_moe_wide")
EAGER = ("off", "full", "selective", "budget:0.5")
COMPILED = ("off", "full", "selective")
TORCH_BUDGETS = (0.1, 0.5, 1.0)
DEFAULT_OUT = os.path.join(RESULTS, "compile_compare.json")
WIDE = dict(num_layers=2, hidden_size=512, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
            moe_intermediate_size=512, num_experts=8, num_experts_per_tok=2, seq_len=512, micro_batch=2)


def family(name, config_path):
    import transformers
    transformers.logging.set_verbosity_error()
    import hpac.hf as hf
    import hpac.harness.compare as hc
    import hpac.harness.models as hm
    config = hf.load_config(config_path)
    spec, train = config["model"], config["train"]
    if name == "qwen3_moe_wide":
        for k, v in WIDE.items():
            (train if k in ("seq_len", "micro_batch") else spec)[k] = v
    shape = (f"transformers Qwen3MoeForCausalLM, {spec['num_layers']} layers, hidden {spec['hidden_size']}, "
             f"{spec['num_attention_heads']} heads of {spec['head_dim']}, {spec['num_experts']} experts top-"
             f"{spec['num_experts_per_tok']} of width {spec['moe_intermediate_size']}, seq {train['seq_len']} x "
             f"batch {train['micro_batch']}, fp32")
    registry = hf.load_registry()
    ids = {}

    def batch(step):
        if step not in ids:
            ids[step] = hm.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"],
                                       step)
        return ids[step]

    def build(mode, compiled):
        model = hm.qwen3_moe_model(spec, train["seed"])
        model.config.use_cache = False  # as the checkpointed modes set it: the same model in every method
        cfg = hc.mode_config(config, mode)
        cfg["train"]["compile"] = compiled
        hf.prepare(model, cfg, registry, log=None)
        return model

    loss = lambda model, x: model(input_ids=x, labels=x).loss  # noqa: E731
    return shape, build, batch, loss


def eager_rows(build, batch, loss, steps, log):
    runs = {m: {"model": build(m, False), "times": [], "peaks": [], "dgrad": 0.0} for m in EAGER}
    for step in range(steps + 1):
        order = hc.rotated(EAGER, step)
        grads = {}
        for m in order:
            seconds, peak, grads[m] = measure(runs[m]["model"], loss, batch(step))
            if step > 0:
                runs[m]["times"].append(seconds)
                runs[m]["peaks"].append(peak)
        for m in EAGER:
            runs[m]["dgrad"] = max(runs[m]["dgrad"], compare(grads[m], grads["off"])[0])
        log(f"eager step {step}/{steps}: " + " ".join(f"{m} {1e3 * seconds:.0f}ms" for m in EAGER
                                                      for seconds in runs[m]["times"][-1:]))
    return [{"method": f"eager:{m}", "ms_median": 1e3 * statistics.median(r["times"]),
             "ms_all": [1e3 * t for t in r["times"]], "peak_bytes": max(r["peaks"]), "max_dgrad_vs_off": r["dgrad"]}
            for m, r in runs.items()]


def compiled_row(method, make, build, batch, loss, steps, log):
    """One compiled method: compile (timed), then its steps alternated with a fresh eager off model's."""
    torch._dynamo.reset()
    model, off = make(), build("off", False)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measure(model, loss, batch(0))
    compile_s = time.perf_counter() - t0
    measure(off, loss, batch(0))
    times, peaks, off_times, off_peaks, dgrad = [], [], [], [], 0.0
    for step in range(1, steps + 1):
        pair = [("compiled", model), ("off", off)]
        grads = {}
        for name, m in (pair if step % 2 else pair[::-1]):
            seconds, peak, grads[name] = measure(m, loss, batch(step))
            (times if name == "compiled" else off_times).append(seconds)
            (peaks if name == "compiled" else off_peaks).append(peak)
        dgrad = max(dgrad, compare(grads["compiled"], grads["off"])[0])
    row = {"method": method, "ms_median": 1e3 * statistics.median(times), "ms_all": [1e3 * t for t in times],
           "peak_bytes": max(peaks), "off_ms_median_alongside": 1e3 * statistics.median(off_times),
           "off_peak_alongside": max(off_peaks), "compile_s": compile_s, "max_dgrad_vs_off": dgrad}
    log(f"{method}: compiled in {compile_s:.0f}s, {row['ms_median']:.0f}ms vs eager off "
        f"{row['off_ms_median_alongside']:.0f}ms, peak {row['peak_bytes'] / 2**20:.1f}MiB, |dgrad| {dgrad:.2g}")
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--steps", type=int, default=4, help="measured steps per method (after the warm-up / compile)")
    ap.add_argument("--torch-budgets", default=",".join(str(f) for f in TORCH_BUDGETS),
                    help="torch.compile activation_memory_budget values")
    ap.add_argument("--out", default=DEFAULT_OUT)
    a = ap.parse_args()
    names = a.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"--models {','.join(unknown)} is not allowed; allowed: {', '.join(MODELS)}")
    if a.steps < 1:
        ap.error(f"--steps {a.steps} is not allowed; allowed: a positive integer")
    if not torch_at_least(2, 4):
        sys.exit(f"bench/peers/compile_compare.py needs torch >= 2.4 (this is {torch.__version__})")
    import torch._functorch.config as functorch_config
    budgets = [float(f) for f in a.torch_budgets.split(",")]
    hpac.track_memory()
    started = time.perf_counter()
    data = {**environment("compile_compare"), "steps": a.steps, "backend": "inductor", "models": {}}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)

    def save():  # after every row: a run stopped early leaves what it measured
        data["wall_s"] = time.perf_counter() - started
        data["load_average_at_end"] = os.getloadavg()[0]
        write_json(a.out, data)

    for name in names:
        log = lambda msg: print(f"[compile_compare {time.perf_counter() - started:.0f}s] {name} {msg}",  # noqa: E731
                                flush=True)
        shape, build, batch, loss = family(name, a.config)
        entry = data["models"][name] = {"shape": shape, "rows": eager_rows(build, batch, loss, a.steps, log)}
        save()
        for mode in COMPILED:
            entry["rows"].append(compiled_row(f"compiled:{mode}", lambda: build(mode, True), build, batch, loss,
                                              a.steps, log))
            save()
        previous = functorch_config.activation_memory_budget
        try:
            for f in budgets:
                functorch_config.activation_memory_budget = f
                entry["rows"].append(compiled_row(f"torch_budget:{f}", lambda: build("off", True), build, batch,
                                                  loss, a.steps, log))
                save()
        finally:
            functorch_config.activation_memory_budget = previous
            torch._dynamo.reset()
    print(f"[compile_compare] wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
