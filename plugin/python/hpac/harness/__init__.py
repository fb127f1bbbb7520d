"""Not API: the scaffolding hpac's own tests, demo and benchmarks run on. Nothing here is kept stable, and nothing in
the library (hpac, hpac.hf, hpac.distributed, hpac.torchtitan) imports from here (test/layout_check.py enforces it).

    models      transformers' Qwen3MoeForCausalLM from the hpac-train YAML's model section (random weights), the
                token batches hpac-train draws
    compare     one model trained under several checkpoint modes, step by step, against off; the main job's table
    demo        the main job: python -m hpac.harness.demo --config examples/training_demo/train.yaml
    stats       the per-layer counters the harness reports, summed; the device memory meter
    parallel    the parallel layouts the multi-rank tests train (FSDP2, DTensor TP, expert and context parallel)
    oracle      what a rank's run is checked against (gradient slices, the distributed rules on the op logs)
    dist_train  the multi-rank runner: torchrun --nproc-per-node N -m hpac.harness.dist_train --config ...
    hooks       checkpoint_with: hpac.checkpoint's frame around any invocation-like object (hpac.harness.checkpoint_with)
    blocks      the Python Qwen3-MoE-style block (attention, top-k MoE) the tests and benchmarks stack
    parity      the gradient comparison every parity check uses (bit for bit or within a tolerance; NaN never equal)
    sac_reference  hpac's selective policy written for PyTorch's own SAC (torch >= 2.4), and one measured step
    plan_oracle the budget planner's exact optimum (a MILP, scipy), imported only by its test and benchmark
"""
from .hooks import checkpoint_with
