"""The parallel layouts hpac's multi-rank tests train (test scaffolding, not API; what a multi-rank user of hpac
needs is hpac.distributed): the real transformers Qwen3MoeForCausalLM split over ranks with FSDP2 (`fully_shard`),
DTensor tensor parallelism (`parallelize_module`) and expert parallelism (tokens exchanged with functional
all-to-all, as torchtitan's MoE does), trained under off, full and selective through hpac.hf and the hpac-train YAML
(its `parallel:` section, validated by the C++ parser). Started by torchrun (module hpac.harness.dist_train).

Layout (the C++ trainer's, docs/distributed.md): world = tp x cp x dp, rank = (dp_rank x cp + cp_rank) x tp + tp_rank.
  tp > 1     attention by heads (q/k/v ColwiseParallel, o_proj RowwiseParallel on the "tp" mesh dimension) and each
             expert's intermediate width (gate/up rows, down columns; the partial outputs all-reduced over tp with
             _c10d_functional::all_reduce). q_norm, k_norm and the router see part of the work on a tp rank: their
             gradients are summed over tp after backward.
  dp > 1     each dp rank trains micro_batch rows of the global batch (micro_batch x dp rows). fsdp: true shards every
             parameter over the "dp" mesh dimension with fully_shard (self_attn and the MoE router/experts as their
             own FSDP units inside each layer, so their gathers run inside the checkpoint regions; then the layer;
             then the root); fsdp: false averages the gradients over dp after backward.
  ep > 1     ep consecutive dp ranks split the experts; tokens go to the rank owning their expert and come back
             through _c10d_functional all_to_all_single (autograd: the backward sends the gradient rows back).
             Expert parameters are left out of FSDP (ignored_params); their gradients are summed over the ranks
             owning the same experts and divided by dp.
  cp > 1     torch's context_parallel (CUDA only, tp 1 and ep 1; Note [Context parallel needs CUDA]): each cp rank
             holds 2 of the sequence's 2 x cp chunks (head-tail load balancing), input ids, positions and shifted
             labels sharded alike; SDPA runs as ring attention (DTensor); the loss is each rank's token sum over the
             global token count, the gradients summed over cp after backward.
  expert shard dim (the runner's --expert-shard-dim, default 0): with fsdp and ep 1, FSDP2 shards the 3-D expert
             weights ([experts, rows, columns]) on this dim (shard_placement_fn -> Shard(dim)), as torchtitan and
             NeMo do when there are more FSDP ranks than experts. A dim other than 0 makes FSDP2's all-gather
             copy-out chunk and concatenate (aten::split.Tensor, aten::cat.out) inside the MoE unit's gather.
"""
import torch
import torch.distributed as dist
import torch.nn as nn


