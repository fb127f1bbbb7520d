"""Level1 on PyTorch's own engine: runs hpac.harness.dist_train under torchrun for each layout of
examples/distributed/torchrun/ (FSDP2 alone, TP x FSDP2, expert parallel x FSDP2, TP x EP x FSDP2; 2 and 4 Gloo ranks
on loopback; cp2 needs CUDA: tools/gpu_level1.sh)
and writes the figures to bench/results/dist_torchrun.json: per rank and mode, the peak tensor bytes above the step's
start (max over steps), the largest differences from the 1-rank run and from off, and the last step's per-phase
counts of functional collectives and FSDP2 gathers. bench/report.py renders docs/distributed.md's table
from it.

    .venv/bin/python -m bench.distributed.dist_torchrun [--layouts dp2_fsdp,...] [--out bench/results/dist_torchrun.json]
    .venv/bin/python -m bench.distributed.dist_torchrun --drift [--steps 20] [--out bench/results/dist_drift.json]

--drift: the 4-rank layout with every feature the runner allows together (TP 2 x EP 2 x FSDP2 over dp 2; modes off,
full, selective and budget 0.5 side by side; compile is refused with TP on this torch), --steps steps, every rank's
per-step loss, differences from the 1-rank run, peak tensor bytes and bytes live after the step, written as they
were measured (bench/results/dist_drift.json; docs/distributed.md's drift table).

Every rank runs OMP_NUM_THREADS=1 (the ranks share the machine's cores).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

from bench.common import RESULTS, ROOT, child_env, environment, write_json
LAYOUTS = [("dp2_fsdp", 2), ("tp2", 2), ("ep2_dp2_fsdp", 2), ("dp4_fsdp", 4), ("tp2_dp2_fsdp", 4),
           ("ep4_dp4_fsdp", 4), ("tp2_ep2_dp2_fsdp", 4)]
DRIFT_LAYOUT, DRIFT_BUDGET = "tp2_ep2_dp2_fsdp", 0.5
# Against the 1-rank run over 20 AdamW steps: off itself moves away from it by a few 1e-5 in the gradients (fp32
# sums in another order: TP and EP all-reduces, FSDP2's reduce-scatter; measured 3.7e-05 by step 4), so the drift
# run checks the 1-rank run at 1e-4 and every mode against off bit for bit, as the runner always does.
DRIFT_TOLERANCE = 1e-4
ROW_KEYS = ("step", "loss", "dloss_1rank", "dgrad_1rank", "dloss_off", "dgrad_off", "peak_bytes", "bytes_after_step",
            "budget_stage")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(python, config, ranks, extra=()):
    """hpac.harness.dist_train on `ranks` ranks; returns (its JSON, wall seconds). Rank 0's lines are echoed as they
    come."""
    with tempfile.TemporaryDirectory() as tmp:
        out_json = os.path.join(tmp, "run.json")
        cmd = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1",
               "--master-port", str(_free_port()), "-m", "hpac.harness.dist_train", "--config", config,
               "--json", out_json, *extra]
        env = child_env(OMP_NUM_THREADS=1)
        start = time.time()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
        lines = []
        for line in p.stdout:
            lines.append(line)
            if line.startswith("[rank 0] step ") or "OK:" in line or "error" in line:
                print("  " + line.rstrip(), flush=True)
        if p.wait() != 0:
            sys.exit(f"{' '.join(cmd)} exited with {p.returncode}:\n{''.join(lines[-200:])}")
        with open(out_json) as f:
            return json.load(f), round(time.time() - start, 1)


def run(python, layout, ranks):
    config = os.path.join("examples", "distributed", "torchrun", layout + ".yaml")
    data, wall_s = _torchrun(python, config, ranks)
    per_rank = []
    for r in data["per_rank"]:
        modes = {}
        for mode, rows in r["modes"].items():
            modes[mode] = {
                "peak_bytes": max(row["peak_bytes"] for row in rows),
                "max_dloss_1rank": max(row["dloss_1rank"] for row in rows),
                "max_dgrad_1rank": max(row["dgrad_1rank"] for row in rows),
                "max_dloss_off": max(row["dloss_off"] for row in rows),
                "max_dgrad_off": max(row["dgrad_off"] for row in rows),
                "last_step_counts": rows[-1]["counts"],
            }
        per_rank.append({"rank": r["rank"], "modes": modes})
    return {"layout": layout, "ranks": ranks, "parallel": data["parallel"], "model": data["model"],
            "train": data["train"], "torch": data["torch"], "transformers": data["transformers"],
            "wall_s": wall_s, "per_rank": per_rank,
            "command": f"torchrun --nproc-per-node {ranks} -m hpac.harness.dist_train --config {config}"}


def drift(python, steps):
    """The drift run (--drift): every rank's rows as measured, per mode."""
    example = os.path.join(ROOT, "examples", "distributed", "torchrun", DRIFT_LAYOUT + ".yaml")
    with open(example) as f:
        text = f.read()
    marker = "  mode: selective"
    if marker not in text:
        sys.exit(f"{example}: no '{marker}' line to turn into mode budget")
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, DRIFT_LAYOUT + "_budget.yaml")
        with open(config, "w") as f:
            f.write(text.replace(marker, f"  mode: budget\n  memory_budget: {DRIFT_BUDGET}", 1))
        data, wall_s = _torchrun(python, config, 4, ["--steps", str(steps), "--modes", "off,full,selective,budget",
                                                     "--tolerance", str(DRIFT_TOLERANCE)])
    return {"layout": DRIFT_LAYOUT, "ranks": data["ranks"], "parallel": data["parallel"], "model": data["model"],
            "train": data["train"], "torch": data["torch"], "transformers": data["transformers"],
            "memory_budget": DRIFT_BUDGET, "wall_s": wall_s, "cores": os.cpu_count(), "threads_per_rank": 1,
            "command": f"torchrun --nproc-per-node 4 -m hpac.harness.dist_train --config "
                       f"examples/distributed/torchrun/{DRIFT_LAYOUT}.yaml (mode budget, memory_budget "
                       f"{DRIFT_BUDGET}) --steps {steps} --modes off,full,selective,budget --tolerance "
                       f"{DRIFT_TOLERANCE:g}", "tolerance_1rank": DRIFT_TOLERANCE,
            "per_rank": [{"rank": r["rank"], "modes": {m: [{k: row[k] for k in ROW_KEYS if k in row} for row in rows]
                                                       for m, rows in r["modes"].items()}}
                         for r in data["per_rank"]]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--layouts", default=",".join(name for name, _ in LAYOUTS))
    ap.add_argument("--out", default=None, help="default bench/results/dist_torchrun.json, or dist_drift.json")
    ap.add_argument("--drift", action="store_true", help=f"the {DRIFT_LAYOUT} drift run instead of the layouts")
    ap.add_argument("--steps", type=int, default=20, help="steps of the drift run (a positive integer)")
    args = ap.parse_args()
    if args.steps < 1:
        ap.error(f"--steps {args.steps}: allowed: a positive integer")
    if args.drift:
        out = args.out or os.path.join(RESULTS, "dist_drift.json")
        result = {**environment("dist_drift"), **drift(args.python, args.steps)}
        write_json(out, result)
        print(f"{DRIFT_LAYOUT}: {result['wall_s']} s; wrote {out}")
        return 0
    args.out = args.out or os.path.join(RESULTS, "dist_torchrun.json")
    known = dict(LAYOUTS)
    wanted = args.layouts.split(",")
    bad = [w for w in wanted if w not in known]
    if bad:
        ap.error(f"--layouts: {', '.join(bad)} not allowed; allowed: {', '.join(known)}")
    results = []
    for name in wanted:
        results.append(run(args.python, name, known[name]))
        print(f"{name}: {results[-1]['wall_s']} s", flush=True)
    write_json(args.out, {**environment("dist_torchrun"), "cores": os.cpu_count(), "threads_per_rank": 1,
                          "layouts": results})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
