"""hpac in a multi-rank job: what every rank must agree on and how a job fails as one.

    import hpac.distributed as hd
    hd.check_same_config(config, runner_settings)            # before the first step, on every rank
    hd.share_budget_plans(prep, plan_dir)                    # mode budget: after the profile step, on every rank
    except Exception as e: print(hd.fail_together(rank, e, f"step {s}")); ...   # one message from every rank

Each function is collective over the default process group (or `group`) unless it says otherwise: call it on every
rank at the same point. The parallel layouts hpac's own multi-rank tests train (FSDP2, DTensor tensor parallel,
expert parallel, context parallel) are test scaffolding, in hpac.harness.parallel, and not part of this API.
"""
import hashlib
import os
import time
from typing import Any, Dict, List, Optional, Tuple

import torch.distributed as dist

from ._budget import budget


def config_digest(config: Dict[str, Any], runner_settings: str = "") -> str:
    """sha256 of the effective settings every rank must share. Not collective.

    Args:
        config: the parsed hpac-train config (hpac.hf.load_config); its "effective_summary" is the C++
            effectiveSummary: model, train, activation_checkpoint with its plan, activation_swap, parallel.
        runner_settings: lines the runner appends (its own options that change what a rank computes or issues).

    Returns:
        The hex digest of the summary followed by runner_settings.
    """
    return hashlib.sha256((config["effective_summary"] + runner_settings).encode()).hexdigest()


def check_same_config(config: Dict[str, Any], runner_settings: str = "", group=None) -> str:
    """All-gathers every rank's digest and summary; raises on every rank when any rank's differs from the first's.

    Args:
        config: this rank's parsed config (see config_digest).
        runner_settings: lines the runner appends (its options that change what a rank computes or issues, e.g. the
            expert shard dim, torch's checkpoint early stop).
        group: the process group (default: the default group).

    Returns:
        The digest every rank shares.

    Raises:
        RuntimeError: naming each differing rank and its differing summary lines, on every rank.
    """
    mine = (config_digest(config, runner_settings), config["effective_summary"] + runner_settings)
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    differ = [r for r, (d, _) in enumerate(everyone) if d != everyone[0][0]]
    if not differ:
        return everyone[0][0]
    base = everyone[0][1].splitlines()
    lines = []
    for r in differ:
        other = everyone[r][1].splitlines()
        diff = [f"rank 0: {a} | rank {r}: {b}" for a, b in zip(base, other) if a != b]
        lines.append(f"rank {r} differs from rank 0: " + "; ".join(diff))
    raise RuntimeError("hpac.distributed: the ranks run different effective configs (mode, plan or parallel "
                       "layout); no rank trains. " + " ".join(lines))


# ---------------------------------------------------------------------------------------------------------------
# One budget plan for every rank

