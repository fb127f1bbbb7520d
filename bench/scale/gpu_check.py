"""The accelerator check's driver (tools/gpu_check.sh runs it after building hpac): five sections on one device, each
recorded in OUT/gpu_check.json whether it passed or raised.

  core          hpac on the device's tensors: a stack of Qwen3-MoE-style blocks (test/python/moe_block.py: eager
                attention with dropout, top-k router renormalised in place, index_add_ experts) checkpointed by
                hpac.checkpoint under full, selective and a budget, gradients and loss bit for bit against no
                checkpoint from the same RNG seed (the recompute replays the device's RNG: dropout masks); the same
                on a non-default CUDA stream; peak and kept bytes per mode (torch.cuda.max_memory_allocated on
                CUDA, hpac's tracking allocator on CPU); a policy_fn through hpac.create_selective_checkpoint_contexts
                under torch.utils.checkpoint, bit for bit. Deterministic algorithms on (index_add_ on CUDA is
                atomic otherwise; CUBLAS_WORKSPACE_CONFIG set by the script).
  target_shapes bench/scale/target_shapes.py's table (Qwen3-30B-A3B's layer shapes, fewer experts) on the device in the
                check's dtype, at seq 1024 on a few layers, with the 48-layer derivation; its JSON and its markdown
                table beside gpu_check.json.
  sac_peer      PyTorch's SAC and hpac with the same policy_fn on the target-shaped model's decoder layers
                (torch.utils.checkpoint with torch's create_selective_checkpoint_contexts or hpac's): kept bytes,
                peak, step time (interleaved), gradients against off and against each other.
  planner       hpac.budget(f, cost="measured") (device-timed profile) and cost="estimated" (flops and bytes on the
                device's roofline) on the same model: each plan's kept bytes and ops, the profile's measured against
                estimated microseconds, peak and step time.
  memory_target hpac.fit_memory_target on the same model's decoder layers (AdamW, absolute step peaks of the CUDA
                caching allocator, and its reserved bytes beside them): off's and full's measured step peaks, then
                targets between them: predicted and measured peak, slack, the plan; every step under its target,
                the first (profile) step included, loss bit for bit with off.

    python -m bench.scale.gpu_check --out gpu-check [--device cuda] [--dtype bfloat16]
    python -m bench.scale.gpu_check --dry-run --out /tmp/x     # device cpu, tiny shapes: every section end to end
    python -m bench.scale.gpu_check --verify /tmp/x/gpu_check.json   # exit 1 unless every section is there and passed
"""
import argparse
import functools
import gc
import importlib
import json
import os
import statistics
import sys
import time
import traceback
import types

import torch

import hpac
from hpac.harness.stats import Memory

from bench.common import environment, write_json
import bench.common.target_shapes as ts
from bench.common.target_shapes_table import target_shapes_table

SECTIONS = ("core", "target_shapes", "sac_peer", "planner", "memory_target")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def grads_of(model):
    return [p.grad.detach().clone() if p.grad is not None else None for p in model.parameters()]


def bitwise(a, b):
    return all((x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
               for x, y in zip(a, b)) and len(a) == len(b)


def max_diff(a, b):
    worst = 0.0
    for x, y in zip(a, b):
        if x is None or y is None:
            return float("inf") if (x is None) != (y is None) else worst
        d = (x.double() - y.double()).abs().max().item() if x.numel() else 0.0
        worst = max(worst, d if d == d else float("inf"))
    return worst


def save_matmuls_policy(ctx, op, *args, **kwargs):
    """The policy_fn of the check: keep matmuls and attention, recompute the rest (torch's documented example)."""
    from torch.utils.checkpoint import CheckpointPolicy
    keep = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default}
    for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"):
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            keep.add(packet.default)
    return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE


