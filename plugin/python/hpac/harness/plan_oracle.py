"""The exact optimum of the budget planner's additive objective, as an oracle for tests and benchmarks (Note [An exact
oracle for the planner], policy/budget_plan.h): a MILP over the planner's own groups, solved by scipy's milp (HiGHS).
hpac itself never imports scipy.

The objective is the knapsack's (Note [Budget as a knapsack]): keep groups, each whole, maximising the kernel time
kept (so minimising the time left to recompute) within the budget's bytes. Groups without bytes and collectives are
kept by every plan, the collectives' bytes taken from the budget first, as hpac's planner does (Note [Collectives are
kept by every plan]). Dead-op skipping (Note [Dead ops are skipped]) is outside this objective: a plan's dataflow
recompute time is read from its plan text, where skipped ops are marked.
"""
from typing import Dict, List, Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp


def optimum(group_bytes: Sequence[int], group_micros: Sequence[float], collective: Sequence[int],
            budget_bytes: int) -> List[bool]:
    """Per group: kept by the exact optimum of the additive objective."""
    forced = [b == 0 or bool(c) for b, c in zip(group_bytes, collective)]
    left = max(budget_bytes - sum(b for b, c in zip(group_bytes, collective) if c), 0)
    free = [g for g, f in enumerate(forced) if not f]
    keep = list(forced)
    if not free:
        return keep
    weights = np.array([group_bytes[g] for g in free], dtype=float)
    values = np.array([group_micros[g] for g in free], dtype=float)
    result = milp(c=-values, constraints=LinearConstraint(weights[None, :], -np.inf, float(left)),
                  integrality=np.ones(len(free)), bounds=Bounds(0, 1), options={"mip_rel_gap": 0.0})
    if not result.success:
        raise RuntimeError(f"plan_oracle: milp found no optimum ({result.message})")
    for g, x in zip(free, result.x):
        keep[g] = bool(round(x))
    return keep


def kept_bytes(keep: Sequence[bool], group_bytes: Sequence[int], collective: Sequence[int]) -> int:
    """The bytes a plan keeping `keep` holds within the budget (collectives' bytes are outside it)."""
    return sum(b for k, b, c in zip(keep, group_bytes, collective) if k and not c)


def recompute_micros(keep: Sequence[bool], group_micros: Sequence[float]) -> float:
    """The additive objective: kernel time of the groups not kept."""
    return float(sum(m for k, m in zip(keep, group_micros) if not k))


def keep_of_save(save: Sequence[int], group_of: Sequence[int], groups: int) -> List[bool]:
    """Per group: kept by a plan whose per-op save flags are `save`."""
    keep = [False] * groups
    for s, g in zip(save, group_of):
        if s and g >= 0:
            keep[g] = True
    return keep


def plan_decisions(text: str) -> List[Dict[str, object]]:
    """The op lines of a plan text (Note [Plan files]): decision, op, µs."""
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] in ("keep", "recompute", "skip"):
            rows.append({"decision": parts[0], "op": parts[2], "micros": float(parts[4])})
    return rows


def plan_recompute_micros(text: str) -> float:
    """A plan's predicted recompute time under hpac's dataflow objective: the µs of the ops its recompute runs."""
    return sum(r["micros"] for r in plan_decisions(text) if r["decision"] == "recompute")


def region_groups(budget) -> Dict[str, list]:
    """The groups of a planned hpac.Budget's last profile."""
    group_of, group_bytes, micros, collective = budget._region.groups()
    return {"group_of": list(group_of), "bytes": list(group_bytes), "micros": list(micros),
            "collective": list(collective)}


def knapsack_keep(group_bytes: Sequence[int], group_micros: Sequence[float], collective: Sequence[int],
                  budget_bytes: int) -> List[bool]:
    """Per group: kept by hpac's own additive planner (the knapsack, no dataflow) over these groups, one op each."""
    import torch
    n = len(group_bytes)
    save, group_of, _, _, _ = torch.ops.hpac.plan_budget([1] * n, list(range(n)), list(group_bytes),
                                                        [float(m) for m in group_micros], [0] * n,
                                                        [int(c) for c in collective], int(budget_bytes))
    return keep_of_save(save, group_of, n)


def optimal_plan_text(budget) -> str:
    """The plan text of the additive optimum for a planned hpac.Budget's profile and budget, replayable by
    hpac.budget(plan=...) (skip marks as hpac's dataflow analysis gives them for that choice)."""
    g = region_groups(budget)
    keep = optimum(g["bytes"], g["micros"], g["collective"], budget.status()["budget_bytes"])
    return budget._region.plan_text_keeping([int(k) for k in keep])
