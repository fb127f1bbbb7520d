"""Long runs stay flat: the main job (the tiny Qwen3-MoE of examples/training_demo/train.yaml) trained for many steps
with what a long run meets, through hpac.hf.prepare (Python) and hpac-train's Trainer (C++, build/bench/hpac-soak):
every --faults-every steps a forward whose graph is dropped without backward, a step that ends in an exception inside
a checkpointed layer's forward and one that ends in an exception inside its recompute; every --rebuild-every steps the
model rebuilt and prepared again; and the Python run again on 2 FSDP2 ranks (Gloo over loopback, the model sharded
after prepare as hpac.harness.dist_train does; exceptions in the forward only unless --fsdp-recompute-faults). Every --sample steps: live CPU tensor bytes after the step (hpac's tracking
allocator), the process's resident set (/proc/self/statm), hpac Invocations alive. Written to
bench/results/soak.json as it goes (a run stopped early keeps what it measured); docs/reliability.md, "Memory across
a run", reports it.

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 \\
    .venv/bin/python -m bench.soak.soak [--steps 10000] [--modes budget] [--runs python,cpp]

The RSS growth per 1000 steps is the least-squares slope of the resident set over the samples after --warmup steps
(the first rebuild included); the goal is under 1 MiB. GLIBC_TUNABLES as the demo sets them keep glibc's heap from
returning and re-mapping pages between steps (docs/results.md); the run records what was set.
"""
import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time

from bench.common import CONFIG, RESULTS, ROOT, child_env, environment, write_json


class Fault(Exception):
    """The exception a soak step raises inside a layer."""


def resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def slope_per_1000(samples, key, warmup):
    """Least-squares slope of samples[key] over their steps after `warmup`, per 1000 steps."""
    pts = [(s["step"], s[key]) for s in samples if s["step"] > warmup]
    if len(pts) < 2:
        return None
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    var = sum((x - mx) ** 2 for x, _ in pts)
    return 1000 * sum((x - mx) * (y - my) for x, y in pts) / var if var else None


def between_rebuilds(samples, warmup, rebuild_every):
    """(RSS growth per 1000 steps between rebuilds, [RSS change across each rebuild]): consecutive samples after the
    warm-up, split by whether a rebuild falls between them."""
    within, across, steps = 0, [], 0
    after = [s for s in samples if s["step"] > warmup]
    for a, b in zip(after, after[1:]):
        if (a["step"] - 1) // rebuild_every != (b["step"] - 1) // rebuild_every:
            across.append(b["rss_bytes"] - a["rss_bytes"])
        else:
            within += b["rss_bytes"] - a["rss_bytes"]
            steps += b["step"] - a["step"]
    return (1000 * within / steps if steps else None), across


def summary(samples, warmup, rebuild_every):
    after = [s for s in samples if s["step"] > warmup]
    tensor = [s["tensor_bytes"] for s in after]
    within, across = between_rebuilds(samples, warmup, rebuild_every)
    return {
        "warmup": warmup,
        "rss_growth_between_rebuilds_bytes_per_1000_steps": within,
        "rss_change_across_rebuilds_bytes": across,
        "samples_after_warmup": len(after),
        "tensor_bytes_min": min(tensor) if tensor else None,
        "tensor_bytes_max": max(tensor) if tensor else None,
        "rss_growth_bytes_per_1000_steps": slope_per_1000(samples, "rss_bytes", warmup),
        "rss_first_after_warmup": after[0]["rss_bytes"] if after else None,
        "rss_last": samples[-1]["rss_bytes"] if samples else None,
        "invocations_alive_max": max((s["invocations_alive"] for s in samples), default=None),
    }


def failing(model, where, ids):
    """One forward and backward of `model` on `ids` with a Fault raised where the second layer's MLP runs, in the
    forward or in the recompute; 1 when it was raised (and caught), else 0. The gradients are dropped."""
    calls = []

    def fault(module, inputs):
        calls.append(1)
        if (where == "forward") == (len(calls) == 1):
            raise Fault(f"raised in the {where}")
    handle = model.model.layers[1].mlp.register_forward_pre_hook(fault)
    try:
        model(input_ids=ids, labels=ids).loss.backward()
    except Fault:
        return 1
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)
    return 0