# ---- core ------------------------------------------------------------------------------------------------------------
def core(a, log):
    from hpac.harness.blocks import Block
    device, memory = a.device, Memory(a.device)
    dims = dict(hidden=64, heads=4, experts=4, inter=32, seq=32) if a.dry_run else \
        dict(hidden=1024, heads=8, experts=8, inter=512, seq=1024)
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(Block(dims["hidden"], dims["heads"], dims["experts"], dims["inter"], top_k=2,
                                       dropout=0.1) for _ in range(4)).to(device)
    x0 = torch.randn(2, dims["seq"], dims["hidden"], device=device)
    budgets = [hpac.budget(0.5) for _ in blocks]
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)

    def run(mode, stream=None):
        """(loss, grads, peak above start, kept after forward, seconds) of one forward + backward from seed 7."""
        import contextlib
        blocks.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        sync(device)
        default = torch.cuda.current_stream(device) if stream is not None else None
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with ctx:
            if stream is not None:
                stream.wait_stream(default)  # x0 and the weights were made on the default stream
            torch.manual_seed(7)
            start = memory.current()
            memory.reset_peak()
            t0 = time.perf_counter()
            h = x
            for i, block in enumerate(blocks):
                if mode == "off":
                    h = block(h)
                elif mode == "policy_fn":
                    cf = functools.partial(hpac.create_selective_checkpoint_contexts, save_matmuls_policy)
                    h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False, context_fn=cf)
                else:
                    h = hpac.checkpoint(block, h, policy=budgets[i] if mode == "budget" else mode)
            loss = h.float().square().mean()
            kept = memory.current() - start
            loss.backward()
            sync(device)
            seconds = time.perf_counter() - t0
        if stream is not None:
            default.wait_stream(stream)
        return loss.detach(), grads_of(blocks) + [x.grad.clone()], memory.peak() - start, kept, seconds

    result = {"dims": dims, "modes": {}, "stream": None}
    try:
        ref_loss, ref_grads, *_ = run("off")
        for mode in ("off", "full", "selective", "budget", "policy_fn"):
            calls = []
            for call in range(2):  # the budget profiles on its first call and plans on its second
                loss, grads, peak, kept, seconds = run(mode)
                calls.append({"bitwise_loss": bool(torch.equal(loss, ref_loss)),
                              "bitwise_grads": bitwise(grads, ref_grads), "max_dgrad": max_diff(grads, ref_grads),
                              "peak_bytes": peak, "kept_bytes": kept, "seconds": seconds})
            result["modes"][mode] = calls
            log(f"core {mode}: bitwise {[c['bitwise_grads'] for c in calls]}, peak "
                f"{calls[-1]['peak_bytes'] / 2**20:.1f} MiB, kept {calls[-1]['kept_bytes'] / 2**20:.1f} MiB")
        result["budget_plans"] = [b.status() for b in budgets]
        if torch.device(device).type == "cuda":
            stream = torch.cuda.Stream(device)
            rows = {}
            for mode in ("full", "selective", "budget", "policy_fn"):
                loss, grads, peak, kept, seconds = run(mode, stream)
                rows[mode] = {"bitwise_loss": bool(torch.equal(loss, ref_loss)),
                              "bitwise_grads": bitwise(grads, ref_grads), "max_dgrad": max_diff(grads, ref_grads)}
            result["stream"] = rows
            log(f"core on a side stream: bitwise {[r['bitwise_grads'] for r in rows.values()]}")
        else:
            result["stream"] = "not run: device cpu (no CUDA streams)"
    finally:
        torch.use_deterministic_algorithms(deterministic)
    check_core(result)
    return result


def check_core(result):
    """Raises unless every mode's every call, on the default stream and on a side one, is bit for bit with no
    checkpoint, and every checkpointed mode keeps less than off; records peak_ordering_ok in result."""
    failures = [f"{m} call {i}" for m, calls in result["modes"].items() for i, c in enumerate(calls)
                if not (c["bitwise_grads"] and c["bitwise_loss"])]
    if isinstance(result["stream"], dict):
        failures += [f"{m} on a side stream" for m, r in result["stream"].items()
                     if not (r["bitwise_grads"] and r["bitwise_loss"])]
    result["peak_ordering_ok"] = all(result["modes"][m][-1]["kept_bytes"] < result["modes"]["off"][-1]["kept_bytes"]
                                     for m in ("full", "selective", "budget", "policy_fn"))
    if failures:
        raise AssertionError("not bit for bit with no checkpoint: " + ", ".join(failures))
    if not result["peak_ordering_ok"]:
        raise AssertionError("a checkpointed mode kept no less than off: "
                             + json.dumps({m: c[-1]["kept_bytes"] for m, c in result["modes"].items()}))


