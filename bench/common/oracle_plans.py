"""hpac's budget plans beside the exact optimum of the planner's additive objective (Note [An exact oracle for the
planner], policy/budget_plan.h; the MILP of hpac.harness.plan_oracle, scipy's milp), written as plan files for a
transformers causal LM whose decoder layers are each a budget region: what bench.budget.plan_oracle replays against
each other and bench.budget.main_job_frontier measures against the fixed modes. hpac and the oracle are imported
where used (the oracle needs scipy).
"""
import copy
import gc
import os
import time


def split_step(model, ids):
    """(forward s, backward s, gradients) of one step of a causal LM on token batch `ids`."""
    model.zero_grad(set_to_none=True)
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
    finally:
        gc.enable()
    return t1 - t0, t2 - t1, [p.grad for p in model.parameters()]


def plan_files(base, fraction, batch, profiles, tmp):
    """Profiles a copy of `base`, every layer its own budget region, and writes three plans per layer: hpac's, the
    MILP's optimum and hpac's additive knapsack alone. Returns ({name: [plan path per layer]}, {name: predicted
    figures summed over the layers}, the regions)."""
    import hpac
    import hpac.harness.plan_oracle as plan_oracle
    profiled = copy.deepcopy(base)
    regions = [hpac.budget(fraction, profile_invocations=profiles) for _ in profiled.model.layers]
    for layer, b in zip(profiled.model.layers, regions):
        hpac.checkpoint_wrapper(layer, policy=b)
    for step in range(profiles):
        split_step(profiled, batch(step))
    plans = {"hpac": [], "optimum": [], "hpac_additive": []}
    predicted = {k: {"additive_micros": 0.0, "dataflow_micros": 0.0, "kept_bytes": 0} for k in plans}
    for i, b in enumerate(regions):
        g = plan_oracle.region_groups(b)
        additive = plan_oracle.knapsack_keep(g["bytes"], g["micros"], g["collective"], b.status()["budget_bytes"])
        texts = {"hpac": b._region.plan_text(), "optimum": plan_oracle.optimal_plan_text(b),
                 "hpac_additive": b._region.plan_text_keeping([int(k) for k in additive])}
        for name, text in texts.items():
            path = os.path.join(tmp, f"{fraction}-{name}-{i}.plan")
            with open(path, "w") as f:
                f.write(text)
            plans[name].append(path)
            save = [int(r["decision"] == "keep") for r in plan_oracle.plan_decisions(text)]
            keep = plan_oracle.keep_of_save(save, g["group_of"], len(g["bytes"]))
            predicted[name]["additive_micros"] += plan_oracle.recompute_micros(keep, g["micros"])
            predicted[name]["dataflow_micros"] += plan_oracle.plan_recompute_micros(text)
            predicted[name]["kept_bytes"] += plan_oracle.kept_bytes(keep, g["bytes"], g["collective"])
    return plans, predicted, regions
