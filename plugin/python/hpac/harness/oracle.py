"""The torchrun harness's oracle (hpac.harness.dist_train): what a rank's run is checked against — the slice of the
1-rank run's gradient a rank covers, a rank's full gradient, and hpac's distributed rules read off the per-phase
counts of functional collectives and FSDP2 ops in the layers' op logs. The layout and the parallelisation are
hpac.harness.parallel's."""

from .parallel import expert_slice

# The collectives and FSDP lifecycle ops the run counts per phase (hpac op-log names; overload omitted).
FUNCTIONAL_COLLECTIVES = ("_c10d_functional::all_reduce", "_c10d_functional::all_to_all_single",
                          "_c10d_functional::reduce_scatter_tensor", "_c10d_functional::all_gather_into_tensor",
                          "_c10d_functional::wait_tensor")
FSDP_GATHER = "c10d::_allgather_base_"  # FSDP2's parameter all-gather (dist.all_gather_into_tensor)
# What FSDP2's copy-out adds for a parameter sharded on a dim other than 0 (torch.cat(chunks, dim, out=...); the
# torch.chunk before it is an aten::split.Tensor like the model's own, so it is not counted apart).
FSDP_COPY_OUT = ("aten::cat.out",)
ISSUED = ("saved", "run", "recomputed", "ignored")  # the kernel ran; "served" did not


def reference_slice(name, ref, layout, model_spec):
    """The part of the 1-rank parameter (or gradient) `ref` that this rank's full_grad covers: for the experts, the
    slice hpac.harness.parallel.expert_slice gives this rank (its experts under ep, its width under tp)."""
    if ".mlp.experts." not in name or (layout.ep == 1 and layout.tp == 1):
        return ref
    n = model_spec["num_experts"] // layout.ep
    owned = slice(layout.ep_rank * n, (layout.ep_rank + 1) * n)
    return expert_slice(name, ref, owned, model_spec["moe_intermediate_size"], layout.tp, layout.tp_rank)


def full_grad(p):
    """The gradient as this rank's view of the 1-rank one: FSDP/TP DTensors gathered (a collective: every rank
    calls it for the same parameters in the same order)."""
    g = p.grad
    return g.full_tensor() if hasattr(g, "full_tensor") else g


# ---------------------------------------------------------------------------------------------------------------
# Counting

def phase_counts(layer_stats):
    """{phase: {op: {"issued": n, "served": n, "saved": n, "ignored": n}}} summed over the layers' op logs, for
    the functional collectives, FSDP2's gather and lifecycle ops (fsdp::*) and its copy-out of a parameter sharded
    on a dim other than 0 (FSDP_COPY_OUT, named with its overload)."""
    out = {"forward": {}, "recompute": {}}
    for stats in layer_stats:
        for key, n in stats.items():
            if not key.startswith("log:"):
                continue
            phase, op, action = key[4:].split(" ")
            name = op if op in FSDP_COPY_OUT else op.split(".")[0]
            if not (name in FUNCTIONAL_COLLECTIVES or name in FSDP_COPY_OUT or name.startswith(("c10d::", "fsdp::"))):
                continue
            c = out[phase].setdefault(name, {"issued": 0, "served": 0, "saved": 0, "ignored": 0})
            c["issued"] += n if action in ISSUED else 0
            c["served"] += n if action == "served" else 0
            c["saved"] += n if action == "saved" else 0
            c["ignored"] += n if action == "ignored" else 0
    return out


def format_counts(counts):
    cells = []
    for phase in ("forward", "recompute"):
        for op, c in sorted(counts[phase].items()):
            extra = "".join(f" {k} {v}" for k, v in c.items() if k != "issued" and v)
            cells.append(f"{phase} {op}: issued {c['issued']}{extra}")
    return "; ".join(cells) or "(no collective or FSDP op inside a region)"


def rule_violations(mode, counts, budget_stage=None):
    """What breaks hpac's distributed rules in one step's per-phase counts (empty when none):
    selective: every functional collective of the forward saved, none issued in the recompute (served);
    full: functional collectives issued again in the recompute, none served;
    budget: as full in its profile (budget_stage 'profiling': every op recomputed, on every rank alike), as
    selective once planned (Note [Collectives are kept by every plan], policy/budget_plan.h);
    every mode: FSDP2's gathers and lifecycle ops ignored in both phases (never counted, never cached).
    torch.utils.checkpoint stops a recompute early once every tensor backward needs is back, so a recompute may
    end before a region's last ops (the MoE block's all-reduce, for one): it sees at most the forward's calls."""
    out = []
    if mode == "budget":
        mode = "full" if budget_stage == "profiling" else "selective"
    fwd, rec = counts["forward"], counts["recompute"]
    for op in FUNCTIONAL_COLLECTIVES:
        f = fwd.get(op)
        r = rec.get(op, {"issued": 0, "served": 0, "saved": 0, "ignored": 0})
        if f is None:
            if r["issued"] or r["served"]:
                out.append(f"{op}: in the recompute but not in the forward")
            continue
        if mode == "selective":
            if f["saved"] != f["issued"]:
                out.append(f"{op}: {f['issued']} issued in forward but {f['saved']} saved")
            if r["issued"] or not 0 < r["served"] <= f["saved"]:
                out.append(f"{op}: recompute issued {r['issued']} and served {r['served']} (forward saved "
                           f"{f['saved']}): a collective must be served, never re-issued")
        if mode == "full" and (r["served"] or not 0 < r["issued"] <= f["issued"]):
            out.append(f"{op}: full re-issued {r['issued']} and served {r['served']} of {f['issued']} in the "
                       "recompute")
    for phase, c in counts.items():
        for op, n in c.items():
            if (op == FSDP_GATHER or op.startswith("fsdp::")) and n["ignored"] != n["issued"]:
                out.append(f"{phase} {op}: {n['issued'] - n['ignored']} of {n['issued']} calls counted by hpac "
                           "instead of ignored")
    return out