# ---- target_shapes ---------------------------------------------------------------------------------------------------
def target_options(a, **over):
    o = types.SimpleNamespace(layers=a.layers, steps=a.steps, seq=1024, experts=8, vocab=4096, dtype=a.dtype,
                              device=a.device, modes=list(ts.MODES), compile_backend="inductor", target_layers=48,
                              dry_run=a.dry_run, tiny=a.dry_run, out=None)
    if a.dry_run:
        o.seq, o.steps, o.experts, o.vocab, o.compile_backend, o.layers = 32, 1, 4, 128, "aot_eager", "1,2"
    for k, v in over.items():
        setattr(o, k, v)
    return o


def target_shapes(a, log):
    o = target_options(a)
    o.out = os.path.join(a.out, "target_shapes.json")
    data = ts.run(o, [int(x) for x in o.layers.split(",")], log=log)
    write_json(o.out, data)
    table = target_shapes_table(data)
    with open(os.path.join(a.out, "target_shapes.md"), "w") as f:
        f.write("\n".join(table) + "\n")
    return {"json": "target_shapes.json", "table": "target_shapes.md", "derived": data["derived"],
            "wall_s": data["wall_s"]}


# ---- shared by sac_peer and planner: the target-shaped model, a few decoder layers --------------------------------
def target_model(a, layers):
    o = target_options(a)
    spec = ts.model_spec(layers, o.experts, o.vocab, tiny=o.tiny)
    model = ts.build(spec, o.seq, DTYPES[a.dtype], a.device)
    ids = __import__("hpac.harness.models", fromlist=["token_batch"]).token_batch(spec["vocab_size"], 1, o.seq, 1234,
                                                                               0).to(a.device)
    return model, ids


def fwd_bwd(model, ids, memory):
    """(seconds, peak above start, kept after forward, grads) of one forward + backward."""
    model.zero_grad(set_to_none=True)
    gc.collect()
    memory.sync()
    start = memory.current()
    memory.reset_peak()
    t0 = time.perf_counter()
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    kept = memory.current() - start
    loss.backward()
    memory.sync()
    return time.perf_counter() - t0, memory.peak() - start, kept, grads_of(model)


def interleaved(model, ids, memory, apply, methods, steps, log, label):
    """Every method once per round (rotated), after a warm-up round: {method: {ms, peak, kept, grads of the last}}."""
    import hpac.harness.compare as hc
    rec = {m: {"s": [], "peak": [], "kept": []} for m in methods}
    grads = {}
    for r in range(steps + 1):
        for m in hc.rotated(methods, r):
            apply(m)
            s, peak, kept, grads[m] = fwd_bwd(model, ids, memory)
            if r:
                rec[m]["s"].append(s), rec[m]["peak"].append(peak), rec[m]["kept"].append(kept)
        log(f"{label} round {r}/{steps}")
    apply(None)
    return {m: {"ms_median": 1e3 * statistics.median(x["s"]), "ms_all": [1e3 * t for t in x["s"]],
                "peak_bytes": max(x["peak"]), "kept_bytes": max(x["kept"])} for m, x in rec.items()}, grads


def sac_peer(a, log):
    import hpac.hf as hf
    from torch.utils.checkpoint import create_selective_checkpoint_contexts as torch_contexts
    memory = Memory(a.device)
    model, ids = target_model(a, 2)
    contexts = {"torch_sac": torch_contexts, "hpac": hpac.create_selective_checkpoint_contexts}

    def apply(method):
        for layer in model.model.layers:
            hpac.unwrap_checkpoint(layer)
            if method in contexts:
                hf.wrap_torch_checkpoint(layer, functools.partial(contexts[method], save_matmuls_policy))

    rows, grads = interleaved(model, ids, memory, apply, ["off", "torch_sac", "hpac"], a.sac_steps, log, "sac_peer")
    for m, row in rows.items():
        row["max_dgrad_vs_off"] = max_diff(grads[m], grads["off"])
        row["bitwise_vs_off"] = bitwise(grads[m], grads["off"])
    rows["hpac"]["bitwise_vs_torch_sac"] = bitwise(grads["hpac"], grads["torch_sac"])
    rows["hpac"]["max_dgrad_vs_torch_sac"] = max_diff(grads["hpac"], grads["torch_sac"])
    result = {"layers": 2, "policy_fn": "MUST_SAVE mm / bmm / addmm / SDPA kernels, PREFER_RECOMPUTE the rest",
              "rows": rows, "hpac_over_torch_sac_time": rows["hpac"]["ms_median"] / rows["torch_sac"]["ms_median"],
              "kept_bytes_equal": rows["hpac"]["kept_bytes"] == rows["torch_sac"]["kept_bytes"]}
    log(f"sac_peer: hpac/torch SAC time {result['hpac_over_torch_sac_time']:.3f}, kept "
        f"{rows['hpac']['kept_bytes'] / 2**20:.1f} / {rows['torch_sac']['kept_bytes'] / 2**20:.1f} MiB, grads hpac vs "
        f"torch SAC max {rows['hpac']['max_dgrad_vs_torch_sac']:.3g}")
    if not rows["hpac"]["kept_bytes"] < rows["off"]["kept_bytes"]:
        raise AssertionError(f"hpac's policy_fn kept no less than off: {rows['hpac']['kept_bytes']} vs "
                             f"{rows['off']['kept_bytes']}")
    return result


