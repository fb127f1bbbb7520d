"""What the two frontier benchmarks (bench.budget.budget_frontier, bench.scale.frontier_30b) share besides their plot
(bench.common.plotting): a run's results with hpac's tensor-memory tracking on, saved as the run goes."""
import hpac

from bench.common import Run


def start_results(name, out, steps, compile_steps, budgets):
    """A frontier run's results: (data, log(msg), save()); tensor memory tracked from here on, and save() writes what
    was measured so far (after every group of rows: a run stopped early leaves what it measured)."""
    hpac.track_memory()
    run = Run(name, out, steps=steps, compile_steps=compile_steps, budgets=list(budgets), models={})
    return run.data, run.log, run.save
