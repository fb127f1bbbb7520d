"""The figures of docs/*.md, from the suite's JSON (bench/results/*.json).

Every table and every sentence that quotes a measured figure sits in a generated region of a document:

    <!-- BEGIN generated NAME -->
    ...                            (replaced by section NAME below)
    <!-- END generated NAME -->

    .venv/bin/python bench/report_results.py                 # prints every section
    .venv/bin/python bench/report_results.py --write docs/*.md  # rewrites the regions in place
    .venv/bin/python bench/report_results.py --check docs/*.md  # CTest docs.figures_match_json

--check fails when a region differs from what the JSON gives, names a section that does not exist, or when a figure
(a ratio such as 1.5×, a percentage, or a quantity in ms, ns or MiB) stands outside the generated regions. Figures
that are not this project's measurements (a reference design's table) sit between
<!-- BEGIN quoted WHY --> and <!-- END quoted -->, which says where they come from.
Only the Python standard library: any python3 runs it.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # the sections beside this file, also when it is imported by path
    sys.path.insert(0, HERE)
# Each section lives beside the benchmark it reports (bench/<script>_report.py); what they share is report_common.
# The names other scripts import from here (load, target_shapes_table, hf_scale, ...) stay importable.
from report_common import ROOT, load, print_sections, rows, span, stray_figures, write_or_check  # noqa: E402,F401
from report_common import render as render_sections  # noqa: E402
from budget_frontier_report import budget_frontier  # noqa: E402
from memory_target_report import memory_target, memory_target_30b  # noqa: E402
from meta_plan_report import meta_plan, meta_plan_scale  # noqa: E402
from compile_compare_report import compile_compare  # noqa: E402
from cost_estimate_report import cost_estimate  # noqa: E402
from dist_torchrun_report import dist_drift, dist_torchrun  # noqa: E402
from distributed_report import distributed  # noqa: E402
from explain_report import explain  # noqa: E402
from frontier_30b_report import frontier_30b, frontier_30b_context_fn  # noqa: E402
from hf_qwen3_30b_layer_report import hf_scale  # noqa: E402
from main_job_frontier_report import main_job_frontier  # noqa: E402
from overhead_benchmark_report import overhead  # noqa: E402
from peer_harness_report import peer  # noqa: E402
from plan_oracle_report import plan_oracle  # noqa: E402
from plan_stability_report import plan_stability  # noqa: E402
from policy_fn_overhead_report import policy_fn_overhead, policy_fn_overhead_reading  # noqa: E402
from recompute_floor_report import recompute_floor  # noqa: E402
from sac_peer_report import sac_peer, sac_peer_reading  # noqa: E402
from soak_report import soak  # noqa: E402
from step_benchmark_report import key_ratios, scale, step, train_step  # noqa: E402
from target_shapes_report import target_shapes, target_shapes_summary, target_shapes_table  # noqa: E402,F401
from torch_release_check_report import torch_releases  # noqa: E402
from torchtitan_sac_report import torchtitan_sac  # noqa: E402

# Every section: the name of its generated region -> its function of the results directory (the order of the print).
SECTIONS = {
    "overhead": overhead, "step": step, "train_step": train_step, "peer": peer, "sac_peer": sac_peer,
    "sac_peer_reading": sac_peer_reading, "key_ratios": key_ratios, "scale": scale, "distributed": distributed,
    "hf_scale": hf_scale, "dist_torchrun": dist_torchrun, "dist_drift": dist_drift, "budget_frontier": budget_frontier,
    "cost_estimate": cost_estimate, "plan_stability": plan_stability, "plan_oracle": plan_oracle,
    "frontier_30b": frontier_30b,
    "target_shapes": target_shapes,
    "target_shapes_summary": target_shapes_summary,
    "memory_target": memory_target,
    "memory_target_30b": memory_target_30b,
    "meta_plan": meta_plan, "meta_plan_scale": meta_plan_scale,
    # A GPU run's target shapes (tools/gpu_check.sh), for the region docs/results.md says it goes under.
    "gpu_target_shapes": lambda r: target_shapes_table(load(r, "gpu_check_target_shapes.json")),
    "policy_fn_overhead": policy_fn_overhead, "policy_fn_overhead_reading": policy_fn_overhead_reading,
    "frontier_30b_context_fn": frontier_30b_context_fn,
    "explain": explain,
    "compile_compare": compile_compare,
    "torch_releases": torch_releases,
    "recompute_floor": recompute_floor,
    "main_job_frontier": main_job_frontier,
    "torchtitan_sac": torchtitan_sac,
    "soak": soak,
}


def render(text, results):
    """(new text, problems): every generated region replaced by its section."""
    return render_sections(text, results, SECTIONS)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--write", nargs="+", metavar="DOC", help="rewrite the generated regions of these documents")
    ap.add_argument("--check", nargs="+", metavar="DOC", help="fail if a document differs from the JSON")
    args = ap.parse_args()
    if not args.write and not args.check:
        print_sections(SECTIONS, args.results)
        return 0
    return write_or_check(args.write, args.check, args.results, SECTIONS)


if __name__ == "__main__":
    sys.exit(main())