def planner(a, log):
    memory = Memory(a.device)
    model, ids = target_model(a, 2)
    fractions = (0.25, 0.5)
    budgets = {f"{cost}:{f}": [hpac.budget(f, cost=cost) for _ in model.model.layers]
               for cost in ("measured", "estimated") for f in fractions}

    def apply(method):
        for i, layer in enumerate(model.model.layers):
            hpac.unwrap_checkpoint(layer)
            if method in budgets:
                hpac.checkpoint_wrapper(layer, policy=budgets[method][i])

    rows, grads = interleaved(model, ids, memory, apply, ["off"] + list(budgets), a.sac_steps, log, "planner")
    for m, row in rows.items():
        row["max_dgrad_vs_off"] = max_diff(grads[m], grads["off"])
        if m in budgets:
            row["plans"] = [b.status() for b in budgets[m]]
            prof = budgets[m][0].profile()
            measured = sum(p["micros"] for p in prof) if m.startswith("measured") else None
            row["profile"] = {"ops": len(prof), "micros_sum": sum(p["micros"] for p in prof),
                              "estimated_micros_sum": sum(p["estimated_micros"] for p in prof),
                              "measured_micros_sum": measured}
    result = {"layers": 2, "roofline": hpac.roofline(a.device), "rows": rows}
    log("planner: " + ", ".join(f"{m} kept {r['kept_bytes'] / 2**20:.1f} MiB {r['ms_median']:.0f} ms"
                                for m, r in rows.items()))
    stuck = [m for m in budgets if any(p["stage"] != "planned" for p in rows[m]["plans"])]
    if stuck:
        raise AssertionError(f"budgets that did not plan: {stuck}")
    return result


