"""The figures of docs/*.md, from the suite's JSON (bench/results/*.json).

Every table and every sentence that quotes a measured figure sits in a generated region of a document:

    <!-- BEGIN generated NAME -->
    ...                            (replaced by section NAME below)
    <!-- END generated NAME -->

    .venv/bin/python -m bench.report                 # prints every section
    .venv/bin/python -m bench.report --write docs/*.md  # rewrites the regions in place
    .venv/bin/python -m bench.report --check docs/*.md  # CTest docs.figures_match_json

--check fails when a region differs from what the JSON gives, names a section that does not exist, or when a figure
(a ratio such as 1.5×, a percentage, or a quantity in ms, ns or MiB) stands outside the generated regions. Figures
that are not this project's measurements (a reference design's table) sit between
<!-- BEGIN quoted WHY --> and <!-- END quoted -->, which says where they come from.
Only the Python standard library: any python3 runs it, from the checkout's root (python3 -m bench.report).
"""
import argparse
import os
import sys

# Each section lives beside the benchmark whose JSON it reads (bench/<area>/<script>_report.py); what they share is
# bench.common.report.
from bench.common.report import ROOT, print_sections, write_or_check
from bench.common.report import render as render_sections
from bench.budget.budget_frontier_report import budget_frontier
from bench.budget.memory_target_report import memory_target, memory_target_30b
from bench.budget.meta_plan_report import meta_plan, meta_plan_scale
from bench.peers.compile_compare_report import compile_compare
from bench.budget.cost_estimate_report import cost_estimate
from bench.distributed.dist_torchrun_report import dist_drift, dist_torchrun
from bench.distributed.hpac_train_compare_report import distributed
from bench.cpp.explain_report import explain
from bench.scale.frontier_30b_report import frontier_30b, frontier_30b_context_fn
from bench.scale.hf_qwen3_30b_layer_report import hf_scale
from bench.budget.main_job_frontier_report import main_job_frontier
from bench.cpp.overhead_report import overhead
from bench.peers.peer_harness_report import peer
from bench.budget.plan_oracle_report import plan_oracle
from bench.budget.plan_stability_report import plan_stability
from bench.peers.policy_fn_overhead_report import policy_fn_overhead, policy_fn_overhead_figures
from bench.budget.recompute_floor_report import recompute_floor
from bench.peers.sac_peer_report import sac_peer, sac_peer_figures
from bench.soak.soak_report import soak
from bench.cpp.step_report import key_ratios, scale, step, train_step
from bench.scale.target_shapes_report import target_shapes, target_shapes_summary
from bench.releases.torch_releases_report import torch_releases
from bench.peers.torchtitan_sac_report import torchtitan_sac

# Every section: the name of its generated region -> its function of the results directory (the order of the print).
SECTIONS = {
    "overhead": overhead, "step": step, "train_step": train_step, "peer": peer, "sac_peer": sac_peer,
"key_ratios": key_ratios, "scale": scale, "distributed": distributed,
    "hf_scale": hf_scale, "dist_torchrun": dist_torchrun, "dist_drift": dist_drift, "budget_frontier": budget_frontier,
    "cost_estimate": cost_estimate, "plan_stability": plan_stability, "plan_oracle": plan_oracle,
    "frontier_30b": frontier_30b,
    "target_shapes": target_shapes,
    "target_shapes_summary": target_shapes_summary,
    "memory_target": memory_target,
    "memory_target_30b": memory_target_30b,
    "meta_plan": meta_plan, "meta_plan_scale": meta_plan_scale,
    "policy_fn_overhead": policy_fn_overhead,
    "frontier_30b_context_fn": frontier_30b_context_fn,
    "explain": explain,
    "compile_compare": compile_compare,
    "torch_releases": torch_releases,
    "recompute_floor": recompute_floor,
    "main_job_frontier": main_job_frontier,
    "torchtitan_sac": torchtitan_sac,
    "soak": soak,
}


# Figure sets: the name in <!-- fig NAME.KEY --> -> its function of the results directory ({KEY: text}). The prose
# around them is the document's own.
FIGURES = {
    "sac_peer": sac_peer_figures,
    "policy_fn": policy_fn_overhead_figures,
    "key_ratios": key_ratios,
}


def render(text, results):
    """(new text, problems): every generated region replaced by its section, every inline figure by its value."""
    return render_sections(text, results, SECTIONS, FIGURES)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--write", nargs="+", metavar="DOC", help="rewrite the generated regions of these documents")
    ap.add_argument("--check", nargs="+", metavar="DOC", help="fail if a document differs from the JSON")
    args = ap.parse_args()
    if not args.write and not args.check:
        print_sections(SECTIONS, args.results, FIGURES)
        return 0
    return write_or_check(args.write, args.check, args.results, SECTIONS, FIGURES)


if __name__ == "__main__":
    sys.exit(main())