def python_run(args, mode, log, publish, layout=None):
    """The soak through hpac.hf.prepare, in this process (with `layout`, this rank's part of an FSDP2 job: the model
    sharded after prepare, as hpac.harness.dist_train does); returns the run's record (publish(record) after every
    sample writes what was measured so far)."""
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning)
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    import hpac
    import hpac.hf as hf
    import hpac.harness.models as hm
    import hpac.harness.parallel as hp

    hpac.track_memory()
    config = hf.load_config(args.config)
    config["activation_checkpoint"]["mode"] = mode
    spec, train = config["model"], config["train"]
    record = {"program": "bench/soak/soak.py (hpac.hf.prepare)" + (f", FSDP2 rank {layout.rank} of {layout.world}"
                                                             if layout else ""),
              "mode": mode, "steps": args.steps, "faults_every": args.faults_every,
              "rebuild_every": args.rebuild_every, "dropped_forwards": 0, "forward_faults": 0, "recompute_faults": 0,
              "rebuilds": 0, "samples": []}
    state = {}

    def build():
        state.clear()
        gc.collect()
        model = hm.qwen3_moe_model(spec, train["seed"])
        state["prep"] = hf.prepare(model, config, log=lambda *a: None)
        if layout is not None:
            hp.shard(model, layout, [])
        state["model"], state["opt"] = model, torch.optim.AdamW(model.parameters(), lr=train["lr"])

    def batch(step):
        rank = layout.rank if layout is not None else 0
        return hm.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"] + rank, step)

    build()
    start = time.perf_counter()
    for step in range(args.steps):
        if step and step % args.rebuild_every == 0:
            build()
            record["rebuilds"] += 1
        ids = batch(step)
        if step and step % args.faults_every == 0:
            state["model"](input_ids=ids, labels=ids)  # dropped: evaluation in train mode, a skipped micro-batch
            record["dropped_forwards"] += 1
            record["forward_faults"] += failing(state["model"], "forward", ids)
            if layout is None or args.fsdp_recompute_faults:
                record["recompute_faults"] += failing(state["model"], "recompute", ids)
        model, opt = state["model"], state["opt"]
        torch.manual_seed(train["seed"] + step)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % args.sample == 0 or step + 1 == args.steps:
            gc.collect()
            row = {"step": step + 1, "tensor_bytes": hpac.cpu_tensor_memory_stats()["current_bytes"],
                   "rss_bytes": resident_bytes(), "invocations_alive": torch.ops.hpac.invocations_alive(),
                   "seconds": round(time.perf_counter() - start, 3)}
            record["samples"].append(row)
            record["summary"] = summary(record["samples"], args.warmup, args.rebuild_every)
            publish(record)
            if (step + 1) % (10 * args.sample) == 0:
                log(f"{'rank %d ' % layout.rank if layout else ''}python {mode} step {step + 1}/{args.steps}: "
                    f"tensor bytes {row['tensor_bytes']}, rss {row['rss_bytes'] / 2**20:.1f} MiB, invocations "
                    f"alive {row['invocations_alive']}")
    record["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return record


def fsdp2_worker(args, mode):
    """One rank of the 2-rank FSDP2 soak (under torchrun): writes its record to <out>.rank<r>.part."""
    import datetime
    import torch.distributed as dist
    import hpac.harness.parallel as hp
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    layout = hp.Layout({"tp": 1, "dp": world, "ep": 1, "fsdp": True}, rank, world)
    layout.build_groups()
    part = f"{args.out}.rank{rank}.part"

    def publish(record):
        with open(part, "w") as f:
            json.dump(record, f)
    log = lambda msg: print(f"[soak rank {rank}] {msg}", flush=True)
    publish(python_run(args, mode, log, publish, layout))
    dist.barrier()
    dist.destroy_process_group()


def fsdp2_run(args, mode, log):
    """The soak on 2 FSDP2 ranks (Gloo over loopback, torchrun --standalone); returns rank 0's record with rank 1's
    summary beside it."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "bench.soak.soak", "--fsdp2-worker", "--modes", mode, "--config", args.config, "--steps",
           str(args.steps), "--faults-every", str(args.faults_every), "--rebuild-every", str(args.rebuild_every),
           "--sample", str(args.sample), "--warmup", str(args.warmup), "--out", args.out]
    if args.fsdp_recompute_faults:
        cmd.append("--fsdp-recompute-faults")
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, cwd=ROOT, env=child_env(OMP_NUM_THREADS=1))
    records = []
    for rank in range(2):
        with open(f"{args.out}.rank{rank}.part") as f:
            records.append(json.load(f))
        os.remove(f"{args.out}.rank{rank}.part")
    record = records[0]
    record["other_ranks"] = [{"rank": 1, "summary": records[1]["summary"]}]
    return record


def cpp_run(args, mode, log, out_dir):
    """hpac-soak (bench/cpp/soak_train.cpp) in a child process; returns its JSON with the summary added."""
    path = os.path.join(out_dir, f"soak_cpp_{mode}.json.part")
    cmd = [args.cpp, "--config", os.path.relpath(args.config, ROOT), "--mode", mode, "--steps", str(args.steps),
           "--faults-every", str(args.faults_every), "--rebuild-every", str(args.rebuild_every), "--sample",
           str(args.sample), "--json", path]
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    with open(path) as f:
        record = json.load(f)
    os.remove(path)
    record["summary"] = summary(record["samples"], args.warmup, args.rebuild_every)
    return record


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--modes", default="budget", help="comma-separated checkpoint modes (default budget)")
    ap.add_argument("--runs", default="python,cpp,fsdp2",
                    help="comma-separated: python (hpac.hf), cpp (hpac-soak), fsdp2 (hpac.hf on 2 FSDP2 ranks)")
    ap.add_argument("--fsdp-recompute-faults", action="store_true",
                    help="fsdp2 runs also raise inside the recompute (FSDP2's own backward state then decides)")
    ap.add_argument("--fsdp2-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="write --out from these soak JSONs (runs made in separate processes, side by side)")
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--faults-every", type=int, default=50)
    ap.add_argument("--rebuild-every", type=int, default=2000)
    ap.add_argument("--sample", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=1000, help="steps left out of the growth fit")
    ap.add_argument("--cpp", default=os.path.join(ROOT, "build", "bench", "hpac-soak"))
    ap.add_argument("--out", default=os.path.join(RESULTS, "soak.json"))
    args = ap.parse_args()
    for name in ("steps", "faults_every", "rebuild_every", "sample"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)} is not allowed; allowed: a positive integer")
    runs = [r for r in args.runs.split(",") if r]
    if set(runs) - {"python", "cpp", "fsdp2"}:
        ap.error(f"--runs {args.runs!r} is not allowed; allowed: python, cpp, fsdp2 (comma-separated)")
    if args.fsdp2_worker:
        fsdp2_worker(args, args.modes)
        return
    if args.merge:
        merged = None
        for path in args.merge:
            with open(path) as f:
                part = json.load(f)
            if merged is None:
                merged = part
                continue
            merged["runs"].update(part["runs"])
            merged["wall_s"] = max(merged["wall_s"], part["wall_s"])  # the parts ran side by side
            merged["load_average_at_end"] = max(merged["load_average_at_end"], part["load_average_at_end"])
        for run in merged["runs"].values():  # the repository's path, not this machine's
            if os.path.isabs(run.get("config", "")):
                run["config"] = os.path.relpath(run["config"], ROOT)
        write_json(args.out, merged)
        return

    import torch
    started = time.perf_counter()
    log = lambda msg: print(f"[soak {time.perf_counter() - started:.0f}s] {msg}", flush=True)
    data = {**environment("soak"), "omp_num_threads": os.environ.get("OMP_NUM_THREADS") or "(unset)",
            "warmup": args.warmup, "config": os.path.relpath(args.config, ROOT), "runs": {}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def save():
        data["wall_s"] = round(time.perf_counter() - started, 1)
        data["load_average_at_end"] = os.getloadavg()[0]
        write_json(args.out, data)

    for mode in [m for m in args.modes.split(",") if m]:
        for run in runs:
            key = f"{run}:{mode}"
            if run == "python":
                def publish(record, key=key):
                    data["runs"][key] = record
                    save()
                data["runs"][key] = python_run(args, mode, log, publish)
            elif run == "cpp":
                data["runs"][key] = cpp_run(args, mode, log, os.path.dirname(os.path.abspath(args.out)))
            else:
                data["runs"][key] = fsdp2_run(args, mode, log)
            save()
            s = data["runs"][key]["summary"]
            log(f"{key}: tensor bytes {s['tensor_bytes_min']}..{s['tensor_bytes_max']} after warm-up, RSS growth "
                f"{(s['rss_growth_bytes_per_1000_steps'] or 0) / 2**20:.3f} MiB per 1000 steps, invocations alive "
                f"at most {s['invocations_alive_max']}")


if __name__ == "__main__":
    main()