def _target_steps(a, mode, target=None, steps=4):
    """Step peaks (absolute, the step's own device) of one fresh target-shaped model under `mode`, with its losses
    and, for a target, the MemoryTarget's report."""
    memory = Memory(a.device)  # on CPU: hpac's tracker before the model is built (the target counts absolute bytes)
    model, ids = target_model(a, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fitted = None
    if mode == "full":
        for layer in model.model.layers:
            hpac.checkpoint_wrapper(layer, "full")
    elif mode == "target":
        fitted = hpac.fit_memory_target(model, model.model.layers, target, optimizer=opt)
    peaks, reserved, losses = [], [], []
    for _ in range(steps):
        gc.collect()
        memory.sync()
        memory.reset_peak()
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        memory.sync()
        peaks.append(memory.peak())
        # What an out-of-memory error on the device answers to: the caching allocator's reserved bytes (CUDA).
        reserved.append(torch.cuda.max_memory_reserved() if memory.cuda else None)
        losses.append(loss.item())
    report = fitted.report() if fitted else None
    del model, opt, fitted
    gc.collect()
    return peaks, losses, report, reserved


def memory_target(a, log):
    off, off_losses, _, _ = _target_steps(a, "off")
    full, _, _, _ = _target_steps(a, "full")
    lo, hi = max(full), max(off)
    rows = []
    for share in (0.25, 0.5, 0.75):
        target = int(lo + share * (hi - lo))
        peaks, losses, report, reserved = _target_steps(a, "target", target)
        rows.append({"target_bytes": target, "step_peaks": peaks, "step_reserved": reserved,
                     "history": report["history"], "layers": report["layers"], "losses_equal_off": losses == off_losses,
                     "steps_over_target": sum(p > target for p in peaks)})
        log(f"memory_target {target / 2**20:.1f} MiB: measured {[p / 2**20 for p in peaks]} MiB" +
            (f", reserved {[r / 2**20 for r in reserved]} MiB" if reserved[0] is not None else ""))
        if not rows[-1]["losses_equal_off"]:
            raise AssertionError(f"target {target}: losses {losses} differ from off's {off_losses}")
        # Every step counts, the first (profile) step included: on a device a step over is an out-of-memory error.
        # Fragmentation (reserved beyond allocated) is reported beside it, not held to the target.
        over = [(i + 1, p) for i, p in enumerate(peaks) if p > target]
        if over:
            raise AssertionError(f"target {target}: steps over it (step, peak bytes), the first counted: {over}")
    return {"off_peak_bytes": hi, "full_peak_bytes": lo, "rows": rows}


# ---- driver ----------------------------------------------------------------------------------------------------------
def verify(path):
    """The check a CTest entry runs after the dry run: the JSON exists and every section is there and passed."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        print(f"gpu_check --verify: {path}: {e}", file=sys.stderr)
        return 1
    bad = [s for s in SECTIONS if not data.get("sections", {}).get(s, {}).get("ok")]
    for s in bad:
        print(f"gpu_check --verify: section {s}: " + str(data.get("sections", {}).get(s, {}).get("error", "missing")),
              file=sys.stderr)
    if not data.get("finished"):
        print("gpu_check --verify: the run did not finish", file=sys.stderr)
        bad.append("finished")
    if not bad:
        print(f"gpu_check --verify: {path}: every section ({', '.join(SECTIONS)}) passed on {data['device']}"
              f"{' (dry run)' if data['dry_run'] else ''}")
    return 1 if bad else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder (gpu_check.json, target_shapes.json, target_shapes.md)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--layers", default="1,2,4", help="target_shapes: layer counts")
    ap.add_argument("--steps", type=int, default=4, help="target_shapes: measured rounds per layer count")
    ap.add_argument("--sac-steps", type=int, default=5, help="sac_peer and planner: measured rounds")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--dry-run", action="store_true", help="device cpu, float32, tiny shapes, one round each")
    ap.add_argument("--verify", metavar="JSON", help="only check a gpu_check.json: every section there and passed")
    a = ap.parse_args(argv)
    if a.verify:
        return verify(a.verify)
    if not a.out:
        ap.error("--out is required")
    if a.dry_run:
        a.device, a.dtype, a.sac_steps = "cpu", "float32", 1
        torch.set_num_threads(1)  # tiny ops: a second thread only waits, and on a busy machine it waits long
    sections = [s for s in a.sections.split(",") if s]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        ap.error(f"--sections {','.join(unknown)} not allowed; allowed: {', '.join(SECTIONS)}")
    if torch.device(a.device).type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device (--dry-run runs on cpu)")
    os.makedirs(a.out, exist_ok=True)
    started = time.perf_counter()
    log = lambda msg: print(f"[gpu_check {time.perf_counter() - started:.0f}s] {msg}", flush=True)  # noqa: E731
    import transformers  # noqa: F401 (the header names its version)
    data = {**environment("gpu_check"), "cuda": torch.version.cuda, "device": a.device,
            "device_name": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else "cpu",
            "dtype": a.dtype, "dry_run": a.dry_run, "finished": False, "sections": {}}
    path = os.path.join(a.out, "gpu_check.json")
    importlib.import_module("hpac.hf")
    gc.freeze()  # the imports' objects out of the collector's way: every step runs gc.collect()

    def save():
        data["wall_s"] = time.perf_counter() - started
        with open(path, "w") as f:
            json.dump(data, f, indent=1, default=str)

    for name in sections:
        t0 = time.perf_counter()
        log(f"section {name}")
        try:
            entry = {"ok": True, **globals()[name](a, log)}
        except Exception as e:  # recorded, then the run goes on: one failing section does not hide the others
            traceback.print_exc()
            entry = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        entry["seconds"] = time.perf_counter() - t0
        data["sections"][name] = entry
        log(f"section {name}: {'passed' if entry['ok'] else 'FAILED: ' + entry['error']} ({entry['seconds']:.0f}s)")
        save()
        gc.collect()
        if a.device.startswith("cuda"):
            torch.cuda.empty_cache()
    data["finished"] = True
    save()
    failed = [s for s, e in data["sections"].items() if not e["ok"]]
    log(f"wrote {path}; passed: {', '.join(s for s in sections if s not in failed) or 'none'}; "
        f"failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
