"""PyTorch's own context parallel on this machine: torch.distributed.tensor.experimental.context_parallel over the
ranks of a 1-D mesh, around one causal F.scaled_dot_product_attention forward and backward (batch 2, 4 heads,
sequence 64, head dim 16), no hpac anywhere. A harness script, not a test: it records what torch does.

    torchrun --nproc-per-node 2 test/python/dist/context_parallel_probe.py [--device cpu|cuda]

Each rank prints one line: "[rank N] context_parallel on DEVICE: ran, |dout| X vs the unsharded attention" or
"[rank N] context_parallel on DEVICE: TypeName: message". Exit status 0 when it ran, 1 when torch raised.
"""
import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    backend = "gloo"
    if args.device == "cuda":  # NCCL with a GPU per rank; Gloo lets ranks share one GPU
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        backend = "nccl" if torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", "1")) else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard
    mesh = init_device_mesh(args.device, (world,), mesh_dim_names=("cp",))
    torch.manual_seed(0)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    q, k, v = (torch.randn(2, 4, 64, 16, device=args.device, dtype=dtype) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    cq, ck, cv = (t.clone() for t in (q, k, v))  # sharded in place: not leaves that require grad yet
    try:
        with context_parallel(mesh, buffers=[cq, ck, cv], buffer_seq_dims=[2, 2, 2],
                              no_restore_buffers={cq, ck, cv}):
            for t in (cq, ck, cv):
                t.requires_grad_()
            out = F.scaled_dot_product_attention(cq, ck, cv, is_causal=True)
            out.sum().backward()
            (full,) = context_parallel_unshard(mesh, [out.detach()], [2])
        diff = (full.float() - expected.float()).abs().max().item()
        verdict, status = f"ran, |dout| {diff:.3g} vs the unsharded attention", 0
    except Exception as e:  # the record is the exception torch raised
        verdict, status = f"{type(e).__name__}: {str(e).splitlines()[0]}", 1
    print(f"[rank {rank}] context_parallel on {args.device} (torch {torch.__version__}, {backend}): {verdict}",
          flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
