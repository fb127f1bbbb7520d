"""Plans made on the meta device, checked against real runs (issue: plan for the machine you will train on).

--check: for the main job (examples/training_demo/train.yaml) or Qwen3-30B-A3B's layer shapes (--shapes 30b, as
bench/budget/memory_target.py builds them: --layers, --batch x --seq, --experts, --vocab, float32), at --targets targets
evenly between the meta step's floor (the plan's least, every layer recomputed) and off's peak:
  1. `python -m hpac plan` (its own process, as a user runs it) on the meta device for the h100-sxm spec;
  2. a real CPU run that applies the plan file (activation_checkpoint.plan; its layers' regions weigh ops by the
     estimated costs, HPAC_ROOFLINE pinned to the spec's float32 rates), --warmup + --steps steps: the step's
     measured peak (hpac's tracking allocator, absolute) against the plan's prediction;
  3. a real CPU run planning itself from its real profile (memory_target, cost: estimated on the same rates, pinned
     with HPAC_ROOFLINE to the spec's float32 rates): is its plan the meta one, and their predicted recompute time.
Each run in a process of its own (a plan pins the meta roofline; a target counts absolute bytes).

--scale: the planner on the 48-layer Qwen3-30B-A3B (128 experts, vocabulary 151936, bfloat16) at seq 4096,
micro-batch 1 and 2, world size 8, an 80 GiB target on h100-sxm: wall time and the process's peak RSS, the plan,
and the fixed modes per rank; then the seed's layout (seq 1024, 48 layers, bfloat16, micro-batch 1; its parallel
layout is not given: 8, 16 and 32 FSDP2 ranks): off / full / selective per rank, and plans for 24 GiB and 20 GiB.
--layers-line: the meta step's off / full / selective at bench/scale/target_shapes.py's shapes (its JSON in bench/results)
and layer counts, beside its measured peaks, and at 48 layers beside the line it derives.

    .venv/bin/python -m bench.budget.meta_plan --check --out bench/results/meta_plan_main.json
    .venv/bin/python -m bench.budget.meta_plan --check --shapes 30b --layers 2 --batch 2 --out bench/results/meta_plan_30b_2.json
    .venv/bin/python -m bench.budget.meta_plan --check --shapes 30b --layers 4 --batch 1 --out bench/results/meta_plan_30b_4.json
    .venv/bin/python -m bench.budget.meta_plan --scale --layers-line --out bench/results/meta_plan_scale.json
    .venv/bin/python -m bench.budget.meta_plan --plot docs/results_meta_plan.png --out bench/results/meta_plan_scale.json
(--plot alone draws one plan of the --out JSON's scale runs, --plot-key batch_1, batch_2 (default; the layout whose
plan checkpoints) or seed_table/16/24GiB, with hpac.plan.plot, as `python -m hpac plan --plot` draws a plan.)
(GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 for the real runs.)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from bench.common import CONFIG, RESULTS, ROOT, Run, child_env, module_command

DEVICE = "h100-sxm"


def _yaml(args, folder, layers=None, seq=None, batch=None, experts=None, vocab=None, dtype="float32"):
    """The run's trainer YAML: the main job's, or the 30B layer shapes' (memory_target.py's model)."""
    if args.shapes == "main" and layers is None:
        return CONFIG
    text = (f"model: {{preset: qwen3_moe_30b_a3b, num_layers: {layers or args.layers}, num_experts: "
            f"{experts or args.experts}, vocab_size: {vocab or args.vocab}}}\n"
            f"train: {{seq_len: {seq or args.seq}, micro_batch: {batch or args.batch}, lr: 1.0e-3, seed: 1234, "
            f"dtype: {dtype}}}\n")
    path = os.path.join(folder, f"shapes_{layers or args.layers}.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def plan_cli(config, target, out, world=1, modes=""):
    """`python -m hpac plan` in its own process: (the plan, wall seconds, the child's peak RSS in bytes)."""
    size = f"{target}B" if isinstance(target, int) else str(target)  # Note [One size grammar]: a unit, always
    cmd = [sys.executable, "-m", "hpac", "plan", config, "--memory-target", size, "--device", DEVICE,
           "--world-size", str(world), "--out", out, "--quiet"] + (["--modes", modes] if modes else [])
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=subprocess.DEVNULL, stderr=err, text=True)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak RSS (ru_maxrss, KiB on Linux)
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        err.seek(0)
        stderr = err.read().strip()
    if child.returncode != 0:
        return {"error": stderr.splitlines()[-1] if stderr else "failed"}, wall, None
    with open(out) as f:
        return json.load(f), wall, usage.ru_maxrss * 1024


