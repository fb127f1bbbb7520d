"""Runs the multi-rank comparisons of docs/distributed.md and writes their figures to bench/results/distributed.json.

    .venv/bin/python -m bench.distributed.hpac_train_compare [--build build] [--out bench/results/distributed.json]

For each example layout, `hpac-train --config examples/distributed/<layout>.yaml --compare --steps 3 --nproc N`; its
output is parsed: the lead rank's parity lines (maxima over ranks and steps against the 1-rank run, per mode) and each
rank's peak memory and last-step collective counts. bench/report.py prints the table from the JSON.
"""
import argparse
import os
import re
import subprocess
import sys
import time

from bench.common import RESULTS, ROOT, environment, write_json
LAYOUTS = [("tp2", 2), ("ep2_dp2", 2), ("dp2_fsdp", 2), ("tp2_ep2_dp2_fsdp", 4)]
STEPS = 3
PARITY = re.compile(r"parity (\w+)\s+vs the 1-rank run over (\d+) steps: max \|dloss\| (\S+), max \|dgrad\| ([^\s,]+)")
RANK = re.compile(r"rank (\d+) \(tp (\d+), dp (\d+), ep (\d+)\): peak off (\S+) MiB, full (\S+) MiB, selective (\S+) MiB; "
                  r"last step collectives in forward/recompute regions: full (\d+)/(\d+), selective (\d+)/(\d+); "
                  r"FSDP gathers selective (\d+)/(\d+)")


def run(build, layout, ranks):
    cmd = [os.path.join(build, "tools", "trainer", "hpac-train"), "--config",
           os.path.join(ROOT, "examples", "distributed", layout + ".yaml"), "--compare", "--steps", str(STEPS),
           "--nproc", str(ranks)]
    start = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HPAC_DIST_TIMEOUT_S="60"))
    out = p.stdout + p.stderr
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited with {p.returncode}:\n{out}")
    parity = {m.group(1): {"max_dloss": float(m.group(3)), "max_dgrad": float(m.group(4))}
              for m in PARITY.finditer(out)}
    per_rank = []
    for m in RANK.finditer(out):
        g = m.groups()
        per_rank.append({"rank": int(g[0]), "tp_rank": int(g[1]), "dp_rank": int(g[2]), "ep_rank": int(g[3]),
                         "peak_off_MiB": float(g[4]), "peak_full_MiB": float(g[5]), "peak_selective_MiB": float(g[6]),
                         "collectives_full": [int(g[7]), int(g[8])], "collectives_selective": [int(g[9]), int(g[10])],
                         "gathers_selective": [int(g[11]), int(g[12])]})
    if set(parity) != {"off", "full", "selective"} or len(per_rank) != ranks:
        sys.exit(f"could not read the parity lines or the {ranks} rank lines from:\n{out}")
    return {"layout": layout, "ranks": ranks, "steps": STEPS, "wall_s": round(time.time() - start, 1),
            "parity_vs_1_rank": parity, "per_rank": sorted(per_rank, key=lambda r: r["rank"]),
            "command": " ".join(["hpac-train"] + cmd[1:]).replace(ROOT + "/", "")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(RESULTS, "distributed.json"))
    args = ap.parse_args()
    results = [run(args.build, layout, ranks) for layout, ranks in LAYOUTS]
    write_json(args.out, {**environment("hpac_train_compare"), "cores": os.cpu_count(), "layouts": results})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