def _plan_ops(text: str) -> List[Tuple[str, ...]]:
    """(occurrence, op, overload) of every op line of a plan text (Note [Plan files], policy/plan_file.h)."""
    return [tuple(line.split()[1:4]) for line in text.splitlines()
            if line.split()[:1] and line.split()[0] in ("keep", "recompute", "skip")]


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _describe(ops: List[Tuple[str, ...]], i: int) -> str:
    if i >= len(ops):
        return f"the end of its profile ({len(ops)} ops)"
    occurrence, op, overload = ops[i]
    return f"{op}{'' if overload == '-' else '.' + overload} occurrence {occurrence}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def share_budget_plans(prep, plan_dir: str, group=None) -> Dict[str, List[str]]:
    """Makes every rank replay the first rank's budget plan, layer by layer. Call on every rank at the same point,
    after the budget layers' profile (their first call), before their next forward.

    Note [One budget plan for every rank]
    Each rank profiles its layers in the first step (every op recomputed, as full, on every rank alike) and plans
    from its own kernel times, so two ranks' plans can differ in what they keep (measured: ranks of one job
    disagree on some layers; docs/distributed.md). Collectives are kept by every plan (Note [Collectives are kept
    by every plan], policy/budget_plan.h), so differing plans do not hang, but they differ in memory and in what the
    recompute runs, and a job should run one plan. So the ranks all-gather their plan texts (Budget.save_plan) and
    every rank replays rank 0's (hpac.budget(plan=...), re-wrapped in the layer's context): a loaded plan is never
    re-profiled, and a forward that leaves it is an error naming the plan and the op. The op sequences are compared
    first: a rank whose region ran other ops than rank 0's in the profile fails here, on every rank, with one
    message naming the rank, the layer and the first differing op; a rank whose region leaves the shared plan in a
    later step raises hpac's mismatch error there, and fail_together makes every rank report it.

    Args:
        prep: hpac.hf.prepare's result for this rank's model (its layers with a budget are shared).
        plan_dir: a directory every rank may write (shared or not); each rank writes its own plan, the plan it
            received and the plan its region holds after loading it, named by layer and rank.
        group: the process group (default: the default group); "rank 0" is its first rank.

    Returns:
        {"own": [...], "held": [...]}: per budget layer, the sha256 of the plan this rank made from its own profile
        and of the plan its region holds now (the first rank's).

    Raises:
        RuntimeError: on every rank, when the ranks' regions ran different ops in the profile (naming the rank, the
            layer and the first differing op); hpac's error when a region has not planned yet.
    """
    rank = dist.get_rank(group)
    layers = [p for p in prep.layers if p.budget is not None]
    os.makedirs(plan_dir, exist_ok=True)
    own = []
    for p in layers:
        path = os.path.join(plan_dir, f"layer{p.index}.rank{rank}.own.plan")
        p.budget.save_plan(path)  # raises unless the region planned (its profile finished)
        own.append(_read(path))
    everyone: List[Optional[List[str]]] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, own, group=group)
    problems = []
    for r in range(1, len(everyone)):
        for p, base, mine in zip(layers, everyone[0], everyone[r]):
            a, b = _plan_ops(base), _plan_ops(mine)
            if a == b:
                continue
            i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            problems.append(f"rank {r}, layer {p.index}: op {i} is {_describe(b, i)} where rank 0's is "
                            f"{_describe(a, i)}")
    if problems:
        raise RuntimeError("hpac.distributed: mode budget: the ranks' regions ran different ops in the profile, so "
                           "rank 0's plan cannot serve every rank; no rank trains on. " + "; ".join(problems))
    held = []
    for p, text in zip(layers, everyone[0]):
        path = os.path.join(plan_dir, f"layer{p.index}.from-rank0.plan")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        p.use_budget(budget(plan=path))  # prepare's wrap, with the layer's op log, on the new region
        check = os.path.join(plan_dir, f"layer{p.index}.rank{rank}.held.plan")
        p.budget.save_plan(check)  # what the region holds now, written back from C++
        held.append(_read(check))
    return {"own": [_digest(t) for t in own], "held": [_digest(t) for t in held]}


# ---------------------------------------------------------------------------------------------------------------
# One failure, reported by every rank

FAILURE_KEY = "hpac/first_failure"
REPORTED_KEY = "hpac/failures_reported"


def fail_together(rank: int, error: BaseException, where: str) -> str:
    """The message every rank reports for a job that fails mid-step. Not collective: each rank calls it on its own
    failure, before it exits.

    The first rank to fail posts its error to the job's store (torchrun's agent serves it, so it outlives the ranks)
    before it exits; its peers fail next, at their next collective on the closed Gloo connection, and report the
    posted error instead of their own ("Connection closed by peer"). First post wins; a rank that finds nothing
    posted (a peer that died without posting) reports its own error.

    Args:
        rank: this rank.
        error: the exception this rank caught.
        where: what the rank was doing (step and mode), put before its own message.

    Returns:
        The first posted failure, "rank R, WHERE: MESSAGE", or this rank's own when no store is left.
    """
    mine = f"rank {rank}, {where}: {str(error).strip()}"
    try:
        store = dist.distributed_c10d._get_default_store()
        winner = store.compare_set(FAILURE_KEY, "", mine)
        return winner.decode() if isinstance(winner, bytes) else str(winner)
    except Exception:  # no store left: the error is this rank's own
        return mine


def wait_for_peers_to_fail(world: int, timeout_s: float = 30.0) -> None:
    """After this rank reported its failure (fail_together): counts it in the job's store, closes its process group
    so that peers blocked in a collective with it fail now (on the closed connection) rather than at their timeout,
    and waits, at most `timeout_s`, until every rank has counted its own. Without the wait, the first rank to exit
    lets torchrun's agent stop its peers before they report. Never raises."""
    try:
        store = dist.distributed_c10d._get_default_store()
        store.add(REPORTED_KEY, 1)
        dist.destroy_process_group()
        deadline = time.monotonic() + timeout_s
        while store.add(REPORTED_KEY, 0) < world and time.monotonic() < deadline:
            time.sleep(0.05)
    except Exception:  # no store left: nothing to wait for
        pass
