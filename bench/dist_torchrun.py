"""Level1 on PyTorch's own engine: runs hpac.dist_train under torchrun for each layout of
examples/distributed/torchrun/ (FSDP2 alone, TP x FSDP2, expert parallel x FSDP2; 2 and 4 Gloo ranks on loopback)
and writes the figures to bench/results/dist_torchrun.json: per rank and mode, the peak tensor bytes above the step's
start (max over steps), the largest differences from the 1-rank run and from off, and the last step's per-phase
counts of functional collectives and FSDP2 gathers. bench/report_results.py renders docs/distributed.md's table
from it.

    .venv/bin/python bench/dist_torchrun.py [--layouts dp2_fsdp,...] [--out bench/results/dist_torchrun.json]

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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYOUTS = [("dp2_fsdp", 2), ("tp2", 2), ("ep2_dp2_fsdp", 2), ("dp4_fsdp", 4), ("tp2_dp2_fsdp", 4),
           ("ep4_dp4_fsdp", 4)]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(python, layout, ranks):
    config = os.path.join("examples", "distributed", "torchrun", layout + ".yaml")
    with tempfile.TemporaryDirectory() as tmp:
        out_json = os.path.join(tmp, "run.json")
        cmd = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1",
               "--master-port", str(_free_port()), "-m", "hpac.dist_train", "--config", config, "--json", out_json]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(ROOT, "plugin", "python"))
        start = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)} exited with {p.returncode}:\n{p.stdout}\n{p.stderr}")
        with open(out_json) as f:
            data = json.load(f)
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
            "wall_s": round(time.time() - start, 1), "per_rank": per_rank,
            "command": f"torchrun --nproc-per-node {ranks} -m hpac.dist_train --config {config}"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--layouts", default=",".join(name for name, _ in LAYOUTS))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "dist_torchrun.json"))
    args = ap.parse_args()
    known = dict(LAYOUTS)
    wanted = args.layouts.split(",")
    bad = [w for w in wanted if w not in known]
    if bad:
        ap.error(f"--layouts: {', '.join(bad)} not allowed; allowed: {', '.join(known)}")
    results = []
    for name in wanted:
        results.append(run(args.python, name, known[name]))
        print(f"{name}: {results[-1]['wall_s']} s", flush=True)
    with open(args.out, "w") as f:
        json.dump({"cores": os.cpu_count(), "threads_per_rank": 1, "layouts": results}, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
