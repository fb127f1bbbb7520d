"""PyTorch's own selective activation checkpointing in the setups of test_dist_train_field_failures.py: the real
transformers Qwen3MoeForCausalLM on 2 Gloo ranks, FSDP2 over dp (hpac.harness.parallel.parallelize and shard, the
experts on --expert-shard-dim), each decoder layer under torch.utils.checkpoint.checkpoint(use_reentrant=False,
context_fn=create_selective_checkpoint_contexts(policy)) with no hpac in the region, 2 steps against the same model
without checkpointing. A harness script, not a test (the tests assert hpac's behaviour; this one records torch's):

    torchrun --nproc-per-node 2 test/python/dist/torch_sac_probe.py --config CONFIG.yaml --expert-shard-dim 1 \
        [--experts-regathered-in-recompute] [--policy mm|hpac]

--policy mm saves aten.mm only (a list policy, as torchtitan writes them); hpac is hpac's selective policy written
for PyTorch's SAC (hpac.harness.sac_reference). Each rank prints one verdict line: "OK" with |dloss| |dgrad| against
no checkpointing, or "FAILED" with the error; the exit status is 0 only when every step ran.
"""
import argparse
import datetime
import functools
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _context_fn(policy):
    if policy == "mm":
        return lambda: create_selective_checkpoint_contexts([torch.ops.aten.mm.default])
    import hpac.harness.sac_reference as sac_reference
    return sac_reference.make_context_fn()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--expert-shard-dim", type=int, default=0)
    parser.add_argument("--experts-regathered-in-recompute", action="store_true")
    parser.add_argument("--policy", choices=("mm", "hpac"), default="mm")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()
    import hpac.harness.oracle as oracle
    import hpac.harness.parallel as hp
    import hpac.hf as hf
    import hpac.harness.compare as hc
    import hpac.harness.models as hm

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    config = hf.load_config(args.config)
    hp.check_expert_shard_dim(config, args.expert_shard_dim)
    spec, train = config["model"], config["train"]
    layout = hp.Layout(config["parallel"], rank, world)
    layout.build_groups()
    runs = {}
    for name in ("none", "torch-sac"):
        model = hm.qwen3_moe_model(spec, train["seed"])
        model.config.use_cache = False  # what hpac.hf.prepare sets: a cache would grow between forward and recompute
        tp_partial, expert_params = hp.parallelize(model, config, layout)
        if name == "torch-sac":
            for layer in model.model.layers:
                layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False,
                                                  context_fn=_context_fn(args.policy))
        hp.shard(model, layout, expert_params, args.expert_shard_dim)
        if args.experts_regathered_in_recompute:
            hp.regather_experts_in_recompute(model)
        runs[name] = (model, tp_partial, expert_params)
    mb = train["micro_batch"]
    where = (f"torch {torch.__version__} SAC (policy {args.policy}), expert shard dim {args.expert_shard_dim}"
             + (", experts re-gathered in the recompute" if args.experts_regathered_in_recompute else ""))
    worst = [0.0, 0.0]
    for step in range(2):
        ids = hm.token_batch(spec["vocab_size"], mb * layout.dp, train["seq_len"], train["seed"], step)
        ids = ids[layout.dp_rank * mb:(layout.dp_rank + 1) * mb]
        result = {}
        for name, (model, tp_partial, expert_params) in runs.items():
            model.zero_grad(set_to_none=True)
            try:
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
            except RuntimeError as e:
                print(f"[rank {rank}] {where}: FAILED in step {step + 1}: {e}", flush=True)
                os._exit(1)  # the peer may wait in a collective this rank never reaches
            hp.reduce_gradients(model, layout, tp_partial, expert_params)
            result[name] = (loss.detach(), [oracle.full_grad(p) for p in model.parameters()])
        worst[0] = max(worst[0], hc.max_abs_diff(result["torch-sac"][0], result["none"][0]))
        worst[1] = max([worst[1]] + [hc.max_abs_diff(g, g0) for g, g0 in zip(result["torch-sac"][1],
                                                                                 result["none"][1])])
    print(f"[rank {rank}] {where}: OK, 2 steps, |dloss| {worst[0]:.2g} |dgrad| {worst[1]:.2g} vs no checkpoint",
          flush=True)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