class Layout:
    """Ranks and groups of one job, from the config's parallel section and the process group."""

    def __init__(self, parallel, rank, world, device="cpu"):
        self.tp, self.dp, self.ep, self.fsdp = parallel["tp"], parallel["dp"], parallel["ep"], parallel["fsdp"]
        self.cp = parallel.get("cp", 1)
        self.rank, self.world, self.device = rank, world, device
        self.tp_rank, self.cp_rank = rank % self.tp, rank // self.tp % self.cp
        self.dp_rank = rank // (self.tp * self.cp)
        self.ep_rank = self.dp_rank % self.ep
        self.mesh = self.tp_group = self.dp_group = self.ep_group = self.edp_group = self.cp_group = None

    @property
    def name(self):
        parts = [f"tp{self.tp}"] if self.tp > 1 else []
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        parts += [f"dp{self.dp}"] if self.dp > 1 else []
        parts += ["fsdp"] if self.fsdp else []
        return "_".join(parts) or "single"

    def build_groups(self):
        """Every rank creates every group in the same order (new_group is collective)."""
        from torch.distributed.device_mesh import init_device_mesh
        if self.cp > 1:  # tp and ep are 1 here (check_layout)
            self.mesh = init_device_mesh(self.device, (self.dp, self.cp, self.tp), mesh_dim_names=("dp", "cp", "tp"))
            self.cp_group = self.mesh.get_group("cp")
        else:
            self.mesh = init_device_mesh(self.device, (self.dp, self.tp), mesh_dim_names=("dp", "tp"))
        self.tp_group = self.mesh.get_group("tp")
        self.dp_group = self.mesh.get_group("dp")
        if self.ep == 1:
            return
        for t in range(self.tp):
            for e in range(self.dp // self.ep):
                ranks = [(e * self.ep + i) * self.tp + t for i in range(self.ep)]
                g = dist.new_group(ranks)
                if self.rank in ranks:
                    self.ep_group = g
            for i in range(self.ep):
                ranks = [(e * self.ep + i) * self.tp + t for e in range(self.dp // self.ep)]
                g = dist.new_group(ranks)
                if self.rank in ranks:
                    self.edp_group = g


def check_layout(config, world, device="cpu"):
    """The job's world size and device against the config (the C++ parser checked the degrees against the model)."""
    p = config["parallel"]
    cp = p.get("cp", 1)
    if p["tp"] * cp * p["dp"] != world:
        raise ValueError(f"{config['file']}: parallel: tp {p['tp']} x cp {cp} x dp {p['dp']} = "
                         f"{p['tp'] * cp * p['dp']} ranks, but the job has {world} (torchrun --nproc-per-node); "
                         "allowed: a world size equal to tp x cp x dp")
    if cp > 1:
        check_context_parallel(config, device)
    if config["train"]["compile"] and p["tp"] > 1 and config["activation_checkpoint"]["mode"] != "off":
        # Measured on torch 2.13 (CPU, Gloo) with torch's own checkpoint too, no hpac in the region: AOTAutograd's
        # save_from_forward fails on a checkpointed layer with DTensor TP ("expected all tensors_saved_with_vc_check
        # to be Tensors", a DeviceMesh among them), and the selective layer's region is never traced.
        raise ValueError(f"{config['file']}: train.compile: true with parallel.tp {p['tp']} and checkpointing is not "
                         f"supported on torch {torch.__version__}: torch.compile of a checkpointed DTensor-TP layer "
                         "fails inside AOTAutograd, with or without hpac; allowed: compile with tp 1 (dp, ep, fsdp), "
                         "or train.compile: false with tp")


# Note [Context parallel needs CUDA]
# torch's context_parallel (torch.distributed.tensor.experimental, 2.13) shards the sequence and turns
# F.scaled_dot_product_attention into ring attention through DTensor handlers registered for the CUDA SDPA kernels
# only: aten._scaled_dot_product_flash_attention, _efficient_attention and _cudnn_attention (and their backward).
# On a CPU tensor SDPA dispatches aten._scaled_dot_product_flash_attention_for_cpu, for which DTensor has no
# sharding strategy: the first attention of the forward raises NotImplementedError ("does not have a sharding
# strategy registered"). test/python/dist/test_context_parallel.py runs torch's own context_parallel on two Gloo
# ranks and asserts exactly that, so it turns red the day torch supports the CPU kernel. hpac writes no ring
# attention of its own: on CPU a cp > 1 job is refused before the first step, on every rank.
CP_CPU_REFUSAL = ("torch {torch}'s context_parallel has ring-attention handlers for the CUDA SDPA kernels only "
                  "(flash, efficient, cudnn); on CPU, SDPA runs aten._scaled_dot_product_flash_attention_for_cpu, "
                  "which DTensor cannot shard (NotImplementedError, Note [Context parallel needs CUDA])")


def check_context_parallel(config, device):
    """cp > 1: the runner's rules (tp 1, ep 1, no compile) and a CUDA device."""
    p = config["parallel"]
    where = f"{config['file']}: parallel.cp {p['cp']}"
    if p["tp"] > 1 or p["ep"] > 1:
        raise ValueError(f"{where} with tp {p['tp']} and ep {p['ep']} is not supported by the torchrun runner; "
                         "allowed: cp > 1 with tp 1 and ep 1 (context parallel x data parallel, fsdp or not)")
    if config["train"]["compile"]:
        raise ValueError(f"{where} with train.compile: true is not supported (context_parallel patches "
                         "F.scaled_dot_product_attention at run time); allowed: train.compile: false with cp")
    if device != "cuda":
        raise ValueError(f"{where} on device {device}: " + CP_CPU_REFUSAL.format(torch=torch.__version__)
                         + "; allowed: cp 1 on CPU, or --device cuda on a machine with CUDA")


def check_cp_attention(model, layout):
    """cp > 1: the model's attention must be one torch's ring attention can split: SDPA (the patched
    F.scaled_dot_product_attention), causal over the whole sequence (no sliding window)."""
    if layout.cp == 1:
        return
    impl = model.config._attn_implementation
    window = getattr(model.config, "use_sliding_window", False) and getattr(model.config, "sliding_window", None)
    if impl != "sdpa" or window:
        raise ValueError(f"parallel.cp {layout.cp}: the model's attention cannot be split over the sequence: "
                         f"attn_implementation '{impl}'" + (f", sliding_window {window}" if window else "")
                         + "; allowed: attn_implementation 'sdpa' with full causal attention (torch's "
                         "context_parallel replaces F.scaled_dot_product_attention only)")


def context_parallel_step(model, ids, layout):
    """Forward and backward of one micro-batch under torch's context_parallel on the cp mesh dimension: the input
    ids, positions and next-token labels sharded along the sequence (in place, torch's head-tail balancing); the
    loss is this rank's token sum over the micro-batch's token count (the cp ranks' losses sum to the 1-rank loss,
    transformers' mean of the shifted cross entropy). Returns this rank's part of the loss."""
    from torch.distributed.tensor.experimental import context_parallel
    b, s = ids.shape
    ids = ids.clone()
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    positions = torch.arange(s, device=ids.device).expand(b, s).contiguous()
    count = (labels != -100).sum()
    buffers = [ids, positions, labels]
    with context_parallel(layout.mesh["cp"], buffers=buffers, buffer_seq_dims=[1, 1, 1],
                          no_restore_buffers=set(buffers)):
        logits = model(input_ids=ids, position_ids=positions).logits
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100,
                                           reduction="sum") / count
        loss.backward()
    return loss.detach()


def experts_in_fsdp(config):
    """Whether FSDP2 shards the expert weights (fsdp: true and ep 1; with ep > 1 they are left out of it)."""
    return config["parallel"]["fsdp"] and config["parallel"]["ep"] == 1


EXPERT_SHARD_DIMS = (0, 1, 2)  # the dims of a 3-D expert weight [experts, rows, columns]


def check_expert_shard_dim(config, dim):
    """The expert shard dim against the layout and the model: any dim of the expert weights with FSDP2 sharding
    them (fsdp: true, ep 1), and one the dp degree divides unless it is 0 (FSDP2 pads dim 0 only); 0 always."""
    if dim not in EXPERT_SHARD_DIMS:
        raise ValueError(f"expert shard dim {dim} is not allowed; allowed: "
                         f"{', '.join(map(str, EXPERT_SHARD_DIMS))} (a dim of the 3-D expert weights "
                         "[experts, rows, columns])")
    p, spec = config["parallel"], config["model"]
    if dim == 0:
        return
    if not experts_in_fsdp(config):
        raise ValueError(f"{config['file']}: expert shard dim {dim} with parallel.fsdp {str(p['fsdp']).lower()} and "
                         f"ep {p['ep']} is not allowed: FSDP2 does not shard the expert weights there (ep > 1 "
                         "splits them by expert and leaves them out of FSDP2); allowed: fsdp: true with ep 1, or "
                         "expert shard dim 0")
    inter = spec["moe_intermediate_size"] // p["tp"]
    shapes = {"gate_up_proj": (spec["num_experts"], 2 * inter, spec["hidden_size"]),
              "down_proj": (spec["num_experts"], spec["hidden_size"], inter)}
    for name, shape in shapes.items():
        if shape[dim] % p["dp"]:
            raise ValueError(f"{config['file']}: expert shard dim {dim}: mlp.experts.{name} {list(shape)} has "
                             f"{shape[dim]} on dim {dim}, which dp {p['dp']} does not divide (FSDP2 pads dim 0 "
                             "only); allowed: a dim the dp degree divides in both expert weights, or 0")


# ---------------------------------------------------------------------------------------------------------------
# Collectives with autograd (forward inside hpac's regions: what the selective policy saves and serves)

def _all_reduce(x, group):
    y = torch.ops._c10d_functional.all_reduce(x, "sum", group.group_name)
    return torch.ops._c10d_functional.wait_tensor(y)


class _ReduceFromTp(torch.autograd.Function):
    """Forward: sum over the tp group (a functional all-reduce); backward: identity."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _CopyToTp(torch.autograd.Function):
    """Forward: identity; backward: the gradient summed over the tp group."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad.contiguous(), ctx.group), None


def _all_to_all(x, out_splits, in_splits, group):
    """Rows of x, in_splits[r] of them to rank r; returns out_splits[r] rows from each rank r (autograd)."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor
    return wait_tensor(all_to_all_single_autograd(x.contiguous(), out_splits, in_splits, group))


def _expert(x, gate_up, down, act):
    gate, up = nn.functional.linear(x, gate_up).chunk(2, dim=-1)
    return nn.functional.linear(act(gate) * up, down)


def _tp_rows(tp, tp_rank, inter):
    """This tp rank's slice of an expert's intermediate width."""
    if inter % tp:
        raise ValueError(f"moe_intermediate_size {inter} is not divisible by tp {tp}")
    w = inter // tp
    return slice(tp_rank * w, (tp_rank + 1) * w)


def expert_slice(name, weight, experts, inter, tp=1, tp_rank=0):
    """The part of an expert weight a rank holds: the experts in `experts` (a slice), each one's intermediate width
    `inter` split over tp — its rows of gate and of up in gate_up_proj ([experts, 2 x inter, hidden], stored as
    [gate rows; up rows]), its columns of down_proj ([experts, hidden, inter]). The oracle slices the 1-rank
    gradients with it."""
    rows = _tp_rows(tp, tp_rank, inter)
    if name.endswith("gate_up_proj"):
        return torch.cat([weight[experts, :inter][:, rows], weight[experts, inter:][:, rows]], dim=1)
    return weight[experts, :, rows]


def _expert_params(experts, owned, tp, tp_rank):
    inter = experts.intermediate_dim
    return [nn.Parameter(expert_slice(n, getattr(experts, n).data, owned, inter, tp, tp_rank).clone())
            for n in ("gate_up_proj", "down_proj")]


class TensorParallelExperts(nn.Module):
    """Qwen3MoeExperts with each expert's intermediate width split over tp (expert_slice); the outputs summed over
    tp. Same parameter names as the original, so the 1-rank names still apply."""

    def __init__(self, experts, tp, tp_rank, group):
        super().__init__()
        self.gate_up_proj, self.down_proj = _expert_params(experts, slice(None), tp, tp_rank)
        self.num_experts, self.act_fn, self.group = experts.num_experts, experts.act_fn, group

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        # Every expert runs on every rank (an empty row set included) so that the ranks' graphs agree.
        for e in range(self.num_experts):
            tok, pos = torch.where(top_k_index == e)
            y = _expert(hidden_states[tok], self.gate_up_proj[e], self.down_proj[e], self.act_fn)
            out.index_add_(0, tok, y * top_k_weights[tok, pos, None])
        return _ReduceFromTp.apply(out, self.group)


class ExpertParallelExperts(nn.Module):
    """Qwen3MoeExperts with the experts split over the ep group: this rank holds experts
    [ep_rank * E/ep, (ep_rank + 1) * E/ep) (renumbered from 0, same parameter names). Token rows are sorted by
    expert, their counts exchanged (all_to_all_single), the rows sent to the owners and the results sent back
    (all_to_all_single with autograd), as torchtitan's MoE does.

    With tp > 1 (TP x EP) each owned expert's intermediate width is split over tp as well (expert_slice): the ep
    group is the ranks with the same tp rank, which hold the same tokens as their tp peers (attention's
    RowwiseParallel output is replicated over tp), so each tp rank exchanges the same rows with its own ep group,
    computes its part of the owned experts, and the partial outputs are summed over tp at the end (one functional
    all-reduce, as TensorParallelExperts does)."""

    def __init__(self, experts, ep, ep_rank, group, tp=1, tp_rank=0, tp_group=None):
        super().__init__()
        n = experts.num_experts
        if n % ep:
            raise ValueError(f"num_experts {n} is not divisible by ep {ep}")
        self.local = n // ep
        owned = slice(ep_rank * self.local, (ep_rank + 1) * self.local)
        self.gate_up_proj, self.down_proj = _expert_params(experts, owned, tp, tp_rank)
        self.num_experts, self.ep, self.act_fn, self.group = n, ep, experts.act_fn, group
        self.tp_group = tp_group if tp > 1 else None

    def forward(self, hidden_states, top_k_index, top_k_weights):
        from torch.distributed._functional_collectives import all_to_all_single, wait_tensor
        k = top_k_index.shape[1]
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // k
        counts = torch.bincount(flat, minlength=self.num_experts)  # per global expert, this rank's rows
        # received[s, j]: rows rank s sends for local expert j
        received = wait_tensor(all_to_all_single(counts, None, None, self.group)).view(self.ep, self.local)
        send = counts.view(self.ep, self.local).sum(1).tolist()
        recv = received.sum(1).tolist()
        rows = _all_to_all(hidden_states[token], recv, send, self.group)
        # Group the received rows by local expert (they arrive by source, then expert), run each, put them back.
        by_expert = torch.argsort(torch.arange(self.local).repeat(self.ep).repeat_interleave(received.reshape(-1)),
                                  stable=True)
        per_expert = received.sum(0).tolist()
        outs = [_expert(chunk, self.gate_up_proj[j], self.down_proj[j], self.act_fn)
                for j, chunk in enumerate(rows[by_expert].split(per_expert))]
        results = torch.empty_like(rows).index_copy(0, by_expert, torch.cat(outs))
        back = _all_to_all(results, send, recv, self.group)
        weights = top_k_weights.reshape(-1)[order, None]
        out = torch.zeros_like(hidden_states).index_add(0, token, back * weights)
        return out if self.tp_group is None else _ReduceFromTp.apply(out, self.tp_group)


# ---------------------------------------------------------------------------------------------------------------
# Building the parallel model

def _tp_attention(attn, layout):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    parallelize_module(attn, layout.mesh["tp"], {"q_proj": ColwiseParallel(), "k_proj": ColwiseParallel(),
                                                 "v_proj": ColwiseParallel(), "o_proj": RowwiseParallel()})


def parallelize(model, config, layout):
    """Applies the layout to a freshly built model (before hpac.hf.prepare and shard()). Returns the names of the
    parameters whose gradients are partial per tp rank (summed over tp after backward) and of the expert-parallel
    ones."""
    tp_partial, expert_params = [], []
    for i, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{i}."
        if layout.tp > 1:
            _tp_attention(layer.self_attn, layout)
            tp_partial += [prefix + "self_attn.q_norm.weight", prefix + "self_attn.k_norm.weight"]
            moe = layer.mlp
            if layout.ep == 1:
                moe.experts = TensorParallelExperts(moe.experts, layout.tp, layout.tp_rank, layout.tp_group)
            moe.register_forward_pre_hook(lambda m, args: (_CopyToTp.apply(args[0], layout.tp_group),) + args[1:])
            tp_partial.append(prefix + "mlp.gate.weight")
        if layout.ep > 1:
            layer.mlp.experts = ExpertParallelExperts(layer.mlp.experts, layout.ep, layout.ep_rank, layout.ep_group,
                                                      layout.tp, layout.tp_rank, layout.tp_group)
            expert_params += [prefix + "mlp.experts.gate_up_proj", prefix + "mlp.experts.down_proj"]
    return tp_partial, expert_params


def shard(model, layout, expert_params, expert_shard_dim=0):
    """FSDP2 over the dp mesh dimension: self_attn and the router / experts (the MoE block less the
    expert-parallel experts) of every layer as their own units, then the layer, then the root. The experts' weights
    are sharded on expert_shard_dim (check_expert_shard_dim), every other parameter on dim 0."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard
    mesh = layout.mesh["dp"]
    params = dict(model.named_parameters())
    ignored = {params[n] for n in expert_params}
    experts = {id(p) for layer in model.model.layers for p in layer.mlp.experts.parameters() if p not in ignored}

    def placement(p):
        return Shard(expert_shard_dim) if expert_shard_dim and id(p) in experts else None

    for layer in model.model.layers:
        fully_shard(layer.self_attn, mesh=mesh)
        fully_shard(layer.mlp, mesh=mesh, ignored_params=ignored or None, shard_placement_fn=placement)
        fully_shard(layer, mesh=mesh, ignored_params=ignored or None)
    fully_shard(model, mesh=mesh, ignored_params=ignored or None)
    # No backward prefetch of the previous unit (each unit "prefetches" only itself, a no-op; an empty list would
    # mean FSDP2's default): a unit's parameters are then gathered where they are needed, by its own pre-forward
    # hook in the recompute (inside the checkpoint region, where hpac's counts show it), not by the next unit's
    # pre-backward hook.
    for m in model.modules():
        if hasattr(m, "set_modules_to_backward_prefetch"):
            m.set_modules_to_backward_prefetch([m])


def regather_experts_in_recompute(model):
    """Moves the experts' FSDP2 gathers out of the forward's regions and into the recompute's, the order of
    NeMo-Automodel #3958 (experts resharded between forward and backward): in the forward each layer's MoE unit is
    gathered by the layer's forward pre-hook (FSDPModule.unshard(), as an explicit prefetch does), before the
    layer's checkpoint region; the MoE block's output is multiplied by a saved 1.0 (a post-MoE op that saves a
    tensor, bit for bit the identity), so backward unpacks the region's saved tensors, and recomputes it, before the
    MoE unit's pre-backward hook has gathered the resharded experts: the recompute's pre-forward hook gathers them,
    inside the region. FSDP2's copy-out then runs in the recompute and not in the forward. Call after shard()."""
    for layer in model.model.layers:
        layer.register_forward_pre_hook(lambda module, args: module.mlp.unshard())
        one = torch.ones(())
        layer.mlp.register_forward_hook(lambda module, args, output, one=one: output * one)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def reduce_gradients(model, layout, tp_partial, expert_params):
    """The gradient reductions FSDP2 and DTensor do not do (after backward, outside every region)."""
    params = dict(model.named_parameters())
    if layout.cp > 1:  # each cp rank's loss covers its part of the sequence
        for p in params.values():
            dist.all_reduce(_local(p.grad), group=layout.cp_group)
    for n in tp_partial:
        dist.all_reduce(_local(params[n].grad), group=layout.tp_group)
    if layout.dp > 1 and not layout.fsdp:
        for n, p in params.items():
            if n not in expert_params:
                g = _local(p.grad)
                dist.all_reduce(g, group=layout.dp_group)
                g.div_(layout.dp)
    for n in expert_params:
        g = params[n].grad
        if layout.dp // layout.ep > 1:
            dist.all_reduce(g, group=layout.edp_group)
        g.div_(layout.dp)