def child(kind, config, arg, warmup, steps):
    """In a process of its own: a real run of `config` applying plan file `arg` (kind 'apply') or planning itself for
    target bytes `arg` (kind 'target'); JSON on stdout."""
    import torch
    from bench.common.config_run import run
    import hpac
    import hpac.hf as hf
    torch.set_num_threads(1)
    hpac.track_memory()
    base = hf.load_config(config)
    if kind == "apply":
        r = run(base, f"plan:{arg}", warmup, steps)
    else:
        base = dict(base, activation_checkpoint=dict(base["activation_checkpoint"], cost="estimated"))
        r = run(base, f"target:{arg}", warmup, steps)
    r.pop("memtracker", None)
    print(json.dumps(r))


def real(kind, config, arg, args, **env):
    cmd = module_command("bench.budget.meta_plan", "--child", kind, config, arg, "--warmup", args.warmup,
                         "--steps", args.steps)
    done = subprocess.run(cmd, cwd=ROOT, env=child_env(**env), capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rates():
    import hpac._devices as devices
    spec = devices.SPECS[DEVICE]
    return f"{spec.flops_tflops['float32'] * 1e6:.6g}:{spec.bandwidth_tb_s * 1e6:.6g}"


def check(args, folder, log):
    config = _yaml(args, folder)
    probe, wall, _ = plan_cli(config, "1024GiB", os.path.join(folder, "probe.json"), modes="off,full")
    if "error" in probe:
        raise SystemExit(f"the meta probe failed: {probe['error']}")
    full, hi = probe["modes"]["full"]["peak_bytes"], probe["modes"]["off"]["peak_bytes"]
    # between the plan's floor (every layer recomputed under its budget plan, above full's peak where a budget
    # region holds more than full's) and off's peak: every target is one the planner must meet
    lo = max(full, probe.get("floor_bytes") or full)
    targets = [int(lo + (hi - lo) * k / (args.targets + 1)) for k in range(1, args.targets + 1)]
    log(f"meta: full {full / 2**20:.2f} MiB, floor {lo / 2**20:.2f} MiB, off {hi / 2**20:.2f} MiB ({wall:.1f} s); "
        "targets " + ", ".join(f"{t / 2**20:.2f}" for t in targets))
    rows = []
    for target in targets:
        meta, wall, rss = plan_cli(config, target, os.path.join(folder, f"plan_{target}.json"))
        row = {"target_bytes": target, "plan_wall_s": wall, "plan_rss_bytes": rss}
        if "error" in meta:
            row["error"] = meta["error"]
            rows.append(row)
            log(f"target {target / 2**20:.2f} MiB: {meta['error'][:160]}")
            continue
        applied = real("apply", config, os.path.join(folder, f"plan_{target}.json"), args, HPAC_ROOFLINE=_rates())
        own = real("target", config, target, args, HPAC_ROOFLINE=_rates())
        row.update(predicted_bytes=meta["predicted_bytes"], predicted_event=meta["predicted_event"],
                   meta_layers=[(x["checkpointed"], x["budget_bytes"]) for x in meta["layers"]],
                   meta_recompute_micros=meta["recompute_micros"])
        if "error" not in applied:
            row.update(measured_bytes=applied["peak_bytes"], measured_steps=[s["peak_bytes"] for s in applied["steps"]],
                       prediction_error=(meta["predicted_bytes"] - applied["peak_bytes"]) / applied["peak_bytes"],
                       over_target=applied["peak_bytes"] > target)
        else:
            row["apply_error"] = applied["error"]
        if "error" not in own and own.get("target"):
            layers = own["target"]["layers"]
            micros = sum(x["recompute_micros"] for x in layers if x["checkpointed"])
            row.update(real_layers=[(x["checkpointed"], x["budget_bytes"]) for x in layers],
                       real_recompute_micros=micros, real_predicted_bytes=own["target"]["predicted_bytes"],
                       real_measured_bytes=own["peak_bytes"])
            row["same_plan"] = row["real_layers"] == row["meta_layers"]
            row["recompute_time_ratio"] = (meta["recompute_micros"] / micros) if micros else None
        else:
            row["target_error"] = own.get("error")
        rows.append(row)
        log(f"target {target / 2**20:.2f} MiB: predicted {row['predicted_bytes'] / 2**20:.2f}, measured "
            f"{row.get('measured_bytes', 0) / 2**20:.2f} ({100 * row.get('prediction_error', 0):+.2f}%), same plan "
            f"as the real profile's: {row.get('same_plan')}")
    return {"config": os.path.relpath(config, ROOT) if config == CONFIG else open(config).read(),
            "meta_full_bytes": full, "meta_floor_bytes": lo, "meta_off_bytes": hi, "rows": rows}


def scale(args, folder, log):
    out = {}
    for batch in (1, 2):
        config = _yaml(args, folder, layers=48, seq=4096, batch=batch, experts=128, vocab=151936, dtype="bfloat16")
        meta, wall, rss = plan_cli(config, "80GiB", os.path.join(folder, f"scale_{batch}.json"), world=8,
                                   modes="off,full,selective")
        out[f"batch_{batch}"] = {"plan": meta, "wall_s": wall, "rss_bytes": rss}
        log(f"48 layers, micro-batch {batch} x 4096, world 8: {wall:.0f} s, RSS {(rss or 0) / 2**30:.2f} GiB, "
            f"{meta.get('predicted_bytes', 0) / 2**30:.2f} GiB predicted" if "error" not in meta else meta["error"])
    # the seed's table: Qwen3-30B-A3B at seq 1024, 48 layers, bfloat16; its parallel layout is not given, so the
    # modes and the 24 / 20 GiB targets at 8, 16 and 32 FSDP2 ranks (micro-batch 1)
    config = _yaml(args, folder, layers=48, seq=1024, batch=1, experts=128, vocab=151936, dtype="bfloat16")
    seed = {}
    for world in (8, 16, 32):
        row = {}
        for target in ("1024GiB", "24GiB", "20GiB"):
            meta, wall, rss = plan_cli(config, target, os.path.join(folder, f"seed_{world}_{target}.json"),
                                       world=world, modes="off,full,selective" if target == "1024GiB" else "")
            row[target] = {"plan": meta, "wall_s": wall, "rss_bytes": rss}
            log(f"seed layout, world {world}, {target}: " + (meta.get("error") or
                                                            f"{meta['predicted_bytes'] / 2**30:.2f} GiB predicted"))
        seed[str(world)] = row
    out["seed_table"] = seed
    return out


def layers_line(args, folder, log):
    """The meta step's fixed modes at bench/scale/target_shapes.py's shapes and layer counts beside its measured peaks, and
    at 48 layers beside the line it derives from them (bench/results/target_shapes.json)."""
    with open(os.path.join(RESULTS, "target_shapes.json")) as f:
        ts = json.load(f)
    rows = []
    for layers in sorted({r["layers"] for r in ts["runs"]} | {ts["target_layers"]}):
        config = _yaml(args, folder, layers=layers, seq=ts["seq"], batch=ts["batch"], experts=ts["experts"],
                       vocab=ts["vocab"], dtype=ts["dtype"])
        meta, wall, rss = plan_cli(config, "1024GiB", os.path.join(folder, f"line_{layers}.json"),
                                   modes="off,full,selective")
        if "error" in meta:
            raise SystemExit(f"the meta step at {layers} layers failed: {meta['error']}")
        measured = next((r["rows"] for r in ts["runs"] if r["layers"] == layers), None)
        row = {"layers": layers, "wall_s": wall, "rss_bytes": rss, "modes": {}}
        for mode, v in meta["modes"].items():
            m = {"meta_bytes": v["peak_bytes"], "meta_event": v["event"]}
            if measured:
                m["measured_bytes"] = measured[mode]["peak_bytes"]
            if layers == ts["target_layers"]:
                m["derived_bytes"] = ts["derived"][mode]["peak_bytes_derived"]
            row["modes"][mode] = m
        rows.append(row)
        log(f"layers line, {layers} layers: " + ", ".join(
            f"{k} meta {v['meta_bytes'] / 2**30:.3f} GiB vs "
            + (f"{v['measured_bytes'] / 2**30:.3f} measured" if "measured_bytes" in v
               else f"{v.get('derived_bytes', 0) / 2**30:.3f} derived") for k, v in row["modes"].items()))
    return {"shapes": {k: ts[k] for k in ("seq", "batch", "experts", "vocab", "dtype")},
            "target_shapes_hpac": ts.get("hpac"), "rows": rows}


def main():
    if sys.argv[1:2] == ["--child"]:
        ap = argparse.ArgumentParser()
        ap.add_argument("--child", nargs=3)
        ap.add_argument("--warmup", type=int)
        ap.add_argument("--steps", type=int)
        a = ap.parse_args()
        child(*a.child, a.warmup, a.steps)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--scale", action="store_true")
    ap.add_argument("--layers-line", action="store_true")
    ap.add_argument("--shapes", choices=("main", "30b"), default="main")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--targets", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--plot", metavar="PNG")
    ap.add_argument("--plot-key", default="batch_2")
    args = ap.parse_args()
    if args.plot and not (args.check or args.scale or args.layers_line):
        import hpac.plan as plan
        with open(args.out) as f:
            entry = json.load(f)["scale"]
        for key in args.plot_key.split("/"):
            entry = entry[key]
        plan.plot(entry["plan"], args.plot)
        print(f"wrote {args.plot}")
        return
    import torch  # noqa: F401 (the header names its version)
    run = Run("meta_plan", args.out, device_spec=DEVICE, shapes=args.shapes, layers=args.layers, batch=args.batch,
              seq=args.seq, warmup=args.warmup, steps=args.steps)
    data, log = run.data, run.log
    with tempfile.TemporaryDirectory() as folder:
        if args.check:
            data["check"] = check(args, folder, log)
        if args.scale:
            data["scale"] = scale(args, folder, log)
        if args.layers_line:
            data["layers_line"] = layers_line(args, folder, log)
    run.save()
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
